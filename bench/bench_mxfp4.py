"""MXFP4 experts (issue 42, the masked decode kernel) against the FP8 masked kernel and the published W4A16 figure.

    python -m bench.bench_mxfp4 [--model] [--quick] [--out DIR]

``--model`` (any machine): the cost model's table (``deep_fp8_gemm.config.cost.mxfp4_estimate_seconds``) for
DeepSeek-V4 / V3 and Kimi-K3 expert shapes, 32 local experts, M = 1..64 tokens per expert, against the FP4 HBM floor
(the checkpoint's bytes at 4.8 TB/s), the FP8 masked kernel's model (``estimate_seconds`` of the heuristic's pick) and
Humming's W4A16 figure on H200 (Kimi W13 at M = 8: 66.9 us, inclusionAI/humming #58; its expert count is not
published, so the table gives the floor-equivalent expert count beside it). This is what docs/mxfp4.md shows.

Without ``--model`` (needs sm_90): each case checked against float64 on CPU first (calc_diff < 1e-3), then timed with
``bench/timing.py`` (L2 flushed, median of >= 20 runs), the MXFP4 kernel and the FP8 masked kernel on the same
activations; writes ``<out>/mxfp4.json``. Without an sm_90 device it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HBM_BYTES_PER_S = 4.8e12
HUMMING_W4A16_KIMI_W13_M8_US = 66.9
GROUPS = 32
#: (model, projection, N, K): w13 (N = 2I, K = H) and w2 (N = H, K = I). DeepSeek-V4's routed experts keep V3's
#: DeepSeekMoE dimensions (H 7168, I 2048); Kimi-K3's as the W4A16 figure's (N 6144, K 3584 for W13).
SHAPES = [("DeepSeek-V4", "w13", 4096, 7168), ("DeepSeek-V4", "w2", 7168, 2048),
          ("Kimi-K3", "w13", 6144, 3584), ("Kimi-K3", "w2", 3584, 3072)]
TOKENS = (1, 2, 4, 8, 16, 32, 64)


def model_rows(groups: int = GROUPS) -> list[dict]:
    """The cost model's rows (no GPU needed)."""
    from deep_fp8_gemm.config import get_config
    from deep_fp8_gemm.config.cost import estimate_seconds, mxfp4_estimate_seconds, mxfp4_hbm_bytes
    from deep_fp8_gemm.kernels.mxfp4_gemm import pick_config

    rows = []
    for model, proj, n, k in SHAPES:
        for m in TOKENS:
            cfg = pick_config(n, k, groups, m, 132)
            t = mxfp4_estimate_seconds(m, n, k, groups, cfg.block_m, cfg.block_n)
            floor = mxfp4_hbm_bytes(m, n, k, groups, cfg.block_n, stored=False) / HBM_BYTES_PER_S
            fp8 = estimate_seconds(get_config(m, n, k, groups, "masked"), m)
            rows.append(dict(model=model, proj=proj, n=n, k=k, m=m, tile=f"{cfg.block_m}x{cfg.block_n}",
                             mxfp4_us=t * 1e6, fp4_floor_us=floor * 1e6, over_floor=t / floor, fp8_us=fp8 * 1e6,
                             speedup_vs_fp8=fp8 / t))
    return rows


PREFILL_TOKENS = (64, 256, 1024, 4096)


def prefill_rows(groups: int = GROUPS) -> list[dict]:
    """The cost model at prefill: ``m`` tokens per expert on the contiguous layout (alignment 128), the register-A
    kernel's pick (BLOCK_M up to 128 tokens: the weights converted once per tile of tokens) against the FP8 contiguous
    kernel's model at the heuristic's pick (m_sum = groups x m)."""
    from deep_fp8_gemm.config import get_config
    from deep_fp8_gemm.config.cost import estimate_seconds, mxfp4_estimate_seconds
    from deep_fp8_gemm.kernels.mxfp4_gemm import pick_config

    rows = []
    for model, proj, n, k in SHAPES:
        for m in PREFILL_TOKENS:
            cfg = pick_config(n, k, groups, m, 132, "contiguous")
            t = mxfp4_estimate_seconds(m, n, k, groups, cfg.block_m, cfg.block_n)
            fp8 = estimate_seconds(get_config(groups * m, n, k, groups, "contiguous"), groups * m)
            rows.append(dict(model=model, proj=proj, n=n, k=k, m=m, tile=f"{cfg.block_m}x{cfg.block_n}",
                             mxfp4_us=t * 1e6, fp8_us=fp8 * 1e6, speedup_vs_fp8=fp8 / t))
    return rows


