"""The swap-AB dense kernels (config.GemmConfig.swap_ab; include/deep_fp8_gemm/policy_swap_ab.cuh), executed by the
CPU simulator against the float64 model (tests/_operands.py): every token tile (8, 16, 24, 32) and both weight
tiles (64, 128: one and two m64 waves), odd m, several token blocks, N tails inside and across a 128-row scale block,
a K tail, split-K, and planted bugs (a token scale of the wrong column, a weight scale of the wrong block, the tile
stored untransposed, the stage released before the token scales were read) that must be caught."""

from __future__ import annotations

import shutil
import zlib
from typing import NamedTuple

import pytest
import torch

from deep_fp8_gemm import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.config import GemmConfig, check_config, get_config
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.simulator import SimulationError
from tests._mutate import mutated_headers
from tests._operands import assert_within_one_bf16_ulp, gemm64
from tests.kernels.test_sim_gemm import quantised_operands

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


@pytest.fixture(autouse=True)
def exact_accumulation(monkeypatch):
    """fp32-exact wgmma sums: the comparisons are one bf16 ulp of float64 (the tensor-core model is the plain
    kernel's, covered by tests/kernels/test_sim_tensor_core.py; swap-AB changes which operand is which, not the MMA)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")


class SwapCase(NamedTuple):
    m: int
    n: int
    k: int
    block_m: int  # tokens (the wgmma's N)
    block_n: int  # weight rows (m64 waves)
    split_k: int
    grid: int


CASES = {
    "m1_bm8_bn64_n_tail_in_block": SwapCase(1, 200, 256, 8, 64, 1, 2),      # n tiles 0..3, the last 8 rows
    "m5_bm8_bn128_two_waves_k_tail": SwapCase(5, 136, 208, 8, 128, 1, 2),   # n 128..135 in scale block 1
    "m13_bm16_bn64_second_half_block": SwapCase(13, 192, 384, 16, 64, 1, 3),  # tile n0 = 64, 128 (blocks 0, 1)
    "m24_bm24_bn64": SwapCase(24, 128, 256, 24, 64, 1, 2),
    "m31_bm32_bn128": SwapCase(31, 256, 256, 32, 128, 1, 2),
    "m30_bm8_four_token_blocks": SwapCase(30, 128, 256, 8, 64, 1, 3),
    "m16_bm16_split_k_3": SwapCase(16, 128, 384, 16, 64, 3, 4),
}


def _config(case: SwapCase, stages: int = 3) -> GemmConfig:
    cfg = GemmConfig(kind="dense", shape_n=case.n, shape_k=case.k, num_groups=1, block_m=case.block_m,
                     block_n=case.block_n, num_stages=stages, cluster_m=1, cluster_n=1, band_width=16,
                     grid_size=case.grid, split_k=case.split_k, swap_ab=True)
    check_config(cfg)
    return cfg


def _run(case: SwapCase, seed: int):
    a, sa, b, sb = quantised_operands((case.m,), case.n, case.k, seed=seed)
    d = torch.full((case.m, case.n), float("nan"), dtype=torch.bfloat16)
    gemm.launch_1d2d(_config(case), a, get_col_major_tma_aligned_tensor(sa), b, sb, d, None, backend="sim")
    return d, gemm64(a, sa, b, sb)


@pytest.mark.parametrize("name", sorted(CASES))
def test_swap_ab_kernel_matches_float64(name):
    d, expected = _run(CASES[name], seed=zlib.crc32(name.encode()) % 1000)
    assert not d.isnan().any(), "rows or columns of D left unwritten"
    assert_within_one_bf16_ulp(d, expected)


def test_swap_ab_rows_past_m_and_columns_past_n_are_not_written():
    """The transposed tile's TMA store drops token rows >= m and weight rows >= n: a D view inside a larger,
    NaN-poisoned buffer keeps its poison outside the view."""
    case = CASES["m5_bm8_bn128_two_waves_k_tail"]
    a, sa, b, sb = quantised_operands((case.m,), case.n, case.k, seed=7)
    big = torch.full((case.m + 3, case.n + 24), float("nan"), dtype=torch.bfloat16)
    d = big[:case.m, :case.n]
    gemm.launch_1d2d(_config(case), a, get_col_major_tma_aligned_tensor(sa), b, sb, d, None, backend="sim")
    assert_within_one_bf16_ulp(d, gemm64(a, sa, b, sb))
    assert big[case.m:].isnan().all() and big[:, case.n:].isnan().all()


def test_config_rules():
    with pytest.raises(ValueError, match="swap_ab: block_m"):
        check_config(GemmConfig(kind="dense", shape_n=256, shape_k=256, num_groups=1, block_m=64, block_n=64,
                                num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=1, swap_ab=True))
    with pytest.raises(ValueError, match="swap_ab: block_n"):
        check_config(GemmConfig(kind="dense", shape_n=256, shape_k=256, num_groups=1, block_m=16, block_n=96,
                                num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=1, swap_ab=True))
    with pytest.raises(ValueError, match=r"swap_ab is a kernel of the kinds \(.dense.,\)"):
        check_config(GemmConfig(kind="masked", shape_n=256, shape_k=256, num_groups=2, block_m=16, block_n=64,
                                num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=1, swap_ab=True))
    cfg = _config(CASES["m31_bm32_bn128"])
    assert (cfg.num_math_warpgroups, cfg.waves_m, cfg.mma_rows, cfg.mma_cols, cfg.mma_n) == (1, 2, 128, 32, 32)
    assert cfg.kernel_name().endswith("_swapab") and cfg.template_constants()["SWAP_AB"]


def test_heuristic_picks_swap_ab_only_where_the_model_says_it_pays():
    """The fast mode's pick rule: dense, m <= 32, modelled >= 10% faster than the best plain config
    (config.heuristic._best_swap_ab); the batch-invariant mode never picks it."""
    fast = dict(batch_invariant=False)
    narrow = get_config(1, 576, 7168, 1, "dense", 132, **fast)
    assert narrow.swap_ab and narrow.block_m == 8
    assert not get_config(1, 576, 7168, 1, "dense", 132).swap_ab  # invariant (the default)
    assert not get_config(64, 576, 7168, 1, "dense", 132, **fast).swap_ab  # m > 32: never
    assert not get_config(16, 4096, 7168, 1, "dense", 132, **fast).swap_ab  # both at the model's HBM floor (< 1% apart)


# ---------------------------------------------------------------------------------------------- planted bugs
VALUE = "const float s0 = sa.pair[j].x * sb, s1 = sa.pair[j].y * sb;"
PLANTED = {
    # the token scale of the neighbouring column pair (j + 1 wraps within the tile)
    "token_scale_wrong_column": ("policy_swap_ab.cuh", VALUE,
                                 "const float s0 = sa.pair[(j + 1) % (BLOCK_M / 8)].x * sb, "
                                 "s1 = sa.pair[(j + 1) % (BLOCK_M / 8)].y * sb;"),
    # the tokens' scales read as one scale per row pair (lane / 4 instead of lane % 4)
    "token_scale_lane_mapping": ("policy_swap_ab.cuh", "sa + 8 * j + 2 * (lane % 4)", "sa + 8 * j + 2 * (lane / 4 % 4)"),
    # the tile stored untransposed: feature-major where D is token-major
    "stored_untransposed": ("policy_swap_ab.cuh", "d[m * BLOCK_N + n] =", "d[n * BLOCK_M + m] ="),
    # the weight scale of the tile's first 128-row block for every tile (tiles past n = 128 get block 0's)
    "weight_scale_block_zero": ("kernels/fp8_gemm.cuh",
                                "const float* sb_row0 = params.sb + (tile.group * kNumScaleBlocksN + cols.block0) * kNumKBlocks;",
                                "const float* sb_row0 = params.sb + (tile.group * kNumScaleBlocksN + 0) * kNumKBlocks;"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path, monkeypatch):
    header, original, planted = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, header, original, planted)
    case = CASES["m13_bm16_bn64_second_half_block"]
    try:
        d, expected = _run(case, seed=3)
    except SimulationError:
        return
    with pytest.raises(AssertionError):
        assert not d.isnan().any()
        assert_within_one_bf16_ulp(d, expected)


def test_planted_stage_released_before_the_token_scales_are_read(tmp_path, monkeypatch):
    """Reading the token scales in the promotion, after the stage's release, lets the producer overwrite them: the
    simulator's adversarial schedules (producer far ahead) catch it."""
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh",
                    "                if constexpr (kSwapAB)\n                    sa_cols.load(sa, lane);\n", "")
    mutated_headers_again = (
        "                                promote_swap_ab<BLOCK_M>(acc[w], scratch, sb0, sa_cols);",
        "                                sa_cols.load(sa, lane);\n"
        "                                promote_swap_ab<BLOCK_M>(acc[w], scratch, sb0, sa_cols);")
    target = tmp_path / "include" / "deep_fp8_gemm" / "kernels" / "fp8_gemm.cuh"
    text = target.read_text()
    assert text.count(mutated_headers_again[0]) == 1
    target.write_text(text.replace(*mutated_headers_again))
    case = SwapCase(16, 128, 1024, 16, 64, 1, 1)  # one CTA, 8 K blocks through a 2-stage ring
    caught = None
    for seed in (1, 2, 3, 4, 5, 6):
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        a, sa, b, sb = quantised_operands((case.m,), case.n, case.k, seed=seed)
        d = torch.full((case.m, case.n), float("nan"), dtype=torch.bfloat16)
        try:
            gemm.launch_1d2d(_config(case, stages=2), a, get_col_major_tma_aligned_tensor(sa), b, sb, d, None,
                             backend="sim")
        except SimulationError as e:
            caught = str(e)
            break
        try:
            assert_within_one_bf16_ulp(d, gemm64(a, sa, b, sb))
        except AssertionError as e:
            caught = str(e)
            break
    assert caught is not None, "a promotion reading the released stage went unnoticed"
