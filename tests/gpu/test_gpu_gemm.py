"""GPU tests of the three GEMM ops on an sm_90 device (skipped, with the reason, anywhere else).

Each result is compared with deep_fp8_gemm.reference (run on the GPU in float32) by calc_diff < 1e-3;
outputs are NaN-poisoned first, so an element the kernel fails to write shows up.

Every case is module-level data (the UPPER_CASE tables below, listed in ``GPU_CASE_TABLES``), and
:func:`launch_cases` spells out every GEMM these tests launch; tests/gpu/test_gpu_cases.py checks all of them
on the CPU with the library's own rules (validation, check_config, tensor-map legality), so a GPU case
cannot become illegal unnoticed.
"""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.config import GemmConfig, check_config
from deep_fp8_gemm.kernels import gemm, targets

pytestmark = pytest.mark.gpu

DEEPSEEK_V3_DENSE = targets.DEEPSEEK_V3_DENSE


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


# ---------------------------------------------------------------------------------------------- cases
DENSE_MS = [1, 64, 128, 4096]
DENSE_ODD = [(1, 7168, 1152), (7, 2112, 576), (63, 7168, 1152), (65, 2112, 576), (129, 200, 512), (1000, 7168, 1152),
             (333, 2104, 7168), (17, 4096, 80)]
DENSE_STREAMS = (300, 2112, 7168)  # (m, n, k)
DENSE_GRAPH = (64, 4096, 7168)
# Configs forced on the GPU: (m, n, k, block_m, block_n, stages, (cluster_m, cluster_n)).
FORCED = {
    "multicast_a": (1024, 4096, 2048, 128, 128, 5, (1, 2)),
    "multicast_b_odd_m_blocks": (640, 2112, 2048, 128, 96, 5, (2, 1)),
    # The only two-wave (BLOCK_M=256) case: BLOCK_N=112 fits the register budget (3 x 56 + overhead <= 232;
    # 128 does not), 2240 = 20 x 112 columns, a tile straddling two sB blocks.
    "bm256": (512, 2240, 1024, 256, 112, 3, (1, 1)),
    "bn144": (256, 1152, 1024, 128, 144, 4, (1, 1)),
    "bm64_bn160": (64, 1600, 1024, 64, 160, 5, (1, 1)),
}
FORCED_NAMES = sorted(FORCED)
CONTIGUOUS = [(4, 8192, 4096, 7168), (8, 4096, 7168, 2048), (32, 256, 4096, 7168)]  # (G, m per group, n, k)
MASKED = [(4, 256, 4096, 7168), (8, 32, 7168, 2048), (2, 1024, 7168, 2048)]  # (G, expected m, n, k)
GPU_CASE_TABLES = (DEEPSEEK_V3_DENSE, DENSE_MS, DENSE_ODD, FORCED_NAMES, CONTIGUOUS, MASKED)


def forced_config(name: str) -> tuple[int, GemmConfig]:
    """``(m, config)`` of a FORCED case (band width 16 n-blocks, 132 SMs)."""
    m, n, k, bm, bn, stages, cluster = FORCED[name]
    return m, GemmConfig(kind="dense", shape_n=n, shape_k=k, num_groups=1, block_m=bm, block_n=bn, num_stages=stages, cluster_m=cluster[0], cluster_n=cluster[1], band_width=16 // cluster[1], grid_size=132)


def contiguous_sizes(num_groups: int, m_per_group: int) -> list[int]:
    """Valid rows per expert of a CONTIGUOUS case: 0.7-1.3 x m_per_group, expert 1 empty."""
    g = torch.Generator().manual_seed(num_groups)
    sizes = [int(m_per_group * (0.7 + 0.6 * torch.rand(1, generator=g).item())) for _ in range(num_groups)]
    sizes[1] = 0  # an empty expert
    return sizes


def contiguous_rows(sizes: list[int]) -> int:
    """m_sum of the contiguous layout: each expert padded to get_m_alignment_for_contiguous_layout() rows."""
    align = dfg.get_m_alignment_for_contiguous_layout()
    return sum((s + align - 1) // align * align for s in sizes)


def launch_cases() -> list[dict]:
    """Every GEMM the tests of this module launch: ``kind``, ``a_shape`` (A's shape), ``n``, ``k``, ``groups``,
    ``expected_m`` (masked), ``config`` (a forced GemmConfig, or None for the heuristic's), ``test``."""
    cases = [dict(kind="dense", a_shape=(m, k), n=n, k=k, test="test_dense_deepseek_v3")
             for n, k in DEEPSEEK_V3_DENSE for m in DENSE_MS]
    cases += [dict(kind="dense", a_shape=(m, k), n=n, k=k, test="test_dense_odd_shapes") for m, n, k in DENSE_ODD]
    cases += [dict(kind="dense", a_shape=(m, k), n=n, k=k, test=t)
              for (m, n, k), t in ((DENSE_STREAMS, "test_dense_deterministic_and_streams"),
                                   (DENSE_GRAPH, "test_dense_cuda_graph"))]
    for name in FORCED_NAMES:
        m, cfg = forced_config(name)
        cases.append(dict(kind="dense", a_shape=(m, cfg.shape_k), n=cfg.shape_n, k=cfg.shape_k, config=cfg,
                          test=f"test_dense_forced_configs[{name}]"))
    for g, m, n, k in CONTIGUOUS:
        cases.append(dict(kind="contiguous", a_shape=(contiguous_rows(contiguous_sizes(g, m)), k), n=n, k=k, groups=g,
                          test="test_contiguous"))
    for g, expected_m, n, k in MASKED:
        cases.append(dict(kind="masked", a_shape=(g, 2 * expected_m, k), n=n, k=k, groups=g, expected_m=expected_m,
                          test="test_masked_and_graph_replay"))
    return cases


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("n,k", DEEPSEEK_V3_DENSE)
@pytest.mark.parametrize("m", DENSE_MS)
def test_dense_deepseek_v3(m, n, k):
    check_dense(m, n, k)


@pytest.mark.parametrize("m,n,k", DENSE_ODD)
def test_dense_odd_shapes(m, n, k):
    check_dense(m, n, k, seed=m)


def test_dense_deterministic_and_streams():
    a, sa, b, sb, out = check_dense(*DENSE_STREAMS, seed=5)
    second = nan_like(out.shape)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), second)
    stream.synchronize()
    assert torch.equal(out, second), "a second run (non-default stream) is not bitwise identical"


def test_dense_cuda_graph():
    m, n, k = DENSE_GRAPH
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


@pytest.mark.parametrize("case", FORCED_NAMES)
def test_dense_forced_configs(case):
    m, cfg = forced_config(case)
    check_config(cfg)
    n, k = cfg.shape_n, cfg.shape_k
    a, sa, b, sb = operands((m,), n, k, seed=3)
    out = nan_like((m, n))
    gemm.launch_1d2d(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, None, backend="cuda")
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


@pytest.mark.parametrize("num_groups,m_per_group,n,k", CONTIGUOUS)
def test_contiguous(num_groups, m_per_group, n, k):
    sizes = contiguous_sizes(num_groups, m_per_group)
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


@pytest.mark.parametrize("num_groups,expected_m,n,k", MASKED)
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
