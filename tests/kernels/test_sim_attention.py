"""The indexer's MQA-logits kernels in the CPU simulator (``DFG_SIMULATE=1``, issue 44): the real sm_90a kernel source
(kernels/mqa_logits.cuh) run on simulator-sized problems against the exact reference, and the exact set of entries
each form writes (a NaN-filled buffer through the kernel host code: the window, the -inf of a clean call, nothing
else, no row or padding past the view).

Cases keep to a few kernel variants (each is one g++ build, cached): dense H 64 / D 128 fp32 clean (DeepSeek-V3.2's
indexer), H 32 / D 64 bf16 compressed, H 64 / D 32 fp32 plain; paged H 64 / D 128 next_n 2 fp32 (MTP), H 32 / D 128
next_n 1 bf16. The simulator's tensor-core model truncates within each k32 step, hence the tolerance (``rtol`` of
the row's largest logit); with ``DFG_SIM_EXACT_MMA=1`` the kernels match the float64 reference to fp32 rounding.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from deep_fp8_gemm import attention as A
from deep_fp8_gemm import set_num_sms
from deep_fp8_gemm.kernels import mqa_logits as K
from deep_fp8_gemm.runtime.target import Backend
from tests._attention import (NEG_INF, assert_logits_match, decompress, dense_inputs, generate_ks_ke, paged_inputs)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

SIM_SMS = 4
#: The tensor-core model (13-bit truncating accumulation per k32 step) against float64: relative to the largest logit.
SIM_RTOL = {torch.float32: 2e-3, torch.bfloat16: 2 ** -7 + 2e-3}
RAGGED_KS = [0, 5, 50, 120, -3, 199, 0, 64, 10, 180, 7, 0, 30, 1, 2, 100]
RAGGED_KE = [200, 5, 40, 260, 30, 200, 1, 128, 190, 300, 7, 0, 31, 129, 255, 101]


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", str(SIM_SMS))
    set_num_sms(SIM_SMS)  # the paged op takes metadata of get_num_sms() rows
    yield monkeypatch
    set_num_sms(0)


def _windows(kind: str, seq_len: int, seq_len_kv: int):
    if kind == "ragged":
        return (torch.tensor(RAGGED_KS[:seq_len], dtype=torch.int32),
                torch.tensor(RAGGED_KE[:seq_len], dtype=torch.int32))
    return generate_ks_ke(seq_len, seq_len_kv, kind == "causal")


DENSE_CASES = [
    pytest.param(64, 128, torch.float32, True, False, "causal", 16, 384, id="h64-d128-fp32-clean-causal"),
    pytest.param(32, 64, torch.bfloat16, False, True, "cp", 16, 128, id="h32-d64-bf16-compressed-cp"),
    pytest.param(64, 32, torch.float32, False, False, "ragged", 16, 256, id="h64-d32-fp32-plain-ragged"),
    pytest.param(64, 128, torch.float32, True, False, "ragged", 12, 256, id="h64-d128-fp32-clean-ragged"),
]


@pytest.mark.parametrize("heads,head_dim,dtype,clean,compressed,windows,seq_len,seq_len_kv", DENSE_CASES)
def test_sim_dense_matches_reference(simulate, heads, head_dim, dtype, clean, compressed, windows, seq_len,
                                     seq_len_kv):
    q, kv, w, _, _ = dense_inputs(seq_len, seq_len_kv, heads, head_dim, seed=heads * head_dim)
    ks, ke = _windows(windows, seq_len, seq_len_kv)
    width = int((ke - ks).max()) // 2 if compressed else 0  # compressed narrower than the widest window
    logits = A.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=clean, max_seqlen_k=width, logits_dtype=dtype)
    ref = A.fp8_mqa_logits_reference(q, kv, w, ks, ke, clean, width, dtype)
    assert logits.shape == ref.shape and logits.stride() == ref.stride() and logits.dtype == dtype
    written = ref != NEG_INF
    if clean:
        assert torch.equal(logits == NEG_INF, ~written)
    expected = A.dense_values_f64(q, *kv, w)
    full = decompress(logits, ks, ke, seq_len_kv) if compressed else logits.double()
    inside = decompress(ref, ks, ke, seq_len_kv) != NEG_INF if compressed else written
    assert_logits_match(full, expected, inside, SIM_RTOL[dtype])


def _sentinel(rows: int, stride: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((rows, stride), float("nan"), dtype=dtype)


@pytest.mark.parametrize("heads,head_dim,dtype,clean,compressed,windows,seq_len,seq_len_kv",
                         [DENSE_CASES[0], DENSE_CASES[1], DENSE_CASES[2]])
def test_sim_dense_writes_exactly_its_entries(simulate, heads, head_dim, dtype, clean, compressed, windows, seq_len,
                                              seq_len_kv):
    """Through the kernel host code into a NaN-filled buffer (8 rows and the row padding past the view): plain,
    the clamped window; clean, every column < seq_len_kv; compressed, columns [0, min(window, width)). Nothing else."""
    q, kv, w, _, _ = dense_inputs(seq_len, seq_len_kv, heads, head_dim, seed=1)
    ks, ke = _windows(windows, seq_len, seq_len_kv)
    width = int((ke - ks).max()) // 2 if compressed else seq_len_kv
    stride = A.dense_logits_layout(seq_len, seq_len_kv, heads, width if compressed else 0, dtype)[0][1]
    buffer = _sentinel(seq_len + 8, stride, dtype)
    config = K.dense_config(heads, head_dim, dtype, clean, compressed)
    K.launch_dense(config, q, kv[0], kv[1], w, ks, ke, buffer, width, Backend.SIM)
    lo, hi = ks.long().clamp(0, seq_len_kv), ke.long().clamp(0, seq_len_kv)
    col = torch.arange(stride)[None]
    if clean:
        expected = col < seq_len_kv
    elif compressed:
        expected = col < (hi - lo).clamp(min=0, max=width)[:, None]
    else:
        expected = (col >= lo[:, None]) & (col < hi[:, None])
    got = ~buffer.isnan()
    assert torch.equal(got[:seq_len], expected.expand(seq_len, -1))
    assert not got[seq_len:].any()


PAGED_CASES = [
    pytest.param(64, 128, 2, torch.float32, 300, id="h64-d128-next2-fp32"),
    pytest.param(32, 128, 1, torch.bfloat16, 200, id="h32-d128-next1-bf16"),
]


@pytest.mark.parametrize("heads,head_dim,next_n,dtype,avg_kv", PAGED_CASES)
def test_sim_paged_matches_reference(simulate, heads, head_dim, next_n, dtype, avg_kv):
    q, cache, w, context, table, width = paged_inputs(4, next_n, heads, head_dim, avg_kv, seed=heads + next_n)
    context[1] = 0  # a row without work
    meta = A.get_paged_mqa_logits_metadata(context, 64, SIM_SMS)
    logits = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width, logits_dtype=dtype)
    ref = A.fp8_paged_mqa_logits_reference(q, cache, w, context, table, meta, width, False, dtype)
    assert logits.shape == ref.shape and logits.stride() == ref.stride()
    written = ref != NEG_INF
    expected = torch.zeros_like(ref, dtype=torch.float64)
    A.reference_paged_into(expected, q, cache, w, context, table)  # float64: the values before rounding
    assert_logits_match(logits, expected, written, SIM_RTOL[dtype])


@pytest.mark.parametrize("heads,head_dim,next_n,dtype,avg_kv", PAGED_CASES[:1])
def test_sim_paged_writes_exactly_its_entries(simulate, heads, head_dim, next_n, dtype, avg_kv):
    """Row b * next_n + t at p < min(context_lens[b, t], context_lens[b, -1], width) and nothing else: not the rest of
    the row's last 256-token tile, not the padding, not a short max_context_len's columns past it."""
    q, cache, w, context, table, width = paged_inputs(3, next_n, heads, head_dim, avg_kv, seed=9)
    context[0, 0] = context[0, 1] + 70  # past the row's last query: capped by it
    meta = A.get_paged_mqa_logits_metadata(context, 64, SIM_SMS)
    narrow = width - 40
    stride = A.paged_logits_layout(3 * next_n, narrow, dtype)[1]
    buffer = _sentinel(3 * next_n + 2, stride, dtype)
    config = K.paged_config(heads, head_dim, next_n, dtype)
    K.launch_paged(config, q, cache, w, context, table, meta, buffer, narrow, Backend.SIM)
    limit = torch.minimum(context, context[:, -1:]).clamp(max=narrow).reshape(-1, 1)
    expected = torch.arange(stride)[None] < limit
    got = ~buffer.isnan()
    assert torch.equal(got[:3 * next_n], expected)
    assert not got[3 * next_n:].any()


def test_sim_adversarial_schedules(simulate):
    """Seeded adversarial interleavings (the race detector on): the dense clean kernel (math, producer and -inf
    warps) and the paged kernel give the round-robin schedule's bits."""
    q, kv, w, _, _ = dense_inputs(16, 384, 64, 128, seed=4)
    ks, ke = generate_ks_ke(16, 384, True)
    base = A.fp8_mqa_logits(q, kv, w, ks, ke)
    pq, cache, pw, context, table, width = paged_inputs(4, 2, 64, 128, 300, seed=4)
    meta = A.get_paged_mqa_logits_metadata(context, 64, SIM_SMS)
    paged = A.fp8_paged_mqa_logits(pq, cache, pw, context, table, meta, width)
    written = A.fp8_paged_mqa_logits_reference(pq, cache, pw, context, table, meta, width) != NEG_INF
    for seed in (7, 12345):
        simulate.setenv("DFG_SIM_SEED", str(seed))
        assert torch.equal(A.fp8_mqa_logits(q, kv, w, ks, ke), base)
        assert torch.equal(A.fp8_paged_mqa_logits(pq, cache, pw, context, table, meta, width)[written], paged[written])


def test_sim_exact_mma_is_the_reference_to_fp32_rounding(simulate):
    """With exact fp32 wgmma (DFG_SIM_EXACT_MMA=1) the only difference left is the kernel's fp32 head sum and scale:
    within a few fp32 ulps of the row's largest logit."""
    simulate.setenv("DFG_SIM_EXACT_MMA", "1")
    q, kv, w, _, _ = dense_inputs(16, 384, 64, 128, seed=5)
    ks, ke = generate_ks_ke(16, 384, True)
    logits = A.fp8_mqa_logits(q, kv, w, ks, ke)
    written = logits != NEG_INF
    assert_logits_match(logits, A.dense_values_f64(q, *kv, w), written, 2e-6)
    pq, cache, pw, context, table, width = paged_inputs(4, 2, 64, 128, 300, seed=5)
    meta = A.get_paged_mqa_logits_metadata(context, 64, SIM_SMS)
    paged = A.fp8_paged_mqa_logits(pq, cache, pw, context, table, meta, width)
    expected = torch.zeros(paged.shape, dtype=torch.float64)
    A.reference_paged_into(expected, pq, cache, pw, context, table)
    assert_logits_match(paged, expected, expected != NEG_INF, 2e-6)
