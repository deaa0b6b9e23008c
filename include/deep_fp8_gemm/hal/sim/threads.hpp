// deep_fp8_gemm CPU simulator: the thread-facing operations the hal wraps.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- thread-facing operations (hal wraps them)

DFG_SIM_API void sync_threads() {
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

DFG_SIM_API void named_barrier_sync(u32 id, u32 num_threads) {
    const char* what = "named_barrier_sync";
    ThreadBarrier& b = named_barrier_round(id, num_threads, 1, what);
    aligned("bar.sync (named_barrier_sync)");
    Cta& c = my_cta();
    thread_barrier_sync(b, num_threads, c.live, WaitKind::NamedBarrier, me().cta, id, what);
}

// The result is read when this thread resumes: the next round cannot complete before this thread arrives in it.
DFG_SIM_API bool named_barrier_sync_or(u32 id, u32 num_threads, bool pred) {
    const char* what = "named_barrier_sync_or";
    ThreadBarrier& b = named_barrier_round(id, num_threads, 2, what);
    aligned("bar.red.or (named_barrier_sync_or)");
    b.red_or = b.red_or || pred;
    Cta& c = my_cta();
    thread_barrier_sync(b, num_threads, c.live, WaitKind::NamedBarrier, me().cta, id, what);
    return b.red_result;
}

DFG_SIM_API void cluster_sync() {
    aligned("barrier.cluster (cluster_sync)");
    const u32 index = me().cta / L().cfg.cluster_x;
    Launch::Cluster& cluster = L().clusters[index];
    thread_barrier_sync(cluster.barrier, kAllThreads, cluster.live, WaitKind::ClusterBarrier, index, 0,
                        "cluster_sync");
}

DFG_SIM_API void mbar_init(u64* bar, u32 arrive_count) {
    const u32 offset = mbarrier_offset(bar, "mbar_init");
    if (arrive_count == 0 || arrive_count > u32(kMaxTxCount))
        fail(format("mbar_init: arrive count %u must be in [1, 2^20-1]", arrive_count));
    Mbarrier mb{arrive_count, arrive_count, 0, 0};
    mb.init_tid = me().tid;
    mb.init_site = me().site;
    my_cta().mbarriers[offset] = mb;
    std::memcpy(bar, &kMbarrierTag, 8);
}

inline void check_cluster_rank(u32 cta_rank, const char* what) {
    const u32 cluster_x = L().cfg.cluster_x;
    if (cta_rank >= cluster_x)
        fail(format("%s: cta rank %u outside the cluster of %u CTAs", what, cta_rank, cluster_x));
}

// The arrive of mbarrier.arrive.shared::cluster on the barrier at `offset` of CTA `cta_rank` of this cluster
// (`remote`, `use`: how reports name the remote access and the arrive; string literals, kept by the reports).
inline void arrive_in_cluster(u32 cta_rank, u32 offset, const char* what, const char* remote, const char* use) {
    const u32 cluster_x = L().cfg.cluster_x;
    const u32 target = me().cta / cluster_x * cluster_x + cta_rank;
    if (target != me().cta) {
        remote_access(target, remote);
        check_mbarrier_visible(mbarrier_at(target, offset, what), target, offset, use);
    }
    mbarrier_arrive(target, offset, 0, what);
}

DFG_SIM_API void mbar_arrive_cluster(u64* bar, u32 cta_rank) {
    check_cluster_rank(cta_rank, "mbar_arrive_cluster");
    arrive_in_cluster(cta_rank, mbarrier_offset(bar, "mbar_arrive_cluster"), "mbar_arrive_cluster",
                      "mbar_arrive_cluster (remote arrive)", "a remote arrive (mbar_arrive_cluster)");
}

// The emulation's shared::cluster addresses: rank << 24 | offset (a CTA's shared memory is < 16 MiB), so an address
// plus an element offset stays in its CTA, as mapa's result on the GPU.
constexpr u32 kClusterRankShift = 24;

DFG_SIM_API u32 cluster_smem_address(const void* ptr, u32 cta_rank) {
    check_cluster_rank(cta_rank, "cluster_smem_address (mapa)");
    return cta_rank << kClusterRankShift | smem_offset(ptr, "cluster_smem_address (mapa)");
}

DFG_SIM_API void mbar_arrive_cluster_address(u32 address) {
    const char* what = "mbar_arrive_cluster_address";
    const u32 offset = address & ((1u << kClusterRankShift) - 1);
    check_cluster_rank(address >> kClusterRankShift, what);
    if (offset % 8 || offset + 8 > L().cfg.dynamic_smem_bytes)
        fail(format("%s: shared::cluster address %#x (offset %#x) is not an 8-byte-aligned barrier in shared memory",
                    what, address, offset));
    arrive_in_cluster(address >> kClusterRankShift, offset, what, "mbar_arrive_cluster_address (remote arrive)",
                      "a remote arrive (mbar_arrive_cluster_address)");
}

// mbarrier.try_wait.parity's default semantics are .acquire.cta: the waiter acquires what the completed phase's
// arrivals released, where the scopes allow (hb.hpp).
DFG_SIM_API void mbar_wait(u64* bar, u32 parity, BarrierName name) {
    const u32 offset = mbarrier_offset(bar, "mbar_wait");
    if ((mbarrier_at(me().cta, offset, "mbar_wait").phase & 1) == (parity & 1))
        block(Wait{WaitKind::Mbarrier, me().cta, offset, parity & 1, 0, name}, "mbar_wait");
    const Mbarrier& mb = mbarrier_at(me().cta, offset, "mbar_wait");
    sync_acquire(me(), mb.released[parity & 1], Scope::Cta, true, "mbar_wait (.acquire.cta)", site_id(me().site));
}

// cp.async.bulk.tensor.3d.global.shared::cta.bulk_group (PTX ISA "cp.async.bulk.tensor"): checked and its source
// captured at the issue; the source must stay unchanged until a cp.async.bulk.wait_group.read covers the group, and
// the global writes happen when the group completes: at a cp.async.bulk.wait_group (without .read) covering it, or at
// the thread's exit (the kernel's completion makes them visible to the next kernel). PTX ISA
// "cp.async.bulk.wait_group": .read only says the sources have been read; the writes of a group are complete, and
// visible to the executing thread, once a wait_group without .read covers it. Before, the writes were made at the
// issue, so a reader synchronised with the issuer right after the issue (or after wait_group.read) saw them.
DFG_SIM_API void tma_store(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2) {
    const char* what = "tma_store_3d";
    const Box box(tensor_map(map, what), c0, c1, c2);
    const u32 offset = smem_offset(src, what);
    box.check_smem(offset, what);
    check_async_read(offset, box.footprint, "a TMA store (async proxy)");
    const u8* smem = my_cta().smem;
    Thread& t = me();
    const u32 site = site_id(t.site);
    if (S().races) async_access(t, uintptr_t(smem + offset), box.footprint, false, false, site, "a TMA store's read");
    StoreRecord r{offset, std::vector<u8>(smem + offset, smem + offset + box.footprint), site, box.map, {c0, c1, c2}};
    t.open_stores.push_back(std::move(r));
}

// A TMA store's global writes (at its group's completion), by thread `t`: recorded as async-proxy writes of global
// memory at t's clock now (so a thread that synchronises with t after this is ordered after them), from the source
// bytes captured at the issue.
inline void tma_store_flush(Thread& t, const StoreRecord& r, bool at_exit) {
    const Box box(r.map, r.c[0], r.c[1], r.c[2]);
    // How a report names the write: the store's issue and where it completes (one text per store site and kind).
    static std::unordered_map<u64, std::string> names;
    const u32 done = at_exit ? 0u : site_id(t.site);
    auto [it, inserted] = names.emplace(u64(r.site) << 32 | done, std::string());
    if (inserted)
        it->second = format("a TMA store's write (the store issued at %s completes at %s)", site_text(r.site).c_str(),
                            at_exit ? "the thread's exit" : ("the cp.async.bulk.wait_group at " + site_text(done)).c_str());
    const char* what = it->second.c_str();
    for (u32 row = 0; row < box.rows; ++row) {
        u8* g = const_cast<u8*>(box.row_global(row));
        if (!g) continue;
        if (S().races) {
            const auto [lo, hi] = box.x_range();
            if (hi > lo) async_access(t, uintptr_t(g + lo * box.eb), u32(hi - lo) * box.eb, true, true, r.site, what);
        }
        for (u32 x = 0; x < box.map.box_dims[0]; ++x) {
            if (!box.x_in_bounds(x)) continue;
            const u32 s = swizzle(r.offset + row * box.row_bytes + x * box.eb, box.swz);
            std::memcpy(g + (i64(r.c[0]) + x) * box.eb, r.snapshot.data() + (s - r.offset), box.eb);
        }
    }
}

DFG_SIM_API void tma_store_commit() {
    Thread& t = me();
    t.committed_stores.push_back(StoreGroup{std::move(t.open_stores), false});
    t.open_stores.clear();
}

// cp.async.bulk.wait_group{.read} n: every committed group but the newest n has read its sources (.read) or is
// complete (`complete`: writes made).
DFG_SIM_API void tma_store_wait(u32 n, bool complete) {
    Thread& t = me();
    const size_t older = t.committed_stores.size() > n ? t.committed_stores.size() - n : 0;
    for (size_t i = 0; i < older; ++i) {
        StoreGroup& group = t.committed_stores[i];
        if (group.read_done) continue;
        for (const StoreRecord& r : group.stores)
            if (std::memcmp(my_cta().smem + r.offset, r.snapshot.data(), r.snapshot.size()) != 0)
                fail(format("shared-memory source [%#x, %#zx) of a TMA store was overwritten before "
                            "tma_store_wait_read / tma_store_wait_all released it",
                            r.offset, r.offset + r.snapshot.size()));
        if (S().races)  // the async proxy is done reading the sources: later writes there must come after this
            for (const StoreRecord& r : group.stores)
                async_read_done(t, uintptr_t(my_cta().smem + r.offset), u32(r.snapshot.size()), r.site);
        group.read_done = true;
    }
    if (!complete) return;
    for (size_t i = 0; i < older; ++i) {
        for (const StoreRecord& r : t.committed_stores.front().stores) tma_store_flush(t, r, false);
        t.committed_stores.pop_front();
    }
}

// The thread exits: the groups whose sources it waited for complete now (the kernel's completion). Groups not even
// read-waited stay, for final_checks' report.
inline void tma_stores_exit(Thread& t) {
    if (!t.committed_stores.empty()) t.site = Site{"(thread exit)", 0};
    while (!t.committed_stores.empty() && t.committed_stores.front().read_done) {
        for (const StoreRecord& r : t.committed_stores.front().stores) tma_store_flush(t, r, true);
        t.committed_stores.pop_front();
    }
}

inline WgmmaGroup& wgmma_open_group(Warpgroup& wg, u64 g) {
    while (wg.executed + wg.groups.size() <= g) wg.groups.emplace_back();
    return wg.groups[g - wg.executed];
}

// One thread's wgmma.mma_async: A through descriptor `desc_a` or, when `a` is not null, from this thread's register
// A fragment `a` (four .b32 of four e4m3: a_frag_row / a_frag_k); B through `desc_b`; accumulator `d` (N/2 f32).
inline void wgmma_issue_any(u32 n, u64 desc_a, const u32* a, u64 desc_b, float* d, bool scale_d,
                            u32 type = kWgmmaE4m3, bool trans_a = false, bool trans_b = false) {
    Thread& t = me();
    aligned("wgmma.mma_async", true);
    Warpgroup& wg = my_warpgroup("wgmma");
    check_wgmma_registers(t.tid / kWarpgroupThreads, n);
    if (!t.wgmma_fenced) fail("wgmma issued without wgmma_fence since the last wgmma_wait (PTX ISA wgmma.fence)");
    const bool reg_a = a != nullptr;
    const u64 g = t.wgmma_commits;
    operands_issue(t, d, n, a, g);
    WgmmaGroup& group = wgmma_open_group(wg, g);
    const u32 k = t.wgmma_ops_in_open_group++;
    if (k == group.ops.size()) {
        WgmmaOp op;
        op.desc_a = desc_a;
        op.desc_b = desc_b;
        op.n = n;
        op.scale_d = scale_d;
        op.reg_a = reg_a;
        op.type = type;
        op.trans_a = trans_a;
        op.trans_b = trans_b;
        if (reg_a)
            op.a_codes.assign(64 * 32, 0);
        else
            decode_operand(desc_a, 64, op.addr_a, op.lo_a, op.hi_a, "A", trans_a);
        decode_operand(desc_b, n, op.addr_b, op.lo_b, op.hi_b, "B", trans_b);
        // Shared-memory operands are read by the async proxy from here to the wait that retires the group.
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
    if (op.type != type || op.trans_a != trans_a || op.trans_b != trans_b)
        fail(format("wgmma is warpgroup-collective but this thread's operand type %u (trans %d %d) differs from its "
                    "warpgroup's %u (trans %d %d) in wgmma %u of group %llu", type, trans_a, trans_b, op.type,
                    op.trans_a, op.trans_b, k, static_cast<unsigned long long>(g)));
    if (op.desc_a != desc_a || op.desc_b != desc_b || op.n != n || op.scale_d != scale_d || op.reg_a != reg_a)
        fail(format("wgmma is warpgroup-collective but this thread's operands differ from its warpgroup's: "
                    "(desc_a %#llx%s, desc_b %#llx, N %u, scale_d %d) vs (%#llx%s, %#llx, %u, %d) in wgmma %u of group "
                    "%llu",
                    static_cast<unsigned long long>(desc_a), reg_a ? " (A in registers)" : "",
                    static_cast<unsigned long long>(desc_b), n, scale_d, static_cast<unsigned long long>(op.desc_a),
                    op.reg_a ? " (A in registers)" : "", static_cast<unsigned long long>(op.desc_b), op.n,
                    op.scale_d, k, static_cast<unsigned long long>(g)));
    const u32 lane_t = t.tid % kWarpgroupThreads;
    if (reg_a)  // the registers are read at issue here; the in-flight check keeps them unchanged to the wait
        for (u32 j = 0; j < 4; ++j)
            for (u32 b = 0; b < 4; ++b) op.a_codes[a_frag_row(lane_t, j) * 32 + a_frag_k(lane_t, j, b)] = u8(a[j] >> (8 * b));
    op.frag[lane_t] = d;
    ++op.issued;
}

DFG_SIM_API void wgmma_issue(u32 n, u64 desc_a, u64 desc_b, float* d, bool scale_d) {
    wgmma_issue_any(n, desc_a, nullptr, desc_b, d, scale_d);
}

// BF16 (k16) / TF32 (k8) wgmma, both operands from shared memory; trans_a / trans_b: MN-major (bf16 only).
DFG_SIM_API void wgmma_issue_typed(u32 type, u32 n, u64 desc_a, u64 desc_b, float* d, bool scale_d, bool trans_a,
                                   bool trans_b) {
    if (type != kWgmmaBf16 && type != kWgmmaTf32) fail(format("wgmma_issue_typed: unknown operand type %u", type));
    if (type == kWgmmaTf32 && (trans_a || trans_b))
        fail("wgmma .tf32: operands must be K-major (PTX ISA: imm-trans only for .f16 / .bf16)");
    wgmma_issue_any(n, desc_a, nullptr, desc_b, d, scale_d, type, trans_a, trans_b);
}

DFG_SIM_API void wgmma_issue_rs(u32 n, const u32* a, u64 desc_b, float* d, bool scale_d) {
    wgmma_issue_any(n, 0, a, desc_b, d, scale_d);
}

DFG_SIM_API void wgmma_fence() {
    aligned("wgmma.fence", true);
    me().wgmma_fenced = true;
    operands_fence(me());
}

DFG_SIM_API void wgmma_commit() {
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
    release_into(group.join, t);  // what each thread did before its commit precedes the group (hb.hpp)
    if (++group.committed < kWarpgroupThreads) return;
    for (u32 k = 0; k < group.ops.size(); ++k)  // a thread may have committed before others issued more
        if (group.ops[k].issued != kWarpgroupThreads)
            fail(format("wgmma_commit: only %u of 128 threads issued wgmma %u of group %llu", group.ops[k].issued, k,
                        static_cast<unsigned long long>(g)));
    wg.complete = g + 1;
}

DFG_SIM_API void wgmma_wait(u32 n) {
    aligned("wgmma.wait_group", true);
    Thread& t = me();
    Warpgroup& wg = my_warpgroup("wgmma_wait");
    t.wgmma_fenced = false;
    if (t.wgmma_commits <= n) return;
    const u64 target = t.wgmma_commits - n;  // groups [0, target) must be complete
    if (wg.complete < target)
        block(Wait{WaitKind::WgmmaGroup, t.cta, t.tid / kWarpgroupThreads, 0, target}, "wgmma_wait");
    operands_retire(t, target);
    while (wg.executed < target) {
        for (const WgmmaOp& op : wg.groups.front().ops) {
            check_read_window(op, my_cta().smem);
            execute(op, my_cta().smem);
        }
        wg.retired.push_back(std::move(wg.groups.front().join));
        wg.groups.pop_front();
        ++wg.executed;
    }
    // The retired groups' commits precede what this thread does next.
    for (u64 g = t.wgmma_acquired > wg.retired_base ? t.wgmma_acquired : wg.retired_base; g < target; ++g)
        acquire_from(t, wg.retired[g - wg.retired_base]);
    t.wgmma_acquired = target > t.wgmma_acquired ? target : t.wgmma_acquired;
    if (wg.retired.size() > 16) {  // drop what every thread of the warpgroup has acquired
        u64 lowest = ~0ull;
        for (u32 i = 0; i < kWarpgroupThreads; ++i) {
            const u64 a = thread_at(t.cta, t.tid / kWarpgroupThreads * kWarpgroupThreads + i).wgmma_acquired;
            lowest = a < lowest ? a : lowest;
        }
        while (wg.retired_base < lowest && !wg.retired.empty()) {
            wg.retired.pop_front();
            ++wg.retired_base;
        }
    }
}

// bar.warp.sync 0xffffffff (PTX ISA "bar.warp.sync"): the 32 lanes meet (a warp rendezvous, like stmatrix's), so
// each lane's memory accesses before it are ordered before every lane's after it.
DFG_SIM_API void warp_sync() {
    aligned("bar.warp.sync");
    Thread& t = me();
    WarpRendezvous& w = my_cta().warps[t.tid / 32];
    const u64 generation = w.generation;
    release_into(w.join, t);
    if (++w.arrived < 32) {
        block(Wait{WaitKind::StmatrixWarp, t.cta, t.tid / 32, 0, generation}, "bar.warp.sync");
        acquire_from(t, w.released);  // no other rendezvous of the warp completes before every lane resumed
        return;
    }
    w.released = std::move(w.join);
    w.join.clear();
    acquire_from(t, w.released);
    w.arrived = 0;
    ++w.generation;
}

// shfl.sync.bfly.b32 with the full mask: a warp rendezvous. Registers only: no happens-before edge (PTX gives a
// shuffle no memory ordering), unlike bar.warp.sync.
DFG_SIM_API float shfl_xor(float value, u32 lane_mask) {
    aligned("shfl.sync.bfly");
    if (lane_mask > 31) fail(format("shfl_xor: lane mask %u is not a lane index (0..31)", lane_mask));
    Thread& t = me();
    WarpRendezvous& w = my_cta().warps[t.tid / 32];
    const u32 lane = t.tid % 32;
    const u64 generation = w.generation;
    float* bank = w.shfl[generation & 1];
    bank[lane] = value;
    if (++w.arrived < 32) {
        block(Wait{WaitKind::StmatrixWarp, t.cta, t.tid / 32, 0, generation}, "shfl.sync.bfly");
    } else {
        w.arrived = 0;
        ++w.generation;
    }
    return bank[lane ^ lane_mask];
}

DFG_SIM_API void stmatrix_x4(void* row_ptr, const u32 (&regs)[4]) {
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
    const u32 site = site_id(t.site);
    for (u32 l = 0; l < 32; ++l) {
        const u32 matrix = l / 8, row = l % 8;
        check_no_mbarrier_overlap(t.cta, w.row_offset[l], 16, what);
        Thread& writer = thread_at(t.cta, t.tid / 32 * 32 + l);  // the lane that gave the row address
        if (S().races)
            fine_access(writer, uintptr_t(smem + w.row_offset[l]), 16, Access{"an stmatrix write", true, false, Scope::Cta, site});
        for (u32 c = 0; c < 4; ++c) std::memcpy(smem + w.row_offset[l] + 4 * c, &w.regs[row * 4 + c][matrix], 4);
        generic_write(t.cta, w.row_offset[l], 16, writer);
        writer.generic_write_site = site;  // all lanes execute the same stmatrix (convergence)
    }
    w.arrived = 0;
    ++w.generation;
}

}  // namespace dfg::sim::detail
