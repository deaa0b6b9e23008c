"""bench/bench_jit.py's compile breakdown: NVRTC's own trace split into front end / NVVM / ptxas (no GPU)."""

from __future__ import annotations

import pytest

from bench import bench_jit
from deep_fp8_gemm.runtime.compiler import nvrtc_version


@pytest.mark.skipif(nvrtc_version() < (12, 8), reason="--fdevice-time-trace needs NVRTC >= 12.8")
def test_compile_breakdown_splits_a_real_compile_into_its_phases():
    phases = bench_jit.compile_breakdown("probe")
    assert set(phases) == set(bench_jit.TRACE_PHASES) | {"traced_total_s"}
    # Every phase ran (the probe has wgmma, so ptxas has work), and they fit inside the timed NVRTC call.
    for key in bench_jit.TRACE_PHASES:
        assert phases[key] > 0, (key, phases)
    assert sum(phases[k] for k in bench_jit.TRACE_PHASES) <= phases["traced_total_s"] * 1.05, phases


def test_compile_breakdown_names_an_unknown_case():
    with pytest.raises(ValueError, match="no such kernel"):
        bench_jit.compile_breakdown("no such kernel")
