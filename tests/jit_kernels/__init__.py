"""Small real kernels for the JIT runtime tests (compiled, never launched) and shared fixtures.

``wgmma_probe.cu`` + ``wgmma_n8.cuh``: a header-using warp-specialised kernel (setmaxnreg, mbarrier, TMA
3-D loads, one FP8 wgmma m64n8k32) whose SASS has QGMMA / UTMALDG / USETMAXREG.
``spill.cu``: spills under ``--maxrregcount=32``. ``setmaxnreg_no_bounds.cu``: ptxas C7508.
``syntax_error.cu``: fails to compile.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

KERNEL_DIR = Path(__file__).resolve().parent
REPO_ROOT = KERNEL_DIR.parent.parent
SPILL_OPTIONS = ("--maxrregcount=32",)
PYTHON = sys.executable


def _render(template: str, constants: dict, extra_code: str = "") -> str:
    from deep_fp8_gemm.runtime.render import render

    return render(template, constants, extra_code, directory=KERNEL_DIR)


def probe_source(name: str = "dfg_test_probe", *, accumulate: bool = False, block_k: int = 32) -> str:
    """The wgmma probe kernel rendered with its wgmma n8 wrapper as extra code."""
    return _render("wgmma_probe.cu", {"KERNEL_NAME": name, "NUM_THREADS": 256, "BLOCK_K": block_k,
                                      "ACCUMULATE": accumulate}, (KERNEL_DIR / "wgmma_n8.cuh").read_text())


def simple_source(template: str, name: str) -> str:
    """One of the single-placeholder test kernels (spill, setmaxnreg_no_bounds, syntax_error)."""
    return _render(template, {"KERNEL_NAME": name})


def subprocess_env(**extra: str) -> dict:
    """Environment for child Python processes: the repository importable, plus ``extra``."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture
def jit_cache(tmp_path, monkeypatch):
    """An empty private disk cache (``DFG_JIT_CACHE_DIR``) and an empty in-process cache."""
    from deep_fp8_gemm.runtime import cache

    directory = tmp_path / "jit-cache"
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(directory))
    for name in ("DFG_JIT_DISABLE_CACHE", "DFG_JIT_DEBUG", "DFG_JIT_PTXAS_VERBOSE"):
        monkeypatch.delenv(name, raising=False)
    cache.clear_memory_cache()
    yield directory
    cache.clear_memory_cache()

