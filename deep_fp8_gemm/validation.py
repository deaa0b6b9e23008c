"""Argument checks shared by the public GEMM ops, their fake (meta) kernels and the CPU reference.

Errors: ``TypeError`` for a wrong Python type or dtype, ``ValueError`` for a wrong rank, shape, stride,
device, alignment or value; every message names the argument (``lhs[0]`` is A, ``lhs[1]`` sA, ``rhs[0]`` B,
``rhs[1]`` sB) and the offending values.

Three levels, because they run in three places:

* always (``check_*(..., layout=False)``, used by :mod:`deep_fp8_gemm.reference`): types, dtypes, ranks, exact
  shapes including the scale shapes, one device for every tensor, ``k >= 1``.
* ``layout=True`` (the ops and their fake kernels): the kernels' contract on top of that —
    - A and B K-major: ``stride(-1) == 1``; out row-major: ``stride(-1) == 1``;
    - every other stride of A, B and out a positive multiple of 16 bytes (TMA's global-stride rule);
    - ``n % 8 == 0`` and ``k % 16 == 0``, so that the contiguous tensors meet that rule (k fp8 bytes per
      row of A and B, 2·n bytes per row of out);
    - contiguous layout: ``m_sum % get_m_alignment_for_contiguous_layout() == 0``.
* ``pointers=True`` (real kernels only; fake tensors have no storage): ``data_ptr`` of A, B and out
  16-byte aligned, and out's bytes not overlapping any input.

sA may have any strides (the ops convert it with ``get_col_major_tma_aligned_tensor``, which may copy);
sB, m_indices and masked_m are made contiguous by the ops (a no-op when they already are).

Cost: a few dozen attribute reads per call, no loops over elements and no device synchronisation —
the values of m_indices / masked_m are never read here.
"""

from __future__ import annotations

import torch

from .utils import ceil_div, get_m_alignment_for_contiguous_layout

FP8 = torch.float8_e4m3fn
_TMA_ALIGN_BYTES = 16
_INDEX_DTYPE = torch.int32


def unpack_pair(pair: object, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``pair`` must be a 2-tuple/list ``(data, scales)``; returns it as a tuple."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (tensor, scales) pair, got {type(pair).__name__}")
    return pair[0], pair[1]


