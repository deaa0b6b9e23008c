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
        case WaitKind::GridDependency: return S().launches[w.key]->finished;
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
        case WaitKind::GridDependency: return format("griddepcontrol.wait - kernel %u has not finished", w.key);
    }
    return "";
}

inline std::string thread_range(u32 first, u32 last) {
    std::string s = first == last ? format("thread %u", first) : format("threads %u-%u", first, last);
    if (first / 32 == last / 32) return s + format(" (warp %u)", first / 32);
    return s + format(" (warps %u-%u)", first / 32, last / 32);
}

// One line per run of consecutive threads of a CTA in the same state (per started launch of the stream).
inline std::string deadlock_report() {
    Stream& st = S();
    std::string out = "deadlock: no thread can make progress\n";
    for (const auto& lp : st.launches) {
        Launch& l = *lp;
        if (!l.started || l.finished) continue;
        g_launch = &l;
        const std::string kernel = st.launches.size() > 1 ? format("kernel %u ", l.index) : std::string();
        const u32 block = l.cfg.block_x;
        for (u32 c = 0; c < l.admitted; ++c) {
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
                    if (tid > 0)
                        out += format("  %scta %u %s: ", kernel.c_str(), c, thread_range(first, tid - 1).c_str()) +
                               state + "\n";
                    first = tid;
                    state = s;
                }
            }
        }
        if (l.admitted < l.ctas.size())
            out += format("  %sctas %u-%u: not yet resident (at most %u threads of the stream are resident at once; "
                          "further CTAs start as resident ones exit)\n",
                          kernel.c_str(), l.admitted, u32(l.ctas.size()) - 1, st.max_resident_threads);
    }
    return out;
}

// Checks that only make sense once every thread of a launch has returned.
inline void final_checks(Launch& l) {
    Stream& s = S();
    const u32 block = l.cfg.block_x;
    const std::string kernel = s.launches.size() > 1 ? format("kernel %u ", l.index) : std::string();
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        for (u32 w = 0; w < l.ctas[c].warpgroups.size(); ++w)
            if (!l.ctas[c].warpgroups[w].groups.empty()) {
                s.failed = true;
                s.error = format("%scta %u warpgroup %u: wgmma issued but never waited for (missing wgmma_wait)",
                                 kernel.c_str(), c, w);
                return;
            }
        for (u32 tid = 0; tid < block; ++tid) {
            const Thread& t = *l.threads[size_t(c) * block + tid];
            if (!t.open_stores.empty() || !t.committed_stores.empty()) {
                s.failed = true;
                s.error = format("%scta %u thread %u: exited with TMA stores not waited for (tma_store_wait_*)",
                                 kernel.c_str(), c, tid);
                return;
            }
        }
    }
}

// The last thread of a CTA of a programmatic dependent launch exits: one of its threads must have executed
// griddepcontrol.wait, or the next kernel's wait (which waits for this one only) would no longer cover the
// previous kernel; records what a dependent of this launch may assume at its start.
inline void pdl_exit_check(Launch& l, Cta& c) {
    if (!c.triggered) c.done_for_dependents = c.dependency_waited || !l.programmatic ? l.index : l.start_done;
    if (l.programmatic && !c.dependency_waited)
        fail(format("pdl: cta %u of kernel %u, a programmatic dependent launch, exits without any of its threads "
                    "executing griddepcontrol.wait (hal::grid_dependency_wait): nothing orders its accesses after "
                    "kernel %u, and a launch that depends on this one would not be ordered after kernel %u either",
                    me().cta, l.index, l.index - 1, l.index - 1));
}

inline void fiber_main() {
    Stream& s = S();
    Launch& l = L();
    void (*entry)(const void*) = l.entry;
    const void* params = l.params;
    set_tracking(s.races);  // kernel code runs: its plain accesses are checked (instrument.hpp)
    entry(params);
    set_tracking(false);
    Thread& t = *s.current;
    tma_stores_exit(t);
    aligned_on_exit();
    t.done = true;
    Cta& cta = l.ctas[t.cta];
    if (cta.live == 1) {
        cta_exit_check();
        copies_exit_check(l, t.cta);
        pdl_exit_check(l, cta);
    }
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
    if (cfg.flags & ~(kFlagZeroSmem | kFlagExactMma | kFlagNoRaces)) return "unknown LaunchConfig flags";
    if (cfg.launch_registers > 255 || cfg.launch_registers * u64(cfg.block_x) > 65536)
        return format("launch_registers=%u x block_x=%u exceeds the 64K register file", cfg.launch_registers,
                      cfg.block_x);
    return "";
}

