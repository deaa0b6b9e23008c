"""Compiles a rendered kernel translation unit with the host C++ compiler into a simulator library.

The translation unit is the very source NVRTC compiles for sm_90a; ``-DDFG_SIMULATOR`` makes
``deep_fp8_gemm/hal.cuh`` pick the CPU emulation (``hal/sim.hpp``). The emulation itself is compiled once per set
of headers into a shared library, the runtime (``dfg_sim_runtime_<key>.so``, :func:`open_runtime`, its soname the
file's name), that every kernel library links dynamically: the emulation's state is then one per process, so one
simulated stream can run kernels of several libraries (a quantiser, then a GEMM, as the ops launch them under PDL;
:func:`.runner.stream`). A kernel's translation unit is compiled with ``-DDFG_SIM_LINKED_RUNTIME`` (it sees the
emulation's declarations only, so it compiles its kernel and the hal's inline wrappers, not the whole simulator
again) and with ``-fsanitize=thread``, which instruments every plain load and store of the kernel code with a call
the runtime defines (``hal/sim/instrument.hpp``: the race detector's view of shared and global memory). Both are
linked without the ThreadSanitizer runtime (``-z defs`` makes a hook the runtime lacks a build error); ``-g1`` gives
``addr2line`` the line tables that name an access's call site in a report. A kernel translation unit that includes the
library's headers is compiled with the prelude (:func:`open_prelude`): the hal and the standard headers it needs,
precompiled once per set of hal headers (a GCC precompiled header, ``-include``), which halves the compile (each
library parsed ~70,000 lines of them, ~0.6 s of its ~1.2 s). The runtime exports only the
emulation's interface (``DFG_SIM_API``, the hooks, the ``dfg_sim_*`` entry points; ``-fvisibility=hidden``, bound
to itself with ``-Bsymbolic``); a kernel library's ``DT_NEEDED`` names it by soname, and the runner loads the
verified runtime before any library that needs it, so the dynamic loader binds to that very file. Libraries and
the runtime are cached like cubins, in ``<cache>/sim/`` (:func:`library_dir`), each entry three files named
``<name>_<key[:24]>``:

* ``.cpp``  — the source, kept beside the library: compiler messages (and debuggers) point into it;
* ``.so`` — the library (or the runtime), built under a temporary name and renamed into place; the prelude's
  is ``.cpp.gch`` (GCC finds a precompiled header as the included file's name plus ``.gch``);
* ``.json`` — its sidecar (format, full key, size and sha256 of the library), written last, so a sidecar
  only ever exists next to the library it describes.

The key is a SHA-256 over the source, every header under the include directory, the compiler's identity and
the flags (a library's: its own and the runtime's). A library is loaded only through :func:`open_library`: it opens the file relative to the checked
directory (never through a link), verifies it against its sidecar and hands out that descriptor, so what is
loaded is the very file that was verified. A missing or mismatched sidecar is a miss: the entry is deleted
under its lock (``.lock``, which also makes concurrent builders compile once) and rebuilt. The sidecar
guards against corruption (a crash, a full disk, a stray edit); the security control is the directory check
of :mod:`..runtime.cachedir` (owned by the user or root, writable by nobody else, ancestors included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .. import env
from ..runtime import cachedir, paths

CXX = "g++"
# -fvisibility=hidden: only the entry points (DFG_SIM_EXPORT) are exported, so two simulator libraries in
# one process never bind each other's inline simulator state.
# -fno-threadsafe-statics: a launch runs on one OS thread (fibers; launches are serialised), and thread-safe
# statics would need ThreadSanitizer's atomic hooks.
RUNTIME_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-DDFG_SIMULATOR", "-fno-threadsafe-statics")
FLAGS = (*RUNTIME_FLAGS, "-DDFG_SIM_LINKED_RUNTIME", "-g1", "-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0")
LINK_FLAGS = ("-shared", "-Wl,-z,defs", "-ldl")
# The runtime: a shared library (its soname, -Wl,-soname,<entry>.so, is added per build) bound to its own definitions.
RUNTIME_LINK_FLAGS = ("-shared", "-Wl,-z,defs", "-Wl,-Bsymbolic", "-ldl")
RUNTIME_NAME = "dfg_sim_runtime"
RUNTIME_SOURCE = "// The simulator's emulation (deep_fp8_gemm/simulator/build.py: open_runtime).\n#include <deep_fp8_gemm/hal/sim.hpp>\n"
# The prelude: what every kernel translation unit parses first, precompiled with the kernels' own FLAGS (GCC uses a
# precompiled header only when the flags that change code match; with -Winvalid-pch a mismatch would say so, and the
# compile would read the text instead: slower, the same library). Its key covers the runtime's headers only.
PRELUDE_NAME = "dfg_sim_prelude"
PRELUDE_SOURCE = ("// The simulator's declarations, precompiled (deep_fp8_gemm/simulator/build.py: open_prelude).\n"
                  "#include <deep_fp8_gemm/hal/sim.hpp>\n")
PRELUDE_KIND = "cpp.gch"
PRELUDE_FLAGS = ("-x", "c++-header")
# Bump when the entry layout or the sidecar schema changes: old entries then simply miss. 2: the runtime is a shared
# library that kernel libraries link dynamically (it was an object file linked into each).
FORMAT_VERSION = 2
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Entries and locks, and the temporaries of interrupted builds: what info and clear count as the cache's.
_CACHE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*_[0-9a-f]{24}\.(so|o|json|cpp|cpp\.gch|lock)|\..*\.tmp)$")


class SimBuildError(RuntimeError):
    """The host compiler rejected a translation unit; ``log`` holds its output."""

    def __init__(self, message: str, *, log: str = ""):
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log


@functools.lru_cache(maxsize=None)
def compiler_identity() -> str:
    """First line of ``g++ --version`` (part of the cache key).

    Raises:
        SimBuildError: no host C++ compiler.
    """
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SimBuildError(f"the simulator needs a host C++ compiler ({CXX}): {e}") from None
    return out.splitlines()[0].strip()


# What the runtime includes (hal/sim.hpp: common.cuh and hal/): a planted bug in a kernel header leaves it
# as it is, so it is not compiled again for that.
_RUNTIME_HEADERS = ("deep_fp8_gemm/common.cuh", "deep_fp8_gemm/hal/")


def uses_prelude(source: str) -> bool:
    """Whether a kernel translation unit is compiled with the prelude: one that includes the library's headers (the
    ones that include none, e.g. a test's bare entry point, would only pay for parsing it)."""
    return "#include <deep_fp8_gemm/" in source and source not in (RUNTIME_SOURCE, PRELUDE_SOURCE)


