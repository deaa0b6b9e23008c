// GPU test kernel (tests/gpu/test_gpu_jit.py): the smallest launch through the JIT + driver path.
// out[i] = a[i] * 2 + blockIdx.x for i < n; 128 threads per block, one element per thread.
// Its parameter struct is mirrored by ScaleParams in tests/gpu/test_gpu_jit.py.
#include <deep_fp8_gemm/hal.cuh>

namespace dfg_test {
using namespace dfg;

struct ScaleParams {
    const float* a;  // offset 0
    float* out;      // offset 8
    u32 n;           // offset 16
};
static_assert(sizeof(ScaleParams) == 24, "mirrored by ScaleParams in tests/gpu/test_gpu_jit.py");

DFG_DEVICE void scale_body(const ScaleParams& params) {
    const u32 i = hal::block_idx() * 128 + hal::thread_idx();
    if (i < params.n) params.out[i] = params.a[i] * 2.0f + static_cast<float>(hal::block_idx());
}

}  // namespace dfg_test

DFG_DEFINE_KERNEL(dfg_test_scale, 128, dfg_test::ScaleParams, dfg_test::scale_body)
