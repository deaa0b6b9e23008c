"""The import hook that serves ``deep_gemm`` from :mod:`deep_fp8_gemm.compat.deep_gemm`: ``enable()`` /
``disable()``. No distribution owns ``deep_gemm/`` files for it, so installing deep_fp8_gemm or its drop-in never
overwrites, shadows or deletes another DeepGEMM's files.

Turned on by ``enable()`` (code that controls its imports), or at interpreter start by the ``deep-fp8-gemm-dropin``
distribution's ``.pth`` hook when ``DFG_AS_DEEP_GEMM=1`` (``deep_fp8_gemm_dropin``: it installs a stand-in finder
that imports this module on the first ``deep_gemm`` import, so an interpreter that never imports ``deep_gemm`` never
imports torch for it).

The finder (first on ``sys.meta_path``) answers for ``deep_gemm`` and ``deep_gemm.*``:

* the facade's own modules (``deep_gemm``, ``.utils``, ``.utils.layout``, ``.utils.math``, ``.testing``, ...) are
  the modules of :mod:`deep_fp8_gemm.compat.deep_gemm`, the same objects under both names;
* any other ``deep_gemm.<x>`` (``deep_gemm._C``, ``deep_gemm.mega``, ``deep_gemm.utils.dist``, sgl-deep-gemm's
  ``deep_gemm.<function>`` entries) is the forwarded provider's ``<its name>.<x>``
  (:mod:`deep_fp8_gemm.compat.provider`), also the same objects, so the provider's own absolute imports and
  consumers' ``import_module(f"{dg.__name__}.mega")`` (vLLM 0.33's step5 MegaMoE) reach its modules. The same holds
  under the facade's real name (``deep_fp8_gemm.compat.deep_gemm.<x>``). Without a provider: ``ModuleNotFoundError``.

``enable()`` when ``deep_gemm`` is already imported and is not the facade adopts that module as the forwarded
provider (:func:`deep_fp8_gemm.compat.provider.adopt`): code that imported it before keeps it, later imports get
the facade.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from pathlib import Path

from . import provider

#: The facade package (its modules are served as ``deep_gemm`` / ``deep_gemm.*``).
FACADE = "deep_fp8_gemm.compat.deep_gemm"
_FACADE_DIR = Path(__file__).resolve().parent / "deep_gemm"
_LOCK = threading.RLock()


def _facade_file(rest: str) -> Path | None:
    """The source file of the facade's module ``FACADE + rest`` (``rest`` ``""`` or ``".utils.layout"``), or None
    when the facade has no such module."""
    base = _FACADE_DIR.joinpath(*filter(None, rest.split(".")))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file() and (candidate.parent == _FACADE_DIR or candidate.parent.is_relative_to(_FACADE_DIR)):
            return candidate
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads a name as an existing module object (imported under its own name), keeping that module's ``__spec__``
    (the import system sets it to the alias spec before ``exec_module``)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        spec.loader_state = module.__dict__.get("__spec__")
        return module

    def exec_module(self, module):
        spec = module.__spec__
        if spec is not None and spec.loader is self:
            module.__spec__ = spec.loader_state


class DeepGemmFinder(importlib.abc.MetaPathFinder):
    """Serves ``deep_gemm`` / ``deep_gemm.*`` (module docstring)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "deep_gemm" or fullname.startswith("deep_gemm."):
            rest = fullname[len("deep_gemm"):]
        elif fullname.startswith(FACADE + "."):
            rest = fullname[len(FACADE):]
            if _facade_file(rest) is not None:
                return None  # the facade's own file: the ordinary path finder loads it under its real name
        else:
            return None
        source = _facade_file(rest)
        if source is not None:
            name, origin, is_package = FACADE + rest, str(source), source.name == "__init__.py"
        else:
            other = provider.current()
            if other is None:
                return None
            name = other.import_name + rest
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                return None
            origin, is_package = spec.origin, spec.submodule_search_locations is not None
        alias = importlib.machinery.ModuleSpec(fullname, _AliasLoader(name), origin=origin, is_package=is_package)
        return alias


#: The one finder instance.
FINDER = DeepGemmFinder()


def is_facade(module) -> bool:
    return getattr(module, "__name__", "") == FACADE or getattr(module, "__name__", "").startswith(FACADE + ".")


def is_enabled() -> bool:
    """Whether :data:`FINDER` is on ``sys.meta_path``."""
    return any(f is FINDER for f in sys.meta_path)


def enable() -> None:
    """Serve ``deep_gemm`` from the facade from now on (idempotent; module docstring): the finder goes first on
    ``sys.meta_path``, and a ``deep_gemm`` imported before is adopted as the forwarded provider."""
    with _LOCK:
        if not is_enabled():
            sys.meta_path.insert(0, FINDER)
        existing = sys.modules.get("deep_gemm")
        if existing is not None and not is_facade(existing):
            provider.adopt(existing)


def disable() -> None:
    """Stop serving ``deep_gemm`` (mainly for tests): the finder leaves ``sys.meta_path``, the ``deep_gemm*`` names
    it served leave ``sys.modules``, the forwarded provider is forgotten and an adopted module gets its names back.
    Code holding the facade keeps it."""
    with _LOCK:
        sys.meta_path[:] = [f for f in sys.meta_path if f is not FINDER]
        for key in [k for k in sys.modules if k == "deep_gemm" or k.startswith("deep_gemm.")]:
            del sys.modules[key]
        sys.modules.update(provider.reset())
        _forget_forwarded_submodules()


def _forget_forwarded_submodules() -> None:
    """An import of ``deep_gemm.<x>`` served from the provider (``deep_gemm.mega``) binds ``<x>`` on the facade
    package, as every submodule import binds its parent's attribute; once the provider is forgotten that binding
    would keep answering ``deep_gemm.mega`` with the old provider's module. Drop every attribute of the facade's
    packages that is a module of a provider (the site-packages one under its alias, vLLM's vendored copy, an adopted
    ``deep_gemm``); the facade's own imports (``torch``, ``os``) stay."""
    providers = (provider.ALIAS, provider.VENDORED, "deep_gemm")
    for name, module in list(sys.modules.items()):
        if name != FACADE and not name.startswith(FACADE + "."):
            continue
        for attr, value in list(vars(module).items()):
            owner = getattr(value, "__name__", None) if type(value) is type(sys) else None
            if owner and any(owner == p or owner.startswith(p + ".") for p in providers):
                delattr(module, attr)
