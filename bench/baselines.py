"""What a user has today, and the float64 references every implementation is checked against.

Each builder returns an :class:`Impl`: a callable, its rotated argument copies, and how to read the valid
rows of its output. A builder raises :class:`Unsupported` (reported as "n/a", never a crash) when this torch /
cuBLAS cannot run it.

- ``cublas_block``: ``torch._scaled_mm(A, B.t(), scale_a, scale_b, out_dtype=bf16)`` with the same 1x128 /
  128x128 block scales (cuBLASLt >= 12.9, torch >= 2.9, sm_90). ``scale_a`` is ``[M, K/128]`` with strides
  ``(1, M)``, ``scale_b`` is ``sB.t()`` (``[K/128, N/128]``, strides ``(1, K/128)``). cuBLAS has given silent
  wrong answers unless M % 4 == 0 and K % 512 == 0: M is padded to a multiple of 4 with zero rows (the
  padded call is what is timed), and its output is checked like every other implementation's. Grouped: a
  Python loop of that call over the experts' valid rows (host-side counts; not graph-capturable).
- ``bf16_matmul``: ``torch.mm`` (grouped: a loop of it, or ``torch.bmm`` for the masked layout) on the
  dequantised operands in bf16 — what FP8 has to beat.
- ``scaled_grouped_mm_rowwise``: ``torch._scaled_grouped_mm`` with row-wise scales (one per row of A and per
  row of each B): **different, coarser scaling**, so it is compared against its own float64 reference and
  labelled as such.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


class Unsupported(RuntimeError):
    """This baseline cannot run with this torch / cuBLAS / device; the reason is the message."""


@dataclasses.dataclass
class Impl:
    """One implementation of one benchmark case.

    ``fn(*args)`` runs it and returns its output (whatever ``valid`` reads); ``arg_sets`` are independent
    copies for input rotation; ``valid(output)`` gives the valid rows as ``[rows, n]`` to compare with
    ``reference`` (float64, same rows); ``poison(args)`` NaN-fills preallocated outputs before the check;
    ``threshold``: the calc_diff it must stay below (None: ``timing.CHECK_THRESHOLD``; the MoE layer, checked
    against the bf16 layer, needs a looser one).
    """

    name: str
    fn: Callable[..., object]
    arg_sets: list[tuple]
    valid: Callable[[object], torch.Tensor]
    reference: torch.Tensor
    poison: Callable[[tuple], None] | None = None
    note: str = ""
    threshold: float | None = None


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def copies(tensors: Sequence[torch.Tensor], n: int) -> list[tuple]:
    """``n`` argument tuples: the originals, then ``n - 1`` clones of each tensor (rotation)."""
    sets = [tuple(tensors)]
    for _ in range(n - 1):
        sets.append(tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in tensors))
    return sets


def rotation_count(bytes_per_set: int, quick: bool) -> int:
    """Enough copies that one rotation cycle spans > 2x the 60 MB L2 (cap 8; 2 minimum; --quick caps at 4)."""
    need = -(-(120 << 20) // max(bytes_per_set, 1)) + 1
    return max(2, min(need, 4 if quick else 8))


# --- references -------------------------------------------------------------------------------------------

def dequant_a(a: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
    """float32 dequantised activations (``deep_fp8_gemm.reference.dequantize_per_token``)."""
    from deep_fp8_gemm.reference import dequantize_per_token

    return dequantize_per_token(a, sa)


def dequant_b(b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """float32 dequantised weights (``deep_fp8_gemm.reference.dequantize_per_block``)."""
    from deep_fp8_gemm.reference import dequantize_per_block

    return dequantize_per_block(b, sb)


def reference_nt(a_deq: torch.Tensor, b_deq: torch.Tensor) -> torch.Tensor:
    """float64 ``a_deq @ b_deq.T``: the same math as ``deep_fp8_gemm.reference`` without its fp32 rounding,
    computed on the operands' device (a CPU reference would take minutes for the large shapes)."""
    return a_deq.double() @ b_deq.double().t()


# --- block-scaled cuBLAS ----------------------------------------------------------------------------------

