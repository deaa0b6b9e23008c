"""The prefix-sum contiguous FP8-output GEMM family (kind ``"psum_fp8out"``):
``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum``.

:func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum` (``grouped_layout[g]`` = the end row of group g,
group starts rounded up to the contiguous alignment) with the output of :func:`deep_fp8_gemm.gemm_fp8_fp8_fp8_nt`: D
e4m3 ``[m_sum, n]`` with 1x128 scales (``ops.fp8_output``). The contract is :mod:`.psum`'s: group starts at
multiples of the contiguous alignment (64 or 128, BLOCK_M, compiled into the kernel), the ends checked on every call
of CPU tensors and on CUDA only with ``DFG_CHECK_LAYOUTS=1`` (or :func:`deep_fp8_gemm.check_psum_layout`), the
padding rows of a group's last block computed with the group (D and sD), the other padding rows untouched, on every
backend. Same layers as :mod:`.psum`.
"""

from __future__ import annotations

import torch

from .._core.checks import (INDEX_DTYPE, Problem, check_bool, check_expected_m, check_same_device, check_tensor,
                            layout_values_checked)
from .._core.dispatch import eager, normalise_scales
from .._core.family import GemmFamily, register_op
from ..config import GemmConfig, get_config
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from ..utils import get_m_alignment_for_contiguous_layout
from .fp8_output import (check_layout_and_pointers, check_operands_2d, check_out, out_operands,
                         reference_row_ranges)
from .psum import check_psum_layout_values, check_psum_values, psum_computed_rows

KIND = "psum_fp8out"


def check(a, sa, b, sb, d, sd, grouped_layout, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[m_sum, k]``, sA, B ``[G, n, k]``, sB, D ``[m_sum, n]`` e4m3, sD ``[m_sum, ceil(n/128)]`` M-major,
    grouped_layout ``[G]`` int32 (values not read)."""
    m_sum, n, k, groups = check_operands_2d(a, sa, b, sb, True, "m_sum")
    check_out((d, sd), (), m_sum, n, a.device, "m_sum")
    check_tensor(grouped_layout, "grouped_layout", INDEX_DTYPE, 1)
    if grouped_layout.shape[0] != groups:
        raise ValueError(f"grouped_layout (psum layout: one end row per group) must have G={groups} entries (G = "
                         f"rhs[0].shape[0]), got grouped_layout.shape={tuple(grouped_layout.shape)}")
    check_same_device(a.device, ((grouped_layout, "grouped_layout"),))
    check_layout_and_pointers(a, sa, b, sb, d, sd, n, k, ((grouped_layout, "grouped_layout"),), layout, pointers)
    return Problem(m_sum, n, k, groups)


def reference_validated(a, sa, b, sb, d, sd, grouped_layout, use_ue8m0: bool = False) -> None:
    """The reference on checked tensors whose ends passed :func:`.psum.check_psum_values`: the rows the kernel computes
    with each group (:func:`.psum.psum_computed_rows`), its rows in one matmul and the padding rows of its last block
    (D and sD, as Fp8TmaStore stores every row of a tile) in another, so that a row's result does not depend on its
    group's padding (as :mod:`.contiguous_fp8out`); the other padding rows untouched."""
    parts = []
    for g, start, end, stop in psum_computed_rows(grouped_layout.tolist(), a.size(0)):
        parts += [(g, start, end), (g, end, stop)]
    reference_row_ranges(a, sa, b, sb, d, sd, parts, use_ue8m0)


def reference(lhs, rhs, out, grouped_layout, expected_m: int | None = None, use_ue8m0: bool = False) -> None:
    """Reference of :func:`m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum` (reads and checks the ends)."""
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (grouped_layout, "grouped_layout"))
    check(a, sa, b, sb, d, sd, grouped_layout, layout=False, pointers=False)
    if expected_m is not None:
        check_expected_m(expected_m)
    check_psum_values(grouped_layout.tolist(), a.size(0))
    reference_validated(a, sa, b, sb, d, sd, grouped_layout, check_bool(use_ue8m0, "use_ue8m0"))


