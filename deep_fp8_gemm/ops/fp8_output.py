"""What the FP8-output GEMM families share: the kinds ``*_fp8out`` (e4m3 D with 1x128 scales quantised in the
epilogue) and ``*_swiglu`` (``SiLU(gate) * up`` of the MoE up-projection, then the same quantisation).

* the output pair: ``out = (D, sD)``, D e4m3 ``[..., rows, n_out]`` row-major, sD ``[..., rows, ceil(n_out/128)]``
  float32 in the M-major TMA-aligned layout :func:`deep_fp8_gemm.per_token_cast_to_fp8` returns
  (``utils.empty_m_major``; strides ``(1, aligned_rows)`` / ``(aligned_rows * g, 1, aligned_rows)``), so that
  ``(D, sD)`` is the ``lhs`` of the next GEMM without a copy — its checks (:func:`check_out`, :func:`check_out_layout`,
  :func:`check_out_pointers`) and :func:`empty_out`;
* the numerics the kernels implement and the references compute (:func:`quantise_into`): the fp32 GEMM result
  (dequantised operands, float32 sums, ``_core.reference_math.matmul_nt_f32``) quantised by
  :func:`deep_fp8_gemm.quant.per_token_cast_to_fp8_torch`'s rules — ``amax = max(max|x|, 1e-4)`` per row and
  128 columns, ``scale = amax / 448`` (IEEE division; ``use_ue8m0``: rounded up to a power of two),
  ``D = e4m3(clamp(x / scale, ±448))`` (nearest even). The kernels quantise their own fp32 accumulators, which
  differ from the reference's float32 sums by the summation order only; with exact sums (the simulator's exact
  tensor-core mode and small integers) the bits are equal (tests/test_sim_fp8_output.py);
* the SwiGLU weight layout (:func:`interleave_swiglu_weights`, :func:`deinterleave_swiglu_columns`) and value
  (:func:`swiglu_values`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._core.checks import (FP8, INDEX_DTYPE, Problem, check_aligned_ptr, check_divisibility, check_expected_m,
                            check_is_tensor, check_no_overlap, check_operand_a_2d, check_operand_b_blocks,
                            check_row_major_tma, check_same_device, check_shape, check_tensor, unpack_pair)
from .._core.dispatch import operands
from .._core.reference_math import dequantize_per_token, matmul_nt_f32
from ..constants import GRAN_K, GRAN_MN_BLOCK
from ..quant import per_token_cast_to_fp8_torch
from ..utils import ceil_div, empty_m_major, m_major_strides
from .contiguous import check_m_sum, reference_row_parts
from .masked import check_masked_operands, check_masked_values

OUT_NAMES = ("out[0] (D)", "out[1] (sD)")


# ---------------------------------------------------------------------------------------------- the output pair
def check_out(out: object, lead: tuple[int, ...], rows: int, n_out: int, device: torch.device, rows_name: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``out = (D, sD)``: D e4m3 ``lead + [rows, n_out]``, sD float32 ``lead + [rows, ceil(n_out/128)]``, on
    ``device``; returns ``(D, sD)``. ``rows_name`` spells the row count in messages (``m``, ``m_sum``, ``m_max``)."""
    d, sd = unpack_pair(out, "out")
    rank = len(lead) + 2
    dims = "G, " if lead else ""
    check_tensor(d, OUT_NAMES[0], FP8, rank)
    check_shape(d, OUT_NAMES[0], (*lead, rows, n_out), f"[{dims}{rows_name}, n_out]")
    check_tensor(sd, OUT_NAMES[1], torch.float32, rank)
    check_shape(sd, OUT_NAMES[1], (*lead, rows, ceil_div(n_out, GRAN_K)), f"[{dims}{rows_name}, ceil(n_out/128)]")
    check_same_device(device, ((d, OUT_NAMES[0]), (sd, OUT_NAMES[1])))
    return d, sd


def check_out_layout(d: torch.Tensor, sd: torch.Tensor) -> None:
    """The kernels' layout of the pair: D row-major with 16-byte leading strides (``n_out % 16 == 0``: TMA stores
    whole 16-byte rows), sD exactly M-major TMA-aligned (``utils.m_major_strides``; the kernel writes scale
    ``(g, r, j)`` at ``(g * ceil(n_out/128) + j) * aligned_rows + r``)."""
    n_out = d.shape[-1]
    if n_out % 16:
        raise ValueError(f"{OUT_NAMES[0]} needs 16-byte rows (n_out % 16 == 0 e4m3 columns), got "
                         f"{OUT_NAMES[0]}.shape={tuple(d.shape)}")
    check_row_major_tma(d, OUT_NAMES[0])
    want = m_major_strides(tuple(sd.shape))
    if sd.numel() and sd.stride() != want:
        raise ValueError(f"{OUT_NAMES[1]} must be M-major and TMA-aligned (as per_token_cast_to_fp8 returns, "
                         f"deep_fp8_gemm.utils.empty_m_major): stride {want}, got {OUT_NAMES[1]}.stride()="
                         f"{sd.stride()}")


