"""The M-grouped contiguous layout (``layout = "contiguous"`` of the kinds table):
``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` (bf16 out), ``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous`` (FP8 out) and
``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu`` (the MoE up-projection, SwiGLU·FP8 out).

MoE prefill / training: the experts' rows concatenated in A ``[m_sum, k]``, each expert's segment padded to
``get_m_alignment_for_contiguous_layout()`` rows (64 or 128, process-wide; it is the kernels' BLOCK_M),
``m_indices[r]`` the expert of row r (-1: padding), B ``[G, n, k]`` the experts' weights;
``out[r] = dequant(A[r]) · dequant(B[m_indices[r]])ᵀ`` as the output policy stores it (``ops.outputs``). The kernels
skip BLOCK_M blocks made only of padding and compute the padding rows that share a block with valid rows with the
block's expert; a block's expert is read from its first and last rows (kind ``GroupedContiguous`` of
``scheduler.cuh``). The CPU reference does exactly the same (:func:`reference_row_parts`), so a whole output compares
equal across backends (the reference design's tests zero A's padding rows and compare everything).

The layout rule the kernels rely on (:func:`check_contiguous_values`): every BLOCK_M-row block (BLOCK_M =
``config.contiguous_block_m(get_m_alignment_for_contiguous_layout())``, the alignment itself) holds rows of at
most one expert, and a block holding any expert row has an expert row first or last (the kernel reads the
block's expert from those two rows, and skips the block when both are padding). ``m_sum`` need not be a multiple
of the alignment, as in the reference design (its host code does not check it; Hugging Face transformers' experts
path passes such an ``m_sum`` with -1 rows at the tail): the last block is then partial, its last row is row
``m_sum - 1`` (``scheduler.cuh``, ``contiguous_block_expert``), the kernels' tensor maps clip the rows past
``m_sum``, and the rule applies to it as to any other block. A layout built by
:mod:`deep_fp8_gemm.layout` (each expert's rows from a multiple of the alignment, -1 padding at the tail) meets
it; padding at a segment's head or in its middle does too. CPU tensors are checked on every call (the reference
would compute other layouts one way, the kernels another); CUDA tensors never (the values stay on the device)
unless ``DFG_CHECK_LAYOUTS=1``, or explicitly with :func:`check_contiguous_layout` (both synchronise).
"""

from __future__ import annotations

import numpy as np
import torch

from .._core.checks import (BLOCK128, INDEX_DTYPE, check_is_tensor, check_operand_a_2d, check_operand_b_blocks,
                            check_same_device, check_shape, check_tensor)
from ..config import contiguous_block_m
from ..utils import get_m_alignment_for_contiguous_layout
from .gemm_family import GemmLayout, families_of


def check_m_grouped_operands(a, sa, b, sb, gran=BLOCK128) -> tuple[int, int, int, int]:
    """The operand checks every M-grouped contiguous layout shares (contiguous, psum): A ``[m_sum, k]`` e4m3, sA
    ``[m_sum, ceil(k/128)]`` fp32, B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``, one device. Returns
    ``(m_sum, n, k, G)``."""
    m_sum, k, kb = check_operand_a_2d(a, sa, "m_sum", gran)
    check_is_tensor(b, "rhs[0] (B)")
    if b.dim() != 3 or b.size(0) < 1:
        raise ValueError(f"rhs[0] (B) must be 3-D [G, n, k] with G >= 1, got rhs[0] (B).shape={tuple(b.shape)}")
    num_groups = b.size(0)
    n = check_operand_b_blocks(b, sb, k, kb, num_groups, gran)
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")))
    return m_sum, n, k, num_groups


def check_contiguous_values(m_indices: torch.Tensor, m_sum: int, num_groups: int, name: str = "m_indices") -> None:
    """The values of a checked ``m_indices`` ``[m_sum]`` (module docstring): every entry in ``[-1, G)``, and one
    expert per BLOCK_M block with an expert row first or last. ``ValueError`` naming the block and its rows
    otherwise. Vectorised on the tensor's device; reads a few integers back (one synchronisation on a GPU), the
    rows of a bad block only when raising."""
    if m_sum == 0:
        return
    idx = m_indices.reshape(-1)
    # CPU tensors in numpy (zero-copy): torch's CPU reductions along a dim over a few hundred blocks ran at
    # 3-8 ms here on a loaded 2-core machine (intra-op threads waking up), numpy's at ~20 us. The same expressions
    # run in torch on a GPU, read back with one synchronisation.
    on_host = idx.device.type == "cpu"
    alignment = get_m_alignment_for_contiguous_layout()
    size = contiguous_block_m(alignment)
    values = contiguous_layout_stats(idx.numpy() if on_host else idx, size)
    lo, hi = values[0], values[1]
    if lo < -1 or hi >= num_groups:
        raise ValueError(f"{name} values must be in [-1, G), got min={lo} max={hi} with G={num_groups}")
    if values[2]:
        block = values[3]
        raise ValueError(_block_message(idx[block * size:(block + 1) * size].tolist(), block, size, name, alignment))


