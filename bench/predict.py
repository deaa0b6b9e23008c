"""The heuristic's predictions for the benchmark tables, written before any GPU measurement.

    python -m bench.predict [--out bench/PREDICTIONS.md]

For each shape of the reference design's tables: the config ``deep_fp8_gemm.config.get_config`` picks for
132 SMs and the time its throughput model predicts (``config.estimate_seconds``: tensor-core time vs
shared-memory bandwidth vs L2->shared fill per tile, waves, HBM floor, at 1.83 GHz), next to the H800
published number and the H200 datasheet floor. When a GPU run lands, compare the measured column of
bench/RESULTS.md with these: the gaps say which model constant to recalibrate (config.py, "Throughput model").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deep_fp8_gemm.config import (estimate_seconds, get_config, output_bytes, silu_mul_quant_bytes,
                                  up_projection_seconds)

from .shapes import DEEPSEEK_V3_NK, H800_PUBLISHED_DENSE, MOE_INTER, ContiguousShape, DenseShape, MaskedShape, \
    contiguous_shapes, dense_shapes, masked_shapes

H200_FP8_TFLOPS = 1979.0
H200_HBM_BYTES_PER_S = 4.8e12


def _row(shape, cfg, m_model: int, published: str) -> str:
    seconds = estimate_seconds(cfg, m_model)
    floor = max(shape.flops() / (H200_FP8_TFLOPS * 1e12), shape.bytes() / H200_HBM_BYTES_PER_S)
    tflops = shape.flops() / seconds / 1e12
    tiles = f"{cfg.block_m}x{cfg.block_n} s{cfg.num_stages} mc={cfg.multicast} grid={cfg.grid_size}"
    if cfg.split_k > 1:  # split-K: the tile's K blocks over split_k CTAs, reduced by the last (split_k.cuh)
        tiles += f" split_k={cfg.split_k}"
    return (f"| {shape.family} | {shape.label} | {tiles} | {seconds * 1e6:.1f} | {tflops:.0f} | "
            f"{shape.bytes() / seconds / 1e9:.0f} | {floor * 1e6:.1f} | {published} |")


def predictions() -> list[str]:
    rows = []
    for shape in dense_shapes("deepseek-v3"):
        cfg = get_config(shape.m, shape.n, shape.k, 1, "dense", 132)
        published = H800_PUBLISHED_DENSE.get(shape)
        rows.append(_row(shape, cfg, shape.m, f"{published[0]}" if published else "–"))
    for shape in contiguous_shapes():
        cfg = get_config(shape.m_sum, shape.n, shape.k, shape.num_groups, "contiguous", 132)
        # Padding-only blocks cost nothing in the kernel: model the rows of blocks holding valid rows.
        computed_rows = shape.num_groups * -(-shape.m_per_group // cfg.block_m) * cfg.block_m
        rows.append(_row(shape, cfg, computed_rows, "see RESULTS.md"))
    for shape in masked_shapes():
        cfg = get_config(shape.expected_m, shape.n, shape.k, shape.num_groups, "masked", 132)
        rows.append(_row(shape, cfg, shape.expected_m, "see RESULTS.md"))
    return rows


#: The MoE up-projection's shapes: those grouped benchmark shapes whose (N, K) is DeepSeek-V3's w13 (2I = 4096, H).
UP_PROJECTION_NK = (2 * MOE_INTER, 7168)
TOP_K = 8  # DeepSeek-V3: routed experts per token


def up_projection_shapes() -> list[ContiguousShape | MaskedShape]:
    """The contiguous and masked benchmark shapes of the up-projection (N = 2I = 4096, K = H = 7168)."""
    return [s for s in contiguous_shapes() + masked_shapes() if (s.n, s.k) == UP_PROJECTION_NK]


def activation_bytes_per_row(fused: bool, hidden: int, inter: int) -> int:
    """Bytes one routed row costs the up-projection besides the weights: A and its scales read, then either the
    fused kernel's e4m3 + scales written, or the bf16 ``gate | up`` written, read back by ``silu_mul_quant`` and
    its e4m3 + scales written."""
    a = hidden + 4 * -(-hidden // 128)
    if fused:
        return a + output_bytes("contiguous_swiglu", 1, 2 * inter)
    return a + output_bytes("contiguous", 1, 2 * inter) + silu_mul_quant_bytes(1, inter)


def up_projection_row(shape, fused: bool) -> str:
    inter, hidden, groups = shape.n // 2, shape.k, shape.num_groups
    if isinstance(shape, ContiguousShape):
        layout, m_model, rows, silu_rows = "contiguous", None, shape.m_sum, shape.m_sum
        # Padding-only blocks cost the GEMM nothing: model the rows of blocks holding valid rows, as above.
        cfg = get_config(shape.m_sum, shape.n, hidden, groups, "contiguous_swiglu" if fused else "contiguous", 132)
        m_model = groups * -(-shape.m_per_group // cfg.block_m) * cfg.block_m
    else:
        layout, m_model, rows = "masked", shape.expected_m, groups * shape.rows_per_group
        silu_rows = rows  # the unfused quantiser streams the whole [G, m_max, 2I] buffer
        cfg = get_config(shape.expected_m, shape.n, hidden, groups, "masked_swiglu" if fused else "masked", 132)
    seconds = up_projection_seconds(layout, fused, m_model, inter, hidden, groups, 132, silu_rows=silu_rows)
    per_row = activation_bytes_per_row(fused, hidden, inter)
    extra_rows = 0 if fused else silu_rows - shape.valid_m  # rows the quantiser streams beyond the valid ones
    per_row_all = per_row + (extra_rows * silu_mul_quant_bytes(1, inter)) / max(shape.valid_m, 1)
    weights = groups * (shape.n * hidden + 4 * (shape.n // 128) * -(-hidden // 128))
    tiles = f"{cfg.block_m}x{cfg.block_n} s{cfg.num_stages} mc={cfg.multicast}"
    return (f"| {'fused' if fused else 'unfused'} | {layout} {shape.label} | {tiles} | {seconds * 1e6:.1f} | "
            f"{per_row_all:,.0f} | {per_row_all * TOP_K:,.0f} | {(weights + per_row_all * shape.valid_m) / 1e6:.1f} |")


def up_projection_predictions() -> list[str]:
    rows = []
    for shape in up_projection_shapes():
        rows += [up_projection_row(shape, False), up_projection_row(shape, True)]
    return rows


#: The decode rows of the swap-AB table (issue 25): the DeepSeek-V3 dense shapes at these m.
SMALL_MS = (1, 4, 8, 16, 32)


def _tile(cfg) -> str:
    text = f"{cfg.block_m}x{cfg.block_n} s{cfg.num_stages}"
    return text + (f" split_k={cfg.split_k}" if cfg.split_k > 1 else "")


def swap_ab_row(shape: DenseShape) -> str:
    """One decode shape: the best plain and the best swap-AB config (``get_config(..., swap_ab=False / True)``),
    their modelled µs, the gain, the heuristic's pick (swap-AB where it models >= 10% faster) and the floor."""
    plain = get_config(shape.m, shape.n, shape.k, 1, "dense", 132, swap_ab=False)
    swap = get_config(shape.m, shape.n, shape.k, 1, "dense", 132, swap_ab=True)
    pick = get_config(shape.m, shape.n, shape.k, 1, "dense", 132, batch_invariant=False)  # the fast mode's
    t_plain, t_swap = estimate_seconds(plain, shape.m), estimate_seconds(swap, shape.m)
    floor = max(shape.flops() / (H200_FP8_TFLOPS * 1e12), shape.bytes() / H200_HBM_BYTES_PER_S)
    return (f"| {shape.label} | {_tile(plain)} | {t_plain * 1e6:.2f} | {_tile(swap)} | {t_swap * 1e6:.2f} | "
            f"{(t_plain / t_swap - 1) * 100:+.0f}% | {'swap-AB' if pick.swap_ab else 'plain'} | {floor * 1e6:.2f} | "
            f"see RESULTS.md |")


