"""The prefix-sum ("psum") contiguous layout: the grouped GEMM over expert rows described by group ends.

This is the layout DeepEP v2's dispatch hands over (expanded, expert-sorted, padded rows) and the reference
design's ``use_psum_layout=True``: instead of one expert id per row (``m_indices [m_sum]``), one int32 per
group, ``grouped_layout[g]`` = the end row (exclusive) of group g. Group g owns rows
``[start_g, grouped_layout[g])`` with ``start_0 = 0`` and ``start_g = round_up(grouped_layout[g-1], 128)``;
every other row is padding (its output is unspecified; the kernel skips blocks holding only padding).
An end at or before its group's start is an empty group.

What is checked where (the values live on the device and reading them would cost a synchronisation):

* every call (host, no sync): dtypes, ranks, shapes — ``grouped_layout`` must be 1-D int32 of length
  ``G = rhs[0].shape[0]`` (``ValueError`` naming both otherwise) — devices, strides and alignment;
* CPU tensors (the reference and the simulator): the values too — ``0 <= ends[0] <= ... <= ends[G-1] <=
  m_sum``; a decreasing layout or an end past the rows of A raises ``ValueError``;
* CUDA tensors: the values are never read on the host (CUDA-graph safe). The kernel finds a block's group by
  binary search over the G ends, so any values keep every access in bounds (groups in ``[0, G)``, rows
  clipped to ``m_sum`` by the tensor maps), but a decreasing layout gives unspecified output. Call
  :func:`check_psum_layout` yourself (it synchronises) when the layout is untrusted.

The kernel is the ``GroupedContiguousPsum`` kind of ``include/deep_fp8_gemm/scheduler.cuh`` (config kind
``"psum"``); the 2.x entry point ``m_grouped_fp8_gemm_nt_contiguous(..., use_psum_layout=True)`` of
:mod:`deep_fp8_gemm.compat` calls :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`.
"""

from __future__ import annotations

import torch

from . import prepared, reference
from .ops import _dispatch, _eager, _operands
from .validation import (_check_layout, _check_pointers, _same_device, _tensor, check_expected_m,
                         check_m_grouped_operands, unpack_pair)

_NAME = "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum"


def check_contiguous_psum(a, sa, b, sb, out, grouped_layout, *, layout: bool = True, pointers: bool = True
                          ) -> tuple[int, int, int, int]:
    """Shape checks: A ``[m_sum, k]`` e4m3, sA ``[m_sum, ceil(k/128)]`` fp32, B ``[G, n, k]``, sB
    ``[G, ceil(n/128), ceil(k/128)]``, out ``[m_sum, n]`` bf16, grouped_layout ``[G]`` int32. Returns
    ``(m_sum, n, k, G)``; the values of grouped_layout are not read. ``m_sum`` need not be a multiple of 128
    (the rows after the last group's end are padding)."""
    m_sum, n, k, num_groups = check_m_grouped_operands(a, sa, b, sb, out)
    _tensor(grouped_layout, "grouped_layout", torch.int32, 1)
    if grouped_layout.shape[0] != num_groups:
        raise ValueError(
            f"grouped_layout (psum layout: one end row per group) must have G={num_groups} entries (G = "
            f"rhs[0].shape[0]), got grouped_layout.shape={tuple(grouped_layout.shape)}"
        )
    _same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (out, "out"),
                            (grouped_layout, "grouped_layout")))
    if layout:
        _check_layout(a, b, out, n, k)
    if pointers:
        _check_pointers(a, sa, b, sb, out, ((grouped_layout, "grouped_layout"),))
    return m_sum, n, k, num_groups


def check_psum_layout(grouped_layout: torch.Tensor, m_sum: int) -> None:
    """The value checks of a psum layout (non-negative, non-decreasing, last end <= ``m_sum``); reads the
    values, so it synchronises when ``grouped_layout`` is on a GPU. ValueError on failure."""
    reference.check_psum_values(grouped_layout.tolist(), m_sum)


def _impl(a, sa, b, sb, out, grouped_layout, expected_m) -> None:
    m_sum, n, _, _ = check_contiguous_psum(a, sa, b, sb, out, grouped_layout)
    if expected_m is not None:
        check_expected_m(expected_m)
    if a.device.type == "cpu":  # free to read here; the reference reads them again, the simulator must not see bad ones
        reference.check_psum_values(grouped_layout.tolist(), m_sum)
    if m_sum and n:
        _dispatch("psum", a, sa, b, sb, out, grouped_layout=grouped_layout, expected_m=expected_m)


def _fake(a, sa, b, sb, out, grouped_layout, expected_m) -> None:
    check_contiguous_psum(a, sa, b, sb, out, grouped_layout, pointers=False)


_lib = torch.library.Library("deep_fp8_gemm", "FRAGMENT")
_lib.define(_NAME + "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, Tensor grouped_layout, "
            "int? expected_m=None) -> ()")
for _key in ("CPU", "CUDA"):
    _lib.impl(_NAME, _impl, _key)
torch.library.register_fake(f"deep_fp8_gemm::{_NAME}", _fake, lib=_lib)
_op = getattr(torch.ops.deep_fp8_gemm, _NAME).default


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum(
    lhs: tuple[torch.Tensor, torch.Tensor],
    rhs: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    grouped_layout: torch.Tensor,
    expected_m: int | None = None,
) -> None:
    """Grouped GEMM over expert rows given by group ends (the psum layout, see the module docstring).

    ``out[r] = bf16(dequant(A[r]) · dequant(B[g])ᵀ)`` for every row r of group g; padding rows unspecified.

    Args:
        lhs: ``(A, sA)``: A ``[m_sum, k]`` float8_e4m3fn, K-major; sA ``[m_sum, ceil(k/128)]`` float32 (any
            strides; converted to the M-major TMA-aligned layout, a copy unless it already is).
        rhs: ``(B, sB)``: B ``[G, n, k]`` float8_e4m3fn, K-major; sB ``[G, ceil(n/128), ceil(k/128)]`` float32.
        out: ``[m_sum, n]`` bfloat16, row-major, written in place.
        grouped_layout: ``[G]`` int32 on the same device: end row (exclusive) of each group.
        expected_m: optional positive int, the typical rows per group; chooses the kernel configuration
            (``m_sum`` is often a worst-case buffer size). None: configured for ``m_sum`` rows.

    Same alignment rules (``n % 8 == 0``, ``k % 16 == 0``), errors and dispatch as
    :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`; ``m_sum`` may be any value.
    """
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    if prepared.psum(a, sa, b, sb, out, grouped_layout, expected_m):  # eager: checks cached per signature
        return
    a, sa, b, sb = _operands(lhs, rhs, out, (grouped_layout, "grouped_layout"))
    impl = _impl if _eager(a, sa, b, sb, out, grouped_layout) else _op
    impl(a, sa, b, sb, out, grouped_layout, expected_m)