def contiguous_layout_stats(values, block_m: int | None) -> list[int]:
    """``[min, max]`` of the ``m_indices`` ``values`` (a 1-D numpy array or torch tensor), then, with ``block_m``,
    whether a ``block_m``-row block breaks the block rule and the first that does: the same expressions in numpy
    or torch, read back as host ints (one synchronisation for a GPU tensor)."""
    is_tensor = isinstance(values, torch.Tensor)
    stats = [values.min(), values.max()]
    if block_m is not None:
        tail = -values.shape[0] % block_m
        if tail:  # a partial last block: its last real row repeated keeps first / last / one-expert as they are
            pad = values[-1:].repeat(tail) if is_tensor else np.repeat(values[-1:], tail)
            values = torch.cat([values, pad]) if is_tensor else np.concatenate([values, pad])
        v = values.reshape(-1, block_m)
        first, last = v[:, 0], v[:, -1]
        expert = (torch.maximum if is_tensor else np.maximum)(first, last)
        valid = v >= 0
        bad = (valid.any(1) & (first < 0) & (last < 0)) | (valid & (v != expert[:, None])).any(1)
        stats += [bad.any(), (bad.to(torch.uint8) if is_tensor else bad).argmax()]
    if is_tensor:
        return torch.stack([x.to(torch.int64) for x in stats]).tolist()
    return [int(x) for x in stats]


def _block_message(rows: list[int], block: int, size: int, name: str, alignment: int) -> str:
    """Why block ``block`` (``size`` rows, values ``rows``) breaks the rule, in the user's rows."""
    start = block * size
    where = f"{name}[{start}:{start + size}] (block {block} of the kernels' {size}-row blocks)"
    experts = sorted({e for e in rows if e >= 0})
    fix = (f"start every expert's rows at a multiple of get_m_alignment_for_contiguous_layout()={alignment} and pad "
           f"its segment with -1 at the tail (deep_fp8_gemm.layout.build_contiguous_layout does)")
    if len(experts) > 1:
        spans = []
        for e in experts[:3]:
            at = [start + i for i, x in enumerate(rows) if x == e]
            spans.append(f"expert {e} at rows {at[0]}..{at[-1]}")
        return (f"{where} holds rows of {len(experts)} experts ({', '.join(spans)}): the kernels compute a block with "
                f"one expert's weights, so the others' rows would be wrong; {fix}")
    first_row = start + next(i for i, x in enumerate(rows) if x >= 0)
    return (f"{where} holds expert {experts[0]} (first at row {first_row}) but its first and last rows are padding "
            f"(-1): the kernels read a block's expert from those two rows and would skip the block; {fix}")


def check_contiguous_layout(m_indices: torch.Tensor, num_groups: int) -> None:
    """Check a contiguous layout before a GEMM on the GPU (the op checks CPU tensors itself; CUDA tensors only
    with ``DFG_CHECK_LAYOUTS=1``): ``m_indices`` a 1-D int32 tensor (any ``m_sum``: a partial last block is a block),
    values in ``[-1, num_groups)`` and the block rule of the module docstring. Reads the values, so it synchronises when ``m_indices`` is on a GPU. ``ValueError``
    (``TypeError`` for a wrong type) naming ``m_indices``, the block and its rows."""
    check_tensor(m_indices, "m_indices", INDEX_DTYPE, 1)
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    check_contiguous_values(m_indices, m_indices.shape[0], num_groups)


def kernel_row_experts(experts: torch.Tensor, block_m: int) -> torch.Tensor:
    """The expert each row is computed with by the kernels (``scheduler.cuh``, ``contiguous_block_expert``):
    its own for a valid row; for a padding row (-1), its BLOCK_M block's expert, ``max(m_indices[first],
    m_indices[last])`` of the block's first and last rows, which is -1 (row left untouched) for a block of
    padding only. ``experts``: int64 ``[m]``; returns int64 ``[m]``."""
    m = experts.numel()
    firsts = torch.arange(0, m, block_m, device=experts.device)
    lasts = (firsts + block_m).clamp_(max=m) - 1
    block_expert = torch.maximum(experts[firsts], experts[lasts])
    return torch.where(experts >= 0, experts, block_expert.repeat_interleave(block_m)[:m])


