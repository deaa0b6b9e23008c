"""The simulator's race detector (hal/sim/hb.hpp, hal/sim/shadow.hpp) on small kernels written for it.

tests/sim_kernels/races.cu holds one pattern per mode: each correct one must run silent, each planted bug must be
reported with its kind (race / relaxed / scope) and both call sites (file:line of the two conflicting accesses),
on every seed tried: the detector checks happens-before, not what a schedule happened to expose.
tests/sim_kernels/pdl.cu does the same for programmatic dependent launches (two kernels in one stream).
"""

from __future__ import annotations

import ctypes
import re
import shutil

import pytest
import torch

from deep_fp8_gemm.simulator import SimulationError, StreamLaunch, launch_stream
from tests import sim_kernels

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

SEEDS = (0, 1, 2, 3)


def line_of(stem: str, text: str, nth: int = 0) -> int:
    """Line number (1-based) of the nth line of tests/sim_kernels/<stem>.cu containing ``text``."""
    lines = [i + 1 for i, line in enumerate((sim_kernels.DIRECTORY / f"{stem}.cu").read_text().splitlines())
             if text in line]
    assert len(lines) > nth, f"{text!r} not in {stem}.cu: update the test"
    return lines[nth]


def site(stem: str, text: str, nth: int = 0) -> str:
    """The call-site pattern a report prints for that line of the rendered translation unit."""
    return rf"{stem}_\w+\.cpp:{line_of(stem, text, nth)}\b"


class RaceParams(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("data", ctypes.c_void_p),
                ("counter", ctypes.c_void_p), ("flag", ctypes.c_void_p), ("out", ctypes.c_void_p)]


MODES = {  # name: (mode, grid, cluster)
    "smem_named_barrier": (0, 1, 1), "smem_no_barrier": (1, 1, 1), "smem_mbarrier": (2, 1, 1),
    "smem_write_after_arrive": (3, 1, 1), "smem_mbarrier_no_wait": (4, 1, 1),
    "warp_sync": (5, 1, 1), "warp_no_sync": (6, 1, 1),
    "counter_acq_rel": (7, 4, 1), "counter_relaxed": (8, 4, 1), "counter_cta_scope": (9, 4, 1),
    "counter_fences": (10, 4, 1), "counter_sc_fences": (11, 4, 1),
    "counter_barrier_cumulative": (12, 4, 1), "counter_no_barrier": (13, 4, 1),
    "flag_release_acquire": (14, 2, 1), "flag_relaxed_store": (15, 2, 1),
    "remote_arrive_data": (16, 2, 2), "cluster_barrier_data": (17, 2, 2),
}
CORRECT = ["smem_named_barrier", "smem_mbarrier", "warp_sync", "counter_acq_rel", "counter_fences",
           "counter_sc_fences", "counter_barrier_cumulative", "flag_release_acquire", "cluster_barrier_data"]

# name: (kind, the two call sites, in either order)
S = "races"
BUGS = {
    "smem_no_barrier": ("race", site(S, "area[i] = float(i);", 1), site(S, "p.out[t] = area[127 - i];")),
    "smem_write_after_arrive": ("race", site(S, "area[i] = float(i);", 0), site(S, "p.out[t] = area[127 - i];")),
    "smem_mbarrier_no_wait": ("race", site(S, "area[i] = float(i);", 1), site(S, "p.out[t] = area[127 - i];")),
    "warp_no_sync": ("race", site(S, "area[t] = t;"), site(S, "p.out[t] = float(area[t + 1]);")),
    "counter_relaxed": ("relaxed", site(S, "p.data[cta * kNumThreads] = float(cta);"), site(S, "sum += p.data[i];")),
    "counter_cta_scope": ("scope", site(S, "MemScope::Cta>(p.counter, 1u)"), site(S, "MemScope::Cta>(p.counter, 1u)")),
    "counter_no_barrier": ("race", site(S, "p.data[cta * kNumThreads + t] = float(cta * kNumThreads + t);"),
                           site(S, "sum += p.data[i];")),
    "flag_relaxed_store": ("relaxed", site(S, "p.data[0] = 42.f;"), site(S, "p.out[hal::block_idx()] = p.data[0];")),
    "remote_arrive_data": ("scope", site(S, "p.data[0] = 7.f;"), site(S, "p.out[0] = p.data[0];")),
}
assert set(CORRECT) | set(BUGS) == set(MODES)


