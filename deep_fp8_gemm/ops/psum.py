"""The prefix-sum ("psum") contiguous layout (``layout = "psum"`` of the kinds table): the grouped GEMMs over expert
rows described by group ends, ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`` (bf16 out) and
``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum`` (FP8 out).

This is the layout DeepEP v2's dispatch hands over (expanded, expert-sorted, padded rows) and the reference
design's ``use_psum_layout=True``: instead of one expert id per row (``m_indices [m_sum]``), one int32 per
group, ``grouped_layout[g]`` = the end row (exclusive) of group g. Group g owns rows
``[start_g, grouped_layout[g])`` with ``start_0 = 0`` and ``start_g = round_up(grouped_layout[g-1], alignment)``
(the contiguous alignment, which is BLOCK_M); every other row is padding: the rows after a group's end up to
its last block's end are computed with the group (as the kernel does, and the CPU reference), blocks holding
only padding are skipped. An end at or before its group's start is an empty group.

The alignment is the contiguous one (``get_m_alignment_for_contiguous_layout()``: 128, or 64 after
``set_mk_alignment_for_contiguous_layout(64)``), read at every call, as the reference design rounds group starts to
its BLOCK_M, the alignment: the same ends describe other groups under the other alignment (ends ``[40, 100]``:
group 1 is rows 64..99 at 64, empty at 128). BLOCK_M is the alignment, and the kernel has it compiled in
(``GemmConfig.psum_alignment``, ``scheduler.cuh`` ``psum_block_group``).

What is checked where (the values live on the device and reading them would cost a synchronisation):

* every call (host, no sync): dtypes, ranks, shapes — ``grouped_layout`` must be 1-D int32 of length
  ``G = rhs[0].shape[0]`` (``ValueError`` naming both otherwise) — devices, strides and alignment;
* CPU tensors (the reference and the simulator): the values too (:func:`check_psum_values`) — ``0 <= ends[0] <=
  ... <= ends[G-1] <= m_sum``; a decreasing layout or an end past the rows of A raises ``ValueError``;
* CUDA tensors: the values are never read on the host (CUDA-graph safe) unless ``DFG_CHECK_LAYOUTS=1`` (then
  as on a CPU, one synchronisation per call). The kernel finds a block's group by binary search over the G
  ends, so any values keep every access in bounds (groups in ``[0, G)``, rows clipped to ``m_sum`` by the
  tensor maps), but a decreasing layout gives unspecified output. Call :func:`check_psum_layout` yourself (it
  synchronises) when the layout is untrusted.

Those value rules are all the kernel relies on: with non-decreasing ends a block's binary search finds the one
group whose rows it holds (group starts are multiples of the alignment, which BLOCK_M divides, so a block never
straddles two groups), and rows of a block past its group's end are padding.

The kernel is the ``GroupedContiguousPsum`` kind of ``include/deep_fp8_gemm/scheduler.cuh``; the 2.x entry point
``m_grouped_fp8_gemm_nt_contiguous(..., use_psum_layout=True)`` of :mod:`deep_fp8_gemm.compat` calls
:func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`. The families are built from :class:`PsumLayout` and the output
policies (``ops.gemm_family``).
"""

from __future__ import annotations

import torch

from .._core.checks import INDEX_DTYPE, check_same_device, check_tensor
from ..config import contiguous_block_m
from ..utils import get_m_alignment_for_contiguous_layout
from .contiguous import MGroupedLayout
from .gemm_family import families_of


def check_psum_values(ends: list[int], m_sum: int, name: str = "grouped_layout",
                      rows: str = "the rows of lhs[0] (A), m_sum") -> None:
    """Values of a psum layout: ``0 <= ends[0] <= ends[1] <= ... <= ends[G-1] <= m_sum`` (ValueError; ``rows``
    names ``m_sum`` in the message)."""
    previous = 0
    for g, end in enumerate(ends):
        if end < previous:
            what = "non-negative" if g == 0 else f"non-decreasing ({name}[{g - 1}]={previous})"
            raise ValueError(f"{name} (psum layout: end row of each group) must be {what}, got {name}[{g}]={end}")
        previous = end
    if ends and ends[-1] > m_sum:
        raise ValueError(f"{name}[{len(ends) - 1}]={ends[-1]} exceeds {rows}={m_sum}")


