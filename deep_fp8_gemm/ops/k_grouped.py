"""The k-grouped GEMM family (kind ``"k_grouped"``): MoE experts' weight gradients in one launch,
``k_grouped_gemm_fp8_fp8_fp32_nt``: for every group g, ``d[g] = c[g] + A_g·B_gᵀ`` in fp32 with run-time K_g.

Layout (the reference's SM90 ``k_grouped_fp8_gemm_nt_contiguous`` convention): G = len(ks) groups; group g has
K_g = ks[g] (a multiple of 128, 0 allowed) and starts at K offset k_off_g = sum(ks[:g]) of the concatenated K axis.

* ``a`` float8_e4m3fn 1-D, numel ``m * sum(ks)``: A_g ``[m, K_g]`` row-major (stride K_g) at element ``m * k_off_g``;
* ``b`` float8_e4m3fn 1-D, numel ``n * sum(ks)``: B_g ``[n, K_g]`` row-major at element ``n * k_off_g``;
* ``sa`` float32 ``[m, sum(ks)/128]``, ``sb`` float32 ``[n, sum(ks)/128]``: column j = K block j of the concatenated
  K axis (group g's blocks are columns ``k_off_g/128 .. (k_off_g + K_g)/128 - 1``); any strides;
* ``d`` float32 ``[G, m, n]`` contiguous; ``c`` None, ``d`` itself (accumulate in place) or another float32
  ``[G, m, n]`` tensor (same layout, not overlapping d; d is then only written).

``D_g = C_g + A_g·B_gᵀ`` (``C_g = 0`` when c is None); ``K_g = 0`` gives ``D_g = C_g``. ``ks_tensor`` (int32 ``[G]`` on
d's device, the values of ``ks``) is what the kernel reads; on CPU tensors it is checked against ``ks``. The kernel
is kind ``"k_grouped"`` (``GemmKind::KGrouped1D1D``, ``policy_k_grouped.cuh``); the custom op is
``torch.ops.deep_fp8_gemm.k_grouped_gemm_fp8_fp8_fp32_nt``. Same layers as :mod:`.wgrad_1d1d`.
"""

from __future__ import annotations

import torch

from .._core.checks import (FP8, Problem, check_aligned_ptr, check_c_layout, check_fp32_c, check_fp32_out,
                            check_no_overlap, check_same_device, check_shape, check_tensor, is_meta, unpack_pair)
from .._core.dispatch import accumulates_in_place, accumulator, eager, normalise_scales, operands
from .._core.family import GemmFamily, register_op
from .._core.reference_math import gemm_nt_row_scaled_f64
from ..config import GemmConfig, k_grouped_config
from ..constants import GRAN_K, K_GROUP_ALIGNMENT
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend, layout_values_checked


def check_ks(ks: object) -> list[int]:
    """``ks`` as a list of Python ints: at least one group, each a non-negative multiple of 128."""
    if not isinstance(ks, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ks):
        raise TypeError(f"ks must be a list or tuple of Python ints (K of each group), got {ks!r}")
    if len(ks) < 1:
        raise ValueError("ks must name at least one group, got ks=[]")
    for g, k in enumerate(ks):
        if k < 0 or k % K_GROUP_ALIGNMENT:
            raise ValueError(f"ks[{g}]={k}: every group's K must be a non-negative multiple of {K_GROUP_ALIGNMENT} "
                             f"(get_k_alignment_for_contiguous_layout())")
    return list(ks)


def _check_contiguous_c(c) -> None:
    if not c.is_contiguous():
        raise ValueError(f"c must be contiguous [G, m, n], got c.stride()={c.stride()}")


