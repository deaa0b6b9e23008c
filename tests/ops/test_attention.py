"""The DeepSeek-V3.2 indexer's MQA logits on the CPU (issue 44): deep_fp8_gemm.attention's exact references, shapes,
strides and ``-inf`` positions against an independent float64 model, on DeepGEMM's own test cases (54e2261
``tests/test_attention.py``, at small sizes), ragged windows, a paged cache with a scrambled block table; the schedule
metadata against a port of the reference's SM90 metadata kernel; every refusal of the reference's SM90 path; the
custom ops' fake kernels; the reference's two spellings (compat / the drop-in).
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

from deep_fp8_gemm import attention as A
from deep_fp8_gemm import compat, set_num_sms
from deep_fp8_gemm.utils import calc_diff, get_num_sms
from tests._attention import (FP8, NEG_INF, assert_logits_match, decompress, dense_inputs, dense_model,
                              generate_ks_ke, paged_inputs, paged_model)


def _align(x: int, y: int) -> int:
    return (x + y - 1) // y * y


# ---------------------------------------------------------------------------------------------- dense
def _dense_cases():
    """The reference's enumerate_mqa_logits on SM90 (FP8, fp32 weights, heads 32 / 64, head_dim 32 / 64 / 128, both
    (compressed, clean) pairs, both window patterns, both logits dtypes), at seq_len 16 / seq_len_kv 96."""
    for dtype, (compressed, clean), heads, head_dim, disable_cp, seq_len_kv in itertools.product(
            (torch.bfloat16, torch.float32), ((False, True), (True, False)), (32, 64), (32, 64, 128), (False, True),
            (96,)):
        yield pytest.param(dtype, compressed, clean, heads, head_dim, disable_cp, seq_len_kv,
                           id=f"{str(dtype)[6:]}-{'cmp' if compressed else 'clean'}-h{heads}-d{head_dim}-"
                              f"{'nocp' if disable_cp else 'cp'}-kv{seq_len_kv}")


@pytest.mark.parametrize("dtype,compressed,clean,heads,head_dim,disable_cp,seq_len_kv", list(_dense_cases()))
def test_dense_reference_cases(dtype, compressed, clean, heads, head_dim, disable_cp, seq_len_kv):
    seq_len = 16
    q, (kv, kv_sf), w, q_bf16, kv_bf16 = dense_inputs(seq_len, seq_len_kv, heads, head_dim, seed=heads + head_dim)
    ks, ke = generate_ks_ke(seq_len, seq_len_kv, disable_cp)
    max_seqlen_k = int((ke - ks).max()) if compressed else 0
    logits = A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, clean_logits=clean, max_seqlen_k=max_seqlen_k,
                              logits_dtype=dtype)
    # The reference's allocation: [align(seq_len, 128 / H), stride] with 1024-byte rows, sliced.
    per_row = 1024 // dtype.itemsize
    stride = _align(seq_len_kv + 256, per_row) if not compressed else _align(_align(max_seqlen_k, 256), per_row)
    assert logits.dtype == dtype and logits.stride() == (stride, 1)
    assert logits.shape == ((seq_len, max_seqlen_k) if compressed else (seq_len, seq_len_kv))
    assert logits.untyped_storage().nbytes() == _align(seq_len, 128 // heads) * stride * dtype.itemsize
    full = decompress(logits, ks, ke, seq_len_kv) if compressed else logits.double()
    expected = dense_model(q, kv, kv_sf, w, ks, ke)
    # The same -inf positions as the reference (compressed: after the reference test's decompression).
    assert torch.equal(full == NEG_INF, expected == NEG_INF)
    written = expected != NEG_INF
    assert_logits_match(full, expected, written, 2 ** -7 if dtype == torch.bfloat16 else 2 ** -22)
    # Against the unquantised bf16 inputs, as the reference test's first metric (FP8 error only).
    unquantised = dense_model(q_bf16, kv_bf16, torch.ones(seq_len_kv), w, ks, ke)
    assert calc_diff(full.masked_fill(~written, 0), unquantised.masked_fill(~written, 0)) < 1e-3


def test_dense_ragged_windows_and_clamping():
    """Windows of every kind: empty (ks == ke, ks > ke), past the KV (ke > seq_len_kv), negative ks (read as 0),
    one-token; clean_logits on and off, compressed narrower than some windows (the columns past it are dropped)."""
    seq_len, seq_len_kv, heads, head_dim = 12, 200, 64, 64
    q, (kv, kv_sf), w, _, _ = dense_inputs(seq_len, seq_len_kv, heads, head_dim, seed=7)
    ks = torch.tensor([0, 5, 50, 120, -3, 199, 0, 64, 10, 180, 7, 0], dtype=torch.int32)
    ke = torch.tensor([200, 5, 40, 260, 30, 200, 1, 128, 190, 300, 7, 0], dtype=torch.int32)
    expected = dense_model(q, kv, kv_sf, w, ks.clamp(0, seq_len_kv), ke.clamp(0, seq_len_kv))
    clean = A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, clean_logits=True)
    assert torch.equal(clean.double() == NEG_INF, expected == NEG_INF)
    assert_logits_match(clean, expected, expected != NEG_INF, 2 ** -22)
    assert (clean[[1, 2, 10, 11]] == NEG_INF).all()  # empty windows: the whole row
    plain = A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, clean_logits=False)
    assert torch.equal(plain[expected != NEG_INF], clean[expected != NEG_INF])
    compressed = A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, clean_logits=False, max_seqlen_k=64)
    assert compressed.shape == (seq_len, 64)
    assert torch.equal(decompress(compressed, ks, ke, seq_len_kv) == NEG_INF,
                       (expected == NEG_INF) | _past_width(ks, seq_len_kv, 64))
    ref = A.fp8_mqa_logits_reference(q, (kv, kv_sf), w, ks, ke, False, 64)
    assert torch.equal(ref, compressed) and ref.stride() == compressed.stride()


def _past_width(ks: torch.Tensor, seq_len_kv: int, width: int) -> torch.Tensor:
    j = torch.arange(seq_len_kv)
    return j[None] >= ks.clamp(0, seq_len_kv)[:, None] + width


def test_dense_empty_problems():
    q, (kv, kv_sf), w, _, _ = dense_inputs(4, 64, 32, 32, seed=1)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 64, dtype=torch.int32)
    none = A.fp8_mqa_logits(q[:0], (kv, kv_sf), w[:0], ks[:0], ke[:0])
    assert none.shape == (0, 64)
    no_kv = A.fp8_mqa_logits(q, (kv[:0], kv_sf[:0]), w, ks, ke)
    assert no_kv.shape == (4, 0) and no_kv.stride() == (256, 1)


# ---------------------------------------------------------------------------------------------- paged
def _paged_cases():
    """The reference's enumerate_paged_mqa_logits on SM90 (2-D context lengths, clean_logits False, block 64, next_n
    1 / 2, heads 32 / 64, head_dim 128, both logits dtypes) at batch 3 and average contexts of 100 / 300 tokens,
    plus head_dim 32 and 64."""
    for dtype, batch, next_n, heads, avg_kv in itertools.product((torch.bfloat16, torch.float32), (3,), (1, 2),
                                                                 (32, 64), (100, 300)):
        yield pytest.param(dtype, batch, next_n, heads, 128, avg_kv,
                           id=f"{str(dtype)[6:]}-b{batch}-n{next_n}-h{heads}-d128-kv{avg_kv}")
    for head_dim in (32, 64):
        yield pytest.param(torch.float32, 4, 2, 64, head_dim, 150, id=f"float32-b4-n2-h64-d{head_dim}-kv150")


@pytest.mark.parametrize("dtype,batch,next_n,heads,head_dim,avg_kv", list(_paged_cases()))
def test_paged_reference_cases(dtype, batch, next_n, heads, head_dim, avg_kv):
    q, cache, w, context, table, max_model_len = paged_inputs(batch, next_n, heads, head_dim, avg_kv,
                                                              seed=batch * 10 + next_n)
    meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
    logits = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, max_model_len, logits_dtype=dtype)
    per_row = 1024 // dtype.itemsize
    assert logits.shape == (batch * next_n, max_model_len) and logits.dtype == dtype
    assert logits.stride() == (_align(_align(max_model_len, 256), per_row), 1)
    expected = paged_model(q, cache, w, context, table, max_model_len)
    written = expected != NEG_INF
    # The reference test's mask: positions < context_lens[b, t] (its context_lens_nextn).
    positions = torch.arange(max_model_len)[None]
    assert torch.equal(written, positions < context.reshape(-1, 1))
    assert torch.equal(logits.double() == NEG_INF, ~written)  # the CPU reference writes -inf at the rest
    assert_logits_match(logits, expected, written, 2 ** -7 if dtype == torch.bfloat16 else 2 ** -22)


def test_paged_scrambled_table_is_what_is_read():
    """The same cache read through a permuted table gives the permuted tokens' scores: the table is followed, not
    the cache order; a context length past max_context_len is cut at the logits' width."""
    q, cache, w, context, table, width = paged_inputs(2, 1, 64, 128, 200, seed=3)
    meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
    base = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width)
    perm = torch.randperm(cache.shape[0], generator=torch.Generator().manual_seed(0))
    moved = torch.empty_like(cache)
    moved[perm] = cache  # block k of the cache now lives at perm[k]
    again = A.fp8_paged_mqa_logits(q, moved, w, context, perm[table.long()].to(torch.int32), meta, width)
    assert torch.equal(base, again)
    narrow = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, 100)
    assert narrow.shape == (2, 100) and torch.equal(narrow, base[:, :100])


