"""Planted bugs of simulator round 4 (issue 38): what the simulator used to treat as instant, free or untracked.

Each case plants one change into a copy of the real kernel headers (tests/_mutate.py) and requires a
SimulationError whose message names the rule, the thread, the register or address and the call sites. Every one
of these mutations ran clean (and, where the values are checked, matched the reference) before its rule existed:
  * misaligned vector access: split-K's workspace base moved 8 bytes, so its 16-byte Float4 stores and loads are
    misaligned (the GPU faults; x86 loads them and the values stay right);
  * in-flight accumulator: a promotion reading the scratch accumulator between the wgmma's commit and the
    wgmma.wait_group that retires it (the PTX ISA makes the registers undefined in that window);
  * register written after wgmma.fence: the scratch accumulator zeroed after the fence, then read by the first
    wgmma (scale-d = 0, so the values do not change: only the rule sees it);
  * register fence after wgmma.wait_group: the fence_operand loop after the wait removed;
  * cp.async completion: the producer's sB copies tracked by a plain mbarrier.arrive instead of
    cp.async.mbarrier.arrive, so the full barrier may complete before they land.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil

import pytest
import torch

from deep_fp8_gemm.config import check_config
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.kernels import split_k
from deep_fp8_gemm.simulator import SimulationError

from tests import sim_kernels

from tests._mutate import mutated_headers
from .test_sim_gemm import make_config, quantised_operands, run_sim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

GEMM = "kernels/fp8_gemm.cuh"
SMALL = dict(m=64, n=128, k=256, block_m=64, block_n=64)


def _dense(args: dict) -> None:
    cfg = make_config("dense", args["n"], args["k"], args["block_m"], args["block_n"], stages=2, grid=2)
    if args.get("split_k", 1) > 1:
        cfg = dataclasses.replace(cfg, split_k=args["split_k"])
        check_config(cfg)
        split_k.clear()
    a, sa, b, sb = quantised_operands((args["m"],), args["n"], args["k"], seed=3)
    d = torch.full((args["m"], args["n"]), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d)


# name: (header, original text, planted text, config args, message pattern)
PLANTED = {
    "misaligned_split_k_partials": (
        "split_k.cuh",
        "float* base = partials + (static_cast<u64>(tile_idx)",
        "float* base = partials + 2 + (static_cast<u64>(tile_idx)",
        dict(m=64, n=64, k=256, block_m=64, block_n=32, split_k=2),
        r"split_k\.cuh:\d+.*: misaligned: a 16-byte plain (write|read) at global 0x[0-9a-f]+ \(address % 16 = 8\)",
    ),
    # The wave's wgmma group left in flight (wait<1> keeps the newest group pending): the promotion then reads the
    # scratch accumulator of an unretired wgmma. Before the rule the deferred execution handed it the previous K
    # block's values (wrong results, no report).
    "accumulator_read_in_flight": (
        GEMM,
        "                        hal::wgmma_wait<0>();\n",
        "                        hal::wgmma_wait<1>();\n",
        SMALL,
        r"kernels/fp8_gemm\.cuh:\d+.*: wgmma registers: a plain read of d\[\d+\] of the accumulator fragment "
        r"d\[0\.\.31\] of a wgmma\.mma_async m64n64k32 issued at kernels/fp8_gemm\.cuh:\d+ \(group \d+\) before the "
        r"wgmma\.wait_group that retires it",
    ),
    # The scratch accumulator cleared after the wgmma.fence: the first wgmma (scale-d = 0) overwrites it, so the values
    # stay right and the simulator used to run clean; the PTX ISA requires the fence between the two accesses.
    "accumulator_written_after_fence": (
        GEMM,
        "                        hal::wgmma_fence();\n",
        "                        hal::wgmma_fence();\n"
        "                        DFG_UNROLL\n"
        "                        for (u32 i = 0; i < kMmaValues; ++i)\n"
        "                            scratch[i] = 0.5f * scratch[i];\n",
        SMALL,
        r"kernels/fp8_gemm\.cuh:\d+.*: wgmma registers: this wgmma\.mma_async m64n64k32 uses d\[\d+\] \(the accumulator "
        r"fragment d\[0\.\.31\]\), which this thread wrote at kernels/fp8_gemm\.cuh:\d+(?: <- \S+)* after its last wgmma\.fence "
        r"\(at kernels/fp8_gemm\.cuh:\d+\)",
    ),
    # The register fence after the wait removed: the promotion reads the accumulators with nothing keeping the compiler
    # from moving the reads above the wait (identical SASS today; see hal/sim/wgmma_registers.hpp).
    "accumulator_read_without_register_fence": (
        GEMM,
        "                        hal::wgmma_wait<0>();\n"
        "                        DFG_UNROLL\n"
        "                        for (u32 i = 0; i < kMmaValues; ++i)\n"
        "                            hal::fence_operand(scratch[i]);\n",
        "                        hal::wgmma_wait<0>();\n",
        SMALL,
        r"promotion\.cuh:\d+.*: wgmma registers: a plain read of d\[\d+\] of the accumulator fragment d\[0\.\.31\] of "
        r"a wgmma\.mma_async m64n64k32, after the wgmma\.wait_group at kernels/fp8_gemm\.cuh:\d+ that retired it, with "
        r"no register fence",
    ),
    # The producer's sB copies tracked by a plain mbarrier.arrive instead of cp.async.mbarrier.arrive: the full barrier
    # may complete before the copies land. Before, the copy happened at its issue and the plain arrive released it.
    "cp_async_tracked_by_a_plain_arrive": (
        GEMM,
        "                    hal::cp_async_mbar_arrive(bar);\n",
        "                    hal::mbar_arrive(bar);\n",
        SMALL,
        r"race: a plain read of 4 bytes at smem\+0x[0-9a-f]+ of cta \d+ conflicts with a plain write by cta \d+'s cp\.async "
        r"completion at kernels/fp8_gemm\.cuh:\d+",
    ),
}
SITE = re.compile(r"\w+\.cuh:\d+")
THREAD = re.compile(r"cta \d+ thread \d+")


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_round4_bug_is_reported(bug, tmp_path, monkeypatch):
    header, original, planted, args, pattern = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, header, original, planted)
    with pytest.raises(SimulationError) as e:
        _dense(args)
    report = str(e.value)
    print(f"{bug}: simulator reported:\n{report[:2000]}")
    assert re.search(pattern, report), f"{bug}: unexpected report:\n{report[:3000]}"
    assert THREAD.search(report) and SITE.search(report), f"{bug}: the report names no thread or call site"


def test_quantiser_vectorised_on_a_misaligned_input_is_reported():
    """The host's half of the 16-byte rule planted away: the vectorised per-token kernel launched on an input 8 bytes
    off 16-byte alignment (the plan checks the address, _run_plan's ``x.data_ptr() % 16``; the launcher here forces
    the vectorised binary). Before the rule the simulator faulted without a call site, or ran clean where the
    compiler chose unaligned moves."""
    buffer = torch.randn(64 * 256 + 8, dtype=torch.float32).to(torch.bfloat16)
    x = buffer[4 : 4 + 64 * 256].view(64, 256)
    assert x.data_ptr() % 16 == 8
    plan = kq.plan_quant(x, kq.QuantKind.PER_TOKEN)

    def forced_vectorised(config, params, grid, device):
        kq.launch_sim(dataclasses.replace(config, vectorized=True), params, grid, device)

    with pytest.raises(SimulationError) as e:
        kq._run_plan(plan, x, forced_vectorised)
    report = str(e.value)
    assert re.search(r"kernels/quant\.cuh:\d+.*: misaligned: a 16-byte plain read at global 0x[0-9a-f]+ "
                     r"\(address % 16 = 8\)", report), report[:2000]
    assert THREAD.search(report)


class StoreParams(ctypes.Structure):
    _fields_ = [("map", ctypes.c_uint8 * 128), ("out", ctypes.c_void_p), ("seen", ctypes.c_void_p),
                ("mode", ctypes.c_uint32)]


def _store_then_read(mode: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full((32, 16), 0xEE, dtype=torch.uint8)
    seen = torch.zeros(32, 16, dtype=torch.uint8)
    blob = sim_kernels.tensor_map_field(sim_kernels.tensor_map_3d(out, (16, 32, 1)))
    sim_kernels.run("tma_store_flag", StoreParams(blob, out.data_ptr(), seen.data_ptr(), mode), grid=1, block=64,
                    cluster=1, smem_bytes=512)
    return out, seen


def test_tma_store_complete_before_the_barrier_is_seen():
    out, seen = _store_then_read(0)
    expected = (torch.arange(32)[:, None] + torch.arange(16)[None, :]).to(torch.uint8)
    assert torch.equal(out, expected) and torch.equal(seen, expected)


def test_tma_store_read_waited_only_is_reported():
    """cp.async.bulk.wait_group.read before the barrier: the store's source has been read, its writes are not known to
    be complete, so warp 1's reads after the barrier race with them. Before, the writes were made at the issue and the
    reads saw the stored tile: no report."""
    with pytest.raises(SimulationError) as e:
        _store_then_read(1)
    report = str(e.value)
    # Whichever comes first in the schedule: warp 1's read (then the store's completing write finds it), or the write.
    assert re.search(r"race: (a TMA store's write \(the store issued at \S+:\d+ completes at the "
                     r"cp\.async\.bulk\.wait_group at \S+:\d+\) of 16 bytes at global 0x[0-9a-f]+ conflicts with a "
                     r"plain read by cta 0 thread \d+ \(warp 1 lane \d+\) at \S+:\d+|a plain read of 1 bytes at global "
                     r"0x[0-9a-f]+ conflicts with a TMA write by cta 0 thread 0 \(warp 0 lane 0\) at \S+:\d+)",
                     report), report[:2000]
