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

inline const char* role_name(RegRole r) { return r == RegRole::A ? "register A fragment a" : "accumulator fragment d"; }

// "d[5] of the accumulator fragment d[0..63] of a wgmma.mma_async m64n128k32"
inline std::string register_name(const OperandRegister& r) {
    const bool a = r.role == RegRole::A;
    return format("%s[%u] of the %s fragment %s[0..%u] of a wgmma.mma_async m64n%uk32", a ? "a" : "d", r.index,
                  a ? "register A" : "accumulator", a ? "a" : "d", a ? 3u : r.n / 2u - 1u, r.n);
}

// The records of registers [lo, lo + 4 * count) of the thread's stack, the window grown to cover them.
inline OperandRegister* operand_registers(Thread& t, uintptr_t lo, u32 count) {
    OperandRegisters& w = t.wgmma_registers;
    const uintptr_t hi = lo + 4 * uintptr_t(count);
    if (w.regs.empty()) {
        w.lo = lo;
        w.hi = hi;
        w.regs.assign(count, OperandRegister{});
    } else if (lo < w.lo || hi > w.hi) {
        const uintptr_t nlo = lo < w.lo ? lo : w.lo, nhi = hi > w.hi ? hi : w.hi;
        if ((w.lo - nlo) % 4 || (nhi - nlo) > (uintptr_t(1) << 20))
            fail(format("wgmma registers: fragment at %#llx is not 4-byte aligned with the thread's others, or too "
                        "far from them", static_cast<unsigned long long>(lo)));
        std::vector<OperandRegister> grown((nhi - nlo) / 4);
        std::copy(w.regs.begin(), w.regs.end(), grown.begin() + (w.lo - nlo) / 4);
        w.regs.swap(grown);
        w.lo = nlo;
        w.hi = nhi;
    }
    if ((lo - w.lo) % 4) fail(format("wgmma registers: fragment at %#llx is not 4-byte aligned", static_cast<unsigned long long>(lo)));
    return &w.regs[(lo - w.lo) / 4];
}

// This thread issues a wgmma of group `group` (at its current site) with accumulator `d` (n / 2 registers) and, if
// `a` is not null, a register A fragment `a` (4 registers).
inline void operands_issue(Thread& t, const float* d, u32 n, const u32* a, u64 group) {
    const u32 site = site_id(t.site);
    const auto use = [&](uintptr_t lo, u32 count, RegRole role) {
        OperandRegister* regs = operand_registers(t, lo, count);
        for (u32 i = 0; i < count; ++i) {
            OperandRegister& r = regs[i];
            r.role = role;
            r.index = u16(i);
            r.n = u16(n);
            if (r.access_fence == t.wgmma_registers.fences)
                fail(format("wgmma registers: this wgmma.mma_async m64n%uk32 uses %s[%u] (the %s[0..%u]), which this "
                            "thread %s at %s after its last wgmma.fence (at %s): the PTX ISA requires a wgmma.fence "
                            "between a thread's access of a register and a wgmma that uses it as accumulator or A "
                            "fragment (\"wgmma.fence\"); move the access before the fence",
                            n, role == RegRole::A ? "a" : "d", i, role_name(role), count - 1,
                            r.access_write ? "wrote" : "read", site_text(r.access_site).c_str(),
                            site_text(t.wgmma_registers.fence_site).c_str()));
            r.state = RegState::InFlight;
            r.group = group;
            r.event_site = site;
        }
    };
    use(reinterpret_cast<uintptr_t>(d), n / 2, RegRole::Accumulator);
    if (a) use(reinterpret_cast<uintptr_t>(a), 4, RegRole::A);
}

// This thread's wgmma.wait_group (at its current site) retired its groups [0, target): their accumulators now need
// the register fence before the thread touches them; A fragments are the thread's again.
inline void operands_retire(Thread& t, u64 target) {
    OperandRegisters& w = t.wgmma_registers;
    u32 site = 0;
    for (OperandRegister& r : w.regs) {
        if (r.state != RegState::InFlight || r.group >= target) continue;
        if (!site) site = site_id(t.site);
        r.state = r.role == RegRole::Accumulator ? RegState::Unfenced : RegState::Idle;
        r.event_site = site;
    }
}

inline void operands_fence(Thread& t) {
    t.wgmma_registers.fences++;
    t.wgmma_registers.fence_site = site_id(t.site);
}

// hal::fence_operand on the register at `reg` (a no-op for registers no wgmma uses).
DFG_SIM_API void register_fence(const void* reg) {
    OperandRegisters& w = me().wgmma_registers;
    const uintptr_t a = reinterpret_cast<uintptr_t>(reg);
    if (a - w.lo >= w.hi - w.lo || (a - w.lo) % 4) return;
    OperandRegister& r = w.regs[(a - w.lo) / 4];
    if (r.state == RegState::Unfenced) r.state = RegState::Idle;
}

// A plain access of thread `t` to [a, a + bytes) inside its window of operand registers (instrument.hpp).
inline void operand_access(Thread& t, uintptr_t a, u32 bytes, bool write, u32 site) {
    OperandRegisters& w = t.wgmma_registers;
    const uintptr_t first = (a - w.lo) / 4, end = (a + bytes - w.lo + 3) / 4;
    for (uintptr_t i = first; i < end && i < w.regs.size(); ++i) {
        OperandRegister& r = w.regs[i];
        if (r.role == RegRole::None) continue;
        if (r.state != RegState::Idle) {
            g_sites.names.push_back(site_text(site));
            t.site = Site{g_sites.names.back().c_str(), 0};
            if (r.state == RegState::InFlight)
                fail(format("wgmma registers: a plain %s of %s issued at %s (group %llu) before the wgmma.wait_group "
                            "that retires it: the registers of an in-flight wgmma are undefined until then (PTX ISA "
                            "\"wgmma.mma_async\")",
                            write ? "write" : "read", register_name(r).c_str(), site_text(r.event_site).c_str(),
                            static_cast<unsigned long long>(r.group)));
            fail(format("wgmma registers: a plain %s of %s, after the wgmma.wait_group at %s that retired it, with no "
                        "register fence (hal::fence_operand) on it since: without one the compiler may move the access "
                        "above the wait",
                        write ? "write" : "read", register_name(r).c_str(), site_text(r.event_site).c_str()));
        }
        r.access_fence = w.fences;
        r.access_site = site;
        r.access_write = write;
    }
}

}  // namespace dfg::sim::detail
