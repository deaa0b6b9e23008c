"""The caches hold code the process runs: owner-only directories, refused when others can write them, and
nothing loaded that was not built and checked here (issue 29).

CI runs as root, which ignores mode bits: foreign ownership is made with ``os.chown`` to another uid and the
assertions are on the mode bits themselves. A planted library is a real one whose constructor writes a marker
file, placed under the exact name the next call loads (kernel name + public hash, computable by anyone).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pytest

from deep_fp8_gemm import cli
from deep_fp8_gemm.runtime import cache, paths
from deep_fp8_gemm.runtime.compiler import CompileError, compile_kernel
from deep_fp8_gemm.simulator import build, build_library, launch
from tests._mutate import carry_simulator_entries
from tests.jit_kernels import PYTHON, REPO_ROOT, jit_cache, probe_source, simple_source, subprocess_env  # noqa: F401

OTHER_UID = 65534  # nobody
REFUSED = r"(?s)will not use the JIT cache directory .*DFG_JIT_CACHE_DIR"


# ---------------------------------------------------------------------------------------- helpers
def _tiny_source(name: str) -> str:
    """A translation unit with the kernel entry a simulator library exports, a kernel whose threads do nothing
    (builds in well under a second: it includes no simulator headers; it links the simulator's runtime library,
    which has dfg_sim_run_stream and dfg_sim_last_error)."""
    return textwrap.dedent(f"""
        struct KernelInfo {{ void (*body)(const void*); unsigned max_threads, reserved; unsigned long long params_bytes; }};
        static void body(const void*) {{}}
        extern "C" __attribute__((visibility("default"))) const KernelInfo* {name}_sim_kernel() {{
            static const KernelInfo info{{body, 1, 0, 0}};
            return &info;
        }}
    """)


def _fresh_kernel() -> tuple[str, str]:
    """A kernel name and source no process has loaded yet (the runner keeps what it loaded)."""
    name = f"k_sec_{uuid.uuid4().hex[:12]}"
    return name, _tiny_source(name)


def _launch(name: str, source: str) -> None:
    launch(name, source, b"", grid=1, block=1, cluster=1, smem_bytes=0)


def _next_library(cache_dir: Path, name: str, source: str) -> Path:
    """The path the next launch of ``source`` loads from ``cache_dir``: what an attacker computes."""
    return cache_dir / "sim" / f"{name}_{build.cache_key(source, paths.include_dir())[:24]}.so"


def _entry_files(cache_dir: Path, library: Path) -> list[str]:
    """The files a built library leaves in the cache: its entry's and those of the runtime library it links."""
    key = build.cache_key(build.RUNTIME_SOURCE, paths.include_dir())
    runtime = cache_dir / "sim" / f"{build.RUNTIME_NAME}_{key[:24]}.so"
    return sorted([library.with_suffix(s).name for s in (".cpp", ".json", ".lock", ".so")] +
                  [runtime.with_suffix(s).name for s in (".cpp", ".json", ".lock", ".so")])


def _plant(path: Path, name: str, marker: Path) -> Path:
    """Builds, at ``path``, a library that exports ``name``'s entry points and writes ``marker`` when loaded."""
    code = textwrap.dedent(f"""
        #include <cstdio>
        __attribute__((constructor)) static void planted() {{
            if (std::FILE* f = std::fopen("{marker}", "w")) {{ std::fputs("planted code ran", f); std::fclose(f); }}
        }}
    """) + _tiny_source(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f"planted-{uuid.uuid4().hex[:8]}.cpp"
    src.write_text(code)
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(path)], check=True)
    src.unlink()
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _modes(root: Path) -> dict[str, str]:
    """``{relative path: "dir 0700" / "file 0600"}`` for everything under ``root`` (``root`` itself as ".")."""
    found = {".": f"dir {stat.S_IMODE(root.lstat().st_mode):04o}"}
    for p in root.rglob("*"):
        kind = "dir" if p.is_dir() else "file"
        found[str(p.relative_to(root))] = f"{kind} {stat.S_IMODE(p.lstat().st_mode):04o}"
    return found