def reference_row_parts(m_indices: torch.Tensor, num_groups: int, device: torch.device
                        ) -> list[tuple[int, torch.Tensor]]:
    """The matmuls of a contiguous reference (this family's and the FP8-output kinds', ``ops.fp8_output``):
    ``(expert, rows)`` with ``rows`` int64 indices on ``device``, per expert first its own rows, then the padding
    rows of its BLOCK_M blocks (:func:`kernel_row_experts`, BLOCK_M = the current alignment), each part non-empty;
    rows of padding-only blocks are in none (the kernels leave them untouched). Reads ``m_indices`` on the host
    (``ValueError`` for values outside ``[-1, G)``)."""
    experts = m_indices.to(device=device, dtype=torch.long)
    if experts.numel() == 0:
        return []
    lo, hi = int(experts.min()), int(experts.max())
    if lo < -1 or hi >= num_groups:
        raise ValueError(f"m_indices values must be in [-1, G), got min={lo} max={hi} with G={num_groups}")
    own = experts
    experts = kernel_row_experts(experts, contiguous_block_m(get_m_alignment_for_contiguous_layout()))
    order = torch.argsort(experts, stable=True)  # untouched rows (-1) first, then expert 0, 1, ...
    counts = torch.bincount(experts + 1, minlength=num_groups + 1).tolist()
    parts = []
    start = counts[0]
    for g in range(num_groups):
        count = counts[g + 1]
        if count:
            rows = order[start: start + count]
            # The expert's own rows in a matmul of their own, its blocks' padding rows in another: float32 matmuls
            # may sum in another order for another row count, and a row's result must not depend on how much
            # padding its expert has (the masked path and the expert-parallel layers compute the same rows
            # without it: bit-identical, tests/model/test_distributed.py).
            is_own = own[rows] >= 0
            parts += [(g, part) for part in (rows[is_own], rows[~is_own]) if part.numel()]
            start += count
    return parts


class MGroupedLayout(GemmLayout):
    """What the M-grouped layouts over a 2-D A share (contiguous, psum): A ``[m_sum, k]``, B ``[G, n, k]``, planned
    for ``m_sum`` rows at BLOCK_M = the contiguous alignment."""

    rows_name = "m_sum"

    def check_inputs(self, a, sa, b, sb, gran=BLOCK128):
        return check_m_grouped_operands(a, sa, b, sb, gran)

    def plan_problem(self, a, b, expected_m):
        """The heuristic for ``m_sum`` rows over ``G`` experts, BLOCK_M = the contiguous alignment."""
        return (a.shape[0], b.shape[-2], b.shape[-1], b.shape[0],
                {"contiguous_alignment": get_m_alignment_for_contiguous_layout()})


class ContiguousLayout(MGroupedLayout):
    """``m_indices [m_sum]`` int32, any ``m_sum`` (a partial last block is a block, as in the reference design); the
    values' block rule (:func:`check_contiguous_values`); the rows of :func:`reference_row_parts`."""

    name, grouped, op_template = "contiguous", "m_indices", "m_grouped_gemm_fp8_fp8_{}_nt_contiguous"
    schema = ", Tensor m_indices"

    def check_grouped(self, gl, problem, device):
        check_tensor(gl, "m_indices", INDEX_DTYPE, 1)
        check_shape(gl, "m_indices", (problem.m,), "[m_sum]")
        check_same_device(device, ((gl, "m_indices"),))

    def values_check(self, gl, rows, groups):
        check_contiguous_values(gl, rows, groups)

    def reference_parts(self, a, gl, groups):
        return reference_row_parts(gl, groups, a.device)


