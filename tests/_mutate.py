"""Planted-bug tests: a copy of the device headers with one text change, made the include directory of both
builds (the sm_90a compile and the CPU simulator) for the rest of the test."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from deep_fp8_gemm.runtime import cache, compiler, paths

_SESSION_CACHE_DIR = os.environ.get("DFG_JIT_CACHE_DIR")  # imported at collection, before any test's fixture


def mutated_headers(tmp_path: Path, monkeypatch, header: str, original: str, planted: str) -> None:
    """Copies include/ under ``tmp_path``, replaces the one occurrence of ``original`` in ``header`` (relative
    to include/deep_fp8_gemm/) by ``planted``, points the JIT at the copy and at a fresh cache."""
    mutated = tmp_path / "include"
    shutil.copytree(paths.include_dir(), mutated)
    target = mutated / "deep_fp8_gemm" / header
    text = target.read_text()
    assert text.count(original) == 1, f"the original text is no longer in {header}; update this test: {original!r}"
    target.write_text(text.replace(original, planted))
    fresh = tmp_path / "cache"
    _carry_simulator_runtime(mutated, fresh)
    for module in (paths, compiler, cache):  # the sm_90a build gives the simulator its register count
        monkeypatch.setattr(module, "include_dir", lambda: mutated)
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(fresh))


def _carry_simulator_runtime(mutated: Path, fresh: Path) -> None:
    """The simulator's runtime library and its prelude (the precompiled hal) cover common.cuh and hal/ only
    (deep_fp8_gemm/simulator/build.py), which a plant in a kernel header leaves as they are: the ones the unmutated
    headers built (once per session, in the session's cache) serve the copy too, instead of ~12 s of g++ per planted
    test. A plant in hal/ changes their keys and gets its own."""
    from deep_fp8_gemm.simulator import build

    if shutil.which(build.CXX) is None:
        return
    key = build.cache_key(build.RUNTIME_SOURCE, paths.include_dir())
    if build.cache_key(build.RUNTIME_SOURCE, mutated) != key:
        return
    carry_simulator_entries(fresh)


def carry_simulator_entries(cache_dir: Path) -> None:
    """Puts the session cache's runtime library and prelude (built there first if missing) into ``cache_dir``'s
    ``sim/``, each with its source and sidecar, in the cache's modes: a test's fresh cache then builds only its own
    kernel libraries. The session's cache is the one the run started with (``DFG_JIT_CACHE_DIR`` then, whatever a
    fixture set since). The prelude (~70 MB) is hard-linked where the file system allows (the library never writes
    an entry in place: a rebuild replaces the file), else copied."""
    from deep_fp8_gemm.simulator import build

    with _session_cache(), build.open_runtime() as runtime, build.open_prelude() as prelude:
        entries = [(runtime.path, ".so"), (prelude.path, f".{build.PRELUDE_KIND}")]
    target = cache_dir / "sim"
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(cache_dir, 0o700)
    for entry, built in entries:
        stem = entry.name.removesuffix(built)
        for suffix in (built, ".json", ".cpp"):
            source, copy = entry.parent / f"{stem}{suffix}", target / f"{stem}{suffix}"
            if not (suffix == f".{build.PRELUDE_KIND}" and _hard_link(source, copy)):
                shutil.copyfile(source, copy)  # small files: a test may edit its cache's copy in place
            os.chmod(copy, 0o600)


@contextlib.contextmanager
def _session_cache() -> Iterator[None]:
    now = os.environ.get("DFG_JIT_CACHE_DIR")
    _set_cache_dir(_SESSION_CACHE_DIR)
    try:
        yield
    finally:
        _set_cache_dir(now)


def _set_cache_dir(value: str | None) -> None:
    if value is None:
        os.environ.pop("DFG_JIT_CACHE_DIR", None)
    else:
        os.environ["DFG_JIT_CACHE_DIR"] = value


def _hard_link(source: Path, link: Path) -> bool:
    try:
        os.link(source, link)
    except OSError:  # another file system
        return False
    return True
