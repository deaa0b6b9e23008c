"""The 1D1D GEMM with fp32 accumulation (weight gradients; DeepSeek-V3's "1x128 x 1x128" recipe).

``gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)``: ``D = C + A·Bᵀ`` in float32, where

* A ``[m, k]`` and B ``[n, k]`` are float8_e4m3fn, K-major (row-major, 16-byte row strides);
* sA ``[m, ceil(k/128)]`` and sB ``[n, ceil(k/128)]`` are float32 1x128 per-row scales of A and B (any strides:
  both are converted to the M-major TMA-aligned layout of ``get_col_major_tma_aligned_tensor`` before launch);
* ``d`` ``[m, n]`` float32, row-major with a 16-byte-multiple row stride (so column pairs are 8-byte aligned); ``c`` ``[m, n]`` float32 of the same layout, or ``d``
  itself (in-place accumulation into a main-grad buffer), or None (``D = A·Bᵀ``). A ``c`` distinct from ``d``
  must not overlap it; the kernel never reads ``d`` then.

Dispatch as :mod:`deep_fp8_gemm.ops`: CPU tensors run :func:`deep_fp8_gemm.reference.gemm_fp8_fp8_fp32_nt_1d1d`
(or, with ``DFG_SIMULATE=1``, the kernel in the CPU simulator); CUDA tensors need sm_90 and run the JIT kernel
(kind ``"1d1d"`` of ``kernels/fp8_gemm.cuh`` with the policies of ``policy_1d1d.cuh``).

``k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, ks_tensor, c)`` (below): the k-grouped variant for MoE
weight gradients, ``d[g] = c[g] + A_g·B_gᵀ`` for groups of run-time K_g in one launch (kind ``"k_grouped"``,
``policy_k_grouped.cuh``); same dispatch.
"""

from __future__ import annotations

import torch

from . import reference
from .validation import (_aligned_ptr, _divisibility, _no_overlap, _row_major_tma, _same_device, _shape, _tensor,
                         unpack_pair)
from .utils import ceil_div

FP8 = torch.float8_e4m3fn


def _check_fp32_d(d, accumulates: str) -> None:
    """``d`` is an fp32 tensor (``accumulates``: which kernel accumulates in fp32, for the message)."""
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"d must be a torch.Tensor, got {type(d).__name__}")
    if d.dtype != torch.float32:
        raise TypeError(f"d must be torch.float32 ({accumulates} accumulates in fp32), got d.dtype={d.dtype}")


def _check_fp32_c(c, d, shape_doc: str) -> None:
    """``c`` is None or an fp32 tensor of d's shape (``shape_doc``: d's documented shape, e.g. ``[m, n]``)."""
    if c is None:
        return
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"c must be a torch.Tensor or None, got {type(c).__name__}")
    if c.dtype != torch.float32:
        raise TypeError(f"c must be torch.float32, got c.dtype={c.dtype}")
    if c.shape != d.shape:
        raise ValueError(f"c must have d's shape {shape_doc}={tuple(d.shape)}, got c.shape={tuple(c.shape)}")


def _check_c_layout(c, d, check_separate) -> None:
    """``c`` is None, ``d`` itself (in place), or a separate tensor that passes ``check_separate(c)``, is
    TMA-aligned and does not overlap ``d``."""
    if c is not None and c.data_ptr() != d.data_ptr():
        check_separate(c)
        _aligned_ptr(c, "c")
        _no_overlap(d, ((c, "c (pass c=d to accumulate in place)"),))
    elif c is not None and c.stride() != d.stride():
        raise ValueError(f"c starts where d does but has other strides: c.stride()={c.stride()}, "
                         f"d.stride()={d.stride()}; pass c=d to accumulate in place")


def _check_contiguous_c(c) -> None:
    if not c.is_contiguous():
        raise ValueError(f"c must be contiguous [G, m, n], got c.stride()={c.stride()}")


