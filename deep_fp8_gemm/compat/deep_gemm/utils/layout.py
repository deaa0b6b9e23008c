"""deep_gemm.utils.layout: TMA-aligned scale layouts and the contiguous layout's alignment (process-wide: 64 or
128, the contiguous kernels' BLOCK_M), from :mod:`deep_fp8_gemm.compat`; ``set_mk_alignment_for_contiguous_layout``
sets the forwarded provider's too (:mod:`deep_fp8_gemm.compat.facade`). The SM100 packed-UE8M0 layouts come from the
forwarded provider when there is one."""

from ... import provider as _provider
from ...facade import set_mk_alignment_for_contiguous_layout
from ...knobs import (get_k_alignment_for_contiguous_layout, get_m_alignment_for_contiguous_layout,
                      get_mk_alignment_for_contiguous_layout, get_theoretical_mk_alignment_for_contiguous_layout,
                      get_tma_aligned_size)
from ...api import get_mn_major_tma_aligned_tensor

__all__ = [
    "get_k_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_tensor",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "get_tma_aligned_size",
    "set_mk_alignment_for_contiguous_layout",
]
__getattr__ = _provider.forwarder("utils.layout")
