// Fused quantisation kernel entry (rendered by deep_fp8_gemm/kernels/quant.py): one kind, one input dtype.
//   QUANT_KIND  0 = per-token (1x128), 1 = per-block (128x128), 2 = SiLU(gate) * up then per-token
//   INPUT_TYPE  0 = bf16, 1 = fp16, 2 = fp32 input
//   VECTORIZED  true when every row starts 16-byte aligned and k % 16 == 0 (16-byte loads and stores)
//   USE_UE8M0   true: scales rounded up to powers of two (UE8M0), see quant.cuh
//   NUM_THREADS threads per CTA; dynamic shared memory = dfg::quant::quant_smem_bytes<NUM_THREADS>()
#include <deep_fp8_gemm/kernels/quant.cuh>

{{EXTRA_CODE}}

namespace dfg_quant_entry {
using namespace dfg;

constexpr u32 kNumThreads = {{NUM_THREADS}};

DFG_DEVICE void body(const quant::QuantParams& params) {
    constexpr auto kKind = static_cast<quant::QuantKind>({{QUANT_KIND}});
    constexpr auto kInputType = static_cast<quant::InputType>({{INPUT_TYPE}});
    quant::quant_body<kKind, kInputType, {{VECTORIZED}}, kNumThreads, {{USE_UE8M0}}>(params);
}

}  // namespace dfg_quant_entry

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, dfg_quant_entry::kNumThreads, dfg::quant::QuantParams, dfg_quant_entry::body)
