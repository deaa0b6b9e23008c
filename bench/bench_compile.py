"""Cold compile of the DeepSeek-V3 dense set: this tree against a baseline tree, alternating.

    python -m bench.bench_compile --baseline /path/to/other/checkout [--repeats 3] [--m 4096|all] [--json PATH]

Each repeat compiles the set once per tree, in a fresh process per tree (``DFG_JIT_DISABLE_CACHE=1``: no disk
cache; a new process has no memory cache), the two trees' runs alternating and their order swapped each repeat so
that both see the same load of a shared machine. The set is what the audit lists (``kernels.targets.audit_targets
("dense", None, ms, 132)``, the same call in either tree): ``--m 4096`` (default: the issue-45 bar's set, 7
kernels) or ``--m all`` (the kind's M range 1..8192). A kernel's figure is the audit's ``compile_seconds``
(NVRTC's own time, ``CompiledKernel.compile_seconds``: no Python start-up or rendering); per tree the report gives
the median over kernels of each kernel's median over repeats, the median over names both trees compile, and the
ratio. Prints the 1-minute load average before and after every run (this tool does not make the machine quiet).
The baseline is only imported from (``PYTHONPATH`` = its root, run from its root), never written.

Nothing here is a test; the issue-45 bar is median <= 0.30 s and <= 1.15x a baseline built from 97bb652.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, time
from deep_fp8_gemm.kernels.targets import audit_targets
from deep_fp8_gemm.runtime.compiler import compile_kernel, compiler_identity
ms = {ms!r}
seconds = {{}}
start = time.perf_counter()
for target in audit_targets("dense", None, ms, 132):
    kernel = compile_kernel(target.name, target.source, options=target.options)
    seconds[target.name] = kernel.compile_seconds
print(json.dumps({{"seconds": seconds, "wall_s": time.perf_counter() - start, "compiler": compiler_identity()}}))
"""


def run_tree(tree: Path, ms: list[int] | None) -> dict:
    """Compile the dense set in a fresh process rooted at ``tree``; ``{"seconds": {name: s}, "wall_s", ...}``."""
    env = dict(os.environ, DFG_JIT_DISABLE_CACHE="1", PYTHONPATH=str(tree))
    load_before = os.getloadavg()[0]
    run = subprocess.run([sys.executable, "-c", _CHILD.format(ms=ms)], cwd=str(tree), env=env, capture_output=True,
                         text=True)
    if run.returncode != 0:
        raise RuntimeError(f"compiling the dense set in {tree} failed:\n{run.stderr[-4000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["load"] = (load_before, os.getloadavg()[0])
    return result


def summarise(runs: list[dict]) -> dict:
    """Per kernel the median over ``runs``; the median over kernels."""
    names = sorted(runs[0]["seconds"])
    per_kernel = {n: statistics.median(r["seconds"][n] for r in runs) for n in names}
    return {"per_kernel": per_kernel, "median_s": statistics.median(per_kernel.values()), "kernels": len(names)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, type=Path, help="root of the baseline checkout (read only)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats (default 3)")
    parser.add_argument("--m", default="4096", help="'4096' (default), a comma-separated M list, or 'all'")
    parser.add_argument("--json", metavar="PATH", help="also write the runs and the summary as JSON")
    args = parser.parse_args(argv)
    ms = None if args.m == "all" else [int(m) for m in args.m.split(",")]
    trees = {"baseline": args.baseline.resolve(), "new": REPO}
    runs: dict[str, list[dict]] = {"baseline": [], "new": []}
    for rep in range(args.repeats):
        order = ("baseline", "new") if rep % 2 == 0 else ("new", "baseline")
        for label in order:
            result = run_tree(trees[label], ms)
            runs[label].append(result)
            print(f"repeat {rep + 1} {label:<8} median {statistics.median(result['seconds'].values()):.3f} s over "
                  f"{len(result['seconds'])} kernels, wall {result['wall_s']:.1f} s, load {result['load'][0]:.2f} -> "
                  f"{result['load'][1]:.2f}", file=sys.stderr)
    summary = {label: summarise(r) for label, r in runs.items()}
    common = sorted(set(summary["baseline"]["per_kernel"]) & set(summary["new"]["per_kernel"]))
    base_common = statistics.median(summary["baseline"]["per_kernel"][n] for n in common) if common else None
    new_common = statistics.median(summary["new"]["per_kernel"][n] for n in common) if common else None
    ratio = summary["new"]["median_s"] / summary["baseline"]["median_s"]
    print(f"compiler: {runs['new'][0]['compiler']}; {os.cpu_count()} CPUs; {args.repeats} alternating repeats; "
          f"M = {args.m}")
    print(f"baseline ({trees['baseline']}): median {summary['baseline']['median_s']:.3f} s per kernel "
          f"({summary['baseline']['kernels']} kernels)")
    print(f"new      ({trees['new']}): median {summary['new']['median_s']:.3f} s per kernel "
          f"({summary['new']['kernels']} kernels)")
    print(f"ratio new / baseline: {ratio:.3f}")
    if common:
        print(f"on the {len(common)} kernel names both compile: {new_common:.3f} / {base_common:.3f} s = "
              f"{new_common / base_common:.3f}")
    loads = [r["load"] for rs in runs.values() for r in rs]
    print(f"1-minute load average during the runs: {min(min(l) for l in loads):.2f} .. {max(max(l) for l in loads):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary, "ratio": ratio, "m": args.m},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
