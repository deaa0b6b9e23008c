"""Runs simulated launches: loads a simulator library with ctypes and runs a stream of its kernels.

``launch`` runs one kernel, ``launch_stream`` several kernels of one translation unit in stream order (a
programmatic dependent launch may start before its predecessor ends, as with PDL on the GPU). Both go through
``extern "C" int dfg_sim_run_stream(const dfg::sim::StreamItem*, u32)`` with the kernels' descriptions from
``<name>_sim_kernel()`` (``DFG_DEFINE_KERNEL`` in ``include/deep_fp8_gemm/hal/sim.hpp``); :class:`LaunchConfig`
and :class:`StreamItem` mirror the C++ structs byte for byte. Inside ``with stream():`` every launch, of any kernel
library, joins one simulated stream, and a launch made with ``programmatic=True`` (the ops pass the PDL flag,
:func:`deep_fp8_gemm.set_pdl`) is a programmatic dependent launch of the one before it: the ops' own launch
sequence under PDL.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import threading
from collections.abc import Iterator, Sequence

from .. import env
from ..runtime import paths
from .build import RUNTIME_SOURCE, cache_key, open_library, open_runtime

# Fill shared memory with zeros instead of the 0xFF poison (dfg::sim::kFlagZeroSmem).
FLAG_ZERO_SMEM = 1
# wgmma accumulates in exact fp32 instead of the tensor-core model (dfg::sim::kFlagExactMma).
FLAG_EXACT_MMA = 2
# No race detection (dfg::sim::kFlagNoRaces); set from DFG_SIM_RACES=0.
FLAG_NO_RACES = 4
_PARAMS_ALIGNMENT = 128  # TensorMaps inside the parameter struct are 64-byte aligned; CUDA gives 128
# One launch at a time per process: a launch owns its library's state and the process's SIGSEGV / SIGBUS
# handlers (which turn a fault inside a simulated thread into a SimulationError).
_LAUNCH_LOCK = threading.Lock()


class SimulationError(RuntimeError):
    """A simulated launch failed: deadlock, timeout, a hardware-rule violation or ``trap``. The message is
    the simulator's report."""


