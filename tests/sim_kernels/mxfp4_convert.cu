// The MXFP4 conversion of one 64-row wave (include/deep_fp8_gemm/mxfp4.cuh convert_wave), for
// tests/kernels/test_sim_mxfp4.py: thread 0 TMA-loads a packed tile [64 rows][64 bytes] with the 64-byte swizzle (as the
// kernel's producer does), the threads copy the rows' metadata and the tables into shared memory, and each of the 128
// threads converts its A fragments of the four sub-blocks and stores them: out[thread][s][j] = a[s][j].
#include <deep_fp8_gemm/hal.cuh>
#include <deep_fp8_gemm/mxfp4.cuh>

{{EXTRA_CODE}}

namespace sim_test {
using namespace dfg;

struct Params {
    TensorMap tma_w;   // u8 [64][64]: box (64, 64, 1), SW64
    const u32* meta;   // [64][2]: kernels/mxfp4_gemm.py kernel_metadata's words of one K block
    u32* out;          // [128][4][4]
};

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();  // tile 4096 | meta 512 | tables 128 | barrier 8
    u8* tile = smem;
    u8* meta = smem + 4096;
    u8* tables = smem + 4608;
    u64* bar = reinterpret_cast<u64*>(smem + 4736);
    const u32 t = hal::thread_idx(), warp = t / 32, lane = t % 32;
    if (t == 0) {
        hal::mbar_init(bar, 1);
        hal::fence_view_async_shared();
        hal::fence_barrier_init();
    }
    reinterpret_cast<u32*>(meta)[t] = p.meta[t];
    if (t < mxfp4::kNumTables * 2)
        reinterpret_cast<u32*>(tables)[t] = mxfp4::kE4m3Tables[t / 2][t % 2];
    hal::sync_threads();
    if (t == 0) {
        hal::mbar_arrive_expect_tx(bar, 4096);
        hal::tma_load_3d(tile, &p.tma_w, bar, 0, 0, 0);
    }
    hal::mbar_wait(bar, 0);
    const mxfp4::FragmentLoader loader = mxfp4::FragmentLoader::of(warp, lane);
    const u32 row0 = 16 * warp + lane / 4;
    const mxfp4::RowMeta m0 = mxfp4::RowMeta::load(meta, row0), m1 = mxfp4::RowMeta::load(meta, row0 + 8);
    u32 a[mxfp4::kSubBlocks][WgmmaFragmentA::kRegisters];
    mxfp4::convert_wave(loader, tile, tables, m0, m1, a);
    for (u32 s = 0; s < mxfp4::kSubBlocks; ++s)
        for (u32 j = 0; j < WgmmaFragmentA::kRegisters; ++j)
            p.out[(t * 4 + s) * 4 + j] = a[s][j];
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, 128, sim_test::Params, sim_test::body)
