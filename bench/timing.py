"""The one timing method of the benchmarks (tests never time anything).

Per measured callable:
1. **Correct first.** The caller checks one result against the reference (``check``: ``calc_diff < 1e-3``,
   output poisoned with NaN beforehand so unwritten elements fail) before anything is timed.
2. **Warm-up**: one untimed call (JIT compile, module load, tensor-map encode, cuBLAS heuristics), a
   synchronize, then ``warmup`` more untimed calls.
3. **Timed runs**: ``runs`` (>= 20) calls, each preceded by an L2 flush and timed alone with a pair of CUDA
   events recorded on the current stream right around the call (the flush is outside the pair).
   - L2 flush: ``zero_()`` of a 256 MiB device buffer (> 4x the H200's 60 MB L2), so each call starts with
     its operands in HBM, as a layer does in a real model.
   - Input rotation: the call cycles over ``len(arg_sets)`` independent copies of its operands and outputs
     (distinct allocations), so even without the flush no call finds the previous call's data in cache.
4. **Statistic**: the median over the runs (min, p20, p80 and the relative spread are kept too).

Cross-check for short kernels (``kernel_time_us``): CUDA events include the GPU's launch latency between
the start event and the kernel (~1-3 µs), which matters for 3-20 µs decode-size calls. There the same
flushed loop also runs under ``torch.profiler`` (CUPTI activity records), and the median per call of the
summed device-kernel durations (every kernel between two flushes) is reported beside the event time.

Host overhead (``host_overhead``): ``n`` back-to-back calls without flushes or syncs; reports host time per
call (the loop's wall time before the final synchronize), wall time per call including the drain, and
GPU time per call from events around the whole loop. When host time per call exceeds the kernel's
isolated GPU time, small calls are launch-bound.

On a CPU device (``--device cpu`` smoke runs of the pipeline) wall-clock timers replace events and the
flush is a small memset: those numbers test the code path, they are not benchmarks.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

L2_FLUSH_BYTES = 256 << 20
MIN_RUNS = 20
CHECK_THRESHOLD = 1e-3

METHOD_NOTE = (
    "median of >= 20 runs, each timed alone with CUDA events after an L2 flush (zero_() of a 256 MiB buffer, "
    "> 4x the 60 MB L2) with inputs rotated over independent copies; one untimed call (JIT) + warm-up first; "
    "every implementation's output checked against a float64 reference of the same dequantised operands "
    "(calc_diff < 1e-3, output NaN-poisoned first) before timing; short calls (< 100 µs, < 30 µs with --quick) "
    "also timed from the profiler's CUPTI kernel records, since events add ~1-3 µs of launch latency; "
    "FLOPs = 2mnk over valid rows; bytes = A + B + scales + D once each"
)


@dataclasses.dataclass(frozen=True)
class Stats:
    """Run times of one callable, in microseconds."""

    median_us: float
    min_us: float
    p20_us: float
    p80_us: float
    runs: int

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the run-to-run noise a difference must exceed to mean anything."""
        return (self.p80_us - self.p20_us) / self.median_us if self.median_us > 0 else math.nan

    def as_dict(self) -> dict:
        return {"us": self.median_us, "us_min": self.min_us, "us_p20": self.p20_us, "us_p80": self.p80_us,
                "runs": self.runs, "spread": self.spread}


def summarize(samples_us: Sequence[float]) -> Stats:
    """Median, min and the 20th / 80th percentiles (nearest rank) of ``samples_us``."""
    if not samples_us:
        raise ValueError("summarize needs at least one sample")
    ordered = sorted(samples_us)
    last = len(ordered) - 1

    def pct(p: float) -> float:
        return ordered[min(last, max(0, round(p * last)))]

    return Stats(statistics.median(ordered), ordered[0], pct(0.2), pct(0.8), len(ordered))


