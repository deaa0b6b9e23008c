"""Inputs and an independent float64 model of the indexer's MQA logits, for the attention tests.

The inputs follow DeepGEMM's ``tests/test_attention.py`` (54e2261) at small sizes: bf16 normals cast to e4m3 (q as is,
KV per token with ``per_custom_dims_cast_to_fp8(kv, (0,), False)`` / the paged cache's ``kv_cache_cast_to_fp8``:
amax / 448 scales, values then scales inside each 64-token block), float32 weights, its ``ks`` / ``ke`` patterns
(causal with a prefix; a context-parallel rank's two chunks) and its paged context lengths (``[0.7, 1.3] x avg``,
per-query ``next_n`` lengths, the last one the row's, blocks from one random permutation: a scrambled table).

The model is numpy float64 over the dequantised inputs, one head at a time (not ``deep_fp8_gemm.attention``'s
einsum), with ``-inf`` outside each query's window.
"""

from __future__ import annotations

import numpy as np
import torch

from deep_fp8_gemm.compat import per_custom_dims_cast_to_fp8

FP8 = torch.float8_e4m3fn
NEG_INF = float("-inf")


def generate_ks_ke(seq_len: int, seq_len_kv: int, disable_cp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference test's windows: causal with a ``seq_len_kv - seq_len`` prefix, or context parallelism's two
    chunks of rank ``cp_size // 3``."""
    if disable_cp:
        ks = torch.zeros(seq_len, dtype=torch.int32)
        return ks, torch.arange(seq_len, dtype=torch.int32) + (seq_len_kv - seq_len)
    assert seq_len_kv % seq_len == 0 and seq_len % 2 == 0
    chunk, cp_size = seq_len // 2, seq_len_kv // seq_len
    cp_id = cp_size // 3
    ks = torch.zeros(seq_len, dtype=torch.int32)
    ke = torch.zeros(seq_len, dtype=torch.int32)
    for i in range(chunk):
        ke[i] = cp_id * chunk + i
        ke[i + chunk] = (cp_size * 2 - 1 - cp_id) * chunk + i
    return ks, ke


def dense_inputs(seq_len: int, seq_len_kv: int, num_heads: int, head_dim: int, seed: int):
    """``(q e4m3 [seq, H, D], (kv e4m3, kv_sf), weights fp32, q_bf16, kv_bf16)``."""
    g = torch.Generator().manual_seed(seed)
    q_bf16 = torch.randn(seq_len, num_heads, head_dim, generator=g).bfloat16()
    kv_bf16 = torch.randn(seq_len_kv, head_dim, generator=g).bfloat16()
    weights = torch.randn(seq_len, num_heads, generator=g)
    kv, kv_sf = per_custom_dims_cast_to_fp8(kv_bf16, (0,), False)
    return q_bf16.to(FP8), (kv, kv_sf.reshape(seq_len_kv).contiguous()), weights, q_bf16, kv_bf16


def kv_cache_cast_to_fp8(x: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, 64, 1, D]`` bf16 -> the fused cache ``[num_blocks, 64, 1, D + 4]`` uint8 (per token amax / 448,
    values ``x * (1 / sf)``), as the reference test builds it."""
    num_blocks, block_size, heads, head_dim = x.shape
    assert heads == 1
    sf = x.abs().float().amax(dim=3, keepdim=True).clamp(1e-4) / 448.0
    scaled = (x * (1.0 / sf)).to(FP8)
    fused = torch.empty((num_blocks, block_size * (head_dim + 4)), dtype=torch.uint8)
    fused[:, :block_size * head_dim] = scaled.view(num_blocks, block_size * head_dim).view(torch.uint8)
    fused[:, block_size * head_dim:] = sf.reshape(num_blocks, block_size).contiguous().view(torch.uint8)
    return fused.view(num_blocks, block_size, 1, head_dim + 4)


def paged_inputs(batch: int, next_n: int, num_heads: int, head_dim: int, avg_kv: int, seed: int,
                 extra_blocks: int = 3, lens: list[int] | None = None):
    """``(q e4m3 [B, next_n, H, D], kv_cache, weights [B * next_n, H], context_lens [B, next_n] int32, block_table,
    max_model_len)`` as the reference test draws them (block table rows from one permutation of the blocks, so a
    row's blocks are scattered over the cache; ``extra_blocks`` unused blocks in the pool; ``lens``: the rows' last
    context lengths instead of drawn ones)."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.randint(int(0.7 * avg_kv), int(1.3 * avg_kv), (batch,), generator=g, dtype=torch.int32)
    lens = drawn if lens is None else torch.tensor(lens, dtype=torch.int32)
    blocks_per_row = (lens + 63) // 64
    max_model_len = int(blocks_per_row.max()) * 64
    total = int(blocks_per_row.sum()) + extra_blocks
    cache = kv_cache_cast_to_fp8(torch.randn(total, 64, 1, head_dim, generator=g).bfloat16())
    table = torch.zeros(batch, int(blocks_per_row.max()), dtype=torch.int32)
    pool = torch.randperm(total, generator=g).to(torch.int32)
    offset = 0
    for b, n in enumerate(blocks_per_row.tolist()):
        table[b, :n] = pool[offset:offset + n]
        offset += n
    q = torch.randn(batch, next_n, num_heads, head_dim, generator=g).bfloat16().to(FP8)
    weights = torch.randn(batch * next_n, num_heads, generator=g)
    context = ((lens[:, None] + 1) * torch.rand(batch, next_n, generator=g)).int()
    context[:, -1] = lens
    return q, cache, weights, context.contiguous(), table, max_model_len


def model_scores(q: torch.Tensor, k: np.ndarray, s: np.ndarray, w: torch.Tensor) -> np.ndarray:
    """float64 ``[m, n]``: ``s[j] · Σ_h w[i, h] · max(q[i, h] · k[j], 0)`` (q e4m3 ``[m, H, D]``, k float64 ``[n, D]``),
    head by head."""
    qv = q.float().double().numpy()
    wv = w.double().numpy()
    out = np.zeros((qv.shape[0], k.shape[0]))
    for h in range(qv.shape[1]):
        out += wv[:, h:h + 1] * np.maximum(qv[:, h] @ k.T, 0.0)
    return out * s[None]


def dense_model(q, kv, kv_sf, w, ks, ke) -> torch.Tensor:
    """float64 ``[seq_len, seq_len_kv]`` logits, ``-inf`` outside ``[ks, ke)`` (clamped to the KV)."""
    out = model_scores(q, kv.float().double().numpy(), kv_sf.double().numpy(), w)
    j = np.arange(kv.shape[0])
    inside = (j[None] >= ks.numpy()[:, None]) & (j[None] < ke.numpy()[:, None])
    return torch.from_numpy(np.where(inside, out, NEG_INF))


def decompress(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, seq_len_kv: int) -> torch.Tensor:
    """A compressed (``max_seqlen_k``) result back to ``[seq_len, seq_len_kv]``, ``-inf`` outside the windows, as the
    reference test does (windows clamped to the KV and to the compressed width)."""
    full = torch.full((logits.shape[0], seq_len_kv), NEG_INF, dtype=torch.float64)
    for i in range(logits.shape[0]):
        lo = min(max(int(ks[i]), 0), seq_len_kv)
        hi = max(min(int(ke[i]), seq_len_kv, lo + logits.shape[1]), lo)
        full[i, lo:hi] = logits[i, :hi - lo].double()
    return full


def paged_model(q, cache, w, context, table, width: int) -> torch.Tensor:
    """float64 ``[B * next_n, width]``: row ``b * next_n + t`` at ``p < min(context[b, t], context[b, -1], width)``,
    ``-inf`` elsewhere (the cache read block by block through ``table``)."""
    batch, next_n, _, head_dim = q.shape
    raw = cache.reshape(cache.shape[0], -1)
    values = raw[:, :64 * head_dim].contiguous().view(FP8).view(-1, 64, head_dim).float().double().numpy()
    scales = raw[:, 64 * head_dim:].contiguous().view(torch.float32).view(-1, 64).double().numpy()
    out = torch.full((batch * next_n, width), NEG_INF, dtype=torch.float64)
    for b in range(batch):
        last = int(context[b, -1])
        if last <= 0:
            continue
        pos = np.arange(last)
        blocks = table[b].numpy()[pos // 64]
        scores = model_scores(q[b], values[blocks, pos % 64], scales[blocks, pos % 64], w[b * next_n:(b + 1) * next_n])
        for t in range(next_n):
            n = max(0, min(int(context[b, t]), last, width))
            out[b * next_n + t, :n] = torch.from_numpy(scores[t, :n])
    return out


def assert_logits_match(out: torch.Tensor, expected: torch.Tensor, written: torch.Tensor, rtol: float) -> None:
    """``out`` equals the float64 ``expected`` at the ``written`` entries within ``rtol`` of the row's largest value
    (the tensor cores' k32 accumulation and fp32 / bf16 rounding), and is finite there."""
    got = out.double()[written]
    want = expected[written]
    assert torch.isfinite(got).all()
    if want.numel():
        scale = want.abs().max().clamp_min(1e-30)
        err = (got - want).abs().max()
        assert err <= rtol * scale, f"max |err| {err:.3g} > {rtol:g} x {scale:.3g}"
