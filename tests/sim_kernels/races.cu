// Memory ordering between threads and CTAs, for tests/kernels/test_sim_races.py: one `mode` per pattern, each either
// correct (the simulator must stay silent) or a planted bug (it must report the kind and both call sites).
// 256 threads (two warpgroups); shared memory: an mbarrier at smem+0, a 1 KiB exchange area at smem+1024.
// Global: `data` (one float per thread of the grid), `counter` (zero before the launch), `flag`, `out`.
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 256;

enum Mode : u32 {
    // shared memory between warpgroups: warpgroup 0 writes, warpgroup 1 reads
    kSmemNamedBarrier = 0,     // ok: bar.sync between them
    kSmemNoBarrier = 1,        // bug: no barrier at all
    kSmemMbarrier = 2,         // ok: every writer arrives on an mbarrier the readers wait for
    kSmemWriteAfterArrive = 3, // bug: the writers arrive before they write
    kSmemMbarrierNoWait = 4,   // bug: the readers do not wait
    // inside a warp: lane 0 reads what lane 1 wrote
    kWarpSync = 5,             // ok: bar.warp.sync between
    kWarpNoSync = 6,           // bug: nothing between
    // across CTAs through global memory: every CTA's thread 0 stores its slot, increments `counter`; the CTA that
    // increments last reads every slot (split-K's pattern)
    kCounterAcqRel = 7,        // ok: atom.acq_rel.gpu
    kCounterRelaxed = 8,       // bug: atom.relaxed.gpu
    kCounterCtaScope = 9,      // bug: atom.acq_rel.cta
    kCounterFences = 10,       // ok: fence.acq_rel.gpu; atom.relaxed.gpu; fence.acq_rel.gpu
    kCounterScFences = 11,     // ok: fence.sc.gpu around relaxed atomics
    kCounterBarrierCumulative = 12,  // ok: every thread stores, bar.sync, thread 0's atom.acq_rel releases them all
    kCounterNoBarrier = 13,    // bug: as 12 without the bar.sync (other threads' stores are not released)
    // a flag: CTA 0 stores data and the flag, the others read the data if they see the flag (no spinning: a
    // simulated thread runs until it blocks, so a spin loop would never let CTA 0 run)
    kFlagReleaseAcquire = 14,  // ok: st.release.gpu / ld.acquire.gpu
    kFlagRelaxedStore = 15,    // bug: st.relaxed.gpu
    // a remote mbarrier arrive (cluster of 2): CTA 0 stores global data, arrives on CTA 1's barrier, CTA 1 reads
    kRemoteArriveData = 16,    // bug: mbarrier.arrive is .release.cta: CTA 1's wait does not synchronise with it
    kClusterBarrierData = 17,  // ok: barrier.cluster orders it
};

struct Params {
    u32 mode;
    u32 reserved;
    float* data;
    u32* counter;
    u32* flag;
    float* out;
};

DFG_DEVICE void exchange_in_smem(const Params& p, u32 t) {
    u8* smem = hal::dynamic_smem();
    u64* bar = reinterpret_cast<u64*>(smem);
    float* area = reinterpret_cast<float*>(smem + 1024);
    const u32 wg = t / 128, i = t % 128;
    if (t == 0) {
        hal::mbar_init(bar, 128);
        hal::fence_barrier_init();
    }
    hal::sync_threads();
    if (wg == 0) {
        if (p.mode == kSmemWriteAfterArrive) {
            hal::mbar_arrive(bar);
            area[i] = float(i);
        } else {
            area[i] = float(i);
            if (p.mode == kSmemMbarrier || p.mode == kSmemMbarrierNoWait) hal::mbar_arrive(bar);
        }
    }
    if (p.mode == kSmemNamedBarrier) hal::named_barrier_sync(1, 256);
    if (wg == 1) {
        if (p.mode == kSmemMbarrier || p.mode == kSmemWriteAfterArrive) hal::mbar_wait(bar, 0);
        p.out[t] = area[127 - i];
    }
}

DFG_DEVICE void exchange_in_warp(const Params& p, u32 t) {
    u32* area = reinterpret_cast<u32*>(hal::dynamic_smem() + 1024);
    area[t] = t;
    if (p.mode == kWarpSync) hal::warp_sync();
    if (hal::lane_idx() == 0) p.out[t] = float(area[t + 1]);
}

