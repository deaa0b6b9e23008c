// deep_fp8_gemm CPU simulator: mbarrier and thread-barrier emulation.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- mbarrier

inline Mbarrier& mbarrier_at(u32 cta, u32 offset, const char* what) {
    Cta& c = L().ctas[cta];
    auto it = c.mbarriers.find(offset);
    if (it == c.mbarriers.end())
        fail(format("%s: mbarrier at smem+%#x of cta %u is not initialised (no mbar_init)", what, offset, cta));
    u64 tag;
    std::memcpy(&tag, c.smem + offset, 8);
    if (tag != kMbarrierTag)
        fail(format("%s: the 8 bytes of the mbarrier at smem+%#x of cta %u were overwritten by a store", what,
                    offset, cta));
    return it->second;
}

DFG_SIM_API u32 mbarrier_offset(const u64* bar, const char* what) {
    const u32 offset = smem_offset(bar, what);
    if (offset % 8) fail(format("%s: mbarrier address smem+%#x is not 8-byte aligned", what, offset));
    check_smem_range(offset, 8, what);
    return offset;
}

// The phase completes when all expected arrivals and all expected transaction bytes are in; the pending
// count is then reloaded (PTX ISA "Phase completion of the mbarrier object"). Its waiters acquire what the
// phase's arrivals released (hb.hpp).
inline void mbarrier_maybe_complete(Mbarrier& mb) {
    if (mb.pending == 0 && mb.tx == 0) {
        mb.released[mb.phase & 1] = std::move(mb.arrivals);
        mb.arrivals.clear();
        ++mb.phase;
        mb.pending = mb.expected;
    }
}

// An arrival of the current thread on the mbarrier at smem+offset of `cta` (its own or, remote, a peer's):
// mbarrier.arrive's default semantics are .release.cta, whichever CTA the barrier is in.
DFG_SIM_API void mbarrier_arrive(u32 cta, u32 offset, u32 tx_bytes, const char* what) {
    Mbarrier& mb = mbarrier_at(cta, offset, what);
    if (mb.pending == 0)  // only possible while tx bytes are outstanding: an arrival beyond the count
        fail(format("%s: arrival beyond the expected count %u on the mbarrier at smem+%#x of cta %u (phase %llu "
                    "already has all arrivals, %lld tx bytes outstanding)",
                    what, mb.expected, offset, cta, static_cast<unsigned long long>(mb.phase),
                    static_cast<long long>(mb.tx)));
    mb.tx += tx_bytes;  // expect-tx precedes the arrive (PTX ISA "mbarrier.arrive", .expect_tx)
    if (mb.tx > kMaxTxCount)
        fail(format("%s: tx-count %lld of the mbarrier at smem+%#x exceeds 2^20-1", what,
                    static_cast<long long>(mb.tx), offset));
    --mb.pending;
    Thread& t = me();
    sync_release(mb.arrivals, t, Scope::Cta, true, cta == t.cta ? "mbarrier arrive (.release.cta)"
                                                                 : "a remote mbarrier arrive (.release.cta)",
                 site_id(t.site));
    mbarrier_maybe_complete(mb);
}

// complete-tx from a landing TMA load (PTX ISA "tx-count": may precede the expect-tx). Runs in
// the scheduler, so it returns an error message instead of failing a thread.
inline std::string mbarrier_complete_tx(u32 cta, u32 offset, u32 bytes, const PendingLoad& load) {
    Mbarrier& mb = L().ctas[cta].mbarriers.at(offset);
    const Thread& issuer = *S().threads[u32(load.epoch >> 32) - 1];
    sync_release_clocks(mb.arrivals, load.issuer, issuer.gcta, issuer.gtid, Scope::Async, true, "TMA complete_tx",
                        load.site);
    mb.tx -= bytes;
    if (mb.tx < -kMaxTxCount)
        return format("tx-count of the mbarrier at smem+%#x of cta %u underflows (%lld): more TMA bytes than expected",
                      offset, cta, static_cast<long long>(mb.tx));
    mbarrier_maybe_complete(mb);
    return "";
}

// ---------------------------------------------------------------- thread barriers

// Opens the next generation once everybody expected has arrived; `live` is the number of threads not exited.
inline void thread_barrier_release(ThreadBarrier& b, u32 live) {
    if (b.arrived == 0 || b.arrived < (b.expected == kAllThreads ? live : b.expected)) return;
    b.arrived = 0;
    b.expected = 0;
    b.red_result = b.red_or;
    b.red_or = false;
    b.red_kind = 0;
    ++b.generation;
    hb_release(b);
}

// Every arrival releases into the round, every participant acquires the completed round (hb.hpp).
inline void thread_barrier_sync(ThreadBarrier& b, u32 count, u32 live, WaitKind kind, u32 cta, u32 key,
                                const char* op) {
    if (b.expected == 0) {
        b.expected = count;
    } else if (b.expected != count) {
        const auto show = [](u32 n) { return n == kAllThreads ? std::string("all") : std::to_string(n); };
        fail(format("%s: barrier %u used with thread counts %s and %s in the same round", op, key,
                    show(b.expected).c_str(), show(count).c_str()));
    }
    const u64 generation = b.generation;
    Thread& t = me();
    hb_arrive(b, t);
    ++b.arrived;
    thread_barrier_release(b, live);
    if (b.generation == generation) block(Wait{kind, cta, key, 0, generation}, op);
    hb_acquire(b, t);
    if (kind == WaitKind::ClusterBarrier) t.cluster_gen = generation + 1;
}

}  // namespace dfg::sim::detail
