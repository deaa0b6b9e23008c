"""The benchmark loop shared by the dense and grouped entry points: per shape, build every implementation,
check it against the reference, time it (``bench.timing``), and write results as they come (a run killed by
its time limit still leaves every finished shape on disk)."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from . import report, timing
from .baselines import Impl, Unsupported
from .shapes import Shape, h800_published, shape_to_dict

OURS = report.OURS
# Event times of calls shorter than this (--quick: the second number) are cross-checked with the profiler's
# kernel durations, for deep_fp8_gemm and block-scaled cuBLAS.
PROFILE_BELOW_US = (100.0, 30.0)
PROFILED = (OURS, "cublas_block")
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

# A case builder: shape, device, rotation copies -> [(implementation name, thunk building its Impl)].
Builder = Callable[[Shape, torch.device, int], list[tuple[str, Callable[[], Impl]]]]


def common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="fewer shapes, 20 runs, <= 4 rotation copies (the device check's mode)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (default bench/results)")
    parser.add_argument("--device", default="cuda",
                        help="cuda (default) or cpu: a CPU smoke run of the pipeline, not a benchmark")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per implementation (>= 20)")
    parser.add_argument("--time-budget", type=float, default=None, metavar="S",
                        help="start no new shape after S seconds; the rest are reported as skipped")
    parser.add_argument("--no-baselines", action="store_true", help="time deep_fp8_gemm only")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (JSON and Markdown only)")
    parser.add_argument("--no-profiler", action="store_true",
                        help="skip the profiler (CUPTI) kernel-time cross-check of calls under "
                             f"{PROFILE_BELOW_US[0]:.0f} µs ({PROFILE_BELOW_US[1]:.0f} with --quick)")


def measure(impl: Impl, *, device: torch.device, flusher: timing.L2Flusher, runs: int, warmup: int,
            profile_below_us: float = 0.0) -> dict:
    """Check ``impl`` once against its reference, then time it; calls faster than ``profile_below_us`` are
    cross-checked with the profiler's kernel times (``us_kernel``). Status: ok | wrong | error."""
    rec: dict = {"status": "error", "note": impl.note}
    try:
        args = impl.arg_sets[0]
        if impl.poison is not None:
            impl.poison(args)
        ok, diff = timing.check(impl.valid(impl.fn(*args)), impl.reference,
                                impl.threshold if impl.threshold is not None else timing.CHECK_THRESHOLD)
        rec["diff"] = diff
        if not ok:
            rec["status"] = "wrong"
            return rec
        rec.update(timing.time_call(impl.fn, impl.arg_sets, device=device, flusher=flusher,
                                    runs=runs, warmup=warmup).as_dict())
        rec["status"] = "ok"
        if device.type == "cuda" and rec["us"] < profile_below_us:
            try:
                rec["us_kernel"] = timing.kernel_time_us(impl.fn, impl.arg_sets, flusher=flusher)
            except Exception as exc:  # noqa: BLE001 - the cross-check is optional
                rec["us_kernel_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    return rec


def _rates(rec: dict, shape: Shape) -> None:
    if rec.get("status") == "ok" and rec.get("us"):
        rec["tflops"] = shape.flops() / rec["us"] / 1e6
        rec["gbs"] = shape.bytes() / rec["us"] / 1e3


def run_family(family: str, shapes: Sequence[Shape], build: Builder, args: argparse.Namespace,
               extra: Callable[[torch.device], dict] | None = None) -> int:
    """Runs every shape, writes ``<out>/<family>.{json,md,png}``, prints a table. Exit status: 0 when every
    shape's deep_fp8_gemm result was checked correct, 1 otherwise."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{family}: no CUDA device visible to torch; nothing measured (use --device cpu for a smoke run)",
              file=sys.stderr)
        return 2
    runs = max(timing.MIN_RUNS, args.runs or (timing.MIN_RUNS if args.quick else 50))
    warmup = 3 if args.quick else 10
    env = report.collect_env(device)
    env["quick"] = bool(args.quick)
    flusher = timing.L2Flusher(device)
    rows: list[dict] = []
    start = time.perf_counter()
    print(f"{family}: {len(shapes)} shapes on {env.get('gpu', device)}; {runs} timed runs each", flush=True)
    for shape in shapes:
        row = {"shape": shape_to_dict(shape), "label": shape.label, "flops": shape.flops(), "bytes": shape.bytes(),
               "h800_published_tflops": h800_published(shape), "impls": {}}
        rows.append(row)
        elapsed = time.perf_counter() - start
        if args.time_budget is not None and elapsed > args.time_budget:
            row["impls"][OURS] = {"status": "skipped", "note": f"time budget {args.time_budget:.0f} s spent"}
            continue
        n_copies = _rotation(shape, args.quick)
        row["rotation_copies"] = n_copies
        try:
            thunks = build(shape, device, n_copies)
        except Exception as exc:  # noqa: BLE001 - input construction failed: record it, go on
            row["impls"][OURS] = {"status": "error", "error": f"building inputs: {type(exc).__name__}: {exc}"}
            thunks = []
        for name, thunk in thunks:
            if args.no_baselines and name != OURS:
                continue
            try:
                impl = thunk()
            except Unsupported as exc:
                row["impls"][name] = {"status": "n/a", "note": str(exc)}
                continue
            except Exception as exc:  # noqa: BLE001
                row["impls"][name] = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                continue
            profile_below = 0.0 if args.no_profiler or name not in PROFILED else PROFILE_BELOW_US[bool(args.quick)]
            rec = measure(impl, device=device, flusher=flusher, runs=runs, warmup=warmup,
                          profile_below_us=profile_below)
            _rates(rec, shape)
            row["impls"][name] = rec
            del impl
        del thunks
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(report.console_line(row), flush=True)
        report.write_family(family, rows, env, args.out, extra=None, plot=False)
    extra_data = {}
    if extra is not None:
        try:
            extra_data = extra(device)
        except Exception as exc:  # noqa: BLE001
            extra_data = {"error": f"{type(exc).__name__}: {exc}"}
    paths = report.write_family(family, rows, env, args.out, extra=extra_data, plot=not args.no_plot)
    print()
    print(report.markdown_table(rows))
    print("\n".join("- " + line.replace("**", "") for line in report.headline(rows)))
    if extra_data:
        print(report.extra_markdown(extra_data))
    print(f"\nwritten: {', '.join(str(p) for p in paths)}  ({time.perf_counter() - start:.0f} s)")
    ok = all(r["impls"].get(OURS, {}).get("status") in ("ok", "skipped") for r in rows)
    return 0 if ok else 1


def _rotation(shape: Shape, quick: bool) -> int:
    from .baselines import rotation_count

    return rotation_count(shape.bytes(), quick)

