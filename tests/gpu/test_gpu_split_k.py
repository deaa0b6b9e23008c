"""Split-K on an sm_90 GPU (skipped, with the reason, anywhere else): the heuristic's few-tile decode shapes and
forced splits against the reference, bitwise reproducibility over repeated launches, the counters left at zero,
and a CUDA graph replayed with new inputs (the counters reset by the kernel itself)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.kernels import split_k
from deep_fp8_gemm.config import check_config, get_config
from deep_fp8_gemm.kernels import gemm

from tests.gpu.test_gpu_gemm import nan_like, operands

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fast_mode")]  # split-K / swap-AB picks: issue 37


# (m, n, k, split_k, block_m, block_n)
FORCED_SPLITS = [(7, 576, 7168, 2, 64, 32), (130, 2112, 7168, 4, 128, 64), (64, 576, 7168, 7, 64, 32),
                 (1, 200, 896, 7, 64, 16)]
DECODE_MS = [1, 16, 64, 128]


def _reference(a, sa, b, sb, m, n):
    ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    return ref


@pytest.mark.parametrize("m", DECODE_MS)
def test_heuristic_splits_the_narrow_decode_shape(m):
    cfg = get_config(m, 576, 7168, 1, "dense", dfg.get_num_sms())
    a, sa, b, sb = operands((m,), 576, 7168, seed=m)
    out = nan_like((m, 576))
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    ref = _reference(a, sa, b, sb, m, 576)
    torch.cuda.synchronize()
    assert not out.isnan().any() and calc_diff(out, ref) < 1e-3, cfg
    again = nan_like((m, 576))
    for _ in range(3):  # fixed summation order: the same bits whichever CTA finishes last
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), again)
        assert torch.equal(again, out)


@pytest.mark.parametrize("case", FORCED_SPLITS)
def test_forced_split(case):
    m, n, k, splits, bm, bn = case
    base = get_config(m, n, k, 1, "dense", dfg.get_num_sms(), batch_invariant=False)
    cfg = dataclasses.replace(base, block_m=bm, block_n=bn, num_stages=4, split_k=splits, cluster_m=1, cluster_n=1,
                              grid_size=min(dfg.get_num_sms(), -(-m // bm) * -(-n // bn) * splits))
    check_config(cfg)
    a, sa, b, sb = operands((m,), n, k, seed=splits)
    out = nan_like((m, n))
    gemm.launch_1d2d(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, None, backend="cuda")
    ref = _reference(a, sa, b, sb, m, n)
    torch.cuda.synchronize()
    assert not out.isnan().any() and calc_diff(out, ref) < 1e-3
    counters, _ = split_k.buffers(cfg, m, out.device, torch.cuda.current_stream().cuda_stream)
    assert not counters.any(), "the last split of every tile resets its counter"


def test_split_k_graph_replay_with_new_inputs():
    m, n, k = 16, 576, 7168
    assert get_config(m, n, k, 1, "dense", dfg.get_num_sms(), batch_invariant=False).split_k > 1
    a, sa, b, sb = operands((m,), n, k, seed=1)
    out = nan_like((m, n))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)  # workspace of this stream allocated before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    for seed in (2, 3, 4):
        a2, sa2, _, _ = operands((m,), n, k, seed=seed)
        a.copy_(a2)
        sa.copy_(sa2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any() and calc_diff(out, _reference(a, sa, b, sb, m, n)) < 1e-3, seed


def test_split_k_graphs_outlive_workspace_growth_and_run_side_by_side():
    """Review scenario (issue 25, item 3): a graph captures a small split-K launch; a later eager call needs a
    larger workspace (the per-stream cache grows and frees the old pair); a second graph captures a large launch;
    both graphs are replayed at once on two streams. Each captured launch owns its workspace, so both agree with
    the reference and neither sees the other's counters."""
    shapes = [(16, 576, 7168), (64, 2112, 7168)]
    for m, n, k in shapes + [(128, 2112, 7168)]:  # workspaces (132 SMs): 1 MiB, 2.1 MiB, then 4.4 MiB
        assert get_config(m, n, k, 1, "dense", dfg.get_num_sms(), batch_invariant=False).split_k > 1, (m, n, k)
    stream = torch.cuda.Stream()
    graphs, cases = [], []
    with torch.cuda.stream(stream):
        for i, (m, n, k) in enumerate(shapes):
            a, sa, b, sb = operands((m,), n, k, seed=10 + i)
            out = nan_like((m, n))
            dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)  # warm-up (JIT, plan) outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
            graphs.append(graph)
            cases.append((a, sa, b, sb, out, m, n))
            big = operands((128,), 2112, 7168, seed=99)  # eager growth of the stream's cached workspace
            dfg.gemm_fp8_fp8_bf16_nt(big[:2], big[2:], nan_like((128, 2112)))
    torch.cuda.synchronize()
    side = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(3):
        for (a, sa, b, sb, out, m, n) in cases:
            out.fill_(float("nan"))
        torch.cuda.synchronize()
        for graph, s in zip(graphs, side):
            with torch.cuda.stream(s):
                graph.replay()
        torch.cuda.synchronize()
        for (a, sa, b, sb, out, m, n) in cases:
            assert not out.isnan().any() and calc_diff(out, _reference(a, sa, b, sb, m, n)) < 1e-3, (m, n)
