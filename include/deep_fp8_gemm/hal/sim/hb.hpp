// deep_fp8_gemm CPU simulator: happens-before between threads, CTAs and kernels (PTX ISA "Memory Consistency
// Model"), as vector clocks (clocks.hpp). Part of hal/sim.hpp (included from there, in order).
//
// Each thread's own clock counts its releases: an access is stamped with the current value, a release joins the
// thread's clocks into the synchronisation object and then ticks the clock (so accesses after the release are not
// covered by it), an acquire joins the object's clocks into the thread's. The edges:
//   bar.sync / bar.red / named barriers   every arrival releases, every participant acquires the round's join
//                                         (cumulative: what an arrival had acquired is passed on)
//   barrier.cluster                      the same over the cluster (.release / .acquire at .cluster scope)
//   bar.warp.sync                        the same over the warp
//   mbarrier                             arrive (incl. remote) releases into the current phase at .cta scope
//                                        (PTX's default .release.cta), TMA complete_tx releases the issuing
//                                        thread's clocks at the issue (.cluster), a cp.async.mbarrier.arrive
//                                        releases the CTA's cp.async completion unit once the thread's copies
//                                        landed (cp_async.hpp), mbar_wait acquires the last completed phase at
//                                        .cta scope
//   TMA store                            its global writes are the issuing thread's at the completing
//                                        cp.async.bulk.wait_group (or its exit), not at the issue
//   wgmma group                          each thread's commit releases into the group, the wgmma_wait that
//                                        retires it acquires: a warpgroup-collective wgmma executes once all 128
//                                        threads issued it, so what each did before its commit precedes what
//                                        each does after the wait (an assumption about the hardware, which the
//                                        kernels' one-lane-per-warp stage release relies on; see sim.hpp)
//   atomics, ld.acquire / st.release    release / acquire on the address's SyncVar at the op's scope; RMWs
//                                        continue release sequences, a store starts a new one, a plain store
//                                        ends them; relaxed ones give weak edges only
//   fence.acq_rel / fence.sc            a release fence makes the next relaxed atomic write a release of the
//                                        clocks at the fence; an acquire fence acquires what earlier relaxed
//                                        atomic reads observed; fence.sc ops are also ordered among themselves
//   kernel boundary                      a launch that is not a programmatic dependent launch starts after the
//                                        previous one ended: ordered after all of it (VClock::done)
//   griddepcontrol.wait                  waits for the previous launch of the stream to end: ordered after it
// A release and an acquire synchronise only if they are morally strong: each one's scope includes the other's
// thread. When they are not (or one is relaxed), the edge is kept as a weak one (Clocks::weak), which names the
// operation when a race it would have ordered is reported.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- thread clocks

inline u32& own_clock(Thread& t) { return t.clocks.strong.own[t.tid]; }
inline u32 own_clock(const Thread& t) { return t.clocks.strong.own[t.tid]; }

inline u32 tick(Thread& t) {
    const u32 c = ++own_clock(t);
    if (t.clocks.weak) t.clocks.weak->own[t.tid] = c;
    return c;
}

// A release of `t` into `obj`: obj learns everything t is ordered after, including t's accesses so far.
inline void release_into(Clocks& obj, Thread& t) {
    obj.join(t.clocks);
    tick(t);
}

inline void acquire_from(Thread& t, const Clocks& obj) { t.clocks.join(obj); }

// The clocks of a new thread of launch `l`: its own clock starts at 1, kernels [0, done) are behind it.
inline void init_clocks(Thread& t, const Launch& l, u32 done) {
    t.clocks.clear();
    t.clocks.strong.home = t.gcta;
    t.clocks.strong.own.assign(l.cfg.block_x, 0);
    t.clocks.strong.own[t.tid] = 1;
    t.clocks.strong.done = done;
}

// ---------------------------------------------------------------- scopes

inline Launch& launch_of_cta(u32 gcta) { return *S().cta_launch[gcta]; }

// Does `scope` of a thread of CTA a include the threads of CTA b?
inline bool scope_includes(Scope scope, u32 a, u32 b) {
    if (scope == Scope::Gpu || scope == Scope::Async || a == b) return true;
    if (scope == Scope::Cta) return false;
    const Launch& la = launch_of_cta(a);
    if (&la != &launch_of_cta(b)) return false;
    const u32 cx = la.cfg.cluster_x;
    return (a - la.cta_base) / cx == (b - la.cta_base) / cx;
}