class LaunchConfig(ctypes.Structure):
    """``dfg::sim::LaunchConfig`` (48 bytes)."""

    _fields_ = [
        ("grid_x", ctypes.c_uint32),
        ("block_x", ctypes.c_uint32),
        ("cluster_x", ctypes.c_uint32),
        ("dynamic_smem_bytes", ctypes.c_uint32),
        ("max_steps", ctypes.c_uint64),
        ("timeout_s", ctypes.c_double),
        ("flags", ctypes.c_uint32),
        ("launch_registers", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
    ]


assert ctypes.sizeof(LaunchConfig) == 48 and LaunchConfig.timeout_s.offset == 24 and LaunchConfig.flags.offset == 32
assert LaunchConfig.launch_registers.offset == 36 and LaunchConfig.seed.offset == 40


class StreamItem(ctypes.Structure):
    """``dfg::sim::StreamItem`` (72 bytes)."""

    _fields_ = [
        ("kernel", ctypes.c_void_p),
        ("params", ctypes.c_void_p),
        ("cfg", LaunchConfig),
        ("programmatic", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


assert ctypes.sizeof(StreamItem) == 72 and StreamItem.cfg.offset == 16 and StreamItem.programmatic.offset == 64


@dataclasses.dataclass(frozen=True)
class StreamLaunch:
    """One launch of :func:`launch_stream`: kernel ``name`` of the stream's translation unit with the raw bytes
    of its parameter struct, ``grid`` CTAs of ``block`` threads, ``cluster`` CTAs per cluster, ``smem_bytes`` of
    dynamic shared memory, ``registers`` and ``flags`` as for :func:`launch`. ``programmatic``: a programmatic
    dependent launch (PDL), which may start once every CTA of the previous launch executed
    ``griddepcontrol.launch_dependents`` (or exited) and is ordered after it only by ``griddepcontrol.wait``."""

    name: str
    params: bytes
    grid: int
    block: int
    cluster: int = 1
    smem_bytes: int = 0
    registers: int = 0
    flags: int = 0
    programmatic: bool = False


_LIBRARIES: dict[tuple[str, str], tuple[ctypes.CDLL, str]] = {}  # (kernel name, build key) -> (library, runtime key)
_RUNTIMES: dict[str, ctypes.CDLL] = {}  # by the runtime's build key
_OPEN: list = []  # the open stream (stream()): [its runtime key, launches so far]; empty when none is


def _runtime() -> tuple[ctypes.CDLL, str]:
    """The runtime library of the current headers (the emulation and its state, one per process and headers), loaded
    once: before any kernel library that links it, whose ``DT_NEEDED`` names its soname (the dynamic loader then
    binds to this loaded file, never searches the disk for it). Its entry points are set up here."""
    key = cache_key(RUNTIME_SOURCE, paths.include_dir())
    runtime = _RUNTIMES.get(key)
    if runtime is None:
        with open_runtime() as library:
            fd = os.dup(library.fd)
        runtime = ctypes.CDLL(f"/proc/self/fd/{fd}")  # RTLD_LOCAL, and its soname is matched by the kernel libraries
        runtime.dfg_sim_last_error.restype = ctypes.c_char_p
        runtime.dfg_sim_last_error.argtypes = []
        runtime.dfg_sim_run_stream.restype = ctypes.c_int
        runtime.dfg_sim_run_stream.argtypes = [ctypes.POINTER(StreamItem), ctypes.c_uint32]
        runtime.dfg_sim_stream_open.restype = ctypes.c_int
        runtime.dfg_sim_stream_open.argtypes = []
        runtime.dfg_sim_stream_close.restype = None
        runtime.dfg_sim_stream_close.argtypes = []
        runtime.dfg_sim_tma_load_bytes.restype = ctypes.c_ulonglong
        runtime.dfg_sim_tma_load_bytes.argtypes = []
        _RUNTIMES[key] = runtime
    return runtime, key


def _load(source: str, name: str) -> tuple[ctypes.CDLL, str]:
    """The library of ``source``, loaded once per process and build key, and the key of the runtime it links.

    ``dlopen`` opens the very file :func:`.build.open_library` verified, through a duplicate of its
    descriptor (``/proc/self/fd/N``), so nothing can be swapped in between the check and the load. That
    duplicate stays open for the life of the process (as the library stays mapped): glibc recognises a
    loaded library by the name it was opened under, so ``/proc/self/fd/N`` must never come back naming
    another file. The runtime it links is loaded first (:func:`_runtime`).
    """
    key = (name, cache_key(source, paths.include_dir()))
    entry = _LIBRARIES.get(key)
    if entry is None:
        _, runtime_key = _runtime()
        with open_library(source, name) as library:
            fd = os.dup(library.fd)
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")  # RTLD_LOCAL: libraries never resolve symbols against each other
        entry = _LIBRARIES[key] = (lib, runtime_key)
    return entry


def _kernel_info(lib: ctypes.CDLL, name: str) -> int:
    try:
        fn = getattr(lib, f"{name}_sim_kernel")
    except AttributeError:
        raise ValueError(f"the simulator library defines no kernel {name!r} (DFG_DEFINE_KERNEL)") from None
    fn.restype = ctypes.c_void_p
    fn.argtypes = []
    return fn()


def _aligned_copy(params: bytes) -> tuple[ctypes.Array, int]:
    raw = ctypes.create_string_buffer(len(params) + _PARAMS_ALIGNMENT)
    base = ctypes.addressof(raw)
    aligned = (base + _PARAMS_ALIGNMENT - 1) // _PARAMS_ALIGNMENT * _PARAMS_ALIGNMENT
    ctypes.memmove(aligned, params, len(params))
    return raw, aligned


def _stream_flags(flags: int) -> int:
    """``flags`` plus those of the environment: DFG_SIM_EXACT_MMA=1, DFG_SIM_RACES=0."""
    if env.sim_exact_mma():
        flags |= FLAG_EXACT_MMA
    if env.sim_races() == "off":
        flags |= FLAG_NO_RACES
    return flags


def ptxas_registers(name: str, source: str) -> int:
    """Registers per thread ptxas allocates for kernel ``name`` of ``source`` built for sm_90a (the device
    build of the same translation unit, through the JIT's compile cache), or 0 when NVRTC is not installed
    (the simulator then does not account the register pool).

    Raises:
        CompileError: the source does not compile for sm_90a.
    """
    from ..runtime import compiler

    if not compiler.nvrtc_available():
        return 0
    return compiler.compile_kernel(name, source).resources.registers


def launch(
    name: str,
    source: str,
    params: bytes,
    *,
    grid: int,
    block: int,
    cluster: int,
    smem_bytes: int,
    timeout_s: float | None = None,
    max_steps: int = 0,
    flags: int = 0,
    registers: int = 0,
    seed: int | None = None,
    programmatic: bool = False,
) -> None:
    """Builds (cached) and runs kernel ``name`` of the translation unit ``source`` on the CPU.

    ``params`` is the raw bytes of the kernel's parameter struct (tensor maps inside it packed by
    :func:`~deep_fp8_gemm.simulator.pack_tensor_map`, pointers are host addresses of CPU tensors that
    the caller keeps alive); it is copied into a 128-byte-aligned buffer. ``grid`` CTAs of ``block``
    threads, ``cluster`` consecutive CTAs per cluster, ``smem_bytes`` dynamic shared memory per CTA.
    ``timeout_s`` (wall clock; None = ``DFG_SIM_TIMEOUT_SECONDS``, default 600: a deadlock is reported at once
    anyway, the bound only stops a livelock) and ``max_steps`` (fiber resumptions, 0 = unlimited) bound the run.
    ``registers``: registers per thread at launch, as ptxas reports for the sm_90a build of the same source
    (0 = unknown: the pool is sized by ``__launch_bounds__``); the simulator accounts ``setmaxnreg`` against
    that per-CTA pool. ``seed``: the schedule (0 = round-robin; others seeded adversarial schedules; None =
    ``DFG_SIM_SEED``, default 0). ``DFG_SIM_EXACT_MMA=1`` adds :data:`FLAG_EXACT_MMA` (exact fp32 wgmma),
    ``DFG_SIM_RACES=0`` :data:`FLAG_NO_RACES` (no race detection). Inside ``with stream():`` the launch joins the
    open stream, and ``programmatic`` (the PDL flag the ops pass) makes it a programmatic dependent launch of the
    stream's previous launch; outside one it has no predecessor and runs as a plain launch (as the first kernel of a
    CUDA stream does).

    Raises:
        SimBuildError: the translation unit did not compile.
        SimulationError: the launch failed; the message is the simulator's report.
    """
    # A PDL launch depends on the stream's previous launch: there is none outside an open stream, or at its start.
    dependent = programmatic and bool(_OPEN) and _OPEN[1] > 0
    one = StreamLaunch(name, params, grid, block, cluster, smem_bytes, registers, flags, dependent)
    launch_stream(source, [one], timeout_s=timeout_s, max_steps=max_steps, seed=seed)


def launch_stream(source: str, launches: Sequence[StreamLaunch], *, timeout_s: float | None = None,
                  max_steps: int = 0, seed: int | None = None) -> None:
    """Builds (cached) the translation unit ``source`` and runs ``launches`` of its kernels as one stream.

    Each launch starts after the previous one ended, except a ``programmatic`` one (PDL), which starts as soon as
    every CTA of the previous launch executed ``griddepcontrol.launch_dependents`` or exited, and runs alongside
    it: only ``griddepcontrol.wait`` (``hal::grid_dependency_wait``) orders its accesses after the previous
    kernel's. The shadow memory of the race detector lives for the whole stream, so an access of one kernel that
    conflicts with another kernel's without that order is reported. The library is named after the first
    launch's kernel; ``timeout_s``, ``max_steps`` and ``seed`` (as for :func:`launch`) apply to the whole stream,
    as do the first launch's :data:`FLAG_NO_RACES`.

    Raises:
        ValueError: an empty stream, a kernel the library lacks, a seed or register count out of range.
        SimBuildError: the translation unit did not compile.
        SimulationError: a launch failed; the message is the simulator's report.
    """
    if not launches:
        raise ValueError("launch_stream needs at least one launch")
    if seed is None:
        seed = env.sim_seed()
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if timeout_s is None:
        timeout_s = env.sim_timeout_seconds()
    lib, runtime_key = _load(source, launches[0].name)
    if _OPEN and _OPEN[0] != runtime_key:
        raise ValueError(f"kernel {launches[0].name!r} links the simulator runtime of other headers than the open "
                         "stream's (the headers changed inside `with stream():`)")
    runtime = _RUNTIMES[runtime_key]
    items = (StreamItem * len(launches))()
    buffers = []  # the aligned parameter copies, alive until the stream ran
    for item, spec in zip(items, launches):
        if not 0 <= spec.registers <= 255:
            raise ValueError(f"registers must be in [0, 255], got {spec.registers}")
        raw, aligned = _aligned_copy(spec.params)
        buffers.append(raw)
        item.kernel = _kernel_info(lib, spec.name)
        item.params = aligned
        item.cfg = LaunchConfig(spec.grid, spec.block, spec.cluster, spec.smem_bytes, max_steps, timeout_s,
                                _stream_flags(spec.flags), spec.registers, seed)
        item.programmatic = int(spec.programmatic)
    with _LAUNCH_LOCK:
        status = runtime.dfg_sim_run_stream(items, len(launches))
        report = runtime.dfg_sim_last_error().decode(errors="replace") if status != 0 else ""
        if _OPEN:
            _OPEN[1] += len(launches)
    if status != 0:
        raise SimulationError(report)


@contextlib.contextmanager
def stream() -> Iterator[None]:
    """Every simulated launch made inside the block, of any kernel library (a quantiser, then a GEMM, as the ops
    launch them), joins one stream: each is ordered after the one before it by the kernel boundary, or, when
    launched ``programmatic`` (what the ops do under :func:`deep_fp8_gemm.set_pdl`), only by
    ``griddepcontrol.wait``, as a programmatic dependent launch (PDL) is on the GPU. Each launch still runs to its end
    before its call returns (the ops' results are there as usual), but the race detector keeps the whole stream's
    accesses: a kernel that touches its predecessor's memory before its ``griddepcontrol.wait``, or one that never
    waits, is reported as ``pdl`` (README, "CPU simulator"). Host work between two launches of the block (a torch op
    writing a tensor a kernel reads) is not seen: on the GPU it would be a kernel of its own between them, so keep
    the block to back-to-back launches. Streams do not nest; a failed launch fails the rest of the block's launches.

    Raises:
        SimulationError: a stream is already open.
    """
    runtime, key = _runtime()
    with _LAUNCH_LOCK:
        if _OPEN or runtime.dfg_sim_stream_open() != 0:
            raise SimulationError("a simulator stream is already open (streams do not nest)")
        _OPEN[:] = [key, 0]
    try:
        yield
    finally:
        with _LAUNCH_LOCK:
            _OPEN.clear()
            runtime.dfg_sim_stream_close()


def tma_load_bytes() -> int:
    """Global bytes the simulated TMA loads of this process have read so far (each load's in-bounds box elements,
    once however many CTAs a multicast writes; hal/sim/tma.hpp). The difference across a launch is that launch's
    operand traffic through TMA; its plain global loads (e.g. ``masked_m``) are not counted."""
    runtime, _ = _runtime()
    return int(runtime.dfg_sim_tma_load_bytes())

