"""The real GEMM kernels, executed by the CPU simulator, against the reference (calc_diff < 1e-3).

Every case forces a config so that each code path runs: BLOCK_M 64 / 128 / 256 (one or two math
warpgroups, one or two m64 waves), multicast of A and of B (2-CTA clusters, including the unicast tail of an odd m-block count),
BLOCK_N that straddles 128-column scale blocks, m not a multiple of BLOCK_M, n not a multiple of
BLOCK_N, a K tail, the contiguous layout with padding rows and empty experts, the masked layout with
masked_m of 0 / partial / full. Outputs are NaN-poisoned first so unwritten elements show.
"""

from __future__ import annotations

import dataclasses
import shutil
import zlib
from typing import NamedTuple

import pytest
import torch

from deep_fp8_gemm import calc_diff, get_col_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
from deep_fp8_gemm import reference
from deep_fp8_gemm.config import GemmConfig, check_config, smem_bytes
from deep_fp8_gemm.kernels import gemm

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


def make_config(kind, n, k, block_m, block_n, *, groups=1, stages=3, cluster=(1, 1), grid=2, band=16):
    cfg = GemmConfig(kind=kind, shape_n=n, shape_k=k, num_groups=groups, block_m=block_m, block_n=block_n, num_stages=stages, cluster_m=cluster[0], cluster_n=cluster[1], band_width=band, grid_size=grid)
    check_config(cfg)
    return cfg


def quantised_operands(m_shape, n, k, groups=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*m_shape, k, generator=g)
    a_fp8, sa = per_token_cast_to_fp8(a.reshape(-1, k))
    a_fp8 = a_fp8.reshape(*m_shape, k)
    sa = sa.reshape(*m_shape, -1)
    b_shape = (groups, n, k) if groups else (n, k)
    b = torch.randn(*b_shape, generator=g)
    if groups:
        pairs = [per_block_cast_to_fp8(b[i]) for i in range(groups)]
        b_fp8 = torch.stack([p[0] for p in pairs])
        sb = torch.stack([p[1] for p in pairs])
    else:
        b_fp8, sb = per_block_cast_to_fp8(b)
    return a_fp8, sa, b_fp8, sb


def run_sim(cfg, a, sa, b, sb, d, layout=None):
    gemm.launch_1d2d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, sb, d, layout, backend="sim")


class DenseCase(NamedTuple):
    m: int
    n: int
    k: int
    block_m: int
    block_n: int
    cluster: tuple[int, int]
    stages: int
    grid: int


DENSE_CASES = {
    "bm64_bn16_small_m": DenseCase(7, 256, 256, 64, 16, (1, 1), 4, 3),
    "bm128_two_warpgroups_tail_m": DenseCase(130, 128, 384, 128, 64, (1, 1), 3, 2),
    "bm256_two_waves": DenseCase(200, 96, 256, 256, 32, (1, 1), 2, 1),
    # the large-M pick since the register model's recalibration: 256 x 128 with A multicast, a partial 2nd m-block
    "bm256_bn128_multicast_a": DenseCase(300, 256, 256, 256, 128, (1, 2), 2, 2),
    "bn112_straddles_scale_blocks": DenseCase(64, 336, 256, 64, 112, (1, 1), 3, 3),
    "bn144_straddles_n_tail": DenseCase(65, 296, 128, 64, 144, (1, 1), 2, 2),
    "multicast_a": DenseCase(128, 256, 256, 64, 64, (1, 2), 3, 4),
    # Odd m-block counts (3): the last m-block row is the tail, loaded without multicast, two n-blocks per
    # cluster tile; with an odd n-block count (5) the last tail tile's second CTA has a phantom n-block.
    "multicast_b_odd_m_blocks_odd_n_blocks": DenseCase(150, 160, 256, 64, 32, (2, 1), 3, 2),
    "multicast_b_odd_m_blocks_even_n_blocks": DenseCase(130, 128, 384, 64, 32, (2, 1), 2, 4),
    "k_tail": DenseCase(64, 128, 208, 64, 128, (1, 1), 2, 1),
}


@pytest.mark.parametrize("case", sorted(DENSE_CASES))
def test_dense(case):
    c = DENSE_CASES[case]
    cfg = make_config("dense", c.n, c.k, c.block_m, c.block_n, cluster=c.cluster, stages=c.stages, grid=c.grid)
    m, n, k = c.m, c.n, c.k
    a, sa, b, sb = quantised_operands((m,), n, k, seed=zlib.crc32(case.encode()) % 1000)
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d)
    ref = torch.empty_like(d)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    assert not d.isnan().any(), "kernel left output elements unwritten"
    assert calc_diff(d, ref) < 1e-3


