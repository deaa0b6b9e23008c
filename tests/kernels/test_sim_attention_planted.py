"""Planted bugs in the indexer's kernels: each one, put into a copy of the device headers (tests/_mutate.py), must make
a simulated MQA-logits call fail (wrong logits or -inf positions against the exact reference, or a simulator report:
race, barrier misuse, deadlock). One-line changes of the kind that are easy to write and hard to see on a GPU.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from deep_fp8_gemm import attention as A
from deep_fp8_gemm import set_num_sms
from deep_fp8_gemm.simulator import SimulationError
from tests._attention import NEG_INF, assert_logits_match, dense_inputs, generate_ks_ke, paged_inputs
from tests._mutate import mutated_headers
from tests.kernels.test_sim_attention import RAGGED_KE, RAGGED_KS, SIM_RTOL

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

SIM_SMS = 4


def check_dense_ragged() -> None:
    """Dense H 64 / D 128 fp32 clean over the ragged windows: the -inf positions and the values."""
    q, kv, w, _, _ = dense_inputs(12, 256, 64, 128, seed=3)
    ks, ke = torch.tensor(RAGGED_KS[:12], dtype=torch.int32), torch.tensor(RAGGED_KE[:12], dtype=torch.int32)
    logits = A.fp8_mqa_logits(q, kv, w, ks, ke)
    ref = A.fp8_mqa_logits_reference(q, kv, w, ks, ke)
    assert torch.equal(logits == NEG_INF, ref == NEG_INF)
    assert_logits_match(logits, A.dense_values_f64(q, *kv, w), ref != NEG_INF, SIM_RTOL[torch.float32])


def check_dense_long() -> None:
    """One q block over six 256-row KV tiles (more than the four KV stages: every stage is refilled)."""
    q, kv, w, _, _ = dense_inputs(2, 1536, 64, 128, seed=4)
    ks, ke = generate_ks_ke(2, 1536, True)
    logits = A.fp8_mqa_logits(q, kv, w, ks, ke)
    assert_logits_match(logits, A.dense_values_f64(q, *kv, w), logits != NEG_INF, SIM_RTOL[torch.float32])
    assert torch.equal(logits == NEG_INF, A.fp8_mqa_logits_reference(q, kv, w, ks, ke) == NEG_INF)


def check_dense_compressed() -> None:
    """Dense H 32 / D 64 bf16 compressed (max_seqlen_k half the widest window) over the context-parallel windows."""
    q, kv, w, _, _ = dense_inputs(16, 128, 32, 64, seed=5)
    ks, ke = generate_ks_ke(16, 128, False)
    width = int((ke - ks).max()) // 2
    logits = A.fp8_mqa_logits(q, kv, w, ks, ke, False, width, torch.bfloat16)
    ref = A.fp8_mqa_logits_reference(q, kv, w, ks, ke, False, width, torch.bfloat16)
    written = ref != NEG_INF
    assert torch.equal(logits[written].double(), ref[written].double()) or \
        (logits[written].double() - ref[written].double()).abs().max() <= SIM_RTOL[torch.bfloat16] * ref[written].double().abs().max()
    assert torch.isfinite(logits[written]).all()


def check_paged() -> None:
    """Paged H 64 / D 128 next_n 2 fp32 over a scrambled table, a long row split over two CTAs (the metadata starts
    CTA 1 at its third split): the values at every written position."""
    q, cache, w, context, table, width = paged_inputs(4, 2, 64, 128, 300, seed=6, lens=[1200, 333, 30, 302])
    meta = A.get_paged_mqa_logits_metadata(context, 64, SIM_SMS)
    logits = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width)
    expected = torch.zeros(logits.shape, dtype=torch.float64)
    A.reference_paged_into(expected, q, cache, w, context, table)
    assert_logits_match(logits, expected, expected != NEG_INF, SIM_RTOL[torch.float32])


CHECKS = {"dense_ragged": check_dense_ragged, "dense_long": check_dense_long,
          "dense_compressed": check_dense_compressed, "paged": check_paged}

# name: (header, original text, planted text, check, simulated SMs)
PLANTED = {
    "quad_exchange_with_the_wrong_lane": (
        "mqa_score.cuh", "kept[j] = keep + hal::shfl_xor(send, 1);", "kept[j] = keep + hal::shfl_xor(send, 2);",
        "dense_ragged", SIM_SMS),
    "weights_of_the_neighbouring_heads": (
        "mqa_score.cuh", "smem_weights + q * kNumHeads + 8 * c + 2 * (lane % 4)",
        "smem_weights + q * kNumHeads + 8 * c + 2 * ((lane + 1) % 4)", "paged", SIM_SMS),
    "kv_row_scales_swapped": (
        "mqa_score.cuh", "const float scale = half ? scale_hi : scale_lo;",
        "const float scale = half ? scale_lo : scale_hi;", "dense_compressed", SIM_SMS),
    "relu_dropped": (
        "mqa_score.cuh", "return x > 0.0f ? x : 0.0f; }", "return x; }", "dense_ragged", SIM_SMS),
    "kv_stage_released_before_the_wgmma_retired": (
        "kernels/mqa_logits.cuh",
        "                        Score::wait(acc);\n                    }\n                    if (lane == 0)\n"
        "                        hal::mbar_arrive(&empty_kv[stage]);\n",
        "                    }\n                    if (lane == 0)\n                        hal::mbar_arrive(&empty_kv[stage]);\n"
        "                    if (active)\n                        Score::wait(acc);\n",
        "dense_long", SIM_SMS),
    "q_stage_released_by_half_the_warps": (
        "kernels/mqa_logits.cuh", "hal::mbar_init(&empty_q[s], kNumMathWarps);",
        "hal::mbar_init(&empty_q[s], kNumMathWarps / 2);", "dense_ragged", 1),
    "window_one_past_its_end": (
        "kernels/mqa_logits.cuh", "if (w.lo <= row && row < w.hi) {", "if (w.lo <= row && row <= w.hi) {",
        "dense_ragged", SIM_SMS),
    "clean_misses_the_last_column": (
        "kernels/mqa_logits.cuh", "fill_neg_inf(row, w.hi, params.seq_len_kv, lane);",
        "fill_neg_inf(row, w.hi, params.seq_len_kv - 1, lane);", "dense_ragged", SIM_SMS),
    "paged_tile_reads_its_first_block_four_times": (
        "kernels/mqa_logits.cuh", "physical[b] = b < count ? entries[b] : 0;",
        "physical[b] = b < count ? entries[0] : 0;", "paged", SIM_SMS),
    "paged_schedule_ignores_the_start_split": (
        "kernels/mqa_logits.cuh", "split = static_cast<u32>(s[1]);", "split = 0u;", "paged", SIM_SMS),
    "paged_next_n_rows_swapped": (
        "kernels/mqa_logits.cuh", "const u32 r = g.q * kQueries + query;",
        "const u32 r = g.q * kQueries + (kQueries - 1 - query);", "paged", SIM_SMS),
    "kv_scales_not_awaited": (
        "kernels/mqa_logits.cuh", "hal::mbar_arrive_expect_tx(bar, kSmemKvBytes + kSmemScalesBytes);",
        "hal::mbar_arrive_expect_tx(bar, kSmemKvBytes);", "dense_long", SIM_SMS),
}


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    set_num_sms(SIM_SMS)
    yield monkeypatch
    set_num_sms(0)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_checks_pass_on_the_real_headers(simulate, check):
    simulate.setenv("DFG_SIM_NUM_SMS", str(SIM_SMS))
    CHECKS[check]()


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_bug_fails(simulate, tmp_path, name):
    header, original, planted, check, sms = PLANTED[name]
    mutated_headers(tmp_path, simulate, header, original, planted)
    simulate.setenv("DFG_SIM_NUM_SMS", str(sms))
    with pytest.raises((AssertionError, SimulationError)):
        CHECKS[check]()