def check_1d1d(a, sa, b, sb, d, c, *, layout: bool = True) -> tuple[int, int, int]:
    """Types, shapes and devices (and, with ``layout``, the kernel's stride / alignment rules) of the 1D1D GEMM;
    returns ``(m, n, k)``. Errors name the argument and its value."""
    _tensor(a, "lhs[0] (A)", FP8, 2)
    _tensor(b, "rhs[0] (B)", FP8, 2)
    m, k = a.shape
    n = b.shape[0]
    if k <= 0:
        raise ValueError(f"k must be positive, got lhs[0] (A).shape={tuple(a.shape)}")
    _shape(b, "rhs[0] (B)", (n, k), "[n, k]")
    kb = ceil_div(k, 128)
    _tensor(sa, "lhs[1] (sA)", torch.float32, 2)
    _shape(sa, "lhs[1] (sA)", (m, kb), "[m, ceil(k/128)]")
    _tensor(sb, "rhs[1] (sB)", torch.float32, 2)
    _shape(sb, "rhs[1] (sB)", (n, kb), "[n, ceil(k/128)] (1x128 per-row scales of B, recipe (1, 1, 128))")
    _check_fp32_d(d, "the 1D1D kernel")
    _shape(d, "d", (m, n), "[m, n]")
    _check_fp32_c(c, d, "[m, n]")
    _same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (d, "d"))
                 + (() if c is None else ((c, "c"),)))
    if layout:
        _divisibility(n, k)
        _row_major_tma(a, "lhs[0] (A)")
        _row_major_tma(b, "rhs[0] (B)")
        _row_major_tma(d, "d")
        _aligned_ptr(a, "lhs[0] (A)")
        _aligned_ptr(b, "rhs[0] (B)")
        _aligned_ptr(d, "d")
        inputs = ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"))
        _no_overlap(d, inputs)
        _check_c_layout(c, d, lambda t: _row_major_tma(t, "c"))
    return m, n, k


def _normalise_scales(s: torch.Tensor) -> torch.Tensor:
    from .ops import _normalise_sa

    return _normalise_sa(s)


