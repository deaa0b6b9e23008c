"""GPU tests of the FP8-output and SwiGLU GEMMs (issue 27) on an sm_90 device (skipped, with the reason, anywhere
else): the kernels against their CPU references (the quantiser on the float32 GEMM), the SwiGLU kernels against the
unfused path, and the MoE layer's fused forward against the unfused one and the CPU.

Metrics: calc_diff of the dequantised outputs (``D * sD`` per 128 columns). The kernel and the reference (the
families' ``reference``, run on the GPU in float32) sum in different orders, so a scale may be one ulp apart and an
e4m3 value one step: calc_diff < 1e-4 between them; the simulator checks the bits with exact sums
(tests/kernels/test_sim_fp8_output.py).

The cases are module-level tables (``GPU_CASE_TABLES``) and :func:`launch_cases` spells out every GEMM launched here:
tests/gpu/test_gpu_cases.py checks them on the CPU with the library's own rules.
"""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff
from deep_fp8_gemm.moe import FP8MoE, fp8_moe_forward, fp8_moe_forward_masked
from deep_fp8_gemm.ops import outputs
from deep_fp8_gemm.quant import silu_mul_quant

from tests.gpu.test_gpu_gemm import contiguous_rows, contiguous_sizes, operands

pytestmark = pytest.mark.gpu

# (m, n, k): DeepSeek-V3 dense shapes at decode and prefill sizes, a partial last scale group (2112 = 16.5 x 128)
FP8_DENSE = [(1, 2112, 7168), (64, 4096, 7168), (128, 7168, 2048), (2048, 7168, 2048), (333, 576, 7168)]
# (G, rows per group, n, k) of the grouped FP8-output kinds
FP8_GROUPED = [(4, 256, 4096, 7168), (8, 32, 7168, 2048)]
# (G, rows per group, 2I, H): DeepSeek-V3's up-projection (I = 2048, H = 7168) at prefill and decode sizes
SWIGLU = [(4, 512, 4096, 7168), (8, 32, 4096, 7168), (32, 8, 4096, 7168)]
GPU_CASE_TABLES = (FP8_DENSE, FP8_GROUPED, SWIGLU)


def launch_cases() -> list[dict]:
    """Every GEMM launched by this module's tests (``kind``, ``a_shape``, ``n``, ``k``, ``groups``, ``expected_m``)."""
    cases = [dict(kind="dense_fp8out", a_shape=(m, k), n=n, k=k, test="test_dense_fp8out") for m, n, k in FP8_DENSE]
    for g, m, n, k in FP8_GROUPED:
        rows = contiguous_rows(contiguous_sizes(g, m))
        for kind in ("contiguous_fp8out", "psum_fp8out"):
            cases.append(dict(kind=kind, a_shape=(rows, k), n=n, k=k, groups=g, test="test_grouped_fp8out"))
        cases.append(dict(kind="masked_fp8out", a_shape=(g, 2 * m, k), n=n, k=k, groups=g, expected_m=m,
                          test="test_grouped_fp8out"))
    for g, m, n, k in SWIGLU:
        rows = contiguous_rows(contiguous_sizes(g, m))
        cases.append(dict(kind="contiguous_swiglu", a_shape=(rows, k), n=n, k=k, groups=g, test="test_swiglu"))
        cases.append(dict(kind="contiguous", a_shape=(rows, k), n=n, k=k, groups=g, test="test_swiglu (unfused)"))
        cases.append(dict(kind="masked_swiglu", a_shape=(g, 2 * m, k), n=n, k=k, groups=g, expected_m=m,
                          test="test_swiglu"))
    return cases


def dequantised(d, sd):
    return d.float() * sd.repeat_interleave(128, dim=-1)[..., :d.shape[-1]]


def poisoned(lead, rows, n_out):
    d, sd = outputs.empty_out(lead, rows, n_out, "cuda")
    d.view(torch.uint8).fill_(0x7F)
    sd.fill_(float("nan"))
    return d, sd


def cpu(t):
    return t.cpu() if isinstance(t, torch.Tensor) else tuple(x.cpu() for x in t)


@pytest.mark.parametrize("m,n,k", FP8_DENSE)
def test_dense_fp8out(m, n, k):
    a, sa, b, sb = operands((m,), n, k, seed=m)
    out = poisoned((), m, n)
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), out)
    ref = outputs.empty_out((), m, n, "cpu")
    dfg.gemm_fp8_fp8_fp8_nt((a.cpu(), sa.cpu()), (b.cpu(), sb.cpu()), ref)
    got = dequantised(*cpu(out))
    assert not got.isnan().any(), f"unwritten output at {m=} {n=} {k=}"
    assert calc_diff(got, dequantised(*ref)) < 1e-4
    bf16 = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), bf16)
    assert calc_diff(got, bf16.cpu()) < 2e-3


