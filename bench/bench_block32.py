"""The 1x32 / 32x32 recipe (``gemm_fp8_fp8_bf16_nt_block32``, DeepSeek-V4.1's dense layers) against the same GEMM in
the 1x128 / 128x128 recipe, a bf16 matmul of the dequantised operands and, where it is installed, the ``sgl-deep-gemm``
fork's ``fp8_gemm_nt(..., recipe=(1, 32, 32))`` on the same inputs (its bits are compared with ours: users switching
will diff logits).

    python -m bench.bench_block32 [--quick] [--smoke] [--out DIR] [--time-budget S]

Writes ``<out>/block32.{json,md,png}`` (``bench/report.py``); the fork's rows say "unavailable" when no ``deep_gemm``
other than this library's drop-in can be imported. Shapes: ``kernels/targets.py`` DEEPSEEK_V41_DENSE_BLOCK32 at
decode and prefill rows.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness
from .baselines import Impl, Unsupported
from .shapes import DenseShape

#: (N, K) of DeepSeek-V4.1's dense projections (deep_fp8_gemm.kernels.targets.DEEPSEEK_V41_DENSE_BLOCK32) x these M.
MS, QUICK_MS = (1, 64, 128, 4096), (64, 4096)


def shapes(quick: bool) -> list[DenseShape]:
    from deep_fp8_gemm.kernels.targets import DEEPSEEK_V41_DENSE_BLOCK32

    return [DenseShape(m, n, k) for n, k in DEEPSEEK_V41_DENSE_BLOCK32 for m in (QUICK_MS if quick else MS)]


def make_inputs(shape: DenseShape, device: torch.device) -> dict:
    """One bf16 activation / weight pair quantised both ways (1x32 / 32x32 with power-of-two scales, as V4.1's
    checkpoints, and 1x128 / 128x128), and the float64 product of the 32-recipe's dequantised operands."""
    import deep_fp8_gemm as dfg

    gen = torch.Generator(device=device).manual_seed(zlib.crc32(shape.label.encode()))
    x = torch.randn(shape.m, shape.k, device=device, generator=gen).to(torch.bfloat16)
    w = torch.randn(shape.n, shape.k, device=device, generator=gen).to(torch.bfloat16)
    a32, sa32 = dfg.per_token_cast_to_fp8(x, True, gran_k=32)
    b32, sb32 = dfg.per_block_cast_to_fp8(w, True, gran_k=32)
    a128, sa128 = dfg.per_token_cast_to_fp8(x)
    b128, sb128 = dfg.per_block_cast_to_fp8(w)
    a_deq = a32.double() * sa32.double().repeat_interleave(32, 1)[:, :shape.k]
    b_deq = b32.double() * sb32.double().repeat_interleave(32, 0)[:shape.n].repeat_interleave(32, 1)[:, :shape.k]
    a128_deq = a128.double() * sa128.double().repeat_interleave(128, 1)[:, :shape.k]
    b128_deq = b128.double() * sb128.double().repeat_interleave(128, 0)[:shape.n].repeat_interleave(128, 1)[:, :shape.k]
    return {"b32": (a32, sa32, b32, sb32), "b128": (a128, sa128, b128, sb128),
            "a_deq": a_deq.to(torch.bfloat16), "b_deq": b_deq.to(torch.bfloat16),
            "ref": (a_deq @ b_deq.t()).float(), "ref128": (a128_deq @ b128_deq.t()).float()}


def _impl(name: str, call, operands: tuple, inputs: dict, n_copies: int, ref: str = "ref") -> Impl:
    m, n = operands[0].size(0), operands[2].size(0)
    sets = [(*[t if i == 0 else t.clone() for t in operands],
             torch.empty(m, n, dtype=torch.bfloat16, device=operands[0].device)) for i in range(n_copies)]

    def gemm(a, sa, b, sb, out):
        call((a, sa), (b, sb), out)
        return out

    return Impl(name, gemm, sets, lambda out: out, inputs[ref], poison=lambda args: args[4].fill_(float("nan")))


def fork_gemm():
    """``deep_gemm.fp8_gemm_nt`` of a DeepGEMM that is not this library's drop-in (the ``sgl-deep-gemm`` fork), or
    raises :class:`~bench.baselines.Unsupported` saying why not."""
    try:
        import deep_gemm
    except ImportError as exc:
        raise Unsupported(f"no deep_gemm importable ({exc})") from None
    if getattr(deep_gemm, "DISTRIBUTION", "").startswith("deep-fp8-gemm") or \
            getattr(deep_gemm, "__name__", "") == "deep_fp8_gemm":
        raise Unsupported("the deep_gemm importable is this library's drop-in, not the fork")
    fn = getattr(deep_gemm, "fp8_gemm_nt", None)
    if fn is None:
        raise Unsupported("this deep_gemm has no fp8_gemm_nt")
    return lambda lhs, rhs, out: fn(lhs, rhs, out, recipe=(1, 32, 32))


def build(shape: DenseShape, device: torch.device, n_copies: int):
    import deep_fp8_gemm as dfg

    inputs = make_inputs(shape, device)

    def fork():
        impl = _impl("sgl_deep_gemm_fork", fork_gemm(), inputs["b32"], inputs, n_copies)
        ours = torch.empty_like(impl.arg_sets[0][4])
        dfg.gemm_fp8_fp8_bf16_nt_block32(inputs["b32"][:2], inputs["b32"][2:], ours)
        theirs = impl.fn(*impl.arg_sets[0])
        diff = (theirs.float() - ours.float()).abs()
        impl.note = (f"vs ours: {int((diff > 0).sum())} of {diff.numel()} values differ, max {float(diff.max()):.3g}, "
                     f"calc_diff {float(dfg.calc_diff(theirs.double(), ours.double())):.2e}")
        return impl

    return [
        (harness.OURS, lambda: _impl(harness.OURS, dfg.gemm_fp8_fp8_bf16_nt_block32, inputs["b32"], inputs, n_copies)),
        (f"{harness.OURS}_recipe_128", lambda: _impl(f"{harness.OURS}_recipe_128", dfg.gemm_fp8_fp8_bf16_nt,
                                                     inputs["b128"], inputs, n_copies, ref="ref128")),
        ("sgl_deep_gemm_fork", fork),
        ("bf16_matmul", lambda: baselines.bf16_dense(inputs["a_deq"], inputs["b_deq"], inputs["ref"], n_copies)),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_block32", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two tiny shapes (for --device cpu smoke runs)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    chosen = [DenseShape(8, 256, 352), DenseShape(40, 96, 128)] if args.smoke else shapes(args.quick)
    return harness.run_family("block32" + ("-smoke" if args.smoke else ""), chosen, build, args)


if __name__ == "__main__":
    sys.exit(main())
