"""The DeepSeek-V3.2 indexer's MQA logits (deep_fp8_gemm.attention) against the HBM floor of their bytes (needs sm_90).

    python -m bench.bench_attention [--quick] [--out DIR]

Paged decode (``fp8_paged_mqa_logits``) at DeepSeek-V3.2's indexer shape (64 heads, head_dim 128, 64-token cache
blocks; next_n 1, and 2 with one MTP token) over batch x context 4K-128K, and dense prefill (``fp8_mqa_logits``,
causal windows) at 4K queries. Each case is checked against the exact reference (float64 on the GPU, the written
entries only: calc_diff < 1e-5) before it is timed with ``bench/timing.py`` (L2 flushed, median of >= 20 runs).

Bytes (the model of docs/indexer.md, :func:`paged_bytes` / :func:`dense_bytes`): the cache's blocks read once per
row (``ceil(L / 64) x 64 x (D + 4)``), q, weights, the block table, and the logits written once (the window only).
The report gives µs, GB/s, the HBM floor at 4.8 TB/s and the fraction of it reached, the tensor-core floor at 1979
TFLOPS, and writes ``<out>/attention.json``. Without an sm_90 device it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HBM_BYTES_PER_S = 4.8e12      # H200
FP8_FLOPS_PER_S = 1979e12     # dense FP8 tensor-core peak (H100 / H200 SXM)
HEADS, HEAD_DIM, BLOCK_KV = 64, 128, 64  # DeepSeek-V3.2: index_n_heads 64, index_head_dim 128; cache blocks of 64
CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
BATCHES = (1, 32, 128)


def paged_bytes(batch: int, next_n: int, context: int, heads: int = HEADS, head_dim: int = HEAD_DIM,
                logits_bytes: int = 4) -> int:
    """Bytes one paged call moves at least: every row's cache blocks once (values and scales), q, weights, the block
    table entries, and the written logits (``next_n x context`` per row)."""
    blocks = -(-context // BLOCK_KV)
    per_row = (blocks * BLOCK_KV * (head_dim + 4) + next_n * heads * (head_dim + 4) + 4 * blocks
               + next_n * context * logits_bytes)
    return batch * per_row


def paged_flops(batch: int, next_n: int, context: int, heads: int = HEADS, head_dim: int = HEAD_DIM) -> int:
    return 2 * batch * next_n * context * heads * head_dim


def dense_bytes(seq_len: int, seq_len_kv: int, written: int, heads: int = HEADS, head_dim: int = HEAD_DIM,
                logits_bytes: int = 4) -> int:
    """Bytes of one dense call: q, weights, KV and its scales once, and ``written`` logits."""
    return seq_len * heads * (head_dim + 4) + seq_len_kv * (head_dim + 4) + 16 * seq_len + written * logits_bytes


def floors_us(nbytes: int, flops: int) -> tuple[float, float]:
    """``(HBM floor, tensor-core floor)`` in µs."""
    return nbytes / HBM_BYTES_PER_S * 1e6, flops / FP8_FLOPS_PER_S * 1e6


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"device is sm_{''.join(map(str, torch.cuda.get_device_capability()))}, the kernels need sm_90"
    return None


def _paged_case(batch: int, next_n: int, context: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = -(-context // BLOCK_KV)
    total = batch * blocks
    cache = torch.randint(0, 120, (total, BLOCK_KV * (HEAD_DIM + 4)), generator=g, device="cuda", dtype=torch.uint8)
    scales = torch.rand(total, BLOCK_KV, generator=g, device="cuda") * 0.01 + 0.001
    cache[:, BLOCK_KV * HEAD_DIM:] = scales.view(torch.uint8).view(total, -1)
    cache = cache.view(total, BLOCK_KV, 1, HEAD_DIM + 4)
    table = torch.randperm(total, generator=g, device="cuda").to(torch.int32).view(batch, blocks)
    q = torch.randn(batch, next_n, HEADS, HEAD_DIM, generator=g, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.randn(batch * next_n, HEADS, generator=g, device="cuda")
    lens = torch.tensor([[context - next_n + t + 1 for t in range(next_n)]] * batch, dtype=torch.int32, device="cuda")
    return q, cache, weights, lens, table


def bench_paged(quick: bool) -> list[dict]:
    from deep_fp8_gemm import attention as A
    from deep_fp8_gemm.utils import calc_diff, get_num_sms

    from .timing import L2Flusher, time_call

    flusher, rows = L2Flusher("cuda"), []
    for next_n in (1, 2):
        for batch in BATCHES[:2] if quick else BATCHES:
            for context in CONTEXTS[::2] if quick else CONTEXTS:
                q, cache, w, lens, table = _paged_case(batch, next_n, context, seed=batch + context)
                meta = A.get_paged_mqa_logits_metadata(lens, BLOCK_KV, get_num_sms())
                out = A.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, context)
                if batch * context <= 32 * 16384:  # the float64 check is slow past this; the kernel is the same
                    ref = A.fp8_paged_mqa_logits_reference(q, cache, w, lens, table, meta, context)
                    written = ref != float("-inf")
                    diff = calc_diff(out.double().masked_fill(~written, 0), ref.double().masked_fill(~written, 0))
                    assert diff < 1e-5, f"paged check failed: {batch=} {next_n=} {context=} {diff=}"
                stats = time_call(A.fp8_paged_mqa_logits, [(q, cache, w, lens, table, meta, context)], device="cuda",
                                  flusher=flusher)
                nbytes, flops = paged_bytes(batch, next_n, context), paged_flops(batch, next_n, context)
                hbm_us, tc_us = floors_us(nbytes, flops)
                rows.append(dict(form="paged", batch=batch, next_n=next_n, context=context, us=stats.median_us,
                                 bytes=nbytes, gbps=nbytes / stats.median_us / 1e3, hbm_floor_us=hbm_us,
                                 tensor_floor_us=tc_us, of_hbm_floor=hbm_us / stats.median_us))
    return rows


def bench_dense(quick: bool) -> list[dict]:
    from deep_fp8_gemm import attention as A
    from deep_fp8_gemm.utils import calc_diff

    from .timing import L2Flusher, time_call

    flusher, rows, seq_len = L2Flusher("cuda"), [], 4096
    for seq_len_kv in (8192,) if quick else (8192, 32768):
        q = torch.randn(seq_len, HEADS, HEAD_DIM, device="cuda").to(torch.float8_e4m3fn)
        kv = torch.randn(seq_len_kv, HEAD_DIM, device="cuda").to(torch.float8_e4m3fn)
        kv_sf = torch.rand(seq_len_kv, device="cuda") * 0.01 + 0.001
        w = torch.randn(seq_len, HEADS, device="cuda")
        ks = torch.zeros(seq_len, dtype=torch.int32, device="cuda")
        ke = torch.arange(seq_len, dtype=torch.int32, device="cuda") + (seq_len_kv - seq_len + 1)
        args = (q, (kv, kv_sf), w, ks, ke)
        out = A.fp8_mqa_logits(*args)
        ref = A.fp8_mqa_logits_reference(*args)
        written = ref != float("-inf")
        assert calc_diff(out.double().masked_fill(~written, 0), ref.double().masked_fill(~written, 0)) < 1e-5
        stats = time_call(A.fp8_mqa_logits, [args], device="cuda", flusher=flusher)
        inside = int(written.sum())
        nbytes = dense_bytes(seq_len, seq_len_kv, seq_len * seq_len_kv)  # clean: every entry < seq_len_kv written
        hbm_us, tc_us = floors_us(nbytes, 2 * inside * HEADS * HEAD_DIM)
        rows.append(dict(form="dense", seq_len=seq_len, seq_len_kv=seq_len_kv, us=stats.median_us, bytes=nbytes,
                         gbps=nbytes / stats.median_us / 1e3, hbm_floor_us=hbm_us, tensor_floor_us=tc_us,
                         of_hbm_floor=hbm_us / stats.median_us))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_attention", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--out", default="bench/results", help="directory for attention.json")
    args = parser.parse_args(argv)
    reason = _skip_reason()
    if reason is not None:
        print(f"bench_attention: skipped ({reason})")
        return 0
    rows = bench_paged(args.quick) + bench_dense(args.quick)
    for r in rows:
        shape = (f"B={r['batch']:4} next_n={r['next_n']} L={r['context']:6}" if r["form"] == "paged" else
                 f"S={r['seq_len']} S_kv={r['seq_len_kv']}")
        print(f"{r['form']:5} {shape:32} {r['us']:9.1f} µs {r['gbps']:7.0f} GB/s  HBM floor {r['hbm_floor_us']:8.1f} "
              f"µs ({100 * r['of_hbm_floor']:5.1f}%)  tensor floor {r['tensor_floor_us']:7.1f} µs")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
