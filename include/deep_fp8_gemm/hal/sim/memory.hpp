// deep_fp8_gemm CPU simulator: global atomics, fences and programmatic dependent launch (griddepcontrol).
// Part of hal/sim.hpp (included from there, in order); the happens-before rules are in hb.hpp.
//
// Atomics execute as sequentially consistent read-modify-writes on host memory (the value a thread gets is the
// latest one), but order other memory accesses only as PTX's memory model says: through release / acquire
// semantics at a scope that includes both threads, or a relaxed atomic combined with fence.acq_rel / fence.sc.
#pragma once

namespace dfg::sim::detail {

// "atomic_add (.acq_rel.gpu)": the operation's name in reports.
DFG_SIM_API const char* op_name(const char* op, hal::MemOrder o, hal::MemScope s) {
    static const char* const kOrders[] = {".relaxed", ".acquire", ".release", ".acq_rel", ".sc"};
    static std::unordered_map<std::string, std::string> names;
    const std::string name = format("%s (%s%s)", op, kOrders[static_cast<int>(o)], scope_name(scope_of(s)));
    return names.emplace(name, name).first->second.c_str();
}

inline bool acquires(Order o) { return o == Order::Acquire || o == Order::AcqRel || o == Order::SeqCst; }
inline bool releases(Order o) { return o == Order::Release || o == Order::AcqRel || o == Order::SeqCst; }

// A u32 global-memory (host) address, for an atomic.
inline void check_global_u32(const void* ptr, const char* what) {
    const u8* p = static_cast<const u8*>(ptr);
    for (const auto& lp : S().launches) {
        const Launch& l = *lp;
        if (l.smem_base && p >= l.smem_base && p < l.smem_base + l.smem_alloc * l.ctas.size())
            fail(format("%s: %p points into the shared memory of cta %llu, not global memory", what, ptr,
                        static_cast<unsigned long long>((p - l.smem_base) / l.smem_alloc)));
    }
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 4)
        fail(format("%s: address %p is null or not 4-byte aligned", what, ptr));
}

inline SyncVar& atomic_var(const void* ptr) { return shadow().atomics[reinterpret_cast<uintptr_t>(ptr)]; }

// What an atomic read of `var` gives `t`: with acquire semantics the releases it synchronises with; relaxed, only a
// weak edge, and what a later fence of `t` acquires.
inline void atomic_observe(Thread& t, const SyncVar& var, Scope scope, bool acquire, const char* what, u32 site) {
    if (acquire) return sync_acquire(t, var, scope, true, what, site);
    sync_acquire(t, var, scope, false, what, site);
    for (const SyncVar::Entry& e : var.entries) {
        Observed* o = nullptr;
        for (Observed& x : t.observed)
            if (x.read_scope == scope && x.entry.scope == e.scope && x.entry.gcta == e.gcta) o = &x;
        if (o) {
            o->entry.clocks.join(e.clocks);
            o->entry.op = e.op;
            o->entry.site = e.site;
            o->entry.gtid = e.gtid;
        } else {
            t.observed.push_back(Observed{scope, e});
        }
    }
}

// What an atomic write of `t` puts into `var`: with release semantics its clocks; relaxed after a fence, the clocks
// at the fence; relaxed alone, a weak edge.
inline void atomic_publish(Thread& t, SyncVar& var, Scope scope, bool release, const char* what, u32 site) {
    if (release) return sync_release(var, t, scope, true, what, site);
    if (t.fence_release) {
        sync_release_clocks(var, *t.fence_release, t.gcta, t.gtid, narrower(scope, t.fence_release_scope), true, what,
                            site);
        tick(t);
        return;
    }
    sync_release(var, t, scope, false, what, site);
}

// atom{.order}{.scope}.global.add.u32
DFG_SIM_API u32 atomic_add_global(u32* ptr, u32 value, Order order, Scope scope, const char* what) {
    check_global_u32(ptr, what);
    Thread& t = me();
    const u32 site = site_id(t.site);
    if (S().races) fine_access(t, reinterpret_cast<uintptr_t>(ptr), 4, Access{what, true, true, scope, site});
    SyncVar& var = atomic_var(ptr);
    atomic_observe(t, var, scope, acquires(order), what, site);
    const u32 old = *ptr;
    *ptr = old + value;
    atomic_publish(t, var, scope, releases(order), what, site);  // an RMW continues the release sequences
    return old;
}

