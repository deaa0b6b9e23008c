// Entry point of one MXFP4 grouped GEMM kernel (issues 42, 43), rendered by deep_fp8_gemm/kernels/mxfp4_gemm.py.
// Every double-braced placeholder is a compile-time constant of kernels.mxfp4_gemm.Mxfp4Config.
#include <deep_fp8_gemm/kernels/mxfp4_gemm.cuh>

// The generated register-A wgmma wrapper for this kernel's N = BLOCK_M tokens (empty in the CPU-simulator build).
{{EXTRA_CODE}}

namespace {
using Kernel = dfg::mxfp4::Mxfp4GroupedKernel<{{SHAPE_N}}, {{SHAPE_K}}, {{BLOCK_M}}, {{BLOCK_N}}, {{NUM_STAGES}},
                                              {{NUM_GROUPS}}, {{SMEM_BYTES}}, dfg::GemmKind::{{LAYOUT}},
                                              {{GROUP_ALIGNMENT}}, dfg::mxfp4::Mxfp4Output::{{OUTPUT}}, {{UE8M0}}>;
}  // namespace

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, Kernel::kNumThreads, dfg::mxfp4::Mxfp4Params, Kernel::run)
