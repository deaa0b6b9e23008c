"""Runs one simulated launch: loads a simulator library with ctypes and calls its kernel entry point.

The entry point is ``extern "C" int <name>_sim(const Params*, const dfg::sim::LaunchConfig*)``
(``DFG_DEFINE_KERNEL`` in ``include/deep_fp8_gemm/hal/sim.hpp``); :class:`LaunchConfig` mirrors the C++
struct byte for byte.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .. import env
from ..runtime import paths
from .build import cache_key, open_library

# Fill shared memory with zeros instead of the 0xFF poison (dfg::sim::kFlagZeroSmem).
FLAG_ZERO_SMEM = 1
# wgmma accumulates in exact fp32 instead of the tensor-core model (dfg::sim::kFlagExactMma).
FLAG_EXACT_MMA = 2
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


_LIBRARIES: dict[tuple[str, str], ctypes.CDLL] = {}  # by (kernel name, build key)


def _load(source: str, name: str) -> ctypes.CDLL:
    """The library of ``source``, loaded once per process and build key.

    ``dlopen`` opens the very file :func:`.build.open_library` verified, through a duplicate of its
    descriptor (``/proc/self/fd/N``), so nothing can be swapped in between the check and the load. That
    duplicate stays open for the life of the process (as the library stays mapped): glibc recognises a
    loaded library by the name it was opened under, so ``/proc/self/fd/N`` must never come back naming
    another file.
    """
    key = (name, cache_key(source, paths.include_dir()))
    lib = _LIBRARIES.get(key)
    if lib is None:
        with open_library(source, name) as library:
            fd = os.dup(library.fd)
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")  # RTLD_LOCAL: libraries never resolve symbols against each other
        lib.dfg_sim_last_error.restype = ctypes.c_char_p
        lib.dfg_sim_last_error.argtypes = []
        _LIBRARIES[key] = lib
    return lib


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
    ``DFG_SIM_SEED``, default 0). ``DFG_SIM_EXACT_MMA=1`` adds :data:`FLAG_EXACT_MMA` (exact fp32 wgmma).

    Raises:
        SimBuildError: the translation unit did not compile.
        SimulationError: the launch failed; the message is the simulator's report.
    """
    lib = _load(source, name)
    entry = getattr(lib, f"{name}_sim")
    entry.restype = ctypes.c_int
    entry.argtypes = [ctypes.c_void_p, ctypes.POINTER(LaunchConfig)]

    raw = ctypes.create_string_buffer(len(params) + _PARAMS_ALIGNMENT)
    base = ctypes.addressof(raw)
    aligned = (base + _PARAMS_ALIGNMENT - 1) // _PARAMS_ALIGNMENT * _PARAMS_ALIGNMENT
    ctypes.memmove(aligned, params, len(params))

    if seed is None:
        seed = env.sim_seed()
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if not 0 <= registers <= 255:
        raise ValueError(f"registers must be in [0, 255], got {registers}")
    if env.sim_exact_mma():
        flags |= FLAG_EXACT_MMA
    if timeout_s is None:
        timeout_s = env.sim_timeout_seconds()
    cfg = LaunchConfig(grid, block, cluster, smem_bytes, max_steps, timeout_s, flags, registers, seed)
    with _LAUNCH_LOCK:
        status = entry(aligned, ctypes.byref(cfg))
        report = lib.dfg_sim_last_error().decode(errors="replace") if status != 0 else ""
    if status != 0:
        raise SimulationError(report)
