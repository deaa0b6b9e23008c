"""The numbers every layer shares, each under one name (the glossary in ARCHITECTURE.md says what they mean).

128 appears in this library in four roles that happen to coincide; they have one name each so that a change of
one (the settable contiguous alignment, say) cannot silently change another:

* :data:`GRAN_K`: elements per scale group along K — one fp32 scale per row per ``GRAN_K`` K-elements (1x128)
  and per ``GRAN_K x GRAN_K`` weight block (128x128). The reference design's ``gran_k``. The kernels' K tile
  (``config.BLOCK_K``) is one scale group by construction.
* :data:`GRAN_MN_BLOCK`: rows (of B, or of a weight) per block scale of the 128x128 recipe.
* :data:`K_GROUP_ALIGNMENT`: every group's K of the k-grouped (weight-gradient) layout is a multiple of it,
  so a group's K blocks are whole scale groups.
* :data:`DEFAULT_CONTIGUOUS_ALIGNMENT`: rows each expert segment of the M-grouped contiguous layout is padded to
  by default (settable to one of :data:`CONTIGUOUS_ALIGNMENTS`; = the contiguous kernels' BLOCK_M, so that no M
  tile straddles two experts).

"Group" alone means an expert (``num_groups``, ``G``) everywhere else in the code; a 128-element scale group is
a "scale group".
"""

from __future__ import annotations

#: Elements per scale group along K (1x128 per-token scales, 128x128 block scales): the reference's gran_k.
GRAN_K = 128
#: Rows per block scale of a 128x128-block-quantised operand (B of the 1D2D kernels, weights).
GRAN_MN_BLOCK = 128
#: K of every group of the k-grouped layout is a multiple of this (whole scale groups).
K_GROUP_ALIGNMENT = GRAN_K
#: Rows each expert segment of the contiguous layout is padded to by default.
DEFAULT_CONTIGUOUS_ALIGNMENT = 128
#: The alignments the contiguous layout may be set to (``utils.set_mk_alignment_for_contiguous_layout``): each is
#: the BLOCK_M of the contiguous kernels under it.
CONTIGUOUS_ALIGNMENTS = (64, 128)

#: Largest finite float8_e4m3fn value; quantised values saturate here.
FP8_E4M3_MAX = 448.0
#: Lower clamp of a scale group's amax, so that an all-zero group gets a finite, non-zero scale.
AMAX_FLOOR = 1e-4

#: TMA's global alignment: tensor addresses and every stride but the innermost are multiples of 16 bytes.
TMA_ALIGN_BYTES = 16

#: Compute capability the CUDA kernels are built for (sm_90a: wgmma FP8, setmaxnreg, TMA multicast).
SUPPORTED_CAPABILITY = (9, 0)
#: SM count assumed when no CUDA device is visible (H100 / H800 / H200 SXM).
DEFAULT_NUM_SMS = 132
