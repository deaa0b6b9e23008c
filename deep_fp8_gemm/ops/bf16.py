"""The BF16 GEMMs (issue 41): the reference design's SM90 names, arguments and refusals (DeepGEMM 2.6.1,
``csrc/apis/gemm.hpp``), on the BF16 kernel (``kernels/bf16_gemm.cuh``: wgmma ``.bf16``, fp32 accumulate over the
whole K, no promotion, no scales).

==========================================  ==================  ===================  =====================
name                                        ``a``               ``b``                ``d``
==========================================  ==================  ===================  =====================
``bf16_gemm_nt(a, b, d, c=None)``            ``[m, k]``          ``[n, k]``           ``[m, n]`` bf16 / fp32
``bf16_gemm_nn``                             ``[m, k]``          ``[k, n]``           as nt
``bf16_gemm_tn``                             ``[k, m]``          ``[k, n]``           as nt
``bf16_gemm_tt``                             ``[k, m]``          ``[n, k]``           as nt
``m_grouped_bf16_gemm_nt_contiguous``        ``[m_sum, k]``      ``[G, n, k]``        ``[m_sum, n]`` bf16
``m_grouped_bf16_gemm_nn_contiguous``        ``[m_sum, k]``      ``[G, k, n]``        ``[m_sum, n]`` bf16
``m_grouped_bf16_gemm_nt_masked``            ``[G, m_max, k]``   ``[G, n, k]``        ``[G, m_max, n]`` bf16
==========================================  ==================  ===================  =====================

Every name computes ``D = C + A·Bᵀ`` (``C`` absent: 0) in the NT form, A and B the views the table gives, into ``d``
in place. The dense names take ``c`` (``d``'s dtype and shape; ``c`` may be ``d``); the grouped ones write bf16 and
take none. The grouped layouts are the FP8 families' (``ops.contiguous``: ``grouped_layout`` int32 per row, -1 for
padding, a padding row computed with its BLOCK_M block's group; ``use_psum_layout=True``: one end row per group,
``ops.psum``; ``ops.masked``: rows ``< masked_m[g]`` of each group, the rest untouched).

Backends (``runtime.target``): an sm_90 GPU runs the kernel; CPU tensors run the exact reference (every output the
float64 sum ``c + Σ_k a·b`` of bf16 products, which are exact in float64, rounded once to ``d``'s dtype; rows in fixed
blocks so that a row's bits never depend on the batch: :func:`.._core.bf16_math.matmul_f64`), or the kernel in the
simulator under ``DFG_SIMULATE=1``. Operands whose strides a TMA map cannot describe are copied first on the kernel
backends (what the CPU path accepts, the kernels compute). The reference's SM90 refusals hold on every backend:
``k % 64`` for the grouped names, K-major ``a`` for the contiguous one, K-major ``a`` and ``b`` for the masked one.

Host time (issue 45): an eager call looks up a plan for its tensors' signature (:class:`Bf16Plan`, the FP8 families'
design of ``_core.plans``): the checks, the config, the loaded kernel and the constant parameters are computed once
per signature; a call checks its data pointers and launches (``bench.bench_host``'s ``bf16_*`` rows). The psum layout
(``use_psum_layout=True``: its per-row groups are computed on every call) takes the general path.
"""

from __future__ import annotations

import torch

from .._core import bf16_math, plans
from .._core.checks import (INDEX_DTYPE, check_expected_m, check_no_overlap, check_not_self_overlapping,
                            check_same_device, check_shape, check_tensor, is_meta)
from ..kernels import launching
from ..runtime import target
from ..utils import get_m_alignment_for_contiguous_layout
from ..runtime.target import Backend, layout_values_checked
from . import contiguous as contiguous_layout
from .bf16_plans import Bf16Plan, major_of, plan_entry, tma_strides_ok
from . import masked as masked_layout
from . import psum as psum_layout

__all__ = ["bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt", "m_grouped_bf16_gemm_nt_contiguous",
           "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked"]

