// Entry point of one MQA-logits kernel (the DeepSeek-V3.2 indexer), rendered by deep_fp8_gemm/kernels/mqa_logits.py.
// Every double-braced placeholder is a compile-time constant of kernels.mqa_logits.MqaLogitsConfig.
#include <deep_fp8_gemm/kernels/mqa_logits.cuh>

// The generated wgmma wrapper for this kernel's N = queries x heads (empty in the CPU-simulator build).
{{EXTRA_CODE}}

namespace {
using Kernel = dfg::mqa::MqaLogitsKernel<static_cast<dfg::mqa::Form>({{FORM}}), {{NUM_HEADS}}, {{HEAD_DIM}},
                                         {{QUERIES}}, {{BF16_LOGITS}}, {{CLEAN}}, {{COMPRESSED}}, {{Q_STAGES}},
                                         {{KV_STAGES}}, {{SMEM_BYTES}}>;
}  // namespace

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, Kernel::kNumThreads, dfg::mqa::MqaLogitsParams, Kernel::run)