@pytest.fixture
def umask0():
    """umask 0: what the library creates is owner-only because it says so, not because of the umask."""
    previous = os.umask(0)
    yield
    os.umask(previous)


@pytest.fixture
def empty_sim_cache(jit_cache, monkeypatch):
    """A private cache for the simulator too (the sim tests share ``jit_cache``'s directory), empty: the first
    launch builds the simulator's runtime library there."""
    monkeypatch.delenv("DFG_JIT_DISABLE_CACHE", raising=False)
    return jit_cache


@pytest.fixture
def sim_cache(empty_sim_cache):
    """:func:`empty_sim_cache` holding the session's runtime library and prelude (tests/_mutate.py), for the tests
    about a kernel library's entry: a launch there builds only its library (~8 s of g++ less per test)."""
    carry_simulator_entries(empty_sim_cache)
    return empty_sim_cache


def test_planted_library_runs_when_loaded(tmp_path):
    """Control: the planted library does write its marker when something loads it (in a child process)."""
    marker = tmp_path / "marker"
    planted = _plant(tmp_path / "planted.so", "k_control", marker)
    subprocess.run([PYTHON, "-c", f"import ctypes; ctypes.CDLL({str(planted)!r})"], check=True)
    assert marker.read_text() == "planted code ran"


# ---------------------------------------------------------------------------------------- owner-only
def test_fresh_cache_is_owner_only(tmp_path, monkeypatch, umask0):
    """Every directory the library creates (intermediate ones included) is 0700 and every file 0600: cubins,
    debug dumps, saved failing sources, simulator libraries, sidecars and locks."""
    root = tmp_path / "made" / "by" / "us"
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(root))
    monkeypatch.setenv("DFG_JIT_DEBUG", "1")
    cache.clear_memory_cache()
    compile_kernel("dfg_test_sec_probe", probe_source("dfg_test_sec_probe"))
    with pytest.raises(CompileError):
        compile_kernel("dfg_test_sec_broken", simple_source("syntax_error.cu", "dfg_test_sec_broken"))
    _launch(*_fresh_kernel())

    modes = _modes(tmp_path / "made")
    assert {"by", "by/us", "by/us/sim", "by/us/errors"} <= set(modes), modes
    assert {".cubin", ".json", ".cu", ".ptx", ".lock", ".so", ".cpp"} <= {Path(p).suffix for p in modes}, modes
    assert {mode for p, mode in modes.items() if mode.startswith("dir")} == {"dir 0700"}, modes
    assert {mode for p, mode in modes.items() if mode.startswith("file")} == {"file 0600"}, modes


def test_existing_own_cache_is_tightened(jit_cache):
    """A cache of the user's own made with a 022 umask (readable by all) is tightened on first use."""
    (jit_cache / "sim").mkdir(parents=True, mode=0o755)
    for p in (jit_cache, jit_cache / "sim"):
        p.chmod(0o755)
    (jit_cache / ("0" * 64 + ".json")).write_text("{}")
    (jit_cache / "sim" / f"k_{'0' * 24}.cpp").write_text("// old")
    for p in jit_cache.rglob("*.*"):
        p.chmod(0o644)
    compile_kernel("dfg_test_sec_tight", probe_source("dfg_test_sec_tight"))
    modes = _modes(jit_cache)
    assert set(modes.values()) == {"dir 0700", "file 0600"}, modes


# ---------------------------------------------------------------------------------------- refused
def _unsafe(kind: str, root: Path) -> Path:
    """Makes ``root`` (a cache directory, with ``sim/`` inside) unsafe in one way; returns the path at fault."""
    (root / "sim").mkdir(parents=True)
    target = {"world_writable": root, "group_writable": root, "foreign_owner": root,
              "group_writable_ancestor": root.parent, "foreign_subfolder": root / "sim"}[kind]
    if kind == "world_writable":
        target.chmod(0o777)
    elif kind in ("group_writable", "group_writable_ancestor"):
        target.chmod(0o770)
    else:
        os.chown(target, OTHER_UID, -1)
    return target


