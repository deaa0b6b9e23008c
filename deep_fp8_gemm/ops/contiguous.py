"""The M-grouped contiguous GEMM family (kind ``"contiguous"``): ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous``.

MoE prefill / training: the experts' rows concatenated in A ``[m_sum, k]``, each expert's segment padded to
``get_m_alignment_for_contiguous_layout()`` rows (64 or 128, process-wide; it is the kernels' BLOCK_M),
``m_indices[r]`` the expert of row r (-1: padding), B ``[G, n, k]`` the experts' weights;
``out[r] = bf16(dequant(A[r]) · dequant(B[m_indices[r]])ᵀ)``. The kernels skip BLOCK_M blocks made only of
padding and compute the padding rows that share a block with valid rows with the block's expert; a block's
expert is read from its first and last rows (kind ``GroupedContiguous`` of ``scheduler.cuh``). The CPU
reference does exactly the same, so a whole output compares equal across backends (the reference design's
tests zero A's padding rows and compare everything). Same layers as :mod:`.dense`: checks, reference,
dispatch, plan, the custom op ``torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous``, the public
function.

The layout rule the kernels rely on (:func:`check_contiguous_values`): every BLOCK_M-row block (BLOCK_M =
``config.contiguous_block_m(get_m_alignment_for_contiguous_layout())``, the alignment itself) holds rows of at
most one expert, and a block holding any expert row has an expert row first or last (the kernel reads the
block's expert from those two rows, and skips the block when both are padding). A layout built by
:mod:`deep_fp8_gemm.layout` (each expert's rows from a multiple of the alignment, -1 padding at the tail) meets
it; padding at a segment's head or in its middle does too. CPU tensors are checked on every call (the reference
would compute other layouts one way, the kernels another); CUDA tensors never (the values stay on the device)
unless ``DFG_CHECK_LAYOUTS=1``, or explicitly with :func:`check_contiguous_layout` (both synchronise).
"""

from __future__ import annotations

import numpy as np
import torch

from .._core.checks import (INDEX_DTYPE, Problem, check_is_tensor, check_operand_a_2d, check_operand_b_blocks,
                            check_pointers, check_same_device, check_shape, check_tensor, check_tma_layout,
                            layout_values_checked, unpack_pair)
from .._core.dispatch import eager, normalise_scales, operands
from .._core.family import GemmFamily, register_op
from .._core.plans import GemmEntrySpec, gemm_entry
from .._core.reference_math import dequantize_per_token, matmul_nt_bf16
from ..config import GemmConfig, contiguous_block_m, get_config
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from ..utils import get_m_alignment_for_contiguous_layout

def check_m_grouped_operands(a, sa, b, sb, out) -> Problem:
    """The operand checks every M-grouped contiguous layout shares (contiguous, psum): A ``[m_sum, k]`` e4m3, sA
    ``[m_sum, ceil(k/128)]`` fp32, B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``, out ``[m_sum, n]`` bf16.
    Returns ``Problem(m_sum, n, k, G)``."""
    m_sum, k, kb = check_operand_a_2d(a, sa, "m_sum")
    check_is_tensor(b, "rhs[0] (B)")
    if b.dim() != 3 or b.size(0) < 1:
        raise ValueError(f"rhs[0] (B) must be 3-D [G, n, k] with G >= 1, got rhs[0] (B).shape={tuple(b.shape)}")
    num_groups = b.size(0)
    n = check_operand_b_blocks(b, sb, k, kb, num_groups)
    check_tensor(out, "out", torch.bfloat16, 2)
    check_shape(out, "out", (m_sum, n), "[m_sum, n]")
    return Problem(m_sum, n, k, num_groups)


def check(a, sa, b, sb, out, m_indices, *, layout: bool = True, pointers: bool = True) -> Problem:
    """:func:`check_m_grouped_operands` plus m_indices ``[m_sum]`` int32 on the same device, and (``layout``)
    ``m_sum`` a multiple of the contiguous alignment. The values of m_indices are not read."""
    problem = check_m_grouped_operands(a, sa, b, sb, out)
    check_tensor(m_indices, "m_indices", INDEX_DTYPE, 1)
    check_shape(m_indices, "m_indices", (problem.m,), "[m_sum]")
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (out, "out"),
                                 (m_indices, "m_indices")))
    if layout:
        check_m_sum(problem.m)
        check_tma_layout(a, b, out, problem.n, problem.k)
    if pointers:
        check_pointers(a, sa, b, sb, out, ((m_indices, "m_indices"),))
    return problem


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
    blocked = m_sum % size == 0  # else check() refuses m_sum (the explicit check: before this)
    values = contiguous_layout_stats(idx.numpy() if on_host else idx, size if blocked else None)
    lo, hi = values[0], values[1]
    if lo < -1 or hi >= num_groups:
        raise ValueError(f"{name} values must be in [-1, G), got min={lo} max={hi} with G={num_groups}")
    if blocked and values[2]:
        block = values[3]
        raise ValueError(_block_message(idx[block * size:(block + 1) * size].tolist(), block, size, name, alignment))


