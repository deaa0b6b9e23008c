"""Planted-bug tests: a copy of the device headers with one text change, made the include directory of both
builds (the sm_90a compile and the CPU simulator) for the rest of the test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from deep_fp8_gemm.runtime import cache, compiler, paths


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
    """The simulator's runtime library covers common.cuh and hal/ only (deep_fp8_gemm/simulator/build.py), which a
    plant in a kernel header leaves as they are: the runtime the unmutated headers built (once per session, in
    the session's cache) serves the copy too, instead of ~12 s of g++ per planted test. Copied with its sidecar
    and the cache's modes; a plant in hal/ changes the key and gets its own."""
    from deep_fp8_gemm.simulator import build

    if shutil.which(build.CXX) is None:
        return
    key = build.cache_key(build.RUNTIME_SOURCE, paths.include_dir())
    if build.cache_key(build.RUNTIME_SOURCE, mutated) != key:
        return
    with build.open_runtime() as runtime:
        entry = runtime.path
    target = fresh / "sim"
    target.mkdir(parents=True, mode=0o700)
    os.chmod(fresh, 0o700)
    for suffix in (".so", ".json", ".cpp"):
        copy = target / entry.with_suffix(suffix).name
        shutil.copyfile(entry.with_suffix(suffix), copy)
        os.chmod(copy, 0o600)
