"""Planted bugs in the FP8-output and SwiGLU epilogues (issue 27): each, put into a copy of the device headers, must
make the simulated kernel fail (a simulator report, NaN / unwritten output, or numbers off the reference).

The epilogue's exchanges between threads are the quad's amax partials (shared memory under bar.warp.sync: the
quad is one warp's) and the D tile a warpgroup's threads write and its leader TMA-stores (named barrier 1 + w).
The tiling needs no exchange across warpgroups (fp8_gemm.cuh's opening comment: gate and up of a value live in
one thread); "barrier_shared_across_warpgroups" plants the mix-up a cross-warpgroup exchange would invite (both
warpgroups on one 128-thread barrier).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from deep_fp8_gemm import calc_diff
from deep_fp8_gemm.ops import FAMILIES
from deep_fp8_gemm.simulator import SimulationError

from tests._mutate import mutated_headers
from tests.kernels.test_sim_fp8_output import (RECIPROCAL_TIES, dequantised, exact_operands, make_config, moe_operands,
                                               poisoned_out, reciprocal_tie_operands, run_sim)
from tests.kernels.test_sim_gemm import contiguous_layout

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

# name: (header, original text, planted text, kind, block_m); SEEDED bugs also run under adversarial schedules
# (hal/sim/schedule.hpp), since the round-robin one may happen to order their threads right.
PLANTED = {
    "quad_amax_from_the_wrong_quad": (  # the 16-byte read of the quad's partials from the neighbouring quad's lanes
        "epilogue_fp8.cuh",
        "partials + p * 32 + (lane & ~3u)",
        "partials + p * 32 + ((lane & ~3u) ^ 4u)",
        "dense_fp8out", 64),
    "quad_amax_not_reduced": (  # each lane scales its 32 values by its own partial amax
        "epilogue_fp8.cuh",
        "scale[p / 2][p % 2] = quant::amax_to_scale<kUe8m0>(quant::max_of_vec(quad));",
        "scale[p / 2][p % 2] = quant::amax_to_scale<kUe8m0>(partials[p * 32 + lane]); (void)quad;",
        "dense_fp8out", 64),
    "quad_exchange_without_warp_sync": (
        "epilogue_fp8.cuh",
        "        // The quad's partials: written by its four lanes, read by each of them.\n        hal::warp_sync();\n",
        "",
        "dense_fp8out", 64),
    "values_divided_by_the_scale": (  # a division per value (before issue 45), not x * fl(1 / scale): off at ties
        "epilogue_fp8.cuh",
        "hal::pack_e4m3x2(x0 * inv, x1 * inv);",
        "hal::pack_e4m3x2(x0 / scale[w][h], x1 / scale[w][h]); (void)inv;",
        "dense_fp8out", 64),
    "d_tile_stored_before_the_barrier": (  # the warpgroup's leader TMA-stores the tile before its warps wrote it
        "output.cuh",
        "        hal::fence_view_async_shared();\n        hal::named_barrier_sync(1 + t.wg, 128);\n        if (leader && in_n) {",
        "        hal::fence_view_async_shared();\n        if (leader && in_n) {",
        "dense_fp8out", 128),
    "barrier_shared_across_warpgroups": (
        "output.cuh",
        "        hal::fence_view_async_shared();\n        hal::named_barrier_sync(1 + t.wg, 128);\n        if (leader && in_n) {",
        "        hal::fence_view_async_shared();\n        hal::named_barrier_sync(1, 128);\n        if (leader && in_n) {",
        "dense_fp8out", 128),
    "swiglu_up_chunk_with_the_gate_scale": (
        "kernels/fp8_gemm.cuh",
        "const float sbc = c == 0 ? sb0 : sb1;",
        "const float sbc = sb0;",
        "contiguous_swiglu", 128),
    "swiglu_gate_and_up_swapped": (
        "policy_swiglu.cuh",
        "acc[w][i] = swiglu(acc[w][i], acc[w][kHalf + i]);",
        "acc[w][i] = swiglu(acc[w][kHalf + i], acc[w][i]);",
        "contiguous_swiglu", 128),
}


SEEDED = {"barrier_shared_across_warpgroups": (0, 1, 2, 3, 4, 5, 6)}
# Bugs that change bits only where x / scale and x * fl(1 / scale) round apart: run on rows holding such ties.
AT_RECIPROCAL_TIES = {"values_divided_by_the_scale"}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path, monkeypatch):
    header, original, planted, kind, block_m = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, header, original, planted)
    if kind == "dense_fp8out":  # exact sums: the unplanted kernel's bits equal the reference's (test_sim_fp8_output)
        monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
        m, n, k = 2 * block_m, 256, 256
        a, sa, b, sb = exact_operands((m,), n, k, seed=1)
        if bug in AT_RECIPROCAL_TIES:
            k = 128
            maxima = list(RECIPROCAL_TIES)
            a, sa, b, sb = reciprocal_tie_operands(m, [maxima[r % len(maxima)] for r in range(m)])
        cfg = make_config(kind, n, k, block_m)
        layout, ref_fn, ref_args = None, FAMILIES["dense_fp8out"].reference, ()
        lead_rows, n_out = m, n
    else:
        hidden, inter, groups = 128, 256, 2
        layout = contiguous_layout([100, 128])
        lead_rows, n_out = layout.numel(), inter
        a, sa, _, (b, sb) = moe_operands((lead_rows,), hidden, inter, groups, seed=2, up_gain=8.0)
        cfg = make_config(kind, 2 * inter, hidden, block_m, groups=groups)
        ref_fn, ref_args = FAMILIES["contiguous_swiglu"].reference, (layout,)
    ref = poisoned_out((), lead_rows, n_out)
    ref_fn((a, sa), (b, sb), ref, *ref_args)
    seen = []
    for seed in SEEDED.get(bug, (0,)):
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        out = poisoned_out((), lead_rows, n_out)
        try:
            run_sim(cfg, a, sa, b, sb, out, layout)
        except SimulationError as e:
            print(f"{bug} (seed {seed}): simulator reported:\n{str(e)[:1500]}")
            return
        if layout is None:
            differ = (out[0].view(torch.uint8) != ref[0].view(torch.uint8)).sum().item()
            differ += (out[1] != ref[1]).sum().item()  # NaN != NaN: unwritten scales count
            if differ:
                print(f"{bug} (seed {seed}): {differ} values differ from the reference")
                return
            seen.append(f"seed {seed}: D and sD bit-identical to the reference")
            continue
        rows = layout >= 0
        got, want = dequantised(*out)[rows], dequantised(*ref)[rows]
        diff = calc_diff(got.nan_to_num(1e4), want)
        if got.isnan().any() or diff > 1e-3:
            print(f"{bug} (seed {seed}): calc_diff={diff:.2e}, NaN: {bool(got.isnan().any())}")
            return
        seen.append(f"seed {seed}: calc_diff={diff:.2e}")
    pytest.fail(f"{bug} went unnoticed ({'; '.join(seen)})")
