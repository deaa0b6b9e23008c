"""The watchdog build (DFG_WATCHDOG_SECONDS): a separate binary whose mbarrier waits trap after N seconds with a
message; without the variable the kernels are the plain build, bit for bit. Compiling needs NVRTC, no GPU.

The GPU behaviour (a hang becomes a trap with the message) can only be seen on a device: bench/device_check.sh
runs its smoke step under the watchdog. Here: what the binaries contain, the cache keys, the environment
variable, and that the simulator's deadlock report names barriers as the watchdog's message does.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from deep_fp8_gemm import env
from deep_fp8_gemm.config import GemmConfig, check_config
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.runtime import cache, paths
from deep_fp8_gemm.runtime.compiler import compile_kernel, watchdog_options

from tests._mutate import mutated_headers

KERNEL_DIR = Path(__file__).resolve().parents[1] / "gpu_kernels"
# Small, quick to compile: one math warpgroup, 4 K blocks.
CFG = GemmConfig(kind="dense", shape_n=256, shape_k=512, num_groups=1, block_m=64, block_n=64, num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=2)
CLUSTER_CFG = GemmConfig(kind="dense", shape_n=256, shape_k=512, num_groups=1, block_m=128, block_n=64, num_stages=3, cluster_m=2, cluster_n=1, band_width=16, grid_size=2)  # B multicast: remote arrivals
MBAR_WAIT_FORMAT = re.search(r'#define DFG_MBAR_WAIT_FORMAT "([^"]+)"',
                             (paths.include_dir() / "deep_fp8_gemm" / "common.cuh").read_text()).group(1)


@pytest.fixture
def jit(tmp_path, monkeypatch):
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(tmp_path / "jit-cache"))
    monkeypatch.delenv("DFG_JIT_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("DFG_WATCHDOG_SECONDS", raising=False)
    cache.clear_memory_cache()
    yield monkeypatch
    cache.clear_memory_cache()


def _sources():
    quant = kq.render_source(kq.QuantKernelConfig(kq.QuantKind.PER_TOKEN, kq.InputType.BF16, True))
    return {
        "gemm": (CFG.kernel_name(), gemm.render_source(CFG)),
        "gemm_cluster": (CLUSTER_CFG.kernel_name(), gemm.render_source(CLUSTER_CFG)),
        "quant": quant,
        "tma_roundtrip": ("dfg_test_tma_roundtrip", (KERNEL_DIR / "tma_roundtrip.cu").read_text()),
    }


def _sass(cubin: bytes) -> str:
    from deep_fp8_gemm.runtime.sass import disassemble

    try:
        return disassemble(cubin)
    except RuntimeError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")


def test_watchdog_seconds_parsing(monkeypatch):
    for value, ns in (("", 0), ("0", 0), ("5", 5_000_000_000), ("0.25", 250_000_000), (" 2 ", 2_000_000_000)):
        monkeypatch.setenv("DFG_WATCHDOG_SECONDS", value)
        assert env.watchdog_ns() == ns, value
        assert watchdog_options() == ((f"-DDFG_WATCHDOG_NS={ns}ull",) if ns else ())
    for bad in ("five", "-1", "nan"):
        monkeypatch.setenv("DFG_WATCHDOG_SECONDS", bad)
        with pytest.raises(ValueError, match="DFG_WATCHDOG_SECONDS"):
            env.watchdog_ns()
    monkeypatch.delenv("DFG_WATCHDOG_SECONDS")
    assert env.watchdog_ns() == 0 and watchdog_options() == ()


def test_plain_build_has_no_watchdog_code(jit):
    """Unset and explicitly off (-DDFG_WATCHDOG_NS=0) give the same cubins, without a timer read or a printf
    (the plain SASS was also compared with the build of the hal before the watchdog existed: identical)."""
    for family, (name, source) in _sources().items():
        plain = compile_kernel(name, source)
        off = compile_kernel(name, source, options=("-DDFG_WATCHDOG_NS=0",))
        assert off.cubin == plain.cubin, f"{family}: explicit off differs from the plain build"
        assert b"vprintf" not in plain.cubin and b"watchdog" not in plain.cubin, family
        assert "GLOBALTIMER" not in _sass(plain.cubin), family


def test_watchdog_build_is_a_separate_binary_with_bounded_waits(jit):
    plain = {family: compile_kernel(name, source) for family, (name, source) in _sources().items()}
    jit.setenv("DFG_WATCHDOG_SECONDS", "5")
    for family, (name, source) in _sources().items():
        kernel = compile_kernel(name, source)
        assert kernel.cache_hit == "" and kernel.key != plain[family].key, f"{family}: same cache entry as plain"
        assert kernel.cubin != plain[family].cubin
        assert kernel.resources.spill_bytes == 0, f"{family}: spills in the watchdog build"
        assert name.encode() in kernel.cubin, f"{family}: the message cannot name the kernel"
        sass = _sass(kernel.cubin)
        # Every mbarrier wait polls the timer (ptxas may duplicate a wait loop when it unrolls the K loop); the
        # quantiser has no wait (its only synchronisation is bar.sync, a hardware barrier): no timer.
        timers = sass.count("GLOBALTIMER")
        waits = family != "quant"
        assert (timers > 0) == waits, f"{family}: {timers} %globaltimer reads"
        if waits:
            assert b"deep_fp8_gemm watchdog: kernel %s block %u thread %u waited more than %llu ns in " + \
                MBAR_WAIT_FORMAT.encode() in kernel.cubin, family
            assert "vprintf" in sass and "BPT.TRAP" in sass, family
    # Unsetting the variable goes back to the plain entries.
    jit.delenv("DFG_WATCHDOG_SECONDS")
    name, source = _sources()["gemm"]
    assert compile_kernel(name, source).cubin == plain["gemm"].cubin


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
def test_simulator_deadlock_names_barriers_like_the_watchdog(tmp_path, monkeypatch):
    """A planted arrive-count bug deadlocks the simulated GEMM; the report names the barrier in the watchdog's
    format (role[stage] @smem+offset, parity)."""
    from deep_fp8_gemm.simulator import SimulationError

    from tests.kernels.test_sim_gemm import quantised_operands, run_sim

    # The producer's arrive.expect_tx + its cp.async arrive of sB (the 1D1D kind TMA-loads sB: one arrive).
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh", "hal::mbar_init(&full[s], kRowScaledB ? 1 : kBlock32 ? 1 + B32::kScaleWarps : 2);",
                    "hal::mbar_init(&full[s], kRowScaledB ? 1 : kBlock32 ? 1 + B32::kScaleWarps : 3);")
    cfg = GemmConfig(kind="dense", shape_n=128, shape_k=512, num_groups=1, block_m=64, block_n=64, num_stages=2, cluster_m=1, cluster_n=1, band_width=16, grid_size=1)
    check_config(cfg)
    a, sa, b, sb = quantised_operands((64,), 128, 512, seed=1)
    with pytest.raises(SimulationError) as info:
        run_sim(cfg, a, sa, b, sb, torch.empty(64, 128, dtype=torch.bfloat16))
    report = str(info.value)
    pattern = re.escape(MBAR_WAIT_FORMAT).replace("%s", "(full|empty)").replace("%u", r"\d+").replace(
        "%\\#x", "0x[0-9a-f]+")
    # Math warps wait for full[0] (its phase never completes); the producer for empty[0] of the ring's 2nd pass.
    assert re.search(r"threads 0-127 \(warps 0-3\): " + pattern.replace("(full|empty)", "full", 1), report), report
    assert re.search(r"mbar_wait\(full\[0\] @smem\+0x[0-9a-f]+, parity 0\)", report), report
    assert re.search(r"thread 128 \(warp 4\): mbar_wait\(empty\[\d\] @smem\+0x[0-9a-f]+, parity \d\)", report), report
