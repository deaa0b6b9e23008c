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
"""

from __future__ import annotations

import torch

from .._core.checks import (INDEX_DTYPE, Problem, check_is_tensor, check_operand_a_2d, check_operand_b_blocks,
                            check_pointers, check_same_device, check_shape, check_tensor, check_tma_layout, unpack_pair)
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
        alignment = get_m_alignment_for_contiguous_layout()
        if problem.m % alignment != 0:
            raise ValueError(f"m_sum (rows of lhs[0]) must be a multiple of get_m_alignment_for_contiguous_layout()="
                             f"{alignment}, got m_sum={problem.m}")
        check_tma_layout(a, b, out, problem.n, problem.k)
    if pointers:
        check_pointers(a, sa, b, sb, out, ((m_indices, "m_indices"),))
    return problem


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


def reference_validated(a, sa, b, sb, out, m_indices) -> None:
    """The reference on checked tensors: one matmul per expert over the rows the kernels compute with it
    (:func:`kernel_row_experts`, BLOCK_M = the current alignment): its rows and the padding rows of its blocks;
    padding-only blocks are left untouched. Reads ``m_indices`` on the host (``ValueError`` for values outside
    ``[-1, G)``)."""
    num_groups = b.size(0)
    experts = m_indices.to(device=a.device, dtype=torch.long)
    if experts.numel() == 0:
        return
    lo, hi = int(experts.min()), int(experts.max())
    if lo < -1 or hi >= num_groups:
        raise ValueError(f"m_indices values must be in [-1, G), got min={lo} max={hi} with G={num_groups}")
    experts = kernel_row_experts(experts, contiguous_block_m(get_m_alignment_for_contiguous_layout()))
    order = torch.argsort(experts, stable=True)  # untouched rows (-1) first, then expert 0, 1, ...
    counts = torch.bincount(experts + 1, minlength=num_groups + 1).tolist()
    a_deq = dequantize_per_token(a, sa)
    start = counts[0]
    for g in range(num_groups):
        count = counts[g + 1]
        if count:
            rows = order[start: start + count]
            out[rows] = matmul_nt_bf16(a_deq[rows], b[g], sb[g])
            start += count


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
    """Check and dispatch (the custom op's kernel for CPU and CUDA)."""
    if not check(a, sa, b, sb, out, m_indices).empty:
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
            rows (on every backend), left untouched in a block of padding only. Never read on the host by the
            CUDA path: there an expert id
            ``>= G`` makes the kernel trap (the launch fails; the CUDA context is lost), and the CPU path raises
            ``ValueError``.

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
                                  "none"))
