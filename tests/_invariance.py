"""Batch-invariance fixtures shared by the CPU and simulator tests (issue 37): target rows whose exact products cancel
(so the result is the rounding residue of the order in which partial sums are added), random target rows, and
batches that place them among different neighbours."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn


def cancelling_operands(k: int, n: int, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    """``(A [rows, k], sA, B [n, k], sB)``: A's rows are ``[u, -u]`` (the two K halves), B's rows ``[v, v]``, the scales
    of both halves equal, so every exact dot product is 0 and what a kernel returns is the residue of its summation
    order: a K split into the two halves sums to 0, one accumulator over both does not (in general). ``k`` a multiple
    of 256."""
    g = torch.Generator().manual_seed(seed)
    half = k // 2
    u = (torch.randn(rows, half, generator=g) * 3).to(FP8)
    v = (torch.randn(n, half, generator=g) * 3).to(FP8)
    a = torch.cat([u.view(torch.uint8), (-u.float()).to(FP8).view(torch.uint8)], 1).view(FP8)
    b = torch.cat([v.view(torch.uint8), v.view(torch.uint8)], 1).view(FP8)
    kb = k // 128
    sa = (2.0 ** torch.randint(-3, 3, (rows, 1), generator=g).float()).expand(rows, kb).contiguous()
    nb = -(-n // 128)
    sb = (2.0 ** torch.randint(-3, 3, (nb, 1), generator=g).float()).expand(nb, kb).contiguous()
    sa = sa * (1 + torch.rand(rows, 1, generator=g))  # not powers of two: the promotion's products round
    return a, sa, b, sb


def random_rows(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` e4m3 rows with their 1x128 scales (random magnitudes)."""
    from deep_fp8_gemm import per_token_cast_to_fp8

    g = torch.Generator().manual_seed(seed)
    return per_token_cast_to_fp8(torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g).add(0.1) * 4)


def embed(target: tuple[torch.Tensor, torch.Tensor], batch: int, at: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A batch of ``batch`` rows with ``target``'s rows at ``at``, ``at + 1``, ... and random neighbours elsewhere."""
    a_t, sa_t = target
    a, sa = random_rows(batch, a_t.shape[1], seed)
    a, sa = a.clone(), sa.contiguous().clone()
    a[at: at + a_t.shape[0]] = a_t
    sa[at: at + a_t.shape[0]] = sa_t
    return a, sa


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (so that NaN payloads and signed zeros compare too)."""
    return t.clone(memory_format=torch.contiguous_format).view(-1).view(torch.uint8)


def run_rows(kind: str, target: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
             batch: int, at: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Run ``kind``'s public op on a batch of ``batch`` rows holding ``target``'s rows at ``at`` (for the grouped
    layouts: in group 0, whose weights ``rhs`` are; the other groups get other weights and rows), and return the
    bytes of the target rows' outputs (D, and sD for the FP8 outputs), on the CPU. ``rhs`` is B ``[n, k]`` and its block
    scales; ``batch >= at + rows of target``; the operands are built on the CPU and run on ``device``."""
    from deep_fp8_gemm import ops
    from deep_fp8_gemm.kinds import TABLE
    from deep_fp8_gemm.ops.outputs import empty_out

    row, family = TABLE.row(kind), ops.FAMILIES[kind]
    t = target[0].shape[0]
    assert batch >= at + t, (batch, at, t)
    b, sb = rhs
    n, k = b.shape
    g = torch.Generator().manual_seed(seed + 7)
    other = (torch.randn(n, k, generator=g) * 2).to(FP8), sb * 2
    if row.layout == "dense":
        a, sa = embed(target, batch, at, seed)
        if TABLE.traits(kind, "granularity")["gran_k"] == 32:  # the 1x32 / 32x32 recipe: the same values, its scales
            kb = -(-k // 32)
            sa, sb = sa.repeat_interleave(4, 1)[:, :kb], sb.repeat_interleave(4, 0).repeat_interleave(4, 1)[
                : -(-n // 32), :kb]
        lhs, weights, extra, sel = (a, sa), (b, sb), (), slice(at, at + t)
    elif row.layout in ("contiguous", "psum"):
        align = 128
        count0 = batch  # group 0's rows, then one more group of 40 rows
        seg0 = (count0 + align - 1) // align * align
        a0, sa0 = embed(target, count0, at, seed)
        a1, sa1 = random_rows(40, k, seed + 1)
        m_sum = seg0 + align
        a = torch.zeros(m_sum, k, dtype=FP8)
        sa = torch.ones(m_sum, sa0.shape[1])
        a[:count0], sa[:count0], a[seg0: seg0 + 40], sa[seg0: seg0 + 40] = a0, sa0, a1, sa1
        weights = (torch.stack([b, other[0]]), torch.stack([sb, other[1]]))
        if row.layout == "contiguous":
            idx = torch.full((m_sum,), -1, dtype=torch.int32)
            idx[:count0], idx[seg0: seg0 + 40] = 0, 1
            extra = (idx,)
        else:
            extra = (torch.tensor([count0, seg0 + 40], dtype=torch.int32),)
        lhs, sel = (a, sa), slice(at, at + t)
    else:  # masked: group 0 holds the batch, group 1 other rows; m_max past both
        m_max = max(batch, 24) + 16
        a = torch.zeros(2, m_max, k, dtype=FP8)
        sa = torch.ones(2, m_max, k // 128)
        a[0, :batch], sa[0, :batch] = embed(target, batch, at, seed)
        a1, sa1 = random_rows(24, k, seed + 1)
        a[1, :24], sa[1, :24] = a1, sa1
        lhs = (a, sa)
        weights = (torch.stack([b, other[0]]), torch.stack([sb, other[1]]))
        extra, sel = (torch.tensor([batch, 24], dtype=torch.int32), batch), (0, slice(at, at + t))
    if family.output.name == "swiglu_fp8":
        from deep_fp8_gemm.ops.outputs import interleave_swiglu_weights

        w = weights[0] if weights[0].dim() == 3 else weights[0][None]
        s = weights[1] if weights[1].dim() == 3 else weights[1][None]
        weights = tuple(interleave_swiglu_weights(w, s))
    lead = (2,) if row.layout == "masked" else ()
    rows_out = lhs[0].shape[-2]
    move = (lambda x: x.to(device) if isinstance(x, torch.Tensor) else x)
    lhs, weights, extra = tuple(map(move, lhs)), tuple(map(move, weights)), tuple(map(move, extra))
    if family.output.arity == 1:
        out = torch.full((*lead, rows_out, n), float("nan"), dtype=torch.bfloat16, device=device)
        family.public(lhs, weights, out, *extra)
        return (bits(out[sel].cpu()),)
    d, sd = empty_out(lead, rows_out, family.output.n_out(n), device)
    family.public(lhs, weights, (d, sd), *extra)
    return bits(d[sel].cpu()), bits(sd[sel].cpu())
