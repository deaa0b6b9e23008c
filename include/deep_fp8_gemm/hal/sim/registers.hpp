// deep_fp8_gemm CPU simulator: the CTA's register pool and setmaxnreg.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// PTX ISA "setmaxnreg": the launch gives every thread the register count ptxas chose (LaunchConfig::
// launch_registers, from the sm_90a build's ptxas report); setmaxnreg.dec N releases the registers of its
// warpgroup above N to the CTA's pool, setmaxnreg.inc N blocks until the pool can give the warpgroup N per
// thread. Both are .sync.aligned over the warpgroup: they take effect once all 128 threads executed them.
// An inc that the pool never satisfies is a deadlock (deadlock_report names the warpgroups and counts); a
// dec above the current count, an inc below it, and a count below what the warpgroup keeps live (the
// accumulator fragment of a wgmma in flight, or of the next wgmma it issues) are errors.
#pragma once

namespace dfg::sim::detail {

// Registers a thread needs besides a wgmma accumulator fragment (descriptors, loop state, addresses).
constexpr u32 kRegisterReserve = 8;

// 0 when the launch did not say (no ptxas report): the pool is then not accounted, only the live
// requirement of counts set by setmaxnreg is checked.
inline u32 pool_registers(const LaunchConfig& cfg) { return cfg.launch_registers; }

inline std::string register_pool_state(u32 cta) {
    const Cta& c = L().ctas[cta];
    std::string s = format("pool of cta %u: %llu registers (%u per thread at launch), %lld free; warpgroups hold", cta,
                           static_cast<unsigned long long>(c.reg_total), pool_registers(L().cfg),
                           static_cast<long long>(c.reg_free));
    for (u32 w = 0; w < c.warpgroups.size(); ++w) s += format(" wg%u %u/thread", w, c.warpgroups[w].regs);
    return s;
}

// Live registers of a warpgroup: the largest accumulator fragment of its wgmmas not yet retired.
inline u32 live_accumulator_registers(const Warpgroup& wg) {
    u32 live = 0;
    for (const WgmmaGroup& g : wg.groups)
        for (const WgmmaOp& op : g.ops) live = op.n / 2 > live ? op.n / 2 : live;
    return live;
}

DFG_SIM_API void setmaxnreg(u32 regs, bool increase) {
    const char* what = increase ? "setmaxnreg_inc" : "setmaxnreg_dec";
    Thread& t = me();
    Cta& c = my_cta();
    const u32 w = t.tid / kWarpgroupThreads;
    if ((w + 1) * kWarpgroupThreads > L().cfg.block_x)
        fail(format("%s: thread is in an incomplete warpgroup (block has %u threads)", what, L().cfg.block_x));
    Warpgroup& wg = c.warpgroups[w];
    const u64 generation = wg.setmaxnreg_generation;
    if (++wg.setmaxnreg_arrived < kWarpgroupThreads) {
        block(Wait{WaitKind::SetmaxnregWarpgroup, t.cta, w, 0, generation}, what);
        return;
    }
    // The last thread of the warpgroup performs it.
    const bool known = wg.regs != 0;
    if (known && increase && regs < wg.regs)
        fail(format("registers: setmaxnreg.inc %u of warpgroup %u is below its current %u registers per thread", regs,
                    w, wg.regs));
    if (known && !increase && regs > wg.regs)
        fail(format("registers: setmaxnreg.dec %u of warpgroup %u is above its current %u registers per thread", regs,
                    w, wg.regs));
    const u32 live = live_accumulator_registers(wg);
    if (!increase && live && regs < live + kRegisterReserve)
        fail(format("registers: setmaxnreg.dec %u of warpgroup %u is below its live requirement: a wgmma in flight "
                    "holds %u accumulator registers per thread (+%u)",
                    regs, w, live, kRegisterReserve));
    const i64 delta = known ? (i64(regs) - i64(wg.regs)) * kWarpgroupThreads : 0;
    while (delta > c.reg_free) block(Wait{WaitKind::RegisterPool, t.cta, w, regs, u64(delta)}, what);
    c.reg_free -= delta;
    wg.regs = regs;
    wg.regs_site = t.site;
    wg.setmaxnreg_arrived = 0;
    ++wg.setmaxnreg_generation;
}

// A wgmma with an N-column accumulator (N/2 registers per thread) issued by warpgroup w.
inline void check_wgmma_registers(u32 w, u32 n) {
    const Warpgroup& wg = my_cta().warpgroups[w];
    if (wg.regs && n / 2 + kRegisterReserve > wg.regs)
        fail(format("registers: wgmma m64n%uk32 needs %u accumulator registers per thread (+%u), but warpgroup %u "
                    "holds %u per thread (%s)",
                    n, n / 2, kRegisterReserve, w, wg.regs,
                    wg.regs_site.file ? ("set by setmaxnreg at " + site_str(wg.regs_site)).c_str()
                                      : "the launch allocation"));
}

}  // namespace dfg::sim::detail
