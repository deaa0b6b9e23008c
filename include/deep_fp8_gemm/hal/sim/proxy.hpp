// deep_fp8_gemm CPU simulator: generic vs async proxy, and happens-before between threads of a CTA.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// PTX ISA "Memory Consistency Model: Proxies": shared memory written through the generic proxy (st.shared,
// stmatrix, mbarrier.init) is not seen by the async proxy (TMA, wgmma operand reads, TMA complete_tx on an
// mbarrier) unless the writing thread executes fence.proxy.async (for mbarrier.init also
// fence.mbarrier_init.release.cluster) after the write, and that fence is ordered before the async operation
// (program order in the issuing thread, or a barrier between the two threads; across CTAs a cluster barrier).
//
// Happens-before is that of hb.hpp (vector clocks); the fence must be ordered before the async read by program
// order or a barrier (bar.sync / named / cluster). Generic writes are tracked per shared-memory byte: stmatrix
// and the kernels' plain stores (instrument.hpp).
#pragma once

namespace dfg::sim::detail {

inline Thread& thread_at(u32 cta, u32 tid) { return *L().threads[size_t(cta) * L().cfg.block_x + tid]; }

// What thread `t` knows of the clock of thread `tid` of its own CTA.
inline u32 known_clock(const Thread& t, u32 tid) { return t.clocks.strong.get(t.gcta, tid); }

// ---------------------------------------------------------------- generic writes / async reads of shared memory

inline void generic_write(u32 cta, u32 offset, u32 bytes, const Thread& writer) {
    Cta& c = L().ctas[cta];
    for (u32 i = 0; i < bytes; ++i) {
        c.generic_writer[offset + i] = static_cast<u16>(writer.tid + 1);
        c.generic_clock[offset + i] = own_clock(writer);
    }
}

// Async-proxy writes (TMA) replace whatever the generic proxy wrote.
inline void async_write(u32 cta, u32 offset, u32 bytes) {
    Cta& c = L().ctas[cta];
    std::memset(&c.generic_writer[offset], 0, size_t(bytes) * sizeof(u16));
}

// The first fence.proxy.async of `w` after its clock `clock`, or 0.
inline u32 fence_after(const Thread& w, u32 clock) {
    auto it = std::upper_bound(w.fence_clocks.begin(), w.fence_clocks.end(), clock);
    return it == w.fence_clocks.end() ? 0 : *it;
}

// `reader` (this thread) makes the async proxy read [offset, offset + bytes) of its CTA (`what` names how).
inline void check_async_read(u32 offset, u32 bytes, const char* what) {
    Thread& reader = me();
    Cta& c = my_cta();
    for (u32 i = 0; i < bytes; ++i) {
        const u16 w = c.generic_writer[offset + i];
        if (w == 0) continue;
        const Thread& writer = thread_at(reader.cta, w - 1u);
        const u32 fence = fence_after(writer, c.generic_clock[offset + i]);
        if (fence == 0)
            fail(format("proxy: %s reads smem+%#x of cta %u, written through the generic proxy by thread %u (%s) with "
                        "no fence.proxy.async (fence_view_async_shared) by that thread after the write",
                        what, offset + i, reader.cta, writer.tid, site_text(writer.generic_write_site).c_str()));
        if (writer.tid != reader.tid && known_clock(reader, writer.tid) < fence)
            fail(format("proxy: %s reads smem+%#x of cta %u, written through the generic proxy by thread %u (%s) and "
                        "fenced, but no barrier orders that fence before this thread's read",
                        what, offset + i, reader.cta, writer.tid, site_text(writer.generic_write_site).c_str()));
    }
}

// fence.proxy.async.shared::cta by this thread.
DFG_SIM_API void fence_proxy_async() {
    Thread& t = me();
    t.fence_clocks.push_back(tick(t));
}

// fence.mbarrier_init.release.cluster or fence.proxy.async by this thread: its mbarrier.inits so far become
// visible to the async proxy and (once a barrier orders the fence) to the cluster.
DFG_SIM_API void fence_mbarrier_inits() {
    Thread& t = me();
    const u32 clock = tick(t);
    const u64 gen = L().clusters[t.cta / L().cfg.cluster_x].barrier.generation;
    for (auto& [offset, mb] : my_cta().mbarriers) {
        (void)offset;
        if (mb.init_tid == t.tid && mb.fenced_clock == 0) {
            mb.fenced_clock = clock;
            mb.fence_cluster_gen = gen;
        }
    }
}

// An async-proxy operation (TMA complete_tx) or a remote arrive on `mb` (smem+offset of `cta`) by this thread.
inline void check_mbarrier_visible(const Mbarrier& mb, u32 cta, u32 offset, const char* use) {
    Thread& t = me();
    if (mb.fenced_clock == 0)
        fail(format("proxy: %s uses the mbarrier at smem+%#x of cta %u, initialised by thread %u (%s) without a "
                    "fence.mbarrier_init.release.cluster / fence.proxy.async after the init",
                    use, offset, cta, mb.init_tid, site_str(mb.init_site).c_str()));
    if (cta == t.cta) {
        if (t.tid != mb.init_tid && known_clock(t, mb.init_tid) < mb.fenced_clock)
            fail(format("proxy: %s uses the mbarrier at smem+%#x of cta %u before a barrier ordered its fenced "
                        "initialisation by thread %u (%s) before this thread",
                        use, offset, cta, mb.init_tid, site_str(mb.init_site).c_str()));
    } else if (t.cluster_gen <= mb.fence_cluster_gen) {
        fail(format("proxy: %s uses the mbarrier at smem+%#x of cta %u before a cluster barrier (cluster_sync) ordered "
                    "its initialisation by thread %u of cta %u (%s) before this thread",
                    use, offset, cta, mb.init_tid, cta, site_str(mb.init_site).c_str()));
    }
}

}  // namespace dfg::sim::detail