DFG_DEVICE void counter(const Params& p, u32 t) {
    const u32 cta = hal::block_idx(), grid = hal::grid_dim();
    if (p.mode == kCounterBarrierCumulative || p.mode == kCounterNoBarrier) {
        p.data[cta * kNumThreads + t] = float(cta * kNumThreads + t);
        if (p.mode == kCounterBarrierCumulative) hal::sync_threads();
    }
    if (t != 0) return;
    if (p.mode != kCounterBarrierCumulative && p.mode != kCounterNoBarrier) p.data[cta * kNumThreads] = float(cta);
    u32 old = 0;
    switch (p.mode) {
        case kCounterRelaxed: old = hal::atomic_add<hal::MemOrder::Relaxed, hal::MemScope::Gpu>(p.counter, 1u); break;
        case kCounterCtaScope: old = hal::atomic_add<hal::MemOrder::AcqRel, hal::MemScope::Cta>(p.counter, 1u); break;
        case kCounterFences:
            hal::fence<hal::MemOrder::AcqRel, hal::MemScope::Gpu>();
            old = hal::atomic_add<hal::MemOrder::Relaxed, hal::MemScope::Gpu>(p.counter, 1u);
            hal::fence<hal::MemOrder::AcqRel, hal::MemScope::Gpu>();
            break;
        case kCounterScFences:
            hal::fence<hal::MemOrder::SeqCst, hal::MemScope::Gpu>();
            old = hal::atomic_add<hal::MemOrder::Relaxed, hal::MemScope::Gpu>(p.counter, 1u);
            hal::fence<hal::MemOrder::SeqCst, hal::MemScope::Gpu>();
            break;
        default: old = hal::atomic_add_acq_rel_gpu(p.counter, 1u); break;
    }
    if (old != grid - 1) return;
    float sum = 0.f;
    const u32 stride = p.mode == kCounterBarrierCumulative || p.mode == kCounterNoBarrier ? 1 : kNumThreads;
    for (u32 i = 0; i < grid * kNumThreads; i += stride) sum += p.data[i];
    p.out[0] = sum;
}

DFG_DEVICE void flag(const Params& p, u32 t) {
    if (t != 0) return;
    if (hal::block_idx() == 0) {
        p.data[0] = 42.f;
        if (p.mode == kFlagRelaxedStore)
            hal::atomic_store<hal::MemOrder::Relaxed, hal::MemScope::Gpu>(p.flag, 1u);
        else
            hal::atomic_store<hal::MemOrder::Release, hal::MemScope::Gpu>(p.flag, 1u);
    } else if (hal::atomic_load<hal::MemOrder::Acquire, hal::MemScope::Gpu>(p.flag) == 1u) {
        p.out[hal::block_idx()] = p.data[0];  // (a schedule that runs this CTA first never reads)
    }
}

DFG_DEVICE void remote(const Params& p, u32 t) {
    u64* bar = reinterpret_cast<u64*>(hal::dynamic_smem());
    const u32 rank = hal::cluster_cta_rank();
    if (t == 0) {
        hal::mbar_init(bar, 1);
        hal::fence_barrier_init();
    }
    hal::cluster_sync();
    if (t == 0 && rank == 0) {
        p.data[0] = 7.f;
        if (p.mode == kRemoteArriveData) hal::mbar_arrive_cluster(bar, 1);
    }
    if (p.mode == kClusterBarrierData) hal::cluster_sync();
    if (t == 0 && rank == 1) {
        if (p.mode == kRemoteArriveData) hal::mbar_wait(bar, 0);
        p.out[0] = p.data[0];
    }
    hal::cluster_sync();
}

DFG_DEVICE void body(const Params& p) {
    const u32 t = hal::thread_idx();
    if (p.mode <= kSmemMbarrierNoWait) return exchange_in_smem(p, t);
    if (p.mode <= kWarpNoSync) return exchange_in_warp(p, t);
    if (p.mode <= kCounterNoBarrier) return counter(p, t);
    if (p.mode <= kFlagRelaxedStore) return flag(p, t);
    return remote(p, t);
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