def check_out_pointers(d: torch.Tensor, sd: torch.Tensor, inputs: tuple[tuple[torch.Tensor, str], ...]) -> None:
    """D 16-byte aligned (TMA); D and sD overlapping neither each other nor any input."""
    check_aligned_ptr(d, OUT_NAMES[0])
    check_aligned_ptr(sd, OUT_NAMES[1], 4)
    check_no_overlap(d, inputs + ((sd, OUT_NAMES[1]),), OUT_NAMES[0])
    check_no_overlap(sd, inputs, OUT_NAMES[1])


def empty_out(lead: tuple[int, ...], rows: int, n_out: int, device: torch.device | str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """An uninitialised output pair in the kernels' layout: D e4m3 ``lead + [rows, n_out]``, sD
    ``lead + [rows, ceil(n_out/128)]`` M-major TMA-aligned."""
    d = torch.empty((*lead, rows, n_out), dtype=FP8, device=device)
    return d, empty_m_major((*lead, rows, ceil_div(n_out, GRAN_K)), device)


def quantise_into(values: torch.Tensor, d: torch.Tensor, sd: torch.Tensor, use_ue8m0: bool) -> None:
    """``(d, sd) = per_token_cast_to_fp8_torch(values)``: ``values`` float32 ``[r, n_out]``, ``d`` / ``sd`` views of
    the same rows (any strides)."""
    if values.shape[0] == 0:
        return
    q, s = per_token_cast_to_fp8_torch(values, use_ue8m0)
    d.copy_(q)
    sd.copy_(s)


# ---------------------------------------------------------------------------------------------- SwiGLU
def swiglu_values(gate_up: torch.Tensor) -> torch.Tensor:
    """``SiLU(gate) * up`` in float32 of ``gate_up`` ``[r, 2I]`` in the checkpoint order (gate ``[0, I)``, up
    ``[I, 2I)``): the values ``silu_mul_quant`` quantises (``quant.silu_mul_quant_torch``)."""
    half = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :half].float()) * gate_up[..., half:].float()


def check_swiglu_inter(n: int, name: str = "rhs[0] (B)") -> int:
    """``n = 2I`` with ``I`` a positive multiple of 128 (the SwiGLU kinds' tiles are one gate block and one up
    block); returns I."""
    if n <= 0 or n % (2 * GRAN_MN_BLOCK):
        raise ValueError(f"{name}: the SwiGLU GEMM needs n = 2I (gate | up) with I a multiple of {GRAN_MN_BLOCK}, got "
                         f"n={n}")
    return n // 2


