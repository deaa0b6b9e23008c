"""Fused quantisation kernels (``deep_fp8_gemm.kernels.quant``) against their bytes-moved floor and the
plain-torch implementations.

    python -m bench.bench_quant [--quick] [--out DIR] [--time-budget S]

Kernels: per-token (bf16 ``[m, k]`` -> e4m3 + 1x128 scales written M-major), per-block (bf16 ``[n, k]`` ->
e4m3 + 128x128 scales) and SiLU·mul + quantise (``[m, 2I]`` -> ``[m, I]``), at DeepSeek-V3 sizes
(``bench.shapes.quant_shapes``). Baseline ``torch_quant``: ``deep_fp8_gemm.quant.per_token_cast_to_fp8_torch``
followed by the M-major copy the GEMMs need (what the library did without the fused kernel),
``per_block_cast_to_fp8_torch``, and ``F.silu(gate) * up`` + the per-token torch quantiser
(``deep_fp8_gemm.quant.silu_mul_quant_torch``). Cast-transpose (bf16 ``[m, k]`` -> e4m3 + 1x128 scales of ``x``
and of ``xᵀ``, issue 15): its baseline is two separate quantisations, ``per_token_cast_to_fp8(x)`` and
``per_token_cast_to_fp8(x.t().contiguous())`` (on sm_90 the fused per-token kernel twice and a transpose copy:
what a training step does without the fused cast-transpose), reported in the ``torch_quant`` column.

Check before timing: the fused kernels' e4m3 bytes and scales must equal the torch path's bit for bit
(per-token, per-block, both halves of cast-transpose; any differing element or scale group is NaN-poisoned, so
the check fails), the
per-token scales must come back in the M-major TMA-aligned layout; SiLU·mul + quant must match the torch
path within calc_diff 1e-4 of the dequantised values (the note gives the fraction of differing e4m3 bytes).
Bytes = input read + e4m3 output + scales written once each (``QuantShape.bytes``); the report gives GB/s and
% of the H200's 4.8 TB/s, from the profiler's kernel time where it was measured (short calls). Writes
``<out>/quant.{json,md,png}``. Method: ``bench/timing.py``.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import torch

from . import baselines, harness
from .baselines import Impl, Unsupported
from .shapes import QuantShape, quant_shapes

SILU_THRESHOLD = 1e-4

SMOKE = [QuantShape("per_token", 4, 256), QuantShape("per_token", 130, 200), QuantShape("per_block", 136, 256),
         QuantShape("silu_mul", 5, 128), QuantShape("cast_transpose", 130, 200)]


def _torch_fns():
    from deep_fp8_gemm.quant import silu_mul_quant_torch
    from deep_fp8_gemm.quant import per_block_cast_to_fp8_torch, per_token_cast_to_fp8_torch
    from deep_fp8_gemm.utils import get_col_major_tma_aligned_tensor

    def per_token(x):
        x_fp8, scales = per_token_cast_to_fp8_torch(x)
        return x_fp8, get_col_major_tma_aligned_tensor(scales)

    def cast_transpose(x):
        return (*per_token(x), *per_token(x.t().contiguous()))

    return {"per_token": per_token, "per_block": per_block_cast_to_fp8_torch, "silu_mul": silu_mul_quant_torch,
            "cast_transpose": cast_transpose}


def _two_quantisations(x):
    """The cast-transpose baseline: the library's per-token quantiser on x and on a transposed copy."""
    import deep_fp8_gemm as dfg

    return (*dfg.per_token_cast_to_fp8(x), *dfg.per_token_cast_to_fp8(x.t().contiguous()))


def _fused_fns(device: torch.device):
    """The fused kernels on an sm_90 GPU; on a CPU (smoke runs) the library's public ops, i.e. the torch path."""
    if device.type == "cuda":
        if torch.cuda.get_device_capability(device) != (9, 0):
            raise Unsupported("the fused quantisation kernels need an sm_90 device")
        from deep_fp8_gemm.kernels.quant import (
            per_block_cast_to_fp8_cuda,
            per_token_cast_to_fp8_and_transpose_cuda,
            per_token_cast_to_fp8_cuda,
            silu_mul_quant_cuda,
        )

        return {"per_token": per_token_cast_to_fp8_cuda, "per_block": per_block_cast_to_fp8_cuda,
                "silu_mul": silu_mul_quant_cuda, "cast_transpose": per_token_cast_to_fp8_and_transpose_cuda}
    import deep_fp8_gemm as dfg
    from deep_fp8_gemm.moe import silu_mul_quant

    return {"per_token": dfg.per_token_cast_to_fp8, "per_block": dfg.per_block_cast_to_fp8, "silu_mul": silu_mul_quant,
            "cast_transpose": dfg.per_token_cast_to_fp8_and_transpose}


def _expand_scales(scales: torch.Tensor, kind: str, rows: int, cols: int) -> torch.Tensor:
    """Per-element fp32 scale ``[rows, cols]`` (1x128 groups, or 128x128 blocks for per_block)."""
    s = scales.float().repeat_interleave(128, dim=-1)[..., :cols]
    if kind == "per_block":
        s = s.repeat_interleave(128, dim=0)[:rows]
    return s


