// deep_fp8_gemm CPU simulator: the thread-facing operations the hal wraps.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- thread-facing operations (hal wraps them)

inline void sync_threads() {
    aligned("bar.sync 0 (sync_threads)");
    Cta& c = my_cta();
    thread_barrier_sync(c.named[0], kAllThreads, c.live, WaitKind::NamedBarrier, me().cta, 0, "sync_threads");
}

// The round of named barrier `id` is a bar.sync (kind 1) or a bar.red.or (kind 2) round: not both.
inline ThreadBarrier& named_barrier_round(u32 id, u32 num_threads, u32 kind, const char* what) {
    if (id >= 16) fail(format("%s: barrier id %u is not in 0..15", what, id));
    if (num_threads == 0 || num_threads % 32 || num_threads > L().cfg.block_x)
        fail(format("%s(%u): thread count %u must be a positive multiple of 32 <= %u", what, id, num_threads,
                    L().cfg.block_x));
    ThreadBarrier& b = my_cta().named[id];
    if (b.red_kind != 0 && b.red_kind != kind)
        fail(format("%s(%u): bar.sync and bar.red used in the same round of the barrier", what, id));
    b.red_kind = kind;
    return b;
}

inline void named_barrier_sync(u32 id, u32 num_threads) {
    const char* what = "named_barrier_sync";
    ThreadBarrier& b = named_barrier_round(id, num_threads, 1, what);
    aligned("bar.sync (named_barrier_sync)");
    Cta& c = my_cta();
    thread_barrier_sync(b, num_threads, c.live, WaitKind::NamedBarrier, me().cta, id, what);
}

// The result is read when this thread resumes: the next round cannot complete before this thread arrives in it.
inline bool named_barrier_sync_or(u32 id, u32 num_threads, bool pred) {
    const char* what = "named_barrier_sync_or";
    ThreadBarrier& b = named_barrier_round(id, num_threads, 2, what);
    aligned("bar.red.or (named_barrier_sync_or)");
    b.red_or = b.red_or || pred;
    Cta& c = my_cta();
    thread_barrier_sync(b, num_threads, c.live, WaitKind::NamedBarrier, me().cta, id, what);
    return b.red_result;
}

// atom.global.add.u32 on host memory standing for global memory.
inline u32 atomic_add_global(u32* ptr, u32 value, const char* what) {
    const Launch& l = L();
    const u8* p = reinterpret_cast<const u8*>(ptr);
    for (u32 c = 0; c < l.ctas.size(); ++c)
        if (p >= l.ctas[c].smem && p < l.ctas[c].smem + l.cfg.dynamic_smem_bytes)
            fail(format("%s: %p points into the shared memory of cta %u, not global memory", what, ptr, c));
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 4)
        fail(format("%s: address %p is null or not 4-byte aligned", what, ptr));
    const u32 old = *ptr;
    *ptr = old + value;
    return old;
}

inline void cluster_sync() {
    aligned("barrier.cluster (cluster_sync)");
    const u32 index = me().cta / L().cfg.cluster_x;
    Launch::Cluster& cluster = L().clusters[index];
    thread_barrier_sync(cluster.barrier, kAllThreads, cluster.live, WaitKind::ClusterBarrier, index, 0,
                        "cluster_sync", me().cta % L().cfg.cluster_x);
}

inline void mbar_init(u64* bar, u32 arrive_count) {
    const u32 offset = mbarrier_offset(bar, "mbar_init");
    if (arrive_count == 0 || arrive_count > u32(kMaxTxCount))
        fail(format("mbar_init: arrive count %u must be in [1, 2^20-1]", arrive_count));
    Mbarrier mb{arrive_count, arrive_count, 0, 0};
    mb.init_tid = me().tid;
    mb.init_site = me().site;
    my_cta().mbarriers[offset] = mb;
    std::memcpy(bar, &kMbarrierTag, 8);
}

inline u32 cluster_map_shared(const void* ptr, u32 cta_rank) {
    const u32 cluster_x = L().cfg.cluster_x;
    if (cta_rank >= cluster_x)
        fail(format("cluster_map_shared: cta rank %u outside the cluster of %u CTAs", cta_rank, cluster_x));
    const u32 offset = smem_offset(ptr, "cluster_map_shared");
    if (offset >> 24) fail(format("cluster_map_shared: smem+%#x does not fit the simulator's 24-bit offsets", offset));
    return cta_rank << 24 | offset;
}

inline void mbar_arrive_remote(u32 cluster_addr, const char* what = "mbar_arrive_remote") {
    const u32 cta_rank = cluster_addr >> 24, offset = cluster_addr & 0xFFFFFFu;
    const u32 cluster_x = L().cfg.cluster_x;
    if (cta_rank >= cluster_x)
        fail(format("%s: cta rank %u outside the cluster of %u CTAs", what, cta_rank, cluster_x));
    if (offset % 8) fail(format("%s: mbarrier address smem+%#x is not 8-byte aligned", what, offset));
    check_smem_range(offset, 8, what);
    const u32 target = me().cta / cluster_x * cluster_x + cta_rank;
    if (target != me().cta) {
        remote_access(target, format("%s (remote arrive)", what).c_str());
        check_mbarrier_visible(mbarrier_at(target, offset, what), target, offset,
                               format("a remote arrive (%s)", what).c_str());
    }
    mbarrier_arrive(target, offset, 0, what);
}