inline void release(Launch& l) {
    if (l.smem_base) munmap(l.smem_base, l.smem_alloc * l.ctas.size());
    l.smem_base = nullptr;
}

// The number of threads a stream may keep resident: kMaxResidentThreads, or fewer when the mappings the process
// may still create (vm.max_map_count minus those it has, with a margin for the libraries and memory it maps while
// the stream runs) do not allow two per fiber (its stack and its guard page). `stacks` of those mappings are the
// stream's own fiber stacks already mapped, which its resident threads reuse.
inline u32 resident_thread_limit(size_t stacks) {
    long max_maps = 65530;  // Linux's default
    if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
        if (std::fscanf(f, "%ld", &max_maps) != 1) max_maps = 65530;
        std::fclose(f);
    }
    long maps = 0;
    if (FILE* f = std::fopen("/proc/self/maps", "r")) {
        char buf[65536];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
            maps += std::count(buf, buf + n, '\n');
        std::fclose(f);
    }
    // At least 1, so that the limit is known (admit_ctas: one cluster is always admitted).
    const long room = (max_maps - maps - 4096) / 2 + long(stacks);
    return room < 1 ? 1u : room < long(kMaxResidentThreads) ? u32(room) : kMaxResidentThreads;
}

// A fiber stack from the stream's pool, or a new mapping with a guard page below it (an overflow faults instead of
// corrupting a neighbour); null after recording the error.
inline void* fiber_stack(Stream& s) {
    if (!s.free_stacks.empty()) {
        void* p = s.free_stacks.back();
        s.free_stacks.pop_back();
        return p;
    }
    void* p = mmap(nullptr, kFiberStackBytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p != MAP_FAILED && mprotect(p, 4096, PROT_NONE) != 0) {
        munmap(p, kFiberStackBytes + 4096);
        p = MAP_FAILED;
    }
    if (p == MAP_FAILED) {
        s.failed = true;
        s.error = format("out of memory for fiber stacks: %zu stacks mapped, the next failed (%s); each is two of the "
                         "process's vm.max_map_count mappings (stack and guard page)",
                         s.stacks.size(), std::strerror(errno));
        return nullptr;
    }
    s.stacks.push_back(p);
    return p;
}

// Thread `tid` of CTA `cta` becomes a fiber. Kept out of run(): getcontext returns twice, which would pin run()'s
// locals.
__attribute__((noinline)) inline void add_fiber(Launch& l, u32 cta, u32 tid) {
    Stream& s = S();
    void* p = fiber_stack(s);
    if (!p) return;
    auto t = std::make_unique<Thread>();
    t->cta = cta;
    t->tid = tid;
    t->kernel = l.index;
    t->gcta = l.cta_base + cta;
    t->gtid = u32(s.threads.size());
    t->stack = p;
    t->ctx.reset(new ucontext_t);
    getcontext(t->ctx.get());
    t->ctx->uc_stack.ss_sp = static_cast<u8*>(p) + 4096;
    t->ctx->uc_stack.ss_size = kFiberStackBytes;
    t->ctx->uc_link = &s.scheduler;
    makecontext(t->ctx.get(), fiber_main, 0);
    init_clocks(*t, l, l.start_done);
    s.threads.push_back(t.get());
    l.threads[size_t(cta) * l.cfg.block_x + tid] = std::move(t);
}

// CTA `i` of launch `l` becomes resident: its shared memory poisoned, its bookkeeping allocated, its fibers made.
inline void admit_cta(Launch& l, u32 i) {
    const LaunchConfig& cfg = l.cfg;
    Cta& c = l.ctas[i];
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
    for (u32 tid = 0; tid < cfg.block_x && !S().failed; ++tid) add_fiber(l, i, tid);
}

// Makes further CTAs of the started launches resident, in stream order and whole clusters at a time, while the
// stream's resident threads stay within max_resident_threads (one cluster always may, so that a launch can start
// at all). True if any became resident.
inline bool admit_ctas(Stream& s) {
    bool any = false;
    for (const auto& lp : s.launches) {
        Launch& l = *lp;
        if (!l.started || l.finished) continue;
        g_launch = &l;
        const u32 cluster_threads = l.cfg.cluster_x * l.cfg.block_x;
        while (l.admitted < l.ctas.size()) {
            // NOTES: the mapping count is read (/proc/self/maps, ~1 ms) only once a stream grows past a few thousand
            // resident threads; the simulator tests' launches mostly stay below.
            if (s.max_resident_threads == 0 && s.resident_threads + cluster_threads > 4096)
                s.max_resident_threads = resident_thread_limit(s.stacks.size());
            if (s.resident_threads > 0 && s.max_resident_threads != 0 &&
                s.resident_threads + cluster_threads > s.max_resident_threads)
                return any;
            for (u32 c = l.admitted; c < l.admitted + l.cfg.cluster_x && !s.failed; ++c) admit_cta(l, c);
            if (s.failed) return any;
            l.admitted += l.cfg.cluster_x;
            s.resident_threads += cluster_threads;
            any = true;
        }
    }
    return any;
}

