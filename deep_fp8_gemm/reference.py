"""The exact reference of the library's GEMM op of every kind, under the op's own name and signature: one per row of
the kinds table (``deep_fp8_gemm.kinds.TABLE``), each its family's ``reference`` (``ops.FAMILIES``), so a kind the
table gains has its reference here too. The 2.x names (``fp8_gemm_nt``, ... in :mod:`deep_fp8_gemm.compat`) call these
ops and have no references of their own.

The references check types, dtypes, ranks, exact shapes and devices like the ops do, but accept any strides and
any ``n`` / ``k`` / ``m_sum``, and they *do* read ``m_indices`` / ``masked_m`` / group ends on the host (the ops'
CUDA path never does): out-of-range values raise ``ValueError`` here. What they compute, per output:

* bf16 output (``gemm_fp8_fp8_bf16_nt`` and the grouped forms): per output ``(r, c)``, each K group's partial
  ``Σ A[r,k]·B[c,k]`` of the e4m3 values in float64 (exact in any order; groups of 128, or of 32 for
  ``gemm_fp8_fp8_bf16_nt_block32``), rounded to float32 and promoted in K order,
  ``acc = fp32(acc + p_j · fp32(sA[r,j]·sB[c//128,j]))`` (32x32 blocks: ``c//32``), as the kernels do, then one
  rounding to bf16 (within one bf16 ulp of float64; batch-invariant by construction:
  :mod:`deep_fp8_gemm._core.reference_math`). Rows the op leaves unspecified (padding, rows past ``masked_m``) are
  left untouched; padding rows the kernels compute (sharing a block with valid rows) are computed the same way.
* FP8 output (``gemm_fp8_fp8_fp8_nt`` and the grouped forms): the same fp32 accumulators, quantised per row and 128
  columns by ``per_token_cast_to_fp8``'s rules; SwiGLU (``*_swiglu``): ``SiLU(gate) * up`` of them, then quantised.
* fp32 accumulation (1D1D, k-grouped): ``d = c + A·Bᵀ`` with 1x128 scales on both operands: the same exact block
  partials promoted with the per-row scales in float64, added to ``c``, rounded once to float32 (``c=None``:
  ``d = A·Bᵀ``; ``c`` may be ``d``).

The math they share is :mod:`deep_fp8_gemm._core.reference_math` (``gemm_nt_promoted``, ``gemm_nt_row_scaled_f64``;
``dequantize_per_token`` and ``dequantize_per_block`` are re-exported here).
"""

from ._core.reference_math import dequantize_per_block, dequantize_per_token
from .ops import FAMILIES
from .ops.psum import check_psum_values, psum_group_rows

#: public op name -> its reference, for every family.
REFERENCES = {family.public.__name__: family.reference for family in FAMILIES.values()}
globals().update(REFERENCES)

__all__ = ["REFERENCES", "check_psum_values", "dequantize_per_block", "dequantize_per_token", "psum_group_rows",
           *sorted(REFERENCES)]
