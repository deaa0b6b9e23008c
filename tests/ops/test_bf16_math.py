"""The BF16 GEMMs' argument rules and float64 reference (deep_fp8_gemm._core.bf16_math; issue 41)."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm._core.bf16_math import LAYOUTS, bf16_gemm_operands, bf16_gemm_reference


def _inputs(layout: str, m=5, n=24, k=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(m, k, generator=g).bfloat16()
    B = torch.randn(n, k, generator=g).bfloat16()
    trans_a, trans_b = LAYOUTS[layout]
    return A, B, (A.T.contiguous() if trans_a else A), (B.T.contiguous() if trans_b else B)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_every_layout_is_nt_on_the_transposed_views(layout, out):
    A, B, a, b = _inputs(layout)
    d = torch.empty(5, 24, dtype=out)
    assert bf16_gemm_reference(layout, a, b, d) is d
    assert torch.equal(d, (A.double() @ B.double().T).to(out))
    c = torch.randn(5, 24).to(out)
    bf16_gemm_reference(layout, a, b, d, c)
    assert torch.equal(d, (c.double() + A.double() @ B.double().T).to(out))
    bf16_gemm_reference(layout, a, b, c, c)  # c may be d
    assert torch.equal(c, d)


def test_empty_problems_leave_d_untouched():
    d = torch.full((0, 8), 1.0)
    bf16_gemm_reference("nt", torch.zeros(0, 16, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16), d)


@pytest.mark.parametrize("call, error, message", [
    (lambda a, b, d: bf16_gemm_operands("nx", a, b, d), ValueError, r"layout must be one of \('nt', 'nn', 'tn', 'tt'\), got 'nx'"),
    (lambda a, b, d: bf16_gemm_operands("nt", a.float(), b, d), TypeError, r"a must be torch.bfloat16, got torch.float32"),
    (lambda a, b, d: bf16_gemm_operands("nt", a, b, d.half()), TypeError, r"d must be torch.bfloat16 or torch.float32, got torch.float16"),
    (lambda a, b, d: bf16_gemm_operands("nt", a, b.T, d), ValueError, r"shapes do not agree: a \(5, 48\) \(\[m, k\]\), b \(48, 24\)"),
    (lambda a, b, d: bf16_gemm_operands("nt", a, b, d.T.contiguous().T), ValueError, r"d must be row-major"),
    (lambda a, b, d: bf16_gemm_operands("nt", a, b, d, d.bfloat16()), TypeError, r"c must have d's dtype torch.float32"),
    (lambda a, b, d: bf16_gemm_operands("nt", a, b, d, d[:4]), ValueError, r"c must have d's shape \(5, 24\), got \(4, 24\)"),
    (lambda a, b, d: bf16_gemm_operands("nt", a[0], b, d), ValueError, r"a must be 2-D \[m, k\], got shape \(48,\)"),
    (lambda a, b, d: bf16_gemm_operands("nt", [1], b, d), TypeError, r"a must be a torch.Tensor, got list"),
])
def test_bad_arguments_are_named(call, error, message):
    _, _, a, b = _inputs("nt")
    with pytest.raises(error, match=message):
        call(a, b, torch.empty(5, 24))


def test_mn_major_operands_are_views_not_copies():
    """nn / tn / tt hand the kernel MN-major views (the bf16 wgmma's transpose), never a copy."""
    _, _, a, b = _inputs("tn")
    A, B, m, n, k = bf16_gemm_operands("tn", a, b, torch.empty(5, 24))
    assert (m, n, k) == (5, 24, 48) and A.data_ptr() == a.data_ptr() and B.stride() == (1, 24)