def dequant(out: tuple[torch.Tensor, torch.Tensor], kind: str) -> torch.Tensor:
    x_fp8, scales = out
    return x_fp8.double() * _expand_scales(scales, kind, *x_fp8.shape).double()


def _scale_layout_ok(scales: torch.Tensor, kind: str, rows: int) -> bool:
    if kind == "per_block":
        return scales.is_contiguous()
    aligned = (rows + 3) // 4 * 4
    return scales.size(1) == 1 or scales.stride() == (1, aligned)


def checked_valid(ref: tuple[torch.Tensor, torch.Tensor], kind: str, exact: bool = True):
    """``valid``: the dequantised output (float64); everything NaN when the shapes differ from ``ref``'s or the
    scales are not in the layout the GEMMs read; with ``exact``, also NaN wherever an e4m3 byte or its scale
    differs from ``ref``'s bits."""
    ref_bytes = ref[0].view(torch.uint8)
    rows, cols = ref[0].shape
    ref_scales = _expand_scales(ref[1], kind, rows, cols)

    def valid(out):
        x_fp8, scales = out
        values = dequant(out, kind)
        if x_fp8.shape != ref[0].shape or scales.shape != ref[1].shape or not _scale_layout_ok(scales, kind, rows):
            return torch.full_like(values, float("nan"))
        if not exact:
            return values
        bad = (x_fp8.view(torch.uint8) != ref_bytes) | (_expand_scales(scales, kind, rows, cols) != ref_scales)
        return values.masked_fill(bad, float("nan"))

    return valid


def _pairs_valid(ref: tuple[torch.Tensor, ...], exact: bool = True):
    """:func:`checked_valid` of each (e4m3, per-token scales) pair of a cast-transpose output, flattened and
    concatenated (x's pair, then xᵀ's)."""
    checks = [checked_valid(ref[i:i + 2], "per_token", exact) for i in (0, 2)]

    def valid(out):
        return torch.cat([check(out[i:i + 2]).reshape(-1) for check, i in zip(checks, (0, 2))])

    return valid


def _pairs_dequant(out: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.cat([dequant(out[i:i + 2], "per_token").reshape(-1) for i in (0, 2)])


def make_input(shape: QuantShape, device: torch.device) -> torch.Tensor:
    """bf16 ``[m, in_cols]``: randn with per-row magnitudes spread over 2^-8..2^8 (so the scales vary), seeded by
    the shape only."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(shape.label.encode()))
    x = torch.randn(shape.m, shape.in_cols, device=device, generator=gen)
    x *= torch.exp2(torch.randint(-8, 9, (shape.m, 1), device=device, generator=gen).float())
    return x.to(torch.bfloat16)


def build(shape: QuantShape, device: torch.device, n_copies: int):
    x = make_input(shape, device)
    torch_fn = _torch_fns()[shape.kind]
    ref = torch_fn(x)
    sets = baselines.copies((x,), n_copies)
    exact = shape.kind != "silu_mul"
    if shape.kind == "cast_transpose":
        reference, valid = _pairs_dequant(ref), _pairs_valid(ref)
        torch_fn = _two_quantisations  # the baseline (checked against the torch path's bits like ours)
    else:
        reference, valid = dequant(ref, shape.kind), checked_valid(ref, shape.kind, exact)
    threshold = None if exact else SILU_THRESHOLD
    torch_note = {"per_token": "per_token_cast_to_fp8_torch + M-major copy", "per_block": "per_block_cast_to_fp8_torch",
                  "silu_mul": "F.silu(gate)*up in fp32 + per-token torch quant",
                  "cast_transpose": "two separate quantisations: per_token_cast_to_fp8(x) and of x.t().contiguous()"
                  }[shape.kind]

    def ours() -> Impl:
        fn = _fused_fns(device)[shape.kind]
        note = "fused kernel" if device.type == "cuda" else "CPU smoke: public op = torch path"
        if not exact:
            out = fn(x)
            if out[0].shape == ref[0].shape:
                differing = (out[0].view(torch.uint8) != ref[0].view(torch.uint8)).float().mean().item()
                note += f"; {100 * differing:.4f}% of e4m3 bytes differ from the torch path"
        return Impl(harness.OURS, fn, sets, valid, reference, note=note, threshold=threshold)

    return [
        (harness.OURS, ours),
        ("torch_quant", lambda: Impl("torch_quant", torch_fn, sets, valid, reference, note=torch_note,
                                     threshold=threshold)),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_quant", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (for --device cpu smoke runs)")
    harness.common_args(parser)
    args = parser.parse_args(argv)
    shapes = SMOKE if args.smoke else quant_shapes(args.quick)
    return harness.run_family("quant" + ("-smoke" if args.smoke else ""), shapes, build, args)


if __name__ == "__main__":
    sys.exit(main())
