"""The simulator's model of split-K's hal operations (tests/sim_kernels/split_sync.cu): the global atomic add and
the named barrier with an OR reduction (bar.red.or.pred), including the misuses it must report."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from deep_fp8_gemm.simulator import SimulationError
from tests import sim_kernels

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


class Params(ctypes.Structure):
    _fields_ = [("counter", ctypes.c_void_p), ("olds", ctypes.c_void_p), ("any", ctypes.c_void_p),
                ("mode", ctypes.c_uint32), ("pick", ctypes.c_uint32)]


def _launch(mode, grid=1, pick=0):
    counter = torch.full((1,), 5, dtype=torch.int32)
    olds = torch.full((grid * 256,), -1, dtype=torch.int32)
    any_ = torch.full((grid * 256 * 2,), -1, dtype=torch.int32)
    p = Params(counter.data_ptr(), olds.data_ptr(), any_.data_ptr(), mode, pick)
    sim_kernels.run("split_sync", p, grid=grid, block=256, cluster=1, smem_bytes=1024)
    return counter, olds, any_.view(grid, 2, 128, 2)


@pytest.mark.parametrize("seed", ["0", "7"])
@pytest.mark.parametrize("pick", [5, 200])
def test_atomic_add_and_barrier_or(pick, seed, monkeypatch):
    monkeypatch.setenv("DFG_SIM_SEED", seed)  # 7: an adversarial interleaving
    counter, olds, any_ = _launch(0, grid=3, pick=pick)
    assert int(counter) == 5 + 3 * 256  # no update lost
    assert sorted(olds.tolist()) == list(range(5, 5 + 3 * 256))  # each old value returned exactly once
    picked_wg = pick // 128
    for wg in range(2):
        assert (any_[:, wg, :, 0] == int(wg == picked_wg)).all(), "OR of the round's predicates, in every thread"
    assert (any_[..., 1] == 0).all(), "the next round starts from false"


def test_bar_sync_and_bar_red_in_one_round_is_reported():
    with pytest.raises(SimulationError, match=r"bar\.sync and bar\.red used in the same round of the barrier"):
        _launch(1)


def test_atomic_on_shared_memory_is_reported():
    with pytest.raises(SimulationError, match=r"atomic_add_acq_rel_gpu: .* points into the shared memory of cta 0"):
        _launch(2)
