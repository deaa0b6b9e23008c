"""JIT latency: cold compile (fresh process, no disk cache), warm disk-cache hit, in-memory hit.

    python bench/bench_jit.py [--runs 5] [--json PATH] [--precompile] [--breakdown]

Kernels: the JIT test probe (tests/jit_kernels/wgmma_probe.cu) and, when deep_fp8_gemm.kernels.gemm
provides ``audit_targets``, one real dense, grouped-contiguous and grouped-masked GEMM (DeepSeek-V3
shapes). ``--precompile`` also times ``python -m deep_fp8_gemm precompile --kind dense`` (all
DeepSeek-V3 dense configs) into an empty cache. ``--breakdown`` also splits one compile of each kernel into
the compiler's phases (NVRTC's own trace). Targets (2-core CI machine, median): cold compile
<= 0.5 s per kernel (issue 13; grouped kernels had 0.8 s before), disk hit <= 2 ms, memory hit <= 5 us, dense
precompile < 60 s.
No GPU needed; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# (label, kind, shapes, ms): one representative config per GEMM family (first target of the list).
GEMM_CASES = (
    ("dense 128x7168x2048", "dense", [(7168, 2048)], [128]),
    ("contiguous 4x8192 x 4096x7168", "contiguous", [(4096, 7168)], None),
    ("masked 256 x 7168x2048", "masked", [(7168, 2048)], [256]),
)

_CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
from bench.bench_jit import make_target
target = make_target({case!r})
from deep_fp8_gemm.runtime.compiler import compile_kernel
start = time.perf_counter()
kernel = compile_kernel(target.name, target.source, options=target.options)
print(time.perf_counter() - start, kernel.compile_seconds, kernel.cache_hit or "compiled")
"""


def make_target(case: str):
    """The AuditTarget for a case label: ``"probe"`` or a label of :data:`GEMM_CASES`."""
    if case == "probe":
        from deep_fp8_gemm.runtime.audit import AuditTarget
        from tests.jit_kernels import probe_source

        return AuditTarget("probe", {}, "dfg_bench_probe", probe_source("dfg_bench_probe"))
    from deep_fp8_gemm.kernels.targets import audit_targets

    found = next((c for c in GEMM_CASES if c[0] == case), None)
    if found is None:
        raise ValueError(f"case must be 'probe' or one of {[c[0] for c in GEMM_CASES]}, got {case!r}")
    _, kind, shapes, ms = found
    return audit_targets(kind, shapes, ms, 132)[0]


def gemm_available() -> bool:
    try:
        from deep_fp8_gemm.kernels.targets import audit_targets  # noqa: F401
    except ImportError:
        return False
    return True


def cold_compile(case: str, runs: int) -> dict:
    """Median over ``runs`` fresh processes of the first compile_kernel call (disk cache disabled)."""
    env = dict(os.environ, DFG_JIT_DISABLE_CACHE="1", PYTHONPATH=str(REPO))
    calls, nvrtc = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO), case=case)], env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        calls.append(float(out[0]))
        nvrtc.append(float(out[1]))
    return {"call_s": statistics.median(calls), "nvrtc_s": statistics.median(nvrtc), "min_call_s": min(calls)}


def warm_hits(case: str, cache_dir: Path, disk_runs: int = 50, memory_runs: int = 20000) -> dict:
    """Median disk hit (memory cache cleared each time) and mean in-memory hit, in this process."""
    os.environ["DFG_JIT_CACHE_DIR"] = str(cache_dir)
    os.environ.pop("DFG_JIT_DISABLE_CACHE", None)
    from deep_fp8_gemm.runtime import cache
    from deep_fp8_gemm.runtime.compiler import compile_kernel

    target = make_target(case)
    compile_kernel(target.name, target.source, options=target.options)  # populate the disk cache
    disk = []
    for _ in range(disk_runs):
        cache.clear_memory_cache()
        start = time.perf_counter()
        kernel = compile_kernel(target.name, target.source, options=target.options)
        disk.append(time.perf_counter() - start)
        assert kernel.cache_hit == "disk" and kernel.cubin[:4] == b"\x7fELF"
    compile_kernel(target.name, target.source, options=target.options)
    start = time.perf_counter()
    for _ in range(memory_runs):
        compile_kernel(target.name, target.source, options=target.options)
    memory = (time.perf_counter() - start) / memory_runs
    return {"disk_hit_ms": statistics.median(disk) * 1e3, "memory_hit_us": memory * 1e6,
            "cubin_bytes": len(kernel.cubin), "registers": kernel.resources.registers}