def gemm_fp8_fp8_fp32_nt_1d1d(lhs, rhs, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """``d = c + (A·sA)·(B·sB)ᵀ`` in float32 (see the module docstring for shapes and layouts).

    Runs as the custom op ``torch.ops.deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d`` when torch is tracing or a
    dispatch mode is active (so ``torch.compile(fullgraph=True)`` traces it), directly otherwise. ``c=d`` becomes
    the op's ``accumulate=True`` with no ``c`` (a mutated argument must not alias another input)."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    accumulate = c is d or (isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor) and _eager(c, d)
                            and c.numel() > 0 and c.data_ptr() == d.data_ptr() and c.shape == d.shape
                            and c.stride() == d.stride())
    if accumulate:
        c = None
    if _eager(*(t for t in (a, sa, b, sb, d, c) if isinstance(t, torch.Tensor))):
        _run(a, sa, b, sb, d, d if accumulate else c)
    else:
        for t, name in ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (d, "d")):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _op(a, sa, b, sb, d, c, bool(accumulate))


def _eager(*tensors: torch.Tensor) -> bool:
    from .ops import _eager as ops_eager

    return ops_eager(*tensors)


def _run(a, sa, b, sb, d, c) -> None:
    """Checks, then the CPU reference, the simulator or the sm_90 kernel (``c`` may be ``d`` or None)."""
    m, n, _ = check_1d1d(a, sa, b, sb, d, c)
    if m == 0 or n == 0:
        return
    from .ops import backend_of

    backend = backend_of(a.device)
    if backend is None:
        reference.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
        return
    if c is None:
        c = d
        d.zero_()  # D = 0 + A·Bᵀ: the kernel always reads C
    launch_1d1d(a, _normalise_scales(sa), b, _normalise_scales(sb), d, c, backend)


def launch_1d1d(a, sa, b, sb, d, c, backend: str) -> None:
    """Pick the config for ``(m, n, k)`` and run the kernel (validated, M-major TMA-aligned scales)."""
    from .config import get_config
    from .kernels.gemm import num_sms_for, run_1d1d

    cfg = get_config(a.shape[0], b.shape[0], a.shape[1], 1, "1d1d", num_sms_for(backend))
    run_1d1d(cfg, a, sa, b, sb, d, c, backend)


# --- the custom op (schema below; registered for CPU and CUDA, with a fake kernel for tracing) -----------------
def _op_impl(a, sa, b, sb, d, c, accumulate) -> None:
    if accumulate and c is not None:
        raise ValueError("accumulate=True takes c=None (d is C)")
    _run(a, sa, b, sb, d, d if accumulate else c)


def _op_fake(a, sa, b, sb, d, c, accumulate) -> None:
    check_1d1d(a, sa, b, sb, d, c, layout=False)


_lib = torch.library.Library("deep_fp8_gemm", "FRAGMENT")
_lib.define("gemm_fp8_fp8_fp32_nt_1d1d(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor? c, "
            "bool accumulate) -> ()")
for _key in ("CPU", "CUDA"):
    _lib.impl("gemm_fp8_fp8_fp32_nt_1d1d", _op_impl, _key)
torch.library.register_fake("deep_fp8_gemm::gemm_fp8_fp8_fp32_nt_1d1d", _op_fake, lib=_lib)
_op = torch.ops.deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d.default


# --- the k-grouped weight gradient (MoE experts' dW in one launch) --------------------------------------------
# Layout (the reference's SM90 ``k_grouped_fp8_gemm_nt_contiguous`` convention): G = len(ks) groups; group g has
# K_g = ks[g] (a multiple of 128, 0 allowed) and starts at K offset k_off_g = sum(ks[:g]) of the concatenated K axis.
#   a   float8_e4m3fn 1-D, numel m * sum(ks): A_g [m, K_g] row-major (stride K_g) at element m * k_off_g;
#   b   float8_e4m3fn 1-D, numel n * sum(ks): B_g [n, K_g] row-major at element n * k_off_g;
#   sa  float32 [m, sum(ks)/128], sb float32 [n, sum(ks)/128]: column j = K block j of the concatenated K axis
#       (group g's blocks are columns k_off_g/128 .. (k_off_g + K_g)/128 - 1); any strides;
#   d   float32 [G, m, n] contiguous; c None, d itself (accumulate in place) or another float32 [G, m, n] tensor
#       (same layout, not overlapping d; d is then only written).
# D_g = C_g + A_g·B_gᵀ (C_g = 0 when c is None); K_g = 0 gives D_g = C_g.
K_GROUP_ALIGNMENT = 128


def _check_ks(ks: object) -> list[int]:
    if not isinstance(ks, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ks):
        raise TypeError(f"ks must be a list or tuple of Python ints (K of each group), got {ks!r}")
    if len(ks) < 1:
        raise ValueError("ks must name at least one group, got ks=[]")
    for g, k in enumerate(ks):
        if k < 0 or k % K_GROUP_ALIGNMENT:
            raise ValueError(f"ks[{g}]={k}: every group's K must be a non-negative multiple of {K_GROUP_ALIGNMENT} "
                             f"(get_k_alignment_for_contiguous_layout())")
    return list(ks)


def check_k_grouped(a, sa, b, sb, d, ks, ks_tensor, c, *, layout: bool = True,
                    values: bool = True) -> tuple[list[int], int, int]:
    """Types, shapes, devices (and, with ``layout``, strides / alignment / overlap; with ``values``, the values of
    a CPU ``ks_tensor``) of the k-grouped GEMM; returns ``(ks, m, n)``. Errors name the argument and its value."""
    ks = _check_ks(ks)
    num_groups, k_sum = len(ks), sum(ks)
    _tensor(a, "lhs[0] (A)", FP8, 1)
    _tensor(b, "rhs[0] (B)", FP8, 1)
    _check_fp32_d(d, "the k-grouped GEMM")
    if d.dim() != 3 or d.size(0) != num_groups:
        raise ValueError(f"d must be [G, m, n] with G=len(ks)={num_groups}, got d.shape={tuple(d.shape)}")
    m, n = d.shape[1:]
    if a.numel() != m * k_sum:
        raise ValueError(f"lhs[0] (A) must have m * sum(ks) = {m} * {k_sum} = {m * k_sum} elements (A_g [m, K_g] "
                         f"back to back), got lhs[0] (A).numel()={a.numel()}")
    if b.numel() != n * k_sum:
        raise ValueError(f"rhs[0] (B) must have n * sum(ks) = {n} * {k_sum} = {n * k_sum} elements (B_g [n, K_g] "
                         f"back to back), got rhs[0] (B).numel()={b.numel()}")
    kb = k_sum // K_GROUP_ALIGNMENT
    _tensor(sa, "lhs[1] (sA)", torch.float32, 2)
    _shape(sa, "lhs[1] (sA)", (m, kb), "[m, sum(ks)/128]")
    _tensor(sb, "rhs[1] (sB)", torch.float32, 2)
    _shape(sb, "rhs[1] (sB)", (n, kb), "[n, sum(ks)/128] (1x128 per-row scales of B, recipe (1, 1, 128))")
    _check_fp32_c(c, d, "[G, m, n]")
    named = ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (d, "d"))
    if ks_tensor is not None:
        _tensor(ks_tensor, "ks_tensor", torch.int32, 1)
        if ks_tensor.numel() != num_groups:
            raise ValueError(f"ks_tensor must have len(ks)={num_groups} elements, got ks_tensor.shape="
                             f"{tuple(ks_tensor.shape)}")
        named += ((ks_tensor, "ks_tensor"),)
    _same_device(a.device, named + (() if c is None else ((c, "c"),)))
    if values and ks_tensor is not None and ks_tensor.device.type == "cpu":
        if ks_tensor.tolist() != ks:
            raise ValueError(f"ks_tensor must hold the values of ks={ks}, got ks_tensor={ks_tensor.tolist()}")
    if layout:
        if n % 8 != 0:
            raise ValueError(f"n must be a multiple of 8 (fp32 column pairs of d, 16-byte rows of sB's tensor map), "
                             f"got d.shape={tuple(d.shape)}")
        for t, name in ((a, "lhs[0] (A)"), (b, "rhs[0] (B)")):
            if t.numel() and t.stride(0) != 1:
                raise ValueError(f"{name} must be contiguous, got {name}.stride()={t.stride()}")
            _aligned_ptr(t, name)
        if not d.is_contiguous():
            raise ValueError(f"d must be contiguous [G, m, n], got d.stride()={d.stride()}")
        _aligned_ptr(d, "d")
        _no_overlap(d, ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"))
                    + (() if ks_tensor is None else ((ks_tensor, "ks_tensor"),)))
        _check_c_layout(c, d, _check_contiguous_c)
    return ks, m, n


def k_grouped_gemm_fp8_fp8_fp32_nt(lhs, rhs, d: torch.Tensor, ks, ks_tensor: torch.Tensor | None = None,
                                   c: torch.Tensor | None = None) -> None:
    """``d[g] = c[g] + (A_g·sA_g)·(B_g·sB_g)ᵀ`` in float32 for every group g (layout above), one launch.

    ``ks_tensor`` (int32 ``[G]`` on d's device, the values of ``ks``) is what the kernel reads; None builds it.
    Runs as the custom op ``torch.ops.deep_fp8_gemm.k_grouped_gemm_fp8_fp8_fp32_nt`` under tracing / dispatch
    modes (``c=d`` becomes ``accumulate=True``), directly otherwise. CPU tensors: the float64 reference
    (:func:`deep_fp8_gemm.reference.k_grouped_gemm_fp8_fp8_fp32_nt`), or the kernel in the simulator with
    ``DFG_SIMULATE=1``."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    ks = _check_ks(ks)
    accumulate = c is d or (isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor) and _eager(c, d)
                            and c.numel() > 0 and c.data_ptr() == d.data_ptr() and c.shape == d.shape
                            and c.stride() == d.stride())
    if accumulate:
        c = None
    tensors = (a, sa, b, sb, d, c, ks_tensor)
    if _eager(*(t for t in tensors if isinstance(t, torch.Tensor))):
        _run_k_grouped(a, sa, b, sb, d, ks, ks_tensor, d if accumulate else c)
    else:
        for t, name in ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (d, "d")):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _k_grouped_op(a, sa, b, sb, d, ks, ks_tensor, c, bool(accumulate))


