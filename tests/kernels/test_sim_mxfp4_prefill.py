"""The MXFP4 prefill kernel with the shared-memory conversion stage (issue 43; kernels/mxfp4_convert_gemm.cuh) in the
simulator, through ``ops.mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(..., kernel="convert")``:

* both contiguous layouts (m_indices, psum) at both alignments (64: one math warpgroup, 128: two), three experts of
  100, 0 and 37 tokens and a padding-only block, with folded waves and per-32 waves (a tile with one of each: the
  general loop; tiles with none: the folded loop): within calc_diff 1e-3 of float64 of the dequantised operands,
  padding rows in an expert's block computed with it (zeros: A's padding rows are zero), padding-only blocks untouched;
* the bit contract: every row equal, bit for bit, to the register-A kernel's (kernel="register_a"), under the
  simulator's default tensor-core model (the 13-bit truncating accumulator);
* the cost model's pick (kernel=None) is one of the candidates and gives the same bits;
* adversarial schedules (DFG_SIM_SEED 1-6) give the seed-0 bits, race-free;
* the FP8 output (``m_grouped_gemm_fp8_fp4_fp8_nt_contiguous(..., kernel="convert")``) against the FP8-output rule,
  and bit for bit against the register-A kernel's FP8 output;
* planted bugs (a copy of the headers with one change, tests/_mutate.py) that must fail: the proxy fence after the
  conversion dropped (the simulator's proxy rule), the 128-byte swizzle of the converted stores dropped, the per-32
  handling dropped (every tile through the folded loop), the FP8 output's rows quantised with the wrong row's scale.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import deep_fp8_gemm
from deep_fp8_gemm.kernels import mxfp4_gemm
from deep_fp8_gemm.ops import mxfp4
from deep_fp8_gemm.simulator import SimulationError
from deep_fp8_gemm.utils import calc_diff
from tests._mutate import mutated_headers
from tests.kernels.test_sim_mxfp4 import activations, contiguous_rows, dequantised_product, weights

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

G, N, K, COUNTS = 3, 256, 384, (100, 0, 37)
HEADER = "kernels/mxfp4_convert_gemm.cuh"


def case(alignment: int, psum: bool, seed: int = 7):
    """The contiguous layout of COUNTS padded to ``alignment`` plus one padding-only block; the weights' scales widened
    so that two (expert, K block, wave) records take the per-32 path: expert 0's wave 3 in K block 1 (tile n 1: waves
    2 folded, 3 per-32) and expert 2's wave 1 in K block 0 (tile n 0); every other tile folds."""
    w, sf = weights(G, N, K, seed=seed)
    sf[0, 200, 5] = sf[0, 200, 4] * 2.0 ** 24
    sf[2, 70, 1] = sf[2, 70, 0] * 2.0 ** -30
    a, sa, layout, m_indices = contiguous_rows(COUNTS, alignment, psum, K, seed + 1)
    return a, sa, w, sf, layout, m_indices


def run(monkeypatch, alignment: int, psum: bool, kernel, p=None):
    """``(d, a, sa, w, sf, m_indices)`` of one call under DFG_SIMULATE=1 (D starts as 7.0 everywhere)."""
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    a, sa, w, sf, layout, m_indices = case(alignment, psum)
    if p is None:
        p = mxfp4.prepare_mxfp4_weights(w, sf)
    d = torch.full((a.shape[0], N), 7.0, dtype=torch.bfloat16)
    deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous((a, sa), p, d, layout, use_psum_layout=psum, kernel=kernel)
    finally:
        deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(128)
    return d, a, sa, w, sf, m_indices


def check(d, a, sa, w, sf, m_indices, alignment: int) -> None:
    want = dequantised_product(a.unsqueeze(0), sa.unsqueeze(0), w, sf)
    for e in range(G):
        rows = (m_indices == e).nonzero().view(-1)
        if len(rows):
            diff = calc_diff(d[rows].double(), want[e, rows])
            assert diff <= 1e-3, (e, diff)
    written = (d != 7.0).any(dim=1)
    assert not bool(written[-alignment:].any()), "the padding-only block was written"
    padding = (m_indices < 0) & written
    assert bool(padding.any()) and not bool(d[padding].any()), "padding rows in an expert's block: zeros"


def test_the_case_has_both_paths():
    _, _, w, sf, _, _ = case(128, False)
    p = mxfp4.prepare_mxfp4_weights(w, sf)
    assert p.wave_per32.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]]


