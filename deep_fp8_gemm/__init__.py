"""deep_fp8_gemm: FP8 GEMMs with fine-grained (1x128 / 128x128) scaling for NVIDIA Hopper.

Importing the package registers the ``torch.ops.deep_fp8_gemm`` custom ops (GEMMs, quantisers, the MoE
``silu_mul_quant``); it imports neither the CUDA bindings nor the JIT (they load on the first GPU or
simulator call). Model-facing modules: ``deep_fp8_gemm.nn`` (FP8Linear), ``deep_fp8_gemm.moe``
(fp8_moe_forward, FP8MoE), ``deep_fp8_gemm.layout`` (MoE contiguous layout and routing),
``deep_fp8_gemm.autograd`` (training: fp8_linear, fp8_moe).

The reference design's 2.x names (``fp8_gemm_nt``, ``m_grouped_fp8_gemm_nt_contiguous`` with the psum layout,
``m_grouped_fp8_gemm_nt_masked``, ``transform_sf_into_required_layout``, ...) live in
:mod:`deep_fp8_gemm.compat` and are exported here too, so ``import deep_fp8_gemm as deep_gemm`` works in
code written against it (see the README, "Using it as ``deep_gemm``").
"""

from . import autograd, cast_transpose, compat, layout, moe, nn, ops, prepared, psum, reference, validation, wgrad
from .cast_transpose import (
    per_token_cast_to_fp8_and_transpose,
    transpose_cast_to_fp8_k_grouped,
    transpose_per_block_fp8,
)
from .compat import (
    fp8_fp4_gemm_nt,
    fp8_gemm_nt,
    fp8_m_grouped_gemm_nt_masked,
    get_k_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_mn_major_tma_aligned_tensor,
    get_tc_util,
    get_theoretical_mk_alignment_for_contiguous_layout,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_wgrad_gemm_fp8_fp8_fp32_nt,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
    set_block_size_multiple_of,
    set_ignore_compile_dims,
    set_tc_util,
    transform_sf_into_required_layout,
    wgrad_gemm_fp8_fp8_fp32_nt,
)
from ._core.plans import PreparedGemm, prepare_gemm
from .ops.contiguous import (check_contiguous_layout, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
                             m_grouped_gemm_fp8_fp8_fp8_nt_contiguous, m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu)
from .ops.dense import gemm_fp8_fp8_bf16_nt, gemm_fp8_fp8_fp8_nt
from .ops.k_grouped import k_grouped_gemm_fp8_fp8_fp32_nt
from .ops.masked import (check_masked_layout, m_grouped_gemm_fp8_fp8_bf16_nt_masked, m_grouped_gemm_fp8_fp8_fp8_nt_masked,
                         m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu)
from .ops.outputs import interleave_swiglu_weights
from .ops.wgrad_1d1d import gemm_fp8_fp8_fp32_nt_1d1d
from .ops.psum import (check_psum_layout, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum,
                       m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum)
from .quant import per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8
from .utils import (
    calc_diff,
    ceil_div,
    get_col_major_tma_aligned_tensor,
    get_m_alignment_for_contiguous_layout,
    get_num_sms,
    get_pdl,
    get_tma_aligned_size,
    set_mk_alignment_for_contiguous_layout,
    set_num_sms,
    set_pdl,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "autograd",
    "calc_diff",
    "cast_transpose",
    "ceil_div",
    "check_contiguous_layout",
    "check_masked_layout",
    "check_psum_layout",
    "compat",
    "fp8_fp4_gemm_nt",
    "fp8_gemm_nt",
    "fp8_m_grouped_gemm_nt_masked",
    "gemm_fp8_fp8_bf16_nt",
    "gemm_fp8_fp8_fp32_nt_1d1d",
    "gemm_fp8_fp8_fp8_nt",
    "get_col_major_tma_aligned_tensor",
    "get_k_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_tensor",
    "get_num_sms",
    "get_pdl",
    "get_tc_util",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "get_tma_aligned_size",
    "interleave_swiglu_weights",
    "k_grouped_fp8_gemm_nt_contiguous",
    "k_grouped_gemm_fp8_fp8_fp32_nt",
    "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    "layout",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum",
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum",
    "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu",
    "m_grouped_gemm_fp8_fp8_fp8_nt_masked",
    "m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu",
    "moe",
    "nn",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_token_cast_to_fp8",
    "per_token_cast_to_fp8_and_transpose",
    "psum",
    "prepare_gemm",
    "PreparedGemm",
    "reference",
    "set_block_size_multiple_of",
    "set_ignore_compile_dims",
    "set_mk_alignment_for_contiguous_layout",
    "set_num_sms",
    "set_pdl",
    "set_tc_util",
    "transform_sf_into_required_layout",
    "transpose_cast_to_fp8_k_grouped",
    "transpose_per_block_fp8",
    "wgrad_gemm_fp8_fp8_fp32_nt",
]