class L2Flusher:
    """Evicts the L2 by writing ``nbytes`` of device memory (``zero_()`` of an int32 buffer)."""

    def __init__(self, device: torch.device | str, nbytes: int = L2_FLUSH_BYTES):
        device = torch.device(device)
        if device.type != "cuda":
            nbytes = min(nbytes, 1 << 20)  # CPU smoke runs: keep it cheap
        self.nbytes = nbytes
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[..., object],
    arg_sets: Sequence[tuple],
    *,
    device: torch.device | str,
    flusher: L2Flusher | None,
    runs: int = MIN_RUNS,
    warmup: int = 5,
) -> Stats:
    """Times ``fn(*arg_sets[i % len(arg_sets)])`` as described in the module docstring.

    ``arg_sets`` are independent copies of the operands (rotation); ``flusher`` None disables the flush
    (only for diagnostics: the reported numbers always flush).
    """
    device = torch.device(device)
    if runs < MIN_RUNS:
        raise ValueError(f"runs must be >= {MIN_RUNS}, got {runs}")
    if not arg_sets:
        raise ValueError("arg_sets must hold at least one set of arguments")
    fn(*arg_sets[0])  # JIT compile / module load / heuristics: never timed
    _sync(device)
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    _sync(device)

    samples: list[float] = []
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for i in range(runs):
            if flusher is not None:
                flusher()
            starts[i].record()
            fn(*arg_sets[i % len(arg_sets)])
            ends[i].record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    else:
        for i in range(runs):
            if flusher is not None:
                flusher()
            t0 = time.perf_counter()
            fn(*arg_sets[i % len(arg_sets)])
            samples.append((time.perf_counter() - t0) * 1e6)
    return summarize(samples)


def host_overhead(fn: Callable[..., object], args: tuple, *, device: torch.device | str, calls: int = 200) -> dict:
    """Per-call host and GPU time of ``calls`` back-to-back calls of ``fn(*args)`` (after warm-up).

    Returns ``host_us`` (enqueue time per call, measured before the final synchronize), ``wall_us`` (per
    call, including the drain) and ``gpu_us`` (events around the whole loop, per call; on CPU = wall_us).
    """
    device = torch.device(device)
    for _ in range(10):
        fn(*args)
    _sync(device)
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    t1 = time.perf_counter()
    if device.type == "cuda":
        end.record()
    _sync(device)
    t2 = time.perf_counter()
    wall_us = (t2 - t0) * 1e6 / calls
    gpu_us = begin.elapsed_time(end) * 1e3 / calls if device.type == "cuda" else wall_us
    return {"calls": calls, "host_us": (t1 - t0) * 1e6 / calls, "wall_us": wall_us, "gpu_us": gpu_us}


def split_per_call(kernels: Sequence[tuple[str, float, float]], flush_names: set[str]) -> list[float]:
    """Per-call device time from ``(name, start_us, duration_us)`` kernel records of a flushed loop: the
    durations of the kernels between one flush and the next are summed (the flush's own kernels, recognised
    by name, are left out). Records before the first flush are ignored."""
    per_call: list[float] = []
    current: float | None = None
    for name, _, duration in sorted(kernels, key=lambda k: k[1]):
        if name in flush_names:
            if current is not None:
                per_call.append(current)
            current = 0.0
        elif current is not None:
            current += duration
    if current is not None:
        per_call.append(current)
    return per_call


def _device_kernels(prof) -> list[tuple[str, float, float]]:
    from torch.autograd import DeviceType

    return [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
            if e.device_type == DeviceType.CUDA]


def kernel_time_us(fn: Callable[..., object], arg_sets: Sequence[tuple], *, flusher: L2Flusher,
                   runs: int = MIN_RUNS) -> float | None:
    """Median per-call device-kernel time (µs) of the flushed, rotated loop, from the profiler's CUPTI records;
    None when the profiler gives no usable records (then only the event times stand)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flusher()
        torch.cuda.synchronize()
    flush_names = {name for name, _, _ in _device_kernels(prof)}
    if not flush_names:
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            flusher()
            fn(*arg_sets[i % len(arg_sets)])
        torch.cuda.synchronize()
    per_call = split_per_call(_device_kernels(prof), flush_names)
    if len(per_call) != runs or min(per_call) <= 0:
        return None
    return statistics.median(per_call)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``deep_fp8_gemm.calc_diff`` (``1 - 2Σxy / Σ(x²+y²)`` in float64); imported lazily so that this module
    imports without the library."""
    from deep_fp8_gemm import calc_diff as library_calc_diff

    return library_calc_diff(x, y)


def check(out: torch.Tensor, ref: torch.Tensor, threshold: float = CHECK_THRESHOLD) -> tuple[bool, float]:
    """``(ok, diff)``: ``diff = calc_diff(out, ref)``; ``ok`` only when finite and below ``threshold``
    (NaN from an unwritten, poisoned element fails)."""
    diff = calc_diff(out, ref)
    return (math.isfinite(diff) and diff < threshold), diff
