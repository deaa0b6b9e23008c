// deep_fp8_gemm hardware layer: the memory orders and scopes of atomics and fences (PTX ISA "Memory Consistency
// Model": "Operation types", "Scope"). Shared by both implementations (hal/ptx.cuh, hal/sim.hpp), which map them
// to the instructions' qualifiers (.relaxed / .acquire / .release / .acq_rel / .sc; .cta / .cluster / .gpu).
#pragma once

namespace dfg {
namespace hal {

enum class MemOrder : int { Relaxed = 0, Acquire = 1, Release = 2, AcqRel = 3, SeqCst = 4 };
enum class MemScope : int { Cta = 0, Cluster = 1, Gpu = 2 };

}  // namespace hal
}  // namespace dfg