@pytest.mark.parametrize("g,m,n,k", FP8_GROUPED)
def test_grouped_fp8out(g, m, n, k):
    sizes = contiguous_sizes(g, m)
    rows = contiguous_rows(sizes)
    a, sa, b, sb = operands((rows,), n, k, groups=g, seed=g)
    align = dfg.get_m_alignment_for_contiguous_layout()
    m_indices, ends, start = [], [], 0
    for e, s in enumerate(sizes):
        m_indices += [e] * s + [-1] * (-s % align)
        ends.append(start + s)
        start += s + (-s % align)
    m_indices = torch.tensor(m_indices, dtype=torch.int32, device="cuda")
    valid = (m_indices >= 0).cpu()
    ref = outputs.empty_out((), rows, n, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous(cpu((a, sa)), cpu((b, sb)), ref, m_indices.cpu())
    for call, layout in ((dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous, m_indices),
                         (dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum,
                          torch.tensor(ends, dtype=torch.int32, device="cuda"))):
        out = poisoned((), rows, n)
        call((a, sa), (b, sb), out, layout)
        got = dequantised(*cpu(out))[valid]
        assert not got.isnan().any() and calc_diff(got, dequantised(*ref)[valid]) < 1e-4
    am, sam, bm, sbm = operands((g, 2 * m), n, k, groups=g, seed=g + 1)
    masked_m = torch.tensor([min(2 * m, s) for s in sizes], dtype=torch.int32, device="cuda")
    out = poisoned((g,), 2 * m, n)
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked((am, sam), (bm, sbm), out, masked_m, m)
    ref = outputs.empty_out((g,), 2 * m, n, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked(cpu((am, sam)), cpu((bm, sbm)), ref, masked_m.cpu(), m)
    for e, c in enumerate(masked_m.tolist()):
        if c:
            got = dequantised(*cpu(out))[e, :c]
            assert not got.isnan().any() and calc_diff(got, dequantised(*ref)[e, :c]) < 1e-4


@pytest.mark.parametrize("g,m,n,k", SWIGLU)
def test_swiglu(g, m, n, k):
    """The fused up-projection against its CPU reference and the unfused GPU path (bf16 GEMM + silu_mul_quant)."""
    sizes = contiguous_sizes(g, m)
    rows = contiguous_rows(sizes)
    a, sa, w, sw = operands((rows,), n, k, groups=g, seed=3 * g)
    sw = sw / 16  # keep the products in SiLU's interesting range
    wi, swi = dfg.interleave_swiglu_weights(w, sw)
    align = dfg.get_m_alignment_for_contiguous_layout()
    m_indices = torch.tensor(sum(([e] * s + [-1] * (-s % align) for e, s in enumerate(sizes)), []),
                             dtype=torch.int32, device="cuda")
    valid = (m_indices >= 0).cpu()
    out = poisoned((), rows, n // 2)
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (wi, swi), out, m_indices)
    got = dequantised(*cpu(out))[valid]
    ref = outputs.empty_out((), rows, n // 2, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu(cpu((a, sa)), cpu((wi, swi)), ref, m_indices.cpu())
    assert not got.isnan().any() and calc_diff(got, dequantised(*ref)[valid]) < 1e-4
    gate_up = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (w, sw), gate_up, m_indices)
    plain = dequantised(*cpu(silu_mul_quant(gate_up)))[valid]
    assert calc_diff(got, plain) <= 2e-3
    am, sam, _, _ = operands((g, 2 * m), n, k, groups=g, seed=3 * g + 1)
    masked_m = torch.tensor([min(2 * m, s) for s in sizes], dtype=torch.int32, device="cuda")
    out = poisoned((g,), 2 * m, n // 2)
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu((am, sam), (wi, swi), out, masked_m, m)
    ref = outputs.empty_out((g,), 2 * m, n // 2, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu(cpu((am, sam)), cpu((wi, swi)), ref, masked_m.cpu(), m)
    for e, c in enumerate(masked_m.tolist()):
        if c:
            assert calc_diff(dequantised(*cpu(out))[e, :c], dequantised(*ref)[e, :c]) < 1e-4


def test_moe_layer_fused_on_the_gpu():
    """FP8MoE on the GPU: the fused forward against the CPU's and against the unfused GPU forward; the masked
    fused forward under a CUDA graph replay."""
    from tests.model.test_moe import E, _inputs  # its sizes: H = 256, I = 128 (one output group per expert)

    torch.manual_seed(0)
    module = FP8MoE.from_weights(torch.randn(E, 2 * 128, 256, dtype=torch.bfloat16) / 16,
                                 torch.randn(E, 256, 128, dtype=torch.bfloat16) / 11)
    hidden, ids, weights = _inputs(256, seed=11, drop=0.1, empty_experts=(3,))
    host = module(hidden, ids, weights)
    module = module.cuda()
    assert module.swiglu_pair is not None and module.w13_swiglu.is_cuda
    fused = module(hidden.cuda(), ids.cuda(), weights.cuda()).cpu()
    w = (module.w13, module.w13_scale, module.w2, module.w2_scale)
    plain = fp8_moe_forward(hidden.cuda(), ids.cuda(), weights.cuda(), *w).cpu()
    assert calc_diff(fused, host) < 1e-4 and calc_diff(fused, plain) <= 2e-3
    h = torch.randn(E, 16, 256, dtype=torch.bfloat16, device="cuda")
    counts = torch.tensor([16, 0, 3, 1, 16, 5, 0, 9], dtype=torch.int32, device="cuda")
    fp8_moe_forward_masked(h, counts, *w, w13_swiglu=module.swiglu_pair)  # compile and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_moe_forward_masked(h, counts, *w, w13_swiglu=module.swiglu_pair)
    counts.copy_(torch.tensor([1, 16, 0, 7, 2, 16, 4, 0], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    expected = fp8_moe_forward_masked(h.cpu(), counts.cpu(), *(t.cpu() for t in w),
                                      w13_swiglu=tuple(t.cpu() for t in module.swiglu_pair))
    for e, c in enumerate(counts.tolist()):
        if c:
            assert calc_diff(out[e, :c].cpu(), expected[e, :c]) < 1e-4
