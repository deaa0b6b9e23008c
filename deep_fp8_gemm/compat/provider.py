"""The other provider of ``deep_gemm``: the DeepGEMM the facade (:mod:`deep_fp8_gemm.compat.deep_gemm`) forwards the
names this library does not implement to, and applies the global knobs to.

Found once, lazily (the first name the facade lacks, the first knob set, an import of a submodule it does not have),
in vLLM's order:

1. a site-packages ``deep_gemm`` (``sgl-deep-gemm``, upstream DeepGEMM): located with
   ``importlib.machinery.PathFinder`` (so the facade's own import hook is not consulted) and loaded under the name
   :data:`ALIAS`, so that it and the facade live side by side. Its relative imports resolve under that name; its
   absolute ``deep_gemm.*`` imports reach the facade, whose finder (:mod:`.dropin`) serves the facade's own
   submodules and hands every other ``deep_gemm.<x>`` to ``ALIAS.<x>``. A ``deep_gemm`` already imported before the
   hook was enabled is adopted instead (:func:`adopt`): its ``sys.modules`` entries move under ``ALIAS`` and the
   module objects other code holds keep working.
2. vLLM's vendored copy, ``vllm.third_party.deep_gemm``, only when ``vllm`` is already in ``sys.modules`` (this
   module never imports vLLM; it looks again once vLLM has been imported).

A provider that fails to import (its extension needs CUDA, an incomplete wheel) counts as absent; the error is kept
(:func:`errors`) and logged. The knobs set through the facade are recorded and replayed on a provider found later.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from typing import Any, Callable

from .. import env

#: ``sys.modules`` name of a site-packages ``deep_gemm`` loaded beside the facade.
ALIAS = "_deep_gemm_forwarded"
#: vLLM's vendored copy (DeepGEMM 2.8.1 in vLLM 0.33.0).
VENDORED = "vllm.third_party.deep_gemm"
#: What :func:`deep_gemm.provider_of` says for a name this library serves.
OURS = "deep_fp8_gemm"
#: The global knobs the facade applies to both providers (the reference's setters).
KNOBS = ("set_pdl", "set_num_sms", "set_tc_util", "set_mk_alignment_for_contiguous_layout",
         "use_deterministic_algorithms", "set_ignore_compile_dims", "set_block_size_multiple_of")

LOGGER = logging.getLogger("deep_fp8_gemm.deep_gemm")


@dataclasses.dataclass(frozen=True)
class Provider:
    """The forwarded provider: its module, the ``sys.modules`` name its submodules live under, and a label for
    :func:`deep_gemm.provider_of` and the log ("sgl-deep-gemm 0.2.3.post2 (site-packages deep_gemm)")."""

    module: Any
    import_name: str
    label: str


@dataclasses.dataclass
class _State:
    provider: Provider | None = None
    tried_site: bool = False
    tried_vendored: bool = False
    errors: list = dataclasses.field(default_factory=list)
    knobs: dict = dataclasses.field(default_factory=dict)  # knob -> (args, kwargs), last value set through ours
    logged: set = dataclasses.field(default_factory=set)
    adopted: dict = dataclasses.field(default_factory=dict)  # original sys.modules key -> module (for restore)


_STATE = _State()
_LOCK = threading.RLock()


def _debug(message: str, *args) -> None:
    if env.deep_gemm_debug() and not LOGGER.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.setLevel(logging.DEBUG)
    LOGGER.debug(message, *args)


def debug_once(key: str, message: str, *args) -> None:
    """One debug line per ``key`` (which provider serves a name is said once, not on every lookup)."""
    if key not in _STATE.logged:
        _STATE.logged.add(key)
        _debug(message, *args)


# ---------------------------------------------------------------------------------------------- finding it
def _distribution_of(top_level: str) -> str:
    """``"name version"`` of the installed distribution that owns the top-level package, or ``""``."""
    from importlib import metadata

    try:
        names = metadata.packages_distributions().get(top_level, [])
        return " ".join(f"{n} {metadata.version(n)}" for n in dict.fromkeys(names))
    except Exception:  # broken metadata must not stop the import
        return ""


def _is_our_old_dropin(origin: str) -> bool:
    """deep-fp8-gemm-dropin 0.1.0 installed ``deep_gemm/`` files that re-exported deep_fp8_gemm.compat: forwarding to
    them would forward to ourselves."""
    try:
        with open(origin, encoding="utf-8", errors="replace") as f:
            return "from deep_fp8_gemm import compat" in f.read(8192)
    except OSError:
        return False


def _drop(prefix: str) -> None:
    for key in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
        del sys.modules[key]


def _load_site_packages() -> Provider | None:
    if ALIAS in sys.modules:
        module = sys.modules[ALIAS]
        return Provider(module, ALIAS, getattr(module, "__dfg_label__", "deep_gemm (site-packages)"))
    spec = importlib.machinery.PathFinder.find_spec("deep_gemm", sys.path)
    if spec is None or spec.origin is None or spec.submodule_search_locations is None:
        return None  # none, or a namespace package (no __init__.py): not a DeepGEMM
    if _is_our_old_dropin(spec.origin):
        _STATE.errors.append(f"{spec.origin}: deep-fp8-gemm-dropin 0.1.0's deep_gemm/ files (this library itself); "
                             "pip install the current drop-in to remove them")
        return None
    alias_spec = importlib.util.spec_from_file_location(
        ALIAS, spec.origin, submodule_search_locations=list(spec.submodule_search_locations))
    module = importlib.util.module_from_spec(alias_spec)
    sys.modules[ALIAS] = module
    try:
        alias_spec.loader.exec_module(module)
    except Exception as error:  # an extension that needs CUDA, an incomplete wheel: absent, and said why
        _drop(ALIAS)
        _STATE.errors.append(f"site-packages deep_gemm ({spec.origin}) failed to import: {error!r}")
        LOGGER.warning("deep_gemm facade: the site-packages deep_gemm (%s) failed to import, nothing is forwarded "
                       "to it: %r", spec.origin, error)
        return None
    dist = _distribution_of("deep_gemm")
    label = f"{dist} (site-packages deep_gemm)" if dist else "deep_gemm (site-packages)"
    module.__dfg_label__ = label
    return Provider(module, ALIAS, label)


def _load_vendored() -> Provider | None:
    try:
        module = importlib.import_module(VENDORED)
    except Exception as error:  # vLLM's own import of it catches the same (its _C.init can raise RuntimeError)
        _STATE.errors.append(f"{VENDORED} failed to import: {error!r}")
        _debug("%s is not importable: %r", VENDORED, error)
        return None
    return Provider(module, VENDORED, f"{VENDORED} {getattr(module, '__version__', '')}".strip())


def current() -> Provider | None:
    """The forwarded provider, found on first use (module docstring), or None."""
    with _LOCK:
        if _STATE.provider is None and not _STATE.tried_site:
            _STATE.tried_site = True
            _set(_load_site_packages())
        if _STATE.provider is None and not _STATE.tried_vendored and "vllm" in sys.modules:
            _STATE.tried_vendored = True
            _set(_load_vendored())
        return _STATE.provider


def _set(provider: Provider | None) -> None:
    if provider is None:
        return
    _STATE.provider = provider
    _debug("deep_gemm facade: forwarding to %s", provider.label)
    for name, (args, kwargs) in _STATE.knobs.items():  # knobs set through ours before this provider was found
        setter = getattr(provider.module, name, None)
        if setter is None:
            continue
        try:
            setter(*args, **kwargs)
            _debug("replayed %s%r on %s", name, args, provider.label)
        except Exception as error:
            LOGGER.warning("deep_gemm facade: %s%r, set before %s was loaded, failed there: %r", name, args,
                           provider.label, error)


def adopt(module: Any) -> None:
    """Make an already-imported ``deep_gemm`` (not the facade) the forwarded provider: every ``deep_gemm`` /
    ``deep_gemm.*`` entry of ``sys.modules`` moves under :data:`ALIAS` (module objects unchanged), so the facade
    can take the name while code that already holds the old module keeps using it."""
    with _LOCK:
        moved = {k: v for k, v in sys.modules.items() if k == "deep_gemm" or k.startswith("deep_gemm.")}
        for key, value in moved.items():
            del sys.modules[key]
            sys.modules.setdefault(ALIAS + key[len("deep_gemm"):], value)
        _STATE.adopted.update(moved)
        name = getattr(module, "__name__", "deep_gemm")
        label = f"{name} (imported before the hook)"
        if name == "deep_gemm":
            dist = _distribution_of("deep_gemm")
            label = f"{dist} (site-packages deep_gemm, imported before the hook)" if dist else label
        module_key = name if sys.modules.get(name) is module else ALIAS
        _STATE.tried_site = True
        _set(Provider(module, module_key, label))


def reset() -> dict:
    """Forget the provider, the recorded knobs and the log marks, unload :data:`ALIAS`; returns the ``sys.modules``
    entries :func:`adopt` moved (the hook's ``disable`` puts them back). For tests and for ``disable``."""
    with _LOCK:
        adopted = dict(_STATE.adopted)
        _drop(ALIAS)
        _STATE.__init__()
        return adopted


def errors() -> list[str]:
    """Why each provider candidate tried so far is absent (failed imports), oldest first."""
    return list(_STATE.errors)


# ---------------------------------------------------------------------------------------------- using it
def lookup(path: str, name: str) -> Any:
    """``name`` of the provider's module at ``path`` (``""``, ``"utils"``, ``"utils.layout"``, ``"testing"``, ...);
    ``AttributeError`` when there is no provider or it lacks the name."""
    provider = current()
    if provider is None:
        raise AttributeError(name)
    module = provider.module
    for part in filter(None, path.split(".")):
        sub = getattr(module, part, None)
        if sub is None:
            try:
                sub = importlib.import_module(f"{module.__name__}.{part}")
            except ImportError:
                raise AttributeError(name) from None
        module = sub
    value = getattr(module, name)  # AttributeError when the provider lacks it too
    debug_once(f"{path}.{name}", "deep_gemm%s.%s -> %s", f".{path}" if path else "", name, provider.label)
    return value


def set_knob(name: str, args: tuple, kwargs: dict) -> None:
    """Record a knob set through the facade (replayed on a provider found later) and apply it to the provider now,
    when there is one that has it (its exception propagates: the facade restores its own value)."""
    with _LOCK:
        _STATE.knobs[name] = (args, kwargs)
        provider = current()
    setter = None if provider is None else getattr(provider.module, name, None)
    if setter is not None:
        setter(*args, **kwargs)
        _debug("%s%r applied to %s too", name, args, provider.label)


def fallback(name: str) -> Callable | None:
    """The provider's ``name`` for a call this library refuses, or None."""
    provider = current()
    other = None if provider is None else getattr(provider.module, name, None)
    if other is not None:
        _debug("deep_gemm.%s: a call deep_fp8_gemm refuses goes to %s", name, provider.label)
    return other


def forwarder(path: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the facade's module at ``path``: :func:`lookup`, with an ``AttributeError`` that
    says neither provider has the name (so ``hasattr`` tells the truth)."""
    module_name = "deep_gemm" + (f".{path}" if path else "")

    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # dunders (__path__ probes, __wrapped__, ...) are never forwarded
        try:
            return lookup(path, name)
        except AttributeError:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r} (deep_fp8_gemm does not "
                                 "implement it and no other deep_gemm provider has it)") from None

    return __getattr__