FLAG_MODES = {"flag_release_acquire", "flag_relaxed_store"}


def run_mode(name: str, seed: int) -> bool:
    """Runs one mode; False when a flag mode's reader did not see the flag (so read nothing: no access to check)."""
    mode, grid, cluster = MODES[name]
    data = torch.zeros(grid * 256)
    counter = torch.zeros(1, dtype=torch.int32)
    flag = torch.zeros(1, dtype=torch.int32)
    out = torch.zeros(grid * 256)
    p = RaceParams(mode, 0, data.data_ptr(), counter.data_ptr(), flag.data_ptr(), out.data_ptr())
    sim_kernels.run("races", p, grid=grid, block=256, cluster=cluster, smem_bytes=2048, seed=seed)
    return name not in FLAG_MODES or bool(out[1] == 42)


def assert_reported(report: str, kind: str, first: str, second: str) -> None:
    assert re.search(rf"\b{kind}: ", report), f"expected a {kind} report:\n{report}"
    assert re.search(first, report) and re.search(second, report), f"report does not name both call sites:\n{report}"
    assert len(re.findall(r"cta \d+ thread \d+", report)) >= 2, f"report does not name both threads:\n{report}"


@pytest.mark.parametrize("name", CORRECT)
def test_correct_pattern_is_silent(name):
    for seed in SEEDS:
        run_mode(name, seed)


@pytest.mark.parametrize("name", sorted(BUGS))
def test_planted_pattern_is_reported_with_both_sites(name):
    kind, first, second = BUGS[name]
    reported = 0
    for seed in SEEDS:
        try:
            read = run_mode(name, seed)
        except SimulationError as e:
            print(f"{name} (seed {seed}):\n{e}")
            assert_reported(str(e), kind, first, second)
            reported += 1
        else:  # only the flag pattern's reader may not run into the bug: then it read nothing
            assert not read, f"{name} went unreported with seed {seed}"
    assert reported >= 2, f"{name}: only {reported} of {len(SEEDS)} seeds ran the racing read"


# ---------------------------------------------------------------- programmatic dependent launch (pdl.cu)
class PdlParams(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("trigger", ctypes.c_uint32), ("buffer", ctypes.c_void_p),
                ("other", ctypes.c_void_p), ("out", ctypes.c_void_p)]


PDL_MODES = {"wait_then_read": 0, "read_before_wait": 1, "write_before_wait": 2, "no_wait": 3,
             "unrelated_before_wait": 4}
TRIGGERS = {"trigger_first": 0, "trigger_between_writes": 1, "no_trigger": 2}
P = "pdl"
PRIMARY_WRITES = rf"(?:{site(P, 'p.buffer[i] = float(i);')}|{site(P, 'p.buffer[i] += 1.f;')})"
PDL_BUGS = {  # name: report pattern, the dependent's call site
    "read_before_wait": (r"\bpdl: ", site(P, "p.out[i] = p.buffer[i];", 1)),
    "write_before_wait": (r"\bpdl: ", site(P, "p.buffer[i] = 0.f;")),
    "no_wait": (r"\bpdl: cta \d+ of kernel 1, a programmatic dependent launch, exits without any of its threads "
                r"executing griddepcontrol\.wait", None),
}