// ---------------------------------------------------------------- call sites
// A site id is a u32: bit 27 set, an index into the table of hal call sites (file and line from the hal
// function's default arguments); clear, a plain access's instrumentation call by its return address: bits 20-26 the
// kernel library (an index into the stream's table of libraries, Sites::libraries; a stream may run kernels of
// several), bits 0-19 the offset from that library's base (symbolised with addr2line when a report names it; a
// kernel library's code is far below 1 MiB). Bits 28-31 are free for the shadow's flags.
constexpr u32 kSiteTable = 1u << 27;
constexpr u32 kSiteBits = (1u << 28) - 1;
constexpr u32 kSiteLibraryShift = 20;
constexpr u32 kSiteMaxLibraries = 1u << (27 - kSiteLibraryShift);

struct Sites {
    std::vector<Site> table;
    struct KeyHash {
        size_t operator()(const std::pair<const char*, int>& k) const noexcept {
            return std::hash<const void*>()(k.first) * 1000003u ^ std::hash<int>()(k.second);
        }
    };
    std::unordered_map<std::pair<const char*, int>, u32, KeyHash> by_key;  // (file, line) -> table index
    std::unordered_map<u32, std::string> resolved;  // pc sites already symbolised
    std::deque<std::string> names;                  // storage for Site::file of symbolised sites
    struct Library {
        uintptr_t base;
        std::string file;
    };
    std::vector<Library> libraries;  // the kernel libraries of the stream's launches (pc sites' bits 20-26)
};
inline Sites g_sites;

// The library that defines `code` (a kernel's body) as the stream's library number: launch `l` records its base and
// its bits for pc_site. Past kSiteMaxLibraries libraries in one stream, plain accesses of the later ones are named "?".
inline void register_library(Launch& l, const void* code) {
    Dl_info info{};
    dladdr(code, &info);
    const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    u32 i = 0;
    while (i < g_sites.libraries.size() && g_sites.libraries[i].base != base) ++i;
    if (i == g_sites.libraries.size()) g_sites.libraries.push_back(Sites::Library{base, info.dli_fname ? info.dli_fname : ""});
    l.lib_base = base;
    l.lib_bits = i < kSiteMaxLibraries ? i << kSiteLibraryShift : kSiteTable;  // kSiteTable: none (pc_site gives 0)
}

// NOTES: keyed on the file pointer and line, not a formatted string: this runs for every barrier and memory
// operation the detector records (snprintf here was ~3% of an exact-config simulation).
inline u32 site_id(const Site& s) {
    auto [it, inserted] = g_sites.by_key.emplace(std::make_pair(s.file, s.line), u32(g_sites.table.size()));
    if (inserted) g_sites.table.push_back(s);
    return kSiteTable | it->second;
}

inline u32 pc_site(const void* pc) {
    const Launch& l = *g_launch;
    const uintptr_t off = reinterpret_cast<uintptr_t>(pc) - l.lib_base;
    return off < (1u << kSiteLibraryShift) && l.lib_bits != kSiteTable ? l.lib_bits | u32(off) : 0u;
}

// file:line of a return address in this library, as site_str prints it ("kernels/fp8_gemm.cuh:297"); when the
// access was inlined from a helper, the lines it was inlined into follow, innermost first, up to three
// ("kernels/quant.cuh:200 <- kernels/quant.cuh:256").
inline std::string symbolise(u32 id) {
    auto it = g_sites.resolved.find(id);
    if (it != g_sites.resolved.end()) return it->second;
    const u32 library = id >> kSiteLibraryShift, offset = id & ((1u << kSiteLibraryShift) - 1);
    const std::string name = library < g_sites.libraries.size() ? g_sites.libraries[library].file : std::string();
    std::string file = name;
    // The runner loads libraries through /proc/self/fd/N (the descriptor it verified): addr2line, another
    // process, reads the same file through this process's descriptor.
    if (file.rfind("/proc/self/", 0) == 0) file = format("/proc/%d/", int(getpid())) + file.substr(11);
    std::vector<std::string> frames;
    if (!file.empty()) {
        const std::string cmd = format("addr2line -i -e '%s' 0x%x 2>/dev/null", file.c_str(), offset - 1);
        if (FILE* f = popen(cmd.c_str(), "r")) {
            char line[4096];
            while (frames.size() < 3 && fgets(line, sizeof line, f)) {
                std::string frame = line;
                frame = frame.substr(0, frame.find_first_of(" \n"));
                const size_t colon = frame.rfind(':');
                if (frame.empty() || frame[0] == '?' || colon == std::string::npos || frame.compare(colon, 2, ":?") == 0)
                    break;
                g_sites.names.push_back(frame.substr(0, colon));
                frame = site_str(Site{g_sites.names.back().c_str(), std::atoi(frame.c_str() + colon + 1)});
                if (frames.empty() || frames.back() != frame) frames.push_back(frame);
            }
            pclose(f);
        }
    }
    std::string out;
    for (const std::string& frame : frames) out += (out.empty() ? "" : " <- ") + frame;
    if (out.empty()) out = format("%s+%#x", name.empty() ? "?" : name.c_str(), offset);
    g_sites.resolved.emplace(id, out);
    return out;
}

