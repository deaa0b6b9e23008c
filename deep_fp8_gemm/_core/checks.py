"""Argument-check primitives shared by the op families, their fake (meta) kernels and the exact references.

Errors: ``TypeError`` for a wrong Python type or dtype, ``ValueError`` for a wrong rank, shape, stride,
device, alignment or value; every message names the argument in the user's terms (``lhs[0] (A)``,
``lhs[1] (sA)``, ``rhs[0] (B)``, ``rhs[1] (sB)``, ``out`` / ``d``, ...) and the offending values.

Three levels, because they run in three places (every family's ``check`` takes the same two flags):

* always (``check(..., layout=False, pointers=False)``, what the references run): types, dtypes, ranks, exact
  shapes including the scale shapes, one device for every tensor, ``k >= 1``.
* ``layout=True`` (the ops and their fake kernels): the kernels' contract on top of that (:func:`check_tma_layout`)
  — A and B K-major (``stride(-1) == 1``), out row-major, every other stride a positive multiple of 16 bytes
  (TMA's global-stride rule), ``n % 8 == 0`` and ``k % 16 == 0`` (so that the contiguous tensors meet it), and
  the family's own layout rules.
* ``pointers=True`` (real kernels only; fake tensors have no storage, :func:`check_pointers`): ``data_ptr`` of
  A, B and out 16-byte aligned, and out's bytes not overlapping any input.

Cost: a few dozen attribute reads per call, no loops over elements and no device synchronisation — the values
of m_indices / masked_m / group ends are never read here. The grouped families check those values separately
(their ``check_*_values``), where :func:`runtime.target.layout_values_checked
<deep_fp8_gemm.runtime.target.layout_values_checked>` says so.

Meta tensors (no storage) get the shape-only path: every check above but :func:`check_pointers`, then nothing is
computed (:func:`is_meta`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..constants import GRAN_K, TMA_ALIGN_BYTES
from ..utils import ceil_div

FP8 = torch.float8_e4m3fn
INDEX_DTYPE = torch.int32
#: The operands' names in messages, in the order of the ops' ``(lhs, rhs, out)`` arguments.
OPERAND_NAMES = ("lhs[0] (A)", "lhs[1] (sA)", "rhs[0] (B)", "rhs[1] (sB)", "out")


class Problem(NamedTuple):
    """What a family's ``check`` returns: the GEMM's extents. ``m`` is the rows of one group's output (dense:
    m; contiguous / psum: m_sum, all groups' rows; masked: m_max per group; 1D1D: m; k-grouped: m of every
    group), ``k`` the reduction length (k-grouped: ``sum(ks)``), ``groups`` G (1 for the dense kinds)."""

    m: int
    n: int
    k: int
    groups: int = 1

    @property
    def empty(self) -> bool:
        """Nothing to compute (the ops then leave the output untouched)."""
        return self.m == 0 or self.n == 0


def is_meta(t: torch.Tensor) -> bool:
    """A tensor without storage (``device="meta"``): the ops check its metadata and compute nothing."""
    return t.device.type == "meta"


def capturing() -> bool:
    """A CUDA graph is being captured on the current stream (False in a CPU-only torch)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def unpack_pair(pair: object, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``pair`` must be a 2-tuple/list ``(data, scales)``; returns it as a tuple."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (tensor, scales) pair, got {type(pair).__name__}")
    return pair[0], pair[1]