def run_pdl(mode: str, trigger: str, seed: int, programmatic: bool = True) -> torch.Tensor:
    name, src = sim_kernels.source("pdl")
    buffer, other, out = torch.zeros(256), torch.zeros(256), torch.full((256,), -1.0)
    params = bytes(PdlParams(PDL_MODES[mode], TRIGGERS[trigger], buffer.data_ptr(), other.data_ptr(), out.data_ptr()))
    launch_stream(src, [StreamLaunch(f"{name}_primary", params, grid=2, block=128),
                        StreamLaunch(f"{name}_dependent", params, grid=2, block=128, programmatic=programmatic)],
                  seed=seed)
    return out


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
@pytest.mark.parametrize("mode", ["wait_then_read", "unrelated_before_wait"])
def test_pdl_correct_wait_is_silent(mode, trigger):
    for seed in SEEDS:
        out = run_pdl(mode, trigger, seed)
        assert torch.equal(out, torch.arange(256, dtype=torch.float32) + 1), "the dependent read before the primary ended"


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
@pytest.mark.parametrize("mode", sorted(PDL_BUGS))
def test_pdl_planted_bug_is_reported(mode, trigger):
    pattern, dependent_site = PDL_BUGS[mode]
    for seed in SEEDS:
        with pytest.raises(SimulationError) as e:
            run_pdl(mode, trigger, seed)
        report = str(e.value)
        print(f"{mode} / {trigger} (seed {seed}):\n{report}")
        assert re.search(pattern, report), report
        if dependent_site:  # both call sites: the dependent's access and the primary's
            assert re.search(dependent_site, report) and re.search(PRIMARY_WRITES, report), report
            assert re.search(r"kernel 0 cta \d+ thread \d+", report) and re.search(r"kernel 1 cta \d+ thread \d+", report)


def test_without_pdl_stream_order_needs_no_wait():
    """The same kernels, the dependent launched plainly: it starts after the primary ended, so reading first is fine."""
    for seed in SEEDS:
        out = run_pdl("read_before_wait", "trigger_first", seed, programmatic=False)
        assert torch.equal(out, torch.arange(256, dtype=torch.float32) + 1)
        run_pdl("no_wait", "trigger_first", seed, programmatic=False)


# ---------------------------------------------------------------- the real kernels: no report (no false positives)
# The detector is on in every simulated launch, so every simulator test of the real kernels is part of this sweep:
# seed 0 everywhere; adversarial seeds 1-6 on the dense configs where cross-CTA and producer / consumer ordering
# matters (1 and 2 math warpgroups, multicast of A and of B), contiguous, masked and the quantisers
# (test_sim_schedules.py); 1-3 on k-grouped; 1-2 on cast-transpose; 11 and 12345 on split-K. Here: adversarial
# seeds for the families that had none (1D1D, split-K across CTAs), and with DFG_SIM_RACES=full every family on 16
# seeds plus larger shapes (on request: ~30 minutes on two cores).
from deep_fp8_gemm import calc_diff, env, get_col_major_tma_aligned_tensor, reference  # noqa: E402
from deep_fp8_gemm.config import GemmConfig, check_config  # noqa: E402
from deep_fp8_gemm.kernels import gemm, split_k  # noqa: E402

from tests.kernels import test_sim_schedules  # noqa: E402
from tests.kernels.test_sim_1d1d import CASES as CASES_1D1D, _operands as operands_1d1d, model64 as model64_1d1d  # noqa: E402
from tests.kernels.test_sim_gemm import make_config, quantised_operands, run_sim  # noqa: E402
from tests.kernels.test_sim_split_k import CASES as CASES_SPLIT_K, assert_close_to_float64, run_case, split_config  # noqa: E402

FULL = env.sim_races() == "full"
SWEEP_SEEDS = list(range(1, 17)) if FULL else [1, 2, 3]


