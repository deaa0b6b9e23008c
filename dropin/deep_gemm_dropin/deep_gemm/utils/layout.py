"""deep_gemm.utils.layout: TMA-aligned scale layouts and the contiguous layout's alignment (process-wide: 64 or
128, the contiguous kernels' BLOCK_M): a re-export of :mod:`deep_fp8_gemm.compat`. The SM100 packed-UE8M0 layouts
are not provided."""

from deep_fp8_gemm.compat import (get_k_alignment_for_contiguous_layout, get_m_alignment_for_contiguous_layout,
                                  get_mk_alignment_for_contiguous_layout, get_mn_major_tma_aligned_tensor,
                                  get_theoretical_mk_alignment_for_contiguous_layout, get_tma_aligned_size,
                                  set_mk_alignment_for_contiguous_layout)

__all__ = [
    "get_k_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_tensor",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "get_tma_aligned_size",
    "set_mk_alignment_for_contiguous_layout",
]
