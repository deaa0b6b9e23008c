"""Compiles a rendered kernel translation unit with the host C++ compiler into a simulator library.

The translation unit is the very source NVRTC compiles for sm_90a; ``-DDFG_SIMULATOR`` makes
``deep_fp8_gemm/hal.cuh`` pick the CPU emulation (``hal/sim.hpp``). ``-fsanitize=thread`` instruments every plain
load and store of the kernel code with a call that the simulator itself defines (``hal/sim/instrument.hpp``: the
race detector's view of shared and global memory); the library is linked without the ThreadSanitizer runtime
(``-z defs`` makes a hook the simulator lacks a build error), and ``-g1`` gives ``addr2line`` the line tables
that name an access's call site in a report. Libraries are cached like cubins:
``<DFG_JIT_CACHE_DIR>/sim/<name>_<key>.so`` (with the source beside it as ``.cpp``), the key a SHA-256 over
the source, every header under the include directory, the compiler's identity and the flags. Files are
written under temporary names and renamed into place, so concurrent builders never see a partial library.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

from .. import env
from ..runtime import paths

CXX = "g++"
# -fvisibility=hidden: only the entry points (DFG_SIM_EXPORT) are exported, so two simulator libraries in
# one process never bind each other's inline simulator state.
# -fno-threadsafe-statics: a launch runs on one OS thread (fibers; launches are serialised), and thread-safe
# statics would need ThreadSanitizer's atomic hooks.
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-DDFG_SIMULATOR", "-g1", "-fsanitize=thread",
         "--param=tsan-instrument-func-entry-exit=0", "-fno-threadsafe-statics")
LINK_FLAGS = ("-shared", "-Wl,-z,defs", "-ldl")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def build_library(source: str, name: str) -> Path:
    """Compiles ``source`` (a rendered kernel translation unit) for the simulator; returns the ``.so`` path.

    ``name`` is the kernel's symbol (C identifier); the library exports ``<name>_sim`` and
    ``dfg_sim_last_error``. With ``DFG_JIT_DISABLE_CACHE=1`` the library is built into a fresh temporary
    directory and no cached library is reused.

    Raises:
        ValueError: ``name`` is not a C identifier.
        SimBuildError: the compiler failed (the message carries its log).
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"kernel name must be a C identifier, got {name!r}")
    include_dir = paths.include_dir()
    key = cache_key(source, include_dir)
    if env.jit_disable_cache():
        directory = Path(tempfile.mkdtemp(prefix="dfg_sim_"))
    else:
        directory = env.jit_cache_dir() / "sim"
        directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}_{key[:24]}.so"
    if target.is_file():
        return target

    # The source is kept beside the library: compiler messages (and debuggers) point into it.
    source_path = target.with_suffix(".cpp")
    _write_atomic(source_path, source.encode())
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    obj = tmp.with_suffix(".o")
    try:
        # Compiled and linked in two steps: one g++ call with -fsanitize=thread would link libtsan.
        for step, command in (
            ("compile", [CXX, *FLAGS, f"-I{include_dir}", "-c", str(source_path), "-o", str(obj)]),
            ("link", [CXX, *LINK_FLAGS, str(obj), "-o", str(tmp)]),
        ):
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SimBuildError(f"simulator build of {name} failed ({CXX} {step} exit {proc.returncode})",
                                    log=proc.stderr)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        obj.unlink(missing_ok=True)
    return target
