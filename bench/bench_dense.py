"""Dense FP8 GEMM benchmark: ``gemm_fp8_fp8_bf16_nt`` vs block-scaled cuBLAS, bf16 matmul and the reference
design's H800 numbers, plus the host overhead of a decode-size call.

    python -m bench.bench_dense [--shapes deepseek-v3|decode|all] [--quick] [--out DIR] [--time-budget S]

Writes ``<out>/dense-<table>.{json,md,png}`` (see ``bench/report.py``). Method: ``bench/timing.py``. Shapes with
m <= 32 (``--shapes decode``) also time the plain and the swap-AB kernel's best configs, forced, next to the pick;
the host-overhead section adds a chain of dependent decode layers replayed from a CUDA graph with and without PDL.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness, timing
from .baselines import Impl
from .shapes import DENSE_TABLES, SMOKE_SHAPES, DenseShape, dense_shapes

# Host overhead is measured on the smallest decode calls, where it matters.
HOST_OVERHEAD_SHAPES = (DenseShape(1, 2112, 7168), DenseShape(1, 7168, 2048))


def make_inputs(shape: DenseShape, device: torch.device) -> dict:
    """Random bf16 activations / weights quantised by the library; float64 reference of the dequantised
    operands. The seed depends on the shape only, so reruns see the same data."""
    import deep_fp8_gemm as dfg

    gen = torch.Generator(device=device).manual_seed(zlib.crc32(shape.label.encode()))
    x = torch.randn(shape.m, shape.k, device=device, generator=gen).to(torch.bfloat16)
    w = torch.randn(shape.n, shape.k, device=device, generator=gen).to(torch.bfloat16)
    a, sa = dfg.per_token_cast_to_fp8(x)
    b, sb = dfg.per_block_cast_to_fp8(w)
    a_deq, b_deq = baselines.dequant_a(a, sa), baselines.dequant_b(b, sb)
    return {"a": a, "sa": sa, "b": b, "sb": sb, "a_deq": a_deq, "b_deq": b_deq,
            "ref": baselines.reference_nt(a_deq, b_deq)}


def ours(inputs: dict, n_copies: int) -> Impl:
    """``gemm_fp8_fp8_bf16_nt`` with sA already M-major and TMA-aligned (as a model would keep it)."""
    import deep_fp8_gemm as dfg

    def gemm(a, sa, b, sb, out):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
        return out

    m, n = inputs["a"].size(0), inputs["b"].size(0)
    sets = []
    for i in range(n_copies):
        clone = (lambda t: t) if i == 0 else (lambda t: t.clone())
        sa = dfg.get_col_major_tma_aligned_tensor(clone(inputs["sa"]))  # clone() would lose the M-major strides
        out = torch.empty(m, n, dtype=torch.bfloat16, device=inputs["a"].device)
        sets.append((clone(inputs["a"]), sa, clone(inputs["b"]), clone(inputs["sb"]), out))
    return Impl(harness.OURS, gemm, sets, lambda out: out, inputs["ref"],
                poison=lambda args: args[4].fill_(float("nan")))


def forced(inputs: dict, n_copies: int, swap_ab: bool) -> Impl:
    """The plain (``swap_ab=False``) or swap-AB (``True``) kernel's best config for a decode shape (m <= 32),
    launched through ``kernels.gemm.launch_1d2d`` whatever the heuristic picks: the model's ranking of the two
    (bench/PREDICTIONS.md, "Decode: swap-AB vs the plain kernel") checked on the GPU."""
    import deep_fp8_gemm as dfg
    from deep_fp8_gemm.config import get_config
    from deep_fp8_gemm.kernels import gemm as gemm_host

    m, k = inputs["a"].shape
    n = inputs["b"].size(0)
    cfg = get_config(m, n, k, 1, "dense", dfg.get_num_sms(), swap_ab=swap_ab)

    def gemm(a, sa, b, sb, out):
        gemm_host.launch_1d2d(cfg, a, sa, b, sb, out, None, "cuda")
        return out

    impl = ours(inputs, n_copies)
    return Impl(f"{harness.OURS}_{'swap_ab' if swap_ab else 'plain'}", gemm, impl.arg_sets, lambda out: out,
                inputs["ref"], poison=lambda args: args[4].fill_(float("nan")))


def build(shape: DenseShape, device: torch.device, n_copies: int):
    inputs = make_inputs(shape, device)
    from deep_fp8_gemm.config import SWAP_AB_MAX_M

    decode = [(f"{harness.OURS}_{name}", lambda swap=swap: forced(inputs, n_copies, swap))
              for name, swap in (("plain", False), ("swap_ab", True))] \
        if shape.m <= SWAP_AB_MAX_M and device.type == "cuda" else []  # forced kernels: GPU only
    return [
        (harness.OURS, lambda: ours(inputs, n_copies)),
        *decode,
        ("cublas_block", lambda: baselines.cublas_block_dense(inputs["a"], inputs["sa"], inputs["b"], inputs["sb"],
                                                              inputs["ref"], n_copies)),
        ("bf16_matmul", lambda: baselines.bf16_dense(inputs["a_deq"], inputs["b_deq"], inputs["ref"], n_copies)),
    ]


def host_overhead(device: torch.device, calls: int = 200) -> dict:
    """Per-call host time vs GPU time of back-to-back decode-size calls (deep_fp8_gemm and cuBLAS)."""
    results = []
    flusher = timing.L2Flusher(device)
    for shape in HOST_OVERHEAD_SHAPES:
        for name, thunk in build(shape, device, 1)[:2]:
            entry = {"impl": name, "label": shape.label}
            try:
                impl = thunk()
                kernel = timing.time_call(impl.fn, impl.arg_sets, device=device, flusher=flusher)
                entry.update(timing.host_overhead(impl.fn, impl.arg_sets[0], device=device, calls=calls))
                entry["kernel_us"] = kernel.median_us
            except Exception as exc:  # noqa: BLE001 - report, don't crash
                entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            results.append(entry)
    return {"host_overhead": results}


#: The PDL row: a chain of dependent decode layers (quantise, then a GEMM whose output the next layer quantises),
#: as a model's decode step issues them, captured in a CUDA graph and replayed with and without PDL.
PDL_CHAIN = dict(m=16, hidden=4096, layers=8)


def pdl_chain(device: torch.device, replays: int = 50) -> dict:
    """µs per layer of :data:`PDL_CHAIN` replayed from a CUDA graph with ``set_pdl(False)`` and ``(True)`` (the
    graph captures the launch attribute), and whether both gave the same bits. GPU only."""
    import deep_fp8_gemm as dfg

    if device.type != "cuda":
        return {"pdl_chain": {"status": "skipped", "note": "needs a GPU"}}
    m, h, layers = PDL_CHAIN["m"], PDL_CHAIN["hidden"], PDL_CHAIN["layers"]
    gen = torch.Generator(device=device).manual_seed(5)
    weights = [dfg.per_block_cast_to_fp8(torch.randn(h, h, device=device, generator=gen) / 64) for _ in range(layers)]
    x = torch.randn(m, h, device=device, generator=gen).to(torch.bfloat16)
    before, results, outs = dfg.get_pdl(), {}, {}
    try:
        for pdl in (False, True):
            dfg.set_pdl(pdl)

            def step(inp):
                for b, sb in weights:
                    a, sa = dfg.per_token_cast_to_fp8(inp)
                    y = torch.empty(m, h, device=device, dtype=torch.bfloat16)
                    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), y)
                    inp = y
                return inp

            step(x)  # compile, plans
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = step(x)
            graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            results["pdl" if pdl else "no_pdl"] = start.elapsed_time(end) * 1e3 / replays / layers
            outs[pdl] = out.clone()
    finally:
        dfg.set_pdl(before)
    return {"pdl_chain": {"shape": PDL_CHAIN, "us_per_layer": results, "same_bits": torch.equal(outs[False], outs[True])}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_dense", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="deepseek-v3", choices=(*DENSE_TABLES, "smoke"),
                        help="deepseek-v3: 7 (N,K) x M in {64,128,4096}; decode: M 1..64 and 256/1024/2048; "
                             "all: both; smoke: two tiny shapes for --device cpu")
    parser.add_argument("--no-host-overhead", action="store_true", help="skip the host-overhead measurement")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    shapes = list(SMOKE_SHAPES) if args.shapes == "smoke" else dense_shapes(args.shapes, quick=args.quick)
    extra = None if args.no_host_overhead else (
        lambda device: {**host_overhead(device, calls=20 if device.type == "cpu" else 200), **pdl_chain(device)})
    return harness.run_family(f"dense-{args.shapes}", shapes, build, args, extra=extra)


if __name__ == "__main__":
    sys.exit(main())
