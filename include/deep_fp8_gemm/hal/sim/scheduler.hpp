// deep_fp8_gemm CPU simulator: fiber scheduler, deadlock reports and the launch entry.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

inline bool ready(const Wait& w) {
    Launch& l = L();
    switch (w.kind) {
        case WaitKind::Mbarrier: {
            auto it = l.ctas[w.cta].mbarriers.find(w.key);
            return it == l.ctas[w.cta].mbarriers.end() || (it->second.phase & 1) != w.parity;
        }
        case WaitKind::NamedBarrier: return l.ctas[w.cta].named[w.key].generation != w.target;
        case WaitKind::ClusterBarrier: return l.clusters[w.cta].barrier.generation != w.target;
        case WaitKind::WgmmaGroup: return l.ctas[w.cta].warpgroups[w.key].complete >= w.target;
        case WaitKind::StmatrixWarp: return l.ctas[w.cta].warps[w.key].generation != w.target;
        case WaitKind::SetmaxnregWarpgroup: return l.ctas[w.cta].warpgroups[w.key].setmaxnreg_generation != w.target;
        case WaitKind::RegisterPool: return l.ctas[w.cta].reg_free >= static_cast<i64>(w.target);
        case WaitKind::Yield: return true;
    }
    return true;
}

inline std::string describe_wait(const Thread& t) {
    const Wait& w = t.wait;
    Launch& l = L();
    switch (w.kind) {
        case WaitKind::Mbarrier: {
            const Mbarrier& mb = l.ctas[w.cta].mbarriers.at(w.key);
            // Named as the watchdog build names it on the GPU (DFG_MBAR_WAIT_FORMAT, common.cuh).
            return format(DFG_MBAR_WAIT_FORMAT " - barrier in phase %llu (parity %u), %u of %u arrivals pending, "
                          "tx-count %lld",
                          w.name.role, w.name.index, w.key, w.parity, static_cast<unsigned long long>(mb.phase),
                          unsigned(mb.phase & 1), mb.pending, mb.expected, static_cast<long long>(mb.tx));
        }
        case WaitKind::NamedBarrier: {
            const ThreadBarrier& b = l.ctas[w.cta].named[w.key];
            if (b.expected == kAllThreads)
                return format("%s(barrier %u) - %u of the %u threads not exited arrived", t.wait_op, w.key, b.arrived,
                              l.ctas[w.cta].live);
            return format("%s(barrier %u) - %u of %u threads arrived", t.wait_op, w.key, b.arrived, b.expected);
        }
        case WaitKind::ClusterBarrier: {
            const Launch::Cluster& c = l.clusters[w.cta];
            return format("cluster_sync(cluster %u) - %u of the %u threads not exited arrived", w.cta,
                          c.barrier.arrived, c.live);
        }
        case WaitKind::WgmmaGroup: {
            const Warpgroup& wg = l.ctas[w.cta].warpgroups[w.key];
            const u64 g = w.target - 1;
            const u32 committed = g - wg.executed < wg.groups.size() ? wg.groups[g - wg.executed].committed : 0;
            return format("wgmma_wait - group %llu of warpgroup %u committed by %u of 128 threads",
                          static_cast<unsigned long long>(g), w.key, committed);
        }
        case WaitKind::StmatrixWarp:
            return format("%s - %u of 32 lanes of warp %u arrived", t.wait_op, l.ctas[w.cta].warps[w.key].arrived, w.key);
        case WaitKind::SetmaxnregWarpgroup:
            return format("%s - %u of 128 threads of warpgroup %u arrived", t.wait_op,
                          l.ctas[w.cta].warpgroups[w.key].setmaxnreg_arrived, w.key);
        case WaitKind::RegisterPool: {
            const Warpgroup& wg = l.ctas[w.cta].warpgroups[w.key];
            return format("registers: setmaxnreg.inc %u at %s can never be satisfied: warpgroup %u needs 128 x (%u - "
                          "%u) = %llu registers; ",
                          w.parity, site_str(t.site).c_str(), w.key, w.parity, wg.regs,
                          static_cast<unsigned long long>(w.target)) +
                   register_pool_state(w.cta);
        }
        case WaitKind::Yield: return "preempted";
    }
    return "";
}

inline std::string thread_range(u32 first, u32 last) {
    std::string s = first == last ? format("thread %u", first) : format("threads %u-%u", first, last);
    if (first / 32 == last / 32) return s + format(" (warp %u)", first / 32);
    return s + format(" (warps %u-%u)", first / 32, last / 32);
}

