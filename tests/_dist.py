"""Spawn a small gloo world on this machine (CPU, loopback only) and run one function on every rank.

``run_world(world_size, fn, *args)`` starts ``world_size`` processes (``spawn``), each initialising
``torch.distributed`` with the gloo backend from a ``file://`` rendezvous in a fresh temporary directory, then
calls ``fn(rank, world_size, *args)`` (a module-level function, picklable by name) and sends back its
(picklable) return value through a file. Bounded in time twice over:

* gloo's own collective timeout (``init_process_group(timeout=...)``) ends a collective that waits for a dead
  or stuck peer;
* the parent polls the children: when one exits with an error, the others are terminated at once (they would
  otherwise block in a collective) and ``WorldError`` carries the failing rank's traceback; when the deadline
  passes, all are terminated and ``WorldTimeout`` is raised.

So a rank that raises, or one that hangs, fails the test within ``timeout`` seconds instead of stalling CI.
"""

from __future__ import annotations

import datetime
import os
import pickle
import shutil
import tempfile
import time
import traceback

import torch.multiprocessing as mp

#: Seconds a collective may wait for its peers before gloo raises.
GLOO_TIMEOUT_S = 30.0


class WorldError(RuntimeError):
    """A rank raised (its traceback is in the message)."""


class WorldTimeout(TimeoutError):
    """The world did not finish before the deadline; every rank was terminated."""


def _entry(rank: int, world_size: int, init_file: str, result_file: str, gloo_timeout: float, fn, args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2-3 ranks on a small machine: no thread oversubscription
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=gloo_timeout))
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        payload = ("ok", result)
        code = 0
    except BaseException:  # reported to the parent, which fails the test
        payload = ("error", traceback.format_exc())
        code = 1
    with open(result_file + ".tmp", "wb") as f:
        pickle.dump(payload, f)
    os.replace(result_file + ".tmp", result_file)
    os._exit(code)  # skip interpreter teardown (gloo threads); the result is already on disk


def _read(result_file: str):
    try:
        with open(result_file, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _failure_report(procs, files, world_size: int) -> str:
    """Every failed rank's report. Which rank failed first is not recorded, so reports whose error is a lost
    connection (usually the consequence of a peer's failure) are listed after the others."""
    reports = []
    for rank, (p, f) in enumerate(zip(procs, files)):
        if p.exitcode in (None, 0):
            continue
        report = _read(f)
        text = report[1] if report else f"exit code {p.exitcode}, no report (crashed, or terminated by us)"
        reports.append(("Connection reset" in text or "Connection closed" in text, rank, text))
    return "\n".join(f"rank {rank} of {world_size} failed:\n{text}" for _, rank, text in sorted(reports))


def _terminate(procs) -> None:
    procs = [p for p in procs if p.pid is not None]  # started ones only
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def run_world(world_size: int, fn, *args, timeout: float = 120.0, gloo_timeout: float = GLOO_TIMEOUT_S) -> list:
    """Runs ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks; returns the results by rank.

    Raises ``WorldError`` (a rank raised or died) or ``WorldTimeout`` (``timeout`` seconds passed), after
    terminating every rank that is still running.
    """
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="dfg-dist-")
    files = [os.path.join(tmp, f"rank{r}.pkl") for r in range(world_size)]
    procs = [ctx.Process(target=_entry, args=(r, world_size, os.path.join(tmp, "init"), files[r], gloo_timeout,
                                               fn, args), daemon=True) for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.exitcode for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                time.sleep(0.5)  # let a peer that fails in consequence (connection reset) report too
                _terminate(procs)
                raise WorldError(_failure_report(procs, files, world_size))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                _terminate(procs)
                running = [r for r, c in enumerate(codes) if c is None]
                raise WorldTimeout(f"world of {world_size} not done after {timeout:.0f} s; ranks {running} were "
                                   f"still running and have been terminated")
            time.sleep(0.05)
        return [_read(f)[1] for f in files]
    finally:
        _terminate(procs)
        shutil.rmtree(tmp, ignore_errors=True)
