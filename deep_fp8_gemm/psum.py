"""Old path of the psum contiguous GEMM family (:mod:`deep_fp8_gemm.ops.psum`, where its code and documentation
live): ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum``, ``check_psum_layout``, ``check_contiguous_psum``."""

from .ops.psum import (check_contiguous_psum, check_psum_layout, check_psum_values,
                       m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum, psum_group_rows)

__all__ = ["check_contiguous_psum", "check_psum_layout", "check_psum_values",
           "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum", "psum_group_rows"]
