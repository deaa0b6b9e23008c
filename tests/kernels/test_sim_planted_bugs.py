"""Planted bugs: each one, put into a copy of the device headers, must make the simulated GEMM fail.

This is the simulator's own acceptance test: a simulator that let any of these through would not be
worth running in CI. Each mutation is a one-line change of the kind that is easy to write and hard to
see on a GPU (hangs, or plausible-looking wrong numbers).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.runtime import paths
from deep_fp8_gemm.simulator import SimulationError

from tests._mutate import mutated_headers
from tests.kernels.test_sim_gemm import make_config, quantised_operands, run_sim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

HEADERS = Path(paths.include_dir()) / "deep_fp8_gemm"

# name: (header, original text, planted text, config args)
PLANTED = {
    "wrong_scale_index": (
        "scales.cuh",
        "s.block1 = min_of(n0 / 128u + 1u, kNumScaleBlocksN - 1);",
        "s.block1 = s.block0;",
        dict(m=64, n=336, k=256, block_m=64, block_n=112, cluster=(1, 1)),
    ),
    "wrong_row_scale": (
        "kernels/fp8_gemm.cuh",
        "const float sa_hi = kSwapAB || kRowScaledB ? 0.0f : sa[(frag_row + w * 64 + 8) * kSaPitch];",
        "const float sa_hi = kSwapAB || kRowScaledB ? 0.0f : sa[(frag_row + w * 64) * kSaPitch];",
        dict(m=64, n=128, k=256, block_m=64, block_n=64, cluster=(1, 1)),
    ),
    "wrong_barrier_arrive_count": (
        "kernels/fp8_gemm.cuh",
        "hal::mbar_init(&empty[s], kClusterSize * kNumMathWarps);",
        "hal::mbar_init(&empty[s], kClusterSize * kNumMathWarps + 1);",
        dict(m=64, n=128, k=512, block_m=64, block_n=64, cluster=(1, 1)),
    ),
    "swapped_multicast_peer": (
        "tma.cuh",
        "row0 + static_cast<i32>(cluster_rank * kHalfRows), batch);",
        "row0 + static_cast<i32>((cluster_rank ^ 1u) * kHalfRows), batch);",
        dict(m=128, n=256, k=256, block_m=64, block_n=64, cluster=(1, 2)),
    ),
    "wrong_epilogue_row_mapping": (
        "epilogue.cuh",
        "const u32 row_in_warp = (lane % 8) + (matrix & 1u) * 8;",
        "const u32 row_in_warp = (lane % 8) + (matrix >> 1) * 8;",
        dict(m=64, n=128, k=128, block_m=64, block_n=64, cluster=(1, 1)),
    ),
    "descriptor_wrong_stride": (
        "mma.cuh",
        "| (static_cast<u64>(kSwizzle128BAtomBytes >> 4) << 32)",
        "| (static_cast<u64>(kSwizzle128BAtomBytes >> 5) << 32)",
        dict(m=64, n=128, k=128, block_m=64, block_n=64, cluster=(1, 1)),
    ),
    "stage_released_before_wgmma_wait": (
        "kernels/fp8_gemm.cuh",
        "                        hal::wgmma_commit();\n",
        "                        hal::wgmma_commit();\n"
        "                        if (w + 1 == kWavesM && c + 1 == kMmaChunks)\n"
        "                            release_stage(empty, peer_window, stage, lane);\n",
        dict(m=64, n=128, k=1024, block_m=64, block_n=64, cluster=(1, 1), stages=2),
    ),
    "producer_run_by_every_lane": (
        "kernels/fp8_gemm.cuh",
        "if (warp == kNumMathWarps && hal::elect_one_sync())",
        "if (warp == kNumMathWarps)",
        dict(m=64, n=128, k=512, block_m=64, block_n=64, cluster=(1, 1)),
    ),
    "sb_copied_for_the_wrong_k_block": (
        "kernels/fp8_gemm.cuh",
        "hal::cp_async_4(sb, sb_row0 + kb);",
        "hal::cp_async_4(sb, sb_row0 + (kb + 1) % kNumKBlocks);",
        dict(m=64, n=128, k=512, block_m=64, block_n=64, cluster=(1, 1)),
    ),
    "straddle_segment_inverted": (
        "scales.cuh",
        "offset >= 128u - k * kSegmentCols;",
        "offset < 128u - k * kSegmentCols;",
        dict(m=64, n=336, k=256, block_m=64, block_n=112, cluster=(1, 1)),
    ),
    "straddle_mask_low_half": (  # a mask of the low 16 bits: the pick keeps block0's sign, exponent, top mantissa
        "promotion.cuh",
        "hal::pin(cols.segment_second(k) ? ~0u : 0u)",
        "hal::pin(cols.segment_second(k) ? 0x0000ffffu : 0u)",
        dict(m=64, n=336, k=256, block_m=64, block_n=112, cluster=(1, 1)),
    ),
    "ring_phase_not_carried_across_tiles": (  # the math warps restart the ring at stage 0, phase 0 per tile
        "kernels/fp8_gemm.cuh",
        "        Pipe pipe;\n        TileInfo tile;\n        while (next_tile(scheduler, tile)) {\n"
        "            const u32 n0 = tile.n_block * BLOCK_N;\n",
        "        TileInfo tile;\n        while (next_tile(scheduler, tile)) {\n            Pipe pipe;\n"
        "            const u32 n0 = tile.n_block * BLOCK_N;\n",
        dict(m=128, n=256, k=384, block_m=64, block_n=64, cluster=(1, 1), stages=2),
    ),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path, monkeypatch):
    header, original, planted, args = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, header, original, planted)

    m, n, k = args["m"], args["n"], args["k"]
    cfg = make_config("dense", n, k, args["block_m"], args["block_n"], cluster=args["cluster"],
                      stages=args.get("stages", 3), grid=2 * args["cluster"][1] * args["cluster"][0])
    a, sa, b, sb = quantised_operands((m,), n, k, seed=3)
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    try:
        run_sim(cfg, a, sa, b, sb, d)
    except SimulationError as e:
        print(f"{bug}: simulator reported:\n{str(e)[:1500]}")
        return
    ref = torch.empty_like(d)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    diff = calc_diff(d.nan_to_num(1e4), ref)
    assert d.isnan().any() or diff > 1e-3, f"{bug} went unnoticed (calc_diff={diff:.2e})"
