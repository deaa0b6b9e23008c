"""Batch invariance of the kernels, in the simulator (issue 37): for each family, the same rows inside batches of
several sizes and among other neighbours, under the tiles the heuristic picks at each size (forced onto a
simulator-sized problem, BLOCK_N 144 included), give identical bits; so do other schedule seeds. The sharp rows are
those whose exact products cancel (tests/_invariance.py): their result is the rounding residue of the summation
order. An M-dependent split-K (the fast mode's) fails the same check.

The simulator's tensor core is the same per-element model whatever the wgmma's shape or operand order
(hal/sim/numerics.hpp states it: the inner product is symmetric in its operands), so swap-AB against the plain
kernel here checks the kernels' promotion and stores; the GPU check (tests/gpu/test_gpu_batch_invariance.py)
checks the hardware's side.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from deep_fp8_gemm import get_mk_alignment_for_contiguous_layout, ops, set_mk_alignment_for_contiguous_layout
from deep_fp8_gemm.config import GemmConfig, check_config, get_config
from deep_fp8_gemm.kinds import TABLE
from tests._invariance import cancelling_operands, random_rows, run_rows

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

#: Per family: the simulator-sized problem (n, k; k = 256 so that the cancelling rows' halves are the two K blocks)
#: and the DeepSeek-V3 shape whose picks supply the tiles.
PROBLEMS = {
    "dense": (288, 256, (2112, 7168)),
    "contiguous": (320, 256, (4096, 7168)),
    "psum": (320, 256, (4096, 7168)),
    "masked": (320, 256, (4096, 7168)),
    "dense_fp8out": (256, 256, (4096, 7168)),
    "contiguous_swiglu": (512, 256, (4096, 7168)),
}
PICK_MS = (8, 128, 512, 4096)
#: (batch, position of the target rows): alone, and among many neighbours across a 128-row block boundary.
BATCHES = ((6, 0), (150, 120))


def forced(pick: GemmConfig, n: int, k: int, groups: int) -> GemmConfig:
    """``pick``'s tile, stages, cluster and band on the small problem (a cluster that does not fit it: none)."""
    cfg = dataclasses.replace(pick, shape_n=n, shape_k=k, num_groups=groups, num_stages=min(pick.num_stages, 3),
                              grid_size=min(pick.grid_size, 2 * pick.cluster_size))
    try:
        check_config(cfg)
    except ValueError:
        cfg = dataclasses.replace(cfg, cluster_m=1, cluster_n=1, grid_size=2, band_width=16)
        check_config(cfg)
    return cfg


def picks(kind: str) -> list[GemmConfig]:
    """The distinct tiles the (invariant) heuristic picks for the family's DeepSeek-V3 shape over PICK_MS, forced
    onto the small problem."""
    n, k, (big_n, big_k) = PROBLEMS[kind]
    row = TABLE.row(kind)
    groups = 1 if row.layout == "dense" else 2
    big_groups = 1 if row.layout == "dense" else 8
    out = {}
    for m in PICK_MS:
        m_arg = m * big_groups if row.layout in ("contiguous", "psum") else m
        cfg = forced(get_config(m_arg, big_n if row.output != "swiglu_fp8" else 4096, big_k, big_groups, kind,
                                contiguous_alignment=get_mk_alignment_for_contiguous_layout()), n, k, groups)
        out[cfg.kernel_name()] = cfg
    return list(out.values())


def target(kind: str):
    n, k, _ = PROBLEMS[kind]
    a, sa, b, sb = cancelling_operands(k, n, 4, seed=21)
    ra, rsa = random_rows(2, k, seed=22)
    return (torch.cat([a.view(torch.uint8), ra.view(torch.uint8)]).view(a.dtype), torch.cat([sa, rsa])), (b, sb)


def collect(kind, configs, monkeypatch, batches=BATCHES):
    """Target-row bits of every (config, batch) run."""
    rows, rhs = target(kind)
    runs = []
    for cfg in configs:
        monkeypatch.setattr(ops.FAMILIES[kind], "plan", lambda *a, _cfg=cfg, **k: _cfg)
        for i, (batch, at) in enumerate(batches):
            runs.append((cfg.kernel_name(), batch, run_rows(kind, rows, rhs, batch, at, seed=30 + i)))
    return runs


def assert_invariant(runs) -> None:
    name0, batch0, first = runs[0]
    for name, batch, run in runs[1:]:
        for got, want in zip(run, first):
            assert torch.equal(got, want), f"{name} at batch {batch} differs from {name0} at batch {batch0}"


@pytest.fixture
def simulated(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")


@pytest.mark.parametrize("kind", sorted(PROBLEMS))
def test_rows_do_not_depend_on_batch_tile_or_neighbours(kind, simulated, monkeypatch):
    configs = picks(kind)
    assert len(configs) >= 2, [c.kernel_name() for c in configs]
    assert_invariant(collect(kind, configs, monkeypatch))


def test_the_contiguous_alignment_changes_the_tile_not_the_bits(simulated, monkeypatch):
    """Alignment 64 makes BLOCK_M 64 for the contiguous kernels: same rows, same bits."""
    runs = collect("contiguous", picks("contiguous")[:1], monkeypatch, BATCHES[:1])
    try:
        set_mk_alignment_for_contiguous_layout(64)
        runs += collect("contiguous", picks("contiguous")[:1], monkeypatch, BATCHES[:1])
    finally:
        set_mk_alignment_for_contiguous_layout(128)
    assert runs[0][0] != runs[1][0]  # another kernel
    assert_invariant(runs)


def test_swap_ab_and_the_plain_kernel_agree(simulated, monkeypatch):
    n, k, _ = PROBLEMS["dense"]
    plain = forced(get_config(8, 2112, 7168), n, k, 1)
    swapped = forced(get_config(8, 2112, 7168, swap_ab=True), n, k, 1)
    assert swapped.swap_ab and not plain.swap_ab
    assert_invariant(collect("dense", [plain, swapped], monkeypatch, ((6, 0), (30, 24))))


def test_schedule_seeds_do_not_change_the_bits(simulated, monkeypatch):
    runs = []
    for seed in ("0", "7"):
        monkeypatch.setenv("DFG_SIM_SEED", seed)
        runs += collect("dense", picks("dense")[-1:], monkeypatch, BATCHES[-1:])
    assert_invariant(runs)


def test_an_m_dependent_split_k_fails_the_check(simulated, monkeypatch):
    """The fast mode's picks (split-K at few rows, none at many) forced onto the same problem: the cancelling rows
    come back with other bits, which is what the check exists to catch."""
    n, k, _ = PROBLEMS["dense"]
    small = get_config(8, 576, 7168, batch_invariant=False)
    assert small.split_k > 1
    split = dataclasses.replace(forced(dataclasses.replace(small, split_k=1, swap_ab=False, block_m=64, block_n=32),
                                       n, k, 1), split_k=2, grid_size=4)
    check_config(split)
    plain = forced(get_config(512, 576, 7168, batch_invariant=False), n, k, 1)
    assert plain.split_k == 1
    with pytest.raises(AssertionError, match="differs"):
        assert_invariant(collect("dense", [split, plain], monkeypatch, BATCHES[:1]))
