// Fused quantisation kernel entry (rendered by deep_fp8_gemm/kernels/quant.py): one kind, one input dtype.
//   QUANT_KIND  0 = per-token (1x128), 1 = per-block (128x128), 2 = SiLU(gate) * up then per-token,
//               3 = cast-transpose (x and xᵀ per token), 4 = k-grouped transpose (xᵀ of each row group)
//   INPUT_TYPE  0 = bf16, 1 = fp16, 2 = fp32 input
//   VECTORIZED  true when every row starts 16-byte aligned and k % 16 == 0 (16-byte loads and stores)
//   USE_UE8M0   true: scales rounded up to powers of two (UE8M0), see quant.cuh
//   NUM_THREADS threads per CTA; dynamic shared memory = dfg::quant::quant_smem_bytes<NUM_THREADS>()
//               (kinds 3, 4: 256 threads, dfg::quant::transpose_smem_bytes())
#include <deep_fp8_gemm/kernels/quant.cuh>

{{EXTRA_CODE}}

namespace dfg_quant_entry {
using namespace dfg;

constexpr u32 kNumThreads = {{NUM_THREADS}};
constexpr auto kKind = static_cast<quant::QuantKind>({{QUANT_KIND}});
using Params = quant::ParamsOf<kKind>;

DFG_DEVICE void body(const Params& params) {
    constexpr auto kInputType = static_cast<quant::InputType>({{INPUT_TYPE}});
    quant::quant_body<kKind, kInputType, {{VECTORIZED}}, kNumThreads, {{USE_UE8M0}}>(params);
}

}  // namespace dfg_quant_entry

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, dfg_quant_entry::kNumThreads, dfg_quant_entry::Params, dfg_quant_entry::body)
