// The hal operations of split-K (split_k.cuh) on their own, for tests/kernels/test_sim_split_sync.py: 256 threads, grid of
// `Params::grid` CTAs.
//   mode 0: every thread of every CTA does atomic_add_acq_rel_gpu(counter, 1) and stores the old value; then two
//           named bar.red.or rounds per warpgroup (barrier 1 + warpgroup, 128 threads): the first with
//           pred = (thread == pick), the second with pred = false; each thread stores both results.
//   mode 1: bar.sync and bar.red.or in the same round of barrier 1 (a bug the simulator must report).
//   mode 2: atomic_add_acq_rel_gpu on a shared-memory address (a bug the simulator must report).
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 256;

struct Params {
    u32* counter;
    u32* olds;     // [grid * 256]
    u32* any;      // [grid * 256 * 2]
    u32 mode;
    u32 pick;
};

DFG_DEVICE void body(const Params& p) {
    const u32 t = hal::thread_idx();
    const u32 g = hal::block_idx() * kNumThreads + t;
    const u32 wg = t / 128;
    switch (p.mode) {
        case 0:
            p.olds[g] = hal::atomic_add_acq_rel_gpu(p.counter, 1u);
            p.any[2 * g] = hal::named_barrier_sync_or(1 + wg, 128, t == p.pick) ? 1u : 0u;
            p.any[2 * g + 1] = hal::named_barrier_sync_or(1 + wg, 128, false) ? 1u : 0u;
            break;
        case 1:
            if (t < 128) {
                if (t < 64) hal::named_barrier_sync(1, 128);
                else hal::named_barrier_sync_or(1, 128, true);
            }
            break;
        case 2:
            if (t == 0) hal::atomic_add_acq_rel_gpu(reinterpret_cast<u32*>(hal::dynamic_smem()), 1u);
            break;
    }
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
