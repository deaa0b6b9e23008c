"""The GEMM op families, one per row of the kinds table (``deep_fp8_gemm.kinds.TABLE``), each the product of a layout
family and an output policy:

=============  ===========================================================================================
module         public functions (bf16 / FP8 / SwiGLU·FP8 output, ``ops.outputs``)
=============  ===========================================================================================
:mod:`.dense`       ``gemm_fp8_fp8_bf16_nt`` (split-K and swap-AB for decode), ``gemm_fp8_fp8_fp8_nt``, ``..._bf16_nt_block32``
:mod:`.contiguous`  ``m_grouped_gemm_fp8_fp8_{bf16,fp8}_nt_contiguous``, ``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu``
:mod:`.psum`        ``m_grouped_gemm_fp8_fp8_{bf16,fp8}_nt_contiguous_psum`` (group ends)
:mod:`.masked`      ``m_grouped_gemm_fp8_fp8_{bf16,fp8}_nt_masked``, ``m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu``
:mod:`.wgrad_1d1d`  ``gemm_fp8_fp8_fp32_nt_1d1d`` (fp32 D = C + A·Bᵀ, per-row B scales)
:mod:`.k_grouped`   ``k_grouped_gemm_fp8_fp8_fp32_nt`` (MoE weight gradients, run-time K_g)
=============  ===========================================================================================

:mod:`.gemm_family` composes a layout (``GemmLayout``) and an output policy (:mod:`.outputs`) into a family: checks,
exact reference, dispatch (CPU reference | simulator | sm_90 kernel), config rule (``plan``), custom op and public
entry. :mod:`.moe` holds the MoE pipeline over the grouped families.

Importing this package registers their ``torch.ops.deep_fp8_gemm`` custom ops. The names below are also the old
paths ``deep_fp8_gemm.ops.gemm_fp8_fp8_bf16_nt`` etc. (the three 1.x GEMMs).
"""

from ..kinds import TABLE
from . import contiguous, dense, k_grouped, masked, psum, wgrad_1d1d
from .contiguous import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from .dense import gemm_fp8_fp8_bf16_nt
from .masked import m_grouped_gemm_fp8_fp8_bf16_nt_masked

_BUILT = {**dense.FAMILIES, **contiguous.FAMILIES, **psum.FAMILIES, **masked.FAMILIES,
          "1d1d": wgrad_1d1d.FAMILY, "k_grouped": k_grouped.FAMILY}
#: kind -> its family record (``_core.family.GemmFamily``), in the kinds table's order; every FP8 row has one (the
#: BF16 / TF32 rows' names are ``ops.bf16``, ``ops.einsum``, ``ops.hc_prenorm``).
FAMILIES = {name: _BUILT[name] for name in TABLE.names_of("fp8_gemm")}

__all__ = ["FAMILIES", "gemm_fp8_fp8_bf16_nt", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
           "m_grouped_gemm_fp8_fp8_bf16_nt_masked"]
