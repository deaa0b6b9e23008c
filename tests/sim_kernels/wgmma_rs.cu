// wgmma with A from registers (hal::WgmmaFp8RegA), for tests/test_sim_register_a.py: one warpgroup computes the
// same k32 product twice, A from shared memory through its descriptor (WgmmaFp8) and A from each thread's register
// fragment (WgmmaFp8RegA, written with WgmmaFragmentA from A in global memory), both with B through its descriptor,
// and stores both accumulators [128][N / 2]. `mode` plants one register-rule violation (0: none):
//   1  writes a[0] between the register-A wgmma's commit and its wait (A fragment in flight)
//   2  reads d[0] between the register-A wgmma's commit and its wait (accumulator in flight)
//   3  writes a[1] after the wgmma.fence of a second register-A wgmma (access after the fence)
//   4  reads the register-A wgmma's accumulator after its wait without the register fence
// The extra-code slot below is empty for the simulator and holds the generated wgmma wrappers for NVRTC.
#include <deep_fp8_gemm/hal.cuh>
#include <deep_fp8_gemm/mma.cuh>

{{EXTRA_CODE}}

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;
constexpr u32 kN = 64;

struct Params {
    const u8* image;  // shared-memory image: A [64 x 128] then B [kN x 128], K-major, 128-byte swizzle
    const u8* a;      // A [64 x 32] e4m3, row-major: what the threads put into their register fragments
    float* d_ss;      // [128][kN / 2]
    float* d_rs;      // [128][kN / 2]
    u32* coords;      // [128][16]: row * 32 + k of byte b of a[j] (value 4 j + b) per WgmmaFragmentA
    u64 desc_a, desc_b;
    u32 image_bytes;
    u32 mode;
};

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();
    const u32 t = hal::thread_idx(), warp = t / 32, lane = t % 32;
    const u32 mode = p.mode;
    for (u32 i = t; i < p.image_bytes; i += kNumThreads) smem[i] = p.image[i];
    hal::fence_view_async_shared();
    hal::sync_threads();

    u32 a[WgmmaFragmentA::kRegisters];
    for (u32 j = 0; j < WgmmaFragmentA::kRegisters; ++j) {
        u32 word = 0;
        for (u32 b = 0; b < WgmmaFragmentA::kBytesPerRegister; ++b) {
            const u32 at = WgmmaFragmentA::row(warp, lane, j) * 32 + WgmmaFragmentA::k(lane, j, b);
            word |= u32(p.a[at]) << (8 * b);
            p.coords[t * 16 + 4 * j + b] = at;
        }
        a[j] = word;
    }
    float d_ss[kN / 2], d_rs[kN / 2];
    for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(d_ss[i]);
    hal::wgmma_fence();
    hal::WgmmaFp8<kN>::mma(p.desc_a, p.desc_b, d_ss, false);
    hal::wgmma_commit();
    hal::wgmma_wait<0>();
    for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(d_ss[i]);

    for (u32 j = 0; j < WgmmaFragmentA::kRegisters; ++j) hal::fence_operand(a[j]);
    hal::wgmma_fence();
    hal::WgmmaFp8RegA<kN>::mma(a, p.desc_b, d_rs, false);
    hal::wgmma_commit();
    if (mode == 1) a[0] ^= 1u;
    float early = 0.0f;
    if (mode == 2) early = d_rs[0];
    hal::wgmma_wait<0>();
    if (mode != 4)
        for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(d_rs[i]);
    for (u32 j = 0; j < WgmmaFragmentA::kRegisters; ++j) hal::fence_operand(a[j]);

    if (mode == 3) {  // a second register-A product into the same accumulator, A touched after the fence
        hal::wgmma_fence();
        a[1] ^= u32(p.d_ss == nullptr);  // a read and a write of a[1] (the value stays)
        hal::WgmmaFp8RegA<kN>::mma(a, p.desc_b, d_rs, false);
        hal::wgmma_commit();
        hal::wgmma_wait<0>();
        for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(d_rs[i]);
    }
    for (u32 i = 0; i < kN / 2; ++i) {
        p.d_ss[t * (kN / 2) + i] = d_ss[i];
        p.d_rs[t * (kN / 2) + i] = d_rs[i] + early;
    }
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