def swap_ab_predictions() -> list[str]:
    return [swap_ab_row(DenseShape(m, n, k)) for n, k in DEEPSEEK_V3_NK for m in SMALL_MS]


#: The decode rows of the batch-invariance table (issue 37).
DECODE_MS = (1, 2, 4, 8, 16, 32, 64, 128)


def _pick(cfg) -> str:
    return _tile(cfg) + (" swap-AB" if cfg.swap_ab else "")


def invariance_rows() -> list[str]:
    """Per DeepSeek-V3 dense shape and decode m: the fast mode's pick and the batch-invariant pick (no split-K, no
    swap-AB), their modelled µs and what invariance costs."""
    rows = []
    for n, k in DEEPSEEK_V3_NK:
        for m in DECODE_MS:
            fast = get_config(m, n, k, 1, "dense", 132, batch_invariant=False)
            inv = get_config(m, n, k, 1, "dense", 132)
            t_fast, t_inv = estimate_seconds(fast, m), estimate_seconds(inv, m)
            rows.append(f"| {m}x{n}x{k} | {_pick(fast)} | {t_fast * 1e6:.2f} | {_pick(inv)} | {t_inv * 1e6:.2f} | "
                        f"{(t_inv / t_fast - 1) * 100:+.0f}% |")
    return rows


