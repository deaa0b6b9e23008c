"""MoE grouped FP8 GEMM benchmark: contiguous (prefill) and masked (decode) layouts vs a per-expert loop of
block-scaled cuBLAS, bf16 matmul, row-wise ``torch._scaled_grouped_mm`` (different scaling) and the
reference design's H800 numbers. TFLOPS count valid rows only.

    python -m bench.bench_grouped --kind contiguous|masked [--quick] [--out DIR] [--time-budget S]

Writes ``<out>/<kind>.{json,md,png}``. Every expert gets exactly ``m`` valid rows (as the reference design
benchmarked); the contiguous table adds one 50%-padding row to price padding blocks. Method:
``bench/timing.py``.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness
from .baselines import Impl
from .shapes import ContiguousShape, MaskedShape, contiguous_shapes, masked_shapes


def _quantise(shape, x: torch.Tensor, w: torch.Tensor) -> dict:
    import deep_fp8_gemm as dfg

    k = x.size(-1)
    a, sa = dfg.per_token_cast_to_fp8(x.reshape(-1, k))
    a, sa = a.view(*x.shape), sa.view(*x.shape[:-1], sa.size(-1))
    pairs = [dfg.per_block_cast_to_fp8(w[g]) for g in range(w.size(0))]
    b, sb = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    return {"x": x, "w": w, "a": a, "sa": sa, "b": b, "sb": sb,
            "a_deq": baselines.dequant_a(a, sa), "b_deq": baselines.dequant_b(b, sb)}


def _random(shape, rows_shape: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(shape.label.encode()))
    x = torch.randn(*rows_shape, shape.k, device=device, generator=gen).to(torch.bfloat16)
    w = torch.randn(shape.num_groups, shape.n, shape.k, device=device, generator=gen).to(torch.bfloat16)
    return x, w


def _ref(a_deq_groups: Sequence[torch.Tensor], b_deq: torch.Tensor) -> torch.Tensor:
    """float64 valid rows of every group, in group order."""
    return torch.cat([baselines.reference_nt(a, b_deq[g]) for g, a in enumerate(a_deq_groups)])


# --- contiguous -------------------------------------------------------------------------------------------

def build_contiguous(shape: ContiguousShape, device: torch.device, n_copies: int):
    import deep_fp8_gemm as dfg

    x, w = _random(shape, (shape.m_sum,), device)
    q = _quantise(shape, x, w)
    seg, mpg = shape.segment, shape.m_per_group
    slices = [slice(g * seg, g * seg + mpg) for g in range(shape.num_groups)]
    m_indices = torch.full((shape.m_sum,), -1, dtype=torch.int32, device=device)
    for g, rows in enumerate(slices):
        m_indices[rows] = g
    valid_rows = torch.nonzero(m_indices >= 0).squeeze(1)
    ref = _ref([q["a_deq"][rows] for rows in slices], q["b_deq"])

    def ours() -> Impl:
        def call(a, sa, b, sb, out, idx):
            dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, idx)
            return out

        sets = []
        for i in range(n_copies):
            c = (lambda t: t) if i == 0 else (lambda t: t.clone())
            sa = dfg.get_col_major_tma_aligned_tensor(c(q["sa"]))
            out = torch.empty(shape.m_sum, shape.n, dtype=torch.bfloat16, device=device)
            sets.append((c(q["a"]), sa, c(q["b"]), c(q["sb"]), out, c(m_indices)))
        return Impl(harness.OURS, call, sets, lambda out: out[valid_rows], ref,
                    poison=lambda args: args[4].fill_(float("nan")))

    groups = [(q["a"][rows], q["sa"][rows], q["b"][g], q["sb"][g]) for g, rows in enumerate(slices)]
    return [
        (harness.OURS, ours),
        ("cublas_block", lambda: baselines.cublas_block_loop(groups, ref, n_copies)),
        ("bf16_matmul", lambda: baselines.bf16_loop([q["a_deq"][rows] for rows in slices], q["b_deq"], ref, n_copies)),
        ("scaled_grouped_mm_rowwise", lambda: baselines.scaled_grouped_mm_rowwise(
            x[valid_rows].float(), w.float(), [mpg] * shape.num_groups, n_copies)),
    ]


# --- masked -----------------------------------------------------------------------------------------------

def build_masked(shape: MaskedShape, device: torch.device, n_copies: int):
    import deep_fp8_gemm as dfg

    m_max, em = shape.rows_per_group, shape.expected_m
    x, w = _random(shape, (shape.num_groups, m_max), device)
    q = _quantise(shape, x, w)
    masked_m = torch.full((shape.num_groups,), em, dtype=torch.int32, device=device)
    ref = _ref([q["a_deq"][g, :em] for g in range(shape.num_groups)], q["b_deq"])

    def ours() -> Impl:
        def call(a, sa, b, sb, out, counts):
            dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, counts, em)
            return out

        sets = []
        for i in range(n_copies):
            c = (lambda t: t) if i == 0 else (lambda t: t.clone())
            sa = dfg.get_col_major_tma_aligned_tensor(c(q["sa"]))
            out = torch.empty(shape.num_groups, m_max, shape.n, dtype=torch.bfloat16, device=device)
            sets.append((c(q["a"]), sa, c(q["b"]), c(q["sb"]), out, c(masked_m)))
        return Impl(harness.OURS, call, sets, lambda out: out[:, :em].reshape(-1, shape.n), ref,
                    poison=lambda args: args[4].fill_(float("nan")))

    groups = [(q["a"][g, :em], q["sa"][g, :em], q["b"][g], q["sb"][g]) for g in range(shape.num_groups)]
    return [
        (harness.OURS, ours),
        ("cublas_block", lambda: baselines.cublas_block_loop(groups, ref, n_copies)),
        ("bf16_matmul", lambda: baselines.bf16_bmm(q["a_deq"], q["b_deq"], em, ref, n_copies)),
        ("scaled_grouped_mm_rowwise", lambda: baselines.scaled_grouped_mm_rowwise(
            x[:, :em].float().contiguous(), w.float(), None, n_copies)),
    ]


SMOKE = {
    "contiguous": [ContiguousShape(2, 40, 128, 256), ContiguousShape(2, 64, 128, 256, pad_per_group=64)],
    "masked": [MaskedShape(2, 5, 128, 256, m_max=16), MaskedShape(3, 16, 192, 256)],
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_grouped", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", required=True, choices=("contiguous", "masked"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (for --device cpu smoke runs)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        shapes = SMOKE[args.kind]
    else:
        shapes = contiguous_shapes(args.quick) if args.kind == "contiguous" else masked_shapes(args.quick)
    build = build_contiguous if args.kind == "contiguous" else build_masked
    return harness.run_family(args.kind + ("-smoke" if args.smoke else ""), shapes, build, args)


if __name__ == "__main__":
    sys.exit(main())
