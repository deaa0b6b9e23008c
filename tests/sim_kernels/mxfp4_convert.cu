// The MXFP4 conversion of one 64-row wave (include/deep_fp8_gemm/mxfp4.cuh load_fragment / WaveMeta / convert_wave),
// for tests/kernels/test_sim_mxfp4.py: thread 0 TMA-loads the wave's 4096-byte packed tile and its 272-byte metadata
// record (as the kernel's producer does), the threads fill the pair tables, and each of the 128 threads converts its
// A fragments of the four sub-blocks through the wave's recorded path and stores them: out[thread][s][j] = a[s][j].
#include <deep_fp8_gemm/hal.cuh>
#include <deep_fp8_gemm/mxfp4.cuh>

{{EXTRA_CODE}}

namespace sim_test {
using namespace dfg;

struct Params {
    TensorMap tma_w;     // u8 [1][16][256]: box (256, 16, 1)
    TensorMap tma_meta;  // u8 [1][17][16]: box (16, 17, 1)
    u32* out;            // [128][4][4]
};

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();  // tile 4096 | meta 384 | pair tables 3600 | barrier 8
    u8* tile = smem;
    u8* meta = smem + 4096;
    u8* tables = smem + 4096 + 384;
    u64* bar = reinterpret_cast<u64*>(smem + 4096 + 384 + mxfp4::kPairTableBytes);
    const u32 t = hal::thread_idx(), warp = t / 32, lane = t % 32;
    if (t == 0) {
        hal::mbar_init(bar, 1);
        hal::fence_view_async_shared();
        hal::fence_barrier_init();
    }
    for (u32 i = t; i < mxfp4::kPairTableBytes / 4; i += 128)
        reinterpret_cast<u32*>(tables)[i] = mxfp4::pair_table_word(i / 4, i % 4);
    hal::sync_threads();
    if (t == 0) {
        hal::mbar_arrive_expect_tx(bar, mxfp4::kWaveTileBytes + mxfp4::kWaveMetaBytes);
        hal::tma_load_3d(tile, &p.tma_w, bar, 0, 0, 0);
        hal::tma_load_3d(meta, &p.tma_meta, bar, 0, 0, 0);
    }
    hal::mbar_wait(bar, 0);
    u32 words[2 * mxfp4::kSubBlocks];
    mxfp4::load_fragment(tile, t, words);
    const mxfp4::WaveMeta m = mxfp4::WaveMeta::load(meta, warp, lane);
    u32 a[mxfp4::kSubBlocks][WgmmaFragmentA::kRegisters];
    mxfp4::convert_wave(words, tables, m, mxfp4::WaveMeta::per32(meta), a);
    for (u32 s = 0; s < mxfp4::kSubBlocks; ++s)
        for (u32 j = 0; j < WgmmaFragmentA::kRegisters; ++j)
            p.out[(t * 4 + s) * 4 + j] = a[s][j];
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, 128, sim_test::Params, sim_test::body)
