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

import dataclasses
import re
import shutil

import pytest
import torch

from deep_fp8_gemm.config import check_config
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.kernels import split_k
from deep_fp8_gemm.simulator import SimulationError

from ._mutate import mutated_headers
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