def _run_k_grouped(a, sa, b, sb, d, ks, ks_tensor, c) -> None:
    """Checks, then the CPU reference, the simulator or the sm_90 kernel (``c`` may be ``d`` or None)."""
    ks, m, n = check_k_grouped(a, sa, b, sb, d, ks, ks_tensor, c)
    if m == 0 or n == 0:
        return
    from .ops import backend_of

    backend = backend_of(d.device)
    if backend is None:
        reference.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, ks_tensor, c)
        return
    if ks_tensor is None:
        ks_tensor = torch.tensor(ks, dtype=torch.int32, device=d.device)
    launch_k_grouped(a, sa, b, sb, d, ks, ks_tensor, c, backend)


def launch_k_grouped(a, sa, b, sb, d, ks, ks_tensor, c, backend: str) -> None:
    """Run the k-grouped kernel (kind ``"k_grouped"``) on validated tensors (``c`` may be ``d`` or None): one
    launch for all groups. ``c=None`` zeroes d first (the kernel always reads C); with every K_g = 0 there is
    nothing to multiply and D = C (or 0) is written here instead."""
    if c is None:
        d.zero_()
        c = d
    if sum(ks) == 0:
        if c.data_ptr() != d.data_ptr():
            d.copy_(c)
        return
    from .kernels.gemm import k_grouped_config, num_sms_for, run_k_grouped

    cfg = k_grouped_config(d.shape[1], d.shape[2], len(ks), num_sms_for(backend))
    run_k_grouped(cfg, a, _normalise_scales(sa), b, _normalise_scales(sb), d, c, ks, ks_tensor, backend)


def _k_grouped_op_impl(a, sa, b, sb, d, ks, ks_tensor, c, accumulate) -> None:
    if accumulate and c is not None:
        raise ValueError("accumulate=True takes c=None (d is C)")
    _run_k_grouped(a, sa, b, sb, d, list(ks), ks_tensor, d if accumulate else c)


def _k_grouped_op_fake(a, sa, b, sb, d, ks, ks_tensor, c, accumulate) -> None:
    check_k_grouped(a, sa, b, sb, d, list(ks), ks_tensor, c, layout=False, values=False)


_lib.define("k_grouped_gemm_fp8_fp8_fp32_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, int[] ks, "
            "Tensor? ks_tensor, Tensor? c, bool accumulate) -> ()")
for _key in ("CPU", "CUDA"):
    _lib.impl("k_grouped_gemm_fp8_fp8_fp32_nt", _k_grouped_op_impl, _key)
torch.library.register_fake("deep_fp8_gemm::k_grouped_gemm_fp8_fp8_fp32_nt", _k_grouped_op_fake, lib=_lib)
_k_grouped_op = torch.ops.deep_fp8_gemm.k_grouped_gemm_fp8_fp8_fp32_nt.default