# Top-level phases of NVRTC's trace (--fdevice-time-trace), in pipeline order.
TRACE_PHASES = {"front_end_s": "CUDA C++ Front-End", "nvvm_opt_s": "NVVM Optimizer", "nvvm_codegen_s": "NVVM CodeGen",
                "ptxas_s": "Total PTXAS Time"}


def compile_breakdown(case: str) -> dict:
    """Seconds of each compiler phase (:data:`TRACE_PHASES`) in one compile of ``case``, in this process.

    NOTES: read from NVRTC's own Chrome-format trace (``--fdevice-time-trace``, NVRTC >= 12.8; it writes
    ``<path>.json``). Measured so (issue 13): with the K loop unrolled over the stage ring, the front end was
    5-13 % of a GEMM compile and NVVM and ptxas about 45 % each, both growing by one loop copy per stage (hence
    the rolled K loop); now the front end is ~20 %, NVVM and ptxas ~40 % each.
    """
    from deep_fp8_gemm.runtime import compiler

    target = make_target(case)
    with tempfile.TemporaryDirectory(prefix="dfg_trace_") as tmp:
        options = list(target.options) + [f"--fdevice-time-trace={Path(tmp) / 'trace'}"]
        out = compiler._nvrtc_compile(target.name, target.source, compiler.nvrtc_options(options=options), False)
        if not out.cubin:
            raise RuntimeError(f"{case}: NVRTC failed ({out.status}):\n{out.log}")
        traces = sorted(Path(tmp).glob("*.json"))
        if not traces:
            raise RuntimeError(f"{case}: NVRTC wrote no trace (needs NVRTC >= 12.8)")
        data = json.loads(traces[0].read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    phases = {key: sum(e.get("dur", 0) for e in events if e.get("ph") == "X" and e.get("name") == name) / 1e6
              for key, name in TRACE_PHASES.items()}
    return {**phases, "traced_total_s": out.seconds}


def precompile_dense(cache_dir: Path) -> float:
    env = dict(os.environ, DFG_JIT_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    env.pop("DFG_JIT_DISABLE_CACHE", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "deep_fp8_gemm", "precompile", "--kind", "dense"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per cold-compile median")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--precompile", action="store_true", help="time precompile of all DeepSeek-V3 dense configs")
    parser.add_argument("--breakdown", action="store_true",
                        help="split one compile of each kernel into front end / NVVM / ptxas (NVRTC trace)")
    args = parser.parse_args(argv)

    cases = ["probe"] + ([c[0] for c in GEMM_CASES] if gemm_available() else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="dfg_bench_jit_") as tmp:
        for case in cases:
            row = {"kernel": case, **cold_compile(case, args.runs), **warm_hits(case, Path(tmp))}
            rows.append(row)
            print(f"done: {case}", file=sys.stderr)
        extra = {}
        if args.precompile and gemm_available():
            extra["precompile_dense_s"] = precompile_dense(Path(tmp) / "precompile")

    from deep_fp8_gemm.runtime.compiler import compiler_identity

    print(f"JIT latency ({compiler_identity()}, {os.cpu_count()} CPUs, median of {args.runs} fresh processes)\n")
    print("| kernel | cold compile call (s) | of which NVRTC (s) | disk hit (ms) | memory hit (µs) | cubin (KB) | regs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['call_s']:.3f} | {r['nvrtc_s']:.3f} | {r['disk_hit_ms']:.3f} | "
              f"{r['memory_hit_us']:.2f} | {r['cubin_bytes'] / 1024:.1f} | {r['registers']} |")
    if args.breakdown:
        extra["breakdown"] = {case: compile_breakdown(case) for case in cases}
        print("\n| kernel | front end (s) | NVVM optimiser (s) | NVVM codegen (s) | ptxas (s) |")
        print("|---|---|---|---|---|")
        for case, b in extra["breakdown"].items():
            print(f"| {case} | " + " | ".join(f"{b[k]:.3f}" for k in TRACE_PHASES) + " |")
    if "precompile_dense_s" in extra:
        print(f"\nprecompile --kind dense (all DeepSeek-V3 dense configs, empty cache): {extra['precompile_dense_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"compiler": compiler_identity(), "rows": rows, **extra}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
