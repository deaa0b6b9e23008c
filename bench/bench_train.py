"""A training step (forward + backward) of the FP8 MoE layer (issue 15) against the same layer in bf16.

    python -m bench.bench_train [--quick] [--tokens T ...] [--smoke] [--out DIR] [--time-budget S]

Layer: DeepSeek-V3's expert dimensions (H = 7168, I = 2048) with 32 experts — one rank's share of the 256
experts at expert parallelism 8 — and top-8 routing (``examples/moe_layer.py``'s router, no slot dropped).

Implementations, on the same routing, weights and output gradient:

- ``deep_fp8_gemm``: :func:`deep_fp8_gemm.autograd.fp8_moe` on fp32 master weights with Megatron-style
  ``main_grad`` buffers (the weight gradients accumulate into them inside the k-grouped GEMM), then
  ``torch.autograd.grad`` for ``hidden`` and ``topk_weights``: every GEMM of the step in FP8 (forward, input
  gradients, weight gradients), weights re-quantised every step as in training;
- ``bf16_layer``: ``bf16_moe`` of ``examples/moe_layer.py`` (per-expert bf16 matmuls) on the bf16 weights,
  differentiated by autograd (``hidden``, ``topk_weights``, ``w13``, ``w2``) — also the reference.

Check before timing: calc_diff of the ``hidden`` gradient against the bf16 layer's below ``TRAIN_THRESHOLD``
(FP8 forward and backward GEMMs chained: ~2e-3 expected). FLOPs = 3 x the forward's ``2 · T·top_k · 3·H·I``
(forward, input-gradient and weight-gradient GEMMs; routed slots only). Writes ``<out>/train.{json,md,png}``
(rows in the ``moe`` family format). Method: ``bench/timing.py``; the accumulating ``main_grad`` buffers are
shared by all runs (only the activations rotate).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness
from .baselines import Impl
from .bench_moe import example
from .shapes import MoEShape

#: calc_diff of the FP8 ``hidden`` gradient against the bf16 layer's.
TRAIN_THRESHOLD = 1e-2
NUM_EXPERTS, TOP_K = 32, 8
TOKENS, QUICK_TOKENS = (1024, 4096), (4096,)


@dataclasses.dataclass(frozen=True)
class TrainShape(MoEShape):
    """:class:`bench.shapes.MoEShape` of a training step: FLOPs are forward + input gradient + weight gradient."""

    def flops(self) -> int:
        return 3 * super().flops()

    @property
    def label(self) -> str:
        return "train " + super().label


SMOKE = [TrainShape(16, num_experts=4, top_k=2, hidden=256, inter=128),
         TrainShape(5, num_experts=4, top_k=2, hidden=256, inter=128)]


def train_shapes(quick: bool, tokens: Sequence[int] | None = None) -> list[TrainShape]:
    chosen = tokens or (QUICK_TOKENS if quick else TOKENS)
    return [TrainShape(t, num_experts=NUM_EXPERTS, top_k=TOP_K) for t in chosen]


def build(shape: TrainShape, device: torch.device, n_copies: int):
    from deep_fp8_gemm.autograd import fp8_moe

    E, H, I = shape.num_experts, shape.hidden, shape.inter  # noqa: E741, N806
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(("train " + shape.label).encode()))
    w13 = (torch.randn(E, 2 * I, H, device=device, generator=gen) / math.sqrt(H)).requires_grad_()
    w2 = (torch.randn(E, H, I, device=device, generator=gen) / math.sqrt(I)).requires_grad_()
    w13.main_grad, w2.main_grad = torch.zeros_like(w13), torch.zeros_like(w2)
    w13_16 = w13.detach().to(torch.bfloat16).requires_grad_()
    w2_16 = w2.detach().to(torch.bfloat16).requires_grad_()
    hidden = torch.randn(shape.tokens, H, device=device, generator=gen).to(torch.bfloat16)
    ids, topk_weights = example().route(shape.tokens, E, shape.top_k, device, gen)
    dout = torch.randn(shape.tokens, H, device=device, generator=gen).to(torch.bfloat16)
    sets = [tuple(t.requires_grad_() if t.is_floating_point() else t for t in s)
            for s in baselines.copies((hidden, ids, topk_weights), n_copies)]
    bf16_moe = example().bf16_moe

    def ours_fn(h, i, tw):
        out = fp8_moe(h, i, tw, w13, w2)
        return torch.autograd.grad(out, (h, tw), dout)[0]

    def bf16_fn(h, i, tw):
        out = bf16_moe(h, i, tw, w13_16, w2_16)
        return torch.autograd.grad(out, (h, tw, w13_16, w2_16), dout)[0]

    reference = bf16_fn(*sets[0]).double()
    identity = lambda grad: grad  # noqa: E731
    note = (f"{int((ids >= 0).sum())} routed slots over {int(torch.unique(ids).numel())} experts; calc_diff of "
            "the hidden gradient vs the bf16 layer's")
    return [
        (harness.OURS, lambda: Impl(harness.OURS, ours_fn, sets, identity, reference, threshold=TRAIN_THRESHOLD,
                                    note=f"fp8_moe forward + backward, fp32 main_grad; {note}")),
        ("bf16_layer", lambda: Impl("bf16_layer", bf16_fn, sets, identity, reference,
                                    note="examples/moe_layer.py bf16_moe + autograd (the reference)")),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=None, metavar="T",
                        help=f"token counts (default {' '.join(map(str, TOKENS))}; --quick: "
                             f"{' '.join(map(str, QUICK_TOKENS))})")
    parser.add_argument("--smoke", action="store_true", help="tiny layers (for --device cpu smoke runs)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    if args.tokens is not None and any(t < 1 for t in args.tokens):
        parser.error("--tokens must be positive")
    if args.smoke:
        shapes = SMOKE if args.tokens is None else [dataclasses.replace(SMOKE[0], tokens=t) for t in args.tokens]
    else:
        shapes = train_shapes(args.quick, args.tokens)
    return harness.run_family("train" + ("-smoke" if args.smoke else ""), shapes, build, args)


if __name__ == "__main__":
    sys.exit(main())