inline void mbar_arrive_cluster(u64* bar, u32 cta_rank) {
    const u32 cluster_x = L().cfg.cluster_x;
    if (cta_rank >= cluster_x)
        fail(format("mbar_arrive_cluster: cta rank %u outside the cluster of %u CTAs", cta_rank, cluster_x));
    mbar_arrive_remote(cta_rank << 24 | mbarrier_offset(bar, "mbar_arrive_cluster"), "mbar_arrive_cluster");
}

inline void mbar_wait(u64* bar, u32 parity, BarrierName name) {
    const u32 offset = mbarrier_offset(bar, "mbar_wait");
    const Mbarrier& mb = mbarrier_at(me().cta, offset, "mbar_wait");
    if ((mb.phase & 1) != (parity & 1)) return;
    block(Wait{WaitKind::Mbarrier, me().cta, offset, parity & 1, 0, name}, "mbar_wait");
}

inline void tma_store(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2) {
    const char* what = "tma_store_3d";
    const Box box(tensor_map(map, what), c0, c1, c2);
    const u32 offset = smem_offset(src, what);
    box.check_smem(offset, what);
    check_async_read(offset, box.footprint, "a TMA store (async proxy)");
    const u8* smem = my_cta().smem;
    for (u32 row = 0; row < box.rows; ++row) {
        u8* g = const_cast<u8*>(box.row_global(row));
        if (!g) continue;
        for (u32 x = 0; x < box.map.box_dims[0]; ++x) {
            if (!box.x_in_bounds(x)) continue;
            const u32 s = swizzle(offset + row * box.row_bytes + x * box.eb, box.swz);
            std::memcpy(g + (i64(c0) + x) * box.eb, smem + s, box.eb);
        }
    }
    me().open_stores.push_back(StoreRecord{offset, std::vector<u8>(smem + offset, smem + offset + box.footprint)});
}

inline void tma_store_commit() {
    Thread& t = me();
    t.committed_stores.push_back(std::move(t.open_stores));
    t.open_stores.clear();
}

inline void tma_store_wait_read(u32 n) {
    Thread& t = me();
    while (t.committed_stores.size() > n) {
        for (const StoreRecord& r : t.committed_stores.front())
            if (std::memcmp(my_cta().smem + r.offset, r.snapshot.data(), r.snapshot.size()) != 0)
                fail(format("shared-memory source [%#x, %#zx) of a TMA store was overwritten before "
                            "tma_store_wait_read / tma_store_wait_all released it",
                            r.offset, r.offset + r.snapshot.size()));
        t.committed_stores.pop_front();
    }
}

inline WgmmaGroup& wgmma_open_group(Warpgroup& wg, u64 g) {
    while (wg.executed + wg.groups.size() <= g) wg.groups.emplace_back();
    return wg.groups[g - wg.executed];
}

inline void wgmma_issue(u32 n, u64 desc_a, u64 desc_b, float* d, bool scale_d) {
    Thread& t = me();
    aligned("wgmma.mma_async", true);
    Warpgroup& wg = my_warpgroup("wgmma");
    check_wgmma_registers(t.tid / kWarpgroupThreads, n);
    if (!t.wgmma_fenced) fail("wgmma issued without wgmma_fence since the last wgmma_wait (PTX ISA wgmma.fence)");
    const u64 g = t.wgmma_commits;
    WgmmaGroup& group = wgmma_open_group(wg, g);
    const u32 k = t.wgmma_ops_in_open_group++;
    if (k == group.ops.size()) {
        WgmmaOp op;
        op.desc_a = desc_a;
        op.desc_b = desc_b;
        op.n = n;
        op.scale_d = scale_d;
        decode_operand(desc_a, 64, op.addr_a, op.lo_a, op.hi_a, "A");
        decode_operand(desc_b, n, op.addr_b, op.lo_b, op.hi_b, "B");
        // Operands are read by the async proxy from here to the wait that retires the group.
        const Cta& cta = my_cta();
        const u8* smem = cta.smem;
        const u16* writer = cta.generic_writer.data();
        op.snapshot.resize(op.addr_a.size() + op.addr_b.size());
        for (size_t i = 0; i < op.addr_a.size(); ++i) {
            if (writer[op.addr_a[i]]) check_async_read(op.addr_a[i], 1, "a wgmma operand A read (async proxy)");
            op.snapshot[i] = smem[op.addr_a[i]];
        }
        for (size_t i = 0; i < op.addr_b.size(); ++i) {
            if (writer[op.addr_b[i]]) check_async_read(op.addr_b[i], 1, "a wgmma operand B read (async proxy)");
            op.snapshot[op.addr_a.size() + i] = smem[op.addr_b[i]];
        }
        op.issue_site = t.site;
        op.issue_tid = t.tid;
        group.ops.push_back(std::move(op));
    }
    WgmmaOp& op = group.ops[k];
    if (op.desc_a != desc_a || op.desc_b != desc_b || op.n != n || op.scale_d != scale_d)
        fail(format("wgmma is warpgroup-collective but this thread's operands differ from its warpgroup's: "
                    "(desc_a %#llx, desc_b %#llx, N %u, scale_d %d) vs (%#llx, %#llx, %u, %d) in wgmma %u of group "
                    "%llu",
                    static_cast<unsigned long long>(desc_a), static_cast<unsigned long long>(desc_b), n, scale_d,
                    static_cast<unsigned long long>(op.desc_a), static_cast<unsigned long long>(op.desc_b), op.n,
                    op.scale_d, k, static_cast<unsigned long long>(g)));
    op.frag[t.tid % kWarpgroupThreads] = d;
    ++op.issued;
}