def format_prefill(rows: list[dict]) -> str:
    lines = ["| model | GEMM | N | K | M / expert | tile | MXFP4 register-A (model) us | FP8 contiguous (model) us | "
             "FP8 / MXFP4 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['proj']} | {r['n']} | {r['k']} | {r['m']} | {r['tile']} | "
                     f"{r['mxfp4_us']:.1f} | {r['fp8_us']:.1f} | {r['speedup_vs_fp8']:.2f} |")
    return "\n".join(lines)


def format_model(rows: list[dict]) -> str:
    lines = ["| model | GEMM | N | K | M / expert | tile | MXFP4 (model) us | FP4 floor us | / floor | FP8 masked "
             "(model) us | FP8 / MXFP4 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['proj']} | {r['n']} | {r['k']} | {r['m']} | {r['tile']} | "
                     f"{r['mxfp4_us']:.1f} | {r['fp4_floor_us']:.1f} | {r['over_floor']:.3f} | {r['fp8_us']:.1f} | "
                     f"{r['speedup_vs_fp8']:.2f} |")
    per_expert = next(r for r in rows if (r["model"], r["proj"], r["m"]) == ("Kimi-K3", "w13", 8))
    experts = HUMMING_W4A16_KIMI_W13_M8_US / (per_expert["fp4_floor_us"] / GROUPS)
    lines.append("")
    lines.append(f"{GROUPS} local experts. Humming W4A16 on H200, Kimi W13 at M = 8: {HUMMING_W4A16_KIMI_W13_M8_US} us, "
                 f"the FP4 floor of {experts:.1f} such experts; the model gives {per_expert['mxfp4_us']:.1f} us for "
                 f"{GROUPS}.")
    return "\n".join(lines)


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"device is sm_{''.join(map(str, torch.cuda.get_device_capability()))}, the kernels need sm_90"
    return None


def run_device(quick: bool) -> list[dict]:
    from deep_fp8_gemm.compat.api import m_grouped_fp8_fp4_gemm_nt_masked, m_grouped_fp8_fp8_bf16_nt_masked
    from deep_fp8_gemm.ops import mxfp4
    from deep_fp8_gemm.utils import calc_diff
    from tests.kernels.test_sim_mxfp4 import activations, dequantised_product, weights

    from .timing import bench_us

    results = []
    for model, proj, n, k in SHAPES[:2] if quick else SHAPES:
        g = 8 if quick else GROUPS
        w, sf = weights(g, n, k)
        prepared = mxfp4.prepare_mxfp4_weights(w, sf)
        dev = torch.device("cuda")
        prepared_dev = mxfp4.PreparedMxfp4(prepared.tiles.to(dev), prepared.meta.to(dev), prepared.wave_per32.to(dev))
        wd = mxfp4.dequantize_prepared(prepared).float()
        w8 = wd.to(torch.float8_e4m3fn)  # the FP8 kernel's operands of the same shape (timing only)
        s8 = torch.ones(g, n // 128, k // 128)
        for m in (1, 8, 16, 64):
            a, sa = activations(g, m, k)
            masked = torch.full((g,), m, dtype=torch.int32)
            d = torch.empty(g, m, n, dtype=torch.bfloat16, device=dev)
            args = ((a.to(dev), sa.to(dev)), prepared_dev, d, masked.to(dev), m)
            mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked(*args)
            diff = calc_diff(d.cpu().double(), dequantised_product(a, sa, w, sf))
            us = bench_us(lambda: mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked(*args))
            d8 = torch.empty_like(d)
            from deep_fp8_gemm.utils import get_col_major_tma_aligned_tensor
            fp8_args = ((a.to(dev), get_col_major_tma_aligned_tensor(sa.to(dev))), (w8.to(dev), s8.to(dev)), d8,
                        masked.to(dev), m)
            us8 = bench_us(lambda: m_grouped_fp8_fp8_bf16_nt_masked(*fp8_args))
            results.append(dict(model=model, proj=proj, n=n, k=k, m=m, groups=g, calc_diff=diff, mxfp4_us=us,
                                fp8_us=us8))
            print(f"{model} {proj} N {n} K {k} M {m}: MXFP4 {us:.1f} us, FP8 {us8:.1f} us, calc_diff {diff:.2e}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="store_true", help="print the cost model's table (any machine)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.model:
        print(format_model(model_rows()))
        print()
        print(format_prefill(prefill_rows()))
        return 0
    reason = _skip_reason()
    if reason:
        print(f"bench_mxfp4: skipped ({reason}); `python -m bench.bench_mxfp4 --model` prints the modelled table")
        return 0
    results = run_device(args.quick)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mxfp4.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
