"""The JIT cache: memory and disk hits, key coverage, corruption recovery, concurrent processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import time

import pytest

from deep_fp8_gemm.runtime import cache
from deep_fp8_gemm.runtime.compiler import compile_kernel
from tests.jit_kernels import PYTHON, REPO_ROOT, jit_cache, probe_source, subprocess_env  # noqa: F401 (fixture)

NAME = "dfg_test_cache_probe"


@pytest.fixture(scope="module")
def source():
    return probe_source(NAME)


def _entry_files(directory):
    return sorted(p.name.split(".", 1)[1] for p in directory.iterdir() if not p.name.endswith(".lock"))


def test_memory_then_disk_hit(jit_cache, source):
    first = compile_kernel(NAME, source)
    assert first.cache_hit == ""
    assert _entry_files(jit_cache) == ["cubin", "json"]

    again = compile_kernel(NAME, source)
    assert again.cache_hit == "memory" and again.cubin == first.cubin
    assert compile_kernel(NAME, source) is again  # a hit is a lookup, not a copy

    cache.clear_memory_cache()
    from_disk = compile_kernel(NAME, source)
    assert from_disk.cache_hit == "disk"
    assert (from_disk.cubin, from_disk.resources, from_disk.key) == (first.cubin, first.resources, first.key)
    assert from_disk.compile_seconds == pytest.approx(first.compile_seconds)

    meta = json.loads((jit_cache / f"{first.key}.json").read_text())
    assert meta["name"] == NAME and meta["cubin_bytes"] == len(first.cubin) and meta["format"] == cache.FORMAT_VERSION


def test_disable_cache_skips_disk(jit_cache, source, monkeypatch):
    monkeypatch.setenv("DFG_JIT_DISABLE_CACHE", "1")
    assert compile_kernel(NAME, source).cache_hit == ""
    assert compile_kernel(NAME, source).cache_hit == "memory"
    assert not jit_cache.exists() or not any(jit_cache.iterdir())


def test_unusable_cache_dir_still_compiles(tmp_path, source, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(blocker / "cache"))
    cache.clear_memory_cache()
    with pytest.warns(RuntimeWarning, match="unusable"):
        kernel = compile_kernel(NAME, source)
    assert kernel.cache_hit == "" and kernel.cubin[:4] == b"\x7fELF"
    cache.clear_memory_cache()


def test_key_covers_source_options_arch_compiler_and_headers(source):
    base = dict(options=["-std=c++17"], arch="sm_90a", compiler_id="nvrtc-13.5", header_digest="h1")
    key = cache.cache_key(source, **base)
    assert key == cache.cache_key(source, **base) and len(key) == 64
    variants = [
        cache.cache_key(source + " ", **base),
        cache.cache_key(source, **{**base, "options": ["-std=c++20"]}),
        cache.cache_key(source, **{**base, "options": []}),
        cache.cache_key(source, **{**base, "arch": "sm_90"}),
        cache.cache_key(source, **{**base, "compiler_id": "nvrtc-12.9"}),
        cache.cache_key(source, **{**base, "header_digest": "h2"}),
    ]
    assert len({key, *variants}) == 1 + len(variants)


def test_headers_digest_changes_with_any_header(tmp_path):
    from deep_fp8_gemm.runtime.paths import include_dir

    root = tmp_path / "include"
    shutil.copytree(include_dir(), root)
    before = cache.headers_digest(root)
    assert before == cache.headers_digest(include_dir())  # content, not location

    edited = tmp_path / "edited"
    shutil.copytree(root, edited)
    ptx = edited / "deep_fp8_gemm" / "hal" / "ptx.cuh"
    ptx.write_text(ptx.read_text() + "\n// edit\n")
    assert cache.headers_digest(edited) != before

    added = tmp_path / "added"
    shutil.copytree(root, added)
    (added / "deep_fp8_gemm" / "new.cuh").write_text("#pragma once\n")
    assert cache.headers_digest(added) != before


def test_header_change_misses_the_cache(jit_cache, source, monkeypatch):
    first = compile_kernel(NAME, source)
    monkeypatch.setattr(cache, "headers_digest", lambda root=None: "0" * 64)
    rebuilt = compile_kernel(NAME, source)
    assert rebuilt.cache_hit == "" and rebuilt.key != first.key
    assert cache.cache_info()["entries"] == 2


@pytest.mark.parametrize("damage", ["flip_cubin", "truncate_cubin", "not_elf", "truncate_json", "garbage_json",
                                    "delete_cubin"])
def test_damaged_entry_is_rebuilt(jit_cache, source, damage):
    first = compile_kernel(NAME, source)
    cubin_path, json_path = jit_cache / f"{first.key}.cubin", jit_cache / f"{first.key}.json"
    data = bytearray(cubin_path.read_bytes())
    if damage == "flip_cubin":
        data[len(data) // 2] ^= 0xFF
        cubin_path.write_bytes(bytes(data))
    elif damage == "truncate_cubin":
        cubin_path.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "not_elf":
        cubin_path.write_bytes(b"\0" * len(data))
    elif damage == "truncate_json":
        json_path.write_text(json_path.read_text()[:40])
    elif damage == "garbage_json":
        json_path.write_bytes(b"\xff\xfe not json")
    else:
        cubin_path.unlink()

    cache.clear_memory_cache()
    assert cache.DiskCache(jit_cache).load(first.key) is None
    rebuilt = compile_kernel(NAME, source)
    assert rebuilt.cache_hit == "" and rebuilt.cubin == first.cubin

    cache.clear_memory_cache()
    assert compile_kernel(NAME, source).cache_hit == "disk"
    assert _entry_files(jit_cache) == ["cubin", "json"]


def test_info_and_clear(jit_cache, source):
    assert cache.cache_info() == {"dir": str(jit_cache), "entries": 0, "bytes": 0}
    compile_kernel(NAME, source)
    (jit_cache / "README.txt").write_text("not ours")
    info = cache.cache_info()
    assert info["entries"] == 1 and info["bytes"] > 1000
    assert cache.cache_clear() == 1
    assert cache.cache_info()["entries"] == 0 and (jit_cache / "README.txt").exists()
    assert compile_kernel(NAME, source).cache_hit == ""  # memory cache cleared too


_RACER = textwrap.dedent("""
    import pathlib, sys, time
    sys.path.insert(0, {repo!r})
    from tests.jit_kernels import probe_source
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    source = probe_source({name!r})
    sync = pathlib.Path({sync!r})
    (sync / f"ready-{{sys.argv[1]}}").touch()
    while not (sync / "go").exists():  # every process calls compile_kernel at the same moment
        time.sleep(0.001)
    kernel = compile_kernel({name!r}, source)
    print(kernel.cache_hit or "compiled", kernel.key, len(kernel.cubin))
""")


def test_concurrent_processes_share_one_entry(jit_cache, tmp_path):
    name, num_procs = "dfg_test_race", 4
    sync = tmp_path / "sync"
    sync.mkdir()
    script = _RACER.format(repo=str(REPO_ROOT), name=name, sync=str(sync))
    env = subprocess_env(DFG_JIT_CACHE_DIR=str(jit_cache))
    procs = [subprocess.Popen([PYTHON, "-c", script, str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(num_procs)]
    deadline = time.time() + 120
    while len(list(sync.glob("ready-*"))) < num_procs and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    (sync / "go").touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    lines = [out.split() for out, _ in outputs]
    assert len({key for _, key, _ in lines}) == 1 and len({size for _, _, size in lines}) == 1
    assert sorted(hit for hit, _, _ in lines).count("compiled") == 1  # the lock let exactly one compile
    assert _entry_files(jit_cache) == ["cubin", "json"]  # one entry, no temporaries left
    assert cache.DiskCache(jit_cache).load(lines[0][1]) is not None
