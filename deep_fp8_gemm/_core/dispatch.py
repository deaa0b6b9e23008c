"""What every op entry point does before its family's checks: the eager test, operand unpacking, the
normalisation of scales into the layout the kernels read, and the in-place accumulation alias rule.
"""

from __future__ import annotations

import torch

from ..utils import empty_m_major, get_col_major_tma_aligned_tensor
from .checks import OPERAND_NAMES, check_is_tensor, unpack_pair

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


def eager(*tensors: object) -> bool:
    """True when a call may skip the ``torch.library`` dispatcher (~5 µs of the per-call host time that a
    ~10 µs decode GEMM cannot afford) and take the per-call fast path: not tracing, no dispatch mode active
    (fake / meta / functional modes), plain tensors only. Otherwise the custom op runs, so compiled and
    exported code still sees one node per op. ``None`` arguments (absent optional tensors) are allowed."""
    if _is_compiling() or _dispatch_depth():
        return False
    for t in tensors:
        if t is not None and type(t) is not _Tensor:
            return False
    return True


def operands(lhs, rhs, out, *extra: tuple[object, str], out_name: str = "out") -> tuple[torch.Tensor, ...]:
    """Unpack ``lhs`` / ``rhs`` into ``(A, sA, B, sB)`` and require tensors everywhere (``extra``: more
    ``(value, name)`` pairs). The dispatcher would reject a non-tensor with a RuntimeError; users get a
    TypeError naming it."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    names = OPERAND_NAMES[:4] + (out_name,)
    for t, name in (*zip((a, sa, b, sb, out), names), *extra):
        check_is_tensor(t, name)
    return a, sa, b, sb


def normalise_scales(s: torch.Tensor) -> torch.Tensor:
    """1x128 scales in the M-major TMA-aligned layout the kernels' tensor maps read, at a 16-byte-aligned
    address (a copy unless they already are; ``per_token_cast_to_fp8`` returns them so)."""
    s = get_col_major_tma_aligned_tensor(s)
    if s.numel() > 0 and s.data_ptr() % 16 != 0:
        aligned = empty_m_major(tuple(s.shape), s.device)
        aligned.copy_(s)
        s = aligned
    return s


def accumulates_in_place(c: object, d: object) -> bool:
    """True when ``c`` is ``d`` for the fp32-accumulating kinds: the same object, or (eager tensors) a tensor with
    d's data pointer, shape and strides — so ``D = C + A·Bᵀ`` is an in-place accumulation into ``d``."""
    if c is d:
        return True
    return (isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor) and eager(c, d) and c.numel() > 0
            and c.data_ptr() == d.data_ptr() and c.shape == d.shape and c.stride() == d.stride())


def accumulator(c: torch.Tensor | None, d: torch.Tensor) -> torch.Tensor:
    """The C a fp32-accumulating kernel reads (it always reads one): ``c``, or ``d`` zeroed when ``c`` is None
    (``D = 0 + A·Bᵀ``)."""
    if c is None:
        d.zero_()
        return d
    return c
