// Entry point of one tf32_hc_prenorm_gemm kernel (issue 41), rendered by deep_fp8_gemm/kernels/hc_prenorm.py. Every
// double-braced placeholder is a compile-time constant of kernels.hc_prenorm.HcPrenormConfig.
#include <deep_fp8_gemm/kernels/hc_prenorm.cuh>

// The generated wgmma wrapper for this kernel's N (empty in the CPU-simulator build).
{{EXTRA_CODE}}

namespace {
using Kernel = dfg::hc_prenorm::HcPrenormKernel<{{BLOCK_N}}, {{STAGES}}, {{PLANTED}}, {{SMEM_BYTES}}>;
}  // namespace

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, Kernel::kNumThreads, dfg::hc_prenorm::HcPrenormParams, Kernel::run)
