"""The MXFP4 masked kernel (issue 42) on an sm_90 GPU (skipped, with the reason, anywhere else): Kimi-K3 / DeepSeek-V3
expert shapes at decode token counts through ``m_grouped_fp8_fp4_gemm_nt_masked`` (recipe_b (1, 32)) against float64 of
the dequantised operands, folded and per-32 blocks, an empty expert, rows past masked_m untouched; twenty calls bitwise
equal. Its cases are legal tiles (``kernels.mxfp4_gemm.Mxfp4Config``), checked on the CPU below."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm.kernels import mxfp4_gemm

from tests._gpu import requires_sm90
from tests.kernels.test_sim_mxfp4 import activations, check, dequantised_product, weights

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
