"""The M-grouped contiguous FP8-output GEMM family (kind ``"contiguous_fp8out"``):
``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous``.

:func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (experts' rows concatenated, each segment padded to
the contiguous alignment, ``m_indices[r]`` the expert of row r or -1) with the output of
:func:`deep_fp8_gemm.gemm_fp8_fp8_fp8_nt`: D e4m3 ``[m_sum, n]`` with 1x128 per-row scales quantised in the epilogue
(``ops.fp8_output``). The contract is the bf16 family's (:mod:`.contiguous`): BLOCK_M =
``get_m_alignment_for_contiguous_layout()`` (64 or 128), the block rule on ``m_indices`` checked on every call of CPU
tensors and on CUDA only with ``DFG_CHECK_LAYOUTS=1`` (or :func:`deep_fp8_gemm.check_contiguous_layout`); blocks made
only of padding rows are skipped (their D and sD rows untouched), padding rows sharing a block with valid rows are
computed and quantised with the block's expert (D and sD), on every backend. Same layers as :mod:`.contiguous`.
"""

from __future__ import annotations

import torch

from .._core.checks import Problem, check_bool, layout_values_checked
from .._core.dispatch import eager, normalise_scales
from .._core.family import GemmFamily, register_op
from ..config import GemmConfig, get_config
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from ..utils import get_m_alignment_for_contiguous_layout
from .contiguous import check_contiguous_values
from .fp8_output import check_contiguous, out_operands, reference_contiguous

KIND = "contiguous_fp8out"


def check(a, sa, b, sb, d, sd, m_indices, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[m_sum, k]``, sA, B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``, D ``[m_sum, n]`` e4m3, sD ``[m_sum,
    ceil(n/128)]`` M-major, m_indices ``[m_sum]`` int32 (values not read); ``m_sum`` a multiple of the contiguous
    alignment (``layout``)."""
    return check_contiguous(a, sa, b, sb, d, sd, m_indices, False, layout, pointers)


def reference_validated(a, sa, b, sb, d, sd, m_indices, use_ue8m0: bool = False) -> None:
    """The reference on checked tensors (reads ``m_indices`` on the host): the rows the kernels compute, each expert's
    own rows and the padding rows of its blocks (``ops.fp8_output.reference_contiguous``); padding-only blocks
    untouched."""
    reference_contiguous(a, sa, b, sb, d, sd, m_indices, use_ue8m0)


def reference(lhs, rhs, out, m_indices, use_ue8m0: bool = False) -> None:
    """Reference of :func:`m_grouped_gemm_fp8_fp8_fp8_nt_contiguous`: per expert, the float32 GEMM of its rows (and of
    the padding rows of its blocks) quantised per row and 128 columns."""
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (m_indices, "m_indices"))
    check(a, sa, b, sb, d, sd, m_indices, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, d, sd, m_indices, check_bool(use_ue8m0, "use_ue8m0"))


def plan(a, b, expected_m, num_sms: int, use_ue8m0: bool = False) -> GemmConfig:
    """The config: the heuristic for ``m_sum`` rows over ``G`` experts, BLOCK_M = the contiguous alignment."""
    return get_config(a.shape[0], b.shape[-2], b.shape[-1], b.shape[0], KIND, num_sms,
                      contiguous_alignment=get_m_alignment_for_contiguous_layout(), ue8m0=use_ue8m0)


def dispatch(a, sa, b, sb, d, sd, m_indices, expected_m=None, use_ue8m0: bool = False) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, d, sd, m_indices, use_ue8m0)
        return
    cfg = plan(a, b, None, gemm_host.num_sms_for(backend), use_ue8m0)
    gemm_host.launch_fp8_output(cfg, a, normalise_scales(sa), b, sb.contiguous(), d, sd, m_indices.contiguous(),
                                backend)


def impl(a, sa, b, sb, d, sd, m_indices, use_ue8m0: bool = False) -> None:
    """Check (the layout's values too on CPU tensors, and on CUDA with ``DFG_CHECK_LAYOUTS=1``: the rule of
    :mod:`.contiguous`) and dispatch (the custom op's kernel for CPU and CUDA)."""
    problem = check(a, sa, b, sb, d, sd, m_indices)
    if layout_values_checked(a.device):
        check_contiguous_values(m_indices, problem.m, problem.groups)
    if not problem.empty:
        FAMILY.dispatch(a, sa, b, sb, d, sd, m_indices, None, use_ue8m0)


def _fake(a, sa, b, sb, d, sd, m_indices, use_ue8m0: bool = False) -> None:
    check(a, sa, b, sb, d, sd, m_indices, pointers=False)


OP = register_op("m_grouped_gemm_fp8_fp8_fp8_nt_contiguous",
                 "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor(b!) sd, Tensor m_indices, "
                 "bool use_ue8m0=False) -> ()", impl, _fake)


def m_grouped_gemm_fp8_fp8_fp8_nt_contiguous(lhs: tuple[torch.Tensor, torch.Tensor],
                                             rhs: tuple[torch.Tensor, torch.Tensor],
                                             out: tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor,
                                             use_ue8m0: bool = False) -> None:
    """Grouped GEMM over experts whose rows are concatenated, FP8 output.

    ``out[r] = per_token_cast_to_fp8(dequant(A[r]) · dequant(B[m_indices[r]])ᵀ)`` for every row with
    ``m_indices[r] >= 0``; a padding row (-1) is computed with its block's expert when the block has valid rows, left
    untouched in a block of padding only (every backend alike).

    Args:
        lhs, rhs, m_indices: as :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (the same layout rule,
            checked as there: CPU tensors on every call, CUDA tensors with ``DFG_CHECK_LAYOUTS=1``).
        out: ``(D, sD)``: D ``[m_sum, n]`` float8_e4m3fn row-major (``n % 16 == 0``), sD ``[m_sum, ceil(n/128)]``
            float32 M-major TMA-aligned (``deep_fp8_gemm.utils.empty_m_major``), as :func:`deep_fp8_gemm.
            gemm_fp8_fp8_fp8_nt`.
        use_ue8m0: power-of-two scales.
    """
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (m_indices, "m_indices"))
    check_bool(use_ue8m0, "use_ue8m0")
    (impl if eager(a, sa, b, sb, d, sd, m_indices) else OP)(a, sa, b, sb, d, sd, m_indices, use_ue8m0)


FAMILY = GemmFamily(kind=KIND, public=m_grouped_gemm_fp8_fp8_fp8_nt_contiguous, check=check, reference=reference,
                    dispatch=dispatch, plan=plan, op=OP)
