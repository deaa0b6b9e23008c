// deep_fp8_gemm CPU simulator: vector clocks (the data of the happens-before model; hb.hpp has the rules).
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// Threads are named by their global CTA index (gcta: CTAs of every launch of a stream numbered one after the
// other) and their thread index in the CTA. A VClock maps (gcta, tid) to the last event of that thread the owner
// is ordered after: one dense vector for the owner's own CTA (`own`, the common case: most synchronisation is
// inside a CTA) and one per other CTA it has synchronised with (`foreign`, sorted by gcta: cluster barriers,
// global atomics, remote arrives). `done` says that kernels [0, done) of the stream are wholly ordered before
// the owner (a kernel boundary, or griddepcontrol.wait), so no per-thread entries are kept for them.
#pragma once

namespace dfg::sim::detail {

constexpr u32 kNoCta = ~0u;

struct VClock {
    struct Part {
        u32 gcta;
        std::vector<u32> clk;
    };
    u32 home = kNoCta;  // gcta whose clocks are `own`
    u32 done = 0;       // kernels of the stream wholly ordered before the owner
    std::vector<u32> own;
    std::vector<Part> foreign;  // sorted by gcta, never home

    u32 get(u32 gcta, u32 tid) const {
        if (gcta == home) return tid < own.size() ? own[tid] : 0u;
        for (const Part& p : foreign)
            if (p.gcta == gcta) return tid < p.clk.size() ? p.clk[tid] : 0u;
        return 0;
    }

    static void max_into(std::vector<u32>& into, const std::vector<u32>& from) {
        if (into.size() < from.size()) into.resize(from.size(), 0);
        u32* d = into.data();
        const u32* s = from.data();
        for (size_t i = 0, n = from.size(); i < n; ++i) d[i] = s[i] > d[i] ? s[i] : d[i];
    }

    void merge_part(u32 gcta, const std::vector<u32>& clk) {
        if (clk.empty()) return;
        if (gcta == home) return max_into(own, clk);
        size_t i = 0;
        while (i < foreign.size() && foreign[i].gcta < gcta) ++i;
        if (i == foreign.size() || foreign[i].gcta != gcta) foreign.insert(foreign.begin() + i, Part{gcta, {}});
        max_into(foreign[i].clk, clk);
    }

    void join(const VClock& o) {
        if (home == kNoCta && own.empty() && foreign.empty()) {  // an empty object takes the other's shape
            const u32 d = done;
            *this = o;
            done = o.done > d ? o.done : d;
            return;
        }
        done = o.done > done ? o.done : done;
        if (o.home != kNoCta) merge_part(o.home, o.own);
        for (const Part& p : o.foreign) merge_part(p.gcta, p.clk);
    }
};

// Why a thread or object is ordered after something only "weakly": through an edge the memory model does not
// give (a relaxed atomic standing in for release / acquire, or a release / acquire whose scope does not include
// the other thread). Kept for the report of a race such an edge would have prevented.
enum class Weak : u8 { None = 0, Relaxed = 1, Scope = 2 };
struct WeakNote {
    Weak kind = Weak::None;
    const char* op = "";         // the operation that made the edge weak
    u32 site = 0, gtid = ~0u;    // its site id (hb.hpp) and global thread index
    u32 peer_site = 0, peer_gtid = ~0u;  // the other end of the edge (scope: the observer)
};

// Happens-before state of a thread or a synchronisation object: `strong` through the edges PTX's memory model
// gives, `weak` (allocated at the first weak edge; null means equal to strong) through those and the weak ones.
struct Clocks {
    VClock strong;
    std::unique_ptr<VClock> weak;
    WeakNote note;

    Clocks() = default;
    Clocks(const Clocks& o) : strong(o.strong), weak(o.weak ? new VClock(*o.weak) : nullptr), note(o.note) {}
    Clocks& operator=(const Clocks& o) {
        if (this != &o) {
            strong = o.strong;
            weak.reset(o.weak ? new VClock(*o.weak) : nullptr);
            note = o.note;
        }
        return *this;
    }
    Clocks(Clocks&&) = default;
    Clocks& operator=(Clocks&&) = default;

    const VClock& weak_or_strong() const { return weak ? *weak : strong; }
    VClock& make_weak() {
        if (!weak) weak.reset(new VClock(strong));
        return *weak;
    }
    // A strong edge: everything `from` is ordered after (strongly or weakly) this is now ordered after too.
    void join(const Clocks& from) {
        strong.join(from.strong);
        if (from.weak) {
            make_weak().join(*from.weak);
            note = from.note;
        } else if (weak) {
            weak->join(from.strong);
        }
    }
    // A weak edge: only `weak` learns what `from` knows.
    void join_weak(const Clocks& from, const WeakNote& why) {
        make_weak().join(from.weak_or_strong());
        note = why;
    }
    void clear() {
        strong = VClock{};
        weak.reset();
        note = WeakNote{};
    }
};

// PTX ISA "Scope": the set of threads an operation's ordering applies to. Async: a TMA complete_tx on an
// mbarrier, which makes the async proxy's writes visible to every waiter of the phase, whatever its scope.
enum class Scope : u8 { Cta = 0, Cluster = 1, Gpu = 2, Async = 3 };
inline const char* scope_name(Scope s) {
    return s == Scope::Cta ? ".cta" : s == Scope::Cluster ? ".cluster" : s == Scope::Gpu ? ".gpu" : "async";
}
inline Scope narrower(Scope a, Scope b) { return a < b ? a : b; }

// A location or object that threads release into and acquire from (an atomic's address, an mbarrier phase, the
// order of fence.sc): one entry per (release scope, releasing CTA), because whether an acquirer synchronises
// with a release depends on both scopes and both CTAs (PTX ISA "Morally strong operations").
struct SyncVar {
    struct Entry {
        Scope scope;
        u32 gcta;
        Clocks clocks;
        const char* op;  // the last release into this entry, for reports
        u32 site, gtid;
    };
    std::vector<Entry> entries;
    void clear() { entries.clear(); }
};

// What a relaxed atomic read observed, for a later fence.acq_rel / fence.sc of the same thread to acquire.
struct Observed {
    Scope read_scope;
    SyncVar::Entry entry;
};

}  // namespace dfg::sim::detail
