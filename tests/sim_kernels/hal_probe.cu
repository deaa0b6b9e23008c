// Probe of the simple hal operations for the simulator tests (2-CTA clusters, 128 threads per CTA):
//   indices: out_idx[block][thread] = {thread, warp, lane, block, grid, cluster rank}
//   conversions: thread t converts in[2t], in[2t+1] with pack_bf16x2 and pack_e4m3x2
//   named barrier 1 (warps 0-1) hands a value from warp 0 to warp 1 through shared memory;
//   mbarrier phases: `bar` (count 2) completes phase 0 when threads 64 and 96 both arrive; before that, their
//   wait on parity 1 (the phase before phase 0) returns at once; thread 0's remote arrival on the peer CTA's
//   `peer` barrier (count 1) completes that barrier's phase 0.
//   exit: warp 3 returns early; sync_threads and cluster_sync then wait only for the other threads.
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;

struct Params {
    const float* in;  // [grid * 128 * 2]
    u32* out_idx;     // [grid][128][6]
    u32* out_bf16;    // [grid * 128]
    u16* out_e4m3;    // [grid * 128]
    u32* out_sync;    // [grid][4]
};

DFG_DEVICE void body(const Params& p) {
    const u32 t = hal::thread_idx(), b = hal::block_idx();
    u32* idx = p.out_idx + (b * kNumThreads + t) * 6;
    idx[0] = t;
    idx[1] = hal::warp_idx();
    idx[2] = hal::lane_idx();
    idx[3] = b;
    idx[4] = hal::grid_dim();
    idx[5] = hal::cluster_cta_rank();

    const u32 g = b * kNumThreads + t;
    p.out_bf16[g] = hal::pack_bf16x2(hal::ld_global_nc(p.in + 2 * g), hal::ld_global_nc(p.in + 2 * g + 1));
    p.out_e4m3[g] = hal::pack_e4m3x2(p.in[2 * g], p.in[2 * g + 1]);

    u8* smem = hal::dynamic_smem();
    u64* bar = reinterpret_cast<u64*>(smem);
    u64* peer = bar + 1;
    u32* slot = reinterpret_cast<u32*>(smem + 64);
    if (t == 0) {
        hal::mbar_init(bar, 2);
        hal::mbar_init(peer, 1);
        hal::fence_barrier_init();
    }
    hal::cluster_sync();

    if (hal::warp_idx() < 2) {
        if (t == 0) *slot = 1000 + b;
        hal::named_barrier_sync(1, 64);
        if (t == 32) p.out_sync[b * 4 + 0] = *slot;
    } else {
        if (t == 64 || t == 96) {
            hal::mbar_wait(bar, 1);  // parity of the phase before phase 0: complete (phase 0 is still open)
            hal::mbar_arrive(bar);
        }
        hal::mbar_wait(bar, 0);
        if (t == 64) p.out_sync[b * 4 + 1] = 1;
    }
    if (t == 0) hal::mbar_arrive_cluster(peer, hal::cluster_cta_rank() ^ 1);
    hal::mbar_wait(peer, 0);
    if (t == 0) p.out_sync[b * 4 + 2] = 2;
    if (hal::warp_idx() == 3) return;  // exited threads no longer hold up sync_threads / cluster_sync
    hal::sync_threads();
    if (t == 0) p.out_sync[b * 4 + 3] = 3;
    hal::cluster_sync();
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