@pytest.mark.parametrize("alignment", [64, 128])
@pytest.mark.parametrize("psum", [False, True], ids=["m_indices", "psum"])
def test_against_float64_and_the_register_a_bits(alignment, psum, monkeypatch):
    d, a, sa, w, sf, m_indices = run(monkeypatch, alignment, psum, "convert")
    check(d, a, sa, w, sf, m_indices, alignment)
    ref = run(monkeypatch, alignment, psum, "register_a")[0]
    assert torch.equal(d.view(torch.int16), ref.view(torch.int16)), "a row's bits differ between the two kernels"


def test_the_cost_models_pick_gives_the_same_bits(monkeypatch):
    """kernel=None: the cost model's candidate (pick_contiguous_path), one of the two kernels; the same bits."""
    pick = mxfp4_gemm.pick_contiguous_path(N, K, G, 3 * 128, 4, "contiguous", 128)
    assert pick.path in ("register_a", "convert")
    d = run(monkeypatch, 128, False, None)[0]
    ref = run(monkeypatch, 128, False, "convert")[0]
    assert torch.equal(d.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("alignment, psum", [(128, False), (64, True)], ids=["m_indices-128", "psum-64"])
def test_adversarial_schedules_give_the_same_bits(alignment, psum, monkeypatch):
    """DFG_SIM_SEED 1-6 (random fiber order, preemption at hal calls, delayed TMA landing, a role far ahead or
    behind: docs/simulator.md): the three roles' barriers (raw, full, empty) and the proxy fence hold under every
    schedule, clean of races, with the seed-0 bits."""
    from tests.kernels.test_sim_schedules import SEEDS
    base = run(monkeypatch, alignment, psum, "convert")[0]
    for seed in SEEDS:
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        d = run(monkeypatch, alignment, psum, "convert")[0]
        assert torch.equal(d.view(torch.int16), base.view(torch.int16)), seed


def test_a_partial_last_block_and_an_odd_width(monkeypatch):
    """M_sum not a multiple of the alignment (the last expert's block cut short: A and sA boxes zero-filled past
    M_sum, no store past it), 37 + 20 tokens; and N = 192 (a multiple of 64, not of 128): the cost model leaves the
    conversion kernel out, kernel="convert" is refused with the reason."""
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    w, sf = weights(2, N, 256, seed=9)
    p = mxfp4.prepare_mxfp4_weights(w, sf)
    m_indices = torch.tensor([0] * 37 + [-1] * 91 + [1] * 20, dtype=torch.int32)
    a, sa = activations(1, 148, 256, seed=10)
    a, sa = a[0], sa[0]
    d = torch.full((148, N), 7.0, dtype=torch.bfloat16)
    mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous((a, sa), p, d, m_indices, kernel="convert")
    ref = torch.full((148, N), 7.0, dtype=torch.bfloat16)
    mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous((a, sa), p, ref, m_indices, kernel="register_a")
    assert torch.equal(d.view(torch.int16), ref.view(torch.int16))
    want = dequantised_product(a.unsqueeze(0), sa.unsqueeze(0), w, sf)
    assert calc_diff(d[128:].double(), want[1, 128:]) <= 1e-3
    assert mxfp4_gemm.pick_contiguous_path(192, 256, 2, 4096, 132, "contiguous", 128).path == "register_a"
    w2, sf2 = weights(1, 192, 256, seed=9)
    with pytest.raises(ValueError, match="conversion"):
        mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(
            (a, sa), mxfp4.prepare_mxfp4_weights(w2, sf2), torch.zeros(148, 192, dtype=torch.bfloat16),
            torch.zeros(148, dtype=torch.int32), kernel="convert")


def test_kernel_argument_is_checked():
    with pytest.raises(ValueError, match="kernel must be"):
        mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(
            (torch.zeros(128, 128).to(torch.float8_e4m3fn), torch.ones(128, 1)),
            (torch.zeros(1, 64, 64, dtype=torch.int8), torch.ones(1, 64, 4)),
            torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.int32), kernel="fast")


