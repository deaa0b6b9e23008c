// deep_fp8_gemm CPU simulator: shadow memory and the race checks of memory accesses (FastTrack-style epochs over
// the vector clocks of hb.hpp). Part of hal/sim.hpp (included from there, in order).
//
// Every byte that a plain (generic-proxy) access touched has a cell: the epoch (thread, clock) and site of its last
// write and of its last read, or, once two threads read it with no order between them, a read set holding each
// reader's last read since the write (FastTrack's read-shared state: O(1) per read, a broadcast read of 256
// threads costs no more than 256 single reads). An access is checked against the cell before it is recorded:
//   read    the last write must happen-before it
//   write   the last write and every read recorded since must happen-before it
// by another thread; atomics are exempt from each other when their scopes include each other's thread (else the
// pair is reported as `scope`). The async proxy's accesses (TMA loads and stores) are recorded per 16-byte granule
// (TMA boxes are 16-byte aligned) in a second, coarse shadow that keeps the last async write and the last async
// read: plain accesses are checked against it, TMA issues against the plain cells (smem) and against both (global
// memory, where a TMA store and another kernel's TMA load of the same bytes must be ordered). Async accesses to
// shared memory are not checked against each other: a peer's multicast after this CTA's own load of the stage is
// ordered only by the remote arrive (.release.cta, so not morally strong with the peer's wait), and the proxy /
// wgmma-window checks already cover that path.
//
// Shared and global memory are told apart by address (each launch maps all its CTAs' shared memory as one
// range); the shadow is keyed by address, so it covers both and lives for the whole stream (a later kernel sees an
// earlier one's accesses: kernel boundaries and griddepcontrol.wait order them through VClock::done).
#pragma once

namespace dfg::sim::detail {

struct Cell {
    u64 w = 0, r = 0;      // epochs: (global thread + 1) << 32 | clock; 0: none. r may name a read set (kReadSet)
    u32 wsite = 0, rsite = 0;  // site ids (hb.hpp) with the flags below
};
// Flags in Cell::wsite / rsite, above the 28 bits of the site id.
constexpr u32 kCellAtomic = 1u << 31;  // the access was an atomic operation; its scope in bits 29-30
constexpr u32 kCellScopeShift = 29;
constexpr u32 kReadSet = 1u << 28;     // (rsite) r is an index into Shadow::read_sets

constexpr u32 kPageShift = 12;  // fine pages: one cell per byte of 4 KiB; coarse pages: one per 16 B of 64 KiB
struct ShadowPage {
    Cell cell[1u << kPageShift];
};

// The last read of each thread that read a cell since its last write: slot i is global thread base + i.
struct ReadSet {
    u32 base = 0;
    std::vector<u64> epoch;  // 0: no read
    std::vector<u32> site;
    void clear() {
        epoch.clear();
        site.clear();
    }
    void put(u64 e, u32 s) {
        const u32 gtid = u32(e >> 32) - 1;
        if (epoch.empty()) base = gtid;
        if (gtid < base) {  // grow downwards
            const u32 by = base - gtid;
            epoch.insert(epoch.begin(), by, 0);
            site.insert(site.begin(), by, 0);
            base = gtid;
        }
        const u32 i = gtid - base;
        if (i >= epoch.size()) {
            epoch.resize(i + 1, 0);
            site.resize(i + 1, 0);
        }
        epoch[i] = e;
        site[i] = s;
    }
};

struct Shadow {
    std::unordered_map<uintptr_t, ShadowPage*> fine, coarse;
    std::vector<ReadSet> read_sets;
    std::vector<u32> free_sets;
    std::unordered_map<uintptr_t, SyncVar> atomics;  // release sequences, per address of an atomic
    SyncVar sc_fences;                               // fence.sc ops in their total order
    uintptr_t fine_key = ~uintptr_t(0), coarse_key = ~uintptr_t(0);
    ShadowPage *fine_page = nullptr, *coarse_page = nullptr;

