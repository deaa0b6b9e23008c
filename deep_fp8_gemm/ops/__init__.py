"""The GEMM op families, one module each: every family's checks, exact reference, dispatch (CPU reference |
simulator | sm_90 kernel), config rule (``plan``), custom op and public function live in its module.

=============  ====================  =========================================================================
kind           module                public function
=============  ====================  =========================================================================
dense          :mod:`.dense`         ``gemm_fp8_fp8_bf16_nt`` (split-K for decode shapes)
contiguous     :mod:`.contiguous`    ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` (m_indices)
masked         :mod:`.masked`        ``m_grouped_gemm_fp8_fp8_bf16_nt_masked`` (masked_m, expected_m)
psum           :mod:`.psum`          ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`` (group ends)
1d1d           :mod:`.wgrad_1d1d`    ``gemm_fp8_fp8_fp32_nt_1d1d`` (fp32 D = C + A·Bᵀ, per-row B scales)
k_grouped      :mod:`.k_grouped`     ``k_grouped_gemm_fp8_fp8_fp32_nt`` (MoE weight gradients, run-time K_g)
dense_fp8out   :mod:`.dense_fp8out`  ``gemm_fp8_fp8_fp8_nt`` (e4m3 D + 1x128 scales quantised in the epilogue)
contiguous_    :mod:`.contiguous_    ``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous``
fp8out         fp8out`
masked_fp8out  :mod:`.masked_fp8out` ``m_grouped_gemm_fp8_fp8_fp8_nt_masked``
psum_fp8out    :mod:`.psum_fp8out`   ``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum``
contiguous_    :mod:`.contiguous_    ``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu`` (MoE up-projection:
swiglu         swiglu`               SiLU(gate)·up + FP8 quantisation in the epilogue, interleaved w13)
masked_swiglu  :mod:`.masked_swiglu` ``m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu``
=============  ====================  =========================================================================

:mod:`.fp8_output` holds what the FP8-output families share (the output pair, the quantisation step of their
references, the SwiGLU weight layout); :mod:`.moe` the MoE pipeline over the grouped families.

Importing this package registers their ``torch.ops.deep_fp8_gemm`` custom ops. The names below are also the old
paths ``deep_fp8_gemm.ops.gemm_fp8_fp8_bf16_nt`` etc. (the three 1.x GEMMs).
"""

from . import (contiguous, contiguous_fp8out, contiguous_swiglu, dense, dense_fp8out, k_grouped, masked,
               masked_fp8out, masked_swiglu, psum, psum_fp8out, wgrad_1d1d)
from .contiguous import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from .dense import gemm_fp8_fp8_bf16_nt
from .masked import m_grouped_gemm_fp8_fp8_bf16_nt_masked

#: kind -> its family record (``_core.family.GemmFamily``), in ``config.KINDS`` order.
FAMILIES = {m.FAMILY.kind: m.FAMILY for m in (dense, contiguous, masked, psum, wgrad_1d1d, k_grouped, dense_fp8out,
                                              contiguous_fp8out, masked_fp8out, psum_fp8out, contiguous_swiglu,
                                              masked_swiglu)}

__all__ = ["FAMILIES", "gemm_fp8_fp8_bf16_nt", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
           "m_grouped_gemm_fp8_fp8_bf16_nt_masked"]
