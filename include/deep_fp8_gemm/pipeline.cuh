// Shared-memory stage ring: full/empty mbarrier pairs and the (stage, phase) cursor.
//
// Producer and consumers walk the same sequence of stage uses. Use number u maps to stage u % kNumStages
// and to mbarrier phase (u / kNumStages) % 2. A consumer waits on full[stage] with that parity; the
// producer waits on empty[stage] with the opposite parity, which succeeds at once on the first pass
// over the ring (PTX ISA, mbarrier.try_wait.parity: waiting on the parity of the phase before the
// current one returns true).
#pragma once
#include "common.cuh"

namespace dfg {

// The ring's full (or empty) barriers: one mbarrier per stage, kStride bytes apart (the stage records of
// kernels/fp8_gemm.cuh), indexed like an array.
template <u32 kStride>
struct StageBarriers {
    static_assert(kStride % 8 == 0, "mbarriers are 8-byte objects");
    u8* base;  // stage 0's barrier
    DFG_HOST_DEVICE u64& operator[](u32 stage) const { return *reinterpret_cast<u64*>(base + stage * kStride); }
};

template <u32 kNumStages>
struct PipelineState {
    static_assert(kNumStages >= 1 && kNumStages <= 32, "stage count");
    u32 stage = 0;
    u32 phase = 0;

    // Runs body(stage, phase, i) for the next `count` uses of the ring (i = 0 .. count - 1; 0 allowed) and
    // moves the cursor past them. A tile's uses start anywhere in the ring: keeping the ring order across
    // tiles keeps the producer kNumStages loads ahead at tile boundaries.
    //
    // NOTES: one loop body, not one per stage. Unrolling the ring (stage an immediate in every copy) made
    // each copy cost the compiler 0.03-0.1 s (NVVM and ptxas alike), so 3-16-stage kernels compiled in
    // 0.54-0.83 s; with one body they compile in 0.25-0.41 s (README, "K-loop issue"). The body keeps the
    // per-use cost small by deriving every stage-dependent value from `stage` with one multiply-add on the
    // uniform datapath (barrier, scale and descriptor addresses; fp8_gemm.cuh): 3-15 more math instructions
    // per K block than the unrolled ring, by the audit's K-loop analysis.
    // The uses run in passes over the ring, each at one phase (stages [stage, end)), the inner loop counting
    // down: the wrap test and the phase flip are once per pass, and ptxas keeps the pass's parity and count in
    // registers. One loop over the uses, advancing the cursor by one, paid a stage compare-and-select, a phase
    // select-and-flip and a use counter per K block (audit: dense 64x128 104 -> 100, 1D1D 128x128 182 -> 178
    // math instructions per K block, for ~10% more cold compile: README, "Round three"). A pass bounded by
    // `s < end` instead of a count made ptxas re-derive `end` in every K block (103).
    template <typename Body>
    DFG_HOST_DEVICE void for_each_use(u32 count, Body&& body) {
        u32 done = 0;
        DFG_NO_UNROLL
        while (done < count) {
            // One pass over the ring at one phase: stages [stage, end).
            const u32 first = stage;
            const u32 end = min_of(kNumStages, first + (count - done));
            const u32 p = phase;
            u32 s = first;
            DFG_NO_UNROLL
            for (u32 n = end - first; n != 0; --n, ++s)
                body(s, p, done + (s - first));
            done += end - first;
            if (end == kNumStages) {
                stage = 0;
                phase ^= 1u;
            } else {
                stage = end;
            }
        }
    }
};

}  // namespace dfg
