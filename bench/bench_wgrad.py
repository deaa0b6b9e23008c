"""Weight-gradient (1D1D) FP8 GEMM benchmark: ``fp8_gemm_nt(..., recipe=(1, 1, 128))`` (fp32 ``D = C + A·Bᵀ``,
per-row scales on both operands) against the 1D2D kernel at the same shape (issue 15's target: the 1D1D kernel
at >= 90% of the 1D2D kernel's TFLOPS) and a bf16 matmul.

    python -m bench.bench_wgrad [--smoke] [--quick] [--out DIR] [--time-budget S]

Shapes: DeepSeek-V3's dense weight gradients dW [N, K] = dYᵀ · X, i.e. m = N (out features), n = K (in
features), k = tokens. Writes ``<out>/wgrad.{json,md,png}`` (see ``bench/report.py``). Method: ``bench/timing.py``.
The 1D1D impl reads a zero C (a separate tensor, so repeated runs do not accumulate) and writes a NaN-poisoned D.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness
from .baselines import Impl
from .shapes import DenseShape

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_wgrad", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two tiny shapes (for --device cpu)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    shapes = list(SMOKE) if args.smoke else wgrad_shapes(args.quick)
    return harness.run_family("wgrad", shapes, build, args)


if __name__ == "__main__":
    sys.exit(main())
