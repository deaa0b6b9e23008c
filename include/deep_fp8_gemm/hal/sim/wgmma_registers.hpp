// deep_fp8_gemm CPU simulator: the registers of in-flight wgmmas (accumulator fragments, register A fragments).
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// A wgmma.mma_async reads and writes a thread's registers asynchronously: its accumulator fragment D (N/2 f32) and,
// for a register-sourced A, the thread's A fragment (four .b32 of four e4m3 each). The PTX ISA rules, checked here
// per thread and per 4-byte register:
//   in flight   "Accessing the accumulator register or the input register containing fragments of matrix A of a
//               wgmma.mma_async instruction without first performing a wgmma.wait_group instruction that waits on a
//               wgmma-group including that wgmma.mma_async instruction is an undefined behavior" ("wgmma.mma_async"):
//               any access of the thread to such a register between the issue and the wgmma.wait_group that
//               retires the group is reported, naming the register, the fragment, both call sites and the group.
//   fence       "wgmma.fence ... must be issued ... between a register access by a thread in the warpgroup and any
//               wgmma.mma_async instruction that accesses the same registers, either as accumulator or input
//               register containing fragments of matrix A, except when these are accumulator register accesses
//               across multiple wgmma.mma_async instructions of the same shape" ("wgmma.fence"): a wgmma that uses
//               a register this thread accessed after its last wgmma.fence is reported (the earlier check only saw
//               "no fence since the last wait"). The wgmmas' own accesses need no fence and are not accesses here.
//   register fence after the wait  (hal::fence_operand, an empty asm with the register as "+f" operand): after
//               the wgmma.wait_group that retires a wgmma, the thread must pass each accumulator register through
//               it before touching it, or the compiler may move the access above the wait (the inline asm of the
//               wait names no registers; ptxas then has to serialise the wgmmas, or reads a register still being
//               written). A compiler-ordering rule, not a hardware one; it is checked here on the source, not by
//               the audit in SASS, because leaving the fence out changes nothing in today's SASS (NVRTC 13.5: the
//               cubins are byte-identical with and without the dense and 1D1D kernels' post-wait fence loop), so a
//               SASS rule could not see the omission; it shows only when a compiler schedules differently, and then
//               as ptxas's wgmma serialisation warnings, which the audit already treats as fatal.
// The fragment arrays a kernel passes to a wgmma are locals on the fiber stack; the instrumentation
// (instrument.hpp) hands the thread's own accesses to them to operand_access. A range is known from its first
// wgmma on: an access before a thread's first wgmma of a fragment cannot be attributed (none of the kernels has
// one: their scratch accumulators start with scale-d = 0).
#pragma once

