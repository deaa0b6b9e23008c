// BF16 / TF32 wgmma (hal::WgmmaBf16, hal::WgmmaTf32), for tests/kernels/test_sim_wide_mma.py: one warpgroup copies a
// shared-memory image (A [64 x 128 B] then B [kN x 128 B], K-major, 128-byte swizzle) into shared memory and
// accumulates the four 32-byte k-slices (4 x k16 bf16 = K 64, or 4 x k8 tf32 = K 32) through the descriptors the
// test built, then stores the accumulators [128][kN / 2]. `mode`:
//   0  bf16        1  tf32
//   2  bf16, planted bug: the descriptors are not advanced along K (slice 0 four times)
//   3  bf16 data, planted bug: issued as the tf32 instruction (operand type confused)
//   4  bf16, A and B MN-major (imm-trans-a = imm-trans-b = 1; the image and descriptors are the test's)
//   5  bf16, A MN-major, B K-major
// The extra-code slot is empty for the simulator and holds the generated wgmma wrappers for NVRTC.
#include <deep_fp8_gemm/hal.cuh>

{{EXTRA_CODE}}

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;
constexpr u32 kN = 64;
constexpr u32 kSlices = 4;

struct Params {
    const u8* image;
    float* d;  // [128][kN / 2]
    u64 desc_a[kSlices], desc_b[kSlices];
    u32 image_bytes;
    u32 mode;
};

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();
    const u32 t = hal::thread_idx();
    const u32 mode = p.mode;
    for (u32 i = t; i < p.image_bytes; i += kNumThreads) smem[i] = p.image[i];
    hal::fence_view_async_shared();
    hal::sync_threads();

    float d[kN / 2];
    for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(d[i]);
    hal::wgmma_fence();
    for (u32 s = 0; s < kSlices; ++s) {
        const u32 at = mode == 2 ? 0 : s;
        if (mode == 4)
            hal::WgmmaBf16<kN, 1, 1>::mma(p.desc_a[at], p.desc_b[at], d, s > 0);
        else if (mode == 5)
            hal::WgmmaBf16<kN, 1, 0>::mma(p.desc_a[at], p.desc_b[at], d, s > 0);
        else if (mode == 1 || mode == 3)
            hal::WgmmaTf32<kN>::mma(p.desc_a[at], p.desc_b[at], d, s > 0);
        else
            hal::WgmmaBf16<kN>::mma(p.desc_a[at], p.desc_b[at], d, s > 0);
    }
    hal::wgmma_commit();
    hal::wgmma_wait<0>();
    for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(d[i]);
    for (u32 i = 0; i < kN / 2; ++i) p.d[t * (kN / 2) + i] = d[i];
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
