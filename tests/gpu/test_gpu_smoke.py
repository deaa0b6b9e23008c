"""The smoke step of bench/device_check.sh: one GEMM per kind (and per multicast variant) at a small shape and
the three fused quantisers, each a few milliseconds of GPU time, run first under the watchdog build
(``DFG_WATCHDOG_SECONDS``) with a per-test timeout, so a hang or a wrong result is named within a minute.
Together with tests/gpu/test_gpu_jit.py::test_tma_round_trip (one round trip per swizzle) it is the whole step.

Cases are module-level data (``GPU_CASE_TABLES``, :func:`launch_cases`, :func:`quant_calls`), checked on the
CPU by tests/gpu/test_gpu_cases.py. The odd m-block count of ``multicast_b_odd_m_blocks`` is the 2-CTA tail of
the scheduler (one CTA of the last pair has no m-block).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.config import GemmConfig, check_config
from deep_fp8_gemm.kernels import gemm, targets
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.quant import per_block_cast_to_fp8_torch, per_token_cast_to_fp8_torch
from tests.gpu.test_gpu_gemm import contiguous_rows, nan_like, operands
from tests.kernels.test_quant_kernels import _assert_same, _assert_silu_close

pytestmark = pytest.mark.gpu

# (m, n, k): the heuristic's config
SMOKE_DENSE = [(200, 512, 512)]
# name -> (m, n, k, block_m, block_n, stages, (cluster_m, cluster_n))
SMOKE_FORCED = {
    "multicast_a": (256, 512, 512, 128, 128, 3, (1, 2)),
    "multicast_b_odd_m_blocks": (384, 512, 512, 128, 128, 3, (2, 1)),
}
SMOKE_FORCED_NAMES = sorted(SMOKE_FORCED)
SMOKE_CONTIGUOUS = [([100, 0, 200], 512, 512)]  # (valid rows per expert, n, k)
SMOKE_MASKED = [(2, 64, 512, 512)]  # (G, expected m, n, k); m_max = 2 x expected m
SMOKE_QUANT = [(128, 512)]  # (m, k), bf16: per-token and per-block of [m, k], SiLU-mul of [m, 2k]
SMOKE_FP8 = [(200, 512, 512)]  # (m, n, k): gemm_fp8_fp8_fp8_nt (issue 27)
SMOKE_SWIGLU = [([100, 0, 200], 512, 512)]  # (valid rows per expert, 2I, H): the contiguous SwiGLU kernel
GPU_CASE_TABLES = (SMOKE_DENSE, SMOKE_FORCED_NAMES, SMOKE_CONTIGUOUS, SMOKE_MASKED, SMOKE_QUANT, SMOKE_FP8,
                   SMOKE_SWIGLU)


def forced_config(name: str) -> tuple[int, GemmConfig]:
    m, n, k, bm, bn, stages, cluster = SMOKE_FORCED[name]
    return m, GemmConfig(kind="dense", shape_n=n, shape_k=k, num_groups=1, block_m=bm, block_n=bn, num_stages=stages, cluster_m=cluster[0], cluster_n=cluster[1], band_width=16 // cluster[1], grid_size=132)


def launch_cases() -> list[dict]:
    """Every GEMM this module launches, in tests/gpu/test_gpu_gemm.py's ``launch_cases`` format."""
    cases = [dict(kind="dense", a_shape=(m, k), n=n, k=k, test="smoke dense") for m, n, k in SMOKE_DENSE]
    for name in SMOKE_FORCED_NAMES:
        m, cfg = forced_config(name)
        cases.append(dict(kind="dense", a_shape=(m, cfg.shape_k), n=cfg.shape_n, k=cfg.shape_k, config=cfg,
                          test=f"smoke {name}"))
    cases += [dict(kind="contiguous", a_shape=(contiguous_rows(sizes), k), n=n, k=k, groups=len(sizes),
                   test="smoke contiguous") for sizes, n, k in SMOKE_CONTIGUOUS]
    cases += [dict(kind="masked", a_shape=(g, 2 * em, k), n=n, k=k, groups=g, expected_m=em, test="smoke masked")
              for g, em, n, k in SMOKE_MASKED]
    cases += [dict(kind="dense_fp8out", a_shape=(m, k), n=n, k=k, test="smoke fp8out") for m, n, k in SMOKE_FP8]
    cases += [dict(kind="contiguous_swiglu", a_shape=(contiguous_rows(sizes), k), n=n, k=k, groups=len(sizes),
                   test="smoke swiglu") for sizes, n, k in SMOKE_SWIGLU]
    return cases


def quant_calls() -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [c for m, k in SMOKE_QUANT for c in (("per_token", (m, k), torch.bfloat16),
                                                ("per_block", (m, k), torch.bfloat16),
                                                ("silu_mul", (m, 2 * k), torch.bfloat16))]


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    torch.cuda.synchronize()
    assert not out.isnan().any(), "unwritten output elements"
    assert calc_diff(out, ref) < 1e-3


