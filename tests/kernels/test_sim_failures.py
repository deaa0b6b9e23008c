"""Planted bugs must make a simulated launch fail with a report that points at the bug.

Kernel: tests/sim_kernels/failures.cu (one warpgroup; `mode` selects the bug).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from deep_fp8_gemm.runtime.tensor_map import TmaSwizzle
from deep_fp8_gemm.simulator import SimBuildError, SimulationError, build_library, launch
from tests import sim_kernels
from tests._mutate import carry_simulator_entries
from tests.sim_kernels import tensor_map_3d, tensor_map_field

SMEM_BYTES = 32 * 1024


class FailureParams(ctypes.Structure):
    _fields_ = [
        ("map", ctypes.c_uint8 * 128),
        ("mode", ctypes.c_uint32),
        ("smem_bytes", ctypes.c_uint32),
        ("bad_pointer", ctypes.c_void_p),
    ]


TILE = torch.zeros((64, 128), dtype=torch.uint8)  # e4m3 zeros; alive for the whole module

# mode -> regular expression the report must match
CASES = {
    0: r"deadlock: no thread can make progress\n"
    r"  cta 0 threads 0-127 \(warps 0-3\): mbar_wait\(mbarrier\[0\] @smem\+0, parity 0\) - barrier in phase 0 \(parity 0\), "
    r"1 of 2 arrivals pending, tx-count 0",
    1: r"cta 0 thread 0 .*TMA write into a stage still read by wgmma: box \[0x400, 0x2400\) of cta 0 overlaps "
    r"operand A .* of a wgmma of warpgroup 0 \(group 0, not yet waited",
    2: r"tma_load_3d: shared-memory access \[0x7000, 0x9000\) out of bounds \(dynamic smem is 0x8000 bytes\)",
    3: r"cta 0 thread 7 \(warp 0 lane 7\) at \S*failures_\w+\.cpp:\d+: trap: planted trap 42",
    4: r"cta 0 thread 5 .*wgmma is warpgroup-collective but this thread's operands differ",
    5: r"cta 0 thread 1 .*mbar_arrive: arrival beyond the expected count 1 on the mbarrier at smem\+0",
    6: r"mbar_wait: mbarrier at smem\+0x8 of cta 0 is not initialised",
    7: r"shared-memory source \[0x400, 0x2400\) of a TMA store was overwritten before tma_store_wait_read",
    8: r"tma_load_3d: shared-memory address smem\+0x480 is not 1024-byte aligned",
    9: r"wgmma issued without wgmma_fence",
    10: r"cta 0 thread 16 \(warp 0 lane 16\) at \(thread exit\): convergence: thread exits after 1 \.aligned "
    r"operations, but thread 0 of its warp 0 executed stmatrix\.sync\.aligned at \S*failures_\w+\.cpp:\d+ as its 2nd",
    11: r"race: cta 0: a wgmma of warpgroup 0 \(issued by thread \d+ at \S*failures_\w+\.cpp:\d+\) reads smem "
    r"\[0x400, 0x2400\) before the TMA load writing it has landed",
    12: r"cta 0 thread 3 \(warp 0 lane 3\): segmentation fault at address 0x10",
    13: r"cta 0 thread 32 \(warp 1 lane 0\) at \S*failures_\w+\.cpp:\d+: convergence: setmaxnreg\.inc is this "
    r"thread's 1st \.aligned operation, but thread 0 of its warpgroup 0 exited after 0",
}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_planted_bug_is_reported(mode):
    p = FailureParams(tensor_map_field(tensor_map_3d(TILE, (128, 64, 1), TmaSwizzle.B128)), mode, SMEM_BYTES, 0x10)
    with pytest.raises(SimulationError, match=CASES[mode]):
        sim_kernels.run("failures", p, grid=1, block=128, cluster=1, smem_bytes=SMEM_BYTES)


def test_step_limit_reports_the_waiting_threads():
    p = FailureParams(tensor_map_field(tensor_map_3d(TILE, (128, 64, 1), TmaSwizzle.B128)), 0, SMEM_BYTES)
    with pytest.raises(SimulationError, match=r"(step limit|deadlock)"):
        sim_kernels.run("failures", p, grid=1, block=128, cluster=1, smem_bytes=SMEM_BYTES, max_steps=1)


def test_invalid_launch_configuration_is_rejected():
    p = FailureParams(tensor_map_field(tensor_map_3d(TILE, (128, 64, 1), TmaSwizzle.B128)), 3, SMEM_BYTES)
    with pytest.raises(SimulationError, match=r"block_x=256 exceeds the kernel's NUM_THREADS=128"):
        sim_kernels.run("failures", p, grid=1, block=256, cluster=1, smem_bytes=SMEM_BYTES)
    with pytest.raises(SimulationError, match=r"cluster_x=2 must be in 1\.\.8 and divide grid_x=3"):
        sim_kernels.run("failures", p, grid=3, block=128, cluster=2, smem_bytes=SMEM_BYTES)


def test_compile_error_carries_the_compiler_log():
    source = "#include <deep_fp8_gemm/hal.cuh>\nint broken( { }\n"
    with pytest.raises(SimBuildError, match=r"(?s)simulator build of k_broken failed.*k_broken_\w+\.cpp:2:\d+: error"):
        build_library(source, "k_broken")
    with pytest.raises(ValueError, match="C identifier"):
        launch("not a name", source, b"", grid=1, block=1, cluster=1, smem_bytes=0)


def test_build_is_cached_by_content(tmp_path, monkeypatch):
    carry_simulator_entries(tmp_path)  # the session's runtime and prelude: this test is about the library's entry
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DFG_JIT_DISABLE_CACHE", raising=False)
    name, source = sim_kernels.source("stmatrix")
    first = build_library(source, name)
    assert first.parent == tmp_path / "sim" and first.with_suffix(".cpp").read_text() == source
    assert build_library(source, name) == first
    assert build_library(source + "\n// changed\n", name) != first
