"""vLLM's and SGLang's DeepSeek-V3.2 indexer call sequences, driven on CPU tensors through the ``deep_gemm`` drop-in
(issue 44): what their SM90 code paths pass to ``fp8_fp4_mqa_logits`` / ``fp8_mqa_logits``, ``fp8_fp4_paged_mqa_logits``
/ ``fp8_paged_mqa_logits`` and ``get_paged_mqa_logits_metadata``, and the top-k they then take over the written window
only, against the top-k of an independent float64 model.

Reproduced from their sources (not copied), read 2026-12 from the stored snapshots:
* vLLM ``vllm/model_executor/layers/sparse_attn_indexer.py`` (``sparse_attn_indexer``) over the wrappers of
  ``vllm/utils/deep_gemm.py`` (names resolved with ``getattr``, forwarded positionally, ``clean_logits=`` by keyword,
  ``indices=`` only when given: :class:`VllmDeepGemm`): prefill chunks gather the
  cached K into a contiguous ``(T, D)`` e4m3 workspace and ``(T, 4)`` uint8 scales, viewed as float32 and squeezed,
  then ``fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, clean_logits=False)`` and
  ``top_k_per_row_prefill(logits, ks, ke, ..., logits.stride(0), logits.stride(1), topk)``; decode views the indexer
  cache ``[blocks, 64, D + 4]`` as ``[blocks, 64, 1, D + 4]`` (``unsqueeze(-2)``), reshapes q to ``[B, next_n, H, D]``
  and calls ``fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights[:B * next_n], seq_lens (B, next_n),
  block_table, schedule_metadata, max_model_len=..., clean_logits=False)``, the metadata from
  ``get_paged_mqa_logits_metadata(seq_lens, block_size, num_sms)`` (``vllm/v1/attention/backends/mla/indexer.py``).
* SGLang ``python/sglang/srt/layers/attention/dsa/dsa_indexer.py``: ``_get_topk_paged`` (seq lens as ``(T, 1)``,
  ``deep_gemm.fp8_paged_mqa_logits(q.unsqueeze(1), kv.view(pages, 64, 1, 132), weights, ...,
  clean_logits=False)`` with ``get_paged_mqa_logits_metadata(lens_2d, 64, deep_gemm.get_num_sms())``; the
  target-verify path with ``(B, next_n)`` lengths and ``block_tables[::next_n]``, a strided table) and
  ``_get_topk_ragged`` / ``_get_topk_ragged_with_cp`` (``deep_gemm.fp8_mqa_logits(q, (k_fp8, k_scale), weights, ks,
  ke, clean_logits=False)``).
Their ``torch.cuda`` queries are replaced by the drop-in's ``get_num_sms()`` (what SGLang asks anyway; vLLM asks the
device's SM count, which is the same number).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from deep_fp8_gemm import set_num_sms
from tests._attention import FP8, NEG_INF, dense_model, kv_cache_cast_to_fp8, paged_model
from deep_fp8_gemm.compat import dropin
from tests.dropin.conftest import clean_imports

TOPK = 16


@pytest.fixture(scope="module")
def deep_gemm():
    """``import deep_gemm`` as the consumers do, served by the import hook with no other provider: every indexer
    call below runs on ours (a forwarded call would fail: there is nothing to forward to)."""
    with clean_imports():
        dropin.enable()
        yield importlib.import_module("deep_gemm")


# ---------------------------------------------------------------------------------------------- the serving state
class Cache:
    """An indexer K cache as both keep it: ``[blocks, 64, D + 4]`` uint8, each block's 64 x D e4m3 then 64 fp32 scales,
    and per request a block table row (blocks drawn from one permutation) and its tokens."""

    def __init__(self, lens: list[int], head_dim: int = 128, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        blocks = [(n + 63) // 64 for n in lens]
        total = sum(blocks) + 2
        self.head_dim = head_dim
        self.kv = kv_cache_cast_to_fp8(torch.randn(total, 64, 1, head_dim, generator=g).bfloat16()).squeeze(2)
        self.table = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
        pool, at = torch.randperm(total, generator=g).to(torch.int32), 0
        for r, n in enumerate(blocks):
            self.table[r, :n] = pool[at:at + n]
            at += n
        self.lens = lens

    def gather(self, r: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's cp_gather_indexer_k_quant_cache / SGLang's get_index_k_scale_buffer for request r's first n tokens:
        ``(n, D)`` e4m3 and ``(n, 4)`` uint8 scale bytes."""
        pos = torch.arange(n)
        d = self.head_dim
        blocks = self.kv.reshape(self.kv.shape[0], -1)[self.table[r, pos // 64].long()]  # (n, 64 x (D + 4)) bytes
        values = blocks[:, :64 * d].reshape(n, 64, d)[torch.arange(n), pos % 64]
        scales = blocks[:, 64 * d:].reshape(n, 64, 4)[torch.arange(n), pos % 64]
        return values.contiguous().view(FP8), scales.contiguous()


def queries(tokens: int, heads: int = 64, head_dim: int = 128, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, head_dim, generator=g).bfloat16().to(FP8)
    weights = torch.randn(tokens, heads, generator=g) * heads ** -0.5 * head_dim ** -0.5
    return q, weights


def topk_rows(logits: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, k: int) -> list[list[int]]:
    """The consumers' top-k kernels read each row's [lo, hi) only (through the row stride): sorted indices
    (relative to lo) of the k largest."""
    out = []
    for r in range(logits.shape[0]):
        a, b = int(lo[r]), int(hi[r])
        row = torch.as_strided(logits, (b - a,), (logits.stride(1),), logits.storage_offset() + r * logits.stride(0) + a)
        out.append(sorted(torch.topk(row.double(), min(k, b - a)).indices.tolist()))
    return out


# ---------------------------------------------------------------------------------------------- vLLM
class VllmDeepGemm:
    """vllm/utils/deep_gemm.py's wrappers on SM90: names resolved with getattr on the imported module at first use
    (a missing one is a stub that raises), their own signatures, forwarding to deep_gemm positionally with
    ``clean_logits=`` by keyword and ``indices=`` only when given."""

    def __init__(self, module):
        self._mqa = getattr(module, "fp8_fp4_mqa_logits", None)
        self._paged = getattr(module, "fp8_fp4_paged_mqa_logits", None)
        self._metadata = getattr(module, "get_paged_mqa_logits_metadata", None)
        assert None not in (self._mqa, self._paged, self._metadata), "vLLM would fall back to its _missing stub"

    def fp8_fp4_mqa_logits(self, q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits):
        return self._mqa(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=clean_logits)

    def get_paged_mqa_logits_metadata(self, context_lens, block_size, num_sms, indices=None):
        kwargs = {} if indices is None else {"indices": indices}
        return self._metadata(context_lens, block_size, num_sms, **kwargs)

    def fp8_fp4_paged_mqa_logits(self, q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                 max_model_len, clean_logits, indices=None):
        kwargs = {} if indices is None else {"indices": indices}
        return self._paged(q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len,
                           clean_logits=clean_logits, **kwargs)


def vllm_prefill(deep_gemm, cache: Cache, new: list[int], q, weights):
    """One prefill chunk of sparse_attn_indexer: the chunk's requests' K gathered back to back, token t of request r
    (its position p = lens[r] - new[r] + i) scoring [start_r, start_r + p + 1)."""
    ks, ke, ks_parts, kv_parts, sf_parts, at = [], [], [], [], [], 0
    for r, (n_ctx, n_new) in enumerate(zip(cache.lens, new)):
        values, scales = cache.gather(r, n_ctx)
        kv_parts.append(values)
        sf_parts.append(scales)
        for i in range(n_new):
            ks.append(at)
            ke.append(at + n_ctx - n_new + i + 1)
        at += n_ctx
    k_quant, k_scale_bytes = torch.cat(kv_parts), torch.cat(sf_parts)
    cu_seqlen_ks, cu_seqlen_ke = torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)
    logits = VllmDeepGemm(deep_gemm).fp8_fp4_mqa_logits((q, None), (k_quant, k_scale_bytes.view(torch.float32).squeeze(-1)),
                                                        weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=False)
    return logits, cu_seqlen_ks, cu_seqlen_ke, k_quant, k_scale_bytes.view(torch.float32).squeeze(-1)


def test_vllm_prefill_chunk(deep_gemm):
    cache = Cache([300, 97, 510], seed=2)
    new = [40, 97, 23]
    q, w = queries(sum(new))
    logits, ks, ke, k, k_scale = vllm_prefill(deep_gemm, cache, new, q, w)
    assert logits.shape == (sum(new), sum(cache.lens)) and logits.dtype == torch.float32
    expected = dense_model(q, k, k_scale, w, ks, ke)
    assert topk_rows(logits, ks, ke, TOPK) == topk_rows(expected, ks, ke, TOPK)


def vllm_decode(deep_gemm, cache: Cache, next_n: int, q, weights):
    """The decode branch: seq_lens (B, next_n) with token t of request b at seq_len - next_n + t + 1 tokens."""
    batch = len(cache.lens)
    seq_lens = torch.tensor([[n - next_n + t + 1 for t in range(next_n)] for n in cache.lens], dtype=torch.int32)
    vllm = VllmDeepGemm(deep_gemm)
    num_sms = deep_gemm.get_num_sms()  # the metadata builder's self.num_sms (the device's SM count)
    schedule_metadata = vllm.get_paged_mqa_logits_metadata(seq_lens, 64, num_sms)
    kv_cache = cache.kv.unsqueeze(-2)  # kv_cache_as_quant_view, FP8
    padded_q = q.reshape(batch, -1, *q.shape[1:])
    max_model_len = cache.table.shape[1] * 64
    logits = vllm.fp8_fp4_paged_mqa_logits((padded_q, None), kv_cache, weights[:batch * next_n], seq_lens, cache.table,
                                           schedule_metadata, max_model_len=max_model_len, clean_logits=False)
    return logits, seq_lens, kv_cache, padded_q


@pytest.mark.parametrize("next_n", [1, 2])
def test_vllm_decode(deep_gemm, next_n):
    cache = Cache([700, 64, 1, 333], seed=3)
    q, w = queries(len(cache.lens) * next_n, seed=next_n)
    logits, seq_lens, kv_cache, padded_q = vllm_decode(deep_gemm, cache, next_n, q, w)
    expected = paged_model(padded_q, kv_cache, w, seq_lens, cache.table, logits.shape[1])
    lo, hi = torch.zeros(logits.shape[0], dtype=torch.long), seq_lens.reshape(-1).long()
    assert topk_rows(logits, lo, hi, TOPK) == topk_rows(expected, lo, hi, TOPK)


# ---------------------------------------------------------------------------------------------- SGLang
def sglang_get_topk_paged(deep_gemm, cache: Cache, q, weights_3d):
    """_get_topk_paged (decode, one token per request): lengths (T,) viewed (T, 1), q.unsqueeze(1), the legacy name."""
    seqlens_32 = torch.tensor(cache.lens, dtype=torch.int32)
    seqlens_32_2d = seqlens_32.contiguous().view(-1, 1)
    schedule_metadata = deep_gemm.get_paged_mqa_logits_metadata(seqlens_32_2d, 64, deep_gemm.get_num_sms())
    kv_cache_fp8 = cache.kv.view(cache.kv.shape[0], -1).view(cache.kv.shape[0], 64, 1, cache.head_dim + 4)
    weights = weights_3d.squeeze(2)
    max_seq_len = cache.table.shape[1] * 64
    logits = deep_gemm.fp8_paged_mqa_logits(q.unsqueeze(1)[:q.shape[0]], kv_cache_fp8, weights[:q.shape[0]],
                                            seqlens_32_2d, cache.table, schedule_metadata, max_seq_len,
                                            clean_logits=False)
    return logits, seqlens_32, kv_cache_fp8, weights


def test_sglang_paged(deep_gemm):
    cache = Cache([120, 900, 64, 5], seed=4)
    q, w = queries(4, seed=4)
    logits, lens, kv_cache, w2 = sglang_get_topk_paged(deep_gemm, cache, q, w[:, :, None])
    expected = paged_model(q.unsqueeze(1), kv_cache, w2, lens[:, None], cache.table, logits.shape[1])
    lo = torch.zeros(4, dtype=torch.long)
    assert topk_rows(logits, lo, lens.long(), TOPK) == topk_rows(expected, lo, lens.long(), TOPK)


def test_sglang_target_verify_native(deep_gemm):
    """Target verify with next_n = 2: q viewed (B, next_n, H, D), (B, next_n) lengths, and the per-token table
    expanded by repeat_interleave then de-expanded as block_tables[::next_n] (a row stride of next_n rows)."""
    cache, next_n = Cache([300, 77, 512], seed=5), 2
    q, w = queries(3 * next_n, seed=5)
    ctx_2d = torch.tensor([[n - 1, n] for n in cache.lens], dtype=torch.int32)
    expanded = cache.table.repeat_interleave(next_n, dim=0)
    table = expanded[::next_n]
    assert table.stride(0) == next_n * expanded.shape[1] and not table.is_contiguous()
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx_2d, 64, deep_gemm.get_num_sms())
    kv_cache = cache.kv.unsqueeze(2)
    logits = deep_gemm.fp8_paged_mqa_logits(q.view(3, next_n, *q.shape[1:]), kv_cache, w, ctx_2d, table, meta,
                                            cache.table.shape[1] * 64, clean_logits=False)
    expected = paged_model(q.view(3, next_n, *q.shape[1:]), kv_cache, w, ctx_2d, cache.table, logits.shape[1])
    lo = torch.zeros(6, dtype=torch.long)
    assert topk_rows(logits, lo, ctx_2d.reshape(-1).long(), TOPK) == topk_rows(expected, lo, ctx_2d.reshape(-1).long(),
                                                                                 TOPK)