# ------------------------------------------------------------------------------------------------- FP8 output
def run_fp8(monkeypatch, alignment: int, psum: bool, kernel, use_ue8m0: bool = False):
    """``(d e4m3 [M_sum, N], sd, a, sa, w, sf, m_indices)`` of the FP8-output name under DFG_SIMULATE=1 (D 7.0, sD -1
    everywhere first)."""
    from deep_fp8_gemm.utils import empty_m_major
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    a, sa, w, sf, layout, m_indices = case(alignment, psum)
    p = mxfp4.prepare_mxfp4_weights(w, sf)
    d = torch.full((a.shape[0], N), 7.0).to(torch.float8_e4m3fn)
    sd = empty_m_major((a.shape[0], N // 128), "cpu").fill_(-1.0)
    deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        mxfp4.m_grouped_gemm_fp8_fp4_fp8_nt_contiguous((a, sa), p, (d, sd), layout, use_psum_layout=psum,
                                                        use_ue8m0=use_ue8m0, kernel=kernel)
    finally:
        deep_fp8_gemm.set_mk_alignment_for_contiguous_layout(128)
    return d, sd, a, sa, w, sf, m_indices


@pytest.mark.parametrize("alignment, psum, use_ue8m0", [(128, False, False), (64, True, True)],
                         ids=["m_indices-128", "psum-64-ue8m0"])
def test_fp8_output_against_the_rule_and_the_register_a_bits(alignment, psum, use_ue8m0, monkeypatch):
    """The FP8 output (the FP8-output kinds' rule, per_token_cast_to_fp8_torch(values, use_ue8m0, reciprocal=True)):
    sD within 2e-3 of the rule's scales of the float64 product (the tensor core's ~13-bit chains), D's dequantised
    values within calc_diff 1e-3, the padding-only block untouched; D and sD equal bit for bit to the register-A
    kernel's FP8 output."""
    from deep_fp8_gemm.quant import per_token_cast_to_fp8_torch
    d, sd, a, sa, w, sf, m_indices = run_fp8(monkeypatch, alignment, psum, "convert", use_ue8m0)
    want = dequantised_product(a.unsqueeze(0), sa.unsqueeze(0), w, sf)
    for e in range(G):
        rows = (m_indices == e).nonzero().view(-1)
        if not len(rows):
            continue
        _, want_s = per_token_cast_to_fp8_torch(want[e, rows].float(), use_ue8m0, reciprocal=True)
        assert torch.allclose(sd[rows], want_s, rtol=2e-3), e
        deq = d[rows].float() * sd[rows].repeat_interleave(128, -1)
        assert calc_diff(deq.double(), want[e, rows]) <= 1e-3, e
    assert bool((d[-alignment:].float() == 7.0).all()) and bool((sd[-alignment:] == -1.0).all())
    d_ref, sd_ref = run_fp8(monkeypatch, alignment, psum, "register_a", use_ue8m0)[:2]
    assert torch.equal(d.view(torch.uint8), d_ref.view(torch.uint8)) and torch.equal(sd, sd_ref)


# ------------------------------------------------------------------------------------------------- planted bugs
PLANTS = {
    # The converted B tile handed to the wgmma (async proxy) without the writers' fence: the proxy rule.
    "proxy_fence_dropped": ("hal::fence_view_async_shared();  // the converted B tile to the async proxy", ""),
    # The converted stores without the 128-byte swizzle the wgmma descriptor reads: K chunks land in the wrong place.
    "swizzle_dropped": ("chunk[c] = x * BLOCK_K + 4 * (lane % 4) + ((c ^ (x & 3u)) << 4);",
                        "chunk[c] = x * BLOCK_K + 4 * (lane % 4) + (c << 4);"),
    # Tiles with per-32 waves through the folded loop: their k32 sums are promoted by sB row 0 only.
    "per32_dropped": ("if (!general) {  // folded", "if (true) {  // folded"),
}


def test_planted_fp8_output_bug_fails(tmp_path, monkeypatch):
    """The FP8 output with row r + 8's values quantised by row r's scale (the reciprocal of the wrong row): the checks
    above fail."""
    mutated_headers(tmp_path, monkeypatch, HEADER, "const float inv = 1.0f / scale[0][h];",
                    "const float inv = 1.0f / scale[0][0];")
    with pytest.raises(AssertionError):
        test_fp8_output_against_the_rule_and_the_register_a_bits(128, False, False, monkeypatch)


@pytest.mark.parametrize("bug", sorted(PLANTS))
def test_planted_bugs_fail(bug, tmp_path, monkeypatch):
    original, planted = PLANTS[bug]
    mutated_headers(tmp_path, monkeypatch, HEADER, original, planted)
    try:
        d, a, sa, w, sf, m_indices = run(monkeypatch, 128, False, "convert")
    except SimulationError as exc:
        assert bug == "proxy_fence_dropped" and "proxy" in str(exc), str(exc)[:2000]
        return
    assert bug != "proxy_fence_dropped", "the simulator's proxy rule did not report the missing fence"
    with pytest.raises(AssertionError):
        check(d, a, sa, w, sf, m_indices, 128)
