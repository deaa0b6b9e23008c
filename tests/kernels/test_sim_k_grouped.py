"""The k-grouped kernel (kind "k_grouped": MoE weight gradients, D[g] = C[g] + A_g·B_gᵀ with run-time K_g per
group, one launch), executed by the CPU simulator, against an independent float64 model (numpy,
tests/ops/test_k_grouped.py::model64).

Configs are forced so that each path runs: one and two math warpgroups, one and two m64 waves, m and n not
multiples of the tile, groups with K_g = 0 first / in the middle / last, group lengths that wrap the stage ring
at different places (the ring order must carry across tiles and groups), one CTA walking every group and more
CTAs than tiles; C held in d (in place) and in another tensor (d NaN-poisoned: every element of D must be
written, also for K_g = 0). Planted bugs (a wrong group offset of the scales, a wrong group offset or K extent in
the device-built maps, a ring phase not carried across tiles, a missing tensormap fence) must be caught.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from deep_fp8_gemm import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.config import GemmConfig, check_config, get_config
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.simulator import SimulationError
from tests.ops.test_k_grouped import k_grouped_operands, model64

from tests._mutate import mutated_headers

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


@pytest.fixture(autouse=True)
def exact_accumulation(monkeypatch):
    """Exact fp32 wgmma accumulation: the comparisons below check indexing and fp32 D = C + A·Bᵀ semantics to
    fp32 rounding (the tensor-core model is covered for the family by tests/kernels/test_sim_1d1d.py)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")


CASES = {
    # name: (m, n, ks, block_m, block_n, stages, grid)
    "bm64_bn16_odd_m_empty_middle": (37, 48, [256, 0, 384], 64, 16, 3, 2),
    "bm128_two_warpgroups_odd_n_ring_wraps": (131, 40, [128, 384, 0, 256], 128, 32, 3, 3),
    "bm256_one_cta_all_groups_empty_first": (70, 64, [0, 256, 128], 256, 32, 2, 1),
    "bm64_bn128_more_ctas_than_tiles_empty_last": (20, 136, [384, 128, 0], 64, 128, 2, 8),
}


def run(cfg, a, sa, b, sb, d, c, ks):
    gemm.launch_k_grouped(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d, c,
                          torch.tensor(ks, dtype=torch.int32), sum(ks), "sim")


def check(d, expected, ks):
    got = d.double().numpy()
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    tol = 1e-5 * (np.abs(expected).max() + 1.0) * max(1, max(ks) // 128)
    assert np.abs(got - expected).max() <= tol, np.abs(got - expected).max()


@pytest.mark.parametrize("in_place", [True, False], ids=["c_is_d", "c_separate"])
@pytest.mark.parametrize("name", list(CASES))
def test_k_grouped_kernel_matches_float64(name, in_place):
    m, n, ks, block_m, block_n, stages, grid = CASES[name]
    cfg = GemmConfig(kind="k_grouped", shape_n=n, shape_k=128, num_groups=len(ks), block_m=block_m, block_n=block_n, num_stages=stages, cluster_m=1, cluster_n=1, band_width=16, grid_size=grid)
    check_config(cfg)
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=sum(map(ord, name)) % 1000)
    expected = model64(a, sa, b, sb, c, ks, m, n)
    c_before = c.clone()
    d = c.clone() if in_place else torch.full(c.shape, float("nan"))
    run(cfg, a, sa, b, sb, d, d if in_place else c, ks)
    check(d, expected, ks)
    for g, k in enumerate(ks):
        if k == 0:
            assert torch.equal(d[g], c_before[g]), f"K_{g} = 0: D_{g} must be C_{g}"
    if not in_place:
        assert torch.equal(c, c_before), "C was written"


