"""Compiles a rendered kernel translation unit with the host C++ compiler into a simulator library.

The translation unit is the very source NVRTC compiles for sm_90a; ``-DDFG_SIMULATOR`` makes
``deep_fp8_gemm/hal.cuh`` pick the CPU emulation (``hal/sim.hpp``). ``-fsanitize=thread`` instruments every plain
load and store of the kernel code with a call that the simulator itself defines (``hal/sim/instrument.hpp``: the
race detector's view of shared and global memory); the library is linked without the ThreadSanitizer runtime
(``-z defs`` makes a hook the simulator lacks a build error), and ``-g1`` gives ``addr2line`` the line tables
that name an access's call site in a report. Libraries are cached like cubins, in
``<cache>/sim/`` (:func:`library_dir`), each entry three files named ``<name>_<key[:24]>``:

* ``.cpp``  — the source, kept beside the library: compiler messages (and debuggers) point into it;
* ``.so``   — the library, built under a temporary name and renamed into place;
* ``.json`` — its sidecar (format, full key, size and sha256 of the library), written last, so a sidecar
  only ever exists next to the library it describes.

The key is a SHA-256 over the source, every header under the include directory, the compiler's identity and
the flags. A library is loaded only through :func:`open_library`: it opens the file relative to the checked
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
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-DDFG_SIMULATOR", "-g1", "-fsanitize=thread",
         "--param=tsan-instrument-func-entry-exit=0", "-fno-threadsafe-statics")
LINK_FLAGS = ("-shared", "-Wl,-z,defs", "-ldl")
# Bump when the entry layout or the sidecar schema changes: old entries then simply miss.
FORMAT_VERSION = 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Entries and locks, and the temporaries of interrupted builds: what info and clear count as the cache's.
_CACHE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*_[0-9a-f]{24}\.(so|json|cpp|lock)|\..*\.tmp)$")


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


def cache_key(source: str, include_dir: Path) -> str:
    """SHA-256 over everything that changes the library: source, headers, compiler, flags."""
    h = hashlib.sha256()
    for part in (source, compiler_identity(), " ".join(FLAGS), " ".join(LINK_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    for header in paths.header_files(include_dir):
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
    include_dir = paths.include_dir()
    key = cache_key(source, include_dir)
    stem = f"{name}_{key[:24]}"
    directory = Path(tempfile.mkdtemp(prefix="dfg_sim_")) if env.jit_disable_cache() else library_dir()
    with cachedir.opened(directory, create=True) as d:
        fd = _open_verified(d, stem, key)
        if fd is None:
            # Serialise with other processes building this library; the winner's entry serves the rest.
            with d.lock(f"{stem}.lock"):
                fd = _open_verified(d, stem, key, repair=True)
                if fd is None:
                    fd = _build(d, stem, name, source, include_dir, key)
        try:
            yield Library(directory / f"{stem}.so", fd)
        finally:
            os.close(fd)


def build_library(source: str, name: str) -> Path:
    """:func:`open_library`, for the path alone (the library is built and verified, not loaded)."""
    with open_library(source, name) as library:
        return library.path


def _open_verified(d: cachedir.OpenDir, stem: str, key: str, *, repair: bool = False) -> int | None:
    """A descriptor of ``<stem>.so`` if it matches its sidecar, else None. With ``repair`` (call it only
    while holding the entry's lock) a mismatched entry, or a library without a sidecar, is deleted."""
    try:
        meta = json.loads(d.read(f"{stem}.json"))
        fd = d.open(f"{stem}.so")
    except (OSError, ValueError):  # absent, a link, not a file of the user's (or root's) alone, or not JSON
        fd = None
    else:
        if _matches(meta, key, fd):
            return fd
        os.close(fd)
    if repair:
        for suffix in ("json", "so", "cpp"):  # the sidecar first: it vouches for the library
            d.unlink(f"{stem}.{suffix}")
    return None


def _matches(meta: object, key: str, fd: int) -> bool:
    return (
        isinstance(meta, dict)
        and meta.get("format") == FORMAT_VERSION
        and meta.get("key") == key
        and meta.get("bytes") == os.fstat(fd).st_size
        and meta.get("sha256") == _sha256(fd)
    )


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def _build(d: cachedir.OpenDir, stem: str, name: str, source: str, include_dir: Path, key: str) -> int:
    """Compiles the entry ``stem`` and writes its sidecar; returns a descriptor of the library it verified."""
    d.write_atomic(f"{stem}.cpp", source.encode())
    tmp = d.temp_name(f"{stem}.so")
    obj = d.temp_name(f"{stem}.o")
    try:
        # The compiler gets the checked, resolved directory: nobody else can swap a link on its way. Compiled and
        # linked in two steps: one g++ call with -fsanitize=thread would link libtsan.
        for step, command in (
            ("compile", [CXX, *FLAGS, f"-I{include_dir}", "-c", os.path.join(d.real, f"{stem}.cpp"), "-o",
                         os.path.join(d.real, obj)]),
            ("link", [CXX, *LINK_FLAGS, os.path.join(d.real, obj), "-o", os.path.join(d.real, tmp)]),
        ):
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SimBuildError(f"simulator build of {name} failed ({CXX} {step} exit {proc.returncode})",
                                    log=proc.stderr)
        fd = d.open_built(tmp)
        try:
            record = {"format": FORMAT_VERSION, "key": key, "name": name, "compiler": compiler_identity(),
                      "bytes": os.fstat(fd).st_size, "sha256": _sha256(fd)}
            d.replace(tmp, f"{stem}.so")
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
