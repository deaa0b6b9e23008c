"""GPU tests of the three GEMM ops on an sm_90 device (skipped, with the reason, anywhere else).

Each result is compared with deep_fp8_gemm.reference (run on the GPU in float32) by calc_diff < 1e-3;
outputs are NaN-poisoned first, so an element the kernel fails to write shows up.
"""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.config import GemmConfig, check_config
from deep_fp8_gemm.kernels import gemm

pytestmark = pytest.mark.gpu

DEEPSEEK_V3_DENSE = gemm.DEEPSEEK_V3_DENSE


def operands(m_shape, n, k, groups=None, seed=0):
    torch.manual_seed(seed)
    a = torch.randn(*m_shape, k, device="cuda")
    a_fp8, sa = dfg.per_token_cast_to_fp8(a.reshape(-1, k))
    a_fp8, sa = a_fp8.view(*m_shape, k), sa.reshape(*m_shape, -1)
    w = torch.randn(*((groups,) if groups else ()), n, k, device="cuda")
    if groups:
        pairs = [dfg.per_block_cast_to_fp8(w[g]) for g in range(groups)]
        b, sb = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    else:
        b, sb = dfg.per_block_cast_to_fp8(w)
    return a_fp8, sa, b, sb


def nan_like(shape):
    return torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)


def check_dense(m, n, k, seed=0):
    a, sa, b, sb = operands((m,), n, k, seed=seed)
    out = nan_like((m, n))
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    ref = torch.empty_like(out)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"unwritten output elements at {m=} {n=} {k=}"
    diff = calc_diff(out, ref)
    assert diff < 1e-3, f"{m=} {n=} {k=}: calc_diff={diff:.2e}"
    return a, sa, b, sb, out


@pytest.mark.parametrize("n,k", DEEPSEEK_V3_DENSE)
@pytest.mark.parametrize("m", [1, 64, 128, 4096])
def test_dense_deepseek_v3(m, n, k):
    check_dense(m, n, k)


@pytest.mark.parametrize("m,n,k", [(1, 7168, 1152), (7, 2112, 576), (63, 7168, 1152), (65, 2112, 576),
                                   (129, 200, 512), (1000, 7168, 1152), (333, 2104, 7168), (17, 4096, 80)])
def test_dense_odd_shapes(m, n, k):
    check_dense(m, n, k, seed=m)


def test_dense_deterministic_and_streams():
    a, sa, b, sb, out = check_dense(300, 2112, 7168, seed=5)
    second = nan_like(out.shape)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), second)
    stream.synchronize()
    assert torch.equal(out, second), "a second run (non-default stream) is not bitwise identical"


def test_dense_cuda_graph():
    m, n, k = 64, 4096, 7168
    a, sa, b, sb = operands((m,), n, k, seed=9)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    out = nan_like((m, n))
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)  # compile + warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    new_a, new_sa, _, _ = operands((m,), n, k, seed=10)
    a.copy_(new_a)
    sa.copy_(dfg.get_col_major_tma_aligned_tensor(new_sa))
    out.fill_(float("nan"))
    graph.replay()
    ref = torch.empty_like(out)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    torch.cuda.synchronize()
    assert calc_diff(out, ref) < 1e-3


FORCED = {
    # kind-independent paths forced on the GPU: (m, n, k, block_m, block_n, stages, cluster)
    "multicast_a": (1024, 4096, 2048, 128, 128, 5, (1, 2)),
    "multicast_b_odd_m_blocks": (640, 2112, 2048, 128, 96, 5, (2, 1)),
    "bm256": (512, 2048, 1024, 256, 128, 3, (1, 1)),
    "bn144": (256, 1152, 1024, 128, 144, 4, (1, 1)),
    "bm64_bn160": (64, 1600, 1024, 64, 160, 5, (1, 1)),
}


@pytest.mark.parametrize("case", sorted(FORCED))
def test_dense_forced_configs(case):
    m, n, k, bm, bn, stages, cluster = FORCED[case]
    cfg = GemmConfig("dense", n, k, 1, bm, bn, stages, cluster[0], cluster[1], 16 // cluster[1], 132)
    check_config(cfg)
    a, sa, b, sb = operands((m,), n, k, seed=3)
    out = nan_like((m, n))
    gemm.run(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, None, backend="cuda")
    ref = torch.empty_like(out)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    torch.cuda.synchronize()
    assert not out.isnan().any() and calc_diff(out, ref) < 1e-3


def contiguous_problem(sizes, n, k, seed):
    align = dfg.get_m_alignment_for_contiguous_layout()
    rows = []
    for e, s in enumerate(sizes):
        rows += [e] * s + [-1] * ((s + align - 1) // align * align - s)
    m_indices = torch.tensor(rows, dtype=torch.int32, device="cuda")
    a, sa, b, sb = operands((len(rows),), n, k, groups=len(sizes), seed=seed)
    return a, sa, b, sb, m_indices


@pytest.mark.parametrize("num_groups,m_per_group,n,k", [(4, 8192, 4096, 7168), (8, 4096, 7168, 2048),
                                                         (32, 256, 4096, 7168)])
def test_contiguous(num_groups, m_per_group, n, k):
    g = torch.Generator().manual_seed(num_groups)
    sizes = [int(m_per_group * (0.7 + 0.6 * torch.rand(1, generator=g).item())) for _ in range(num_groups)]
    sizes[1] = 0  # an empty expert
    a, sa, b, sb, m_indices = contiguous_problem(sizes, n, k, seed=num_groups)
    m_indices[: 128] = -1  # an all-padding block at the front (its rows are unspecified)
    out = nan_like((m_indices.numel(), n))
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    ref = torch.empty_like(out)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, m_indices)
    valid = m_indices >= 0
    torch.cuda.synchronize()
    assert not out[valid].isnan().any()
    assert calc_diff(out[valid], ref[valid]) < 1e-3


@pytest.mark.parametrize("num_groups,expected_m,n,k", [(4, 256, 4096, 7168), (8, 32, 7168, 2048), (2, 1024, 7168, 2048)])
def test_masked_and_graph_replay(num_groups, expected_m, n, k):
    m_max = expected_m * 2
    a, sa, b, sb = operands((num_groups, m_max), n, k, groups=num_groups, seed=expected_m)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    masked_m = torch.tensor([0, m_max] + [expected_m // 3 + 1] * (num_groups - 2), dtype=torch.int32, device="cuda")

    def check(out):
        ref = torch.empty_like(out)
        reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), ref, masked_m, expected_m)
        torch.cuda.synchronize()
        for g, rows in enumerate(masked_m.tolist()):
            if rows:
                assert not out[g, :rows].isnan().any()
                assert calc_diff(out[g, :rows], ref[g, :rows]) < 1e-3, f"group {g}"

    out = nan_like((num_groups, m_max, n))
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, expected_m)
    check(out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, expected_m)
    masked_m.copy_(torch.tensor([m_max, 0] + [expected_m] * (num_groups - 2), dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    check(out)
