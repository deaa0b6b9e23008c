"""CPU simulator: runs the real kernel translation units on the host (see ``include/deep_fp8_gemm/hal/sim.hpp``).

``build_library`` compiles a rendered translation unit with g++ (``-DDFG_SIMULATOR``), ``pack_tensor_map``
turns a ``TensorMapSpec`` into the 128 bytes a simulated kernel reads as its ``TensorMap``, ``launch`` runs a
whole grid and ``launch_stream`` several kernels of one translation unit in stream order (programmatic dependent
launches included), ``stream`` joins every launch made inside it (of any kernel library: the ops' own sequence)
into one stream; they raise :class:`SimulationError` with the simulator's report when anything goes wrong.
"""

from .build import SimBuildError, build_library
from .runner import (FLAG_EXACT_MMA, FLAG_NO_RACES, FLAG_ZERO_SMEM, LaunchConfig, SimulationError, StreamLaunch,
                     launch, launch_stream, ptxas_registers, stream, tma_load_bytes)
from .tensor_map_pack import TENSOR_MAP_BYTES, pack_tensor_map

__all__ = [
    "FLAG_EXACT_MMA",
    "FLAG_NO_RACES",
    "FLAG_ZERO_SMEM",
    "LaunchConfig",
    "SimBuildError",
    "SimulationError",
    "StreamLaunch",
    "TENSOR_MAP_BYTES",
    "build_library",
    "launch",
    "launch_stream",
    "pack_tensor_map",
    "ptxas_registers",
    "stream",
    "tma_load_bytes",
]