def check_psum_layout(grouped_layout: torch.Tensor, m_sum: int) -> None:
    """The value checks of a psum layout (non-negative, non-decreasing, last end <= ``m_sum``); reads the
    values, so it synchronises when ``grouped_layout`` is on a GPU. ValueError on failure (TypeError for a
    grouped_layout that is not a 1-D int32 tensor)."""
    check_tensor(grouped_layout, "grouped_layout", INDEX_DTYPE, 1)
    if isinstance(m_sum, bool) or not isinstance(m_sum, int) or m_sum < 0:
        raise ValueError(f"m_sum must be a non-negative int (rows of lhs[0]), got {m_sum!r}")
    check_psum_values(grouped_layout.tolist(), m_sum, rows="m_sum")


def check_psum_layout_values(grouped_layout: torch.Tensor, m_sum: int, num_groups: int | None = None) -> None:
    """:func:`check_psum_values` of a checked ``grouped_layout`` tensor, with the signature of the other layouts'
    value checks (``check_contiguous_values``, ``check_masked_values``): what every CPU call checks (the fast path
    too; on CUDA with DFG_CHECK_LAYOUTS=1), this family's and :mod:`.psum_fp8out`'s, so that the simulator and the
    kernels never see bad ends."""
    check_psum_values(grouped_layout.tolist(), m_sum)


def check_grouped_layout(grouped_layout, num_groups: int, device: torch.device) -> None:
    """A psum layout's tensor (values not read): 1-D int32 of length ``G = rhs[0].shape[0]`` on ``device``."""
    check_tensor(grouped_layout, "grouped_layout", INDEX_DTYPE, 1)
    if grouped_layout.shape[0] != num_groups:
        raise ValueError(
            f"grouped_layout (psum layout: one end row per group) must have G={num_groups} entries (G = "
            f"rhs[0].shape[0]), got grouped_layout.shape={tuple(grouped_layout.shape)}"
        )
    check_same_device(device, ((grouped_layout, "grouped_layout"),))


def psum_group_rows(ends: list[int], alignment: int | None = None) -> list[tuple[int, int]]:
    """``[(start, end)]`` of each group of the psum layout: group g owns rows ``[start_g, end_g)`` with
    ``start_0 = 0``, ``start_g = round_up(ends[g-1], alignment)`` and ``end_g = max(ends[g], start_g)`` (an end
    at or before its start is an empty group). ``alignment`` None: the contiguous alignment."""
    if alignment is None:
        alignment = get_m_alignment_for_contiguous_layout()
    rows, previous = [], 0
    for g, end in enumerate(ends):
        start = 0 if g == 0 else (previous + alignment - 1) // alignment * alignment
        rows.append((start, max(end, start)))
        previous = end
    return rows