namespace dfg::sim::detail {

// NOTES: the fragments are ranges whose state an issue or a retiring wait changes in O(1), and per register only a
// byte (unfenced) and what an access needs: per-register records updated at every issue and wait cost ~5% of an
// exact-config GEMM simulation, the ranges well under 1%.

// "d[5] of the accumulator fragment d[0..63] of a wgmma.mma_async m64n128k32"
inline std::string register_name(const OperandRange& r, u32 i) {
    const bool a = r.role == RegRole::A;
    return format("%s[%u] of the %s fragment %s[0..%u] of a wgmma.mma_async m64n%uk32", a ? "a" : "d", i,
                  a ? "register A" : "accumulator", a ? "a" : "d", r.count - 1, r.n);
}

// The range of registers [lo, lo + 4 * count) of the thread's stack as `role`, the window grown to cover it.
inline OperandRange& operand_range(Thread& t, uintptr_t lo, u32 count, RegRole role) {
    OperandRegisters& w = t.wgmma_registers;
    if (w.hi > w.lo && lo >= w.lo && (lo - w.lo) % 4 == 0) {
        const u32 first = u32((lo - w.lo) / 4);
        for (OperandRange& r : w.ranges)
            if (r.first == first && r.count == count && r.role == role) return r;
    }
    const uintptr_t hi = lo + 4 * uintptr_t(count);
    if (w.ranges.empty()) {
        w.lo = lo;
        w.hi = hi;
        w.unfenced.assign(count, 0);
    } else if (lo < w.lo || hi > w.hi) {
        const uintptr_t nlo = lo < w.lo ? lo : w.lo, nhi = hi > w.hi ? hi : w.hi;
        if ((w.lo - nlo) % 4 || (nhi - nlo) > (uintptr_t(1) << 20))
            fail(format("wgmma registers: fragment at %#llx is not 4-byte aligned with the thread's others, or too "
                        "far from them", static_cast<unsigned long long>(lo)));
        const u32 shift = u32((w.lo - nlo) / 4);
        std::vector<u8> grown((nhi - nlo) / 4, 0);
        std::copy(w.unfenced.begin(), w.unfenced.end(), grown.begin() + shift);
        w.unfenced.swap(grown);
        for (OperandRange& r : w.ranges) r.first += shift;
        w.lo = nlo;
        w.hi = nhi;
    }
    if ((lo - w.lo) % 4) fail(format("wgmma registers: fragment at %#llx is not 4-byte aligned", static_cast<unsigned long long>(lo)));
    w.ranges.push_back(OperandRange{u32((lo - w.lo) / 4), count, role});
    return w.ranges.back();
}

// This thread issues a wgmma of group `group` (at its current site) with accumulator `d` (n / 2 registers) and, if
// `a` is not null, a register A fragment `a` (4 registers).
inline void operands_issue(Thread& t, const float* d, u32 n, const u32* a, u64 group) {
    const auto use = [&](uintptr_t lo, u32 count, RegRole role) {
        OperandRange& r = operand_range(t, lo, count, role);
        r.n = u16(n);
        if (r.touched_fence == t.wgmma_registers.fences)
            fail(format("wgmma registers: this wgmma.mma_async m64n%uk32 uses %s[%u] (the %s fragment %s[0..%u]), "
                        "which this thread %s at %s after its last wgmma.fence (at %s): the PTX ISA requires a "
                        "wgmma.fence between a thread's access of a register and a wgmma that uses it as accumulator or "
                        "A fragment (\"wgmma.fence\"); move the access before the fence",
                        n, role == RegRole::A ? "a" : "d", r.touched_index,
                        role == RegRole::A ? "register A" : "accumulator", role == RegRole::A ? "a" : "d", count - 1,
                        r.touched_write ? "wrote" : "read", site_text(r.touched_site).c_str(),
                        site_str(t.wgmma_registers.fence_site).c_str()));
        if (!r.in_flight) ++t.wgmma_registers.in_flight;
        r.in_flight = true;
        r.group = group;
        r.issue_site = t.site;
    };
    use(reinterpret_cast<uintptr_t>(d), n / 2, RegRole::Accumulator);
    if (a) use(reinterpret_cast<uintptr_t>(a), 4, RegRole::A);
}

// This thread's wgmma.wait_group (at its current site) retired its groups [0, target): their accumulators now need
// the register fence before the thread touches them; A fragments are the thread's again.
inline void operands_retire(Thread& t, u64 target) {
    OperandRegisters& w = t.wgmma_registers;
    if (!w.in_flight) return;
    for (OperandRange& r : w.ranges) {
        if (!r.in_flight || r.group >= target) continue;
        r.in_flight = false;
        --w.in_flight;
        r.retire_site = t.site;
        if (r.role == RegRole::Accumulator) std::memset(&w.unfenced[r.first], 1, r.count);
    }
}

inline void operands_fence(Thread& t) {
    t.wgmma_registers.fences++;
    t.wgmma_registers.fence_site = t.site;
}

// hal::fence_operand on the register at `reg` (a no-op for registers no wgmma uses).
DFG_SIM_API void register_fence(const void* reg) {
    OperandRegisters& w = g_stream->current->wgmma_registers;
    const uintptr_t off = reinterpret_cast<uintptr_t>(reg) - w.lo;
    if (off < w.hi - w.lo) w.unfenced[off / 4] = 0;
}

// A plain access of thread `t` to [a, a + bytes) inside its window of operand registers (instrument.hpp).
inline void operand_access(Thread& t, uintptr_t a, u32 bytes, bool write, u32 site) {
    OperandRegisters& w = t.wgmma_registers;
    const u32 first = u32((a - w.lo) / 4), end = u32((a + bytes - w.lo + 3) / 4);
    for (OperandRange& r : w.ranges) {
        if (first >= r.first + r.count || end <= r.first) continue;
        const u32 lo = first > r.first ? first : r.first, hi = end < r.first + r.count ? end : r.first + r.count;
        u32 i = lo - r.first;  // the register of the range named in a report: the first accessed, or unfenced
        bool unfenced = false;
        if (r.role == RegRole::Accumulator)
            for (u32 j = lo; j < hi && !unfenced; ++j)
                if (w.unfenced[j]) {
                    unfenced = true;
                    if (!r.in_flight) i = j - r.first;
                }
        if (r.in_flight || unfenced) {
            g_sites.names.push_back(site_text(site));
            t.site = Site{g_sites.names.back().c_str(), 0};
            if (r.in_flight)
                fail(format("wgmma registers: a plain %s of %s issued at %s (group %llu) before the wgmma.wait_group "
                            "that retires it: the registers of an in-flight wgmma are undefined until then (PTX ISA "
                            "\"wgmma.mma_async\")",
                            write ? "write" : "read", register_name(r, i).c_str(), site_str(r.issue_site).c_str(),
                            static_cast<unsigned long long>(r.group)));
            fail(format("wgmma registers: a plain %s of %s, after the wgmma.wait_group at %s that retired it, with no "
                        "register fence (hal::fence_operand) on it since: without one the compiler may move the access "
                        "above the wait",
                        write ? "write" : "read", register_name(r, i).c_str(), site_str(r.retire_site).c_str()));
        }
        r.touched_fence = w.fences;
        r.touched_index = i;
        r.touched_site = site;
        r.touched_write = write;
    }
}

}  // namespace dfg::sim::detail