inline void wgmma_fence() {
    aligned("wgmma.fence", true);
    me().wgmma_fenced = true;
}

inline void wgmma_commit() {
    aligned("wgmma.commit_group", true);
    Thread& t = me();
    Warpgroup& wg = my_warpgroup("wgmma_commit");
    const u64 g = t.wgmma_commits;
    WgmmaGroup& group = wgmma_open_group(wg, g);
    if (t.wgmma_ops_in_open_group != group.ops.size())
        fail(format("wgmma_commit: this thread issued %u wgmma in group %llu, its warpgroup issued %zu",
                    t.wgmma_ops_in_open_group, static_cast<unsigned long long>(g), group.ops.size()));
    ++t.wgmma_commits;
    t.wgmma_ops_in_open_group = 0;
    if (++group.committed < kWarpgroupThreads) return;
    for (u32 k = 0; k < group.ops.size(); ++k)  // a thread may have committed before others issued more
        if (group.ops[k].issued != kWarpgroupThreads)
            fail(format("wgmma_commit: only %u of 128 threads issued wgmma %u of group %llu", group.ops[k].issued, k,
                        static_cast<unsigned long long>(g)));
    wg.complete = g + 1;
}

inline void wgmma_wait(u32 n) {
    aligned("wgmma.wait_group", true);
    Thread& t = me();
    Warpgroup& wg = my_warpgroup("wgmma_wait");
    t.wgmma_fenced = false;
    if (t.wgmma_commits <= n) return;
    const u64 target = t.wgmma_commits - n;  // groups [0, target) must be complete
    if (wg.complete < target)
        block(Wait{WaitKind::WgmmaGroup, t.cta, t.tid / kWarpgroupThreads, 0, target}, "wgmma_wait");
    while (wg.executed < target) {
        for (const WgmmaOp& op : wg.groups.front().ops) {
            check_read_window(op, my_cta().smem);
            execute(op, my_cta().smem);
        }
        wg.groups.pop_front();
        ++wg.executed;
    }
}

// bar.warp.sync 0xffffffff (PTX ISA "bar.warp.sync"): the 32 lanes meet (a warp rendezvous, like stmatrix's), so
// each lane's memory accesses before it are ordered before every lane's after it.
inline void warp_sync() {
    aligned("bar.warp.sync");
    Thread& t = me();
    WarpRendezvous& w = my_cta().warps[t.tid / 32];
    const u64 generation = w.generation;
    if (++w.arrived < 32) {
        block(Wait{WaitKind::StmatrixWarp, t.cta, t.tid / 32, 0, generation}, "bar.warp.sync");
        return;
    }
    w.arrived = 0;
    ++w.generation;
}

inline void stmatrix_x4(void* row_ptr, const u32 (&regs)[4]) {
    const char* what = "stmatrix_x4";
    aligned("stmatrix.sync.aligned");
    const u32 offset = smem_offset(row_ptr, what);
    if (offset % 16) fail(format("%s: row address smem+%#x is not 16-byte aligned", what, offset));
    check_smem_range(offset, 16, what);
    Thread& t = me();
    WarpRendezvous& w = my_cta().warps[t.tid / 32];
    const u32 lane = t.tid % 32;
    w.row_offset[lane] = offset;
    std::memcpy(w.regs[lane], regs, sizeof regs);
    const u64 generation = w.generation;
    if (++w.arrived < 32) {
        block(Wait{WaitKind::StmatrixWarp, t.cta, t.tid / 32, 0, generation}, what);
        return;
    }
    u8* smem = my_cta().smem;
    for (u32 l = 0; l < 32; ++l) {
        const u32 matrix = l / 8, row = l % 8;
        check_no_mbarrier_overlap(t.cta, w.row_offset[l], 16, what);
        for (u32 c = 0; c < 4; ++c) std::memcpy(smem + w.row_offset[l] + 4 * c, &w.regs[row * 4 + c][matrix], 4);
        Thread& writer = thread_at(t.cta, t.tid / 32 * 32 + l);  // the lane that gave the row address
        generic_write(t.cta, w.row_offset[l], 16, writer);
        writer.generic_write_site = t.site;  // all lanes execute the same stmatrix (convergence)
    }
    w.arrived = 0;
    ++w.generation;
}

}  // namespace dfg::sim::detail
