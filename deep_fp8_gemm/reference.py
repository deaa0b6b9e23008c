"""The exact reference of every public GEMM op, under the op's own name and signature (old path: each reference
lives in its family's module of :mod:`deep_fp8_gemm.ops`, next to the op it defines).

The references check types, dtypes, ranks, exact shapes and devices like the ops do, but accept any strides and
any ``n`` / ``k`` / ``m_sum``, and they *do* read ``m_indices`` / ``masked_m`` / group ends on the host (the ops'
CUDA path never does): out-of-range values raise ``ValueError`` here. What they compute, per family:

* bf16-output kinds (dense, contiguous, masked, psum): ``out[r, c] = bf16(Σ_k (A[r,k]·sA[r,k//128]) ·
  (B[c,k]·sB[c//128,k//128]))``, operands dequantised to float32, float32 accumulation, one rounding to bf16
  (within one bf16 ulp of float64). Rows the op leaves unspecified (padding, rows past ``masked_m``) are left
  untouched.
* fp32-accumulating kinds (1D1D, k-grouped): ``d = c + A·Bᵀ`` with 1x128 scales on both operands, dequantised,
  multiplied, summed and added to ``c`` in float64, rounded once to float32 (``c=None``: ``d = A·Bᵀ``; ``c`` may
  be ``d``).

The math they share is :mod:`deep_fp8_gemm._core.reference_math` (``dequantize_per_token``,
``dequantize_per_block``).
"""

from ._core.reference_math import dequantize_per_block, dequantize_per_token
from .ops.contiguous import reference as m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from .ops.dense import reference as gemm_fp8_fp8_bf16_nt
from .ops.k_grouped import reference as k_grouped_gemm_fp8_fp8_fp32_nt
from .ops.masked import reference as m_grouped_gemm_fp8_fp8_bf16_nt_masked
from .ops.psum import check_psum_values, psum_group_rows
from .ops.psum import reference as m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum
from .ops.wgrad_1d1d import reference as gemm_fp8_fp8_fp32_nt_1d1d

__all__ = ["check_psum_values", "dequantize_per_block", "dequantize_per_token", "gemm_fp8_fp8_bf16_nt",
           "gemm_fp8_fp8_fp32_nt_1d1d", "k_grouped_gemm_fp8_fp8_fp32_nt", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
           "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum", "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
           "psum_group_rows"]
