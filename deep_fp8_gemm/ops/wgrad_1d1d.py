"""The 1D1D GEMM family (kind ``"1d1d"``): fp32 ``D = C + A·Bᵀ`` with per-row scales on both operands, the
weight gradients of DeepSeek-V3's FP8 training recipe (``gemm_fp8_fp8_fp32_nt_1d1d``).

* A ``[m, k]`` and B ``[n, k]`` are float8_e4m3fn, K-major (row-major, 16-byte row strides);
* sA ``[m, ceil(k/128)]`` and sB ``[n, ceil(k/128)]`` are float32 1x128 per-row scales of A and B (any strides:
  both are converted to the M-major TMA-aligned layout of ``get_col_major_tma_aligned_tensor`` before launch);
* ``d`` ``[m, n]`` float32, row-major with a 16-byte-multiple row stride (so column pairs are 8-byte aligned);
  ``c`` ``[m, n]`` float32 of the same layout, or ``d`` itself (in-place accumulation into a main-grad buffer), or
  None (``D = A·Bᵀ``). A ``c`` distinct from ``d`` must not overlap it; the kernel never reads ``d`` then.

Dispatch as the other families (``runtime.target.backend_of(device, "gemm")``): CPU tensors run the float64
reference (or, with ``DFG_SIMULATE=1``, the kernel in the CPU simulator); CUDA tensors need sm_90 and run the JIT
kernel (kind ``"1d1d"`` of ``kernels/fp8_gemm.cuh`` with the policies of ``policy_1d1d.cuh``). The custom op is
``torch.ops.deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d(a, sa, b, sb, d, c, accumulate)`` (``c=d`` becomes
``accumulate=True`` with no ``c``: a mutated argument must not alias another input).

Host time (issue 45): an eager call looks up a plan for its tensors' signature (:mod:`.wgrad_plans`, the design of
``_core.plans``): the checks, the config, the loaded kernel and the constant parameters are computed once per
signature; a call checks its data pointers and launches (``bench.bench_host``'s ``wgrad_1d1d`` row).
"""

from __future__ import annotations

import torch

from .._core.checks import (FP8, Problem, check_aligned_ptr, check_c_layout, check_divisibility, check_fp32_c,
                            check_fp32_out, check_no_overlap, check_not_self_overlapping, check_row_major_tma,
                            check_same_device, check_shape, check_tensor, is_meta, unpack_pair)
from .._core.dispatch import accumulates_in_place, accumulator, eager, normalise_scales, operands
from .._core.family import GemmFamily, register_op
from .._core.plans import register_cache
from .._core.reference_math import gemm_nt_row_scaled_f64
from ..config import GemmConfig, get_config
from ..constants import GRAN_K
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from ..utils import ceil_div
from .wgrad_plans import Wgrad1d1dPlan, plan_entry


