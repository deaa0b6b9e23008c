"""NVRTC: rendered CUDA source -> sm_90a CUBIN (never PTX for the driver), through the cache.

``compile_kernel`` looks in the in-process cache, then on disk, and only then compiles. The device
headers include nothing from the CUDA toolkit, so NVRTC needs no include path but our own and a cold
compile costs a few tenths of a second (NOTES below) instead of the 1-2 s that parsing CUTLASS/CCCL headers
alone takes.

NOTES (measured, 2-core CI machine, NVRTC 13.5): a dense GEMM compiles in 0.25-0.4 s, most of it ptxas;
the first compile in a process adds ~0.1 s of NVRTC start-up. ``--minimal`` (NVRTC >= 12.4) made no
measurable difference for our toolkit-free sources, so it is not used. Works with libnvrtc 12.x
(cuda-bindings 12.x) and 13.x: only API calls present since CUDA 11.1 are used, and every option exists
in both.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from .. import env
from . import cache, cachedir
from .paths import include_dir
from .resources import KernelResources, parse_ptxas_log

DEFAULT_ARCH = "sm_90a"
_INCLUDE_TOKEN = "-I<include_dir>"  # how the machine-specific include path enters the cache key
_SAVED_SOURCE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*-[0-9a-f]{16}\.cu|\..*\.tmp)$")


class CompileError(RuntimeError):
    """NVRTC rejected a source. ``log`` is NVRTC's log; ``source_path`` the saved rendered source."""

    def __init__(self, message: str, *, log: str = "", source_path: Path | None = None):
        super().__init__(message)
        self.log = log
        self.source_path = source_path


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """A compiled kernel, ready for the driver (``runtime.driver`` loads it with ``cuLibraryLoadData``).

    ``name`` is the ``extern "C"`` entry symbol; ``compile_seconds`` the NVRTC time when it was built
    (also for cache hits); ``cache_hit`` is ``"memory"``, ``"disk"`` or ``""`` (compiled now);
    ``key`` the cache key; ``source_path`` the dumped source (``DFG_JIT_DEBUG``) or None.
    """

    name: str
    cubin: bytes
    ptxas_log: str
    resources: KernelResources
    compile_seconds: float
    cache_hit: str
    key: str
    source_path: Path | None = None


# ---------------------------------------------------------------------------------------- NVRTC
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:  # cuda-python < 12.6 exposed the same API as cuda.nvrtc
            from cuda import nvrtc
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise RuntimeError("deep_fp8_gemm's JIT needs cuda-bindings and NVRTC: "
                               "pip install cuda-bindings nvidia-cuda-nvrtc") from exc
    return nvrtc


def nvrtc_available() -> bool:
    """True when the NVRTC bindings import (the JIT can compile here)."""
    try:
        _nvrtc()
    except RuntimeError:
        return False
    return True