// One line per run of consecutive threads of a CTA in the same state.
inline std::string deadlock_report() {
    Launch& l = L();
    std::string out = "deadlock: no thread can make progress\n";
    const u32 block = l.cfg.block_x;
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        u32 first = 0;
        std::string state;
        for (u32 tid = 0; tid <= block; ++tid) {
            std::string s;
            if (tid < block) {
                const Thread& t = *l.threads[size_t(c) * block + tid];
                s = t.done      ? std::string("exited")
                    : t.blocked ? describe_wait(t) + " at " + site_str(t.site)
                                : std::string("runnable");
            }
            if (tid == block || s != state) {
                if (tid > 0) out += format("  cta %u %s: ", c, thread_range(first, tid - 1).c_str()) + state + "\n";
                first = tid;
                state = s;
            }
        }
    }
    return out;
}

// Checks that only make sense once every thread has returned.
inline void final_checks() {
    Launch& l = L();
    const u32 block = l.cfg.block_x;
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        for (u32 w = 0; w < l.ctas[c].warpgroups.size(); ++w)
            if (!l.ctas[c].warpgroups[w].groups.empty()) {
                l.failed = true;
                l.error = format("cta %u warpgroup %u: wgmma issued but never waited for (missing wgmma_wait)", c, w);
                return;
            }
        for (u32 tid = 0; tid < block; ++tid) {
            const Thread& t = *l.threads[size_t(c) * block + tid];
            if (!t.open_stores.empty() || !t.committed_stores.empty()) {
                l.failed = true;
                l.error = format("cta %u thread %u: exited with TMA stores not waited for (tma_store_wait_*)", c, tid);
                return;
            }
        }
    }
}

inline void fiber_main() {
    Launch& l = L();
    l.entry(l.params);
    Thread& t = *l.current;
    aligned_on_exit();
    t.done = true;
    Cta& cta = l.ctas[t.cta];
    if (cta.live == 1) cta_exit_check();
    thread_barrier_release(cta.named[0], --cta.live);
    Launch::Cluster& cluster = l.clusters[t.cta / l.cfg.cluster_x];
    thread_barrier_release(cluster.barrier, --cluster.live);
}  // uc_link returns to the scheduler

inline std::string validate_config(const LaunchConfig& cfg, u32 max_threads) {
    if (cfg.grid_x == 0 || cfg.block_x == 0) return "grid_x and block_x must be positive";
    if (cfg.block_x > max_threads)
        return format("block_x=%u exceeds the kernel's NUM_THREADS=%u (__launch_bounds__)", cfg.block_x, max_threads);
    if (cfg.cluster_x == 0 || cfg.cluster_x > 8 || cfg.grid_x % cfg.cluster_x)
        return format("cluster_x=%u must be in 1..8 and divide grid_x=%u", cfg.cluster_x, cfg.grid_x);
    if (cfg.dynamic_smem_bytes > kMaxSmemBytes)
        return format("dynamic_smem_bytes=%u exceeds the sm_90 limit of %u", cfg.dynamic_smem_bytes, kMaxSmemBytes);
    if (cfg.flags & ~(kFlagZeroSmem | kFlagExactMma)) return "unknown LaunchConfig flags";
    if (cfg.launch_registers > 255 || cfg.launch_registers * u64(cfg.block_x) > 65536)
        return format("launch_registers=%u x block_x=%u exceeds the 64K register file", cfg.launch_registers,
                      cfg.block_x);
    return "";
}

inline void release(Launch& l) {
    for (auto& t : l.threads)
        if (t->stack) munmap(t->stack, kFiberStackBytes + 4096);
    for (Cta& c : l.ctas)
        if (c.smem) munmap(c.smem, l.smem_alloc);
}

// A fiber for thread `tid` of CTA `cta`, with a guard page below its stack (an overflow faults instead of
// corrupting a neighbour). Kept out of run(): getcontext returns twice, which would pin run()'s locals.
__attribute__((noinline)) inline void add_fiber(Launch& l, u32 cta, u32 tid) {
    void* p = mmap(nullptr, kFiberStackBytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        l.failed = true;
        l.error = "out of memory for fiber stacks";
        return;
    }
    mprotect(p, 4096, PROT_NONE);
    auto t = std::make_unique<Thread>();
    t->cta = cta;
    t->tid = tid;
    t->stack = p;
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = static_cast<u8*>(p) + 4096;
    t->ctx.uc_stack.ss_size = kFiberStackBytes;
    t->ctx.uc_link = &l.scheduler;
    makecontext(&t->ctx, fiber_main, 0);
    l.threads.push_back(std::move(t));
}