@pytest.mark.parametrize("with_cp", [False, True])
def test_sglang_ragged(deep_gemm, with_cp):
    """_get_topk_ragged: every request's K gathered back to back, ks = its start, ke = ks + position + 1;
    _get_topk_ragged_with_cp: one request's chunk, ks = 0, ke_offset = arange(kv_len - q_len + 1, kv_len + 1)."""
    cache = Cache([200, 333] if not with_cp else [600], seed=6)
    q_lens = [50, 21] if not with_cp else [40]
    q, w = queries(sum(q_lens), seed=6)
    parts = [cache.gather(r, n) for r, n in enumerate(cache.lens)]
    k_fp8 = torch.cat([p[0] for p in parts])
    k_scale = torch.cat([p[1] for p in parts]).view(torch.float32).squeeze(-1)
    ks, ke, at = [], [], 0
    for n_ctx, n_q in zip(cache.lens, q_lens):
        ks += [at] * n_q
        ke += [at + n_ctx - n_q + i + 1 for i in range(n_q)]
        at += n_ctx
    ks, ke = torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)
    weights = w[:, :, None].squeeze(-1)
    logits = deep_gemm.fp8_mqa_logits(q[:ks.shape[0]], (k_fp8, k_scale), weights[:ks.shape[0]], ks, ke,
                                      clean_logits=False)
    assert logits.shape == (ks.shape[0], k_fp8.shape[0])
    expected = dense_model(q, k_fp8, k_scale, weights, ks, ke)
    assert topk_rows(logits, ks, ke, TOPK) == topk_rows(expected, ks, ke, TOPK)


