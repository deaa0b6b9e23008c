// Test kernel for the JIT runtime tests (never launched): exercises every Hopper feature the audit
// looks for, so its SASS must contain USETMAXREG, UTMALDG, QGMMA, SYNCS, WARPGROUP and ACQBULK (griddepcontrol.wait,
// in both roles after setmaxnreg, as the GEMM kernels wait before their first global access).
//   warpgroup 0 (threads 0..127):   math; setmaxnreg.inc, waits on the barrier, one wgmma m64n8k32
//   warpgroup 1 (threads 128..255): producer; setmaxnreg.dec, one thread issues two TMA 3-D loads
//   barrier `full`: arrive count 1 (producer's arrive.expect_tx) + the TMA transaction bytes
//   shared memory: A tile 64x32 e4m3 at 0 (2 KiB), B tile 8x32 e4m3 at 2 KiB, barrier at 4 KiB
#include <deep_fp8_gemm/hal.cuh>

{{EXTRA_CODE}}

namespace dfg_test {
using namespace dfg;

constexpr u32 kNumThreads = {{NUM_THREADS}};
constexpr u32 kBlockK = {{BLOCK_K}};
constexpr u32 kTileABytes = 64 * kBlockK;
constexpr u32 kTileBBytes = 8 * kBlockK;
constexpr bool kAccumulate = {{ACCUMULATE}};

struct Params {
    TensorMap map_a;
    TensorMap map_b;
    float* out;
};

// No-swizzle K-major wgmma descriptor (cute/arch/mma_sm90_desc.hpp GmmaDescriptor): start address >> 4
// in bits 0..13, leading byte offset >> 4 in 16..29, stride byte offset >> 4 in 32..45, layout 0.
DFG_DEVICE u64 make_desc(const void* smem_ptr) {
    const u64 start = (hal::smem_addr(smem_ptr) & 0x3FFFFu) >> 4;
    const u64 leading = 128u >> 4, stride = 256u >> 4;
    return start | (leading << 16) | (stride << 32);
}

DFG_DEVICE void body(const Params& params) {
    u8* smem = hal::dynamic_smem();
    u8* tile_a = smem;
    u8* tile_b = smem + kTileABytes;
    u64* full = reinterpret_cast<u64*>(smem + 4096);

    if (hal::thread_idx() == 0) {
        hal::mbar_init(full, 1);
        hal::fence_barrier_init();
    }
    hal::sync_threads();

    if (hal::warp_idx() >= 4) {
        hal::setmaxnreg_dec<40>();
        hal::grid_dependency_wait();
        if (hal::thread_idx() == 128) {
            hal::tma_prefetch(&params.map_a);
            hal::mbar_arrive_expect_tx(full, kTileABytes + kTileBBytes);
            hal::tma_load_3d(tile_a, &params.map_a, full, 0, 0, 0);
            hal::tma_load_3d(tile_b, &params.map_b, full, 0, 0, 0);
        }
    } else {
        hal::setmaxnreg_inc<232>();
        hal::grid_dependency_wait();
        hal::mbar_wait(full, 0);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        hal::wgmma_fence();
        hal::WgmmaFp8<8>::mma(make_desc(tile_a), make_desc(tile_b), acc, kAccumulate);
        hal::wgmma_commit();
        hal::wgmma_wait<0>();
        DFG_UNROLL
        for (int i = 0; i < 4; ++i) params.out[hal::thread_idx() * 4 + i] = acc[i];
    }
}

}  // namespace dfg_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, dfg_test::kNumThreads, dfg_test::Params, dfg_test::body)
