// deep_fp8_gemm CPU simulator: convergence of .aligned operations.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// PTX ISA: an instruction with the .aligned qualifier must be executed by all threads of the warp (for the
// wgmma.* and setmaxnreg instructions: of the warpgroup) in convergence, i.e. the same instruction in the
// same dynamic instance; otherwise the behaviour is undefined (hangs or corrupts on the hardware). Here each
// warp and warpgroup keeps the sequence of its .aligned operations (name + call site): a lane's n-th
// .aligned operation must equal every other lane's n-th, and a lane may not exit while other lanes of its
// warp (warpgroup) executed .aligned operations it has not. Operations checked: bar.sync (sync_threads,
// named_barrier_sync), barrier.cluster (cluster_sync), stmatrix (warp); wgmma.fence / mma_async /
// commit_group / wait_group and setmaxnreg (warpgroup, and warp).
#pragma once

namespace dfg::sim::detail {

inline std::string ordinal(u64 n) {
    const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th" : n % 10 == 1 ? "st" : n % 10 == 2 ? "nd"
                                                                                       : n % 10 == 3 ? "rd" : "th";
    return std::to_string(n) + suffix;
}

// One .aligned operation of this thread in `log` (lanes = 32 or 128, `unit` names the group).
inline void aligned_step(AlignedLog& log, u32 lane, u32 unit_index, const char* unit, const char* op) {
    Thread& t = me();
    const u64 k = log.count[lane]++;
    if (k - log.base < log.entries.size()) {
        const AlignedEntry& e = log.entries[k - log.base];
        if (e.op != op && std::strcmp(e.op, op) != 0)
            fail(format("convergence: .aligned operations diverged in %s %u: this thread's %s .aligned operation is "
                        "%s, thread %u's is %s at %s (all threads of the %s must execute the same .aligned "
                        "instruction at the same call site in the same round)",
                        unit, unit_index, ordinal(k + 1).c_str(), op, e.tid, e.op, site_str(e.site).c_str(), unit));
        if (e.site.line != t.site.line || std::strcmp(e.site.file, t.site.file) != 0)
            fail(format("convergence: .aligned operations diverged in %s %u: this thread executed its %s .aligned "
                        "operation %s at a different call site than thread %u (%s) (all threads of the %s must "
                        "execute the same .aligned instruction at the same call site in the same round)",
                        unit, unit_index, ordinal(k + 1).c_str(), op, e.tid, site_str(e.site).c_str(), unit));
    } else {
        // A lane that has exited can never execute this one.
        const u32 first = t.tid - lane;
        const bool any_exited = L().ctas[t.cta].live < L().cfg.block_x;
        for (u32 l = 0; any_exited && l < log.count.size(); ++l) {
            const Thread& other = *L().threads[size_t(t.cta) * L().cfg.block_x + first + l];
            if (other.done && log.count[l] <= k)
                fail(format("convergence: %s is this thread's %s .aligned operation, but thread %u of its %s %u "
                            "exited after %llu (all threads of the %s must execute it)",
                            op, ordinal(k + 1).c_str(), other.tid, unit, unit_index,
                            static_cast<unsigned long long>(log.count[l]), unit));
        }
        log.entries.push_back(AlignedEntry{op, t.site, t.tid});
    }
    // Drop what every lane has passed (only the slowest lanes can move the front).
    if (k != log.base) return;
    u64 slowest = log.count[0];
    for (u64 c : log.count) slowest = c < slowest ? c : slowest;
    while (log.base < slowest && !log.entries.empty()) {
        log.entries.pop_front();
        ++log.base;
    }
}

// A .aligned operation over the warp (and, for warpgroup-wide instructions, the warpgroup).
DFG_SIM_API void aligned(const char* op, bool warpgroup_wide) {
    Thread& t = me();
    Cta& c = my_cta();
    aligned_step(c.warp_aligned[t.tid / 32], t.tid % 32, t.tid / 32, "warp", op);
    if (warpgroup_wide && t.tid / kWarpgroupThreads < c.warpgroup_aligned.size())
        aligned_step(c.warpgroup_aligned[t.tid / kWarpgroupThreads], t.tid % kWarpgroupThreads,
                     t.tid / kWarpgroupThreads, "warpgroup", op);
}

// At thread exit: no other lane of its warp / warpgroup may have executed a .aligned operation this one has not.
inline void aligned_exit_check(const AlignedLog& log, u32 lane, const char* unit, u32 unit_index) {
    const u64 k = log.count[lane];
    if (k - log.base < log.entries.size()) {
        const AlignedEntry& e = log.entries[k - log.base];
        fail(format("convergence: thread exits after %llu .aligned operations, but thread %u of its %s %u executed "
                    "%s at %s as its %s (all threads of the %s must execute it)",
                    static_cast<unsigned long long>(k), e.tid, unit, unit_index, e.op, site_str(e.site).c_str(),
                    ordinal(k + 1).c_str(), unit));
    }
}

inline void aligned_on_exit() {
    Thread& t = me();
    Cta& c = my_cta();
    t.site = Site{"(thread exit)", 0};
    aligned_exit_check(c.warp_aligned[t.tid / 32], t.tid % 32, "warp", t.tid / 32);
    if (t.tid / kWarpgroupThreads < c.warpgroup_aligned.size())
        aligned_exit_check(c.warpgroup_aligned[t.tid / kWarpgroupThreads], t.tid % kWarpgroupThreads, "warpgroup",
                           t.tid / kWarpgroupThreads);
}

inline void aligned_init(Cta& c, u32 block_x) {
    c.warp_aligned.assign((block_x + 31) / 32, AlignedLog{});
    for (u32 w = 0; w < c.warp_aligned.size(); ++w)
        c.warp_aligned[w].count.assign(block_x - 32 * w < 32 ? block_x - 32 * w : 32, 0);
    c.warpgroup_aligned.assign(block_x / kWarpgroupThreads, AlignedLog{});
    for (AlignedLog& log : c.warpgroup_aligned) log.count.assign(kWarpgroupThreads, 0);
}

}  // namespace dfg::sim::detail