UNSAFE = ["world_writable", "group_writable", "foreign_owner", "group_writable_ancestor", "foreign_subfolder"]


@pytest.mark.parametrize("kind", UNSAFE)
def test_explicit_unsafe_dir_is_refused_and_nothing_planted_runs(tmp_path, monkeypatch, kind):
    root = tmp_path / "shared" / "cache"
    at_fault = _unsafe(kind, root)
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(root))
    cache.clear_memory_cache()
    name, source = _fresh_kernel()
    marker = tmp_path / "marker"
    _plant(_next_library(root, name, source), name, marker)
    before = sorted(p.name for p in root.rglob("*"))

    st = at_fault.stat()
    owner_and_mode = rf"{re.escape(str(at_fault))} \(owner .*uid {st.st_uid}\), mode {stat.S_IMODE(st.st_mode):04o}\)"
    with pytest.raises(RuntimeError, match=REFUSED) as refused:
        _launch(name, source)
    assert refused.match(owner_and_mode) and refused.match("Fix: point DFG_JIT_CACHE_DIR at a directory of your own")
    with pytest.raises(RuntimeError, match=REFUSED + ".*" + owner_and_mode):
        compile_kernel("dfg_test_sec_refused", probe_source("dfg_test_sec_refused"))
    assert not marker.exists()
    assert sorted(p.name for p in root.rglob("*")) == before  # nothing read, written or tightened there


def test_sticky_world_writable_ancestor_is_fine(tmp_path, monkeypatch):
    """A temp root (1777) is an acceptable ancestor: others can neither rename nor remove what is ours in it."""
    shared = tmp_path / "tmp-like"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(shared / "mine"))
    cache.clear_memory_cache()
    assert compile_kernel("dfg_test_sec_sticky", probe_source("dfg_test_sec_sticky")).cubin[:4] == b"\x7fELF"
    _launch(*_fresh_kernel())
    assert stat.S_IMODE((shared / "mine").stat().st_mode) == 0o700