inline std::string site_text(u32 id) {
    id &= kSiteBits;
    if (id & kSiteTable) return site_str(g_sites.table[id & (kSiteTable - 1)]);
    return id ? symbolise(id) : std::string("?");
}

// ---------------------------------------------------------------- synchronisation objects with scopes

inline const char* weak_kind(Weak w) { return w == Weak::Relaxed ? "relaxed" : "scope"; }

// A release of `clocks` (thread `gtid` of CTA `gcta`'s, or what its last fence saw) at `scope` into `var`;
// strong = false for a relaxed atomic write (a weak edge only). The caller ticks the thread's clock.
inline void sync_release_clocks(SyncVar& var, const Clocks& clocks, u32 gcta, u32 gtid, Scope scope, bool strong,
                                const char* op, u32 site) {
    SyncVar::Entry* e = nullptr;
    for (SyncVar::Entry& x : var.entries)
        if (x.scope == scope && x.gcta == gcta) e = &x;
    if (!e) {
        var.entries.push_back(SyncVar::Entry{scope, gcta, Clocks{}, op, site, gtid});
        e = &var.entries.back();
    }
    e->op = op;
    e->site = site;
    e->gtid = gtid;
    if (strong) {
        e->clocks.join(clocks);
    } else {
        e->clocks.join_weak(clocks, WeakNote{Weak::Relaxed, op, site, gtid, 0, ~0u});
    }
}

inline void sync_release(SyncVar& var, Thread& t, Scope scope, bool strong, const char* op, u32 site) {
    sync_release_clocks(var, t.clocks, t.gcta, t.gtid, scope, strong, op, site);
    tick(t);
}

inline bool morally_strong(const SyncVar::Entry& e, u32 gcta, Scope scope) {
    return e.scope == Scope::Async || (scope_includes(e.scope, e.gcta, gcta) && scope_includes(scope, gcta, e.gcta));
}

// `clocks` (a thread's, or a fence's pending acquire) acquires what `var` released; an entry synchronises only
// when both scopes include the other side (else, and for a relaxed acquire, a weak edge).
inline void sync_acquire_into(Clocks& clocks, u32 gcta, u32 gtid, const SyncVar& var, Scope scope, bool strong,
                              const char* op, u32 site) {
    for (const SyncVar::Entry& e : var.entries) {
        const bool moral = morally_strong(e, gcta, scope);
        if (strong && moral) {
            clocks.join(e.clocks);
        } else if (!strong) {
            clocks.join_weak(e.clocks, WeakNote{Weak::Relaxed, op, site, gtid, e.site, e.gtid});
        } else {
            clocks.join_weak(e.clocks, WeakNote{Weak::Scope, e.op, e.site, e.gtid, site, gtid});
        }
    }
}

inline void sync_acquire(Thread& t, const SyncVar& var, Scope scope, bool strong, const char* op, u32 site) {
    sync_acquire_into(t.clocks, t.gcta, t.gtid, var, scope, strong, op, site);
}

// ---------------------------------------------------------------- thread barriers (bar.sync, cluster, warp)

inline void hb_arrive(ThreadBarrier& b, Thread& t) { release_into(b.join, t); }

// The round completed: what its arrivals had seen becomes visible to every participant.
inline void hb_release(ThreadBarrier& b) {
    b.released = std::move(b.join);
    b.join.clear();
}

inline void hb_acquire(const ThreadBarrier& b, Thread& t) { acquire_from(t, b.released); }

}  // namespace dfg::sim::detail