// Synchronous faults inside a fiber (a wild pointer in the kernel, a fiber stack overflowing into its guard
// page) abandon that fiber and fail the launch instead of killing the process. The handler runs on an
// alternate stack (the fiber's may be exhausted). Outside a fiber it reinstalls the previous handler and
// returns: the fault recurs and that handler (e.g. Python's faulthandler) sees it.
struct FaultGuard {
    static constexpr size_t kAltStackBytes = 64 * 1024;
    struct sigaction previous_segv, previous_bus;
    stack_t previous_stack;
    std::unique_ptr<u8[]> alt_stack{new u8[kAltStackBytes]};

    static void on_fault(int sig, siginfo_t* info, void*);
    FaultGuard();
    ~FaultGuard();
};
inline FaultGuard* g_fault_guard = nullptr;

inline void FaultGuard::on_fault(int sig, siginfo_t* info, void*) {
    Launch* l = g_launch;
    if (!l || !l->in_fiber) {
        sigaction(sig, sig == SIGSEGV ? &g_fault_guard->previous_segv : &g_fault_guard->previous_bus, nullptr);
        return;
    }
    l->fault_signal = sig;
    l->fault_address = info->si_addr;
    setcontext(&l->scheduler);  // back into run(), as if the fiber had yielded
}

inline FaultGuard::FaultGuard() {
    stack_t ss{};
    ss.ss_sp = alt_stack.get();
    ss.ss_size = kAltStackBytes;
    sigaltstack(&ss, &previous_stack);
    struct sigaction sa{};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
    sigaction(SIGBUS, &sa, &previous_bus);
    g_fault_guard = this;
}

inline FaultGuard::~FaultGuard() {
    sigaction(SIGSEGV, &previous_segv, nullptr);
    sigaction(SIGBUS, &previous_bus, nullptr);
    sigaltstack(&previous_stack, nullptr);
    g_fault_guard = nullptr;
}

inline void report_fault(Launch& l) {
    const Thread& t = *l.current;
    l.failed = true;
    const char* kind = l.fault_signal == SIGBUS ? "bus error" : "segmentation fault";
    l.error = format("cta %u thread %u (warp %u lane %u): %s at address %p (a bad pointer, or more than %zu KiB of "
                     "fiber stack)",
                     t.cta, t.tid, t.tid / 32, t.tid % 32, kind, l.fault_address, kFiberStackBytes / 1024);
}

