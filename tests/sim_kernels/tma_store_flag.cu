// TMA store visibility, for tests/test_sim_planted_round4.py: warp 0 writes a tile through the generic proxy into
// shared memory, thread 0 stores it to global memory with one TMA store, a CTA barrier follows, and warp 1 reads
// the tile back from global memory with plain loads. `mode` says how thread 0 waits for its store before the barrier:
//   0  cp.async.bulk.wait_group 0 (tma_store_wait_all): the store's writes are complete, the barrier orders them (ok)
//   1  cp.async.bulk.wait_group.read 0 (tma_store_wait_read<0>): only the source has been read; the writes may still
//      be in flight when warp 1 reads (the bug; thread 0 waits for completion only after the barrier)
// The tile is 32 rows of 16 bytes.
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 64;

struct Params {
    TensorMap map;  // over `out`: u8 [32][16], box 16 x 32 x 1, no swizzle
    u8* out;
    u8* seen;  // [32][16]: what warp 1 read
    u32 mode;
};

DFG_DEVICE void body(const Params& p) {
    const u32 t = hal::thread_idx();
    u8* smem = hal::dynamic_smem();
    if (t < 32) {
        for (u32 i = 0; i < 16; ++i) smem[t * 16 + i] = static_cast<u8>(t + i);
        hal::fence_view_async_shared();
    }
    hal::sync_threads();
    if (t == 0) {
        hal::tma_store_3d(&p.map, smem, 0, 0, 0);
        hal::tma_store_commit();
        if (p.mode == 0)
            hal::tma_store_wait_all();
        else
            hal::tma_store_wait_read<0>();
    }
    hal::sync_threads();
    if (t >= 32) {
        const u32 r = t - 32;
        for (u32 i = 0; i < 16; ++i) p.seen[r * 16 + i] = p.out[r * 16 + i];
    }
    if (t == 0 && p.mode != 0) hal::tma_store_wait_all();
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