// Every thread of CTA `i` of launch `l` has exited: its fiber stacks go back to the pool, and what only a running
// CTA needs is freed (the Thread records stay: reports and the race detector's epochs name them), including the
// race detector's shadow of its shared memory and the pages behind it (nothing may access an exited CTA's).
inline void retire_cta(Stream& s, Launch& l, u32 i) {
    const u32 block = l.cfg.block_x;
    for (u32 tid = 0; tid < block; ++tid) {
        Thread& t = *l.threads[size_t(i) * block + tid];
        s.free_stacks.push_back(t.stack);
        t.stack = nullptr;
        t.ctx.reset();
        t.clocks.clear();
        std::vector<u32>().swap(t.fence_clocks);
        std::vector<Observed>().swap(t.observed);
        t.fence_release.reset();
    }
    Cta& c = l.ctas[i];
    if (c.copy_unit) c.copy_unit->clocks.clear();
    std::vector<u16>().swap(c.generic_writer);
    std::vector<u32>().swap(c.generic_clock);
    std::vector<AlignedLog>().swap(c.warp_aligned);
    std::vector<AlignedLog>().swap(c.warpgroup_aligned);
    if (s.shadow) s.shadow->forget(uintptr_t(c.smem), l.smem_alloc);
    madvise(c.smem, l.smem_alloc, MADV_DONTNEED);
    ++l.exited_ctas;
    s.resident_threads -= block;
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
    Stream* s = g_stream;
    if (!s || !s->in_fiber) {
        sigaction(sig, sig == SIGSEGV ? &g_fault_guard->previous_segv : &g_fault_guard->previous_bus, nullptr);
        return;
    }
    s->fault_signal = sig;
    s->fault_address = info->si_addr;
    setcontext(&s->scheduler);  // back into run(), as if the fiber had yielded
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

inline void report_fault(Stream& s) {
    const Thread& t = *s.current;
    s.failed = true;
    const char* kind = s.fault_signal == SIGBUS ? "bus error" : "segmentation fault";
    s.error = thread_name(t) + format(": %s at address %p (a bad pointer, or more than %zu KiB of fiber stack)", kind,
                                      s.fault_address, kFiberStackBytes / 1024);
}

// Starts launch `l` of the stream: its shared memory (one mapping, page-aligned and so 1024-byte aligned per CTA
// as the device's dynamic smem; poisoned as each CTA becomes resident) and its CTAs, numbered after those of the
// launches before it. Its threads are made when their CTA becomes resident (admit_ctas).
inline void start_launch(Stream& s, Launch& l) {
    const LaunchConfig& cfg = l.cfg;
    g_launch = &l;
    l.started = true;
    l.cta_base = u32(s.cta_launch.size());
    l.smem_alloc = (size_t(cfg.dynamic_smem_bytes) + 4095) / 4096 * 4096 + 4096;
    l.ctas.resize(cfg.grid_x);
    l.clusters.resize(cfg.grid_x / cfg.cluster_x);
    for (Launch::Cluster& c : l.clusters) c.live = cfg.cluster_x * cfg.block_x;
    void* p = mmap(nullptr, l.smem_alloc * cfg.grid_x, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        s.failed = true;
        s.error = "out of memory for shared memory";
        return;
    }
    l.smem_base = static_cast<u8*>(p);
    for (u32 i = 0; i < cfg.grid_x; ++i) {
        Cta& c = l.ctas[i];
        c.smem = l.smem_base + i * l.smem_alloc;
        c.gcta = l.cta_base + i;
        s.cta_launch.push_back(&l);
    }
    l.thread_base = u32(s.threads.size());
    l.threads.resize(size_t(cfg.grid_x) * cfg.block_x);
}

// Can launch k of the stream start? After launch k-1 ended; a programmatic dependent launch as soon as every CTA
// of launch k-1 executed griddepcontrol.launch_dependents or exited. Its threads are then ordered after the
// kernels every one of those CTAs was ordered after, never after launch k-1 itself, even if it has ended:
// launch_dependents (explicit or at exit) is not a memory edge, griddepcontrol.wait is.
inline bool may_start(Stream& s, u32 k) {
    Launch& l = *s.launches[k];
    if (k == 0) return true;
    const Launch& prev = *s.launches[k - 1];
    if (!prev.started) return false;
    if (!l.programmatic) {
        l.start_done = k;
        return prev.finished;
    }
    u32 done = k - 1;
    for (const Cta& c : prev.ctas) {
        if (!c.triggered && !c.exited) return false;
        done = c.done_for_dependents < done ? c.done_for_dependents : done;
    }
    l.start_done = done;
    return true;
}

// The stream that runs append to between dfg_sim_stream_open and dfg_sim_stream_close (null: each run is a stream
// of its own). An open stream keeps its launches' threads (the race detector's epochs name them), its shadow memory,
// its call sites and its schedule across runs: a launch of a later run is ordered after the earlier ones by the
// kernel boundary, or only by griddepcontrol.wait when it is programmatic (PDL), whichever library defines it.
inline Stream* g_open_stream = nullptr;

inline void end_stream(Stream& s) {
    for (const auto& lp : s.launches) release(*lp);
    for (void* stack : s.stacks) munmap(stack, kFiberStackBytes + 4096);
    s.stacks.clear();
    s.free_stacks.clear();
    s.shadow.reset();
}

// Runs the launches of `items` to completion, appended to the open stream or as a stream of their own; returns 0 or
// 1 (error in g_last_error). Stream-wide settings (seed, kFlagNoRaces) are those of the stream's first launch; the
// step and time limits those of this run's first.
DFG_SIM_API int run_stream(const StreamItem* items, u32 count) {
    g_last_error.clear();
    if (g_stream) {
        g_last_error = "a simulated launch is already running (launches are not reentrant)";
        return 1;
    }
    if (count == 0) {
        g_last_error = "invalid launch: an empty stream";
        return 1;
    }
    std::unique_ptr<Stream> own;
    Stream* sp = g_open_stream;
    if (!sp) {
        own.reset(new Stream);
        sp = own.get();
    } else if (sp->failed) {
        g_last_error = "the open simulator stream failed earlier (close it and open another): " + sp->error;
        return 1;
    }
    Stream& s = *sp;
    const u32 first = u32(s.launches.size());
    for (u32 k = 0; k < count; ++k) {
        const std::string bad = validate_config(items[k].cfg, items[k].kernel->max_threads);
        const u32 index = first + k;
        if (!bad.empty()) {
            g_last_error = (first + count > 1 ? format("invalid launch %u: ", index) : std::string("invalid launch: ")) + bad;
            return 1;
        }
        if (items[k].programmatic && index == 0) {
            g_last_error = format("invalid launch %u: the first launch of a stream has no predecessor to depend on", index);
            return 1;
        }
    }
    if (first == 0) {
        s.races = !(items[0].cfg.flags & kFlagNoRaces);
        s.shadow.reset(new Shadow);
        g_schedule = Schedule{};
        g_schedule.init(items[0].cfg);
        g_sites = Sites{};
        s.max_resident_threads = 0;  // not known yet (admit_ctas)
    }
    for (u32 k = 0; k < count; ++k) {
        auto l = std::make_unique<Launch>();
        l->cfg = items[k].cfg;
        l->entry = items[k].kernel->body;
        l->params = items[k].params;
        l->params_bytes = items[k].kernel->params_bytes;
        l->index = first + k;
        l->programmatic = items[k].programmatic != 0;
        register_library(*l, reinterpret_cast<const void*>(items[k].kernel->body));
        s.launches.push_back(std::move(l));
    }
    const LaunchConfig& cfg = items[0].cfg;
    g_stream = &s;
    const u32 total = u32(s.launches.size());

    const FaultGuard fault_guard;
    const auto start = std::chrono::steady_clock::now();
    u64 steps = 0;
    Schedule& sched = g_schedule;
    std::vector<Thread*> order;  // threads of the resident CTAs of the started, unfinished launches
    u64 pass = 0;
    bool others_moved = true;  // a non-victim thread was resumed in the previous pass
    // Resumes thread t if it can run; true if it did.
    const auto resume = [&](Thread& t) {
        if (t.done) return false;
        g_launch = s.launches[t.kernel].get();
        if (t.blocked) {
            if (!ready(t.wait)) return false;
            t.blocked = false;
        }
        s.current = &t;
        s.in_fiber = true;
        set_tracking(false);  // a fiber resumes inside a hal function (fiber_main sets it for kernel code)
        swapcontext(&s.scheduler, t.ctx.get());
        set_tracking(false);
        s.in_fiber = false;
        if (s.fault_signal) report_fault(s);
        ++steps;
        if (t.done && !s.failed && s.launches[t.kernel]->ctas[t.cta].live == 0)  // off its stack now
            retire_cta(s, *s.launches[t.kernel], t.cta);
        return true;
    };
    // The threads of the resident CTAs of the started, unfinished launches.
    const auto gather = [&] {
        order.clear();
        for (const auto& lp : s.launches)
            if (lp->started && !lp->finished)
                for (auto& t : lp->threads)
                    if (t) order.push_back(t.get());
    };
    while (!s.failed) {
        bool started = false;
        while (s.next_launch < total && may_start(s, s.next_launch)) {
            start_launch(s, *s.launches[s.next_launch++]);
            started = true;
        }
        if (s.failed) break;
        const bool admitted = admit_ctas(s);
        if (s.failed) break;
        if (started || admitted) gather();
        bool resumed = false, all_done = true, moved = false, skipped = false;
        ++pass;
        if (sched.adversarial) {
            for (u32 i = u32(order.size()); i > 1; --i) std::swap(order[i - 1], order[sched.next() % i]);
            if (sched.victim_cta != ~0u && sched.victim_ahead) {  // the victim runs until it blocks, first
                for (u32 round = 0; round < 64 && !s.failed; ++round) {
                    bool any = false;
                    for (Thread* t : order)
                        if (sched.victim(*t) && resume(*t)) {
                            any = resumed = true;
                            if (s.failed) break;
                        }
                    if (!any) break;
                }
            }
        }
        const bool victim_may_run = !sched.adversarial || sched.victim_ahead || !others_moved || pass % 64 == 0;
        for (Thread* tp : order) {
            if (s.failed) break;
            Thread& t = *tp;
            if (t.done) continue;
            all_done = false;
            const bool victim = sched.adversarial && sched.victim(t);
            if (victim && !victim_may_run) {
                skipped = true;
                continue;
            }
            if (victim && sched.victim_ahead) continue;  // ran above
            if (!resume(t)) continue;
            resumed = true;
            moved |= !victim;
        }
        others_moved = moved;
        if (s.failed) break;
        bool landed = false, finished = false;
        for (const auto& lp : s.launches) {
            Launch& l = *lp;
            if (!l.started || l.finished) continue;
            g_launch = &l;
            landed |= !l.pending_loads.empty() || !l.pending_copies.empty() || !l.pending_copy_arrives.empty();
            std::string error = land_copies(!sched.adversarial || !resumed);
            if (error.empty()) error = land_tma_loads(!sched.adversarial || !resumed);
            if (!error.empty()) {
                s.failed = true;
                s.error = (total > 1 ? format("kernel %u: ", l.index) : std::string()) + error;
                break;
            }
            if (l.exited_ctas == l.ctas.size()) {
                final_checks(l);
                l.finished = finished = true;
                release(l);  // its shared memory (the race detector forgot it CTA by CTA)
            }
        }
        if (s.failed) break;
        all_done = s.next_launch == total;
        for (const auto& lp : s.launches) all_done &= lp->finished;
        if (all_done) break;
        if (finished) gather();
        if (!resumed && !landed && !skipped && !started && !admitted && !finished) {
            s.failed = true;
            s.error = deadlock_report();
            break;
        }
        if (cfg.max_steps && steps > cfg.max_steps) {
            s.failed = true;
            s.error = format("step limit: %llu fiber resumptions without finishing\n",
                             static_cast<unsigned long long>(cfg.max_steps)) + deadlock_report();
            break;
        }
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (cfg.timeout_s > 0 && elapsed > cfg.timeout_s) {
            s.failed = true;
            s.error = format("timeout: launch still running after %.1f s\n", elapsed) + deadlock_report();
            break;
        }
    }
    if (s.failed) g_last_error = s.error;
    g_launch = nullptr;
    g_stream = nullptr;
    if (own) end_stream(s);
    return s.failed ? 1 : 0;
}

// Opens a stream that the runs until dfg_sim_stream_close append to (deep_fp8_gemm.simulator.stream()).
DFG_SIM_API int open_stream() {
    g_last_error.clear();
    if (g_open_stream || g_stream) {
        g_last_error = "a simulator stream is already open (streams do not nest)";
        return 1;
    }
    g_open_stream = new Stream;
    return 0;
}

DFG_SIM_API void close_stream() {
    if (!g_open_stream) return;
    end_stream(*g_open_stream);
    delete g_open_stream;
    g_open_stream = nullptr;
}

}  // namespace dfg::sim::detail