def render() -> str:
    head = [
        "# Predicted performance (model, not measured)",
        "",
        "Generated by `python -m bench.predict`. The heuristic's throughput model (deep_fp8_gemm/config.py) for",
        "the config it picks on a 132-SM H200, at 1.83 GHz. **No GPU measurement yet**: these are the numbers to",
        "check the first GPU run against (bench/RESULTS.md) and to recalibrate the model with.",
        "",
        "| kind | shape | config | model µs | model TFLOPS | model GB/s | H200 floor µs | H800 published TFLOPS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    moe = [
        "",
        "## MoE up-projection: fused SwiGLU epilogue vs bf16 GEMM + silu_mul_quant (issue 27)",
        "",
        "DeepSeek-V3's w13 (2I = 4096, H = 7168) on the grouped shapes above. unfused: the bf16 grouped GEMM plus the",
        "`silu_mul_quant` kernel (`config.silu_mul_quant_seconds`: a launch and its bytes; NOTES: guesses); fused: the",
        "`*_swiglu` kernel (`config.up_projection_seconds`). Bytes per routed row: activations only (A read; the",
        "intermediate written / read back; h written, e4m3 + 1x128 scales); per token: x top-8 routed rows; the masked",
        "unfused rows also count the buffer rows the quantiser streams past `expected_m`. MB per call includes the",
        "weights.",
        "",
        "| path | shape | config | model µs | bytes / routed row | bytes / token (top-8) | MB / call |",
        "|---|---|---|---|---|---|---|",
    ]
    swap = [
        "",
        "## Decode: swap-AB vs the plain kernel, dense m <= 32 (issue 25)",
        "",
        "The best config of each kernel for the DeepSeek-V3 dense shapes at small m (`get_config(..., swap_ab=False`",
        "/ `True)`), the model's µs, the gain of swap-AB over the plain kernel and the heuristic's pick (swap-AB where",
        "it models at least 10% faster, `config.SWAP_AB_MARGIN`). The model puts both kernels at the HBM floor except",
        "where the plain kernel's zero-filled 64-row A tile makes the SMs the bound (n = 576: few tiles, long K). The",
        "block-scaled cuBLAS column has no model: `bench.bench_dense --shapes decode` measures it next to both kernels",
        "(`deep_fp8_gemm_plain`, `deep_fp8_gemm_swap_ab`: each kernel's best config, forced).",
        "",
        "| shape | plain config | plain model µs | swap-AB config | swap-AB model µs | swap-AB gain | pick | H200 floor µs "
        "| cuBLAS block-scaled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    invariance = [
        "",
        "## Decode: the batch-invariant picks vs the fast mode (issue 37)",
        "",
        "The default mode (`deep_fp8_gemm.set_batch_invariant(True)`) never splits K or swaps A and B, so a token's",
        "bits do not depend on its batch; the fast mode (`set_batch_invariant(False)`) weighs both for each problem.",
        "Model µs of each mode's pick for the DeepSeek-V3 dense shapes at decode m; the last column is what invariance",
        "costs in the model (docs/batch-invariance.md).",
        "",
        "| shape | fast-mode pick | model µs | invariant pick | model µs | invariance costs |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + predictions() + moe + up_projection_predictions() + swap + swap_ab_predictions()
                     + invariance + invariance_rows()) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("PREDICTIONS.md"))
    args = parser.parse_args(argv)
    text = render()
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
