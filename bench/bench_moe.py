"""The FP8 MoE layer of issue 7 (E=256, top-8, H=7168, I=2048) against the bf16 PyTorch layer and a
per-expert loop of block-scaled ``torch._scaled_mm``.

    python -m bench.bench_moe [--quick] [--tokens T ...] [--out DIR] [--time-budget S]

Implementations, all on the same routing (uniformly random top-8 of 256, no slot dropped) and weights:

- ``deep_fp8_gemm``: :func:`deep_fp8_gemm.moe.fp8_moe_forward` as ``FP8MoE.forward`` calls it — with the
  interleaved ``w13_swiglu``, so the up-projection is the fused SwiGLU kernel (issue 27) —, eager, with the default
  ``max_m_sum=None`` (one host synchronisation to size the contiguous layout);
- ``deep_fp8_gemm_unfused`` (issue 27): the same call without ``w13_swiglu``: the bf16 ``w13`` GEMM and
  ``silu_mul_quant`` (one kernel more per layer; bench/PREDICTIONS.md has the modelled difference);
- ``bf16_layer``: ``bf16_moe`` of ``examples/moe_layer.py`` (per-expert bf16 matmuls, fp32 combine), on the
  bf16 weights the FP8 ones were quantised from — also the reference every output is compared with;
- ``cublas_block``: ``per_expert_moe`` of ``examples/moe_layer.py`` with each expert run as two block-scaled
  ``torch._scaled_mm`` calls (``bench.baselines``: M padded to 4, M-major 1x128 activation scales) and the
  library's per-token and SiLU·mul quantisers in between — the same FP8 math as ours, one expert at a time.
- ``ep_world1`` / ``ep_decode_world1`` (issue 16): :func:`deep_fp8_gemm.distributed.ep_moe_forward` and, for
  T <= 128, ``ep_moe_forward_decode`` (static buffers, masked layout, no host sync) on a one-rank
  ``torch.distributed`` world (NCCL on the GPU, gloo on CPU, created here when none exists): the same GEMMs
  plus the expert-parallel machinery (count exchange and its host sync, FP8 row packing, all-to-all with
  itself, per-slot return, combine), i.e. the layer's own overhead over ``fp8_moe_forward`` before any
  network time; fused up-projection, as ``EPMoE`` runs it. Results are bit-identical to ours (checked against the
  same reference).

Check before timing: calc_diff against the bf16 layer below ``MOE_THRESHOLD`` (two chained FP8 GEMMs with
requantised activations; ~2e-3 expected, a dropped or misrouted expert gives > 1e-2); the cuBLAS loop's note
also gives its calc_diff against ours (same FP8 math: ~1e-5 expected). Effective TFLOPS = ``2 · T·top_k ·
3·H·I`` / time (routed slots only). Weights (11.3 GB e4m3 + 22.5 GB bf16 at full size) are generated once per
process, in chunks; when the device has too little free memory for the bf16 copy, the bf16 layer is skipped
(``n/a`` with the reason) and the cuBLAS loop becomes the reference (threshold 1e-3).
Writes ``<out>/moe.{json,md,png}``. Method: ``bench/timing.py`` (only the activations are rotated: the
weights are far larger than the L2 anyway, and the L2 is flushed before every call).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch

from . import baselines, harness, timing
from .baselines import Impl, Unsupported
from .shapes import MoEShape, moe_shapes

#: calc_diff an FP8 layer must stay below against the bf16 layer.
MOE_THRESHOLD = 1e-2
#: Free device memory kept beyond the bf16 weights (activations, the bf16 layer's temporaries, the L2 flush).
HEADROOM_BYTES = 12 << 30
EXPERTS_PER_CHUNK = 16
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "moe_layer.py"

SMOKE = [MoEShape(1, num_experts=4, top_k=2, hidden=256, inter=128),
         MoEShape(3, num_experts=4, top_k=2, hidden=256, inter=128)]


def example():
    """``examples/moe_layer.py`` as a module (its bf16 layer, ``per_expert_moe`` loop and router), loaded from
    its path so that this works whether or not ``examples`` is importable."""
    module = sys.modules.get("_dfg_example_moe_layer")
    if module is None:
        spec = importlib.util.spec_from_file_location("_dfg_example_moe_layer", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["_dfg_example_moe_layer"] = module
    return module


# --- weights (generated once per process) --------------------------------------------------------------------

_WEIGHTS: dict = {}


def _bf16_fits(shape: MoEShape, device: torch.device) -> tuple[bool, str]:
    bf16 = shape.num_experts * 3 * shape.hidden * shape.inter * 2
    if device.type != "cuda":
        return True, ""
    free, _ = torch.cuda.mem_get_info(device)
    fp8 = shape.num_experts * shape.expert_bytes()
    need = bf16 + fp8 + HEADROOM_BYTES
    if free >= need:
        return True, ""
    return False, (f"bf16 layer skipped: its weights need {bf16 / 2**30:.1f} GiB and {need / 2**30:.1f} GiB are "
                   f"needed in all, {free / 2**30:.1f} GiB free")


def weights(shape: MoEShape, device: torch.device) -> dict:
    """e4m3 ``w13``, ``w13_scale``, ``w2``, ``w2_scale`` (128x128 blocks per expert, quantised by the library)
    and, when they fit, the bf16 ``w13`` / ``w2`` they come from (``randn / sqrt(fan_in)``, seed 0), built in
    chunks of experts so that no fp32 copy of the whole layer ever exists. Cached for the next shape."""
    import deep_fp8_gemm as dfg

    key = (shape.num_experts, shape.hidden, shape.inter, str(device))
    if key in _WEIGHTS:
        return _WEIGHTS[key]
    _WEIGHTS.clear()
    from deep_fp8_gemm.ops.moe import swiglu_weights

    E, H, I = shape.num_experts, shape.hidden, shape.inter  # noqa: E741, N806
    keep_bf16, why = _bf16_fits(shape, device)
    gen = torch.Generator(device=device).manual_seed(0)
    w = {"w13": torch.empty(E, 2 * I, H, dtype=torch.float8_e4m3fn, device=device),
         "w13_scale": torch.empty(E, math.ceil(2 * I / 128), math.ceil(H / 128), dtype=torch.float32, device=device),
         "w2": torch.empty(E, H, I, dtype=torch.float8_e4m3fn, device=device),
         "w2_scale": torch.empty(E, math.ceil(H / 128), math.ceil(I / 128), dtype=torch.float32, device=device),
         "bf16": None, "bf16_note": why}
    if keep_bf16:
        w["bf16"] = (torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=device),
                     torch.empty(E, H, I, dtype=torch.bfloat16, device=device))
    for index, (name, rows, cols) in enumerate((("w13", 2 * I, H), ("w2", H, I))):
        for first in range(0, E, EXPERTS_PER_CHUNK):
            last = min(E, first + EXPERTS_PER_CHUNK)
            if keep_bf16:
                chunk = w["bf16"][index][first:last]  # a contiguous view: generated in place
                torch.randn(chunk.shape, generator=gen, out=chunk)
            else:
                chunk = torch.randn(last - first, rows, cols, device=device, generator=gen, dtype=torch.bfloat16)
            chunk.mul_(1.0 / math.sqrt(cols))
            for e in range(first, last):
                w[name][e], w[name + "_scale"][e] = dfg.per_block_cast_to_fp8(chunk[e - first])
            del chunk
    w["w13_swiglu"] = swiglu_weights(w["w13"], w["w13_scale"])  # what FP8MoE derives at load time (a copy)
    _WEIGHTS[key] = w
    return w


# --- the per-expert block-scaled torch._scaled_mm layer ------------------------------------------------------

def cublas_moe(w13, w13_scale, w2, w2_scale):
    """``forward(hidden, topk_ids, topk_weights)``: the example's per-expert loop with each expert run as two
    block-scaled ``torch._scaled_mm`` calls (``bench.baselines``) around the library's SiLU·mul + quantise.
    Raises :class:`Unsupported` when this torch / device cannot run the block-scaled call."""
    import deep_fp8_gemm as dfg
    from deep_fp8_gemm.moe import silu_mul_quant

    per_expert_moe = example().per_expert_moe
    num_experts = w13.shape[0]

    def gemm(a, sa, b, sb, rows):
        return baselines._scaled_mm(*baselines._scaled_mm_args(a, sa, b, sb))[:rows]

    def forward(hidden, topk_ids, topk_weights):
        x_fp8, x_scales = dfg.per_token_cast_to_fp8(hidden)

        def expert_ffn(e, tokens):
            rows = tokens.numel()
            # Row gather through a uint8 view (as fp8_moe_forward does: fp8 indexing is not supported everywhere).
            a = x_fp8.view(torch.uint8).index_select(0, tokens).view(torch.float8_e4m3fn)
            gate_up = gemm(a, x_scales.index_select(0, tokens), w13[e], w13_scale[e], rows)
            h, h_scales = silu_mul_quant(gate_up)
            return gemm(h, h_scales, w2[e], w2_scale[e], rows)

        return per_expert_moe(hidden, topk_ids, topk_weights, num_experts, expert_ffn)

    # Probe both GEMM shapes once (Unsupported, reported as n/a, rather than a crash inside the timed loop).
    k_h, k_i = w13.shape[2], w2.shape[2]
    probe_a = torch.zeros(4, k_h, dtype=torch.float8_e4m3fn, device=w13.device)
    probe_s = torch.ones(4, math.ceil(k_h / 128), device=w13.device)
    baselines._probe(baselines._scaled_mm, baselines._scaled_mm_args(probe_a, probe_s, w13[0], w13_scale[0]),
                     "torch._scaled_mm (1x128 x 128x128 block scales)")
    probe_a = torch.zeros(4, k_i, dtype=torch.float8_e4m3fn, device=w13.device)
    probe_s = torch.ones(4, math.ceil(k_i / 128), device=w13.device)
    baselines._probe(baselines._scaled_mm, baselines._scaled_mm_args(probe_a, probe_s, w2[0], w2_scale[0]),
                     "torch._scaled_mm (1x128 x 128x128 block scales)")
    return forward


# --- the expert-parallel layer on a one-rank world -----------------------------------------------------------

_OWN_GROUP: list = []  # the process group this module created (destroyed by main())


def _world_of_one(device: torch.device) -> None:
    """Initialises a one-rank ``torch.distributed`` world (NCCL for CUDA, gloo for CPU) unless one exists."""
    import os
    import tempfile

    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise Unsupported(f"a {dist.get_world_size()}-rank world is initialised; this row needs one rank")
        return
    init = os.path.join(tempfile.mkdtemp(prefix="dfg-bench-ep-"), "init")
    try:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"file://{init}",
                                rank=0, world_size=1)
    except Exception as exc:  # noqa: BLE001 - no backend here: the row is n/a, the others still run
        raise Unsupported(f"cannot start a one-rank world: {type(exc).__name__}: {exc}") from exc
    _OWN_GROUP.append(True)


def _close_world() -> None:
    if _OWN_GROUP:
        import torch.distributed as dist

        dist.destroy_process_group()
        _OWN_GROUP.clear()


def ep_impls(shape: MoEShape, device: torch.device, fp8: tuple, sets: list, reference, threshold: float,
             case_note: str, w13_swiglu=None) -> list:
    """The ``ep_world1`` and ``ep_decode_world1`` implementations (module docstring)."""
    from deep_fp8_gemm.distributed import EPDecodeBuffers, ep_moe_forward, ep_moe_forward_decode

    identity = lambda out: out  # noqa: E731

    def prefill() -> Impl:
        _world_of_one(device)
        return Impl("ep_world1", lambda h, i, tw: ep_moe_forward(h, i, tw, *fp8, w13_swiglu=w13_swiglu), sets,
                    identity, reference, note=f"ep_moe_forward, 1 rank; {case_note}", threshold=threshold)

    def decode() -> Impl:
        if shape.tokens > 128:
            raise Unsupported("decode path timed for T <= 128 only (its static buffers scale with T)")
        _world_of_one(device)
        buffers = EPDecodeBuffers.allocate(shape.tokens, shape.hidden, shape.top_k, shape.num_experts,
                                           device=device)
        expected_m = max(1, shape.tokens * shape.top_k // shape.num_experts)
        return Impl("ep_decode_world1",
                    lambda h, i, tw: ep_moe_forward_decode(h, i, tw, *fp8, buffers, expected_m,
                                                           w13_swiglu=w13_swiglu), sets, identity,
                    reference, note=f"ep_moe_forward_decode, 1 rank, expected_m={expected_m}", threshold=threshold)

    return [("ep_world1", prefill), ("ep_decode_world1", decode)]


# --- cases ---------------------------------------------------------------------------------------------------

def make_inputs(shape: MoEShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``hidden [T, H]`` bf16 and the example's router output (``topk_ids``, ``topk_weights``), seeded by T."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(shape.label.encode()))
    hidden = torch.randn(shape.tokens, shape.hidden, device=device, generator=gen).to(torch.bfloat16)
    ids, topk_weights = example().route(shape.tokens, shape.num_experts, shape.top_k, device, gen)
    return hidden, ids, topk_weights


def build(shape: MoEShape, device: torch.device, n_copies: int):
    from deep_fp8_gemm.moe import fp8_moe_forward

    w = weights(shape, device)
    fp8 = (w["w13"], w["w13_scale"], w["w2"], w["w2_scale"])
    hidden, ids, topk_weights = make_inputs(shape, device)
    sets = baselines.copies((hidden, ids, topk_weights), n_copies)
    identity = lambda out: out  # noqa: E731

    def ours_fn(h, i, tw):
        return fp8_moe_forward(h, i, tw, *fp8, w13_swiglu=w["w13_swiglu"])

    def unfused_fn(h, i, tw):
        return fp8_moe_forward(h, i, tw, *fp8)

    bf16_fn = None
    reference, threshold, ref_note = None, MOE_THRESHOLD, "calc_diff vs the bf16 layer"
    if w["bf16"] is not None:
        w13_16, w2_16 = w["bf16"]
        bf16_moe = example().bf16_moe

        def bf16_fn(h, i, tw):
            return bf16_moe(h, i, tw, w13_16, w2_16)

        reference = bf16_fn(hidden, ids, topk_weights)

    cublas_state: dict = {}

    def cublas_fn():
        if "fn" not in cublas_state:
            cublas_state["fn"] = cublas_moe(*fp8)
        return cublas_state["fn"]

    if reference is None:  # no bf16 layer: the cuBLAS loop (same FP8 math) is the reference
        try:
            reference = cublas_fn()(hidden, ids, topk_weights)
            threshold, ref_note = timing.CHECK_THRESHOLD, "calc_diff vs the cuBLAS loop (no bf16 layer)"
        except Unsupported as exc:
            raise RuntimeError(f"no reference: {w['bf16_note']}; {exc}") from exc

    slots = int((ids >= 0).sum())
    active = int(torch.unique(ids[ids >= 0]).numel())
    case_note = f"{slots} routed slots over {active} experts; {ref_note}"

    def ours() -> Impl:
        return Impl(harness.OURS, ours_fn, sets, identity, reference, note=f"fp8_moe_forward; {case_note}",
                    threshold=threshold)

    def unfused() -> Impl:
        cross = timing.calc_diff(unfused_fn(hidden, ids, topk_weights), ours_fn(hidden, ids, topk_weights))
        return Impl("deep_fp8_gemm_unfused", unfused_fn, sets, identity, reference,
                    note=f"fp8_moe_forward without w13_swiglu (bf16 gate|up + silu_mul_quant); calc_diff vs fused "
                         f"{cross:.1e}; {case_note}", threshold=threshold)

    def bf16() -> Impl:
        if bf16_fn is None:
            raise Unsupported(w["bf16_note"])
        return Impl("bf16_layer", bf16_fn, sets, identity, reference, note="examples/moe_layer.py bf16_moe "
                    "(the reference)")

    def cublas() -> Impl:
        fn = cublas_fn()
        note = f"per-expert loop over {active} experts"
        try:
            cross = timing.calc_diff(fn(hidden, ids, topk_weights), ours_fn(hidden, ids, topk_weights))
            note += f"; calc_diff vs deep_fp8_gemm {cross:.1e}"
        except Exception as exc:  # noqa: BLE001 - the cross-check is informational; measure() reports failures
            note += f"; cross-check failed: {type(exc).__name__}"
        return Impl("cublas_block", lambda h, i, tw: fn(h, i, tw), sets, identity, reference, note=note,
                    threshold=threshold)

    return [(harness.OURS, ours), ("deep_fp8_gemm_unfused", unfused), ("bf16_layer", bf16), ("cublas_block", cublas),
            *ep_impls(shape, device, fp8, sets, reference, threshold, case_note, w["w13_swiglu"])]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_moe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=None, metavar="T",
                        help="token counts (default 1 16 128 1024 4096; --quick: 16 1024)")
    parser.add_argument("--smoke", action="store_true", help="tiny layers (for --device cpu smoke runs)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        shapes = SMOKE if args.tokens is None else [MoEShape(t, 4, 2, 256, 128) for t in args.tokens]
    else:
        shapes = moe_shapes(args.quick, tuple(args.tokens) if args.tokens else None)
    if any(t < 1 for t in (s.tokens for s in shapes)):
        parser.error("--tokens must be positive")
    try:
        return harness.run_family("moe" + ("-smoke" if args.smoke else ""), shapes, build, args)
    finally:
        _close_world()


if __name__ == "__main__":
    sys.exit(main())