def _scaled_mm_args(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> tuple:
    """``(A padded to M % 4 == 0, B.t(), scale_a M-major, scale_b = sB.t())`` for ``torch._scaled_mm``;
    ``sa`` row-major ``[m, kb]``, ``sb`` ``[nb, kb]``."""
    m, k = a.shape
    if k % 512:
        raise Unsupported(f"k={k} is not a multiple of 512 (cuBLAS block scaling is unsafe there)")
    m4 = _align(max(m, 1), 4)
    if m4 != m:
        a = torch.cat([a, torch.zeros(m4 - m, k, dtype=a.dtype, device=a.device)])
        sa = torch.cat([sa, torch.ones(m4 - m, sa.size(1), dtype=sa.dtype, device=sa.device)])
    scale_a = sa.t().contiguous().t()  # [m4, kb], strides (1, m4)
    scale_b = sb.contiguous().t()      # [kb, nb], strides (1, kb)
    return a.contiguous(), b.contiguous().t(), scale_a, scale_b


def _scaled_mm(a, bt, scale_a, scale_b):
    return torch._scaled_mm(a, bt, scale_a, scale_b, out_dtype=torch.bfloat16)


def _probe(fn: Callable[..., object], args: tuple, what: str) -> None:
    if not hasattr(torch, "_scaled_mm"):
        raise Unsupported("torch has no _scaled_mm")
    try:
        fn(*args)
        if args and isinstance(args[0], torch.Tensor) and args[0].is_cuda:
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure means "not supported here"
        first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise Unsupported(f"{what}: {type(exc).__name__}: {first_line}") from exc


def cublas_block_dense(a, sa, b, sb, ref: torch.Tensor, n_copies: int) -> Impl:
    """Block-scaled ``torch._scaled_mm`` for one dense GEMM (``sa`` row-major ``[m, kb]``)."""
    m = a.size(0)
    args = _scaled_mm_args(a, sa, b, sb)
    _probe(_scaled_mm, args, "torch._scaled_mm (1x128 x 128x128 block scales)")
    # Rotation: clone the storage and rebuild the views (B.t(), M-major scale_a).
    sets = [args]
    for _ in range(n_copies - 1):
        a_c, bt, scale_a, scale_b = args
        sets.append((a_c.clone(), bt.t().clone().t(), scale_a.t().clone().t(), scale_b.t().clone().t()))
    note = f"M padded {m}->{args[0].size(0)}" if args[0].size(0) != m else ""
    return Impl("cublas_block", _scaled_mm, sets, lambda out: out[:m], ref, note=note)


def cublas_block_loop(groups: Sequence[tuple], ref: torch.Tensor, n_copies: int) -> Impl:
    """A loop of block-scaled ``torch._scaled_mm`` over experts; ``groups`` = ``[(a_g, sa_g, b_g, sb_g)]``
    holding each expert's valid rows (row-major ``sa_g``). Output: the valid rows of every expert, in order."""
    per_group = [_scaled_mm_args(*g) for g in groups if g[0].size(0) > 0]
    rows = [g[0].size(0) for g in groups if g[0].size(0) > 0]
    if per_group:
        _probe(_scaled_mm, per_group[0], "torch._scaled_mm (1x128 x 128x128 block scales)")

    def loop(*flat):
        return [_scaled_mm(*flat[i:i + 4]) for i in range(0, len(flat), 4)]

    def valid(outs):
        return torch.cat([o[:r] for o, r in zip(outs, rows)])

    flat = tuple(t for g in per_group for t in g)
    sets = [flat]
    for _ in range(n_copies - 1):
        clone = []
        for a_c, bt, scale_a, scale_b in per_group:
            clone += [a_c.clone(), bt.t().clone().t(), scale_a.t().clone().t(), scale_b.t().clone().t()]
        sets.append(tuple(clone))
    padded = sum(g[0].size(0) for g in per_group) != sum(rows)
    note = f"loop over {len(per_group)} experts" + (", M padded to 4 per expert" if padded else "")
    return Impl("cublas_block", loop, sets, valid, ref, note=note)


# --- bf16 ---------------------------------------------------------------------------------------------------

def bf16_dense(a_deq: torch.Tensor, b_deq: torch.Tensor, ref: torch.Tensor, n_copies: int) -> Impl:
    """``torch.mm(A_bf16, B_bf16.t())`` on the dequantised operands."""
    a16, b16 = a_deq.to(torch.bfloat16), b_deq.to(torch.bfloat16)
    out = torch.empty(a16.size(0), b16.size(0), dtype=torch.bfloat16, device=a16.device)

    def mm(a, b, o):
        return torch.mm(a, b.t(), out=o)

    return Impl("bf16_matmul", mm, copies((a16, b16, out), n_copies), lambda o: o, ref,
                poison=lambda args: args[2].fill_(float("nan")))


def bf16_loop(a_deq_groups: Sequence[torch.Tensor], b_deq: torch.Tensor, ref: torch.Tensor, n_copies: int) -> Impl:
    """A loop of ``torch.mm`` per expert (valid rows only), bf16 operands."""
    a16 = [a.to(torch.bfloat16) for a in a_deq_groups]
    b16 = b_deq.to(torch.bfloat16)
    keep = [g for g, a in enumerate(a16) if a.size(0) > 0]

    def loop(b, *a_list):
        return [torch.mm(a, b[g].t()) for g, a in zip(keep, a_list)]

    sets = copies((b16, *[a16[g] for g in keep]), n_copies)
    return Impl("bf16_matmul", loop, sets, lambda outs: torch.cat(outs), ref, note=f"loop over {len(keep)} experts")


def bf16_bmm(a_deq: torch.Tensor, b_deq: torch.Tensor, valid_rows: int, ref: torch.Tensor, n_copies: int) -> Impl:
    """``torch.bmm`` over ``[G, m_max, k] x [G, k, n]`` (computes all m_max rows; valid = the first
    ``valid_rows`` of each group)."""
    a16, b16 = a_deq.to(torch.bfloat16), b_deq.to(torch.bfloat16)

    def bmm(a, b):
        return torch.bmm(a, b.transpose(1, 2))

    return Impl("bf16_matmul", bmm, copies((a16, b16), n_copies),
                lambda o: o[:, :valid_rows].reshape(-1, o.size(-1)), ref, note="torch.bmm over all m_max rows")


# --- row-wise torch._scaled_grouped_mm (different scaling) -------------------------------------------------

def rowwise_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp32 scale per row (last dim): ``(x_fp8, scale[...])`` with ``x ≈ x_fp8 · scale[..., None]``."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-4) / FP8_MAX
    return (x / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def scaled_grouped_mm_rowwise(x_valid: torch.Tensor, w: torch.Tensor, counts: Sequence[int] | None,
                              n_copies: int) -> Impl:
    """``torch._scaled_grouped_mm`` with row-wise scales.

    Contiguous (``counts`` given): ``x_valid`` ``[sum(counts), k]`` (valid rows only, experts in order),
    ``offs`` = cumulative counts. Masked (``counts`` None): ``x_valid`` ``[G, m, k]``, 3-D x 3-D.
    ``w`` ``[G, n, k]``. Checked against a float64 product of its own dequantised operands.
    """
    if not hasattr(torch, "_scaled_grouped_mm"):
        raise Unsupported("torch has no _scaled_grouped_mm")
    a, sa = rowwise_quant(x_valid)
    b, sb = rowwise_quant(w)
    a_deq = a.float() * sa.unsqueeze(-1)
    b_deq = b.float() * sb.unsqueeze(-1)
    bt = b.transpose(-2, -1)  # [G, k, n], column-major per group
    if counts is not None:
        offs = torch.tensor(counts, device=a.device, dtype=torch.int64).cumsum(0).to(torch.int32)
        ref_parts, start = [], 0
        for g, c in enumerate(counts):
            ref_parts.append(a_deq[start:start + c].double() @ b_deq[g].double().t())
            start += c
        ref = torch.cat(ref_parts)

        def call(a_, bt_, sa_, sb_, offs_):
            return torch._scaled_grouped_mm(a_, bt_, sa_, sb_, offs=offs_, out_dtype=torch.bfloat16)

        args = (a, bt, sa, sb, offs)
        valid = lambda o: o  # noqa: E731
    else:
        ref = torch.bmm(a_deq.double(), b_deq.double().transpose(1, 2)).reshape(-1, w.size(1))

        def call(a_, bt_, sa_, sb_):
            return torch._scaled_grouped_mm(a_, bt_, sa_, sb_, out_dtype=torch.bfloat16)

        args = (a, bt, sa, sb)
        valid = lambda o: o.reshape(-1, o.size(-1))  # noqa: E731
    try:
        call(*args)
        if a.is_cuda:
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure means "not supported here"
        msg = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise Unsupported(f"torch._scaled_grouped_mm (row-wise): {type(exc).__name__}: {msg}") from exc
    sets = [args]
    for _ in range(n_copies - 1):
        sets.append((a.clone(), bt.transpose(-2, -1).clone().transpose(-2, -1), sa.clone(), sb.clone(), *args[4:]))
    return Impl("scaled_grouped_mm_rowwise", call, sets, valid, ref,
                note="row-wise scales (different scaling), own reference")
