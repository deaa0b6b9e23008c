// Entry point of one BF16 GEMM kernel (issue 41), rendered by deep_fp8_gemm/kernels/bf16_gemm.py. Every double-braced
// placeholder is a compile-time constant of kernels.bf16_gemm.Bf16GemmConfig.
#include <deep_fp8_gemm/kernels/bf16_gemm.cuh>

// The generated wgmma wrapper for this kernel's N and transpose bits (empty in the CPU-simulator build).
{{EXTRA_CODE}}

namespace {
using Kernel = dfg::bf16::Bf16GemmKernel<static_cast<dfg::bf16::Form>({{FORM}}), {{BLOCK_M}}, {{BLOCK_N}}, {{STAGES}},
                                         {{NUM_MATH_WARPGROUPS}}, {{MN_MAJOR_A}}, {{MN_MAJOR_B}}, {{FP32_OUT}},
                                         {{ACCUMULATE}}, {{PLANTED}}, {{SMEM_BYTES}}>;
}  // namespace

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, Kernel::kNumThreads, dfg::bf16::Bf16GemmParams, Kernel::run)
