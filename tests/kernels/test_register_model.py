"""The heuristic's register model (config.math_registers_needed) against ptxas: the tiles on both sides of the
232-register budget of two math warpgroups are compiled for sm_90a (NVRTC) and each verdict of the model — fits, or
rejected by check_config — must be what ptxas does: spill-free, or spilling. The heuristic stays a pure function
(no compile inside get_config); this test is where its constants are calibrated, and where a kernel change that
moves the boundary shows (then recalibrate MATH_REGISTER_OVERHEAD and say so in its comment).
"""

from __future__ import annotations

import pytest

from deep_fp8_gemm.config import (FP32_ACCUMULATE_KINDS, SMEM_LIMIT, GemmConfig, max_stages, check_config,
                                  math_registers_needed)
from deep_fp8_gemm.kernels.gemm import render_source
from deep_fp8_gemm.runtime.compiler import compile_kernel

# (kind, shape_n, shape_k, groups, block_m, block_n): DeepSeek-V3 shapes, the largest tiles each family's rules allow
# around the boundary (BLOCK_N <= 160 keeps a tile within two sB blocks; 256 rows are two m64 waves per warpgroup).
TILES = [
    ("dense", 7168, 16384, 1, 256, 128),          # model 232 of 232: fits (the large-M pick)
    ("dense", 7168, 16384, 1, 256, 144),          # model 256: rejected; ptxas spills 24 B
    ("masked", 4096, 7168, 4, 256, 128),          # fits
    ("masked", 4096, 7168, 4, 256, 144),          # rejected; ptxas spills 120 B
    ("dense_fp8out", 7168, 16384, 1, 256, 128),   # fits (the FP8 epilogue needs no more than the accumulators)
    ("masked_swiglu", 4096, 7168, 4, 128, 256),   # one wave of 256 + the 128-column chunk: 232, fits
    ("1d1d", 7168, 4096, 1, 256, 96),             # the fp32-accumulate kinds: fits (model 224)
    ("dense", 7168, 16384, 1, 128, 160),          # one wave: every legal one-wave tile fits
]


def _config(kind, n, k, groups, block_m, block_n):
    stages = max_stages(block_m, block_n, SMEM_LIMIT, kind)
    return GemmConfig(kind=kind, shape_n=n, shape_k=k, num_groups=groups, block_m=block_m, block_n=block_n,
                      num_stages=stages, cluster_m=1, cluster_n=1, band_width=16, grid_size=132)


def _model_fits(cfg) -> bool:
    try:
        check_config(cfg)
    except ValueError as exc:
        assert "registers per math thread" in str(exc), f"{cfg.kernel_name()} is illegal for another reason: {exc}"
        return False
    return True


@pytest.mark.parametrize("tile", TILES, ids=[f"{t[0]}_{t[4]}x{t[5]}" for t in TILES])
def test_register_model_agrees_with_ptxas(tile):
    cfg = _config(*tile)
    fits = _model_fits(cfg)
    resources = compile_kernel(cfg.kernel_name(), render_source(cfg)).resources
    spills = resources.spill_bytes > 0 or resources.stack_bytes > 0
    needed = math_registers_needed(cfg.kind, cfg.block_m, cfg.block_n)
    what = (f"{cfg.kernel_name()}: the model needs {needed} of {cfg.math_registers} registers "
            f"({'fits' if fits else 'rejected'}); ptxas: {resources.spill_bytes} B spilled, {resources.stack_bytes} B stack")
    if fits:
        assert not spills, what + " — the model admits a tile that spills: raise its overhead"
    elif cfg.kind not in FP32_ACCUMULATE_KINDS:  # the 1D1D overhead is not yet calibrated on its rejected side
        assert spills, what + " — the model rejects a tile ptxas fits: lower its overhead"


def test_the_boundary_is_tested_on_both_sides():
    """Each calibrated family has a tile the model admits at the budget's edge and one it rejects, so the test above
    pins the overhead from both sides (it would pass any overhead otherwise)."""
    verdicts = {}
    for tile in TILES:
        cfg = _config(*tile)
        if cfg.kind in FP32_ACCUMULATE_KINDS:
            continue
        verdicts.setdefault(cfg.kind, set()).add(_model_fits(cfg))
    assert verdicts["dense"] == {True, False} and verdicts["masked"] == {True, False}
