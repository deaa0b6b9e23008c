"""deep_fp8_gemm: FP8 GEMMs with fine-grained (1x128 / 128x128) scaling for NVIDIA Hopper.

Importing the package registers the ``torch.ops.deep_fp8_gemm`` custom ops (GEMMs, quantisers, the MoE
``silu_mul_quant``); it imports neither the CUDA bindings nor the JIT (they load on the first GPU or
simulator call). Model-facing modules: ``deep_fp8_gemm.nn`` (FP8Linear), ``deep_fp8_gemm.moe``
(fp8_moe_forward, FP8MoE), ``deep_fp8_gemm.layout`` (MoE contiguous layout and routing),
``deep_fp8_gemm.autograd`` (training: fp8_linear, fp8_moe). ``deep_fp8_gemm.attention``: the DeepSeek-V3.2 / V4
indexer's FP8 MQA logits (dense and paged) and the paged form's schedule metadata.

The reference design's 2.x surface (``fp8_gemm_nt``, ``m_grouped_fp8_gemm_nt_contiguous`` with the psum layout,
``m_grouped_fp8_gemm_nt_masked``, ``transform_sf_into_required_layout``, its casts and knobs) is
:mod:`deep_fp8_gemm.compat`, which the ``deep_gemm`` drop-in re-exports; its GEMM and knob names are exported here
too (the same objects). The casts exported here are the library's own (``deep_fp8_gemm.quant``); the reference's
bits are ``deep_fp8_gemm.compat.per_token_cast_to_fp8`` etc. (docs/dropin.md).
"""

from . import attention, autograd, cast_transpose, compat, layout, moe, nn, ops, reference
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
# The BF16 / TF32 names: the reference's signatures (compiled_dims etc. validated hints), one object per name
from .compat.bf16 import (bf16_gemm_nn, bf16_gemm_nt, bf16_gemm_tn, bf16_gemm_tt, m_grouped_bf16_gemm_nn_contiguous,
                          m_grouped_bf16_gemm_nt_contiguous, m_grouped_bf16_gemm_nt_masked)
from .ops.contiguous import (check_contiguous_layout, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
                             m_grouped_gemm_fp8_fp8_fp8_nt_contiguous, m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu)
from .ops.dense import gemm_fp8_fp8_bf16_nt, gemm_fp8_fp8_bf16_nt_block32, gemm_fp8_fp8_fp8_nt
from .ops.einsum import einsum, fp8_einsum
from .ops.hc_prenorm import tf32_hc_prenorm_gemm
from .ops.k_grouped import k_grouped_gemm_fp8_fp8_fp32_nt
from .ops.masked import (check_masked_layout, m_grouped_gemm_fp8_fp8_bf16_nt_masked, m_grouped_gemm_fp8_fp8_fp8_nt_masked,
                         m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu)
from .ops.outputs import interleave_swiglu_weights
from .ops.wgrad_1d1d import gemm_fp8_fp8_fp32_nt_1d1d
from .ops.psum import (check_psum_layout, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum,
                       m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum)
from .quant import per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8, silu_mul_quant
from .utils import (
    calc_diff,
    ceil_div,
    get_col_major_tma_aligned_tensor,
    get_m_alignment_for_contiguous_layout,
    get_num_sms,
    get_pdl,
    get_tma_aligned_size,
    is_batch_invariant,
    set_batch_invariant,
    set_mk_alignment_for_contiguous_layout,
    set_num_sms,
    set_pdl,
)

__version__ = "0.1.0"

#: The public modules (submodules imported by the package appear as attributes too; these are the API).
_PUBLIC_MODULES = ("attention", "autograd", "cast_transpose", "compat", "layout", "moe", "nn", "ops", "reference")
__all__ = sorted(["__version__", *_PUBLIC_MODULES,
                  *(name for name, value in globals().items() if not name.startswith("_") and callable(value)
                    and getattr(value, "__module__", "").startswith(__name__))])

#: Old paths kept one more release (each warns once, naming the new path, when first imported).
_DEPRECATED_MODULES = ("prepared", "psum", "validation", "wgrad")


def __getattr__(name: str):
    """``deep_fp8_gemm.psum`` etc. without an import statement: the deprecated old paths load (and warn) on first
    use, not when the package is imported."""
    if name in _DEPRECATED_MODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