    ~Shadow() {
        for (auto& [k, p] : fine) std::free(p);
        for (auto& [k, p] : coarse) std::free(p);
    }
    static ShadowPage* get(std::unordered_map<uintptr_t, ShadowPage*>& map, uintptr_t key, bool create) {
        auto it = map.find(key);
        if (it != map.end()) return it->second;
        if (!create) return nullptr;
        auto* p = static_cast<ShadowPage*>(std::calloc(1, sizeof(ShadowPage)));
        if (!p) fail("out of memory for the race detector's shadow memory (DFG_SIM_RACES=0 turns it off)");
        map.emplace(key, p);
        return p;
    }
    // The cell of byte `a` (null when none exists and create is false).
    Cell* fine_cell(uintptr_t a, bool create) {
        const uintptr_t key = a >> kPageShift;
        if (key != fine_key) {
            ShadowPage* p = get(fine, key, create);
            if (!p) return nullptr;
            fine_key = key;
            fine_page = p;
        }
        return &fine_page->cell[a & ((1u << kPageShift) - 1)];
    }
    // The cell of the 16-byte granule holding byte `a`.
    Cell* coarse_cell(uintptr_t a, bool create) {
        const uintptr_t g = a >> 4;
        const uintptr_t key = g >> kPageShift;
        if (key != coarse_key) {
            ShadowPage* p = get(coarse, key, create);
            if (!p) return nullptr;
            coarse_key = key;
            coarse_page = p;
        }
        return &coarse_page->cell[g & ((1u << kPageShift) - 1)];
    }
    // Drops every record of [a, a + bytes) (a and bytes page multiples: an exited CTA's shared memory, which no
    // access may touch again), so the shadow of a grid's shared memory is bounded by its resident CTAs'.
    void forget(uintptr_t a, size_t bytes) {
        for (uintptr_t key = a >> kPageShift; key < (a + bytes) >> kPageShift; ++key) {
            auto it = fine.find(key);
            if (it == fine.end()) continue;
            for (Cell& c : it->second->cell) free_set(c);
            std::free(it->second);
            fine.erase(it);
        }
        fine_key = coarse_key = ~uintptr_t(0);
        const uintptr_t end = (a + bytes) >> 4;  // coarse cells: one per 16-byte granule, no read sets
        for (uintptr_t g = a >> 4; g < end;) {
            const uintptr_t page_end = ((g >> kPageShift) + 1) << kPageShift;
            const uintptr_t stop = page_end < end ? page_end : end;
            auto it = coarse.find(g >> kPageShift);
            if (it != coarse.end())
                for (uintptr_t x = g; x < stop; ++x) it->second->cell[x & ((1u << kPageShift) - 1)] = Cell{};
            g = stop;
        }
    }
    void free_set(Cell& c) {
        if (c.rsite & kReadSet) {
            read_sets[c.r].clear();
            free_sets.push_back(u32(c.r));
        }
        c.r = 0;
        c.rsite = 0;
    }
    u32 new_set() {
        if (!free_sets.empty()) {
            const u32 i = free_sets.back();
            free_sets.pop_back();
            return i;
        }
        read_sets.emplace_back();
        return u32(read_sets.size() - 1);
    }
};

inline Shadow& shadow() { return *S().shadow; }

// ---------------------------------------------------------------- epochs

inline u64 epoch_of(const Thread& t) { return (u64(t.gtid) + 1) << 32 | own_clock(t); }
inline Thread& epoch_thread(u64 e) { return *S().threads[(e >> 32) - 1]; }

// Is the access `e` ordered before thread `t`'s next one (program order, or a happens-before path in `vc`)?
inline bool ordered_in(u64 e, const Thread& t, const VClock& vc) {
    const u32 gtid = u32(e >> 32) - 1;
    if (gtid == t.gtid) return true;
    const Thread& p = *S().threads[gtid];
    return p.kernel < vc.done || vc.get(p.gcta, p.tid) >= u32(e);
}
inline bool ordered(u64 e, const Thread& t) { return ordered_in(e, t, t.clocks.strong); }

// ---------------------------------------------------------------- reports

inline Scope cell_scope(u32 site) { return Scope((site >> kCellScopeShift) & 3u); }
inline u32 atomic_flags(Scope s) { return kCellAtomic | (u32(s) << kCellScopeShift); }

// Where byte `a` is, for a report: "smem+0x1c040 of cta 0" or "global 0x7f3a12345000".
inline std::string where(uintptr_t a) {
    for (const auto& lp : S().launches) {
        const Launch& l = *lp;
        if (!l.smem_base || a < uintptr_t(l.smem_base) || a >= uintptr_t(l.smem_base) + l.smem_alloc * l.ctas.size())
            continue;
        const uintptr_t off = a - uintptr_t(l.smem_base);
        const std::string kernel = S().launches.size() > 1 ? format(" of kernel %u", l.index) : std::string();
        return format("smem+%#llx of cta %llu", static_cast<unsigned long long>(off % l.smem_alloc),
                      static_cast<unsigned long long>(off / l.smem_alloc)) + kernel;
    }
    return format("global %#llx", static_cast<unsigned long long>(a));
}

inline std::string access_name(bool write, u32 flags, bool async) {
    if (async) return write ? "a TMA write" : "a TMA read";
    if (flags & kCellAtomic) return format("an atomic %s (%s)", write ? "write" : "read", scope_name(cell_scope(flags)));
    return write ? "a plain write" : "a plain read";
}

inline std::string thread_of(u64 e) { return thread_name(epoch_thread(e)); }

// The access of `t` (`what`, `bytes` at `a`, at site `site`) conflicts with the earlier access `prev` (epoch, site
// with flags, write or read, async or not): report it with both threads and both call sites, and the kind.
[[noreturn]] inline void report_race(Thread& t, const char* what, uintptr_t a, u32 bytes, u32 site, u64 prev,
                                     u32 prev_site, bool prev_write, bool prev_async) {
    const Thread& p = epoch_thread(prev);
    const std::string here = site_text(site);
    g_sites.names.push_back(here);
    t.site = Site{g_sites.names.back().c_str(), 0};  // fail() names this access's site
    const std::string by = &t == &me() ? std::string() : " by " + thread_name(t);  // stmatrix: another lane's row
    const std::string head = format("%s%s of %u bytes at %s conflicts with %s by %s at %s", what, by.c_str(), bytes,
                                    where(a).c_str(),
                                    access_name(prev_write, prev_site, prev_async).c_str(), thread_name(p).c_str(),
                                    site_text(prev_site).c_str());
    if (p.kernel != t.kernel) {
        const Thread& later = p.kernel > t.kernel ? p : t;
        fail(format("pdl: %s: kernel %u is a programmatic dependent launch, ordered after kernel %u only by "
                    "griddepcontrol.wait (hal::grid_dependency_wait), and its access comes before its wait",
                    head.c_str(), later.kernel, later.kernel - 1));
    }
    if (t.clocks.weak && ordered_in(prev, t, *t.clocks.weak)) {
        const WeakNote& n = t.clocks.note;
        if (n.kind == Weak::Relaxed)
            fail(format("relaxed: %s: the two threads synchronise only through a relaxed atomic (%s at %s by %s), which "
                        "orders no other memory access (use .release / .acquire, or fences)",
                        head.c_str(), n.op, site_text(n.site).c_str(), thread_of(u64(n.gtid + 1) << 32).c_str()));
        fail(format("scope: %s: the two threads synchronise only through %s at %s by %s, observed at %s by %s, a "
                    "thread outside its scope: a release and an acquire synchronise only when each one's scope "
                    "includes the other's thread (PTX ISA \"Morally strong operations\")",
                    head.c_str(), n.op, site_text(n.site).c_str(), thread_of(u64(n.gtid + 1) << 32).c_str(),
                    site_text(n.peer_site).c_str(),
                    n.peer_gtid == ~0u ? "?" : thread_of(u64(n.peer_gtid + 1) << 32).c_str()));
    }
    fail(format("race: %s, with no happens-before between them (a barrier, an mbarrier wait, or a release / acquire "
                "pair orders accesses of different threads)",
                head.c_str()));
}

// Two atomics on the same address whose scopes do not include each other's threads.
[[noreturn]] inline void report_scope_atomics(Thread& t, const char* what, Scope scope, uintptr_t a, u32 site, u64 prev,
                                              u32 prev_site) {
    g_sites.names.push_back(site_text(site));
    t.site = Site{g_sites.names.back().c_str(), 0};
    const std::string op = std::strchr(what, '(') ? std::string(what) : format("%s (%s)", what, scope_name(scope));
    fail(format("scope: %s at %s and an atomic (%s) by %s at %s access the same address with scopes that do not "
                "include each other's threads: they are neither atomic nor ordered with respect to each other "
                "(PTX ISA \"Morally strong operations\")",
                op.c_str(), where(a).c_str(), scope_name(cell_scope(prev_site)),
                thread_of(prev).c_str(), site_text(prev_site).c_str()));
}

// ---------------------------------------------------------------- checks of one cell

struct Access {
    const char* what;  // "a plain read", "atomic_add", "a TMA load", ...
    bool write;
    bool atomic;
    Scope scope;       // atomics
    u32 site;
};

inline bool atomic_pair_ok(const Thread& t, const Access& x, u64 prev, u32 prev_site) {
    if (!x.atomic || !(prev_site & kCellAtomic)) return false;
    const Thread& p = epoch_thread(prev);
    const Scope ps = cell_scope(prev_site);
    return scope_includes(ps, p.gcta, t.gcta) && scope_includes(x.scope, t.gcta, p.gcta);
}

inline void check_prev(Thread& t, const Access& x, uintptr_t a, u32 bytes, u64 prev, u32 prev_site, bool prev_write,
                       bool prev_async) {
    if (!prev || ordered(prev, t)) return;
    if (x.atomic && (prev_site & kCellAtomic)) {
        if (atomic_pair_ok(t, x, prev, prev_site)) return;
        report_scope_atomics(t, x.what, x.scope, a, x.site, prev, prev_site);
    }
    report_race(t, x.what, a, bytes, x.site, prev, prev_site, prev_write, prev_async);
}

inline void check_reads(Thread& t, const Access& x, uintptr_t a, u32 bytes, const Cell& c, bool async) {
    if (!c.r) return;
    if (!(c.rsite & kReadSet)) return check_prev(t, x, a, bytes, c.r, c.rsite, false, async);
    const ReadSet& set = shadow().read_sets[c.r];
    for (size_t i = 0; i < set.epoch.size(); ++i)
        if (set.epoch[i]) check_prev(t, x, a, bytes, set.epoch[i], set.site[i], false, async);
}

inline void record_read(Thread& t, Cell& c, u64 e, u32 site) {
    Shadow& sh = shadow();
    if (!c.r || (!(c.rsite & kReadSet) && ordered(c.r, t))) {
        c.r = e;
        c.rsite = site;
        return;
    }
    if (!(c.rsite & kReadSet)) {
        const u32 i = sh.new_set();
        sh.read_sets[i].put(c.r, c.rsite);
        sh.read_sets[i].put(e, site);
        c.r = i;
        c.rsite = kReadSet;
        return;
    }
    sh.read_sets[c.r].put(e, site);
}

// A plain (or hal-performed generic-proxy, or atomic) access of `t` to [a, a + bytes).
inline void fine_access(Thread& t, uintptr_t a, u32 bytes, const Access& x) {
    Shadow& sh = shadow();
    const u64 e = epoch_of(t);
    const u32 flags = x.site | (x.atomic ? atomic_flags(x.scope) : 0u);
    for (u32 i = 0; i < bytes; ++i) {
        Cell& c = *sh.fine_cell(a + i, true);
        check_prev(t, x, a, bytes, c.w, c.wsite, true, false);
        if (x.write) {
            check_reads(t, x, a, bytes, c, false);
            if ((c.wsite & kCellAtomic) && !x.atomic) {  // a plain store ends the address's release sequences
                auto it = sh.atomics.find(a + i);
                if (it != sh.atomics.end()) it->second.clear();
            }
            c.w = e;
            c.wsite = flags;
            sh.free_set(c);
        } else {
            record_read(t, c, e, flags);
        }
    }
    // The async proxy's accesses to the same granules.
    for (uintptr_t g = a >> 4; g <= (a + bytes - 1) >> 4; ++g) {
        const Cell* c = sh.coarse_cell(g << 4, false);
        if (!c) continue;
        check_prev(t, x, a, bytes, c->w, c->wsite, true, true);
        if (x.write) check_prev(t, x, a, bytes, c->r, c->rsite, false, true);
    }
}

// An async-proxy access issued by `t` (TMA: `write` into shared memory, or a read / write of global memory) of
// [a, a + bytes): checked against the plain accesses there; global ones also against the async ones.
inline void async_access(Thread& t, uintptr_t a, u32 bytes, bool write, bool global, u32 site, const char* what) {
    Shadow& sh = shadow();
    const Access x{what, write, false, Scope::Cta, site};
    for (uintptr_t p = a; p < a + bytes;) {
        const uintptr_t page_end = ((p >> kPageShift) + 1) << kPageShift;
        const uintptr_t end = page_end < a + bytes ? page_end : a + bytes;
        if (!sh.fine_cell(p, false)) {  // no plain access touched this page
            p = end;
            continue;
        }
        for (; p < end; ++p) {
            const Cell& c = *sh.fine_cell(p, false);
            check_prev(t, x, a, bytes, c.w, c.wsite, true, false);
            if (write) check_reads(t, x, a, bytes, c, false);
        }
    }
    if (!global) return;
    const u64 e = epoch_of(t);
    for (uintptr_t g = a >> 4; g <= (a + bytes - 1) >> 4; ++g) {
        Cell& c = *sh.coarse_cell(g << 4, true);
        check_prev(t, x, a, bytes, c.w, c.wsite, true, true);
        if (write) {
            check_prev(t, x, a, bytes, c.r, c.rsite, false, true);
            c.w = e;
            c.wsite = site;
            c.r = 0;
        } else {
            c.r = e;
            c.rsite = site;
        }
    }
}

// Async-proxy writes that landed (TMA load into shared memory, issued at epoch e): recorded, not checked.
inline void async_landed(uintptr_t a, u32 bytes, u64 e, u32 site) {
    Shadow& sh = shadow();
    for (uintptr_t g = a >> 4; g <= (a + bytes - 1) >> 4; ++g) {
        Cell& c = *sh.coarse_cell(g << 4, true);
        c.w = e;
        c.wsite = site;
        c.r = 0;
    }
}

// The async proxy finished reading [a, a + bytes) of shared memory for `t` (a TMA store's source, at the wait
// that releases it): later plain writes there must be ordered after this point.
inline void async_read_done(Thread& t, uintptr_t a, u32 bytes, u32 site) {
    Shadow& sh = shadow();
    const u64 e = epoch_of(t);
    for (uintptr_t g = a >> 4; g <= (a + bytes - 1) >> 4; ++g) {
        Cell& c = *sh.coarse_cell(g << 4, true);
        c.r = e;
        c.rsite = site;
    }
}

}  // namespace dfg::sim::detail