def test_k_grouped_config_rules():
    cfg = get_config(4096, 7168, 4096, 8, "k_grouped", 132)
    assert cfg.kind == "k_grouped" and cfg.shape_k == 128 and cfg.cluster_size == 1 and cfg.num_groups == 8
    # the binary does not depend on the per-group K the cost model assumed
    assert get_config(4096, 7168, 512, 8, "k_grouped", 132).shape_k == 128
    with pytest.raises(ValueError, match="shape_k must be 128"):
        check_config(GemmConfig(kind="k_grouped", shape_n=256, shape_k=256, num_groups=4, block_m=128, block_n=128, num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=2))
    with pytest.raises(ValueError, match="1D1D kernel does not multicast"):
        check_config(GemmConfig(kind="k_grouped", shape_n=256, shape_k=128, num_groups=4, block_m=128, block_n=128, num_stages=3, cluster_m=1, cluster_n=2, band_width=8, grid_size=2))
    small = get_config(77, 120, 4096, 4, "k_grouped", 132)
    tiles = 4 * -(-77 // small.block_m) * -(-120 // small.block_n)
    assert small.grid_size == min(132, tiles)


def test_k_grouped_params_carry_the_group_maps():
    import struct

    d = torch.zeros(2, 4, 8)
    raw = gemm.pack_params([bytes(128)] * 4, rows=4, d_f32=d.data_ptr(), c_f32=d.data_ptr(), ld_d=8, ld_c=8,
                           group_maps=0x1240)
    assert len(raw) == gemm.PARAMS_BYTES
    assert struct.unpack_from("<QQIIQ", raw, 536) == (d.data_ptr(), d.data_ptr(), 8, 8, 0x1240)


# ---------------------------------------------------------------------------------------------- planted bugs
PLANTED_CFG = (70, 48, [256, 384, 0, 128], 64, 16, 2, 2)  # 2 stages: groups of 2 / 3 / 0 / 1 K blocks

def _at(indent: int, *lines: str) -> str:
    return "".join(" " * indent + line + "\n" for line in lines)


# kernels/fp8_gemm.cuh, the 1D1D wave from its wgmma commit to the release (24 spaces: the wave loop's body).
_SCALES_READ = _at(24, "WaveScales<kRowScaledB ? BLOCK_N : 16u> wave_scales;",
                   "if constexpr (kRowScaledB) {",
                   "    if (w == 0)",
                   "        sb_cols.load(sb + frag_col);",
                   "    wave_scales.combine(sb_cols, sa[frag_row + w * 64], sa[frag_row + w * 64 + 8]);",
                   "}")
_WAIT = _at(24, "hal::wgmma_wait<0>();",
            "DFG_UNROLL",
            "for (u32 i = 0; i < kMmaValues; ++i)",
            "    hal::fence_operand(scratch[i]);",
            "const bool last = w + 1 == kWavesM && c + 1 == kMmaChunks;",
            "if constexpr (kRowScaledB) {  // every scale is in registers: release, then promote",
            "    if (last) {",
            "        // Only lane 0 arrives: every lane's sA / sB reads must be ordered before its",
            "        // release (its arrive releases its own accesses only).")
_WARP_SYNC = _at(32, "hal::warp_sync();")
_SCALES_UNDER_WGMMA = _SCALES_READ + _WAIT + _WARP_SYNC
_SCALES_AFTER_WAIT = _WAIT.replace(_at(24, "if constexpr (kRowScaledB) {  // every scale is in registers: release, "
                                           "then promote"), _SCALES_READ + _at(24, "if constexpr (kRowScaledB) {"))

PLANTED = {
    # the scales' group offset (sA / sB column of the group's first K block) stuck at group 0
    "scale_column_group_offset": ("policy_k_grouped.cuh", "info.k_block0 = cur_k_block0;", "info.k_block0 = 0;"),
    # the ring's cursor is not carried across tiles: the math warps restart it at stage 0, phase 0 on every
    # tile (groups of odd K-block counts)
    "ring_phase_not_carried": ("kernels/fp8_gemm.cuh",
                               "        Pipe pipe;\n        TileInfo tile;\n        while (next_tile(scheduler, tile)) {\n"
                               "            const u32 n0 = tile.n_block * BLOCK_N;\n",
                               "        TileInfo tile;\n        while (next_tile(scheduler, tile)) {\n            Pipe pipe;\n"
                               "            const u32 n0 = tile.n_block * BLOCK_N;\n"),
    # D / C of group g at the wrong offset
    "output_group_offset": ("output.cuh",
                            "const u64 group_rows = kKGrouped ? static_cast<u64>(tile.group) * params.rows : 0u;",
                            "const u64 group_rows = kKGrouped ? static_cast<u64>(tile.group) * (params.rows - 1) : 0u;"),
    # the device-built maps (kernels/group_maps.cuh): A_g / B_g at the next group's offset (the inclusive prefix
    # sum where the exclusive one belongs), and a K extent not replaced (the template's 128 for every group)
    "map_builder_inclusive_offset": ("kernels/group_maps.cuh",
                                     "k_off = carry + inclusive[i] - k_group;",
                                     "k_off = carry + inclusive[i];"),
    "map_builder_k_extent_kept": ("kernels/group_maps.cuh",
                                  "        hal::tensormap_replace_global_dim<0>(slot, static_cast<u32>(k_group));\n",
                                  ""),
    # TMA through a map in global memory without the acquire fence
    "tensormap_fence_missing": ("kernels/fp8_gemm.cuh", "                hal::tensormap_fence_acquire(map_b);\n", ""),
    # lane 0 releases the stage while other lanes of its warp still read sB from it (adversarial schedules): the
    # scales read after the wgmma wait, as the promotion did before issue 28, and no bar.warp.sync before the
    # release. (The kernel reads them between the commit and the wait, so that every lane has read them before
    # any lane passes the wait in the simulator; the warp sync it keeps orders the lanes' reads before lane 0's
    # arrive on the GPU, and deleting it alone goes unnoticed here.)
    "stage_released_before_all_lanes_read_sb": ("kernels/fp8_gemm.cuh", _SCALES_UNDER_WGMMA, _SCALES_AFTER_WAIT),
}
# Schedules each bug is run under until one reports it (default: the round-robin schedule only). A race shows
# under some interleavings and not others, and which ones depends on the whole kernel's code, so the race is
# given several adversarial seeds (with the scales read under the wgmma, the plant above is caught by seeds 10,
# 12, 26, 33, 45, 59 and 62 of 0-63; the warp sync deleted from the old order was caught by 5, 33, 35 and 48).
PLANTED_SEEDS = {"stage_released_before_all_lanes_read_sb": (10, 12, 26, 33)}


def _run_planted(d, c):
    m, n, ks, block_m, block_n, stages, grid = PLANTED_CFG
    cfg = GemmConfig(kind="k_grouped", shape_n=n, shape_k=128, num_groups=len(ks), block_m=block_m, block_n=block_n, num_stages=stages, cluster_m=1, cluster_n=1, band_width=16, grid_size=grid)
    a, sa, b, sb, c0 = k_grouped_operands(m, n, ks, seed=21)
    c.copy_(c0)
    d.fill_(float("nan"))
    try:
        run(cfg, a, sa, b, sb, d, c, ks)
    except SimulationError as e:
        return str(e)
    got = d.double().numpy()
    expected = model64(a, sa, b, sb, c0, ks, m, n)
    return None if np.isfinite(got).all() and np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max() else \
        f"wrong result: max error {np.nanmax(np.abs(got - expected))}, NaN {int(np.isnan(got).sum())}"


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_kernel_bug_is_caught(bug, tmp_path, monkeypatch):
    header, original, planted = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, header, original, planted)
    m, n, ks = PLANTED_CFG[:3]
    report = None
    for seed in PLANTED_SEEDS.get(bug, (0,)):
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        report = _run_planted(torch.empty(len(ks), m, n), torch.empty(len(ks), m, n))
        if report is not None:
            break
    assert report is not None, f"{bug} went unnoticed under seeds {PLANTED_SEEDS.get(bug, (0,))}"
    print(f"{bug}: {report[:600]}")
    if bug == "tensormap_fence_missing":
        assert "fence.proxy.tensormap::generic.acquire" in report


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_k_grouped_under_adversarial_schedules(seed, monkeypatch):
    """Seeded adversarial schedules (shuffled fibers, preemption at hal calls, delayed TMA landing, the producer
    far ahead or behind) on groups of 2 / 3 / 0 / 1 K blocks with a 2-stage ring, C in place."""
    monkeypatch.setenv("DFG_SIM_SEED", str(seed))
    m, n, ks, block_m, block_n, stages, grid = PLANTED_CFG
    cfg = GemmConfig(kind="k_grouped", shape_n=n, shape_k=128, num_groups=len(ks), block_m=block_m, block_n=block_n, num_stages=stages, cluster_m=1, cluster_n=1, band_width=16, grid_size=grid)
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=30 + seed)
    d = c.clone()
    run(cfg, a, sa, b, sb, d, d, ks)
    check(d, model64(a, sa, b, sb, c, ks, m, n), ks)
