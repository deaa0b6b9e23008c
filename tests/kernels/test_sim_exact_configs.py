"""The exact kernel binaries the heuristic picks for the reference design's table, run in the simulator.

Same template constants as on the GPU (N, K, tiles, stages, cluster shape, band width): only the grid
(4 CTAs instead of 132) and the row count (one or two m-blocks instead of thousands) are reduced, and
neither is part of the binary. So the kernels the first GPU run will launch have already executed here,
with their real N and K, against the reference (calc_diff < 1e-3, NaN-poisoned output): in CI one dense binary
per tile template (_dense_cases), all of them with DFG_SIM_RACES=full.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from deep_fp8_gemm import calc_diff, ceil_div, env, reference
from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.kernels.targets import DEEPSEEK_V3_DENSE, DEEPSEEK_V3_GROUPED

from tests.kernels.test_sim_gemm import contiguous_layout, quantised_operands, run_sim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

SIM_GRID = 4  # a multiple of every cluster size


@pytest.fixture(autouse=True)
def exact_accumulation(monkeypatch):
    """These binaries run with exact fp32 wgmma accumulation (DFG_SIM_EXACT_MMA=1): their point is the real
    template constants (indexing, pipelines, multicast with real N and K), and the tensor-core model costs
    ~2.5x the simulation time on these long reductions. The kernels' accuracy under the model is tested in
    test_sim_gemm / test_sim_random_configs / test_sim_schedules (every path) and test_sim_tensor_core.

    The race detector is off here (DFG_SIM_RACES=0) unless DFG_SIM_RACES=full asks for it (the simulator's CI
    share must stay under 12 minutes): on these real-K reductions it costs ~15% (the 64x96 anchor at K = 16384:
    23-27 s with it, 20.5 s without). Every kernel family runs with the detector on in the other simulator
    tests (test_sim_races.py sweeps each one on its seeds); what the detector checks does not depend on N
    and K beyond the ring's wrap, which the smaller shapes there exercise."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    if env.sim_races() != "full":
        monkeypatch.setenv("DFG_SIM_RACES", "0")


# Shapes that crashed the reference design (its issue tracker): n=7168 with k=1152 (an odd number of K
# blocks), and n not a multiple of 64.
ODD_SHAPES = ((1, 7168, 1152), (65, 2112, 576), (129, 200, 512))


def _dense_cases():
    """One case per distinct binary the heuristic picks for the DeepSeek-V3 dense shapes and ODD_SHAPES. In CI,
    one binary per tile template (the same tiles, stages, cluster and split, other N and K): the one with the
    fewest K blocks x N blocks, plus every binary of ODD_SHAPES; DFG_SIM_RACES=full runs them all (the 256x128
    tile alone is five binaries, 3 of its 3.5 minutes in the K = 16384 / 7168 / 1536 ones)."""
    seen = {}
    problems = [(m, n, k) for n, k in DEEPSEEK_V3_DENSE for m in (64, 128, 4096)] + list(ODD_SHAPES)
    for m, n, k in problems:
        cfg = get_config(m, n, k, 1, "dense", 132)
        seen.setdefault(cfg.kernel_name(), (cfg, m, (m, n, k) in ODD_SHAPES))
    cases = sorted(seen.values(), key=lambda c: c[0].kernel_name())
    if env.sim_races() == "full":
        return [(cfg, m) for cfg, m, _ in cases]
    cheapest = {}  # tile template -> its case with the fewest K blocks x N blocks
    for case in cases:
        cfg = case[0]
        template = dataclasses.replace(cfg, shape_n=0, shape_k=0)
        cost = ceil_div(cfg.shape_k, 128) * ceil_div(cfg.shape_n, cfg.block_n)
        if template not in cheapest or cost < cheapest[template][0]:
            cheapest[template] = (cost, case)
    kept = {id(case) for _, case in cheapest.values()}
    return [(case[0], case[1]) for case in cases if case[2] or id(case) in kept]


@pytest.mark.parametrize("cfg,m", _dense_cases(), ids=lambda v: v.kernel_name() if hasattr(v, "kernel_name") else str(v))
def test_dense_anchor_config(cfg, m):
    # One m-block (two for B multicast, the second a partial one: the pairing path runs for real).
    rows = min(m, cfg.block_m) if cfg.cluster_m == 1 else cfg.block_m + 1
    cfg = dataclasses.replace(cfg, grid_size=SIM_GRID)
    n, k = cfg.shape_n, cfg.shape_k
    a, sa, b, sb = quantised_operands((rows,), n, k, seed=n + k)
    d = torch.full((rows, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d)
    ref = torch.empty_like(d)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    assert not d.isnan().any()
    assert calc_diff(d, ref) < 1e-3


@pytest.mark.parametrize("n,k", DEEPSEEK_V3_GROUPED)
def test_contiguous_anchor_config(n, k):
    cfg = dataclasses.replace(get_config(8 * 4096, n, k, 8, "contiguous", 132), grid_size=SIM_GRID)
    layout = contiguous_layout([0, 0, 0, 0, 0, 0, 70, 0])  # one non-empty expert, one partial block
    rows = layout.numel()
    a, sa, b, sb = quantised_operands((rows,), n, k, groups=cfg.num_groups, seed=n)
    d = torch.full((rows, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, layout)
    ref = torch.empty_like(d)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, layout)
    valid = layout >= 0
    assert not d[valid].isnan().any() and calc_diff(d[valid], ref[valid]) < 1e-3


@pytest.mark.parametrize("n,k", DEEPSEEK_V3_GROUPED)
def test_masked_anchor_config(n, k):
    cfg = dataclasses.replace(get_config(256, n, k, 4, "masked", 132), grid_size=SIM_GRID)
    m_max = 64
    masked_m = torch.tensor([0, 0, 33, 0], dtype=torch.int32)
    a, sa, b, sb = quantised_operands((4, m_max), n, k, groups=4, seed=k)
    d = torch.full((4, m_max, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, masked_m)
    ref = torch.empty_like(d)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), ref, masked_m, 256)
    assert not d[2, :33].isnan().any() and calc_diff(d[2, :33], ref[2, :33]) < 1e-3
    assert d[[0, 1, 3]].isnan().all()
