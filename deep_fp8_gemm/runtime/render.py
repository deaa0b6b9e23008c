"""Kernel entry templates + compile-time constants -> one CUDA translation unit.

A template is a ``.cu`` file with ``{{NAME}}`` placeholders. Rendering is plain string substitution
(never ``str.format`` / ``eval`` on caller data): every placeholder must receive a constant and every
constant must be used, so a misspelt name fails loudly instead of compiling a different kernel.
The special placeholder ``{{EXTRA_CODE}}`` receives generated code (for example the PTX wrappers of
the wgmma shapes a config needs).

Templates instantiate exactly one kernel through ``DFG_DEFINE_KERNEL`` (include/deep_fp8_gemm/hal/ptx.cuh),
whose symbol is ``extern "C"``: the runtime finds it by name without a binary utility.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

from .paths import template_dir

EXTRA_CODE = "EXTRA_CODE"
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def cpp_literal(value: object) -> str:
    """A constant as C++ source: bools -> ``true``/``false``, ints -> decimal, enums -> their int value,
    strings verbatim (for type names and identifiers chosen by our own code, never user data).

    Raises:
        TypeError: floats and other types, whose C++ spelling would be ambiguous.
    """
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):  # also IntEnum members
        return str(int(value))
    if isinstance(value, str):
        return value
    raise TypeError(f"template constant must be bool, int or str, got {type(value).__name__}: {value!r}")


def render_string(template: str, constants: Mapping[str, object], extra_code: str = "", *, origin: str = "<string>") -> str:
    """Substitutes ``constants`` (and ``extra_code`` for ``{{EXTRA_CODE}}``) into ``template``.

    Raises:
        ValueError: a placeholder without a constant, a constant without a placeholder, or an
            ``EXTRA_CODE`` entry in ``constants``.
    """
    if EXTRA_CODE in constants:
        raise ValueError(f"{origin}: pass generated code via extra_code, not constants[{EXTRA_CODE!r}]")
    values = {name: cpp_literal(value) for name, value in constants.items()}
    values[EXTRA_CODE] = extra_code

    used = set(_PLACEHOLDER.findall(template))
    missing = sorted(used - values.keys())
    if missing:
        raise ValueError(f"{origin}: no constant for placeholder(s) {missing}")
    unused = sorted(set(constants) - used)
    if unused:
        raise ValueError(f"{origin}: constant(s) {unused} not used by the template")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def render(
    template_name: str,
    constants: Mapping[str, object],
    extra_code: str = "",
    *,
    directory: Path | None = None,
) -> str:
    """Renders ``<directory>/<template_name>`` (default directory: :func:`.paths.template_dir`).

    Raises:
        FileNotFoundError: no such template.
        ValueError: see :func:`render_string`.
    """
    path = (template_dir() if directory is None else directory) / template_name
    return render_string(path.read_text(), constants, extra_code, origin=str(path))


def kernel_name(prefix: str, source: str) -> str:
    """Deterministic unique symbol for a rendered source: ``f"{prefix}_{sha256(source)[:16]}"``.

    Templates take the name as a constant, so the hash is over the source rendered *without* it
    (callers pass that text); the same configuration always gets the same symbol.
    """
    if not _IDENTIFIER.fullmatch(prefix):
        raise ValueError(f"kernel name prefix must be a C identifier, got {prefix!r}")
    return f"{prefix}_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
