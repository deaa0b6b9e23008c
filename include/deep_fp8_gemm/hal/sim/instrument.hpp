// deep_fp8_gemm CPU simulator: instrumentation of the kernels' plain loads and stores.
// Part of hal/sim.hpp (included from there, in order); see its header for why this mechanism.
//
// deep_fp8_gemm/simulator/build.py compiles a kernel's translation unit with -fsanitize=thread
// (--param=tsan-instrument-func-entry-exit=0) and links it, with the separately compiled (uninstrumented)
// emulation, without the ThreadSanitizer runtime: GCC then calls __tsan_readN / __tsan_writeN before every memory
// access of that translation unit it could not prove local, and this file defines those functions. The hal's
// inline wrappers are in that translation unit too, so the calls are filtered here, cheapest test first: g_track
// is true only while a fiber runs kernel code (fiber_main sets it, every hal function clears it for its duration
// through HalGuard, the scheduler never sets it), then the thread's own fiber stack (locals whose address escaped:
// accumulator arrays, lambdas' captures; only the registers its wgmmas use are checked there, wgmma_registers.hpp)
// and the launch's parameter struct are skipped.
// What remains is a plain access of the kernel to shared or global memory: shadow.hpp checks and records it,
// with the return address as its call site (symbolised by addr2line when reported; the build adds -g1).
#pragma once

#define DFG_SIM_NO_TSAN __attribute__((no_sanitize("thread")))

namespace dfg::sim::detail {

inline bool g_track = false;

// HalGuard (api.hpp) clears g_track for a hal function's duration and restores it after: the simulator's own
// work is not the kernel's. Not instrumented themselves (when everything is one instrumented translation unit).
DFG_SIM_API DFG_SIM_NO_TSAN __attribute__((noinline)) bool hal_guard_enter() {
    const bool saved = g_track;
    g_track = false;
    return saved;
}
DFG_SIM_API DFG_SIM_NO_TSAN __attribute__((noinline)) void hal_guard_leave(bool saved) { g_track = saved; }

DFG_SIM_NO_TSAN inline void set_tracking(bool on) { g_track = on; }

// A plain access of the running thread's kernel code to [a, a + bytes): bounds of shared memory, then the race
// checks (and, for a store into shared memory, the proxy bookkeeping of generic writes).
inline void plain_access(Thread& t, uintptr_t a, u32 bytes, bool write, u32 site) {
    const Launch& l = L();
    const uintptr_t base = reinterpret_cast<uintptr_t>(l.smem_base);
    if (a - base < l.smem_alloc * l.ctas.size()) {
        const u32 cta = u32((a - base) / l.smem_alloc);
        const u32 offset = u32((a - base) % l.smem_alloc);
        const char* what = write ? "plain store" : "plain load";
        if (cta != t.cta || offset + bytes > l.cfg.dynamic_smem_bytes) {
            g_sites.names.push_back(site_text(site));
            t.site = Site{g_sites.names.back().c_str(), 0};
            if (cta != t.cta) fail(format("%s: %p points into the shared memory of cta %u, not this CTA's", what,
                                          reinterpret_cast<void*>(a), cta));
            fail(format("%s: shared-memory access [%#x, %#x) out of bounds (dynamic smem is %#x bytes)", what, offset,
                        offset + bytes, l.cfg.dynamic_smem_bytes));
        }
        if (write) {
            generic_write(cta, offset, bytes, t);
            t.generic_write_site = site;
        }
    }
    fine_access(t, a, bytes, Access{write ? "a plain write" : "a plain read", write, false, Scope::Cta, site});
}

// A plain access the compiler emitted as naturally aligned (GCC calls __tsan_readN / __tsan_writeN only when the
// type or its analysis guarantees N-byte alignment, __tsan_unaligned_* otherwise) at an address that is not: the
// device build vectorises the same access from the same type (ld / st .v2 / .v4, 8- and 16-byte LDG / STS) and it
// faults there (misaligned address), while x86 loads most of them and the values stay right.
[[noreturn]] inline void misaligned_access(Thread& t, uintptr_t a, u32 bytes, bool write, u32 site) {
    g_sites.names.push_back(site_text(site));
    t.site = Site{g_sites.names.back().c_str(), 0};
    fail(format("misaligned: a %u-byte plain %s at %s (address %% %u = %u): the access's type makes the compiler "
                "emit one %u-byte vector access, which faults on the GPU (misaligned address); align the pointer or "
                "use narrower accesses",
                bytes, write ? "write" : "read", where(a).c_str(), bytes, u32(a % bytes), bytes));
}

DFG_SIM_NO_TSAN inline void on_plain_access(void* addr, u32 bytes, bool write, void* pc, bool natural = false) {
    if (!g_track) return;
    Thread& t = *g_stream->current;
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    if (natural && (a & (bytes - 1))) {
        g_track = false;
        misaligned_access(t, a, bytes, write, pc_site(pc));
    }
    if (a - reinterpret_cast<uintptr_t>(t.stack) < kFiberStackBytes + 4096) {
        // The thread's own locals: only its wgmma operand registers are checked (wgmma_registers.hpp).
        const OperandRegisters& w = t.wgmma_registers;
        if (a + bytes > w.lo && a < w.hi) {
            g_track = false;
            operand_access(t, a, bytes, write, pc_site(pc));
            g_track = true;
        }
        return;
    }
    const Launch& l = *g_launch;
    if (a - reinterpret_cast<uintptr_t>(l.params) < l.params_bytes) return;
    g_track = false;
    plain_access(t, a, bytes, write, pc_site(pc));
    g_track = true;
}

}  // namespace dfg::sim::detail

