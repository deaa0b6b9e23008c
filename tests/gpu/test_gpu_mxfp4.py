"""The MXFP4 masked kernel (issue 42) on an sm_90 GPU (skipped, with the reason, anywhere else): Kimi-K3 / DeepSeek-V3
expert shapes at decode token counts through ``m_grouped_fp8_fp4_gemm_nt_masked`` (recipe_b (1, 32)) against float64 of
the dequantised operands, folded and per-32 blocks, an empty expert, rows past masked_m untouched; twenty calls bitwise
equal. Its cases are legal tiles (``kernels.mxfp4_gemm.Mxfp4Config``), checked on the CPU below."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm.kernels import mxfp4_gemm

from tests._gpu import requires_sm90
from tests.kernels.test_sim_mxfp4 import activations, check, contiguous_rows, dequantised_product, weights

pytestmark = [pytest.mark.gpu]

# (G, N, K, m_max, masked_m per expert (cycled), expected_m, per-32 rows)
MXFP4_CASES = [(8, 6144, 3584, 16, (1, 8, 0, 16), 8, 0), (8, 3584, 3072, 8, (8, 3, 0), 4, 2),
               (4, 4096, 7168, 32, (32, 17, 0, 5), 16, 3), (16, 7168, 2048, 64, (64, 0, 40), 32, 0)]


def test_cases_are_legal_tiles():
    """Runs everywhere: every case's pick is a legal config (N, K, stages within shared memory)."""
    for g, n, k, _, _, expected_m, _ in MXFP4_CASES:
        mxfp4_gemm.pick_config(n, k, g, expected_m, 132)


@requires_sm90
@pytest.mark.parametrize("case", MXFP4_CASES)
def test_mxfp4_masked_against_float64(case):
    from deep_fp8_gemm.compat.api import m_grouped_fp8_fp4_gemm_nt_masked

    g, n, k, m_max, masked, expected_m, wide = case
    w, sf = weights(g, n, k, wide_rows=tuple((e, 64 * e + 1) for e in range(wide)))
    a, sa = activations(g, m_max, k)
    want = dequantised_product(a, sa, w, sf)
    masked_m = torch.tensor([masked[e % len(masked)] for e in range(g)], dtype=torch.int32)
    dev = torch.device("cuda")
    d = torch.full((g, m_max, n), 7.0, dtype=torch.bfloat16, device=dev)
    args = ((a.to(dev), sa.to(dev)), (w.to(dev), sf.to(dev)), d, masked_m.to(dev), expected_m)
    m_grouped_fp8_fp4_gemm_nt_masked(*args, recipe_a=(1, 128), recipe_b=(1, 32))
    first = d.clone()
    check(d.cpu(), want, masked_m)
    for _ in range(20):
        m_grouped_fp8_fp4_gemm_nt_masked(*args, recipe_a=(1, 128), recipe_b=(1, 32))
        assert torch.equal(d, first)


# (alignment, psum): vLLM's DeepGemmFP4Experts call, both layouts (issue 43)
CONTIGUOUS_CASES = [(64, False), (128, False), (64, True), (128, True)]
GPU_CASE_TABLES = (MXFP4_CASES, CONTIGUOUS_CASES)


def test_contiguous_cases_are_legal_tiles():
    for alignment, psum in CONTIGUOUS_CASES:
        mxfp4_gemm.pick_config(128, 256, 3, 32, 132, "psum" if psum else "contiguous", alignment)


@requires_sm90
@pytest.mark.parametrize("case", CONTIGUOUS_CASES)
def test_mxfp4_contiguous_against_float64(case):
    import deep_fp8_gemm
    from deep_fp8_gemm.compat.api import m_grouped_fp8_fp4_gemm_nt_contiguous
    from deep_fp8_gemm.utils import calc_diff
    from tests.kernels.test_sim_mxfp4 import contiguous_case

    alignment, psum = case
    deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        a, sa, w, sf, d, layout, m_indices = contiguous_case(alignment, psum)
        want = dequantised_product(a.unsqueeze(0), sa.unsqueeze(0), w, sf)
        dev = torch.device("cuda")
        out = d.to(dev)
        m_grouped_fp8_fp4_gemm_nt_contiguous((a.to(dev), sa.to(dev)), (w.to(dev), sf.to(dev)), out, layout.to(dev),
                                             use_psum_layout=psum, recipe_a=(1, 128), recipe_b=(1, 32))
    finally:
        deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(128)
    out = out.cpu()
    for e in range(3):
        rows = (m_indices == e).nonzero().view(-1)
        if len(rows):
            assert calc_diff(out[rows].double(), want[e, rows]) <= 1e-3
    assert bool((out[-alignment:] == 7.0).all())  # the padding-only block untouched