def _tensor(t: object, name: str, dtype: torch.dtype, rank: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {name}.dtype={t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got {name}.shape={tuple(t.shape)}")


def _shape(t: torch.Tensor, name: str, expected: tuple[int, ...], what: str) -> None:
    if t.shape != expected:
        raise ValueError(f"{name} must have shape {what}={expected}, got {name}.shape={tuple(t.shape)}")


def _same_device(device: torch.device, named: tuple[tuple[torch.Tensor, str], ...]) -> None:
    for t, name in named:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device: lhs[0] is on {device}, {name} on {t.device}")


def _row_major_tma(t: torch.Tensor, name: str) -> None:
    """Last dim contiguous, every other stride a positive multiple of 16 bytes (empty tensors pass)."""
    if t.numel() == 0:
        return
    strides = t.stride()
    if strides[-1] != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got {name}.stride()={strides}")
    size = t.element_size()
    for s in strides[:-1]:
        if s <= 0 or (s * size) % _TMA_ALIGN_BYTES != 0:
            raise ValueError(
                f"{name}'s leading strides must be positive multiples of {_TMA_ALIGN_BYTES} bytes, "
                f"got {name}.stride()={strides} with element_size={size}"
            )


def _divisibility(n: int, k: int) -> None:
    if n % 8 != 0 or k % 16 != 0:
        raise ValueError(f"n must be a multiple of 8 and k a multiple of 16 (TMA 16-byte rows), got {n=} {k=}")


def _aligned_ptr(t: torch.Tensor, name: str) -> None:
    if t.numel() > 0 and t.data_ptr() % _TMA_ALIGN_BYTES != 0:
        raise ValueError(f"{name}.data_ptr() must be {_TMA_ALIGN_BYTES}-byte aligned, got {t.data_ptr():#x}")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, last byte + 1) of a non-empty tensor."""
    start = t.data_ptr()
    if t.is_contiguous():  # the common case, without a Python loop over dims
        return start, start + t.numel() * t.element_size()
    span = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    return start, start + span * t.element_size()


def _no_overlap(out: torch.Tensor, named: tuple[tuple[torch.Tensor, str], ...]) -> None:
    if out.numel() == 0:
        return
    lo, hi = _byte_range(out)
    for t, name in named:
        if t.numel() == 0:
            continue
        t_lo, t_hi = _byte_range(t)
        if lo < t_hi and t_lo < hi:
            raise ValueError(
                f"out must not overlap {name}: out bytes [{lo:#x}, {hi:#x}), {name} bytes [{t_lo:#x}, {t_hi:#x})"
            )


def _check_operand_a_2d(a: torch.Tensor, sa: torch.Tensor, rows: str) -> tuple[int, int, int]:
    """A ``[rows, k]`` e4m3 and sA ``[rows, ceil(k/128)]`` fp32 (``rows`` names the row count in messages);
    returns ``(rows, k, ceil(k/128))``."""
    _tensor(a, "lhs[0] (A)", FP8, 2)
    num_rows, k = a.shape
    if k <= 0:
        raise ValueError(f"k must be positive, got lhs[0] (A).shape={tuple(a.shape)}")
    kb = ceil_div(k, 128)
    _tensor(sa, "lhs[1] (sA)", torch.float32, 2)
    _shape(sa, "lhs[1] (sA)", (num_rows, kb), f"[{rows}, ceil(k/128)]")
    return num_rows, k, kb


def _check_operand_b(b: torch.Tensor, sb: torch.Tensor, k: int, kb: int, num_groups: int | None) -> int:
    """B ``[n, k]`` / ``[G, n, k]`` and sB ``[ceil(n/128), kb]`` / ``[G, ceil(n/128), kb]``; returns n."""
    rank = 2 if num_groups is None else 3
    _tensor(b, "rhs[0] (B)", FP8, rank)
    _tensor(sb, "rhs[1] (sB)", torch.float32, rank)
    n = b.size(-2)
    lead = () if num_groups is None else (num_groups,)
    dims = "[n, k]" if num_groups is None else "[G, n, k]"
    _shape(b, "rhs[0] (B)", lead + (n, k), dims)
    nb = ceil_div(n, 128)
    sdims = "[ceil(n/128), ceil(k/128)]" if num_groups is None else "[G, ceil(n/128), ceil(k/128)]"
    _shape(sb, "rhs[1] (sB)", lead + (nb, kb), sdims)
    return n


def _check_layout(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, n: int, k: int) -> None:
    _divisibility(n, k)
    _row_major_tma(a, "lhs[0] (A)")
    _row_major_tma(b, "rhs[0] (B)")
    _row_major_tma(out, "out")


def _check_pointers(a, sa, b, sb, out, extra: tuple[tuple[torch.Tensor, str], ...]) -> None:
    _aligned_ptr(a, "lhs[0] (A)")
    _aligned_ptr(b, "rhs[0] (B)")
    _aligned_ptr(out, "out")
    _no_overlap(out, ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")) + extra)


def check_dense(a, sa, b, sb, out, *, layout: bool = True, pointers: bool = True) -> tuple[int, int, int]:
    """Checks of ``gemm_fp8_fp8_bf16_nt``: A ``[m, k]`` e4m3, sA ``[m, ceil(k/128)]`` fp32, B ``[n, k]``
    e4m3, sB ``[ceil(n/128), ceil(k/128)]`` fp32, out ``[m, n]`` bf16. Returns ``(m, n, k)``."""
    m, k, kb = _check_operand_a_2d(a, sa, "m")
    n = _check_operand_b(b, sb, k, kb, None)
    _tensor(out, "out", torch.bfloat16, 2)
    _shape(out, "out", (m, n), "[m, n]")
    _same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (out, "out")))
    if layout:
        _check_layout(a, b, out, n, k)
    if pointers:
        _check_pointers(a, sa, b, sb, out, ())
    return m, n, k


def check_m_grouped_operands(a, sa, b, sb, out) -> tuple[int, int, int, int]:
    """The operand checks every M-grouped contiguous layout shares: A ``[m_sum, k]`` e4m3, sA
    ``[m_sum, ceil(k/128)]`` fp32, B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``, out ``[m_sum, n]``
    bf16. Returns ``(m_sum, n, k, G)``."""
    m_sum, k, kb = _check_operand_a_2d(a, sa, "m_sum")
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"rhs[0] (B) must be a torch.Tensor, got {type(b).__name__}")
    if b.dim() != 3 or b.size(0) < 1:
        raise ValueError(f"rhs[0] (B) must be 3-D [G, n, k] with G >= 1, got rhs[0] (B).shape={tuple(b.shape)}")
    num_groups = b.size(0)
    n = _check_operand_b(b, sb, k, kb, num_groups)
    _tensor(out, "out", torch.bfloat16, 2)
    _shape(out, "out", (m_sum, n), "[m_sum, n]")
    return m_sum, n, k, num_groups


def check_contiguous(
    a, sa, b, sb, out, m_indices, *, layout: bool = True, pointers: bool = True
) -> tuple[int, int, int, int]:
    """Checks of ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous``: A ``[m_sum, k]``, sA ``[m_sum, ceil(k/128)]``,
    B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``, out ``[m_sum, n]`` bf16, m_indices ``[m_sum]`` int32.
    Returns ``(m_sum, n, k, G)``. The values of m_indices are not read."""
    m_sum, n, k, num_groups = check_m_grouped_operands(a, sa, b, sb, out)
    _tensor(m_indices, "m_indices", _INDEX_DTYPE, 1)
    _shape(m_indices, "m_indices", (m_sum,), "[m_sum]")
    _same_device(
        a.device,
        ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (out, "out"), (m_indices, "m_indices")),
    )
    if layout:
        alignment = get_m_alignment_for_contiguous_layout()
        if m_sum % alignment != 0:
            raise ValueError(
                f"m_sum (rows of lhs[0]) must be a multiple of get_m_alignment_for_contiguous_layout()={alignment}"
                f", got {m_sum=}"
            )
        _check_layout(a, b, out, n, k)
    if pointers:
        _check_pointers(a, sa, b, sb, out, ((m_indices, "m_indices"),))
    return m_sum, n, k, num_groups


def check_masked(
    a, sa, b, sb, out, masked_m, expected_m, *, layout: bool = True, pointers: bool = True
) -> tuple[int, int, int, int]:
    """Checks of ``m_grouped_gemm_fp8_fp8_bf16_nt_masked``: A ``[G, m_max, k]``, sA ``[G, m_max, ceil(k/128)]``,
    B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``, out ``[G, m_max, n]`` bf16, masked_m ``[G]`` int32,
    expected_m a positive int. Returns ``(G, m_max, n, k)``. The values of masked_m are not read."""
    check_expected_m(expected_m)
    _tensor(a, "lhs[0] (A)", FP8, 3)
    num_groups, m_max, k = a.shape
    if k <= 0 or num_groups < 1:
        raise ValueError(f"lhs[0] (A) must be [G, m_max, k] with G >= 1 and k >= 1, got shape={tuple(a.shape)}")
    kb = ceil_div(k, 128)
    _tensor(sa, "lhs[1] (sA)", torch.float32, 3)
    _shape(sa, "lhs[1] (sA)", (num_groups, m_max, kb), "[G, m_max, ceil(k/128)]")
    n = _check_operand_b(b, sb, k, kb, num_groups)
    _tensor(out, "out", torch.bfloat16, 3)
    _shape(out, "out", (num_groups, m_max, n), "[G, m_max, n]")
    _tensor(masked_m, "masked_m", _INDEX_DTYPE, 1)
    _shape(masked_m, "masked_m", (num_groups,), "[G]")
    _same_device(
        a.device,
        ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (out, "out"), (masked_m, "masked_m")),
    )
    if layout:
        _check_layout(a, b, out, n, k)
    if pointers:
        _check_pointers(a, sa, b, sb, out, ((masked_m, "masked_m"),))
    return num_groups, m_max, n, k


def check_expected_m(expected_m: object) -> None:
    """``expected_m`` must be a Python int (not bool) > 0: a host-side hint, never a tensor."""
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise TypeError(f"expected_m must be an int, got {type(expected_m).__name__} ({expected_m!r})")
    if expected_m <= 0:
        raise ValueError(f"expected_m must be positive, got {expected_m=}")
