"""The reference design's 2.x surface (DeepGEMM 2.6.1's SM90 API): the one place it is implemented. The module
``deep_gemm`` is its facade, :mod:`.deep_gemm` (served under that name by the import hook, :mod:`.dropin`, which the
``deep-fp8-gemm-dropin`` distribution turns on with ``DFG_AS_DEEP_GEMM=1``), forwarding what this library does not
implement to the other installed DeepGEMM (:mod:`.provider`, :mod:`.facade`).

* :mod:`.api` — the GEMMs (``fp8_gemm_nt``, ``m_grouped_fp8_gemm_nt_contiguous`` with the psum layout,
  ``m_grouped_fp8_gemm_nt_masked``, ``k_grouped_fp8_gemm_nt_contiguous``, the 1.x weight-gradient names), the recipe
  and ``compiled_dims`` checks, the scale-layout helpers (``transform_sf_into_required_layout``,
  ``get_mn_major_tma_aligned_tensor``) and the names a loader requires but nothing provides;
* :mod:`.casts` — the reference's casts bit for bit (``per_token_cast_to_fp8(x, use_ue8m0, gran_k=128)``, ...: its
  ``x * (1 / sf)``, row-major scales), what ``deep_gemm.utils`` exports;
* :mod:`.attention` — the DeepSeek-V3.2 indexer's names (``fp8_fp4_mqa_logits``, ``fp8_fp4_paged_mqa_logits``, the
  legacy ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``, ``get_paged_mqa_logits_metadata``) on
  :mod:`deep_fp8_gemm.attention`;
* :mod:`.bf16` — the BF16 / TF32 names (``bf16_gemm_{nt,nn,tn,tt}``, ``m_grouped_bf16_gemm_{nt,nn}_contiguous``,
  ``m_grouped_bf16_gemm_nt_masked``, ``einsum``, ``fp8_einsum``, ``tf32_hc_prenorm_gemm``) with their
  ``compiled_dims`` / ``ensure_zero_padding`` arguments, on :mod:`deep_fp8_gemm.ops.bf16` and its siblings;
* :mod:`.knobs` — the runtime knobs (``set_num_sms(0)`` = every SM, ``set_pdl``, the contiguous alignment, ...).

Every name exported both here and at the top of :mod:`deep_fp8_gemm` is the same object, except the three casts: the
package's own ``per_token_cast_to_fp8`` / ``per_block_cast_to_fp8`` / ``per_channel_cast_to_fp8`` keep their
device-independent IEEE division and M-major scales (``deep_fp8_gemm.quant``); ``deep_fp8_gemm.compat`` (and the
drop-in) give the reference's bits. Write ``import deep_fp8_gemm.compat as deep_gemm`` (or install the drop-in) for
code written against the reference (or ``import deep_fp8_gemm.compat.deep_gemm as
deep_gemm`` for the whole module with its submodules and forwarding).
"""

from . import api, arguments, attention, bf16, casts, knobs
from .api import (LOADER_REQUIRED_ENTRIES, fp8_fp4_gemm_nt, fp8_gemm_nt,
                  fp8_m_grouped_gemm_nt_masked, get_mn_major_tma_aligned_tensor, k_grouped_fp8_gemm_nt_contiguous,
                  k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, m_grouped_fp8_fp4_gemm_nt_contiguous,
                  m_grouped_fp8_fp4_gemm_nt_masked, m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
                  transform_sf_into_required_layout, unsupported_entry, wgrad_gemm_fp8_fp8_fp32_nt)
from .arguments import check_compiled_dims, check_recipe
from .attention import (fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits, fp8_mqa_logits, fp8_paged_mqa_logits,
                        get_paged_mqa_logits_metadata)
from .bf16 import (bf16_gemm_nn, bf16_gemm_nt, bf16_gemm_tn, bf16_gemm_tt, einsum, fp8_einsum,
                   m_grouped_bf16_gemm_nn_contiguous, m_grouped_bf16_gemm_nt_contiguous, m_grouped_bf16_gemm_nt_masked,
                   tf32_hc_prenorm_gemm)
from .casts import (align, ceil_div, ceil_to_ue8m0, per_block_cast_to_fp8, per_channel_cast_to_fp8,
                    per_custom_dims_cast_to_fp8, per_token_cast_to_fp8)
from .knobs import (RUNTIME_KNOBS, RuntimeKnobs, get_k_alignment_for_contiguous_layout,
                    get_m_alignment_for_contiguous_layout, get_mk_alignment_for_contiguous_layout, get_num_sms, get_pdl,
                    get_tc_util, get_tma_aligned_size,
                    get_theoretical_mk_alignment_for_contiguous_layout, set_block_size_multiple_of,
                    set_ignore_compile_dims, set_mk_alignment_for_contiguous_layout, set_num_sms, set_pdl, set_tc_util,
                    use_deterministic_algorithms)

#: The names the 2.x surface exports (the drop-in's ``deep_gemm`` re-exports each, ``deep_gemm.utils`` the casts and
#: layout helpers).
__all__ = sorted({*api.__all__, *attention.__all__, *bf16.__all__, *casts.__all__, *knobs.__all__})
