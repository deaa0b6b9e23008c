// deep_fp8_gemm CPU simulator: seeded adversarial schedules.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// Seed 0 is the round-robin schedule: fibers resumed in (cta, thread) order, TMA loads landing at the end of
// each pass. Any other seed (LaunchConfig::seed, DFG_SIM_SEED) derives a schedule from it:
//   * the fibers of each pass run in a random order;
//   * a hal operation is preempted before it starts with probability 1/16 (the thread yields);
//   * each TMA load in flight lands at the end of a pass with probability 1/2 (all land once nothing else moves);
//   * one victim, chosen by the seed, runs far ahead (it is resumed until it blocks, before anybody else, every
//     pass) or far behind (resumed only when nothing else moved in the previous pass, or every 64th pass): a
//     whole CTA, one warpgroup of a CTA, or the last warpgroup of a CTA (the producer of the GEMM kernels).
// The same seed gives the same schedule for the same kernel and launch.
#pragma once

namespace dfg::sim::detail {

struct Schedule {
    bool adversarial = false;
    u64 state = 0;
    bool victim_ahead = false;
    u32 victim_cta = ~0u, victim_first = 0, victim_last = 0;  // threads [first, last) of victim_cta

    u64 next() {  // splitmix64
        u64 z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    bool chance(u32 one_in) { return next() % one_in == 0; }

    void init(const LaunchConfig& cfg) {
        adversarial = cfg.seed != 0;
        state = cfg.seed;
        if (!adversarial) return;
        next();
        const u32 kind = u32(next() % 4);
        victim_ahead = next() & 1;
        victim_cta = u32(next() % cfg.grid_x);
        const u32 warpgroups = cfg.block_x / kWarpgroupThreads;
        if (kind == 0 || warpgroups == 0) {  // no victim
            victim_cta = ~0u;
        } else if (kind == 1) {  // a whole CTA
            victim_first = 0;
            victim_last = cfg.block_x;
        } else {  // one warpgroup; kind 3: the last one (the producer of the GEMM kernels)
            const u32 w = kind == 3 ? warpgroups - 1 : u32(next() % warpgroups);
            victim_first = w * kWarpgroupThreads;
            victim_last = victim_first + kWarpgroupThreads;
        }
    }
    bool victim(const Thread& t) const { return t.cta == victim_cta && t.tid >= victim_first && t.tid < victim_last; }
};

inline Schedule g_schedule;

// Called at the start of every hal operation: an adversarial schedule may preempt the thread here.
inline void maybe_preempt() {
    if (g_schedule.adversarial && g_schedule.chance(16)) block(Wait{WaitKind::Yield, 0, 0, 0, 0}, "preempted");
}

// Entry of every hal operation: records its call site, then an adversarial schedule may preempt the thread.
DFG_SIM_API void enter(const char* file, int line) {
    at(file, line);
    maybe_preempt();
}

}  // namespace dfg::sim::detail
