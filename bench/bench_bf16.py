"""The BF16 / TF32 names (issue 41) against cuBLAS and their floors (needs sm_90).

    python -m bench.bench_bf16 [--quick] [--out DIR]

Rows: ``bf16_gemm_nt`` / ``_nn`` at DeepSeek-V3 / V4 projection shapes against ``torch.matmul`` (cuBLAS, the same
bf16 operands and output); ``m_grouped_bf16_gemm_nt_masked`` (SGLang's BF16 MoE runner at decode) against a loop of
per-expert matmuls; ``einsum("bhr,hdr->bhd")`` (V4's o_proj heads) against ``torch.einsum``; ``fp8_einsum`` on the
same shape; ``tf32_hc_prenorm_gemm`` (V4's mHC, n 24, num_splits 16) against its HBM floor. Each case is checked
against the float64 CPU path on a slice first (calc_diff < 1e-4; 1e-3 for FP8), then timed with ``bench/timing.py``
(L2 flushed, median of >= 20 runs). The floors: bytes at 4.8 TB/s (H200) and FLOPs at 989 TFLOPS (dense BF16 / TF32
tensor peak, H100 / H200 SXM: 989 BF16, 494 TF32). Writes ``<out>/bf16.json``. Without an sm_90 device it prints why
and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HBM_BYTES_PER_S = 4.8e12
BF16_FLOPS_PER_S = 989e12
TF32_FLOPS_PER_S = 494e12
#: (layout, m, n, k): V3's attention output / MoE-less dense shapes at decode and prefill, V4's o_proj
DENSE = [("nt", 1, 7168, 16384), ("nt", 64, 7168, 16384), ("nt", 4096, 7168, 2048), ("nt", 4096, 24576, 1536),
         ("nn", 128, 4096, 7168), ("nn", 4096, 4096, 7168)]
#: (groups, rows per group, n, k): SGLang's BF16 MoE runner at decode (V3 experts: 2 x 2048 up, 7168 down)
MASKED = [(32, 8, 4096, 7168), (32, 64, 4096, 7168), (32, 64, 7168, 2048)]
#: (b, h, r, d): V4's o_proj heads
HEADS = [(128, 8, 4096, 1024), (4096, 8, 4096, 1024)]
#: (m, k, num_splits): V4's mHC pre-norm
HC = [(64, 4 * 7168, 16), (4096, 4 * 7168, 16)]


def floors_us(nbytes: int, flops: int, flops_per_s: float = BF16_FLOPS_PER_S) -> tuple[float, float]:
    """``(HBM floor, tensor-core floor)`` in µs."""
    return nbytes / HBM_BYTES_PER_S * 1e6, flops / flops_per_s * 1e6


def gemm_bytes(m: int, n: int, k: int, groups: int = 1, out_bytes: int = 2) -> int:
    """A, B (per group) and D once each, bf16 operands."""
    return groups * (2 * m * k + 2 * n * k + out_bytes * m * n)


def hc_bytes(m: int, k: int, n: int = 24, splits: int = 16) -> int:
    """A (bf16) and B (fp32) once, the split partials of D and sqr_sum written once."""
    return 2 * m * k + 4 * n * k + 4 * splits * m * (n + 1)


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"device is sm_{''.join(map(str, torch.cuda.get_device_capability()))}, the kernels need sm_90"
    return None


def _row(form, shape, ours_us, nbytes, flops, baseline_us=None, flops_per_s=BF16_FLOPS_PER_S) -> dict:
    hbm, tc = floors_us(nbytes, flops, flops_per_s)
    return dict(form=form, shape=shape, us=ours_us, baseline_us=baseline_us, hbm_floor_us=hbm, tensor_floor_us=tc,
                of_floor=max(hbm, tc) / ours_us, vs_baseline=None if baseline_us is None else baseline_us / ours_us)


def run(quick: bool) -> list[dict]:
    import deep_fp8_gemm.compat.deep_gemm as dg
    from deep_fp8_gemm.utils import calc_diff

    from .timing import L2Flusher, time_call

    flusher, rows, g = L2Flusher("cuda"), [], torch.Generator(device="cuda").manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    for layout, m, n, k in DENSE[::2] if quick else DENSE:
        a = rand(m, k).bfloat16()
        b = rand(n, k).bfloat16() if layout == "nt" else rand(k, n).bfloat16()
        d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        fn = getattr(dg, f"bf16_gemm_{layout}")
        fn(a, b, d)
        rows_checked = min(m, 64)
        ref = torch.empty(rows_checked, n, dtype=torch.bfloat16)
        fn(a[:rows_checked].cpu(), b.cpu(), ref)
        assert calc_diff(d[:rows_checked].cpu(), ref) < 1e-4, ("dense", layout, m, n, k)
        ours = time_call(fn, [(a, b, d)], device="cuda", flusher=flusher).median_us
        bt = b.T if layout == "nt" else b
        cublas = time_call(lambda x, y, z: torch.matmul(x, y, out=z), [(a, bt, d)], device="cuda",
                           flusher=flusher).median_us
        rows.append(_row(f"bf16_gemm_{layout}", (m, n, k), ours, gemm_bytes(m, n, k), 2 * m * n * k, cublas))
    for groups, m, n, k in MASKED[:2] if quick else MASKED:
        a, b = rand(groups, m, k).bfloat16(), rand(groups, n, k).bfloat16()
        d = torch.empty(groups, m, n, dtype=torch.bfloat16, device="cuda")
        masked_m = torch.full((groups,), m, dtype=torch.int32, device="cuda")
        dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, m)
        assert calc_diff(d[0].cpu(), a[0].double().cpu() @ b[0].double().cpu().T) < 1e-4
        ours = time_call(dg.m_grouped_bf16_gemm_nt_masked, [(a, b, d, masked_m, m)], device="cuda",
                         flusher=flusher).median_us
        loop = time_call(lambda x, y, z: [torch.matmul(x[i], y[i].T, out=z[i]) for i in range(groups)],
                         [(a, b, d)], device="cuda", flusher=flusher).median_us
        rows.append(_row("m_grouped_bf16_gemm_nt_masked", (groups, m, n, k), ours, gemm_bytes(m, n, k, groups),
                         2 * groups * m * n * k, loop))
    for bsz, h, r, dd in HEADS[:1] if quick else HEADS:
        x, y = rand(bsz, h, r).bfloat16(), rand(h, dd, r).bfloat16()
        z = torch.empty(bsz, h, dd, dtype=torch.bfloat16, device="cuda")
        dg.einsum("bhr,hdr->bhd", x, y, z)
        assert calc_diff(z[:8].cpu(), torch.einsum("bhr,hdr->bhd", x[:8].double().cpu(), y.double().cpu())) < 1e-4
        ours = time_call(lambda *t: dg.einsum("bhr,hdr->bhd", *t), [(x, y, z)], device="cuda",
                         flusher=flusher).median_us
        torch_us = time_call(lambda p, q, o: o.copy_(torch.einsum("bhr,hdr->bhd", p, q)), [(x, y, z)], device="cuda",
                             flusher=flusher).median_us
        rows.append(_row("einsum bhr,hdr->bhd", (bsz, h, r, dd), ours, gemm_bytes(bsz, dd, r, h),
                         2 * bsz * h * r * dd, torch_us))
        from deep_fp8_gemm.compat import per_block_cast_to_fp8, per_token_cast_to_fp8

        xf, sx = per_token_cast_to_fp8(x.float().view(-1, r), use_ue8m0=True)
        yf = torch.empty(h, dd, r, dtype=torch.float8_e4m3fn, device="cuda")
        sy = torch.empty(h, dd // 128, r // 128, device="cuda")
        for i in range(h):
            yf[i], sy[i] = per_block_cast_to_fp8(y[i].float(), use_ue8m0=True)
        a8, b8 = (xf.view(bsz, h, r), sx.view(bsz, h, -1)), (yf, sy)
        dg.fp8_einsum("bhr,hdr->bhd", a8, b8, z)
        assert calc_diff(z[:8].cpu(), torch.einsum("bhr,hdr->bhd", x[:8].double().cpu(), y.double().cpu())) < 1e-3
        fp8_us = time_call(lambda *t: dg.fp8_einsum("bhr,hdr->bhd", *t), [(a8, b8, z)], device="cuda",
                           flusher=flusher).median_us
        rows.append(_row("fp8_einsum bhr,hdr->bhd", (bsz, h, r, dd), fp8_us, gemm_bytes(bsz, dd, r, h) // 2,
                         2 * bsz * h * r * dd, torch_us, flops_per_s=2 * BF16_FLOPS_PER_S))
    for m, k, splits in HC[:1] if quick else HC:
        a, b = rand(m, k).bfloat16(), rand(24, k)
        d, s = torch.empty(splits, m, 24, device="cuda"), torch.empty(splits, m, device="cuda")
        dg.tf32_hc_prenorm_gemm(a, b, d, s, splits)
        d_ref, s_ref = torch.empty(splits, 8, 24), torch.empty(splits, 8)
        dg.tf32_hc_prenorm_gemm(a[:8].cpu(), b.cpu(), d_ref, s_ref, splits)
        assert calc_diff(d[:, :8].cpu(), d_ref) < 1e-4 and calc_diff(s[:, :8].cpu(), s_ref) < 1e-4
        ours = time_call(dg.tf32_hc_prenorm_gemm, [(a, b, d, s, splits)], device="cuda", flusher=flusher).median_us
        rows.append(_row("tf32_hc_prenorm_gemm", (m, 24, k, splits), ours, hc_bytes(m, k), 2 * m * 24 * k,
                         flops_per_s=TF32_FLOPS_PER_S))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_bf16", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--out", default="bench/results", help="directory for bf16.json")
    args = parser.parse_args(argv)
    reason = _skip_reason()
    if reason is not None:
        print(f"bench_bf16: skipped ({reason})")
        return 0
    rows = run(args.quick)
    for r in rows:
        base = "" if r["baseline_us"] is None else f"  baseline {r['baseline_us']:8.1f} µs ({r['vs_baseline']:4.2f}x)"
        floor = max(r["hbm_floor_us"], r["tensor_floor_us"])
        print(f"{r['form']:30} {str(r['shape']):28} {r['us']:9.1f} µs  floor {floor:8.1f} µs "
              f"({100 * r['of_floor']:5.1f}%){base}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bf16.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