def check(a, sa, b, sb, d, ks, ks_tensor, c, *, layout: bool = True, pointers: bool = True,
          values: bool = True) -> Problem:
    """Types, shapes, devices (``layout``: strides; ``pointers``: alignment and overlap; ``values``: the values of a
    CPU ``ks_tensor``) of the k-grouped GEMM; returns ``Problem(m, n, sum(ks), G)``. Errors name the argument and
    its value."""
    ks = check_ks(ks)
    num_groups, k_sum = len(ks), sum(ks)
    check_tensor(a, "lhs[0] (A)", FP8, 1)
    check_tensor(b, "rhs[0] (B)", FP8, 1)
    check_fp32_out(d, "the k-grouped GEMM")
    if d.dim() != 3 or d.size(0) != num_groups:
        raise ValueError(f"d must be [G, m, n] with G=len(ks)={num_groups}, got d.shape={tuple(d.shape)}")
    m, n = d.shape[1:]
    if a.numel() != m * k_sum:
        raise ValueError(f"lhs[0] (A) must have m * sum(ks) = {m} * {k_sum} = {m * k_sum} elements (A_g [m, K_g] "
                         f"back to back), got lhs[0] (A).numel()={a.numel()}")
    if b.numel() != n * k_sum:
        raise ValueError(f"rhs[0] (B) must have n * sum(ks) = {n} * {k_sum} = {n * k_sum} elements (B_g [n, K_g] "
                         f"back to back), got rhs[0] (B).numel()={b.numel()}")
    kb = k_sum // GRAN_K
    check_tensor(sa, "lhs[1] (sA)", torch.float32, 2)
    check_shape(sa, "lhs[1] (sA)", (m, kb), "[m, sum(ks)/128]")
    check_tensor(sb, "rhs[1] (sB)", torch.float32, 2)
    check_shape(sb, "rhs[1] (sB)", (n, kb), "[n, sum(ks)/128] (1x128 per-row scales of B, recipe (1, 1, 128))")
    check_fp32_c(c, d, "[G, m, n]")
    named = ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (d, "d"))
    if ks_tensor is not None:
        check_tensor(ks_tensor, "ks_tensor", torch.int32, 1)
        if ks_tensor.numel() != num_groups:
            raise ValueError(f"ks_tensor must have len(ks)={num_groups} elements, got ks_tensor.shape="
                             f"{tuple(ks_tensor.shape)}")
        named += ((ks_tensor, "ks_tensor"),)
    check_same_device(a.device, named + (() if c is None else ((c, "c"),)))
    if values and ks_tensor is not None and layout_values_checked(ks_tensor.device):  # CPU; CUDA in the debug mode
        if ks_tensor.tolist() != ks:
            raise ValueError(f"ks_tensor must hold the values of ks={ks}, got ks_tensor={ks_tensor.tolist()}")
    if layout:
        if n % 8 != 0:
            raise ValueError(f"n must be a multiple of 8 (fp32 column pairs of d, 16-byte rows of sB's tensor map), "
                             f"got d.shape={tuple(d.shape)}")
        for t, name in ((a, "lhs[0] (A)"), (b, "rhs[0] (B)")):
            if t.numel() and t.stride(0) != 1:
                raise ValueError(f"{name} must be contiguous, got {name}.stride()={t.stride()}")
        if not d.is_contiguous():
            raise ValueError(f"d must be contiguous [G, m, n], got d.stride()={d.stride()}")
        if c is not None:
            _check_contiguous_c(c)
    if pointers and not is_meta(a):  # meta tensors: no pointers (the shape-only path)
        check_aligned_ptr(a, "lhs[0] (A)")
        check_aligned_ptr(b, "rhs[0] (B)")
        check_aligned_ptr(d, "d")
        check_no_overlap(d, ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"))
                         + (() if ks_tensor is None else ((ks_tensor, "ks_tensor"),)), "d")
        check_c_layout(c, d, _check_contiguous_c)
    return Problem(m, n, k_sum, num_groups)