def interleave_swiglu_weights(w13: torch.Tensor, w13_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The SwiGLU kinds' B layout of a gate/up weight (include/deep_fp8_gemm/policy_swiglu.cuh): exact, a copy.

    Args:
        w13: ``[E, 2I, H]`` float8_e4m3fn in the checkpoint layout (rows ``[0, I)`` gate W1, ``[I, 2I)`` up W3),
            ``I % 128 == 0``.
        w13_scale: ``[E, 2I/128, ceil(H/128)]`` float32, its 128x128 block scales.

    Returns:
        ``(w, s)`` of the same shapes, contiguous: 128-row blocks reordered gate block c, up block c, ...
        (``w[e, 256c + r] = w13[e, 128c + r]``, ``w[e, 256c + 128 + r] = w13[e, I + 128c + r]``), the block
        scales moved with their blocks.
    """
    for t, name, dtype in ((w13, "w13", FP8), (w13_scale, "w13_scale", torch.float32)):
        check_tensor(t, name, dtype, 3)
    num_experts, two_i, hidden = w13.shape
    inter = check_swiglu_inter(two_i, "w13")
    blocks = inter // GRAN_MN_BLOCK
    check_shape(w13_scale, "w13_scale", (num_experts, 2 * blocks, ceil_div(hidden, GRAN_K)),
                "[E, 2I/128, ceil(H/128)]")
    w = (w13.view(torch.uint8).view(num_experts, 2, blocks, GRAN_MN_BLOCK, hidden).transpose(1, 2).contiguous()
         .view(num_experts, two_i, hidden).view(FP8))
    s = w13_scale.view(num_experts, 2, blocks, -1).transpose(1, 2).contiguous().view(num_experts, 2 * blocks, -1)
    return w, s


def deinterleave_swiglu_columns(x: torch.Tensor) -> torch.Tensor:
    """Columns of ``x [..., 2I]`` in the interleaved order (gate block c, up block c, ...) back to the checkpoint
    order (gate ``[0, I)``, up ``[I, 2I)``): what a GEMM with the interleaved B computes, as the unfused path sees it."""
    two_i = x.shape[-1]
    blocks = two_i // (2 * GRAN_MN_BLOCK)
    return x.reshape(*x.shape[:-1], blocks, 2, GRAN_MN_BLOCK).transpose(-3, -2).reshape(*x.shape[:-1], two_i)


# ---------------------------------------------------------------------------------------------- operands
def check_operands_2d(a, sa, b, sb, grouped: bool, rows_name: str) -> tuple[int, int, int, int]:
    """A ``[rows, k]`` e4m3 + sA ``[rows, ceil(k/128)]`` and B ``[n, k]`` (``grouped``: ``[G, n, k]``) + its 128x128
    block scales, one device; returns ``(rows, n, k, G)``."""
    rows, k, kb = check_operand_a_2d(a, sa, rows_name)
    groups = None
    if grouped:
        check_is_tensor(b, "rhs[0] (B)")
        if b.dim() != 3 or b.size(0) < 1:
            raise ValueError(f"rhs[0] (B) must be 3-D [G, n, k] with G >= 1, got rhs[0] (B).shape={tuple(b.shape)}")
        groups = b.size(0)
    n = check_operand_b_blocks(b, sb, k, kb, groups)
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")))
    return rows, n, k, groups or 1


def check_layout_and_pointers(a, sa, b, sb, d, sd, n: int, k: int, extra: tuple[tuple[torch.Tensor, str], ...],
                              layout: bool, pointers: bool) -> None:
    """The ``layout`` level (A / B K-major, TMA strides; the output pair's layout) and the ``pointers`` level
    (alignment, no overlap between the outputs and any input, ``extra`` included) of ``_core.checks``."""
    if layout:
        check_divisibility(n, k)
        check_row_major_tma(a, "lhs[0] (A)")
        check_row_major_tma(b, "rhs[0] (B)")
        check_out_layout(d, sd)
    if pointers:
        check_aligned_ptr(a, "lhs[0] (A)")
        check_aligned_ptr(b, "rhs[0] (B)")
        check_out_pointers(d, sd, ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"))
                           + extra)


def out_operands(lhs, rhs, out, *extra: tuple[object, str]) -> tuple[torch.Tensor, ...]:
    """``(A, sA, B, sB, D, sD)`` unpacked from the public arguments, each required to be a tensor (TypeError naming
    it)."""
    d, sd = unpack_pair(out, "out")
    a, sa, b, sb = operands(lhs, rhs, d, (sd, OUT_NAMES[1]), *extra, out_name=OUT_NAMES[0])
    return a, sa, b, sb, d, sd


# ---------------------------------------------------------------------------------------------- the references
def reference_rows(a_deq: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, d: torch.Tensor, sd: torch.Tensor,
                   use_ue8m0: bool, swiglu: bool) -> None:
    """One expert's rows: ``a_deq`` float32 ``[r, k]`` (dequantised A), B ``[n, k]`` + sB; the FP8 result into
    ``d [r, n_out]`` / ``sd [r, ceil(n_out/128)]`` (``swiglu``: B interleaved, ``n_out = n / 2``)."""
    if a_deq.shape[0] == 0:
        return
    acc = matmul_nt_f32(a_deq, b, sb)
    if swiglu:
        acc = swiglu_values(deinterleave_swiglu_columns(acc))
    quantise_into(acc, d, sd, use_ue8m0)


def reference_dense(a, sa, b, sb, d, sd, use_ue8m0: bool, swiglu: bool = False) -> None:
    """The reference of the dense layout on checked tensors."""
    reference_rows(dequantize_per_token(a, sa), b, sb, d, sd, use_ue8m0, swiglu)


def reference_contiguous(a, sa, b, sb, d, sd, m_indices, use_ue8m0: bool, swiglu: bool = False) -> None:
    """The contiguous layout's reference on checked tensors, on the rows the kernels compute: one part of
    :func:`.contiguous.reference_row_parts` at a time (an expert's own rows; the padding rows sharing a BLOCK_M block
    with them, computed and quantised with that expert, D and sD, as Fp8TmaStore stores every row of a tile);
    padding-only blocks left untouched. Reads ``m_indices`` on the host (``ValueError`` for values outside
    ``[-1, G)``)."""
    parts = reference_row_parts(m_indices, b.size(0), a.device)
    if not parts:
        return
    a_deq = dequantize_per_token(a, sa)
    for g, rows in parts:
        q, s = empty_out((), rows.numel(), d.shape[-1], d.device)
        reference_rows(a_deq[rows], b[g], sb[g], q, s, use_ue8m0, swiglu)
        d.view(torch.uint8)[rows] = q.view(torch.uint8)  # no index_put for float8 on every device
        sd[rows] = s


def reference_row_ranges(a, sa, b, sb, d, sd, parts: list[tuple[int, int, int]], use_ue8m0: bool,
                         swiglu: bool = False) -> None:
    """Rows ``[start, stop)`` of the 2-D A / D computed with group g, one quantised matmul per ``(g, start, stop)`` of
    ``parts`` (the psum layout)."""
    for g, start, stop in parts:
        if stop > start:
            reference_rows(dequantize_per_token(a[start:stop], sa[start:stop]), b[g], sb[g], d[start:stop],
                           sd[start:stop], use_ue8m0, swiglu)


def reference_masked(a, sa, b, sb, d, sd, masked_m, use_ue8m0: bool, swiglu: bool = False) -> None:
    """The masked layout's reference on checked tensors: rows ``< masked_m[g]`` of every group (read on the host,
    ``ValueError`` outside ``[0, m_max]``: :func:`.masked.check_masked_values`); the other rows left untouched."""
    m_max = a.size(1)
    check_masked_values(masked_m, m_max)
    for g, count in enumerate(masked_m.tolist()):
        if count:
            reference_rows(dequantize_per_token(a[g, :count], sa[g, :count]), b[g], sb[g], d[g, :count],
                           sd[g, :count], use_ue8m0, swiglu)


# ---------------------------------------------------------------------------------------------- grouped checks
def n_out_of(n: int, swiglu: bool) -> int:
    """D's columns: ``n``, or ``n / 2`` for the SwiGLU kinds (``n = 2I``, I a multiple of 128: checked)."""
    return check_swiglu_inter(n) if swiglu else n


def check_contiguous(a, sa, b, sb, d, sd, m_indices, swiglu: bool, layout: bool, pointers: bool) -> Problem:
    """The contiguous layout (``contiguous_fp8out``, ``contiguous_swiglu``): A ``[m_sum, k]``, B ``[G, n, k]``,
    ``(D, sD)`` of ``[m_sum, n_out]``, m_indices ``[m_sum]`` int32 (values not read); ``layout``: ``m_sum`` a multiple
    of the contiguous alignment. Returns ``Problem(m_sum, n, k, G)``."""
    m_sum, n, k, groups = check_operands_2d(a, sa, b, sb, True, "m_sum")
    check_out((d, sd), (), m_sum, n_out_of(n, swiglu), a.device, "m_sum")
    check_tensor(m_indices, "m_indices", INDEX_DTYPE, 1)
    check_shape(m_indices, "m_indices", (m_sum,), "[m_sum]")
    check_same_device(a.device, ((m_indices, "m_indices"),))
    if layout:
        check_m_sum(m_sum)
    check_layout_and_pointers(a, sa, b, sb, d, sd, n, k, ((m_indices, "m_indices"),), layout, pointers)
    return Problem(m_sum, n, k, groups)


def check_masked(a, sa, b, sb, d, sd, masked_m, expected_m, swiglu: bool, layout: bool, pointers: bool) -> Problem:
    """The masked layout (``masked_fp8out``, ``masked_swiglu``): A ``[G, m_max, k]``, B ``[G, n, k]``, ``(D, sD)`` of
    ``[G, m_max, n_out]``, masked_m ``[G]`` int32 (values not read), expected_m a positive int. Returns
    ``Problem(m_max, n, k, G)``."""
    check_expected_m(expected_m)
    m_max, n, k, groups = check_masked_operands(a, sa, b, sb)
    check_out((d, sd), (groups,), m_max, n_out_of(n, swiglu), a.device, "m_max")
    check_tensor(masked_m, "masked_m", INDEX_DTYPE, 1)
    check_shape(masked_m, "masked_m", (groups,), "[G]")
    check_same_device(a.device, ((masked_m, "masked_m"),))
    check_layout_and_pointers(a, sa, b, sb, d, sd, n, k, ((masked_m, "masked_m"),), layout, pointers)
    return Problem(m_max, n, k, groups)