def sweep_1d1d(name, monkeypatch):
    m, n, k, block_m, block_n, stages, grid = CASES_1D1D[name]
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=block_m, block_n=block_n,
                     num_stages=stages, cluster_m=1, cluster_n=1, band_width=16, grid_size=grid)
    check_config(cfg)
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    a, sa, b, sb, c = operands_1d1d(m, n, k, seed=3)
    expected = model64_1d1d(a, sa, b, sb, c)
    for seed in SWEEP_SEEDS:
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        d = c.clone()  # C in place
        gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d, d,
                         "sim")
        scale = abs(expected - c.double().numpy()).max() + 1.0
        assert abs(d.double().numpy() - expected).max() <= 1e-5 * scale * max(1, k // 128), f"seed {seed}"


def sweep_split_k(name, monkeypatch):
    m, n, k, bm, bn, splits, grid, stages = CASES_SPLIT_K[name]
    cfg = split_config(n, k, bm, bn, splits, grid, stages)
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    for seed in SWEEP_SEEDS:
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        split_k.clear()
        d, exact, counters = run_case(cfg, m, seed=seed)
        assert_close_to_float64(d, exact)
        assert not counters.any()


def sweep_dense(args, monkeypatch):
    m, n, k, bm, bn, cluster, stages, grid = args
    cfg = make_config("dense", n, k, bm, bn, cluster=cluster, stages=stages, grid=grid)
    a, sa, b, sb = quantised_operands((m,), n, k, seed=5)
    ref = torch.empty((m, n), dtype=torch.bfloat16)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    for seed in SWEEP_SEEDS:
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
        run_sim(cfg, a, sa, b, sb, d)
        assert calc_diff(d, ref) < 1e-3, f"seed {seed}"


def sweep_schedules_suite(monkeypatch):
    """test_sim_schedules.py's dense, grouped and quantiser cases on the sweep's seeds."""
    monkeypatch.setattr(test_sim_schedules, "SEEDS", SWEEP_SEEDS)
    for case in sorted(test_sim_schedules.DENSE):
        test_sim_schedules.test_dense_gemm_under_adversarial_schedules(case, monkeypatch)
    test_sim_schedules.test_grouped_gemms_under_adversarial_schedules(monkeypatch)
    test_sim_schedules.test_quantisers_under_adversarial_schedules()


SWEEP = {
    "1d1d_two_warpgroups": lambda mp: sweep_1d1d("bm128_two_warpgroups_odd_n", mp),
    "split_k_two_warpgroups_across_ctas": lambda mp: sweep_split_k("split4_two_warpgroups_m_and_n_tail", mp),
}
FULL_SWEEP = {
    "1d1d_each_case": lambda mp: [sweep_1d1d(name, mp) for name in sorted(CASES_1D1D)],
    "split_k_each_case": lambda mp: [sweep_split_k(name, mp) for name in sorted(CASES_SPLIT_K)],
    "schedules_suite": sweep_schedules_suite,
    # larger shapes: more tiles per CTA, more K blocks through the ring, multicast with two math warpgroups
    "dense_large_2wg_multicast": lambda mp: sweep_dense((384, 512, 1024, 128, 128, (1, 2), 4, 4), mp),
    "dense_large_1wg_multicast_b": lambda mp: sweep_dense((320, 384, 768, 64, 96, (2, 1), 3, 4), mp),
    "split_k_large": lambda mp: sweep_split_k_large(mp),
}


def sweep_split_k_large(monkeypatch):
    cfg = split_config(256, 1792, 128, 64, 7, 6, 3)
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    for seed in SWEEP_SEEDS:
        monkeypatch.setenv("DFG_SIM_SEED", str(seed))
        split_k.clear()
        d, exact, counters = run_case(cfg, 130, seed=seed)
        assert_close_to_float64(d, exact)
        assert not counters.any()


@pytest.mark.parametrize("family", sorted(SWEEP) + (sorted(FULL_SWEEP) if FULL else []))
def test_real_kernels_are_free_of_reports(family, monkeypatch):
    (SWEEP | FULL_SWEEP)[family](monkeypatch)
