"""Split-K (include/deep_fp8_gemm/split_k.cuh) in the CPU simulator, against a float64 evaluation.

Forced configs (``GemmConfig.split_k``) with 2, 4 and 7 splits cover: m not a multiple of BLOCK_M, an n tail
(n not a multiple of BLOCK_N), one and two math warpgroups, fewer CTAs than work items (a CTA walks several
splits and tiles, so the stage ring crosses split boundaries), a seeded adversarial schedule. Outputs are
NaN-poisoned and so is the partial workspace, so an element nobody wrote or a partial read before it was
written shows. The counters must be zero after every launch (a second launch reuses them: CUDA-graph replay).
Planted bugs (the reduce not waiting for every split; the counter not reset) must make the test fail.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from deep_fp8_gemm.kernels import split_k
from deep_fp8_gemm.config import check_config
from deep_fp8_gemm.reference import dequantize_per_block, dequantize_per_token
from deep_fp8_gemm.simulator import SimulationError

from tests._mutate import mutated_headers
from tests.kernels.test_sim_gemm import make_config, quantised_operands, run_sim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

CASES = {
    # name: (m, n, k, block_m, block_n, split_k, grid, stages)
    "split2_m_tail": (7, 96, 512, 64, 32, 2, 6, 3),
    "split4_two_warpgroups_m_and_n_tail": (130, 200, 512, 128, 64, 4, 5, 2),
    "split7_more_items_than_ctas": (65, 64, 896, 64, 32, 7, 4, 3),
    "split2_one_cta_runs_every_split": (64, 32, 256, 64, 16, 2, 1, 2),
    "split3_single_row": (1, 48, 384, 64, 16, 3, 4, 2),
}


def split_config(n, k, block_m, block_n, splits, grid, stages=3):
    cfg = dataclasses.replace(make_config("dense", n, k, block_m, block_n, stages=stages, grid=grid), split_k=splits)
    check_config(cfg)
    return cfg


def float64_product(a, sa, b, sb):
    return dequantize_per_token(a, sa).double() @ dequantize_per_block(b, sb).double().t()


def assert_close_to_float64(d, exact):
    """Within a bf16 rounding (2^-8 relative) plus the fp32 accumulation's error, of every element."""
    assert not d.isnan().any(), "kernel left output elements unwritten"
    err = (d.double() - exact).abs()
    bound = exact.abs() * 2.0**-8 + 1e-5 * exact.abs().max()
    assert (err <= bound).all(), f"max error {err.max():.3e}, worst element over its bound by {(err - bound).max():.3e}"


def run_case(cfg, m, seed):
    a, sa, b, sb = quantised_operands((m,), cfg.shape_n, cfg.shape_k, seed=seed)
    counters, partials = split_k.buffers(cfg, m, torch.device("cpu"))
    partials.fill_(float("nan"))  # a partial read before its split stored it poisons the result
    d = torch.full((m, cfg.shape_n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d)
    return d, float64_product(a, sa, b, sb), counters


@pytest.fixture(autouse=True)
def fresh_workspace():
    split_k.clear()
    yield
    split_k.clear()


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_k_matches_float64(case, monkeypatch):
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")  # exact fp32 wgmma: the comparison is against arithmetic alone
    m, n, k, bm, bn, splits, grid, stages = CASES[case]
    cfg = split_config(n, k, bm, bn, splits, grid, stages)
    d, exact, counters = run_case(cfg, m, seed=1)
    assert_close_to_float64(d, exact)
    assert not counters.any(), "the last split of each tile must leave its counter at 0"
    # Second launch, new operands, same workspace (as a CUDA-graph replay): the counters were reset.
    d2, exact2, _ = run_case(cfg, m, seed=2)
    assert_close_to_float64(d2, exact2)
    assert not counters.any()


def test_split_k_is_bitwise_reproducible_across_schedules(monkeypatch):
    """The splits are summed in a fixed order, whichever CTA arrives last: a seeded adversarial schedule (other
    arrival orders) gives the same bits."""
    cfg = split_config(64, 896, 64, 32, 7, 4)
    outputs = []
    for seed in ("0", "11", "12345"):
        monkeypatch.setenv("DFG_SIM_SEED", seed)
        d, exact, counters = run_case(cfg, 65, seed=5)
        assert not counters.any()
        outputs.append(d)
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])


def test_split_k_workspace_sizes_and_params():
    cfg = split_config(96, 512, 64, 32, 2, 6)
    assert split_k.pointers(dataclasses.replace(cfg, split_k=1), 7, torch.device("cpu")) == (0, 0)
    counters, partials = split_k.buffers(cfg, 7, torch.device("cpu"))
    assert counters.numel() >= 3 and partials.numel() >= 3 * 2 * 64 * 32 and not counters.any()
    grown, _ = split_k.buffers(cfg, 700, torch.device("cpu"))  # 11 m-blocks: more counters, zeroed
    assert grown.numel() >= 33 and not grown.any()
    from deep_fp8_gemm.kernels import gemm

    packed = gemm.pack_params([bytes(128)] * 4, rows=7, split_counters=0x1234, split_partials=0x5678)
    assert len(packed) == gemm.PARAMS_BYTES
    assert packed[560:576] == (0x1234).to_bytes(8, "little") + (0x5678).to_bytes(8, "little")


# name: (original text in split_k.cuh, planted text, launches)
PLANTED = {
    # The next-to-last split to arrive reduces, reading the partial the last one has not stored yet.
    "reduce_does_not_wait_for_all_splits": (
        "last = hal::atomic_add_acq_rel_gpu(counter, 1u) == kSplitK - 1 ? 1u : 0u;",
        "last = hal::atomic_add_acq_rel_gpu(counter, 1u) == kSplitK - 2 ? 1u : 0u;",
        1,
    ),
    # Nobody resets the counter: the second launch (graph replay) never sees kSplitK - 1.
    "counter_not_reset": ("*counter = 0;", "(void)counter;", 2),
    # The reduce sums one split twice and skips another.
    "reduce_reads_the_wrong_split": (
        "src = reinterpret_cast<const Float4*>(base + s * kSplitStride) + t;",
        "src = reinterpret_cast<const Float4*>(base + (s ^ 1u) % kSplitK * kSplitStride) + t;",
        1,
    ),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_split_k_bug_is_caught(bug, tmp_path, monkeypatch):
    original, planted, launches = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, "split_k.cuh", original, planted)
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")

    # One CTA for 3 tiles x 4 splits: it walks the splits one after the other, so a split never finds a later
    # split of its tile already stored, whatever the schedule.
    cfg = split_config(96, 512, 64, 32, 4, 1)
    with pytest.raises((AssertionError, SimulationError)):
        for launch in range(launches):
            d, exact, counters = run_case(cfg, 7, seed=launch)
            assert_close_to_float64(d, exact)
            assert not counters.any(), "counters left nonzero"
