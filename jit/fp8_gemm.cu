// Entry point of one FP8 GEMM kernel, rendered by deep_fp8_gemm/kernels/gemm.py.
// Every double-braced placeholder is a compile-time constant of deep_fp8_gemm.config.GemmConfig.
#include <deep_fp8_gemm/kernels/fp8_gemm.cuh>

// Generated wgmma wrappers for this kernel's N (empty in the CPU-simulator build).
{{EXTRA_CODE}}

namespace {
using Kernel = dfg::Fp8GemmKernel<static_cast<dfg::GemmKind>({{KIND}}), {{SHAPE_N}}, {{SHAPE_K}}, {{BLOCK_M}},
                                  {{BLOCK_N}}, {{NUM_STAGES}}, {{NUM_GROUPS}}, {{CLUSTER_M}}, {{CLUSTER_N}},
                                  {{NUM_MATH_WARPGROUPS}}, {{BAND_WIDTH}}, {{SMEM_BYTES}}, {{MATH_REGISTERS}},
                                  {{PRODUCER_REGISTERS}}, {{SPLIT_K}}, {{USE_UE8M0}}, {{SWAP_AB}},
                                  {{PSUM_ALIGNMENT}}, static_cast<dfg::ScaleMajor>({{SA_MAJOR}})>;
}  // namespace

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, Kernel::kNumThreads, dfg::GemmParams, Kernel::run)
