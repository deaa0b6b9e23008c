// Entry point of one MXFP4 prefill GEMM kernel with the shared-memory conversion stage (issue 43), rendered by
// deep_fp8_gemm/kernels/mxfp4_gemm.py (Mxfp4Config, path "convert"). Every double-braced placeholder is a
// compile-time constant of that config.
#include <deep_fp8_gemm/kernels/mxfp4_convert_gemm.cuh>

// The generated shared-memory wgmma wrappers (m64n128k32: the folded loop; m64n64k32: one stored wave of the general
// loop); empty in the CPU-simulator build.
{{EXTRA_CODE}}

namespace {
using Kernel = dfg::mxfp4::Mxfp4ConvertKernel<{{SHAPE_N}}, {{SHAPE_K}}, {{BLOCK_M}}, {{BLOCK_N}}, {{NUM_STAGES}},
                                              {{NUM_GROUPS}}, {{SMEM_BYTES}}, dfg::GemmKind::{{LAYOUT}},
                                              dfg::mxfp4::Mxfp4Output::{{OUTPUT}}, {{UE8M0}}>;
// The register split the audit's setmaxnreg deadlock check reads (Mxfp4Config.math_registers / PRODUCER_REGISTERS).
static_assert(Kernel::kMathRegisters == {{MATH_REGISTERS}} && Kernel::kProducerRegisters == {{PRODUCER_REGISTERS}},
              "the kernel's register split is the config's");
}  // namespace

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, Kernel::kNumThreads, dfg::mxfp4::Mxfp4Params, Kernel::run)