@pytest.mark.parametrize("kind", ["world_writable", "foreign_owner"])
def test_default_location_that_fails_is_bypassed_with_one_warning(tmp_path, monkeypatch, kind):
    """DFG_JIT_CACHE_DIR unset, the default location unsafe: a private cache instead, one warning, and the
    library planted in the default location never runs."""
    root = tmp_path / "xdg" / "deep_fp8_gemm"
    _unsafe(kind, root)
    monkeypatch.delenv("DFG_JIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("DFG_JIT_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache.clear_memory_cache()
    name, source = _fresh_kernel()
    marker = tmp_path / "marker"
    _plant(_next_library(root, name, source), name, marker)
    before = sorted(p.name for p in root.rglob("*"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _launch(name, source)
        compile_kernel("dfg_test_sec_default", probe_source("dfg_test_sec_default"))
        _launch(*_fresh_kernel())
    bypassed = [w for w in caught if "private cache" in str(w.message)]
    assert len(bypassed) == 1 and issubclass(bypassed[0].category, RuntimeWarning), [str(w.message) for w in caught]
    assert str(root) in str(bypassed[0].message)
    assert not marker.exists()
    assert sorted(p.name for p in root.rglob("*")) == before


def test_cache_cli_reports_failed_checks(tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    _unsafe("foreign_owner", root)
    (root / ("0" * 64 + ".json")).write_text("{}")
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(root))
    assert cli.main(["cache", "info"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"dir: {root}\nchecks: deep_fp8_gemm will not use") and "is owned by another user" in out
    assert "entries:" not in out  # nothing is read there
    assert cli.main(["cache", "clear"]) == 2
    assert "not clearing" in capsys.readouterr().err
    assert (root / ("0" * 64 + ".json")).exists()


# ---------------------------------------------------------------------------------------- load only what was checked
def test_planted_library_in_own_cache_never_runs(sim_cache, tmp_path):
    """A library under the next call's name but without a sidecar is a miss: deleted and rebuilt."""
    name, source = _fresh_kernel()
    marker = tmp_path / "marker"
    planted = _plant(_next_library(sim_cache, name, source), name, marker)
    _launch(name, source)
    assert not marker.exists()
    sidecar = json.loads(planted.with_suffix(".json").read_text())
    assert sidecar["sha256"] == _sha256(planted) and sidecar["bytes"] == planted.stat().st_size


def _vouch_for(library: Path, planted: Path) -> None:
    """Makes the sidecar of ``library`` (if any) vouch for ``planted``'s size and sha256, as whoever can write
    one file of an entry can write the other: only the ownership checks tell such an entry apart."""
    sidecar = library.with_suffix(".json")
    record = json.loads(sidecar.read_text()) if sidecar.exists() else {}
    record.update(bytes=planted.stat().st_size, sha256=_sha256(planted))
    sidecar.write_text(json.dumps(record))


@pytest.mark.parametrize("damage", ["planted_bytes", "flipped_byte", "symlink", "world_writable", "foreign_owner"])
def test_tampered_library_is_rebuilt_not_loaded(sim_cache, tmp_path, damage):
    name, source = _fresh_kernel()
    library = build_library(source, name)
    genuine = library.read_bytes()
    marker = tmp_path / "marker"
    elsewhere = _plant(tmp_path / "elsewhere.so", name, marker)
    if damage == "planted_bytes":  # the sidecar left as it was
        library.write_bytes(elsewhere.read_bytes())
    elif damage == "flipped_byte":
        data = bytearray(genuine)
        data[len(data) // 2] ^= 0xFF
        library.write_bytes(bytes(data))
    elif damage == "symlink":
        _vouch_for(library, elsewhere)
        library.unlink()
        library.symlink_to(elsewhere)
    else:
        library.write_bytes(elsewhere.read_bytes())
        _vouch_for(library, library)
        if damage == "world_writable":
            library.chmod(0o666)
        else:
            os.chown(library, OTHER_UID, -1)

    _launch(name, source)
    assert not marker.exists()
    assert not library.is_symlink() and library.read_bytes() == genuine
    assert library.stat().st_uid == os.geteuid() and stat.S_IMODE(library.stat().st_mode) == 0o600


@pytest.mark.parametrize("damage", ["symlink", "world_writable", "foreign_owner"])
def test_cubin_entry_others_could_write_is_rebuilt_not_loaded(jit_cache, tmp_path, damage):
    """A consistent entry (metadata vouching for the cubin) that is a link, or that someone else owns or can
    write, is not loaded: the checksum alone cannot tell who wrote both files."""
    name = "dfg_test_sec_cubin"
    first = compile_kernel(name, probe_source(name))
    cubin_path, json_path = jit_cache / f"{first.key}.cubin", jit_cache / f"{first.key}.json"
    forged = bytearray(first.cubin)
    forged[-1] ^= 0xFF
    meta = json.loads(json_path.read_text())
    meta["cubin_sha256"] = hashlib.sha256(bytes(forged)).hexdigest()
    json_path.write_text(json.dumps(meta))
    if damage == "symlink":
        (tmp_path / "forged.cubin").write_bytes(bytes(forged))
        cubin_path.unlink()
        cubin_path.symlink_to(tmp_path / "forged.cubin")
    else:
        cubin_path.write_bytes(bytes(forged))
        for p in (cubin_path, json_path):
            if damage == "world_writable":
                p.chmod(0o666)
            else:
                os.chown(p, OTHER_UID, -1)

    cache.clear_memory_cache()
    rebuilt = compile_kernel(name, probe_source(name))
    assert rebuilt.cache_hit == "" and rebuilt.cubin == first.cubin
    assert not cubin_path.is_symlink() and cubin_path.read_bytes() == first.cubin
    assert cubin_path.stat().st_uid == os.geteuid() and stat.S_IMODE(cubin_path.stat().st_mode) == 0o600


def test_checks_run_once_per_process_and_directory(empty_sim_cache, monkeypatch):
    """The ownership walk runs on a directory's first use only; in-memory hits and repeated launches touch
    neither the walk nor the library's checksum."""
    from deep_fp8_gemm.runtime import cachedir

    walks, hashes = [], []
    problems, sha256 = cachedir._problems, build._sha256
    monkeypatch.setattr(cachedir, "_problems", lambda *a: walks.append(a[0]) or problems(*a))
    monkeypatch.setattr(build, "_sha256", lambda fd: hashes.append(fd) or sha256(fd))
    name, source = _fresh_kernel()
    for _ in range(3):
        _launch(name, source)
        compile_kernel("dfg_test_sec_once", probe_source("dfg_test_sec_once"))
    cache.clear_memory_cache()
    compile_kernel("dfg_test_sec_once", probe_source("dfg_test_sec_once"))  # a disk hit
    assert sorted(walks) == sorted(os.path.realpath(p) for p in (empty_sim_cache, empty_sim_cache / "sim")), walks
    # the builds' own checksums (the runtime's, then the library's): the launch loads the descriptor it hashed
    assert len(hashes) == 2


# ---------------------------------------------------------------------------------------- concurrency
_RACER = textwrap.dedent("""
    import pathlib, sys, time
    sys.path.insert(0, {repo!r})
    from deep_fp8_gemm.simulator import launch
    sync = pathlib.Path({sync!r})
    (sync / f"ready-{{sys.argv[1]}}").touch()
    while not (sync / "go").exists():  # every process launches at the same moment
        time.sleep(0.001)
    launch({name!r}, {source!r}, b"", grid=1, block=1, cluster=1, smem_bytes=0)
""")


def test_concurrent_processes_share_a_private_library_cache(empty_sim_cache, tmp_path):
    """Four processes launching one kernel in a fresh private cache: one compiles (the entry's lock), all
    load that one checked library."""
    num_procs = 4
    name, source = _fresh_kernel()
    sync, bin_dir, builds = tmp_path / "sync", tmp_path / "bin", tmp_path / "builds"
    sync.mkdir()
    bin_dir.mkdir()
    wrapper = bin_dir / "g++"  # counts the links of the runtime (its soname) and of libraries, then runs g++
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -Wl,-soname,"*) echo runtime >> "{builds}";;\n'
                       f'  *" -shared "*) echo built >> "{builds}";; esac\n'
                       f'exec {shutil.which("g++")} "$@"\n')
    wrapper.chmod(0o755)
    env = subprocess_env(DFG_JIT_CACHE_DIR=str(empty_sim_cache), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    script = _RACER.format(repo=str(REPO_ROOT), sync=str(sync), name=name, source=source)
    procs = [subprocess.Popen([PYTHON, "-c", script, str(i)], env=env, stderr=subprocess.PIPE, text=True)
             for i in range(num_procs)]
    deadline = time.time() + 120
    while (len(list(sync.glob("ready-*"))) < num_procs and time.time() < deadline
           and all(p.poll() is None for p in procs)):
        time.sleep(0.01)
    (sync / "go").touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    assert sorted(builds.read_text().split()) == ["built", "runtime"]
    entry = _next_library(empty_sim_cache, name, source)
    built = sorted(p.name for p in (empty_sim_cache / "sim").iterdir())
    assert built == _entry_files(empty_sim_cache, entry)  # no temporaries
    assert set(_modes(empty_sim_cache).values()) == {"dir 0700", "file 0600"}


def test_sidecar_is_verified_before_the_library_is_loaded(sim_cache):
    """The sidecar records the build key, the size and the sha256 of the library it was written for."""
    name, source = _fresh_kernel()
    library = build_library(source, name)
    record = json.loads(library.with_suffix(".json").read_text())
    key = build.cache_key(source, paths.include_dir())
    assert record["key"] == key and library.name == f"{name}_{key[:24]}.so"
    assert record["bytes"] == library.stat().st_size and record["sha256"] == _sha256(library)