def contiguous_layout_stats(values, block_m: int | None) -> list[int]:
    """``[min, max]`` of the ``m_indices`` ``values`` (a 1-D numpy array or torch tensor), then, with ``block_m``,
    whether a ``block_m``-row block breaks the block rule and the first that does: the same expressions in numpy
    or torch, read back as host ints (one synchronisation for a GPU tensor)."""
    is_tensor = isinstance(values, torch.Tensor)
    stats = [values.min(), values.max()]
    if block_m is not None:
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
    with ``DFG_CHECK_LAYOUTS=1``): ``m_indices`` a 1-D int32 tensor, ``m_sum`` a multiple of
    :func:`~deep_fp8_gemm.get_m_alignment_for_contiguous_layout`, values in ``[-1, num_groups)`` and the block rule
    of the module docstring. Reads the values, so it synchronises when ``m_indices`` is on a GPU. ``ValueError``
    (``TypeError`` for a wrong type) naming ``m_indices``, the block and its rows."""
    check_tensor(m_indices, "m_indices", INDEX_DTYPE, 1)
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    m_sum = m_indices.shape[0]
    check_m_sum(m_sum)
    check_contiguous_values(m_indices, m_sum, num_groups)


def check_m_sum(m_sum: int) -> None:
    """``m_sum`` (rows of A) a multiple of the contiguous alignment (``ValueError`` naming both): what every contiguous
    layout's check refuses first (the FP8-output kinds' too, ``ops.fp8_output``)."""
    alignment = get_m_alignment_for_contiguous_layout()
    if m_sum % alignment != 0:
        raise ValueError(f"m_sum (rows of lhs[0]) must be a multiple of get_m_alignment_for_contiguous_layout()="
                         f"{alignment}, got m_sum={m_sum}")


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
            # without it: bit-identical, tests/test_distributed.py).
            is_own = own[rows] >= 0
            parts += [(g, part) for part in (rows[is_own], rows[~is_own]) if part.numel()]
            start += count
    return parts


def reference_validated(a, sa, b, sb, out, m_indices) -> None:
    """The reference on checked tensors: one matmul per part of :func:`reference_row_parts` (an expert's rows, the
    padding rows of its blocks); padding-only blocks are left untouched. Reads ``m_indices`` on the host
    (``ValueError`` for values outside ``[-1, G)``)."""
    parts = reference_row_parts(m_indices, b.size(0), a.device)
    if not parts:
        return
    a_deq = dequantize_per_token(a, sa)
    for g, rows in parts:
        out[rows] = matmul_nt_bf16(a_deq[rows], b[g], sb[g])


def reference(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
              m_indices: torch.Tensor) -> None:
    """Reference of the contiguous grouped GEMM: ``out[r] = A[r]·B[m_indices[r]]ᵀ`` (dequantised).

    Args:
        lhs: ``(A [m_sum, k] float8_e4m3fn, sA [m_sum, ceil(k/128)] float32)``.
        rhs: ``(B [G, n, k] float8_e4m3fn, sB [G, ceil(n/128), ceil(k/128)] float32)``.
        out: ``[m_sum, n]`` bfloat16, written in place.
        m_indices: ``[m_sum]`` int32, values in ``[-1, G)``; rows with -1 are padding: computed with their
            block's expert when their BLOCK_M block (BLOCK_M = the contiguous alignment) holds valid rows, as the
            kernels do, else left untouched.
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check(a, sa, b, sb, out, m_indices, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, out, m_indices)


def plan(a, b, expected_m, num_sms: int) -> GemmConfig:
    """The config: the heuristic for ``m_sum`` rows over ``G`` experts, BLOCK_M = the contiguous alignment."""
    return get_config(a.shape[0], b.shape[-2], b.shape[-1], b.shape[0], "contiguous", num_sms,
                      contiguous_alignment=get_m_alignment_for_contiguous_layout())


def dispatch(a, sa, b, sb, out, m_indices, expected_m=None) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, out, m_indices)
        return
    cfg = plan(a, b, None, gemm_host.num_sms_for(backend))
    gemm_host.launch_1d2d(cfg, a, normalise_scales(sa), b, sb.contiguous(), out, m_indices.contiguous(), backend)


def impl(a, sa, b, sb, out, m_indices) -> None:
    """Check (the layout's values too on CPU tensors, and on CUDA with ``DFG_CHECK_LAYOUTS=1``) and dispatch (the
    custom op's kernel for CPU and CUDA)."""
    problem = check(a, sa, b, sb, out, m_indices)
    if layout_values_checked(a.device):
        check_contiguous_values(m_indices, problem.m, problem.groups)
    if not problem.empty:
        FAMILY.dispatch(a, sa, b, sb, out, m_indices)


def _fake(a, sa, b, sb, out, m_indices) -> None:
    check(a, sa, b, sb, out, m_indices, pointers=False)


OP = register_op("m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
                 "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, Tensor m_indices) -> ()", impl, _fake)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
    lhs: tuple[torch.Tensor, torch.Tensor],
    rhs: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    m_indices: torch.Tensor,
) -> None:
    """Grouped GEMM over experts whose rows are concatenated (MoE prefill / training).

    ``out[r] = bf16(dequant(A[r]) · dequant(B[m_indices[r]])ᵀ)`` for every row with ``m_indices[r] >= 0``.

    Args:
        lhs: ``(A, sA)``: A ``[m_sum, k]`` float8_e4m3fn, K-major; sA ``[m_sum, ceil(k/128)]`` float32.
            Rows are grouped by expert, each expert's segment padded to
            ``get_m_alignment_for_contiguous_layout()`` rows (128, or 64 when set), so ``m_sum`` is a multiple
            of it.
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
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    if _entry(a, sa, b, sb, out, m_indices):  # eager: checks cached per tensor signature (_core.plans)
        return
    a, sa, b, sb = operands(lhs, rhs, out, (m_indices, "m_indices"))
    (impl if eager(a, sa, b, sb, out, m_indices) else OP)(a, sa, b, sb, out, m_indices)


FAMILY = GemmFamily(kind="contiguous", public=m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, check=check,
                    reference=reference, dispatch=dispatch, plan=plan, op=OP)
_entry = gemm_entry(GemmEntrySpec(FAMILY, lambda a, sa, b, sb, out, gl, em: check(a, sa, b, sb, out, gl), "m_indices",
                                  "none", check_contiguous_values))