def reference_validated(a, sa, b, sb, d, ks, c) -> None:
    """The reference on checked tensors: per group, the exact K-block partials promoted with the per-row scales in
    float64 (``_core.reference_math.gemm_nt_row_scaled_f64``), added to C, rounded once to float32 (``K_g = 0``:
    ``d[g] = c[g]``, 0 when ``c`` is None; ``c`` may be ``d``)."""
    m, n = d.shape[1], d.shape[2]
    k_off = 0
    for g, k in enumerate(ks):
        acc = torch.zeros(m, n, dtype=torch.float64, device=d.device) if c is None else c[g].double()
        if k:
            blocks = slice(k_off // GRAN_K, (k_off + k) // GRAN_K)
            acc = acc + gemm_nt_row_scaled_f64(a[m * k_off: m * (k_off + k)].view(m, k), sa[:, blocks],
                                               b[n * k_off: n * (k_off + k)].view(n, k), sb[:, blocks])
        d[g].copy_(acc)
        k_off += k


def reference(lhs, rhs, d: torch.Tensor, ks, ks_tensor: torch.Tensor | None = None,
              c: torch.Tensor | None = None) -> None:
    """Reference of :func:`k_grouped_gemm_fp8_fp8_fp32_nt`: for each group g, ``d[g] = c[g] + A_g·B_gᵀ`` (the layout
    of the module docstring); dequantised, multiplied, summed and added to C in float64, rounded once to float32."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    ks = check_ks(ks)
    check(a, sa, b, sb, d, ks, ks_tensor, c, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, d, ks, c)


def plan(m: int, n: int, num_groups: int, num_sms: int) -> GemmConfig:
    """The config: depends on m, n and G only (one binary for every routing; ``config.k_grouped_config``)."""
    return k_grouped_config(m, n, num_groups, num_sms)


def dispatch(a, sa, b, sb, d, ks, ks_tensor, c) -> None:
    """Run a checked, non-empty call on its backend (``c`` may be ``d`` or None; ``ks_tensor`` None builds it)."""
    backend = target.backend_of(d.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, d, ks, c)
        return
    if ks_tensor is None:
        ks_tensor = device_ks(ks, d.device)
    run(a, sa, b, sb, d, ks, ks_tensor, c, backend)


def device_ks(ks: list[int], device: torch.device) -> torch.Tensor:
    """``ks`` as int32 ``[G]`` on ``device`` without a host sync: a pinned host copy, copied on the current stream
    with ``non_blocking=True`` (the caching host allocator keeps the pinned block until the copy is done).
    ``ValueError`` while the current stream is capturing a CUDA graph: the graph would replay a copy out of host
    memory it does not own and never see new sizes; a captured call passes its own device ``ks_tensor``."""
    host = torch.tensor(ks, dtype=torch.int32)
    if device.type != "cuda":
        return host.to(device)
    if target.is_capturing(target.gpu_index(device)):
        raise ValueError("ks_tensor=None while capturing a CUDA graph: pass ks_tensor (int32 [G] on d's device, "
                         "written before each replay) so that the graph reads the group sizes on the device")
    return host.pin_memory().to(device, non_blocking=True)


def run(a, sa, b, sb, d, ks, ks_tensor, c, backend: Backend) -> None:
    """Pick the config and launch the kernel (one launch for all groups; ``c`` may be ``d`` or None). With every
    K_g = 0 there is nothing to multiply and D = C (or 0) is written here instead."""
    c = accumulator(c, d)
    if sum(ks) == 0:
        if c.data_ptr() != d.data_ptr():
            d.copy_(c)
        return
    cfg = plan(d.shape[1], d.shape[2], len(ks), gemm_host.num_sms_for(backend))
    gemm_host.launch_k_grouped(cfg, a, normalise_scales(sa), b, normalise_scales(sb), d, c, ks_tensor, sum(ks),
                               backend)


def impl(a, sa, b, sb, d, ks, ks_tensor, c) -> None:
    """Check, then dispatch."""
    ks = check_ks(ks)
    if not check(a, sa, b, sb, d, ks, ks_tensor, c).empty and not is_meta(d):  # meta: checked, nothing run
        FAMILY.dispatch(a, sa, b, sb, d, ks, ks_tensor, c)


def _op_impl(a, sa, b, sb, d, ks, ks_tensor, c, accumulate) -> None:
    if accumulate and c is not None:
        raise ValueError("accumulate=True takes c=None (d is C)")
    impl(a, sa, b, sb, d, list(ks), ks_tensor, d if accumulate else c)


def _op_fake(a, sa, b, sb, d, ks, ks_tensor, c, accumulate) -> None:
    check(a, sa, b, sb, d, list(ks), ks_tensor, c, pointers=False, values=False)


OP = register_op("k_grouped_gemm_fp8_fp8_fp32_nt", "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, int[] ks, "
                 "Tensor? ks_tensor, Tensor? c, bool accumulate) -> ()", _op_impl, _op_fake)


def k_grouped_gemm_fp8_fp8_fp32_nt(lhs, rhs, d: torch.Tensor, ks, ks_tensor: torch.Tensor | None = None,
                                   c: torch.Tensor | None = None) -> None:
    """``d[g] = c[g] + (A_g·sA_g)·(B_g·sB_g)ᵀ`` in float32 for every group g (layout in the module docstring), one
    launch.

    ``ks_tensor`` (int32 ``[G]`` on d's device, the values of ``ks``) is what the kernel reads; None builds it.
    Runs as the custom op ``torch.ops.deep_fp8_gemm.k_grouped_gemm_fp8_fp8_fp32_nt`` under tracing / dispatch
    modes (``c=d`` becomes ``accumulate=True``), directly otherwise. CPU tensors: the float64 reference
    (:func:`reference`), or the kernel in the simulator with ``DFG_SIMULATE=1``."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    ks = check_ks(ks)
    accumulate = accumulates_in_place(c, d)
    if accumulate:
        c = None
    tensors = [t for t in (a, sa, b, sb, d, c, ks_tensor) if isinstance(t, torch.Tensor)]
    if eager(*tensors):
        impl(a, sa, b, sb, d, ks, ks_tensor, d if accumulate else c)
        return
    operands((a, sa), (b, sb), d, out_name="d")
    OP(a, sa, b, sb, d, ks, ks_tensor, c, bool(accumulate))


FAMILY = GemmFamily(kind="k_grouped", public=k_grouped_gemm_fp8_fp8_fp32_nt, check=check, reference=reference,
                    dispatch=dispatch, plan=plan, op=OP)
