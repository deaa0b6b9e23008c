"""The masked SwiGLU up-projection family (kind ``"masked_swiglu"``): ``m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu``.

:mod:`.contiguous_swiglu` on the masked layout of :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked` (MoE
decode: ``[G, m_max, H]`` per-expert buffers, ``masked_m`` read on the device only, CUDA-graph safe). B is the
interleaved ``w13`` (:func:`deep_fp8_gemm.ops.fp8_output.interleave_swiglu_weights`), D ``[G, m_max, I]`` e4m3 with
scales ``[G, m_max, I/128]``. The counts are checked as :mod:`.masked` checks them (CPU tensors on every call, the
simulator's included; CUDA only with ``DFG_CHECK_LAYOUTS=1``). Same layers as :mod:`.masked`.
"""

from __future__ import annotations

import torch

from .._core.checks import Problem, check_bool, check_expected_m, layout_values_checked
from .._core.dispatch import eager, normalise_scales
from .._core.family import GemmFamily, register_op
from ..config import GemmConfig, get_config
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from .fp8_output import check_masked, out_operands, reference_masked
from .masked import check_masked_values

KIND = "masked_swiglu"


def check(a, sa, b, sb, d, sd, masked_m, expected_m, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[G, m_max, H]``, sA, B ``[G, 2I, H]`` (interleaved, ``I % 128 == 0``), sB, D ``[G, m_max, I]`` e4m3, sD
    ``[G, m_max, I/128]`` M-major, masked_m ``[G]`` int32, expected_m a positive int."""
    return check_masked(a, sa, b, sb, d, sd, masked_m, expected_m, True, layout, pointers)


def reference_validated(a, sa, b, sb, d, sd, masked_m, use_ue8m0: bool = False) -> None:
    """The reference on checked tensors (reads ``masked_m`` on the host; the other rows untouched)."""
    reference_masked(a, sa, b, sb, d, sd, masked_m, use_ue8m0, swiglu=True)


def reference(lhs, rhs, out, masked_m, expected_m, use_ue8m0: bool = False) -> None:
    """Reference of :func:`m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu`."""
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (masked_m, "masked_m"))
    check(a, sa, b, sb, d, sd, masked_m, expected_m, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, d, sd, masked_m, check_bool(use_ue8m0, "use_ue8m0"))


def plan(a, b, expected_m: int, num_sms: int, use_ue8m0: bool = False) -> GemmConfig:
    """The config: the heuristic for ``expected_m`` rows per group, ``n = 2I``."""
    return get_config(int(expected_m), b.shape[-2], b.shape[-1], b.shape[0], KIND, num_sms, ue8m0=use_ue8m0)


def dispatch(a, sa, b, sb, d, sd, masked_m, expected_m, use_ue8m0: bool = False) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, d, sd, masked_m, use_ue8m0)
        return
    cfg = plan(a, b, expected_m, gemm_host.num_sms_for(backend), use_ue8m0)
    gemm_host.launch_fp8_output(cfg, a, normalise_scales(sa), b, sb.contiguous(), d, sd, masked_m.contiguous(),
                                backend)


def impl(a, sa, b, sb, d, sd, masked_m, expected_m, use_ue8m0: bool = False) -> None:
    """Check (the counts too on CPU tensors, the simulator's included, and on CUDA with ``DFG_CHECK_LAYOUTS=1``) and
    dispatch (the custom op's kernel for CPU and CUDA)."""
    problem = check(a, sa, b, sb, d, sd, masked_m, expected_m)
    if layout_values_checked(a.device):
        check_masked_values(masked_m, problem.m)
    if not problem.empty:
        FAMILY.dispatch(a, sa, b, sb, d, sd, masked_m, expected_m, use_ue8m0)


def _fake(a, sa, b, sb, d, sd, masked_m, expected_m, use_ue8m0: bool = False) -> None:
    check(a, sa, b, sb, d, sd, masked_m, expected_m, pointers=False)


OP = register_op("m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu",
                 "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor(b!) sd, Tensor masked_m, "
                 "int expected_m, bool use_ue8m0=False) -> ()", impl, _fake)


def m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu(lhs: tuple[torch.Tensor, torch.Tensor],
                                                rhs: tuple[torch.Tensor, torch.Tensor],
                                                out: tuple[torch.Tensor, torch.Tensor], masked_m: torch.Tensor,
                                                expected_m: int, use_ue8m0: bool = False) -> None:
    """The SwiGLU up-projection on per-expert buffers: ``out[g, r] = per_token_cast_to_fp8(SiLU(gate) * up)`` of
    ``dequant(A[g, r]) · dequant(W13[g])ᵀ`` in fp32, for ``r < masked_m[g]``.

    Args:
        lhs, masked_m, expected_m: as :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked`.
        rhs: the interleaved ``(W, sW)`` of :func:`m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu`.
        out: ``(D, sD)``: D ``[G, m_max, I]`` float8_e4m3fn, sD ``[G, m_max, I/128]`` float32 M-major TMA-aligned per
            group; rows ``>= masked_m[g]`` unspecified.
        use_ue8m0: power-of-two scales.
    """
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (masked_m, "masked_m"))
    check_expected_m(expected_m)
    check_bool(use_ue8m0, "use_ue8m0")
    (impl if eager(a, sa, b, sb, d, sd, masked_m) else OP)(a, sa, b, sb, d, sd, masked_m, expected_m, use_ue8m0)


FAMILY = GemmFamily(kind=KIND, public=m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu, check=check, reference=reference,
                    dispatch=dispatch, plan=plan, op=OP)