def contiguous_layout(sizes, align=128):
    rows = []
    for e, s in enumerate(sizes):
        padded = (s + align - 1) // align * align
        rows += [e] * s + [-1] * (padded - s)
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("block_m,cluster", [(128, (1, 1)), (64, (1, 2))])
def test_contiguous_padding_and_empty_experts(block_m, cluster):
    n, k, groups = 256, 256, 4
    sizes = [70, 0, 128, 1]  # partial block, empty expert, exact block, single row
    layout = contiguous_layout(sizes)
    m_sum = layout.numel()
    cfg = make_config("contiguous", n, k, block_m, 64, groups=groups, cluster=cluster, grid=2 * cluster[1])
    a, sa, b, sb = quantised_operands((m_sum,), n, k, groups=groups, seed=block_m)
    d = torch.full((m_sum, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, layout)
    ref = torch.full_like(d, float("nan"))
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, layout)
    valid = layout >= 0
    assert not d[valid].isnan().any()
    assert calc_diff(d[valid], ref[valid]) < 1e-3
    # Blocks made only of padding rows are never computed: their rows stay untouched (NaN).
    padding_blocks = [blk for blk in range(m_sum // block_m) if (layout[blk * block_m:(blk + 1) * block_m] < 0).all()]
    for blk in padding_blocks:
        assert d[blk * block_m:(blk + 1) * block_m].isnan().all(), f"padding-only block {blk} was written"


@pytest.mark.parametrize("block_m,cluster", [(64, (1, 1)), (128, (1, 2))])
def test_masked(block_m, cluster):
    n, k, groups, m_max = 256, 256, 4, 160
    masked_m = torch.tensor([0, 37, m_max, 129], dtype=torch.int32)
    cfg = make_config("masked", n, k, block_m, 64, groups=groups, cluster=cluster, grid=2 * cluster[1])
    a, sa, b, sb = quantised_operands((groups, m_max), n, k, groups=groups, seed=block_m + 1)
    d = torch.full((groups, m_max, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, masked_m)
    ref = torch.full_like(d, float("nan"))
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), ref, masked_m, int(masked_m.max()))
    for g, rows in enumerate(masked_m.tolist()):
        if rows:
            assert not d[g, :rows].isnan().any()
            assert calc_diff(d[g, :rows], ref[g, :rows]) < 1e-3
    assert d[0].isnan().all(), "a group with masked_m == 0 must cost nothing and write nothing"


def test_config_smem_matches_kernel_map():
    """The kernel static_asserts this equality; here the formula is also pinned for one config by hand."""
    # D 64x64 bf16 = 8192; 3 stages x (A 8192 + B 8192 + the record: sA 256, sB 16, full and empty barriers 16,
    # padded to 384 so that the next record's sA, a TMA destination, is 128-byte aligned).
    assert smem_bytes(64, 64, 3) == 8192 + 3 * (8192 + 8192 + 384)


def test_public_ops_simulate_env(monkeypatch):
    """DFG_SIMULATE=1 routes the public ops on CPU tensors through the simulator (heuristic configs)."""
    import deep_fp8_gemm as dfg
    from deep_fp8_gemm.kernels import gemm as gemm_module

    launched = []
    real_run = gemm_module.launch_1d2d
    monkeypatch.setattr(gemm_module, "launch_1d2d", lambda cfg, *args: (launched.append(cfg.kind), real_run(cfg, *args))[1])
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "3")
    n, k = 128, 256

    a, sa, b, sb = quantised_operands((5,), n, k, seed=11)
    d = torch.full((5, n), float("nan"), dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), d)
    ref = torch.empty_like(d)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    assert calc_diff(d, ref) < 1e-3

    layout = contiguous_layout([3, 0, 130])
    a, sa, b, sb = quantised_operands((layout.numel(),), n, k, groups=3, seed=12)
    d = torch.full((layout.numel(), n), float("nan"), dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), d, layout)
    ref = torch.empty_like(d)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, layout)
    assert calc_diff(d[layout >= 0], ref[layout >= 0]) < 1e-3

    masked_m = torch.tensor([2, 0], dtype=torch.int32)
    a, sa, b, sb = quantised_operands((2, 8), n, k, groups=2, seed=13)
    d = torch.full((2, 8, n), float("nan"), dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), d, masked_m, 2)
    ref = torch.empty_like(d)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), ref, masked_m, 2)
    assert calc_diff(d[0, :2], ref[0, :2]) < 1e-3
    assert launched == ["dense", "contiguous", "masked"], "the ops did not go through the simulator"


@pytest.mark.parametrize("alignment", [128, 64])
def test_contiguous_m_sum_not_a_multiple_of_the_alignment(monkeypatch, alignment):
    """Issue 40: the reference design accepts any m_sum (Hugging Face transformers' experts path leaves -1 rows at
    the tail of an unrounded buffer). The public op through the simulator: the partial last block's rows are
    computed with its expert (its last row is row m_sum - 1) or, padding only, left untouched, exactly as the CPU
    reference does; the tensor maps clip the rows past m_sum."""
    import deep_fp8_gemm as dfg

    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "3")
    dfg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        # 222 rows: expert 0 (128), expert 1 (64), 30 rows of -1; at 64 the last block is padding only.
        layout = torch.tensor([0] * 128 + [1] * 64 + [-1] * 30, dtype=torch.int32)
        n, k = 128, 256
        a, sa, b, sb = quantised_operands((layout.numel(),), n, k, groups=2, seed=40)
        d = torch.full((layout.numel(), n), float("nan"), dtype=torch.bfloat16)
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), d, layout)
        monkeypatch.delenv("DFG_SIMULATE")
        ref = torch.full_like(d, float("nan"))
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, layout)
    finally:
        dfg.set_mk_alignment_for_contiguous_layout(128)
    untouched = ref.isnan().all(1)
    assert torch.equal(d.isnan().all(1), untouched) and not d[~untouched].isnan().any()
    assert untouched[192:].all() == (alignment == 64) and not untouched[:192].any()
    assert calc_diff(d[~untouched], ref[~untouched]) < 1e-3
