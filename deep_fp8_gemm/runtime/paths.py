"""Where the device headers and the kernel entry templates are.

Two layouts are supported:

* installed wheel: headers at ``deep_fp8_gemm/_include`` and templates at ``deep_fp8_gemm/_jit``
  (setup.py copies them into the package);
* source tree / editable install: ``<repo>/include`` and ``<repo>/jit``.

The packaged copies win when present, so an installed package never reads a stale source tree.
"""

from __future__ import annotations

import functools
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../deep_fp8_gemm
_REPO_DIR = _PACKAGE_DIR.parent

# File that marks a directory as our include root (kernels write `#include <deep_fp8_gemm/...>`).
_INCLUDE_MARKER = Path("deep_fp8_gemm") / "common.cuh"
_HEADER_SUFFIXES = (".cuh", ".hpp", ".h")


@functools.lru_cache(maxsize=None)
def include_dir() -> Path:
    """The directory that contains ``deep_fp8_gemm/common.cuh`` (passed to NVRTC as ``-I``).

    Raises:
        FileNotFoundError: neither the packaged nor the source-tree headers exist.
    """
    candidates = (_PACKAGE_DIR / "_include", _REPO_DIR / "include")
    for candidate in candidates:
        if (candidate / _INCLUDE_MARKER).is_file():
            return candidate
    raise FileNotFoundError(
        f"deep_fp8_gemm device headers not found: looked for {_INCLUDE_MARKER} under "
        + ", ".join(str(c) for c in candidates)
    )


@functools.lru_cache(maxsize=None)
def template_dir() -> Path:
    """The directory of kernel entry templates (``*.cu`` files rendered by :mod:`.render`).

    Raises:
        FileNotFoundError: neither ``deep_fp8_gemm/_jit`` nor ``<repo>/jit`` exists.
    """
    candidates = (_PACKAGE_DIR / "_jit", _REPO_DIR / "jit")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("deep_fp8_gemm kernel templates not found: looked in " + ", ".join(map(str, candidates)))


def header_files(root: Path | None = None) -> list[Path]:
    """Every ``*.cuh`` / ``*.hpp`` / ``*.h`` file under ``root`` (default :func:`include_dir`), sorted.

    The JIT cache key hashes all of them: a kernel may include any of our headers, and hashing the
    whole (small) tree is cheaper and safer than tracking ``#include`` graphs.
    """
    base = include_dir() if root is None else root
    return sorted(p for p in base.rglob("*") if p.suffix in _HEADER_SUFFIXES and p.is_file())