// ld{.relaxed|.acquire}{.scope}.global.u32
DFG_SIM_API u32 atomic_load_global(const u32* ptr, Order order, Scope scope, const char* what) {
    check_global_u32(ptr, what);
    Thread& t = me();
    const u32 site = site_id(t.site);
    if (S().races) fine_access(t, reinterpret_cast<uintptr_t>(ptr), 4, Access{what, false, true, scope, site});
    atomic_observe(t, atomic_var(ptr), scope, acquires(order), what, site);
    return *ptr;
}

// st{.relaxed|.release}{.scope}.global.u32: a store heads a new release sequence.
DFG_SIM_API void atomic_store_global(u32* ptr, u32 value, Order order, Scope scope, const char* what) {
    check_global_u32(ptr, what);
    Thread& t = me();
    const u32 site = site_id(t.site);
    if (S().races) fine_access(t, reinterpret_cast<uintptr_t>(ptr), 4, Access{what, true, true, scope, site});
    SyncVar& var = atomic_var(ptr);
    var.clear();
    *ptr = value;
    atomic_publish(t, var, scope, releases(order), what, site);
}

// fence.acq_rel / fence.sc at `scope` (PTX ISA "membar / fence"): acquires what this thread's relaxed atomic reads
// observed, makes its next relaxed atomic writes releases of its clocks now; fence.sc ops also synchronise with
// each other in their (here: the simulation's) total order.
DFG_SIM_API void fence(Order order, Scope scope, const char* what) {
    Thread& t = me();
    const u32 site = site_id(t.site);
    for (const Observed& o : t.observed) {
        const Scope s = narrower(o.read_scope, scope);
        if (morally_strong(o.entry, t.gcta, s))
            t.clocks.join(o.entry.clocks);
        else
            t.clocks.join_weak(o.entry.clocks, WeakNote{Weak::Scope, o.entry.op, o.entry.site, o.entry.gtid, site, t.gtid});
    }
    t.observed.clear();
    if (order == Order::SeqCst) {
        SyncVar& sc = shadow().sc_fences;
        sync_acquire(t, sc, scope, true, what, site);
        sync_release_clocks(sc, t.clocks, t.gcta, t.gtid, scope, true, what, site);
    }
    t.fence_release.reset(new Clocks(t.clocks));
    t.fence_release_scope = scope;
    tick(t);
}

// ---------------------------------------------------------------- accesses the hal performs for a thread

// A load or store a hal operation makes for the kernel (ld.global.nc, ld / st.global.v2.f32), checked and
// recorded as a plain one, at the hal call's site.
DFG_SIM_API void hal_access(const void* ptr, u32 bytes, bool write, const char* what) {
    if (!S().races) return;
    Thread& t = me();
    fine_access(t, reinterpret_cast<uintptr_t>(ptr), bytes, Access{what, write, false, Scope::Cta, site_id(t.site)});
}

DFG_SIM_API void check_aligned(const void* ptr, u32 alignment, const char* what) {
    if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0)
        fail(format("%s: address %p is not %u-byte aligned (misaligned vector access)", what, ptr, alignment));
}

// ---------------------------------------------------------------- programmatic dependent launch

// griddepcontrol.wait (PTX ISA "griddepcontrol"): the thread waits until the prerequisite grid (the previous launch
// of the stream) has completed and its memory operations are visible; from then on it is ordered after all of it.
// Without a programmatic dependent launch the previous launch has already ended: it returns at once.
DFG_SIM_API void grid_dependency_wait() {
    Thread& t = me();
    Launch& l = L();
    l.ctas[t.cta].dependency_waited = true;
    if (!l.programmatic || l.index == 0) return;
    if (!S().launches[l.index - 1]->finished) block(Wait{WaitKind::GridDependency, t.cta, l.index - 1, 0, 0}, "griddepcontrol.wait");
    t.clocks.strong.done = t.clocks.strong.done > l.index ? t.clocks.strong.done : l.index;
    if (t.clocks.weak) t.clocks.weak->done = t.clocks.strong.done;
}

// griddepcontrol.launch_dependents: the next launch, if programmatic, may start once every CTA of this one has
// executed it (once per CTA is enough) or exited. Not a memory edge: the dependent's wait orders it.
DFG_SIM_API void launch_dependents() {
    Cta& c = my_cta();
    if (c.triggered) return;
    c.triggered = true;
    c.done_for_dependents = me().clocks.strong.done;
}

}  // namespace dfg::sim::detail