def cache_key(source: str, include_dir: Path) -> str:
    """SHA-256 over everything that changes the library: source, headers, compiler, flags (the runtime's too, and
    whether the prelude is used). The keys of the runtime (its source is RUNTIME_SOURCE) and of the prelude cover
    only the headers they include."""
    h = hashlib.sha256()
    runtime = source == RUNTIME_SOURCE
    if runtime:
        flags = (RUNTIME_FLAGS, RUNTIME_LINK_FLAGS)
    elif source == PRELUDE_SOURCE:
        flags = (FLAGS, PRELUDE_FLAGS)
        runtime = True  # the same header scope
    else:
        flags = (FLAGS, LINK_FLAGS, RUNTIME_FLAGS, RUNTIME_LINK_FLAGS, PRELUDE_FLAGS if uses_prelude(source) else ())
    for part in (source, compiler_identity(), *(" ".join(f) for f in flags)):
        h.update(part.encode())
        h.update(b"\0")
    for header in paths.header_files(include_dir):
        if runtime and not str(header.relative_to(include_dir)).startswith(_RUNTIME_HEADERS):
            continue
        h.update(str(header.relative_to(include_dir)).encode())
        h.update(b"\0")
        h.update(header.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def library_dir() -> Path:
    """Where libraries are cached: ``<cache>/sim`` (:func:`..runtime.cachedir.cache_root`)."""
    return cachedir.cache_root() / "sim"


@dataclasses.dataclass(frozen=True)
class Library:
    """A verified library, open: ``path`` where it lives, ``fd`` the descriptor that was verified (load the
    file through it, ``/proc/self/fd/N``, not through ``path``)."""

    path: Path
    fd: int


@contextlib.contextmanager
def open_library(source: str, name: str) -> Iterator[Library]:
    """The verified library of ``source`` (a rendered kernel translation unit), built if missing or damaged;
    its descriptor is closed when the ``with`` block ends (:func:`.runner.launch` loads a duplicate).

    ``name`` is the kernel's symbol (C identifier); the library exports ``<name>_sim`` and
    ``dfg_sim_last_error``. With ``DFG_JIT_DISABLE_CACHE=1`` the library is built into a fresh private
    temporary directory and no cached library is reused.

    Raises:
        ValueError: ``name`` is not a C identifier.
        SimBuildError: the compiler failed (the message carries its log).
        UnsafeCacheDirError: ``DFG_JIT_CACHE_DIR`` fails the checks of :mod:`..runtime.cachedir`.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"kernel name must be a C identifier, got {name!r}")
    with _entry(source, name, "so") as library:
        yield library


@contextlib.contextmanager
def open_runtime() -> Iterator[Library]:
    """The verified runtime library (the emulation, ``hal/sim.hpp`` without ``DFG_SIM_LINKED_RUNTIME``) of the
    current headers, built if missing or damaged; every library links it (:func:`open_library` does), and the runner
    loads it first (:func:`runtime_soname` names it)."""
    with _entry(RUNTIME_SOURCE, RUNTIME_NAME, "so") as runtime:
        yield runtime


@contextlib.contextmanager
def open_prelude() -> Iterator[Library]:
    """The verified prelude (``hal/sim.hpp`` as a kernel translation unit sees it, precompiled with :data:`FLAGS`) of
    the current headers, built if missing or damaged; a kernel library whose source includes the library's headers is
    compiled with ``-include`` of its ``.cpp`` (:func:`_build`), which GCC reads from the ``.cpp.gch`` beside it. Its
    checksum (a ~70 MB file) is computed once per process and file (:func:`_matches`)."""
    with _entry(PRELUDE_SOURCE, PRELUDE_NAME, PRELUDE_KIND) as prelude:
        yield prelude


def runtime_soname(include_dir: Path | None = None) -> str:
    """The soname of the runtime library of ``include_dir``'s headers (the current ones by default): the name a
    kernel library's ``DT_NEEDED`` gives it."""
    key = cache_key(RUNTIME_SOURCE, include_dir or paths.include_dir())
    return f"{RUNTIME_NAME}_{key[:24]}.so"


@contextlib.contextmanager
def _entry(source: str, name: str, kind: str) -> Iterator[Library]:
    include_dir = paths.include_dir()
    key = cache_key(source, include_dir)
    stem = f"{name}_{key[:24]}"
    directory = Path(tempfile.mkdtemp(prefix="dfg_sim_")) if env.jit_disable_cache() else library_dir()
    with cachedir.opened(directory, create=True) as d:
        fd = _open_verified(d, stem, key, kind)
        if fd is None:
            # Serialise with other processes building this entry; the winner's entry serves the rest.
            with d.lock(f"{stem}.lock"):
                fd = _open_verified(d, stem, key, kind, repair=True)
                if fd is None:
                    fd = _build(d, stem, name, source, include_dir, key, kind)
        try:
            yield Library(directory / f"{stem}.{kind}", fd)
        finally:
            os.close(fd)


def build_library(source: str, name: str) -> Path:
    """:func:`open_library`, for the path alone (the library is built and verified, not loaded)."""
    with open_library(source, name) as library:
        return library.path


def _open_verified(d: cachedir.OpenDir, stem: str, key: str, kind: str, *, repair: bool = False) -> int | None:
    """A descriptor of ``<stem>.<kind>`` (a library or the runtime) if it matches its sidecar, else
    None. With ``repair`` (call it only while holding the entry's lock) a mismatched entry, or one without a
    sidecar, is deleted."""
    try:
        meta = json.loads(d.read(f"{stem}.json"))
        fd = d.open(f"{stem}.{kind}")
    except (OSError, ValueError):  # absent, a link, not a file of the user's (or root's) alone, or not JSON
        fd = None
    else:
        if _matches(meta, key, fd, kind):
            return fd
        os.close(fd)
    if repair:
        for suffix in ("json", kind, "cpp"):  # the sidecar first: it vouches for the library
            d.unlink(f"{stem}.{suffix}")
    return None


# Precompiled headers this process checked: (device, inode, size, mtime, ctime) -> sha256. A write or a chmod changes
# ctime (which no user can set), so an entry whose identity is unchanged still holds the bytes that were hashed.
_CHECKED_PRELUDES: dict[tuple[int, ...], str] = {}


def _matches(meta: object, key: str, fd: int, kind: str = "so") -> bool:
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION and meta.get("key") == key):
        return False
    st = os.fstat(fd)
    if meta.get("bytes") != st.st_size:
        return False
    if kind != PRELUDE_KIND:
        return meta.get("sha256") == _sha256(fd)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if identity not in _CHECKED_PRELUDES:
        _CHECKED_PRELUDES[identity] = _sha256(fd)
    return meta.get("sha256") == _CHECKED_PRELUDES[identity]


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def _build(d: cachedir.OpenDir, stem: str, name: str, source: str, include_dir: Path, key: str, kind: str) -> int:
    """Compiles the entry ``stem`` and writes its sidecar; returns a descriptor of the file it verified. A kernel
    library is compiled instrumented and linked against the runtime library; the runtime is compiled and linked as
    a shared library whose soname is its entry's file name."""
    d.write_atomic(f"{stem}.cpp", source.encode())
    tmp = d.temp_name(f"{stem}.{kind}")
    obj = d.temp_name(f"{stem}.o")
    try:
        # The compiler gets the checked, resolved directory: nobody else can swap a link on its way. A library is
        # compiled and linked in two steps (one g++ call with -fsanitize=thread would link libtsan); the linker
        # reads the verified runtime library through this process's descriptor of it.
        cpp = os.path.join(d.real, f"{stem}.cpp")
        runtime_build = source == RUNTIME_SOURCE
        if runtime_build:
            steps = [("compile", [CXX, *RUNTIME_FLAGS, f"-I{include_dir}", "-c", cpp, "-o", os.path.join(d.real, obj)]),
                     ("link", [CXX, *RUNTIME_LINK_FLAGS, f"-Wl,-soname,{stem}.{kind}", os.path.join(d.real, obj),
                               "-o", os.path.join(d.real, tmp)])]
        elif source == PRELUDE_SOURCE:
            steps = [("precompile", [CXX, *FLAGS, *PRELUDE_FLAGS, f"-I{include_dir}", cpp,
                                     "-o", os.path.join(d.real, tmp)])]
        else:
            steps = [("compile", [CXX, *FLAGS, f"-I{include_dir}", "-c", cpp, "-o", os.path.join(d.real, obj)])]
        with contextlib.ExitStack() as stack:
            if uses_prelude(source) and not env.jit_disable_cache():  # (there, every entry is a fresh directory)
                # GCC reads <prelude>.cpp.gch for -include <prelude>.cpp, by path: this checked directory's (the
                # entry was verified just now and stays open; nobody else can write there).
                header = stack.enter_context(open_prelude()).path.name.removesuffix(".gch")
                steps[0][1][1:1] = ["-Winvalid-pch", "-include", os.path.join(d.real, header)]
            if not runtime_build and source != PRELUDE_SOURCE:
                runtime = stack.enter_context(open_runtime())
                steps.append(("link", [CXX, *LINK_FLAGS, os.path.join(d.real, obj), f"/proc/{os.getpid()}/fd/{runtime.fd}",
                                       "-o", os.path.join(d.real, tmp)]))
            for step, command in steps:
                proc = subprocess.run(command, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SimBuildError(f"simulator build of {name} failed ({CXX} {step} exit {proc.returncode})",
                                        log=proc.stderr)
        fd = d.open_built(tmp)
        try:
            record = {"format": FORMAT_VERSION, "key": key, "name": name, "compiler": compiler_identity(),
                      "bytes": os.fstat(fd).st_size, "sha256": _sha256(fd)}
            d.replace(tmp, f"{stem}.{kind}")
            d.write_atomic(f"{stem}.json", json.dumps(record, indent=1, sort_keys=True).encode())
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        d.unlink(obj)
        d.unlink(tmp)  # already renamed unless the build failed


def library_cache_info() -> dict:
    """``{"dir", "entries", "bytes"}`` of the library cache: entries = sidecars; bytes = all its files."""
    return cachedir.tally(library_dir(), _CACHE_FILE, ".json")


def library_cache_clear() -> int:
    """Deletes every file of the library cache (libraries, sources, sidecars, locks, stale temporaries);
    returns the number of entries removed. Libraries already loaded by a process stay loaded there."""
    return cachedir.clear(library_dir(), _CACHE_FILE, ".json")
