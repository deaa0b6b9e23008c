// deep_fp8_gemm CPU simulator: cluster lifetime.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// PTX ISA "Cluster of Cooperative Thread Arrays" / CUDA programming guide "Distributed Shared Memory": a
// CTA's shared memory (and the mbarriers in it) exists only while the CTA runs, so a CTA must not exit while
// a peer may still access it; kernels end with a cluster barrier for that. Reported here: a remote operation
// (TMA multicast, remote mbarrier arrive) that targets a CTA which has exited, a TMA load still in flight
// into an exiting CTA, and a CTA that exits while a peer that still runs made a remote operation into it with
// no cluster barrier completed since (the peer can still do so: nothing ordered its accesses before the exit).
#pragma once

namespace dfg::sim::detail {

// This thread's CTA makes a remote operation (`what`) into `target` (a CTA of its cluster, not itself).
inline void remote_access(u32 target, const char* what) {
    Thread& t = me();
    if (target == t.cta) return;
    Launch& l = L();
    Cta& c = l.ctas[target];
    if (c.exited)
        fail(format("cluster lifetime: %s targets cta %u of the cluster, which has already exited (its shared memory "
                    "and mbarriers no longer exist)",
                    what, target));
    const u32 rank = t.cta % l.cfg.cluster_x;
    c.remote_gen[rank] = static_cast<i64>(l.clusters[t.cta / l.cfg.cluster_x].barrier.generation);
    c.remote_tid[rank] = t.tid;
    c.remote_site[rank] = t.site;
}

// The last thread of this CTA exits.
inline void cta_exit_check() {
    Launch& l = L();
    const u32 cta = me().cta;
    Cta& c = l.ctas[cta];
    c.exited = true;
    for (const PendingLoad& load : l.pending_loads)
        if (load.cta_mask >> (cta - load.first_cta) & 1)
            fail(format("cluster lifetime: cta %u exits while a TMA load into its shared memory (smem+%#x) is still "
                        "in flight",
                        cta, load.offset));
    const u32 first = cta / l.cfg.cluster_x * l.cfg.cluster_x;
    const u64 gen = l.clusters[cta / l.cfg.cluster_x].barrier.generation;
    for (u32 rank = 0; rank < l.cfg.cluster_x; ++rank) {
        const u32 peer = first + rank;
        if (peer == cta || l.ctas[peer].exited || c.remote_gen[rank] < 0) continue;
        if (static_cast<u64>(c.remote_gen[rank]) >= gen)
            fail(format("cluster lifetime: cta %u exits while cta %u of its cluster still runs and can still arrive "
                        "on its barriers or multicast into it: thread %u of cta %u made a remote operation into it at "
                        "%s and no cluster barrier (cluster_sync) completed since",
                        cta, peer, c.remote_tid[rank], peer, site_str(c.remote_site[rank]).c_str()));
    }
}

}  // namespace dfg::sim::detail