// The ThreadSanitizer instrumentation interface GCC emits calls to (libsanitizer/tsan/tsan_interface.h): defined
// whether or not this translation unit is instrumented, for the kernel translation units that are.
// Exported by the runtime library: the kernel libraries' instrumentation calls bind to them (build.py).
#define DFG_SIM_HOOK extern "C" DFG_SIM_NO_TSAN __attribute__((visibility("default"))) void
#define DFG_SIM_HOOKS(N)                                                                                        \
    DFG_SIM_HOOK __tsan_read##N(void* p) {                                                                     \
        dfg::sim::detail::on_plain_access(p, N, false, __builtin_return_address(0), N > 1);                    \
    }                                                                                                           \
    DFG_SIM_HOOK __tsan_write##N(void* p) {                                                                    \
        dfg::sim::detail::on_plain_access(p, N, true, __builtin_return_address(0), N > 1);                     \
    }                                                                                                           \
    DFG_SIM_HOOK __tsan_unaligned_read##N(void* p) {                                                           \
        dfg::sim::detail::on_plain_access(p, N, false, __builtin_return_address(0));                           \
    }                                                                                                           \
    DFG_SIM_HOOK __tsan_unaligned_write##N(void* p) {                                                          \
        dfg::sim::detail::on_plain_access(p, N, true, __builtin_return_address(0));                            \
    }
DFG_SIM_HOOKS(1)
DFG_SIM_HOOKS(2)
DFG_SIM_HOOKS(4)
DFG_SIM_HOOKS(8)
DFG_SIM_HOOKS(16)
DFG_SIM_HOOK __tsan_read_range(void* p, unsigned long n) {
    dfg::sim::detail::on_plain_access(p, static_cast<dfg::u32>(n), false, __builtin_return_address(0));
}
DFG_SIM_HOOK __tsan_write_range(void* p, unsigned long n) {
    dfg::sim::detail::on_plain_access(p, static_cast<dfg::u32>(n), true, __builtin_return_address(0));
}
DFG_SIM_HOOK __tsan_init() {}
DFG_SIM_HOOK __tsan_func_entry(void*) {}
DFG_SIM_HOOK __tsan_func_exit() {}
DFG_SIM_HOOK __tsan_vptr_update(void**, void*) {}
DFG_SIM_HOOK __tsan_vptr_read(void**) {}
#undef DFG_SIM_HOOKS
#undef DFG_SIM_HOOK