def plan(a, b, expected_m: int | None, num_sms: int, use_ue8m0: bool = False) -> GemmConfig:
    """The config: for ``expected_m`` rows per group when given, else for all ``m_sum`` rows, BLOCK_M = the contiguous
    alignment (as :mod:`.psum`)."""
    num_groups = b.shape[0]
    m_sum = a.shape[0] if expected_m is None else min(a.shape[0], int(expected_m) * num_groups)
    return get_config(max(m_sum, 1), b.shape[-2], b.shape[-1], num_groups, KIND, num_sms,
                      contiguous_alignment=get_m_alignment_for_contiguous_layout(), ue8m0=use_ue8m0)


def dispatch(a, sa, b, sb, d, sd, grouped_layout, expected_m=None, use_ue8m0: bool = False) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, d, sd, grouped_layout, use_ue8m0)
        return
    cfg = plan(a, b, expected_m, gemm_host.num_sms_for(backend), use_ue8m0)
    gemm_host.launch_fp8_output(cfg, a, normalise_scales(sa), b, sb.contiguous(), d, sd,
                                grouped_layout.contiguous(), backend)


def impl(a, sa, b, sb, d, sd, grouped_layout, expected_m=None, use_ue8m0: bool = False) -> None:
    """Check (the ends too on CPU tensors, and on CUDA with ``DFG_CHECK_LAYOUTS=1``, as :mod:`.psum`) and dispatch
    (the custom op's kernel for CPU and CUDA)."""
    problem = check(a, sa, b, sb, d, sd, grouped_layout)
    if expected_m is not None:
        check_expected_m(expected_m)
    if layout_values_checked(a.device):
        check_psum_layout_values(grouped_layout, problem.m)
    if not problem.empty:
        FAMILY.dispatch(a, sa, b, sb, d, sd, grouped_layout, expected_m, use_ue8m0)


def _fake(a, sa, b, sb, d, sd, grouped_layout, expected_m=None, use_ue8m0: bool = False) -> None:
    check(a, sa, b, sb, d, sd, grouped_layout, pointers=False)


OP = register_op("m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum",
                 "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor(b!) sd, Tensor grouped_layout, "
                 "int? expected_m=None, bool use_ue8m0=False) -> ()", impl, _fake)


def m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum(lhs: tuple[torch.Tensor, torch.Tensor],
                                                  rhs: tuple[torch.Tensor, torch.Tensor],
                                                  out: tuple[torch.Tensor, torch.Tensor], grouped_layout: torch.Tensor,
                                                  expected_m: int | None = None, use_ue8m0: bool = False) -> None:
    """Grouped GEMM over expert rows given by group ends (the psum layout), FP8 output.

    Args:
        lhs, rhs, grouped_layout, expected_m: as :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`.
        out: ``(D, sD)``: D ``[m_sum, n]`` float8_e4m3fn, sD ``[m_sum, ceil(n/128)]`` float32 M-major TMA-aligned, as
            :func:`deep_fp8_gemm.gemm_fp8_fp8_fp8_nt`; the padding rows after a group's end up to the end of its last
            BLOCK_M-row block (BLOCK_M = the contiguous alignment) are computed with the group, other padding rows
            are left untouched (every backend alike).
        use_ue8m0: power-of-two scales.
    """
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out, (grouped_layout, "grouped_layout"))
    check_bool(use_ue8m0, "use_ue8m0")
    (impl if eager(a, sa, b, sb, d, sd, grouped_layout) else OP)(a, sa, b, sb, d, sd, grouped_layout, expected_m,
                                                                  use_ue8m0)


FAMILY = GemmFamily(kind=KIND, public=m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum, check=check,
                    reference=reference, dispatch=dispatch, plan=plan, op=OP)