def check(a, sa, b, sb, d, c, *, layout: bool = True, pointers: bool = True) -> Problem:
    """Types, shapes and devices (and, with ``layout``, the kernel's stride rules; with ``pointers``, alignment and
    overlap) of the 1D1D GEMM; returns ``Problem(m, n, k)``. Errors name the argument and its value."""
    check_tensor(a, "lhs[0] (A)", FP8, 2)
    check_tensor(b, "rhs[0] (B)", FP8, 2)
    m, k = a.shape
    n = b.shape[0]
    if k <= 0:
        raise ValueError(f"k must be positive, got lhs[0] (A).shape={tuple(a.shape)}")
    check_shape(b, "rhs[0] (B)", (n, k), "[n, k]")
    kb = ceil_div(k, GRAN_K)
    check_tensor(sa, "lhs[1] (sA)", torch.float32, 2)
    check_shape(sa, "lhs[1] (sA)", (m, kb), "[m, ceil(k/128)]")
    check_tensor(sb, "rhs[1] (sB)", torch.float32, 2)
    check_shape(sb, "rhs[1] (sB)", (n, kb), "[n, ceil(k/128)] (1x128 per-row scales of B, recipe (1, 1, 128))")
    check_fp32_out(d, "the 1D1D kernel")
    check_shape(d, "d", (m, n), "[m, n]")
    check_fp32_c(c, d, "[m, n]")
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (d, "d"))
                      + (() if c is None else ((c, "c"),)))
    if layout:
        check_divisibility(n, k)
        check_row_major_tma(a, "lhs[0] (A)")
        check_row_major_tma(b, "rhs[0] (B)")
        check_row_major_tma(d, "d")
        check_not_self_overlapping(d, "d")
        if c is not None:
            check_row_major_tma(c, "c")
            check_not_self_overlapping(c, "c")
    if pointers and not is_meta(a):  # meta tensors: no pointers (the shape-only path)
        check_aligned_ptr(a, "lhs[0] (A)")
        check_aligned_ptr(b, "rhs[0] (B)")
        check_aligned_ptr(d, "d")
        check_no_overlap(d, ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")), "d")
        check_c_layout(c, d, lambda t: check_row_major_tma(t, "c"))
    return Problem(m, n, k)


def reference_validated(a, sa, b, sb, d, c) -> None:
    """The reference on checked tensors: dequantised, multiplied and summed in float64, ``c`` added in float64
    (``c`` may be ``d`` or None), rounded once to float32 into ``d``."""
    prod = gemm_nt_row_scaled_f64(a, sa, b, sb)
    if c is not None:
        prod += c.double()
    d.copy_(prod)


def reference(lhs, rhs, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """Reference of :func:`gemm_fp8_fp8_fp32_nt_1d1d`: ``d = c + A·Bᵀ`` in float32 for A ``[m, k]`` / B ``[n, k]``
    e4m3 with 1x128 scales sA ``[m, ceil(k/128)]`` / sB ``[n, ceil(k/128)]`` (both dequantised per row), ``d`` /
    ``c`` ``[m, n]`` float32; ``c`` may be ``d`` (accumulate in place) or None (``d = A·Bᵀ``). Operands dequantised
    and multiplied in float64, summed in float64, added to ``c`` in float64, rounded once to float32 (the kernel's
    fp32 accumulation differs from it by fp32 rounding only)."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check(a, sa, b, sb, d, c, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, d, c)


def plan(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """The config: the heuristic for ``m x n`` outputs over ``k``."""
    return get_config(m, n, k, 1, "1d1d", num_sms)


def dispatch(a, sa, b, sb, d, c) -> None:
    """Run a checked, non-empty call on its backend (``c`` may be ``d`` or None)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, d, c)
        return
    run(a, normalise_scales(sa), b, normalise_scales(sb), d, accumulator(c, d), backend)


def run(a, sa, b, sb, d, c, backend: Backend) -> None:
    """Pick the config for ``(m, n, k)`` and launch the kernel (checked tensors, M-major TMA-aligned scales, ``c``
    the C the kernel reads: ``d`` itself or a separate tensor)."""
    cfg = plan(a.shape[0], b.shape[0], a.shape[1], gemm_host.num_sms_for(backend))
    gemm_host.launch_1d1d(cfg, a, sa, b, sb, d, c, backend)


def impl(a, sa, b, sb, d, c) -> None:
    """Check, then dispatch (``c`` may be ``d`` or None; meta tensors: checked, nothing run)."""
    if not check(a, sa, b, sb, d, c).empty and not is_meta(d):
        FAMILY.dispatch(a, sa, b, sb, d, c)


def _op_impl(a, sa, b, sb, d, c, accumulate) -> None:
    if accumulate and c is not None:
        raise ValueError("accumulate=True takes c=None (d is C)")
    impl(a, sa, b, sb, d, d if accumulate else c)


def _op_fake(a, sa, b, sb, d, c, accumulate) -> None:
    check(a, sa, b, sb, d, c, pointers=False)  # strides at trace time, as the other families' fakes


OP = register_op("gemm_fp8_fp8_fp32_nt_1d1d", "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor? c, "
                 "bool accumulate) -> ()", _op_impl, _op_fake)


def _unplanned(a, sa, b, sb, d, c) -> None:
    """:func:`gemm_fp8_fp8_fp32_nt_1d1d` without a plan, after the pairs are unpacked."""
    accumulate = accumulates_in_place(c, d)
    if accumulate:
        c = None
    tensors = [t for t in (a, sa, b, sb, d, c) if isinstance(t, torch.Tensor)]
    if eager(*tensors):
        impl(a, sa, b, sb, d, d if accumulate else c)
        return
    operands((a, sa), (b, sb), d, out_name="d")
    OP(a, sa, b, sb, d, c, bool(accumulate))


def _make_plan(a, sa, b, sb, d, c) -> Wgrad1d1dPlan:
    """The plan of a new signature, after the op's checks (its errors, its order): ``c`` is checked as the op takes it
    (``d`` when it aliases ``d``: such a plan runs the op's path, as the op decides per call)."""
    as_given = c is None or c is d or not accumulates_in_place(c, d)
    problem = check(a, sa, b, sb, d, c if as_given else d)
    return Wgrad1d1dPlan(_unplanned, plan, a, sa, b, sb, d, c, problem.empty, as_given)


#: The eager entry (``wgrad_plans.plan_entry``): ``ENTRY(a, sa, b, sb, d, c)``; ``ENTRY.hit`` for ``compat``.
ENTRY = plan_entry(_make_plan, _unplanned)


def gemm_fp8_fp8_fp32_nt_1d1d(lhs, rhs, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """``d = c + (A·sA)·(B·sB)ᵀ`` in float32 (see the module docstring for shapes and layouts).

    Runs as the custom op ``torch.ops.deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d`` when torch is tracing or a
    dispatch mode is active (so ``torch.compile(fullgraph=True)`` traces it), directly otherwise. ``c=d`` becomes
    the op's ``accumulate=True`` with no ``c`` (a mutated argument must not alias another input)."""
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    ENTRY(a, sa, b, sb, d, c)


def clear_plans() -> None:
    """Forget every 1D1D plan (tests; a loaded kernel stays loaded)."""
    ENTRY.plans.clear()
    for index in ENTRY.indexes:
        index.clear()


def plan_stats() -> dict[str, tuple[int, int]]:
    """``{"1d1d": (plans, weights indexed)}``: what tests and benchmarks inspect."""
    return {"1d1d": (len(ENTRY.plans), sum(len(i) for i in ENTRY.indexes))}


def plans_of() -> list[Wgrad1d1dPlan]:
    """The 1D1D plans (tests: a pointer-only change must reuse one)."""
    return list(ENTRY.plans.values())


FAMILY = GemmFamily(kind="1d1d", public=gemm_fp8_fp8_fp32_nt_1d1d, check=check, reference=reference, dispatch=dispatch,
                    plan=plan, op=OP)
register_cache("wgrad.", clear_plans, plan_stats)  # _core.plans.clear() / stats() cover the 1D1D plans too
