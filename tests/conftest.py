"""Shared pytest setup: tests marked ``gpu`` are skipped, with the reason, without an sm_90 device.

The run ends with one line per skip reason (``pytest_terminal_summary``), e.g. ``N GPU tests skipped: no sm_90
device (no CUDA driver/device)``, so the README's plain ``python -m pytest -q tests`` says why tests skip.
Use ``@pytest.mark.gpu`` (or ``from tests._gpu import requires_sm90``) on tests that need the device.
``fast_mode``: a fixture for tests of the split-K / swap-AB picks, which the heuristic makes only with
``set_batch_invariant(False)`` (docs/batch-invariance.md); the default mode is restored after the test.
``--dfg-test-timeout SECONDS``: a test running longer dumps every thread's stack and ends the process (a
hung kernel cannot be interrupted from Python); bench/device_check.sh's smoke step uses it.
Under pytest-xdist (``-n``) each worker gets its share of the cores for torch's intra-op threads
(:func:`_share_the_cores`).
"""

from __future__ import annotations

import faulthandler
import os
from collections import Counter

import pytest

from tests._gpu import sm90_skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = sm90_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def skip_summary(reports, gpu_reason: str | None) -> list[str]:
    """One line per skip reason: the GPU tests (skipped with :func:`tests._gpu.sm90_skip_reason`'s reason, by the
    ``gpu`` marker or ``requires_sm90``) first, as ``N GPU tests skipped: no sm_90 device (<reason>)``, then
    ``N skipped: <reason>`` for the others, most first."""
    gpu, other = 0, Counter()
    for report in reports:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        if gpu_reason is not None and reason == gpu_reason:
            gpu += 1
        else:
            other[reason] += 1
    lines = [f"{gpu} GPU test{'s' * (gpu != 1)} skipped: no sm_90 device ({gpu_reason})"] if gpu else []
    return lines + [f"{n} skipped: {reason}" for reason, n in other.most_common()]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    for line in skip_summary(terminalreporter.stats.get("skipped", []), sm90_skip_reason()):
        terminalreporter.write_line(line)


@pytest.fixture
def fast_mode():
    import deep_fp8_gemm as dfg

    before = dfg.is_batch_invariant()
    dfg.set_batch_invariant(False)
    try:
        yield
    finally:
        dfg.set_batch_invariant(before)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--dfg-test-timeout", type=float, default=0.0, metavar="SECONDS",
                     help="dump the stacks and exit the process when one test runs longer (0: no limit)")


_STDERR_FD: list[int] = []  # a copy of the real stderr: fd 2 is redirected while pytest captures a test's output


def _share_the_cores() -> None:
    """An xdist worker runs torch's intra-op pool on cores // workers threads (at least 1), not on every core: with
    N workers each holding a pool of every core, the OpenMP threads of one worker spin-wait (libgomp's busy wait
    after each parallel region) on cores the other workers' simulator runs need. Measured on 2 cores: a simulator
    test's CPU time 20.1 s with one thread against 26.6 s with two (tests/kernels/test_sim_exact_configs.py's masked
    anchors), the same results."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_configure(config: pytest.Config) -> None:
    _share_the_cores()
    if config.getoption("--dfg-test-timeout") > 0 and not _STDERR_FD:
        _STDERR_FD.append(os.dup(2))  # capture is suspended during configure: this is the terminal / log


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    timeout = item.config.getoption("--dfg-test-timeout")
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True, file=_STDERR_FD[0] if _STDERR_FD else 2)
    try:
        yield
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
