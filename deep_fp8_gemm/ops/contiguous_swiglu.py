"""The contiguous SwiGLU up-projection family (kind ``"contiguous_swiglu"``):
``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu``.

The MoE expert's first half in one kernel: ``h = SiLU(x W1ᵀ) * (x W3ᵀ)`` quantised to e4m3 with 1x128 scales, from
the fp32 accumulators in the epilogue, on the contiguous layout of
:func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` — instead of that GEMM's bf16 ``[m_sum, 2I]`` output
and :func:`deep_fp8_gemm.silu_mul_quant` reading it back. B is the experts' ``w13`` in the interleaved layout of
:func:`deep_fp8_gemm.ops.fp8_output.interleave_swiglu_weights` (gate and up 128-row blocks alternating; derived once
when a layer loads its weights), so that a 256-column tile holds the gate and up columns of one 128-column output
group (include/deep_fp8_gemm/policy_swiglu.cuh). Legal for ``I % 128 == 0``. The layout's contract is the bf16
family's (:mod:`.contiguous`: BLOCK_M = the contiguous alignment, the block rule checked on CPU tensors every call,
on CUDA with ``DFG_CHECK_LAYOUTS=1``; padding rows of a block with valid rows computed with its expert, on every
backend). Same layers as :mod:`.contiguous`.
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

KIND = "contiguous_swiglu"


def check(a, sa, b, sb, d, sd, m_indices, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[m_sum, H]``, sA, B ``[G, 2I, H]`` (interleaved, ``I % 128 == 0``), sB ``[G, 2I/128, ceil(H/128)]``, D
    ``[m_sum, I]`` e4m3, sD ``[m_sum, I/128]`` M-major, m_indices ``[m_sum]`` int32 (values not read); ``m_sum`` a
    multiple of the contiguous alignment (``layout``). Returns ``Problem(m_sum, 2I, H,
    G)``."""
    return check_contiguous(a, sa, b, sb, d, sd, m_indices, True, layout, pointers)


def reference_validated(a, sa, b, sb, d, sd, m_indices, use_ue8m0: bool = False) -> None:
    """The reference on checked tensors: per expert, the float32 GEMM, SiLU(gate) * up, quantised, over the rows the
    kernels compute (its own rows, then the padding rows of its blocks: ``ops.fp8_output.reference_contiguous``)."""
    reference_contiguous(a, sa, b, sb, d, sd, m_indices, use_ue8m0, swiglu=True)


def reference(lhs, rhs, out, m_indices, use_ue8m0: bool = False) -> None:
    """Reference of :func:`m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu` (padding-only blocks untouched)."""
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (m_indices, "m_indices"))
    check(a, sa, b, sb, d, sd, m_indices, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, d, sd, m_indices, check_bool(use_ue8m0, "use_ue8m0"))


def plan(a, b, expected_m, num_sms: int, use_ue8m0: bool = False) -> GemmConfig:
    """The config: the heuristic for ``m_sum`` rows over ``G`` experts, ``n = 2I``, BLOCK_M = the contiguous
    alignment."""
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


OP = register_op("m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu",
                 "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor(b!) sd, Tensor m_indices, "
                 "bool use_ue8m0=False) -> ()", impl, _fake)


def m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu(lhs: tuple[torch.Tensor, torch.Tensor],
                                                    rhs: tuple[torch.Tensor, torch.Tensor],
                                                    out: tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor,
                                                    use_ue8m0: bool = False) -> None:
    """The SwiGLU up-projection of the experts' rows: ``out[r] = per_token_cast_to_fp8(SiLU(g) * u)`` with
    ``[g | u] = dequant(A[r]) · dequant(W13[m_indices[r]])ᵀ`` in fp32, for every row with ``m_indices[r] >= 0``; a
    padding row (-1) is computed with its block's expert when the block has valid rows, left untouched in a block of
    padding only (every backend alike).

    Args:
        lhs, m_indices: as :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (A ``[m_sum, H]``; the same
            layout rule, checked as there).
        rhs: ``(W, sW)`` = :func:`deep_fp8_gemm.ops.fp8_output.interleave_swiglu_weights` of the experts' ``(w13,
            w13_scale)``: W ``[G, 2I, H]`` e4m3 (gate / up 128-row blocks alternating), sW ``[G, 2I/128, ceil(H/128)]``;
            ``I % 128 == 0``.
        out: ``(D, sD)``: D ``[m_sum, I]`` float8_e4m3fn row-major, sD ``[m_sum, I/128]`` float32 M-major TMA-aligned
            (``deep_fp8_gemm.utils.empty_m_major``): the ``lhs`` of the down projection, as ``silu_mul_quant``
            returns it.
        use_ue8m0: power-of-two scales.

    Numerics: ``silu_mul_quant``'s (``SiLU(x) = x / (1 + e^-x)``, the product and the 1x128 quantisation in fp32)
    applied to the fp32 GEMM result instead of its bf16 rounding.
    """
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (m_indices, "m_indices"))
    check_bool(use_ue8m0, "use_ue8m0")
    (impl if eager(a, sa, b, sb, d, sd, m_indices) else OP)(a, sa, b, sb, d, sd, m_indices, use_ue8m0)


FAMILY = GemmFamily(kind=KIND, public=m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu, check=check,
                    reference=reference, dispatch=dispatch, plan=plan, op=OP)