@pytest.mark.parametrize("m,n,k", SMOKE_DENSE)
def test_smoke_dense(m, n, k):
    a, sa, b, sb = operands((m,), n, k, seed=1)
    out, ref = nan_like((m, n)), torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    _check(out, ref)


@pytest.mark.parametrize("name", SMOKE_FORCED_NAMES)
def test_smoke_multicast(name):
    m, cfg = forced_config(name)
    check_config(cfg)
    a, sa, b, sb = operands((m,), cfg.shape_n, cfg.shape_k, seed=2)
    out, ref = nan_like((m, cfg.shape_n)), torch.empty(m, cfg.shape_n, device="cuda", dtype=torch.bfloat16)
    gemm.launch_1d2d(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, None, backend="cuda")
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    _check(out, ref)


@pytest.mark.parametrize("sizes,n,k", SMOKE_CONTIGUOUS)
def test_smoke_contiguous(sizes, n, k):
    align = dfg.get_m_alignment_for_contiguous_layout()
    rows = []
    for e, s in enumerate(sizes):
        rows += [e] * s + [-1] * ((s + align - 1) // align * align - s)
    m_indices = torch.tensor(rows, dtype=torch.int32, device="cuda")
    a, sa, b, sb = operands((len(rows),), n, k, groups=len(sizes), seed=3)
    out, ref = nan_like((len(rows), n)), torch.empty(len(rows), n, device="cuda", dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, m_indices)
    valid = m_indices >= 0
    _check(out[valid], ref[valid])


@pytest.mark.parametrize("g,expected_m,n,k", SMOKE_MASKED)
def test_smoke_masked(g, expected_m, n, k):
    m_max = 2 * expected_m
    a, sa, b, sb = operands((g, m_max), n, k, groups=g, seed=4)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    masked_m = torch.tensor([m_max] + [expected_m // 3 + 1] * (g - 1), dtype=torch.int32, device="cuda")
    out, ref = nan_like((g, m_max, n)), torch.empty(g, m_max, n, device="cuda", dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, expected_m)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), ref, masked_m, expected_m)
    for i, rows in enumerate(masked_m.tolist()):
        _check(out[i, :rows], ref[i, :rows])


@pytest.mark.parametrize("m,k", SMOKE_QUANT)
def test_smoke_quantisers(m, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    _assert_same(kq.per_token_cast_to_fp8_cuda(x), per_token_cast_to_fp8_torch(x))
    _assert_same(kq.per_block_cast_to_fp8_cuda(x), per_block_cast_to_fp8_torch(x))
    gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
    y = F.silu(gate_up[:, :k].float()) * gate_up[:, k:].float()
    _assert_silu_close(kq.silu_mul_quant_cuda(gate_up), per_token_cast_to_fp8_torch(y))


def _dequantised(d, sd):
    return d.float() * sd.repeat_interleave(128, dim=-1)[..., :d.shape[-1]]


@pytest.mark.parametrize("m,n,k", SMOKE_FP8)
def test_smoke_fp8_output(m, n, k):
    from deep_fp8_gemm.ops import FAMILIES, outputs

    a, sa, b, sb = operands((m,), n, k, seed=5)
    out, ref = outputs.empty_out((), m, n, "cuda"), outputs.empty_out((), m, n, "cuda")
    out[1].fill_(float("nan"))
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), out)
    FAMILIES["dense_fp8out"].reference((a, sa), (b, sb), ref)
    _check(_dequantised(*out), _dequantised(*ref))


@pytest.mark.parametrize("sizes,n,k", SMOKE_SWIGLU)
def test_smoke_swiglu(sizes, n, k):
    from deep_fp8_gemm.ops import FAMILIES, outputs

    align = dfg.get_m_alignment_for_contiguous_layout()
    rows = []
    for e, s in enumerate(sizes):
        rows += [e] * s + [-1] * ((s + align - 1) // align * align - s)
    m_indices = torch.tensor(rows, dtype=torch.int32, device="cuda")
    a, sa, w, sw = operands((len(rows),), n, k, groups=len(sizes), seed=6)
    w, sw = dfg.interleave_swiglu_weights(w, sw / 16)
    out, ref = outputs.empty_out((), len(rows), n // 2, "cuda"), outputs.empty_out((), len(rows), n // 2, "cuda")
    out[1].fill_(float("nan"))
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (w, sw), out, m_indices)
    FAMILIES["contiguous_swiglu"].reference((a, sa), (w, sw), ref, m_indices)
    valid = m_indices >= 0
    _check(_dequantised(*out)[valid], _dequantised(*ref)[valid])