def test_paged_zero_and_short_contexts():
    q, cache, w, context, table, width = paged_inputs(4, 2, 32, 128, 100, seed=5)
    context[0] = torch.tensor([0, 0], dtype=torch.int32)
    context[1] = torch.tensor([1, 1], dtype=torch.int32)
    context[2] = torch.tensor([64, 3], dtype=torch.int32)  # query 0 past the last query's context: capped by it
    meta = A.get_paged_mqa_logits_metadata(context, 64, 8)
    with pytest.raises(ValueError, match=r"schedule_meta must be \[get_num_sms\(\) \+ 1, 2\]"):
        A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width)
    meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
    logits = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width)
    assert (logits[0:2] == NEG_INF).all() and torch.isfinite(logits[2, :1]).all() and (logits[2, 1:] == NEG_INF).all()
    assert torch.isfinite(logits[4, :3]).all() and (logits[4, 3:] == NEG_INF).all()
    assert torch.isfinite(logits[5, :3]).all() and (logits[5, 3:] == NEG_INF).all()


# ---------------------------------------------------------------------------------------------- metadata
def reference_metadata(context_lens: torch.Tensor, num_sms: int) -> list[list[int]]:
    """A scalar port of the reference's sm90_paged_mqa_logits_metadata (non-varlen): prefix sums of the 256-token
    splits of each row's last context, the reversed allocation, the binary search; its prefix array is padded to
    a multiple of 32 rows with zero-length rows (what a row past the batch reads)."""
    batch, next_n = context_lens.shape
    aligned = _align(max(batch, 1), 32)
    prefix, total = [], 0
    for b in range(aligned):
        n = max(int(context_lens[b, -1]), 0) if b < batch else 0
        total += (n + 255) // 256
        prefix.append(total)
    atoms = (next_n + (2 if next_n >= 2 else 1) - 1) // (2 if next_n >= 2 else 1)
    total = prefix[batch - 1] * atoms if batch else 0
    share, rest = divmod(total, num_sms)
    pivot = num_sms - rest
    rows = []
    for sm in range(num_sms):
        seg = sm * share + (sm - pivot if sm > pivot else 0)
        lo, hi = 0, batch
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid] * atoms <= seg:
                lo = mid + 1
            else:
                hi = mid
        offset = seg if lo == 0 else seg - prefix[lo - 1] * atoms
        segs = prefix[0] if lo == 0 else prefix[lo] - prefix[lo - 1]
        rows.append([lo * atoms + (offset // segs if segs else 0), offset % segs if segs else 0])
    rows.append([batch * atoms, 0])
    return rows


@pytest.mark.parametrize("batch,next_n,num_sms", [(1, 1, 132), (3, 2, 4), (33, 1, 16), (64, 2, 132), (5, 3, 7),
                                                   (40, 4, 132), (0, 1, 8), (17, 2, 1)])
def test_metadata_is_the_reference_kernels(batch, next_n, num_sms):
    g = torch.Generator().manual_seed(batch + next_n)
    context = torch.randint(0, 3000, (batch, next_n), generator=g, dtype=torch.int32)
    if batch > 2:
        context[1] = 0  # a row with no work
        context[2, -1] = 256  # exactly one split
    meta = A.get_paged_mqa_logits_metadata(context, 64, num_sms)
    assert meta.shape == (num_sms + 1, 2) and meta.dtype == torch.int32 and meta.is_contiguous()
    assert meta.tolist() == reference_metadata(context, num_sms)


def test_metadata_schedule_covers_every_split_once():
    """Walked as the paged kernel walks it (CTA c: from row c to row c + 1), the metadata names every (row, split)
    exactly once, in order, and every CTA's share differs from the others' by at most one split."""
    context = torch.tensor([[700], [0], [256], [257], [5000], [1]], dtype=torch.int32)
    for num_sms in (1, 3, 4, 13, 132):
        meta = A.get_paged_mqa_logits_metadata(context, 64, num_sms).tolist()
        seen, shares = [], []
        splits = [(max(int(c), 0) + 255) // 256 for c in context[:, -1]]
        for c in range(num_sms):
            (q, s), (q_end, s_end) = meta[c], meta[c + 1]
            share = 0
            while q < q_end or (q == q_end and s < s_end):
                last = min(s_end, splits[q]) if q == q_end else splits[q]
                for split in range(s, last):
                    seen.append((q, split))
                    share += 1
                q, s = q + 1, 0
            shares.append(share)
        assert seen == [(q, s) for q in range(len(splits)) for s in range(splits[q])]
        assert max(shares) - min(shares) <= 1


# ---------------------------------------------------------------------------------------------- refusals
def _dense_args(**over):
    q, (kv, kv_sf), w, _, _ = dense_inputs(8, 64, 64, 128, seed=2)
    ks, ke = generate_ks_ke(8, 64, True)
    args = dict(q=q, kv=(kv, kv_sf), weights=w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke)
    args.update(over)
    return args


def _paged_args(**over):
    q, cache, w, context, table, width = paged_inputs(2, 2, 64, 128, 100, seed=2)
    args = dict(q=q, kv_cache=cache, weights=w, context_lens=context, block_table=table,
                schedule_meta=A.get_paged_mqa_logits_metadata(context, 64, get_num_sms()), max_context_len=width)
    args.update(over)
    return args


def _dense_refusals():
    q, (kv, kv_sf), w, _, _ = dense_inputs(8, 64, 64, 128, seed=2)
    q16 = torch.zeros(8, 16, 128, dtype=FP8)
    yield "heads 16", dict(q=q16, weights=torch.zeros(8, 16)), ValueError, "32 or 64 heads on SM90"
    yield "head_dim 256", dict(q=torch.zeros(8, 64, 256, dtype=FP8)), ValueError, "head_dim 32, 64 or 128"
    yield "bf16 q", dict(q=q.bfloat16()), TypeError, r"q must be torch.float8_e4m3fn"
    yield "q not contiguous", dict(q=q.transpose(0, 1).contiguous().transpose(0, 1)), ValueError, "q must be contiguous"
    yield "bf16 weights", dict(weights=w.bfloat16()), TypeError, "weights must be float32 on SM90"
    yield "weights shape", dict(weights=w[:, :32]), ValueError, r"weights must be \[seq_len, num_heads\]"
    yield "weights strided", dict(weights=torch.zeros(64, 8).t()), ValueError, "unit last stride"
    yield "fp4 kv scales", dict(kv=(kv, kv_sf.view(torch.int32))), TypeError, "FP4 path, SM100 only"
    yield "kv head_dim", dict(kv=(kv[:, :64].contiguous(), kv_sf)), ValueError, "q's head_dim 128"
    yield "kv scales shape", dict(kv=(kv, kv_sf[:10])), ValueError, r"kv\[1\] must be \[seq_len_kv\]"
    yield "kv not a pair", dict(kv=kv), TypeError, r"kv must be a \(values, scales\) pair"
    yield "ks dtype", dict(cu_seq_len_k_start=torch.zeros(8, dtype=torch.int64)), TypeError, "cu_seq_len_k_start must be torch.int32"
    yield "ke shape", dict(cu_seq_len_k_end=torch.zeros(9, dtype=torch.int32)), ValueError, r"cu_seq_len_k_end must be \[seq_len\]"
    yield "clean + compressed", dict(clean_logits=True, max_seqlen_k=16), ValueError, "clean_logits must be False with compressed"
    yield "max_seqlen_k negative", dict(clean_logits=False, max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0"
    yield "max_seqlen_k float", dict(clean_logits=False, max_seqlen_k=2.0), TypeError, "max_seqlen_k must be an int"
    yield "clean int", dict(clean_logits=1), TypeError, "clean_logits must be a bool"
    yield "fp16 logits", dict(logits_dtype=torch.float16), ValueError, "logits_dtype must be torch.float32 or torch.bfloat16"


@pytest.mark.parametrize("over,exc,match", [pytest.param(o, e, m, id=i) for i, o, e, m in _dense_refusals()])
def test_dense_refusals(over, exc, match):
    with pytest.raises(exc, match=match):
        A.fp8_mqa_logits(**_dense_args(**over))


def _paged_refusals():
    q, cache, w, context, table, width = paged_inputs(2, 2, 64, 128, 100, seed=2)
    meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
    yield "next_n 3", dict(q=torch.zeros(2, 3, 64, 128, dtype=FP8), weights=torch.zeros(6, 64),
                           context_lens=torch.ones(2, 3, dtype=torch.int32)), ValueError, "next_n 1 or 2 on SM90"
    yield "heads 16", dict(q=torch.zeros(2, 2, 16, 128, dtype=FP8), weights=torch.zeros(4, 16)), ValueError, "32 or 64 heads"
    yield "block 32", dict(kv_cache=torch.zeros(10, 32, 1, 132, dtype=torch.uint8)), ValueError, "blocks of 64 tokens on SM90"
    yield "cache row bytes", dict(kv_cache=torch.zeros(10, 64, 1, 128, dtype=torch.uint8)), ValueError, r"\[num_blocks, 64, 1, head_dim \+ 4\]"
    yield "cache dtype", dict(kv_cache=cache.view(FP8)), TypeError, "kv_cache must be torch.uint8"
    odd_stride = torch.as_strided(torch.zeros(10 * 8452, dtype=torch.uint8), (10, 64, 1, 132), (8452, 132, 132, 1))
    yield "cache block stride", dict(kv_cache=odd_stride), ValueError, "multiple of 16 bytes"
    yield "1-D context lens", dict(context_lens=context[:, -1].contiguous()), ValueError, "only 2-D context lengths"
    yield "context lens shape", dict(context_lens=context[:, :1].contiguous()), ValueError, r"context_lens must be \[batch, next_n\]"
    yield "bf16 weights", dict(weights=w.bfloat16()), TypeError, "weights must be float32 on SM90"
    yield "table dtype", dict(block_table=table.long()), TypeError, "block_table must be torch.int32"
    yield "table short", dict(block_table=table[:, :1].contiguous()), ValueError, "block_table must have at least"
    yield "meta rows", dict(schedule_meta=meta[:5].contiguous()), ValueError, r"schedule_meta must be \[get_num_sms\(\) \+ 1, 2\]"
    yield "clean", dict(clean_logits=True), ValueError, "clean_logits must be False"
    yield "max_context_len", dict(max_context_len=-1), ValueError, "max_context_len must be >= 0"
    yield "fp16 logits", dict(logits_dtype=torch.float16), ValueError, "logits_dtype must be"


@pytest.mark.parametrize("over,exc,match", [pytest.param(o, e, m, id=i) for i, o, e, m in _paged_refusals()])
def test_paged_refusals(over, exc, match):
    with pytest.raises(exc, match=match):
        A.fp8_paged_mqa_logits(**_paged_args(**over))


def test_metadata_refusals():
    context = torch.ones(3, 2, dtype=torch.int32)
    for args, exc, match in (
            ((context[:, 0].contiguous(), 64, 4), ValueError, "only 2-D context lengths"),
            ((context.long(), 64, 4), TypeError, "context_lens must be torch.int32"),
            ((context.t(), 64, 4), ValueError, "context_lens must be contiguous"),
            ((context, 32, 4), ValueError, "block_kv must be 64 on SM90"),
            ((context, 64, 0), ValueError, "num_sms must be >= 1"),
            ((context, 64, 4.0), TypeError, "num_sms must be an int")):
        with pytest.raises(exc, match=match):
            A.get_paged_mqa_logits_metadata(*args)
    with pytest.raises(ValueError, match="indices must be None"):
        compat.get_paged_mqa_logits_metadata(context, 64, 4, indices=torch.zeros(3, dtype=torch.int32))


# ---------------------------------------------------------------------------------------------- spellings, ops
REFERENCE_SIGNATURES = {  # csrc/apis/attention.hpp register_apis at 54e2261
    "fp8_fp4_mqa_logits": "(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, "
                          "max_seqlen_k=0, logits_dtype=torch.float32)",
    "fp8_fp4_paged_mqa_logits": "(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, "
                                "clean_logits=False, logits_dtype=torch.float32, indices=None)",
    "fp8_mqa_logits": "(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0)",
    "fp8_paged_mqa_logits": "(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, "
                            "clean_logits=False, indices=None)",
    "get_paged_mqa_logits_metadata": "(context_lens, block_kv, num_sms, indices=None)",
}


@pytest.mark.parametrize("name", sorted(REFERENCE_SIGNATURES))
def test_compat_names_have_the_reference_signatures(name):
    sig = inspect.signature(getattr(compat, name))
    spelled = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                        for p in sig.parameters.values())
    assert f"({spelled})" == REFERENCE_SIGNATURES[name]


def test_the_spellings_agree():
    args = _dense_args()
    q = args.pop("q")
    base = A.fp8_mqa_logits(q, **args)
    assert torch.equal(compat.fp8_mqa_logits(q, *args.values()), base)
    assert torch.equal(compat.fp8_fp4_mqa_logits((q, None), *args.values()), base)
    bf16 = compat.fp8_fp4_mqa_logits((q, None), *args.values(), True, 0, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, base.bfloat16())
    with pytest.raises(ValueError, match=r"q\[1\] \(FP4 scales\) must be None"):
        compat.fp8_fp4_mqa_logits((q, torch.ones(8, 64, dtype=torch.int32)), *args.values())
    with pytest.raises(TypeError, match=r"q must be a \(values, scales\) pair"):
        compat.fp8_fp4_mqa_logits(q, *args.values())
    paged = _paged_args()
    qp = paged.pop("q")
    base = A.fp8_paged_mqa_logits(qp, **paged)
    assert torch.equal(compat.fp8_paged_mqa_logits(qp, *paged.values()), base)
    assert torch.equal(compat.fp8_fp4_paged_mqa_logits((qp, None), *paged.values()), base)
    with pytest.raises(ValueError, match="indices must be None"):
        compat.fp8_paged_mqa_logits(qp, *paged.values(), False, torch.zeros(2, dtype=torch.int32))


def test_custom_ops_fake_kernels_give_shapes_and_strides():
    """Meta tensors take the shape-only path of every op; the custom ops' fake kernels agree with the eager call."""
    args = _dense_args(clean_logits=False, max_seqlen_k=40, logits_dtype=torch.bfloat16)
    eager_out = A.fp8_mqa_logits(**args)
    meta = {k: (tuple(t.to("meta") for t in v) if isinstance(v, tuple) else v.to("meta") if isinstance(v, torch.Tensor)
                else v) for k, v in args.items()}
    fake = A.fp8_mqa_logits(**meta)
    assert fake.device.type == "meta" and fake.shape == eager_out.shape and fake.stride() == eager_out.stride()
    op_out = A.DENSE_OP(args["q"], *args["kv"], args["weights"], args["cu_seq_len_k_start"],
                        args["cu_seq_len_k_end"], False, 40, torch.bfloat16)
    assert torch.equal(op_out, eager_out)
    paged = _paged_args()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake_args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in paged.items()}
        out = A.fp8_paged_mqa_logits(**fake_args)
        meta_out = A.get_paged_mqa_logits_metadata(fake_args["context_lens"], 64, 6)
    real = A.fp8_paged_mqa_logits(**paged)
    assert out.shape == real.shape and out.stride() == real.stride() and meta_out.shape == (7, 2)


def test_ops_compile_with_torch_compile():
    args = _dense_args(clean_logits=True)

    @torch.compile(fullgraph=True, backend="eager")
    def f(q, kv, kv_sf, w, ks, ke):
        return A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke) * 1.0

    out = f(args["q"], *args["kv"], args["weights"], args["cu_seq_len_k_start"], args["cu_seq_len_k_end"])
    assert torch.equal(out, A.fp8_mqa_logits(**args))


def test_set_num_sms_changes_the_metadata_the_paged_op_wants():
    paged = _paged_args()
    set_num_sms(5)
    try:
        with pytest.raises(ValueError, match=r"\(6, 2\)"):
            A.fp8_paged_mqa_logits(**paged)
        paged["schedule_meta"] = A.get_paged_mqa_logits_metadata(paged["context_lens"], 64, 5)
        assert A.fp8_paged_mqa_logits(**paged).shape[0] == 4
    finally:
        set_num_sms(0)