# The prefill kernel with the shared-memory conversion stage (issue 43, kernel="convert"): (G, N, K, alignment, psum,
# tokens per expert (cycled)) at expert shapes, folded and per-32 waves; every row's bits against the register-A kernel.
CONVERT_CASES = [(4, 6144, 3584, 128, False, (300, 0, 129, 1)), (4, 7168, 2048, 64, True, (64, 200, 0, 17))]
GPU_CASE_TABLES = (*GPU_CASE_TABLES, CONVERT_CASES)


def test_convert_cases_are_legal_tiles():
    for g, n, k, alignment, psum, _ in CONVERT_CASES:
        mxfp4_gemm.pick_convert_config(n, k, g, "psum" if psum else "contiguous", alignment)


@requires_sm90
@pytest.mark.parametrize("case", CONVERT_CASES)
def test_mxfp4_convert_against_float64_and_register_a_bits(case):
    """The conversion kernel on the GPU: within calc_diff 1e-3 of float64 of the dequantised operands, padding-only
    blocks untouched, and a row's bits equal to the register-A kernel's (the bit contract, which rests on the tensor
    core's D(A, B) = D(B, A)^T: test_gpu_confirms_the_model_assumptions_and_the_fragment_layout checks it)."""
    import deep_fp8_gemm
    from deep_fp8_gemm.ops import mxfp4
    from deep_fp8_gemm.utils import calc_diff

    g, n, k, alignment, psum, counts = case
    counts = [counts[e % len(counts)] for e in range(g)]
    w, sf = weights(g, n, k)
    sf[0, 70, 1] = sf[0, 70, 0] * 2.0 ** -30  # expert 0's wave 1 takes the per-32 path in K block 0
    a, sa, layout, m_indices = contiguous_rows(counts, alignment, psum, k)
    m_sum = m_indices.numel()
    want = dequantised_product(a.unsqueeze(0), sa.unsqueeze(0), w, sf)
    dev = torch.device("cuda")
    p = mxfp4.prepare_mxfp4_weights(w.to(dev), sf.to(dev))
    outs = {}
    deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        for kernel in ("convert", "register_a"):
            out = torch.full((m_sum, n), 7.0, dtype=torch.bfloat16, device=dev)
            mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous((a.to(dev), sa.to(dev)), p, out, layout.to(dev),
                                                            use_psum_layout=psum, kernel=kernel)
            outs[kernel] = out.cpu()
    finally:
        deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(128)
    out = outs["convert"]
    for e in range(g):
        rows_e = (m_indices == e).nonzero().view(-1)
        if len(rows_e):
            assert calc_diff(out[rows_e].double(), want[e, rows_e]) <= 1e-3
    assert bool((out[-alignment:] == 7.0).all())
    assert torch.equal(out.view(torch.int16), outs["register_a"].view(torch.int16))


@requires_sm90
@pytest.mark.parametrize("case", CONVERT_CASES)
def test_mxfp4_convert_fp8_output_equals_register_a(case):
    """The conversion kernel's FP8 output on the GPU: D and sD bit for bit the register-A kernel's FP8 output, and
    dequantised D within calc_diff 1e-3 of float64."""
    import deep_fp8_gemm
    from deep_fp8_gemm.ops import mxfp4
    from deep_fp8_gemm.utils import calc_diff, empty_m_major

    g, n, k, alignment, psum, counts = case
    counts = [counts[e % len(counts)] for e in range(g)]
    w, sf = weights(g, n, k)
    a, sa, layout, m_indices = contiguous_rows(counts, alignment, psum, k, tail_block=False)
    m_sum = m_indices.numel()
    want = dequantised_product(a.unsqueeze(0), sa.unsqueeze(0), w, sf)
    dev = torch.device("cuda")
    p = mxfp4.prepare_mxfp4_weights(w.to(dev), sf.to(dev))
    outs = {}
    deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        for kernel in ("convert", "register_a"):
            d = torch.zeros((m_sum, n), device=dev).to(torch.float8_e4m3fn)
            sd = empty_m_major((m_sum, n // 128), dev).zero_()
            mxfp4.m_grouped_gemm_fp8_fp4_fp8_nt_contiguous((a.to(dev), sa.to(dev)), p, (d, sd), layout.to(dev),
                                                            use_psum_layout=psum, kernel=kernel)
            outs[kernel] = (d.cpu(), sd.cpu())
    finally:
        deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(128)
    (d, sd), (d_ref, sd_ref) = outs["convert"], outs["register_a"]
    assert torch.equal(d.view(torch.uint8), d_ref.view(torch.uint8)) and torch.equal(sd, sd_ref)
    for e in range(g):
        rows_e = (m_indices == e).nonzero().view(-1)
        if len(rows_e):
            deq = d[rows_e].float() * sd[rows_e].repeat_interleave(128, -1)
            assert calc_diff(deq.double(), want[e, rows_e]) <= 1e-3
