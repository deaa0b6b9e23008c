"""The swap-AB dense kernels on an sm_90 GPU (skipped, with the reason, anywhere else): each token tile and weight
tile, forced through ``kernels.gemm.launch_1d2d`` with odd m, N tails and split-K, against the float64 reference;
the heuristic's swap-AB picks through the public op; bitwise repeatability; a CUDA graph replayed with new inputs.
Every case is checked for legality on the CPU by tests/gpu/test_gpu_cases.py (family ``swap_ab``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.config import SMEM_LIMIT, check_config, get_config, smem_bytes
from deep_fp8_gemm.kernels import gemm

from tests._gpu import requires_sm90
from tests.gpu.test_gpu_gemm import nan_like, operands

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fast_mode")]  # split-K / swap-AB picks: issue 37


# (m, n, k, block_m, block_n, split_k)
SWAP_AB_FORCED = [(1, 576, 7168, 8, 64, 14), (5, 200, 896, 8, 64, 1), (13, 2112, 7168, 16, 64, 4),
                  (24, 4096, 7168, 24, 64, 1), (31, 576, 7168, 32, 128, 1), (30, 7168, 2048, 8, 128, 1)]
# The heuristic's swap-AB picks on DeepSeek-V3's n = 576, k = 7168 (bench/PREDICTIONS.md, decode table).
SWAP_AB_PICKS = [(1, 576, 7168), (8, 576, 7168), (16, 576, 7168), (32, 576, 7168)]
GPU_CASE_TABLES = (SWAP_AB_FORCED, SWAP_AB_PICKS)


def forced_config(case):
    m, n, k, block_m, block_n, split_k = case
    base = get_config(m, n, k, 1, "dense", dfg.get_num_sms() if torch.cuda.is_available() else 132, swap_ab=True)
    stages = max(s for s in range(2, 17) if smem_bytes(block_m, block_n, s) <= SMEM_LIMIT)
    cfg = dataclasses.replace(base, block_m=block_m, block_n=block_n, split_k=split_k, num_stages=stages,
                              grid_size=min(-(-m // block_m) * -(-n // block_n) * split_k, 132))
    check_config(cfg)
    return cfg


def launch_cases() -> list[dict]:
    """Every GEMM this module launches (tests/gpu/test_gpu_cases.py, family ``swap_ab``)."""
    cases = [dict(kind="dense", a_shape=(c[0], c[2]), n=c[1], k=c[2], config=forced_config(c),
                  test=f"test_forced_swap_ab[{c}]") for c in SWAP_AB_FORCED]
    cases += [dict(kind="dense", a_shape=(m, k), n=n, k=k, test="test_heuristic_swap_ab_picks") for m, n, k in SWAP_AB_PICKS]
    return cases


def _reference(a, sa, b, sb, m, n):
    ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    return ref


@requires_sm90
@pytest.mark.parametrize("case", SWAP_AB_FORCED)
def test_forced_swap_ab(case):
    m, n, k = case[:3]
    cfg = forced_config(case)
    a, sa, b, sb = operands((m,), n, k, seed=case[3])
    out = nan_like((m, n))
    gemm.launch_1d2d(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, None, backend="cuda")
    ref = _reference(a, sa, b, sb, m, n)
    torch.cuda.synchronize()
    assert not out.isnan().any() and calc_diff(out, ref) < 1e-3, cfg.kernel_name()


@requires_sm90
@pytest.mark.parametrize("m,n,k", SWAP_AB_PICKS)
def test_heuristic_swap_ab_picks(m, n, k):
    assert get_config(m, n, k, 1, "dense", dfg.get_num_sms(), batch_invariant=False).swap_ab
    a, sa, b, sb = operands((m,), n, k, seed=m)
    out = nan_like((m, n))
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    ref = _reference(a, sa, b, sb, m, n)
    again = nan_like((m, n))
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), again)
    torch.cuda.synchronize()
    assert not out.isnan().any() and calc_diff(out, ref) < 1e-3
    assert torch.equal(out, again), "fixed summation order: the same bits every call"


@requires_sm90
def test_swap_ab_graph_replay_with_new_inputs():
    m, n, k = SWAP_AB_PICKS[1]
    a, sa, b, sb = operands((m,), n, k, seed=1)
    out = nan_like((m, n))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    for seed in (2, 3):
        a2, sa2, _, _ = operands((m,), n, k, seed=seed)
        a.copy_(a2)
        sa.copy_(sa2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any() and calc_diff(out, _reference(a, sa, b, sb, m, n)) < 1e-3