def _check(result: tuple, what: str):
    """Unpacks a cuda.bindings ``(nvrtcResult, *values)`` tuple, raising on an error code."""
    nvrtc = _nvrtc()
    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(status)
        raise RuntimeError(f"{what} failed: {text.decode(errors='replace') if isinstance(text, bytes) else text}")
    return values[0] if len(values) == 1 else values


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the loaded libnvrtc."""
    major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def compiler_identity() -> str:
    """Compiler identity for the cache key: NVRTC version and the cuda-bindings version that drives it."""
    try:
        from cuda.bindings import __version__ as bindings_version
    except ImportError:  # pragma: no cover
        bindings_version = "unknown"
    major, minor = nvrtc_version()
    return f"nvrtc-{major}.{minor}/cuda-bindings-{bindings_version}"


def nvrtc_options(arch: str = DEFAULT_ARCH, options: Sequence[str] = ()) -> list[str]:
    """The full NVRTC option list: target (a real ``sm_`` arch makes NVRTC emit a CUBIN), C++17, ``--minimal``,
    our include directory, the ptxas report, then the caller's ``options``.

    ``--minimal`` (NVRTC >= 12.4; this package needs 13): NVRTC leaves out the texture / surface API, the device
    runtime's ``cuda*`` functions, device-side launches and the runtime's types, none of which our headers use; the
    front end parses less. Issue 45: every kernel of ``audit --kind all`` (321) compiles to the same cubin, bit for
    bit, 2.5% faster in total and ~4% on the DeepSeek-V3 dense set."""
    base = [f"--gpu-architecture={arch}", "-std=c++17", "--minimal", _INCLUDE_TOKEN, "--ptxas-options=-v"]
    return [f"-I{include_dir()}" if o == _INCLUDE_TOKEN else o for o in base] + list(options)


def watchdog_options() -> tuple[str, ...]:
    """``("-DDFG_WATCHDOG_NS=<ns>ull",)`` when ``DFG_WATCHDOG_SECONDS`` is set (the watchdog build of
    include/deep_fp8_gemm/hal/ptx.cuh), else ``()`` (the plain build: no watchdog code at all)."""
    ns = env.watchdog_ns()
    return (f"-DDFG_WATCHDOG_NS={ns}ull",) if ns else ()


def _key_options(arch: str, options: Sequence[str]) -> list[str]:
    # The include path differs between installations but not the binary (the headers' content is in
    # the key), so the key sees a fixed token instead: entries stay valid across venvs.
    return [_INCLUDE_TOKEN if o == f"-I{include_dir()}" else o for o in nvrtc_options(arch, options)]


def _get_bytes(prog, size_fn, get_fn, what: str) -> bytes:
    size = _check(size_fn(prog), what)
    buffer = b" " * size
    _check(get_fn(prog, buffer), what)
    return buffer.rstrip(b"\0")  # sizes include the terminating NUL for text results


@dataclasses.dataclass(frozen=True)
class _NvrtcOutput:
    cubin: bytes  # empty when the compile failed
    ptx: str
    log: str
    seconds: float
    status: str = "NVRTC_SUCCESS"


def _nvrtc_compile(name: str, source: str, options: list[str], want_ptx: bool) -> _NvrtcOutput:
    nvrtc = _nvrtc()
    start = time.perf_counter()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in options]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _get_bytes(prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, "nvrtcGetProgramLog")
        log_text = log.decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return _NvrtcOutput(b"", "", log_text, time.perf_counter() - start, getattr(status, "name", str(status)))
        cubin = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        buffer = b" " * cubin
        _check(nvrtc.nvrtcGetCUBIN(prog, buffer), "nvrtcGetCUBIN")
        ptx = ""
        if want_ptx:
            ptx = _get_bytes(prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "nvrtcGetPTX").decode(errors="replace")
        return _NvrtcOutput(buffer, ptx, log_text, time.perf_counter() - start)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def errors_dir() -> Path:
    """Where sources that failed to compile are saved: ``<cache>/errors`` (:func:`.cachedir.cache_root`)."""
    return cachedir.cache_root() / "errors"


def _save_failed_source(name: str, key: str, source: str) -> Path:
    """Writes a source that failed to compile where the user can open it: :func:`errors_dir`, or a fresh
    private temporary directory when that one is unusable or refused; returns the path."""
    filename = f"{name}-{key[:16]}.cu"
    try:
        return _save_private(errors_dir(), filename, source)
    except (OSError, cachedir.UnsafeCacheDirError):  # the compile error matters more than where it is saved
        return _save_private(Path(tempfile.mkdtemp(prefix="deep_fp8_gemm_errors-")), filename, source)


def _save_private(directory: Path, filename: str, source: str) -> Path:
    with cachedir.opened(directory, create=True) as d:
        d.write_atomic(filename, source.encode())
    return directory / filename


def saved_sources_info() -> dict:
    """``{"dir", "entries", "bytes"}`` of the saved failing sources in :func:`errors_dir`."""
    return cachedir.tally(errors_dir(), _SAVED_SOURCE, ".cu")


def saved_sources_clear() -> int:
    """Deletes the saved failing sources in :func:`errors_dir`; returns how many there were."""
    return cachedir.clear(errors_dir(), _SAVED_SOURCE, ".cu")


# ---------------------------------------------------------------------------------------- entry point
def compile_kernel(
    name: str, source: str, *, arch: str = DEFAULT_ARCH, options: Sequence[str] = ()
) -> CompiledKernel:
    """The CUBIN of the ``extern "C"`` kernel ``name`` defined in ``source``, from cache or NVRTC.

    Args:
        name: entry symbol (must be defined by ``source``; part of the cache key).
        source: a complete translation unit (normally from :func:`.render.render`).
        arch: NVRTC target; ``"sm_90a"`` is needed for wgmma / setmaxnreg.
        options: extra NVRTC options, one flag per element.

    Raises:
        CompileError: NVRTC failed; the message carries its log and the saved source path.

    With ``DFG_WATCHDOG_SECONDS`` set, :func:`watchdog_options` are appended: a different binary, so a
    different key in both caches.
    """
    options = tuple(options) + watchdog_options()
    memory_key = (name, source, arch, options, cache.headers_digest())
    hit = cache.memory_get(memory_key)
    if hit is not None:
        return hit

    key = cache.cache_key(source, _key_options(arch, options), arch, compiler_id=compiler_identity(),
                          header_digest=memory_key[-1])
    kernel = _load_or_compile(name, source, arch, options, key)
    # Store the variant later hits return, so a hit is a dict lookup and nothing else.
    cache.memory_put(memory_key, dataclasses.replace(kernel, cache_hit="memory"))
    return kernel


def cached_kernel(
    name: str, source: str, *, arch: str = DEFAULT_ARCH, options: Sequence[str] = ()
) -> CompiledKernel | None:
    """The disk cache's verified entry for what :func:`compile_kernel` would build from these arguments (the same
    key: source, options, arch, this NVRTC, the headers), or None when the cache lacks it (or it is damaged, or
    the cache is disabled or unusable). Never compiles: ``precompile --check`` asks which kernels a shipped cache
    lacks, and times the warm start (reading and verifying each cubin)."""
    if env.jit_disable_cache():
        return None
    options = tuple(options) + watchdog_options()
    key = cache.cache_key(source, _key_options(arch, options), arch, compiler_id=compiler_identity(),
                          header_digest=cache.headers_digest())
    try:
        entry = cache.disk_cache().load(key)
    except (OSError, cachedir.NotADirectoryCacheError):
        return None
    return None if entry is None else _from_entry(entry, key)


def _load_or_compile(name: str, source: str, arch: str, options: tuple, key: str) -> CompiledKernel:
    if env.jit_disable_cache():
        return _compile(name, source, arch, options, key, disk=None)
    disk = cache.disk_cache()
    entry = disk.load(key)
    if entry is None:
        try:
            # Serialise with other processes building this key; the winner's entry serves the rest.
            with disk.lock(key):
                entry = disk.load(key, repair=True)
                if entry is None:
                    return _compile(name, source, arch, options, key, disk=disk)
        except (OSError, cachedir.NotADirectoryCacheError) as exc:  # read-only, full, or a file in the way: still
            # compile, just do not cache
            warnings.warn(f"deep_fp8_gemm JIT cache {disk.directory} is unusable ({exc}); compiling "
                          "without it (set DFG_JIT_CACHE_DIR to a writable directory)", RuntimeWarning, stacklevel=3)
            return _compile(name, source, arch, options, key, disk=None)
    return _from_entry(entry, key)


def _from_entry(entry: cache.DiskEntry, key: str) -> CompiledKernel:
    meta = entry.meta
    source_path = Path(meta["source_path"]) if meta.get("source_path") else None
    return CompiledKernel(
        name=str(meta["name"]),
        cubin=entry.cubin,
        ptxas_log=str(meta["ptxas_log"]),
        resources=KernelResources.from_json(meta["resources"]),
        compile_seconds=float(meta["compile_seconds"]),
        cache_hit="disk",
        key=key,
        source_path=source_path,
    )


def _compile(name: str, source: str, arch: str, options: tuple, key: str, disk: cache.DiskCache | None) -> CompiledKernel:
    debug = env.jit_debug()
    out = _nvrtc_compile(name, source, nvrtc_options(arch, options), want_ptx=debug)
    if not out.cubin:
        path = _save_failed_source(name, key, source)
        raise CompileError(f"NVRTC failed to compile kernel {name} for {arch} ({out.status}; source saved to "
                           f"{path}):\n{out.log.strip()}", log=out.log, source_path=path)
    resources = parse_ptxas_log(out.log, name)
    if env.jit_ptxas_verbose():
        print(f"[deep_fp8_gemm] ptxas report for {name}:\n{out.log.strip()}", file=sys.stderr)

    source_path = None
    if debug:
        source_path = _dump_debug(key, source, out, disk)
        print(f"[deep_fp8_gemm] compiled {name} in {out.seconds:.3f} s: {resources.registers} registers, "
              f"{resources.spill_bytes} spill bytes, warnings {list(resources.warnings)}; dumps at {source_path}",
              file=sys.stderr)
    if disk is not None:
        disk.store(key, out.cubin, {
            "name": name, "arch": arch, "options": list(options), "ptxas_log": out.log,
            "resources": resources.to_json(), "compile_seconds": out.seconds,
            "compiler": compiler_identity(), "source_path": str(source_path) if source_path else None,
        })
    return CompiledKernel(name, out.cubin, out.log, resources, out.seconds, "", key, source_path)


def _dump_debug(key: str, source: str, out: _NvrtcOutput, disk: cache.DiskCache | None) -> Path:
    """``DFG_JIT_DEBUG``: writes source, PTX and SASS beside the cache entry (also when the disk cache is
    disabled: dumps are not cache entries). Returns the source path."""
    target = disk or cache.disk_cache()
    target.write_atomic(target.path(key, "cu"), source.encode())
    target.write_atomic(target.path(key, "ptx"), out.ptx.encode())
    try:
        from .sass import disassemble

        target.write_atomic(target.path(key, "sass"), disassemble(out.cubin).encode())
    except RuntimeError as exc:  # no disassembler: the dump is best-effort, the compile is not
        print(f"[deep_fp8_gemm] no SASS dump: {exc}", file=sys.stderr)
    return target.path(key, "cu")