def psum_computed_rows(ends: list[int], m_sum: int, alignment: int | None = None) -> list[tuple[int, int, int, int]]:
    """``(g, start, end, stop)`` of each non-empty group g: the kernel computes rows ``[start, stop)`` with g, its
    rows ``[start, end)`` (:func:`psum_group_rows`) and the padding rows after them up to the end of its last
    BLOCK_M block (or of A), ``stop``; every other row is left untouched. The references' rows (this family's and
    :mod:`.psum_fp8out`'s). ``alignment`` None: the contiguous alignment (BLOCK_M is the alignment)."""
    if alignment is None:
        alignment = get_m_alignment_for_contiguous_layout()
    block_m = contiguous_block_m(alignment)
    return [(g, start, end, min((end + block_m - 1) // block_m * block_m, m_sum))  # start: a multiple of block_m
            for g, (start, end) in enumerate(psum_group_rows(ends, alignment)) if end > start]


class PsumLayout(MGroupedLayout):
    """Any ``m_sum``; ``grouped_layout [G]`` int32 group ends, an optional ``expected_m``; the ends' rules
    (:func:`check_psum_values`); the rows of :func:`psum_computed_rows`."""

    name, grouped, expected_m = "psum", "grouped_layout", "optional"
    op_template, schema = "m_grouped_gemm_fp8_fp8_{}_nt_contiguous_psum", ", Tensor grouped_layout, int? expected_m=None"

    def check_grouped(self, gl, problem, device):
        check_grouped_layout(gl, problem.groups, device)

    def values_check(self, gl, rows, groups):
        check_psum_layout_values(gl, rows)

    def reference_check(self, gl, rows):
        check_psum_values(gl.tolist(), rows)

    def reference_parts(self, a, gl, groups):
        """Per group, one matmul over its rows and one over the padding rows of its last block that the kernel
        computes with it (:func:`psum_computed_rows`), so that a row's result does not depend on how much padding
        follows its group; the other padding rows are left untouched. The ends passed :func:`check_psum_values`."""
        parts = []
        for g, start, end, stop in psum_computed_rows(gl.tolist(), a.size(0)):
            parts += [(g, slice(lo, hi)) for lo, hi in ((start, end), (end, stop)) if hi > lo]
        return parts

    def plan_problem(self, a, b, expected_m):
        """For ``expected_m`` rows per group when given (``m_sum`` is often a worst-case buffer far larger than the
        rows in use), else for all ``m_sum`` rows; BLOCK_M = the contiguous alignment."""
        num_groups = b.shape[0]
        m_sum = a.shape[0] if expected_m is None else min(a.shape[0], int(expected_m) * num_groups)
        return (max(m_sum, 1), b.shape[-2], b.shape[-1], num_groups,
                {"contiguous_alignment": get_m_alignment_for_contiguous_layout()})


#: The layout, and kind -> family of every psum 1D2D kind of the kinds table.
LAYOUT = PsumLayout()
FAMILIES = families_of(LAYOUT)
_BF16, _FP8 = FAMILIES["psum"].call, FAMILIES["psum_fp8out"].call


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum(lhs: tuple[torch.Tensor, torch.Tensor],
                                                   rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
                                                   grouped_layout: torch.Tensor, expected_m: int | None = None) -> None:
    """Grouped GEMM over expert rows given by group ends (the psum layout, see the module docstring).

    ``out[r] = bf16(dequant(A[r]) · dequant(B[g])ᵀ)`` for every row r of group g; the padding rows after a group's
    end up to the end of its last BLOCK_M-row block (BLOCK_M = the alignment) are computed with g too, other padding
    rows are left untouched (every backend alike).

    Args:
        lhs: ``(A, sA)``: A ``[m_sum, k]`` float8_e4m3fn, K-major; sA ``[m_sum, ceil(k/128)]`` float32 (any
            strides; converted to the M-major TMA-aligned layout, a copy unless it already is).
        rhs: ``(B, sB)``: B ``[G, n, k]`` float8_e4m3fn, K-major; sB ``[G, ceil(n/128), ceil(k/128)]`` float32.
        out: ``[m_sum, n]`` bfloat16, row-major, written in place.
        grouped_layout: ``[G]`` int32 on the same device: end row (exclusive) of each group.
        expected_m: optional positive int, the typical rows per group; chooses the kernel configuration
            (``m_sum`` is often a worst-case buffer size). None: configured for ``m_sum`` rows.

    Same alignment rules (``n % 8 == 0``, ``k % 16 == 0``), errors and dispatch as
    :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`; ``m_sum`` may be any value.
    """
    _BF16(lhs, rhs, out, grouped_layout, expected_m)


def m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum(lhs: tuple[torch.Tensor, torch.Tensor],
                                                  rhs: tuple[torch.Tensor, torch.Tensor],
                                                  out: tuple[torch.Tensor, torch.Tensor], grouped_layout: torch.Tensor,
                                                  expected_m: int | None = None, use_ue8m0: bool = False) -> None:
    """Grouped GEMM over expert rows given by group ends (the psum layout), FP8 output.

    Args:
        lhs, rhs, grouped_layout, expected_m: as :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`.
        out: ``(D, sD)``: D ``[m_sum, n]`` float8_e4m3fn, sD ``[m_sum, ceil(n/128)]`` float32 M-major TMA-aligned, as
            :func:`deep_fp8_gemm.gemm_fp8_fp8_fp8_nt`; the padding rows after a group's end up to the end of its last
            BLOCK_M-row block (BLOCK_M = the contiguous alignment) are computed with the group, other padding rows
            are left untouched (every backend alike).
        use_ue8m0: power-of-two scales.
    """
    _FP8(lhs, rhs, out, grouped_layout, expected_m, use_ue8m0)


FAMILIES["psum"].public = m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum
FAMILIES["psum_fp8out"].public = m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum
#: The old name of the psum check (``deep_fp8_gemm.psum.check_contiguous_psum``).
check_contiguous_psum = FAMILIES["psum"].check