#: The grouped BF16 kernels' K rule on SM90 (``sm90_bf16_gemm.hpp``: ``k % 64 == 0``): whole 64-element K blocks.
GROUPED_K_ALIGN = 64


def kernel_module():
    """:mod:`deep_fp8_gemm.kernels.bf16_gemm` (the JIT layer), imported on first kernel use."""
    from ..kernels import bf16_gemm  # the JIT layer loads on first kernel use, not at import
    return bf16_gemm


def _check_output(d: torch.Tensor, inputs: tuple[tuple[torch.Tensor, str], ...]) -> None:
    """``d`` has distinct elements and shares no byte with the inputs (the contracts of docs/contracts.md)."""
    check_not_self_overlapping(d, "d")
    if not is_meta(d):
        check_no_overlap(d, inputs, "d")


def tma_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when a TMA map can read it (:func:`tma_strides_ok` and a 16-byte aligned address), else a
    K-major copy whose rows are padded to a 16-byte multiple (the map's K extent stays ``k``: the padding is never
    read), so any shape the CPU path accepts runs."""
    if t.data_ptr() % 16 == 0 and tma_strides_ok(t):
        return t
    size = t.element_size()
    k = t.shape[-1]
    padded = -(-max(k, 1) * size // 16) * 16 // size
    buffer = torch.zeros(*t.shape[:-1], padded, dtype=t.dtype, device=t.device)
    buffer[..., :k] = t
    return buffer[..., :k]


# ------------------------------------------------------------------------------------------------- dense
def _dense_checks(layout: str, a, b, d, c) -> tuple[torch.Tensor, torch.Tensor, int, int, int]:
    """Every check of ``bf16_gemm_<layout>`` in its order (the pointer-dependent ones last): ``(A, B, m, n, k)``."""
    A, B, m, n, k = bf16_math.bf16_gemm_operands(layout, a, b, d, c)
    _check_output(d, ((a, "a"), (b, "b")) + (() if c is None or c.data_ptr() == d.data_ptr() else ((c, "c"),)))
    if c is not None and c.data_ptr() == d.data_ptr() and c.stride() != d.stride():
        raise ValueError(f"bf16_gemm_{layout}: c starts where d does but has other strides: c.stride()={c.stride()}, "
                         f"d.stride()={d.stride()}; pass c=d to accumulate in place")
    return A, B, m, n, k


def _dense(layout: str, a, b, d, c) -> None:
    """``bf16_gemm_<layout>`` without a plan: the checks, then the reference, the simulator or the kernel."""
    A, B, m, n, k = _dense_checks(layout, a, b, d, c)
    if m == 0 or n == 0 or is_meta(d):
        return
    if k == 0:  # the reference: no accumulation, d = c or 0
        if c is None:
            d.zero_()
        elif c.data_ptr() != d.data_ptr():
            d.copy_(c)
        return
    backend = target.backend_of(d.device, "gemm")
    if backend is Backend.REFERENCE:
        bf16_math.bf16_gemm_reference(layout, a, b, d, c)
        return
    kernels = kernel_module()
    A, B = tma_view(A), tma_view(B)
    # The kernel stores D and reads C with plain row-major accesses (row strides are parameters; C read before D is
    # written by the same thread, so C may be D): both go to it as given, no staging copy.
    cfg = kernels.pick_config(kernels.Bf16Form.DENSE, m, n, k, 1, major_of(A), major_of(B), d.dtype, c is not None,
                              launching.num_ctas(backend))
    kernels.launch(cfg, A, B, d, c, backend=backend)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """``d = c + a · bᵀ`` (``c=None``: ``a · bᵀ``): ``a`` ``[m, k]``, ``b`` ``[n, k]`` bfloat16 (K- or MN-major,
    any strides); ``d`` ``[m, n]`` bfloat16 or float32, row-major; ``c`` None or ``d``'s dtype and shape (``d``
    itself to accumulate in place). ``TypeError`` / ``ValueError`` name the argument (module docstring)."""
    ENTRIES["dense_nt"](a, b, d, c, None)


def bf16_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """:func:`bf16_gemm_nt` with ``b`` given ``[k, n]``: ``d = c + a · b``."""
    ENTRIES["dense_nn"](a, b, d, c, None)


def bf16_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """:func:`bf16_gemm_nt` with ``a`` given ``[k, m]`` and ``b`` ``[k, n]``: ``d = c + aᵀ · b``."""
    ENTRIES["dense_tn"](a, b, d, c, None)


def bf16_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """:func:`bf16_gemm_nt` with ``a`` given ``[k, m]``: ``d = c + aᵀ · bᵀ``."""
    ENTRIES["dense_tt"](a, b, d, c, None)


# ----------------------------------------------------------------------------------------------- grouped
def _grouped_operands(name: str, a, b, d, rank_a: int, b_doc: str, trans_b: bool):
    """``(B as [G, n, k] view, G, m, n, k)`` after the type, rank, shape and device checks of a grouped name."""
    for t, arg in ((a, "a"), (b, "b"), (d, "d")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    for t, arg in ((a, "a"), (b, "b"), (d, "d")):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: {arg} must be torch.bfloat16 (the grouped BF16 GEMMs write bf16 d), got "
                            f"{t.dtype}")
    a_doc = "[m_sum, k]" if rank_a == 2 else "[G, m_max, k]"
    if a.dim() != rank_a or b.dim() != 3 or d.dim() != rank_a:
        raise ValueError(f"{name}: a must be {a_doc}, b {b_doc}, d {a_doc[:-2]}n]; got a {tuple(a.shape)}, b "
                         f"{tuple(b.shape)}, d {tuple(d.shape)}")
    B = b.transpose(1, 2) if trans_b else b
    groups, n, k = B.shape
    m, k_a = a.shape[-2], a.shape[-1]
    expected_d = (m, n) if rank_a == 2 else (groups, m, n)
    if k_a != k or tuple(d.shape) != expected_d or (rank_a == 3 and a.shape[0] != groups):
        raise ValueError(f"{name}: shapes do not agree: a {tuple(a.shape)} ({a_doc}), b {tuple(b.shape)} ({b_doc}), "
                         f"d {tuple(d.shape)} (expected {expected_d})")
    if groups < 1 or n < 1 or k < 1:
        raise ValueError(f"{name}: G, n and k must be positive (the reference asserts n > 0, k > 0, num_groups > 0), "
                         f"got G={groups}, n={n}, k={k}")
    if k % GROUPED_K_ALIGN:
        raise ValueError(f"{name}: k must be a multiple of {GROUPED_K_ALIGN} (the reference's SM90 grouped BF16 "
                         f"kernels), got k={k}")
    if a.stride(-1) != 1:
        raise ValueError(f"{name}: a must be K-major (a.stride(-1) == 1, as the reference asserts), got strides "
                         f"{tuple(a.stride())}")
    if d.numel() and d.stride(-1) != 1:
        raise ValueError(f"{name}: d must be row-major (N-major, stride(-1) == 1), got strides {tuple(d.stride())}")
    devices = {t.device for t in (a, b, d)}
    if len(devices) != 1:
        raise ValueError(f"{name}: every tensor must be on one device, got a on {a.device}, b on {b.device}, d on "
                         f"{d.device}")
    _check_output(d, ((a, "a"), (b, "b")))
    return B, groups, m, n, k


def _run_grouped(form, a, B, d, groups, m, n, k, *, grouped_layout=None, masked_m=None) -> None:
    backend = target.backend_of(d.device, "gemm")
    kernels = kernel_module()
    A, B = tma_view(a), tma_view(B)
    cfg = kernels.pick_config(form, m, n, k, groups, "k", major_of(B), torch.bfloat16, False,
                              launching.num_ctas(backend))
    kernels.launch(cfg, A, B, d, None, grouped_layout=grouped_layout, masked_m=masked_m, backend=backend)


def _contiguous_checks(name: str, a, b, d, grouped_layout, use_psum_layout, expected_m_for_psum_layout, trans_b):
    """Every check of a contiguous name in its order: ``(B as [G, n, k], G, m, n, k)``."""
    B, groups, m, n, k = _grouped_operands(name, a, b, d, 2, "[G, k, n]" if trans_b else "[G, n, k]", trans_b)
    if not isinstance(use_psum_layout, bool):
        raise TypeError(f"{name}: use_psum_layout must be a bool, got {type(use_psum_layout).__name__}")
    if expected_m_for_psum_layout is not None:
        if not use_psum_layout:
            raise ValueError(f"{name}: expected_m_for_psum_layout is only for use_psum_layout=True (the reference "
                             f"asserts it), got {expected_m_for_psum_layout!r}")
        check_expected_m(expected_m_for_psum_layout, "expected_m_for_psum_layout")
    if use_psum_layout:
        psum_layout.check_grouped_layout(grouped_layout, groups, d.device)
    else:
        check_tensor(grouped_layout, "grouped_layout", INDEX_DTYPE, 1)
        check_shape(grouped_layout, "grouped_layout", (m,), "[m_sum] (one group index per row of a)")
        check_same_device(d.device, ((grouped_layout, "grouped_layout"),), "d")
    if not grouped_layout.is_contiguous():
        raise ValueError(f"{name}: grouped_layout must be contiguous (the reference asserts it), got strides "
                         f"{tuple(grouped_layout.stride())}")
    return B, groups, m, n, k


def _contiguous(name: str, a, b, d, grouped_layout, use_psum_layout, expected_m_for_psum_layout, trans_b) -> None:
    """A contiguous name without a plan: the checks, then the reference, the simulator or the kernel."""
    B, groups, m, n, k = _contiguous_checks(name, a, b, d, grouped_layout, use_psum_layout,
                                            expected_m_for_psum_layout, trans_b)
    if m == 0 or is_meta(d):
        return
    checked = layout_values_checked(d.device)  # CPU always; CUDA with DFG_CHECK_LAYOUTS=1 (one synchronisation)
    if use_psum_layout:
        if checked:
            psum_layout.check_psum_layout_values(grouped_layout, m)
        rows = row_groups_of_psum(grouped_layout, m)
    else:
        if checked:
            contiguous_layout.check_contiguous_values(grouped_layout, m, groups, "grouped_layout")
        rows = grouped_layout
    if target.backend_of(d.device, "gemm") is Backend.REFERENCE:
        for group, idx in contiguous_layout.reference_row_parts(rows, groups, d.device):
            d[idx] = bf16_math.matmul_f64(a[idx], B[group]).to(d.dtype)
        return
    _run_grouped(kernel_module().Bf16Form.M_GROUPED_CONTIGUOUS, a, B, d, groups, m, n, k, grouped_layout=rows)


def row_groups_of_psum(ends: torch.Tensor, m_sum: int) -> torch.Tensor:
    """The per-row group indices (int32 ``[m_sum]``, -1 for rows no group owns) of a psum layout (``ops.psum``:
    group g owns ``[start_g, end_g)``, ``start_0 = 0``, ``start_g`` = ``ends[g-1]`` rounded up to the contiguous
    alignment, ``end_g = max(ends[g], start_g)``), computed on ``ends``' device without reading it back (no
    synchronisation: CUDA-graph capturable), so the contiguous kernel runs the psum layout."""
    align = get_m_alignment_for_contiguous_layout()
    ends64 = ends.to(torch.int64)
    starts = torch.cat([ends64.new_zeros(1), (ends64[:-1] + align - 1) // align * align])
    stops = torch.maximum(ends64, starts)
    r = torch.arange(m_sum, device=ends.device)
    group = (torch.searchsorted(starts, r, right=True) - 1).clamp_(min=0)
    owned = (r >= starts[group]) & (r < stops[group])
    return torch.where(owned, group, torch.full_like(group, -1)).to(torch.int32)


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                      use_psum_layout: bool = False,
                                      expected_m_for_psum_layout: int | None = None) -> None:
    """Rows of every group concatenated: ``d[r] = a[r] · b[g(r)]ᵀ`` in bf16. ``a`` ``[m_sum, k]`` bfloat16
    K-major, ``b`` ``[G, n, k]`` bfloat16, ``d`` ``[m_sum, n]`` bfloat16 row-major, ``k % 64 == 0``;
    ``grouped_layout`` int32 ``[m_sum]`` (group per row, -1 padding: ``ops.contiguous``) or, with
    ``use_psum_layout=True``, int32 ``[G]`` end rows (``ops.psum``; no plan: the rows are computed per call)."""
    if use_psum_layout is not False or expected_m_for_psum_layout is not None:
        _contiguous("m_grouped_bf16_gemm_nt_contiguous", a, b, d, grouped_layout, use_psum_layout,
                    expected_m_for_psum_layout, trans_b=False)
        return
    ENTRIES["contiguous_nt"](a, b, d, grouped_layout, None)


def m_grouped_bf16_gemm_nn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                      use_psum_layout: bool = False) -> None:
    """:func:`m_grouped_bf16_gemm_nt_contiguous` with ``b`` given ``[G, k, n]`` (N-major): ``d[r] = a[r] · b[g(r)]``."""
    if use_psum_layout is not False:
        _contiguous("m_grouped_bf16_gemm_nn_contiguous", a, b, d, grouped_layout, use_psum_layout, None, trans_b=True)
        return
    ENTRIES["contiguous_nn"](a, b, d, grouped_layout, None)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int) -> None:
    """Per group g, rows ``r < masked_m[g]``: ``d[g, r] = a[g, r] · b[g]ᵀ`` in bf16; other rows untouched. ``a``
    ``[G, m_max, k]`` and ``b`` ``[G, n, k]`` bfloat16 K-major, ``d`` ``[G, m_max, n]`` bfloat16 row-major,
    ``k % 64 == 0``, ``masked_m`` int32 ``[G]`` (values in ``[0, m_max]``), ``expected_m`` a positive int (the
    heuristic's rows per group)."""
    if type(expected_m) is not int or expected_m <= 0:  # the op's path raises, in its order
        _masked(a, b, d, masked_m, expected_m)
        return
    ENTRIES["masked"](a, b, d, masked_m, expected_m)


def _masked_checks(a, b, d, masked_m, expected_m):
    """Every check of the masked name in its order: ``(B, G, m_max, n, k)``."""
    name = "m_grouped_bf16_gemm_nt_masked"
    B, groups, m, n, k = _grouped_operands(name, a, b, d, 3, "[G, n, k]", False)
    if B.stride(-1) != 1:
        raise ValueError(f"{name}: b must be K-major (b.stride(-1) == 1, as the reference asserts), got strides "
                         f"{tuple(B.stride())}")
    check_expected_m(expected_m)
    check_tensor(masked_m, "masked_m", INDEX_DTYPE, 1)
    check_shape(masked_m, "masked_m", (groups,), "[G]")
    check_same_device(d.device, ((masked_m, "masked_m"),), "d")
    if not masked_m.is_contiguous():
        raise ValueError(f"{name}: masked_m must be contiguous (the reference asserts it), got strides "
                         f"{tuple(masked_m.stride())}")
    return B, groups, m, n, k


def _masked(a, b, d, masked_m, expected_m) -> None:
    """The masked name without a plan: the checks, then the reference, the simulator or the kernel."""
    B, groups, m, n, k = _masked_checks(a, b, d, masked_m, expected_m)
    if m == 0 or is_meta(d):
        return
    if layout_values_checked(d.device):
        masked_layout.check_masked_values(masked_m, m)
    if target.backend_of(d.device, "gemm") is Backend.REFERENCE:
        for g, rows in enumerate(masked_m.tolist()):
            if rows:
                d[g, :rows] = bf16_math.matmul_f64(a[g, :rows], B[g]).to(d.dtype)
        return
    _run_grouped(kernel_module().Bf16Form.M_GROUPED_MASKED, a, B, d, groups, m, n, k, masked_m=masked_m)


# ---------------------------------------------------------------------------------------------- per-call plans
# Each name's entry (``ops.bf16_plans``: the plan of a signature and the entry that finds it) over its own checks and
# path. A call is ``(a, b, d, x, expected_m)``: ``x`` the dense names' ``c`` or the grouped names' layout.
def _same(a, b):
    """The kernel's views of a name that passes ``a`` and ``b`` as the kernel reads them (masked)."""
    return a, b


def _dense_entry(layout: str):
    """``bf16_gemm_<layout>``'s entry: A and B the transposed views the layout names, ``x`` = ``c``."""
    trans_a, trans_b = bf16_math.LAYOUTS[layout]

    def views(a, b):
        return (a.T if trans_a else a), (b.T if trans_b else b)

    def op(a, b, d, c, expected_m) -> None:
        _dense(layout, a, b, d, c)

    def make(a, b, d, c) -> Bf16Plan:
        A, B, m, n, k = _dense_checks(layout, a, b, d, c)
        return Bf16Plan(op, views, "DENSE", A, B, d, c, True, m, n, k, 1)

    return plan_entry(make, op)


def _contiguous_entry(trans_b: bool):
    """A contiguous name's entry (m_indices layout only; psum takes the general path), ``x`` = ``grouped_layout``."""
    name = f"m_grouped_bf16_gemm_{'nn' if trans_b else 'nt'}_contiguous"

    def views(a, b):
        return a, (b.transpose(1, 2) if trans_b else b)

    def op(a, b, d, grouped_layout, expected_m) -> None:
        _contiguous(name, a, b, d, grouped_layout, False, None, trans_b)

    def make(a, b, d, grouped_layout) -> Bf16Plan:
        B, groups, m, n, k = _contiguous_checks(name, a, b, d, grouped_layout, False, None, trans_b)
        return Bf16Plan(op, views, "M_GROUPED_CONTIGUOUS", a, B, d, grouped_layout, False, m, n, k, groups)

    return plan_entry(make, op)


def _masked_entry():
    """The masked name's entry, ``x`` = ``masked_m``; ``expected_m`` changes nothing the plan holds."""
    def make(a, b, d, masked_m) -> Bf16Plan:
        B, groups, m, n, k = _masked_checks(a, b, d, masked_m, 1)  # expected_m: checked by the name, not planned
        return Bf16Plan(_masked, _same, "M_GROUPED_MASKED", a, B, d, masked_m, False, m, n, k, groups)

    return plan_entry(make, _masked)


#: name -> the eager entry of a BF16 name (``dense_<layout>``, ``contiguous_{nt,nn}``, ``masked``; psum: none).
ENTRIES = {**{f"dense_{layout}": _dense_entry(layout) for layout in bf16_math.LAYOUTS},
           "contiguous_nt": _contiguous_entry(False), "contiguous_nn": _contiguous_entry(True),
           "masked": _masked_entry()}


def clear_plans() -> None:
    """Forget every BF16 plan (tests; a loaded kernel stays loaded)."""
    for entry in ENTRIES.values():
        entry.plans.clear()
        for index in entry.indexes:
            index.clear()


def plan_stats() -> dict[str, tuple[int, int]]:
    """``{name: (plans, weights indexed)}`` per entry of :data:`ENTRIES`: what tests and benchmarks inspect."""
    return {name: (len(e.plans), sum(len(i) for i in e.indexes)) for name, e in ENTRIES.items()}


def plans_of(name: str) -> list[Bf16Plan]:
    """The plans of entry ``name`` (tests: a pointer-only change must reuse one)."""
    return list(ENTRIES[name].plans.values())


plans.register_cache("bf16.", clear_plans, plan_stats)  # _core.plans.clear() / stats() cover the BF16 plans too