def check_is_tensor(t: object, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_tensor(t: object, name: str, dtype: torch.dtype, rank: int) -> None:
    """A tensor of exactly ``dtype`` and ``rank``."""
    check_is_tensor(t, name)
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {name}.dtype={t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got {name}.shape={tuple(t.shape)}")


def check_shape(t: torch.Tensor, name: str, expected: tuple[int, ...], what: str) -> None:
    """``t.shape == expected``; ``what`` spells the expected shape (``"[m, ceil(k/128)]"``)."""
    if t.shape != expected:
        raise ValueError(f"{name} must have shape {what}={expected}, got {name}.shape={tuple(t.shape)}")


def check_same_device(device: torch.device, named: tuple[tuple[torch.Tensor, str], ...], first: str = "lhs[0]"
                      ) -> None:
    """Every tensor of ``named`` on ``device`` (the device of the argument called ``first``)."""
    for t, name in named:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device: {first} is on {device}, {name} on {t.device}")


def check_row_major_tma(t: torch.Tensor, name: str) -> None:
    """Last dim contiguous, every other stride a positive multiple of 16 bytes (empty tensors pass)."""
    if t.numel() == 0:
        return
    strides = t.stride()
    if strides[-1] != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got {name}.stride()={strides}")
    size = t.element_size()
    for s in strides[:-1]:
        if s <= 0 or (s * size) % TMA_ALIGN_BYTES != 0:
            raise ValueError(
                f"{name}'s leading strides must be positive multiples of {TMA_ALIGN_BYTES} bytes, "
                f"got {name}.stride()={strides} with element_size={size}"
            )


def check_not_self_overlapping(t: torch.Tensor, name: str) -> None:
    """No two elements of the output ``t`` share memory (a layout-level rule: strides only, no pointer). Sorting the
    dimensions of size > 1 by stride, each stride must be at least one past the extent of the dimensions inside it:
    ``stride >= 1 + Σ (size - 1) · stride`` over the smaller-stride ones (a zero stride is an overlap). torch's own
    ``out=`` ops accept such views and keep the last write; a kernel writing tiles in parallel gives a race."""
    dims = sorted((stride, size, d) for d, (size, stride) in enumerate(zip(t.shape, t.stride())) if size > 1)
    extent = 0  # elements spanned by the dimensions already seen, minus one
    for stride, size, d in dims:
        if stride <= extent:
            raise ValueError(
                f"{name} overlaps itself: with shape {tuple(t.shape)} and strides {t.stride()}, dim {d} (stride "
                f"{stride}) steps inside the {extent + 1} elements its inner dims span, so outputs would share "
                f"memory; pass a tensor whose elements are distinct (a contiguous tensor, or a column slice of a "
                f"wider buffer)")
        extent += (size - 1) * stride


def check_divisibility(n: int, k: int) -> None:
    """``n % 8 == 0`` and ``k % 16 == 0``: 16-byte rows of the contiguous bf16 D / fp8 A and B (TMA)."""
    if n % 8 != 0 or k % 16 != 0:
        raise ValueError(f"n must be a multiple of 8 and k a multiple of 16 (TMA 16-byte rows), got {n=} {k=}")


def check_aligned_ptr(t: torch.Tensor, name: str, alignment: int = TMA_ALIGN_BYTES) -> None:
    if t.numel() > 0 and t.data_ptr() % alignment != 0:
        raise ValueError(f"{name}.data_ptr() must be {alignment}-byte aligned, got {t.data_ptr():#x}")


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, last byte + 1)`` of a non-empty tensor."""
    start = t.data_ptr()
    if t.is_contiguous():  # the common case, without a Python loop over dims
        return start, start + t.numel() * t.element_size()
    span = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    return start, start + span * t.element_size()


def byte_span(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    lo, hi = byte_range(t)
    return hi - lo


def check_no_overlap(out: torch.Tensor, named: tuple[tuple[torch.Tensor, str], ...], out_name: str = "out") -> None:
    """``out``'s bytes overlap none of ``named`` (empty tensors never overlap)."""
    if out.numel() == 0:
        return
    lo, hi = byte_range(out)
    for t, name in named:
        if t.numel() == 0:
            continue
        t_lo, t_hi = byte_range(t)
        if lo < t_hi and t_lo < hi:
            raise ValueError(f"{out_name} must not overlap {name}: {out_name} bytes [{lo:#x}, {hi:#x}), {name} bytes "
                             f"[{t_lo:#x}, {t_hi:#x})")


class Granularity(NamedTuple):
    """A kind's scale blocks (the kinds table's granularity traits): ``k`` K elements per scale of A and B, ``n``
    rows of B per scale block."""

    k: int
    n: int

    def dims(self, what: str) -> str:
        """``ceil(what/k)`` (or ``ceil(what/n)`` for ``what == "n"``) as the shape messages spell it."""
        return f"ceil({what}/{self.n if what == 'n' else self.k})"


#: DeepSeek-V3's recipe (1, 128, 128): 1x128 per-token scales on A, 128x128 block scales on B.
BLOCK128 = Granularity(GRAN_K, GRAN_K)


def check_operand_a_2d(a: torch.Tensor, sa: torch.Tensor, rows: str, gran: Granularity = BLOCK128
                       ) -> tuple[int, int, int]:
    """A ``[rows, k]`` e4m3 and sA ``[rows, ceil(k/gran.k)]`` fp32 (``rows`` names the row count in messages);
    returns ``(rows, k, ceil(k/gran.k))``."""
    check_tensor(a, "lhs[0] (A)", FP8, 2)
    num_rows, k = a.shape
    if k <= 0:
        raise ValueError(f"k must be positive, got lhs[0] (A).shape={tuple(a.shape)}")
    kb = ceil_div(k, gran.k)
    check_tensor(sa, "lhs[1] (sA)", torch.float32, 2)
    check_shape(sa, "lhs[1] (sA)", (num_rows, kb), f"[{rows}, {gran.dims('k')}]")
    return num_rows, k, kb


def check_operand_b_blocks(b: torch.Tensor, sb: torch.Tensor, k: int, kb: int, num_groups: int | None,
                           gran: Granularity = BLOCK128) -> int:
    """B ``[n, k]`` / ``[G, n, k]`` e4m3 with block scales sB ``[ceil(n/gran.n), kb]`` / ``[G, ceil(n/gran.n), kb]``
    (128x128 blocks, or 32x32 for the 1x32/32x32 recipe); returns n."""
    rank = 2 if num_groups is None else 3
    check_tensor(b, "rhs[0] (B)", FP8, rank)
    check_tensor(sb, "rhs[1] (sB)", torch.float32, rank)
    n = b.size(-2)
    lead = () if num_groups is None else (num_groups,)
    dims = "[n, k]" if num_groups is None else "[G, n, k]"
    check_shape(b, "rhs[0] (B)", lead + (n, k), dims)
    nb = ceil_div(n, gran.n)
    sdims = f"[{gran.dims('n')}, {gran.dims('k')}]"
    check_shape(sb, "rhs[1] (sB)", lead + (nb, kb), sdims if num_groups is None else "[G, " + sdims[1:])
    return n


def check_tma_layout(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, n: int, k: int, out_name: str = "out"
                     ) -> None:
    """The 1D2D kernels' stride rules: ``n % 8``, ``k % 16``, A / B K-major and out row-major with 16-byte
    leading strides (see the module docstring)."""
    check_divisibility(n, k)
    check_row_major_tma(a, "lhs[0] (A)")
    check_row_major_tma(b, "rhs[0] (B)")
    check_row_major_tma(out, out_name)


def check_pointers(a, sa, b, sb, out, extra: tuple[tuple[torch.Tensor, str], ...] = (), out_name: str = "out"
                   ) -> None:
    """16-byte-aligned data pointers of A, B and out; out overlapping none of the operands nor ``extra``. Meta
    tensors have no pointers (every ``data_ptr()`` is 0): nothing to check."""
    if is_meta(a):
        return
    check_aligned_ptr(a, "lhs[0] (A)")
    check_aligned_ptr(b, "rhs[0] (B)")
    check_aligned_ptr(out, out_name)
    check_no_overlap(out, ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")) + extra,
                     out_name)


def check_expected_m(expected_m: object, name: str = "expected_m") -> int:
    """``expected_m`` must be a Python int (not bool) > 0: a host-side hint, never a tensor. Returns it."""
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise TypeError(f"{name} must be an int, got {type(expected_m).__name__} ({expected_m!r})")
    if expected_m <= 0:
        raise ValueError(f"{name} must be positive, got {name}={expected_m}")
    return expected_m


def check_bool(value: object, name: str) -> bool:
    """``value`` must be a bool (not an int); returns it."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return value


def check_group_values(values: list[int], minimum: int, maximum: int, name: str) -> None:
    """Host-side value check of a grouped layout tensor read on the CPU: every value in ``[minimum, maximum]``."""
    for g, value in enumerate(values):
        if not minimum <= value <= maximum:
            raise ValueError(f"{name}[{g}] must be in [{minimum}, {maximum}], got {value}")


# ---------------------------------------------------------------------------------------------- fp32 D and C
def check_fp32_out(d: object, accumulates: str) -> None:
    """``d`` is an fp32 tensor (``accumulates``: which kernel accumulates in fp32, for the message)."""
    check_is_tensor(d, "d")
    if d.dtype != torch.float32:
        raise TypeError(f"d must be torch.float32 ({accumulates} accumulates in fp32), got d.dtype={d.dtype}")


def check_fp32_c(c: object, d: torch.Tensor, shape_doc: str) -> None:
    """``c`` is None or an fp32 tensor of d's shape (``shape_doc``: d's documented shape, e.g. ``[m, n]``)."""
    if c is None:
        return
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"c must be a torch.Tensor or None, got {type(c).__name__}")
    if c.dtype != torch.float32:
        raise TypeError(f"c must be torch.float32, got c.dtype={c.dtype}")
    if c.shape != d.shape:
        raise ValueError(f"c must have d's shape {shape_doc}={tuple(d.shape)}, got c.shape={tuple(c.shape)}")


def check_c_layout(c: torch.Tensor | None, d: torch.Tensor, check_separate) -> None:
    """The in-place-or-separate rule of the fp32-accumulating kinds: ``c`` is None, ``d`` itself (in place: same
    strides), or a separate tensor that passes ``check_separate(c)``, is TMA-aligned and does not overlap ``d``."""
    if c is not None and c.data_ptr() != d.data_ptr():
        check_separate(c)
        check_aligned_ptr(c, "c")
        check_no_overlap(d, ((c, "c (pass c=d to accumulate in place)"),), "d")
    elif c is not None and c.stride() != d.stride():
        raise ValueError(f"c starts where d does but has other strides: c.stride()={c.stride()}, "
                         f"d.stride()={d.stride()}; pass c=d to accumulate in place")
