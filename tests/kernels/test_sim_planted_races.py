"""Planted memory-ordering bugs in copies of the real kernel headers: each must be reported by the simulator's race
detector (hal/sim/hb.hpp, hal/sim/shadow.hpp) with its kind, both threads and both call sites, on every seed.

Each of these ran clean and matched the reference before the detector existed: a sequentially consistent
emulation makes every store visible at once, and on the GPU each is a rare wrong answer, not a crash. Programmatic
dependent launch is planted here too (the GEMM without its griddepcontrol.wait, two launches of it as one stream);
the patterns the kernels do not use (shared memory exchanged between warpgroups) are planted in small kernels in
tests/kernels/test_sim_races.py, with PDL's other cases (a CTA exiting without the wait, reads before it).
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

import deep_fp8_gemm.kernels.quant as kq
from deep_fp8_gemm.kernels import gemm, split_k
from deep_fp8_gemm import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.config import GemmConfig, check_config
from deep_fp8_gemm.runtime import paths
from deep_fp8_gemm.simulator import SimulationError, launch as sim_launch

from tests._mutate import mutated_headers
from tests.kernels.test_sim_1d1d import _operands as operands_1d1d
from tests.kernels.test_sim_split_k import run_case as run_split_k_case, split_config

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

SEEDS = (0, 1, 2, 3)


def header_line(header: str, text: str) -> int:
    """Line (1-based) of the one line of include/deep_fp8_gemm/<header> that contains ``text``."""
    lines = [i + 1 for i, line in enumerate((paths.include_dir() / "deep_fp8_gemm" / header).read_text().splitlines())
             if text in line]
    assert len(lines) == 1, f"{text!r} is on {len(lines)} lines of {header}: update this test"
    return lines[0]


def run_split_k(seed, monkeypatch):
    # Four CTAs for 3 tiles x 4 splits: the splits of a tile run on different CTAs, at the same time.
    monkeypatch.setenv("DFG_SIM_SEED", str(seed))
    split_k.clear()
    run_split_k_case(split_config(96, 512, 64, 32, 4, 4), 7, seed=seed)


def run_1d1d(seed, monkeypatch):
    # Four K blocks through two stages: the producer reloads every stage's sB while the math warps may still
    # be reading the previous one.
    monkeypatch.setenv("DFG_SIM_SEED", str(seed))
    m, n, k = 64, 64, 512
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=64, block_n=64, num_stages=2,
                     cluster_m=1, cluster_n=1, band_width=16, grid_size=1)
    check_config(cfg)
    a, sa, b, sb, c = operands_1d1d(m, n, k, seed=4)
    d = c.clone()
    gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d, d, "sim")


def run_per_token(seed, monkeypatch):
    def launch(config, params, grid, device):
        name, source = kq.render_source(config)
        sim_launch(name, source, bytes(params), grid=grid, block=config.num_threads, cluster=1,
                   smem_bytes=config.smem_bytes, seed=seed)

    x = (torch.randn(40, 384, generator=torch.Generator().manual_seed(8)) * 3).to(torch.bfloat16)
    kq.run_per_token(x, kq.QuantKind.PER_TOKEN, "x", launch)


SPLIT_STORE = ("split_k.cuh", "mine[j * 128] = v;")
SPLIT_LOAD_FIRST = ("split_k.cuh", "const Float4 p = src[j * 128];")  # the reduce's loads (split 0, splits >= 1)
SPLIT_ATOMIC = "last = hal::atomic_add_acq_rel_gpu(counter, 1u) == kSplitK - 1 ? 1u : 0u;"

# name: (header, original, planted, runner, kind, (header, line text) of the two call sites (None: either load))
PLANTED = {
    # A partial not ordered before the counter's release: without the bar.sync only thread 0's own stores are
    # released by its atomic, the other 127 threads' are not.
    "split_k_partial_not_ordered_before_release": (
        "split_k.cuh", "        hal::named_barrier_sync(1 + wg, 128);\n        u32 last = 0;\n", "        u32 last = 0;\n",
        run_split_k, "race", SPLIT_STORE, None),
    # A relaxed counter: the increments are still atomic, but order nothing.
    "split_k_relaxed_counter": (
        "split_k.cuh", SPLIT_ATOMIC,
        SPLIT_ATOMIC.replace("hal::atomic_add_acq_rel_gpu(", "hal::atomic_add<hal::MemOrder::Relaxed, hal::MemScope::Gpu>("),
        run_split_k, "relaxed", SPLIT_STORE, None),
    # A .cta scope: the splits of a tile run on different CTAs, whose .cta atomics are not even atomic together.
    "split_k_cta_scope_counter": (
        "split_k.cuh", SPLIT_ATOMIC,
        SPLIT_ATOMIC.replace("hal::atomic_add_acq_rel_gpu(", "hal::atomic_add<hal::MemOrder::AcqRel, hal::MemScope::Cta>("),
        run_split_k, "scope", ("split_k.cuh", "hal::atomic_add<"), ("split_k.cuh", "hal::atomic_add<")),
    # 1D1D: lane 0 releases the stage for its warp, but only bar.warp.sync orders the other lanes' reads of the
    # stage's sB (which come after the wgmma wait) before that release.
    "1d1d_stage_released_without_warp_sync": (
        "kernels/fp8_gemm.cuh",
        "                                hal::warp_sync();\n                                release_stage(empty, peer_window, stage, lane);\n",
        "                                release_stage(empty, peer_window, stage, lane);\n",
        run_1d1d, "race", ("policy_1d1d.cuh", "pair[j] = *reinterpret_cast<const F32x2*>(sb_thread + 8 * j);"),
        ("kernels/fp8_gemm.cuh", "hal::tma_load_3d(sb, &params.tma_sb, bar, n0, static_cast<i32>(kb), 0);")),
    # Quantiser: the per-group amax read back from shared memory without the bar.sync after the partials.
    "quant_amax_read_without_barrier": (
        "kernels/quant.cuh", "    partial[tid] = abs_max_bits(v);\n    hal::sync_threads();\n",
        "    partial[tid] = abs_max_bits(v);\n",
        run_per_token, "race", ("kernels/quant.cuh", "partial[tid] = abs_max_bits(v);"),
        ("kernels/quant.cuh", "amax_bits = max_of(max_of_vec(mine[0]), max_of_vec(mine[1]));")),
}


def site_pattern(where) -> str:
    if where is None:  # one of the reduce's loads
        header, text = SPLIT_LOAD_FIRST
        lines = [i + 1 for i, line in enumerate((paths.include_dir() / "deep_fp8_gemm" / header).read_text().splitlines())
                 if text in line]
        assert lines, f"{text!r} not in {header}"
        return rf"{re.escape(header)}:(?:{'|'.join(map(str, lines))})\b"
    header, text = where
    return rf"{re.escape(header)}:{header_line(header, text)}\b"


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_ordering_bug_is_reported_with_both_sites(bug, tmp_path, monkeypatch):
    header, original, planted, runner, kind, first, second = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, header, original, planted)
    first_site, second_site = site_pattern(first), site_pattern(second)  # lines in the mutated copy
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    for seed in SEEDS:
        with pytest.raises(SimulationError) as e:
            runner(seed, monkeypatch)
        report = str(e.value)
        print(f"{bug} (seed {seed}):\n{report[:2000]}")
        assert re.search(rf"\b{kind}: ", report), f"{bug}: expected a {kind} report:\n{report[:3000]}"
        assert re.search(first_site, report) and re.search(second_site, report), (
            f"{bug}: the report does not name both call sites ({first_site}, {second_site}):\n{report[:3000]}")
        assert len(re.findall(r"cta \d+ thread \d+", report)) >= 2, f"{bug}: the report names one thread:\n{report}"


# ---------------------------------------------------------------------------------------------- PDL in a real kernel
def _dense_stream(seed, monkeypatch):
    """The dense GEMM launched twice as one stream, the second a programmatic dependent launch of the first, both
    writing the same D (what a chain of layers does to a reused output buffer): the simulator call of gemm.launch is
    captured and replayed through launch_stream. Returns D and the float64 reference."""
    import dataclasses

    from deep_fp8_gemm import simulator

    from tests._operands import gemm64
    from tests.kernels.test_sim_gemm import make_config, quantised_operands

    captured = {}
    monkeypatch.setattr(simulator, "launch", lambda name, source, params, **kw: captured.update(
        name=name, source=source, params=params, **kw))
    m, n, k = 100, 128, 512  # 2 m-blocks x 2 n-blocks on 2 CTAs, 4 K blocks through 2 stages
    cfg = make_config("dense", n, k, 64, 64, stages=2, grid=2)
    a, sa, b, sb = quantised_operands((m,), n, k, seed=3)
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    gemm.launch_1d2d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, sb, d, None, backend="sim")
    first = simulator.StreamLaunch(captured["name"], captured["params"], captured["grid"], captured["block"],
                                   captured["cluster"], captured["smem_bytes"], captured["registers"])
    simulator.launch_stream(captured["source"], [first, dataclasses.replace(first, programmatic=True)], seed=seed)
    return d, gemm64(a, sa, b, sb)


@pytest.mark.parametrize("seed", (0, 1))
def test_gemm_chained_by_pdl_runs_clean(seed, monkeypatch):
    """The real GEMM's griddepcontrol.wait (both roles, before the first global access) orders the dependent launch's
    TMA loads and D stores after the whole previous grid: no report, and D is the GEMM's."""
    from tests._operands import assert_within_one_bf16_ulp

    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")  # the float64 bound is for exact fp32 accumulation
    d, expected = _dense_stream(seed, monkeypatch)
    assert_within_one_bf16_ulp(d, expected)