#: The layout, and kind -> family of every contiguous 1D2D kind of the kinds table.
LAYOUT = ContiguousLayout()
FAMILIES = families_of(LAYOUT)
_BF16, _FP8, _SWIGLU = (FAMILIES[k].call for k in ("contiguous", "contiguous_fp8out", "contiguous_swiglu"))


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs: tuple[torch.Tensor, torch.Tensor],
                                              rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
                                              m_indices: torch.Tensor) -> None:
    """Grouped GEMM over experts whose rows are concatenated (MoE prefill / training).

    ``out[r] = bf16(dequant(A[r]) · dequant(B[m_indices[r]])ᵀ)`` for every row with ``m_indices[r] >= 0``.

    Args:
        lhs: ``(A, sA)``: A ``[m_sum, k]`` float8_e4m3fn, K-major; sA ``[m_sum, ceil(k/128)]`` float32.
            Rows are grouped by expert, each expert's segment padded to
            ``get_m_alignment_for_contiguous_layout()`` rows (128, or 64 when set); ``m_sum`` need not be a
            multiple of it (the last block is then partial; trailing -1 rows are left untouched, as in the
            reference design).
        rhs: ``(B, sB)``: B ``[G, n, k]`` float8_e4m3fn, K-major; sB ``[G, ceil(n/128), ceil(k/128)]`` float32.
        out: ``[m_sum, n]`` bfloat16, row-major, written in place.
        m_indices: ``[m_sum]`` int32 on the same device, expert of each row in ``[0, G)``, or -1 for a padding
            row (at the tail of its expert's segment): computed with its block's expert when the block has valid
            rows (on every backend), left untouched in a block of padding only. One expert per BLOCK_M block,
            read from the block's first and last rows (module docstring). CPU tensors: checked on every call
            (``ValueError`` naming the block and its rows). CUDA tensors: never read on the host (an expert id
            ``>= G`` makes the kernel trap, the CUDA context is lost; a block mixing experts computes wrong rows)
            unless ``DFG_CHECK_LAYOUTS=1``; check an untrusted layout with :func:`check_contiguous_layout`
            (synchronises).

    Same alignment rules, errors and dispatch as :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt`.
    """
    _BF16(lhs, rhs, out, m_indices)


def m_grouped_gemm_fp8_fp8_fp8_nt_contiguous(lhs: tuple[torch.Tensor, torch.Tensor],
                                             rhs: tuple[torch.Tensor, torch.Tensor],
                                             out: tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor,
                                             use_ue8m0: bool = False) -> None:
    """Grouped GEMM over experts whose rows are concatenated, FP8 output.

    ``out[r] = per_token_cast_to_fp8(dequant(A[r]) · dequant(B[m_indices[r]])ᵀ)`` for every row with
    ``m_indices[r] >= 0``; a padding row (-1) is computed with its block's expert when the block has valid rows, left
    untouched in a block of padding only (every backend alike).

    Args:
        lhs, rhs, m_indices: as :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (the same layout rule, checked as
            there: CPU tensors on every call, CUDA tensors with ``DFG_CHECK_LAYOUTS=1``).
        out: ``(D, sD)``: D ``[m_sum, n]`` float8_e4m3fn row-major (``n % 16 == 0``), sD ``[m_sum, ceil(n/128)]``
            float32 M-major TMA-aligned (``deep_fp8_gemm.utils.empty_m_major``), as
            :func:`deep_fp8_gemm.gemm_fp8_fp8_fp8_nt`.
        use_ue8m0: power-of-two scales.
    """
    _FP8(lhs, rhs, out, m_indices, None, use_ue8m0)


def m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu(lhs: tuple[torch.Tensor, torch.Tensor],
                                                    rhs: tuple[torch.Tensor, torch.Tensor],
                                                    out: tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor,
                                                    use_ue8m0: bool = False) -> None:
    """The SwiGLU up-projection of the experts' rows: ``out[r] = per_token_cast_to_fp8(SiLU(g) * u)`` with
    ``[g | u] = dequant(A[r]) · dequant(W13[m_indices[r]])ᵀ`` in fp32, for every row with ``m_indices[r] >= 0``; a
    padding row (-1) is computed with its block's expert when the block has valid rows, left untouched in a block of
    padding only (every backend alike).

    Args:
        lhs, m_indices: as :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (A ``[m_sum, H]``; the same layout rule,
            checked as there).
        rhs: ``(W, sW)`` = :func:`deep_fp8_gemm.interleave_swiglu_weights` of the experts' ``(w13, w13_scale)``: W
            ``[G, 2I, H]`` e4m3 (gate / up 128-row blocks alternating), sW ``[G, 2I/128, ceil(H/128)]``;
            ``I % 128 == 0``.
        out: ``(D, sD)``: D ``[m_sum, I]`` float8_e4m3fn row-major, sD ``[m_sum, I/128]`` float32 M-major TMA-aligned
            (``deep_fp8_gemm.utils.empty_m_major``): the ``lhs`` of the down projection, as ``silu_mul_quant``
            returns it.
        use_ue8m0: power-of-two scales.

    Numerics: ``silu_mul_quant``'s (``SiLU(x) = x / (1 + e^-x)``, the product and the 1x128 quantisation in fp32)
    applied to the fp32 GEMM result instead of its bf16 rounding.
    """
    _SWIGLU(lhs, rhs, out, m_indices, None, use_ue8m0)


for _kind, _public in (("contiguous", m_grouped_gemm_fp8_fp8_bf16_nt_contiguous),
                       ("contiguous_fp8out", m_grouped_gemm_fp8_fp8_fp8_nt_contiguous),
                       ("contiguous_swiglu", m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu)):
    FAMILIES[_kind].public = _public
