"""CUDA benchmark helpers with the reference's signatures (they need a CUDA device)."""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

import torch


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"deep_gemm.testing.{what} times CUDA kernels and needs a CUDA device")


def bench(fn, num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Seconds per call of ``fn`` (CUDA events around ``num_tests`` calls after ``num_warmups``, L2 flushed
    first; ``high_precision`` runs a large matmul before timing to hide launch overhead)."""
    _require_cuda("bench")
    torch.cuda.synchronize()
    torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda").zero_()
    for _ in range(num_warmups):
        fn()
    if high_precision:
        a = torch.randn(8192, 8192, device="cuda")
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(num_tests):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / num_tests / 1e3


class empty_suppress:
    """A context manager that does nothing (``bench_kineto``'s default)."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return None


class suppress_stdout_stderr:
    """Redirects the process's stdout and stderr (file descriptors 1 and 2 too) to /dev/null inside the block."""

    def __enter__(self):
        self._null = open(os.devnull, "w")
        self._saved = [(sys.stdout, os.dup(1)), (sys.stderr, os.dup(2))]
        os.dup2(self._null.fileno(), 1)
        os.dup2(self._null.fileno(), 2)
        sys.stdout = sys.stderr = self._null
        return self

    def __exit__(self, *_):
        (out, out_fd), (err, err_fd) = self._saved
        sys.stdout, sys.stderr = out, err
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        self._null.close()


def bench_kineto(fn, kernel_names, num_tests: int = 30, suppress_kineto_output: bool = False,
                 trace_path: Optional[str] = None, flush_l2: bool = True, with_multiple_kernels: bool = False,
                 barrier: Optional[Callable] = None):
    """Average seconds per launch of the CUDA kernels whose names contain ``kernel_names`` (a str, or a tuple:
    then a tuple of times), profiled with torch.profiler over ``num_tests`` calls of ``fn`` (L2 flushed before
    each when ``flush_l2``; ``barrier`` called before each). ``with_multiple_kernels=False`` asserts each name
    matches at most one kernel. Reads no environment variable (the reference's ``DG_USE_NVIDIA_TOOLS`` is not
    honoured: see docs/dropin.md, "Environment")."""
    _require_cuda("bench_kineto")
    names = (kernel_names,) if isinstance(kernel_names, str) else tuple(kernel_names)
    fn()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with (suppress_stdout_stderr() if suppress_kineto_output else empty_suppress()):
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(num_tests):
                if flush_l2:
                    torch.empty(int(8e9 // 4), dtype=torch.int, device="cuda").zero_()
                if barrier is not None:
                    barrier()
                fn()
            torch.cuda.synchronize()
    if trace_path is not None:
        profiler.export_chrome_trace(trace_path)
    events = [e for e in profiler.key_averages() if getattr(e, "device_type", None) is not None
              and "cuda" in str(e.device_type).lower()]
    times = []
    for name in names:
        matching = [e for e in events if name in e.key]
        if not with_multiple_kernels:
            assert len(matching) <= 1, f"{name!r} matches several kernels: {[e.key for e in matching]}"
        total_us = sum(getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) for e in matching)
        count = sum(e.count for e in matching)
        times.append(total_us / count / 1e6 if count else 0.0)
    return tuple(times) if isinstance(kernel_names, tuple) else times[0]


__all__ = ["bench", "bench_kineto", "empty_suppress", "suppress_stdout_stderr"]
