"""The MXFP4 prefill kernel with the shared-memory conversion stage (issue 43; kernels/mxfp4_convert_gemm.cuh) in the
simulator, through ``ops.mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(..., kernel="convert")``:

* both contiguous layouts (m_indices, psum) at both alignments (64: one math warpgroup, 128: two), three experts of
  100, 0 and 37 tokens and a padding-only block, with folded waves and per-32 waves (a tile with one of each: the
  general loop; tiles with none: the folded loop): within calc_diff 1e-3 of float64 of the dequantised operands,
  padding rows in an expert's block computed with it (zeros: A's padding rows are zero), padding-only blocks untouched;
* the bit contract: every row equal, bit for bit, to the register-A kernel's (kernel="register_a"), under the
  simulator's default tensor-core model (the 13-bit truncating accumulator);
* the cost model's pick (kernel=None) is one of the candidates and gives the same bits;
* planted bugs (a copy of the headers with one change, tests/_mutate.py) that must fail: the proxy fence after the
  conversion dropped (the simulator's proxy rule), the 128-byte swizzle of the converted stores dropped, the per-32
  handling dropped (every tile through the folded loop).
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
from tests.kernels.test_sim_mxfp4 import activations, dequantised_product, weights

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
    starts, rows = [], 0
    for c in COUNTS:
        starts.append(rows)
        rows += -(-c // alignment) * alignment
    m_sum = rows + alignment
    m_indices = torch.full((m_sum,), -1, dtype=torch.int32)
    ends = []
    for e, (s0, c) in enumerate(zip(starts, COUNTS)):
        m_indices[s0:s0 + c] = e
        ends.append(s0 + c)
    a, sa = activations(1, m_sum, K, seed + 1)
    a, sa = a[0], sa[0]
    a.view(torch.uint8)[m_indices < 0] = 0
    layout = torch.tensor(ends, dtype=torch.int32) if psum else m_indices
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


def test_kernel_argument_is_checked():
    with pytest.raises(ValueError, match="kernel must be"):
        mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(
            (torch.zeros(128, 128).to(torch.float8_e4m3fn), torch.ones(128, 1)),
            (torch.zeros(1, 64, 64, dtype=torch.int8), torch.ones(1, 64, 4)),
            torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.int32), kernel="fast")


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
