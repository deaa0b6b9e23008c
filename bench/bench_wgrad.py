"""Weight-gradient (1D1D) FP8 GEMM benchmark: ``fp8_gemm_nt(..., recipe=(1, 1, 128))`` (fp32 ``D = C + A·Bᵀ``,
per-row scales on both operands) against the 1D2D kernel at the same shape (issue 15's target: the 1D1D kernel
at >= 90% of the 1D2D kernel's TFLOPS) and a bf16 matmul; and (``--family k_grouped``) the k-grouped MoE weight
gradient ``k_grouped_fp8_gemm_nt_contiguous`` (one launch for all experts) against a per-expert loop of the 1D1D
kernel and a per-expert loop of bf16 matmuls.

    python -m bench.bench_wgrad [--family dense|k_grouped] [--smoke] [--quick] [--out DIR] [--time-budget S]

Shapes: DeepSeek-V3's dense weight gradients dW [N, K] = dYᵀ · X, i.e. m = N (out features), n = K (in
features), k = tokens. k_grouped: the routed experts' dW13 [2 x 2048, 7168] (m = 4096, n = 7168) and dW2
[7168, 2048] (m = 7168, n = 2048) for 8 local experts (256 routed experts over EP 32: ~T tokens per expert for T
tokens per rank), K_g = tokens routed to expert g from a seeded skewed routing, padded to 128 (one expert gets
none: an empty group). Writes ``<out>/wgrad.{json,md,png}`` / ``<out>/wgrad_k_grouped.*`` (see ``bench/report.py``).
Method: ``bench/timing.py``. Our impls read a zero C (a separate tensor, so repeated runs do not accumulate) and
write a NaN-poisoned D.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness
from .baselines import Impl
from .shapes import DenseShape, KGroupedShape

FP8_1D2D = "fp8_1d2d"
# (N out features, K in features) of DeepSeek-V3's dense layers (bench/shapes.py), x tokens.
WGRAD_WEIGHTS = ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))
TOKENS = (4096, 8192)
SMOKE = (DenseShape(128, 256, 256), DenseShape(77, 120, 384))


def wgrad_shapes(quick: bool) -> list[DenseShape]:
    return [DenseShape(n_out, k_in, t) for n_out, k_in in WGRAD_WEIGHTS for t in (TOKENS[:1] if quick else TOKENS)]


def build(shape: DenseShape, device: torch.device, n_copies: int):
    import deep_fp8_gemm as dfg

    gen = torch.Generator(device=device).manual_seed(zlib.crc32(("wgrad " + shape.label).encode()))
    x = torch.randn(shape.m, shape.k, device=device, generator=gen).to(torch.bfloat16)
    w = torch.randn(shape.n, shape.k, device=device, generator=gen).to(torch.bfloat16)
    a, sa = dfg.per_token_cast_to_fp8(x)
    b_row, sb_row = dfg.per_token_cast_to_fp8(w)
    a_deq = baselines.dequant_a(a, sa)
    b_row_deq = baselines.dequant_a(b_row, sb_row)

    def ours() -> Impl:
        def gemm(a, sa, b, sb, d, c):
            dfg.fp8_gemm_nt((a, sa), (b, sb), d, c=c, recipe=(1, 1, 128))
            return d

        sets = []
        for i in range(n_copies):
            clone = (lambda t: t) if i == 0 else (lambda t: t.clone())
            sets.append((clone(a), dfg.get_col_major_tma_aligned_tensor(clone(sa)), clone(b_row),
                         dfg.get_col_major_tma_aligned_tensor(clone(sb_row)),
                         torch.empty(shape.m, shape.n, device=device), torch.zeros(shape.m, shape.n, device=device)))
        return Impl(harness.OURS, gemm, sets, lambda d: d, baselines.reference_nt(a_deq, b_row_deq),
                    poison=lambda args: args[4].fill_(float("nan")))

    def fp8_1d2d() -> Impl:
        b_blk, sb_blk = dfg.per_block_cast_to_fp8(w)
        ref = baselines.reference_nt(a_deq, baselines.dequant_b(b_blk, sb_blk))

        def gemm(a, sa, b, sb, out):
            dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
            return out

        sets = [(a, dfg.get_col_major_tma_aligned_tensor(sa), b_blk, sb_blk,
                 torch.empty(shape.m, shape.n, dtype=torch.bfloat16, device=device)) for _ in range(n_copies)]
        return Impl(FP8_1D2D, gemm, sets, lambda out: out, ref, poison=lambda args: args[4].fill_(float("nan")),
                    note="the 1D2D kernel (128x128 B scales, bf16 D) at the same shape")

    return [
        (harness.OURS, ours),
        (FP8_1D2D, fp8_1d2d),
        ("bf16_matmul", lambda: baselines.bf16_dense(a_deq, b_row_deq, baselines.reference_nt(a_deq, b_row_deq),
                                                     n_copies)),
    ]


# --- k-grouped (MoE experts' weight gradients) ----------------------------------------------------------------
FP8_1D1D_LOOP = "fp8_1d1d_loop"
K_GROUPED_WEIGHTS = ((4096, 7168), (7168, 2048))  # (m, n) of dW13 and dW2 per expert
K_GROUPED_EXPERTS = 8
K_GROUPED_TOKENS = (4096, 8192)  # tokens per rank ~ tokens per local expert
K_GROUPED_SMOKE = (KGroupedShape(77, 120, (256, 0, 384, 128)), KGroupedShape(64, 48, (128, 256)))


def routed_ks(num_experts: int, tokens_per_expert: int, seed: int) -> tuple[int, ...]:
    """Tokens per expert of a skewed routing (log-normal expert popularity, sigma 0.4; expert 0 cold), each padded
    to a multiple of 128 (the contiguous layout's alignment); deterministic for ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    popularity = torch.exp(0.4 * torch.randn(num_experts, generator=gen))
    popularity[0] = 0.0
    counts = torch.multinomial(popularity / popularity.sum(), num_experts * tokens_per_expert, replacement=True,
                               generator=gen).bincount(minlength=num_experts)
    return tuple(-(-int(c) // 128) * 128 for c in counts)


def k_grouped_shapes(quick: bool) -> list[KGroupedShape]:
    return [KGroupedShape(m, n, routed_ks(K_GROUPED_EXPERTS, t, seed=m + t))
            for m, n in K_GROUPED_WEIGHTS for t in (K_GROUPED_TOKENS[:1] if quick else K_GROUPED_TOKENS)]


def build_k_grouped(shape: KGroupedShape, device: torch.device, n_copies: int):
    import deep_fp8_gemm as dfg

    m, n, ks = shape.m, shape.n, list(shape.ks)
    groups, k_sum = len(ks), sum(ks)
    offsets = [sum(ks[:g]) for g in range(groups)]
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(("wgrad_k " + shape.label).encode()))
    # dYᵀ [m, tokens] and Xᵀ [n, tokens], quantised 1x128 along the tokens: K_g % 128 == 0, so no scale block
    # crosses two experts and the columns of sA / sB are already the groups' side by side.
    a_full, sa = dfg.per_token_cast_to_fp8(torch.randn(m, k_sum, device=device, generator=gen).to(torch.bfloat16))
    b_full, sb = dfg.per_token_cast_to_fp8(torch.randn(n, k_sum, device=device, generator=gen).to(torch.bfloat16))
    a_deq, b_deq = baselines.dequant_a(a_full, sa), baselines.dequant_a(b_full, sb)

    def flat(x: torch.Tensor) -> torch.Tensor:  # group g's [rows, K_g] block, row-major, back to back
        return torch.cat([x[:, o:o + k].reshape(-1) for o, k in zip(offsets, ks)])

    a, b = flat(a_full), flat(b_full)
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device=device)
    reference = torch.cat([baselines.reference_nt(a_deq[:, o:o + k], b_deq[:, o:o + k]) for o, k in zip(offsets, ks)])
    zero_c = torch.zeros(groups, m, n, device=device)

    def ours() -> Impl:
        def gemm(a, sa, b, sb, d, c):
            dfg.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, ks_tensor, c)
            return d

        sets = [(a if i == 0 else a.clone(), dfg.get_col_major_tma_aligned_tensor(sa), b if i == 0 else b.clone(),
                 dfg.get_col_major_tma_aligned_tensor(sb), torch.empty(groups, m, n, device=device), zero_c)
                for i in range(n_copies)]
        return Impl(harness.OURS, gemm, sets, lambda d: d.reshape(groups * m, n), reference,
                    poison=lambda args: args[4].fill_(float("nan")), note=f"one launch, {groups} groups")

    def loop_1d1d() -> Impl:
        per_group = [(a[m * o:m * (o + k)].view(m, k), dfg.get_col_major_tma_aligned_tensor(sa[:, o // 128:(o + k) // 128]),
                      b[n * o:n * (o + k)].view(n, k), dfg.get_col_major_tma_aligned_tensor(sb[:, o // 128:(o + k) // 128]))
                     if k else None for o, k in zip(offsets, ks)]

        def gemm(d, c):
            for g, ops in enumerate(per_group):
                if ops is None:
                    d[g].copy_(c[g])
                else:
                    dfg.fp8_gemm_nt((ops[0], ops[1]), (ops[2], ops[3]), d[g], c=c[g], recipe=(1, 1, 128))
            return d

        sets = [(torch.empty(groups, m, n, device=device), zero_c) for _ in range(n_copies)]
        return Impl(FP8_1D1D_LOOP, gemm, sets, lambda d: d.reshape(groups * m, n), reference,
                    poison=lambda args: args[0].fill_(float("nan")),
                    note=f"{sum(1 for k in ks if k)} launches of the 1D1D kernel")

    def bf16_loop() -> Impl:
        a16 = [a_deq[:, o:o + k].to(torch.bfloat16) for o, k in zip(offsets, ks)]
        b16 = [b_deq[:, o:o + k].to(torch.bfloat16) for o, k in zip(offsets, ks)]

        def mm(out):
            for g in range(groups):
                torch.mm(a16[g], b16[g].t(), out=out[g])
            return out

        sets = [(torch.empty(groups, m, n, dtype=torch.bfloat16, device=device),) for _ in range(n_copies)]
        return Impl("bf16_matmul", mm, sets, lambda o: o.reshape(groups * m, n), reference,
                    poison=lambda args: args[0].fill_(float("nan")), note=f"loop of {groups} bf16 matmuls")

    return [(harness.OURS, ours), (FP8_1D1D_LOOP, loop_1d1d), ("bf16_matmul", bf16_loop)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_wgrad", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("dense", "k_grouped"), default="dense",
                        help="dense 1D1D weight gradients (default) or the k-grouped MoE weight gradient")
    parser.add_argument("--smoke", action="store_true", help="two tiny shapes (for --device cpu)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    if args.family == "k_grouped":
        shapes = list(K_GROUPED_SMOKE) if args.smoke else k_grouped_shapes(args.quick)
        return harness.run_family("wgrad_k_grouped", shapes, build_k_grouped, args)
    shapes = list(SMOKE) if args.smoke else wgrad_shapes(args.quick)
    return harness.run_family("wgrad", shapes, build, args)


if __name__ == "__main__":
    sys.exit(main())