def test_planted_gemm_without_its_grid_dependency_waits_is_reported(tmp_path, monkeypatch):
    """Both waits planted away (producer and math roles): the dependent GEMM's accesses run alongside the previous
    grid (it launched once every CTA of that one executed launch_dependents) and are reported as `pdl`."""
    producer_wait = "            hal::setmaxnreg_dec<kProducerRegisters>();\n            hal::grid_dependency_wait();\n"
    math_wait = "            hal::setmaxnreg_inc<kMathRegisters>();\n            hal::grid_dependency_wait();\n"
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh", producer_wait,
                    "            hal::setmaxnreg_dec<kProducerRegisters>();\n")
    target = tmp_path / "include" / "deep_fp8_gemm" / "kernels" / "fp8_gemm.cuh"
    text = target.read_text()
    assert text.count(math_wait) == 1, "the math role's wait is no longer spelled this way: update this test"
    target.write_text(text.replace(math_wait, "            hal::setmaxnreg_inc<kMathRegisters>();\n"))
    for seed in SEEDS:
        with pytest.raises(SimulationError) as e:
            _dense_stream(seed, monkeypatch)
        report = str(e.value)
        assert re.search(r"\bpdl: ", report), f"seed {seed}: expected a pdl report:\n{report[:3000]}"
        # both kernels' D stores (the only memory both write), with both threads and both call sites
        assert len(re.findall(rf"{site_pattern(('epilogue.cuh', 'hal::tma_store_3d('))}", report)) >= 2 and \
            len(re.findall(r"kernel [01] cta \d+ thread \d+", report)) >= 2, report[:3000]
