"""Planted-bug tests: a copy of the device headers with one text change, made the include directory of both
builds (the sm_90a compile and the CPU simulator) for the rest of the test."""

from __future__ import annotations

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
    for module in (paths, compiler, cache):  # the sm_90a build gives the simulator its register count
        monkeypatch.setattr(module, "include_dir", lambda: mutated)
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(tmp_path / "cache"))
