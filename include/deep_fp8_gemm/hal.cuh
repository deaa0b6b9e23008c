// deep_fp8_gemm hardware layer: picks the implementation for this build.
//   sm_90a (NVRTC / nvcc):         hal/ptx.cuh, inline PTX
//   CPU simulator (-DDFG_SIMULATOR): hal/sim.hpp, an emulation with the same interface
// Kernel code includes this header and calls dfg::hal::* only; it never branches on the build.
#pragma once
#include "common.cuh"
#if defined(DFG_SIMULATOR)
#include "hal/sim.hpp"
#else
#include "hal/ptx.cuh"
#endif