# ---------------------------------------------------------------------------------------------- simulated
@pytest.mark.skipif(not __import__("shutil").which("g++"), reason="the simulator builds kernels with g++")
def test_consumers_in_the_simulator(deep_gemm, monkeypatch):
    """vLLM's decode (next_n 2) and SGLang's ragged prefill under DFG_SIMULATE=1 (4 SMs): the kernels' logits at the
    consumers' windows match the float64 model to the simulator's tensor-core tolerance, and the top-k values agree."""
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    set_num_sms(4)
    try:
        cache = Cache([700, 64, 1, 333], seed=3)
        q, w = queries(8, seed=2)
        logits, seq_lens, kv_cache, padded_q = vllm_decode(deep_gemm, cache, 2, q, w)
        expected = paged_model(padded_q, kv_cache, w, seq_lens, cache.table, logits.shape[1])
        _close_at(logits, expected, expected != NEG_INF)
        cache = Cache([300, 97], seed=2)
        q, w = queries(60, seed=7)
        logits, ks, ke, k, k_scale = vllm_prefill(deep_gemm, cache, [40, 20], q, w)
        expected = dense_model(q, k, k_scale, w, ks, ke)
        _close_at(logits, expected, expected != NEG_INF)
    finally:
        set_num_sms(0)


def _close_at(got: torch.Tensor, expected: torch.Tensor, where: torch.Tensor) -> None:
    diff = (got.double()[where] - expected[where]).abs().max()
    assert diff <= 2e-3 * expected[where].abs().max(), diff