// Runs one launch to completion; returns 0 or 1 (error in g_last_error).
inline int run(const LaunchConfig& cfg, u32 max_threads, void (*entry)(const void*), const void* params,
               size_t params_bytes = 0) {
    g_last_error.clear();
    if (g_launch) {
        g_last_error = "a simulated launch is already running (launches are not reentrant)";
        return 1;
    }
    const std::string bad = validate_config(cfg, max_threads);
    if (!bad.empty()) {
        g_last_error = "invalid launch: " + bad;
        return 1;
    }
    Launch l;
    l.cfg = cfg;
    l.entry = entry;
    l.params = params;
    l.params_bytes = params_bytes;
    l.smem_alloc = (size_t(cfg.dynamic_smem_bytes) + 4095) / 4096 * 4096 + 4096;
    l.ctas.resize(cfg.grid_x);
    l.clusters.resize(cfg.grid_x / cfg.cluster_x);
    for (Launch::Cluster& c : l.clusters) c.live = cfg.cluster_x * cfg.block_x;
    g_schedule = Schedule{};
    g_schedule.init(cfg);
    g_launch = &l;
    for (Cta& c : l.ctas) {
        // Page-aligned (so 1024-byte aligned, as the device's dynamic smem), poisoned.
        void* p = mmap(nullptr, l.smem_alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            l.failed = true;
            l.error = "out of memory for shared memory";
            break;
        }
        c.smem = static_cast<u8*>(p);
        std::memset(c.smem, (cfg.flags & kFlagZeroSmem) ? 0x00 : 0xFF, l.smem_alloc);
        c.live = cfg.block_x;
        c.warps.resize((cfg.block_x + 31) / 32);
        c.warpgroups.resize((cfg.block_x + kWarpgroupThreads - 1) / kWarpgroupThreads);
        const u32 regs = pool_registers(cfg);
        for (Warpgroup& wg : c.warpgroups) wg.regs = regs;
        c.reg_total = u64(regs) * cfg.block_x;
        c.reg_free = 0;  // the launch hands the whole pool to the warps
        aligned_init(c, cfg.block_x);
        c.generic_writer.assign(cfg.dynamic_smem_bytes, 0);
        c.generic_clock.assign(cfg.dynamic_smem_bytes, 0);
        c.remote_gen.assign(cfg.cluster_x, -1);
        c.remote_tid.assign(cfg.cluster_x, 0);
        c.remote_site.assign(cfg.cluster_x, Site{});
    }
    for (u32 c = 0; c < cfg.grid_x && !l.failed; ++c)
        for (u32 tid = 0; tid < cfg.block_x && !l.failed; ++tid) add_fiber(l, c, tid);
    for (auto& t : l.threads) {
        t->vc.assign(cfg.block_x, 0);
        t->vc[t->tid] = 1;
    }

    const FaultGuard fault_guard;
    const auto start = std::chrono::steady_clock::now();
    u64 steps = 0;
    Schedule& sched = g_schedule;
    std::vector<u32> order(l.threads.size());
    for (u32 i = 0; i < order.size(); ++i) order[i] = i;
    u64 pass = 0;
    bool others_moved = true;  // a non-victim thread was resumed in the previous pass
    // Resumes thread i if it can run; true if it did.
    const auto resume = [&](u32 i) {
        Thread& t = *l.threads[i];
        if (t.done) return false;
        if (t.blocked) {
            if (!ready(t.wait)) return false;
            t.blocked = false;
        }
        l.current = &t;
        l.in_fiber = true;
        swapcontext(&l.scheduler, &t.ctx);
        l.in_fiber = false;
        if (l.fault_signal) report_fault(l);
        ++steps;
        return true;
    };
    while (!l.failed) {
        bool resumed = false, all_done = true, moved = false, skipped = false;
        ++pass;
        if (sched.adversarial) {
            for (u32 i = u32(order.size()); i > 1; --i) std::swap(order[i - 1], order[sched.next() % i]);
            if (sched.victim_cta != ~0u && sched.victim_ahead) {  // the victim runs until it blocks, first
                for (u32 round = 0; round < 64 && !l.failed; ++round) {
                    bool any = false;
                    for (u32 i : order)
                        if (sched.victim(*l.threads[i]) && resume(i)) {
                            any = resumed = true;
                            if (l.failed) break;
                        }
                    if (!any) break;
                }
            }
        }
        const bool victim_may_run = !sched.adversarial || sched.victim_ahead || !others_moved || pass % 64 == 0;
        for (u32 i : order) {
            if (l.failed) break;
            Thread& t = *l.threads[i];
            if (t.done) continue;
            all_done = false;
            const bool victim = sched.adversarial && sched.victim(t);
            if (victim && !victim_may_run) {
                skipped = true;
                continue;
            }
            if (victim && sched.victim_ahead) continue;  // ran above
            if (!resume(i)) continue;
            resumed = true;
            moved |= !victim;
        }
        others_moved = moved;
        if (l.failed) break;
        for (auto& tp : l.threads) all_done &= tp->done;
        const bool landed = !l.pending_loads.empty();
        const std::string error = land_tma_loads(!sched.adversarial || !resumed);
        if (!error.empty()) {
            l.failed = true;
            l.error = error;
            break;
        }
        if (all_done) {
            final_checks();
            break;
        }
        if (!resumed && !landed && !skipped) {
            l.failed = true;
            l.error = deadlock_report();
            break;
        }
        if (cfg.max_steps && steps > cfg.max_steps) {
            l.failed = true;
            l.error = format("step limit: %llu fiber resumptions without finishing\n",
                             static_cast<unsigned long long>(cfg.max_steps)) + deadlock_report();
            break;
        }
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (cfg.timeout_s > 0 && elapsed > cfg.timeout_s) {
            l.failed = true;
            l.error = format("timeout: launch still running after %.1f s\n", elapsed) + deadlock_report();
            break;
        }
    }
    if (l.failed) g_last_error = l.error;
    release(l);
    g_launch = nullptr;
    return l.failed ? 1 : 0;
}

}  // namespace dfg::sim::detail
