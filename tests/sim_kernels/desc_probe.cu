// wgmma descriptor probe for the simulator's ground-truth tests: the test lays A [64 x K] and B [N x K] out in
// shared memory with CuTe's K-major atoms (pycute), builds one descriptor pair per k32 slice the way
// make_gmma_desc does, and compares the accumulators (read back through CLayout_64xN) with A . B^T.
//   one warpgroup; threads copy the image into shared memory, then issue num_k wgmmas in one group
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;
constexpr u32 kMaxK = 8;

struct Params {
    const u8* image;
    float* out;  // [128][N / 2]
    u64 desc_a[kMaxK];
    u64 desc_b[kMaxK];
    u32 image_bytes;
    u32 num_k;
    u32 n;
};

template <u32 kN>
DFG_DEVICE void run(const Params& p) {
    u8* smem = hal::dynamic_smem();
    for (u32 i = hal::thread_idx(); i < p.image_bytes; i += kNumThreads) smem[i] = p.image[i];
    hal::fence_view_async_shared();
    hal::sync_threads();
    float acc[kN / 2];
    hal::wgmma_fence();
    for (u32 k = 0; k < p.num_k; ++k) hal::WgmmaFp8<kN>::mma(p.desc_a[k], p.desc_b[k], acc, k > 0);
    hal::wgmma_commit();
    hal::wgmma_wait<0>();
    for (u32 i = 0; i < kN / 2; ++i) hal::fence_operand(acc[i]);  // the register fence after the wait
    for (u32 i = 0; i < kN / 2; ++i) p.out[hal::thread_idx() * (kN / 2) + i] = acc[i];
}

DFG_DEVICE void body(const Params& p) {
    switch (p.n) {
        case 8: return run<8>(p);
        case 16: return run<16>(p);
        case 32: return run<32>(p);
        case 48: return run<48>(p);
        case 64: return run<64>(p);
        case 96: return run<96>(p);
        case 128: return run<128>(p);
        case 192: return run<192>(p);
        case 256: return run<256>(p);
        default: hal::trap("desc_probe: n not instantiated");
    }
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
