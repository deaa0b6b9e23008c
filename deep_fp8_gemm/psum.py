"""Deprecated old path of the psum contiguous GEMM family (one more release): import
``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`` and ``check_psum_layout`` from :mod:`deep_fp8_gemm`, the rest from
:mod:`deep_fp8_gemm.ops.psum` (where its code and documentation live)."""

import warnings

warnings.warn("deep_fp8_gemm.psum is deprecated and goes in the next release: import "
              "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum and check_psum_layout from deep_fp8_gemm, "
              "check_contiguous_psum / check_psum_values / psum_group_rows from deep_fp8_gemm.ops.psum",
              DeprecationWarning, stacklevel=2)

from .ops.psum import (check_contiguous_psum, check_psum_layout, check_psum_values,  # noqa: E402
                       m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum, psum_group_rows)

__all__ = ["check_contiguous_psum", "check_psum_layout", "check_psum_values",
           "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum", "psum_group_rows"]
