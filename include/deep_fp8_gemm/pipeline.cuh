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

template <u32 kNumStages>
struct PipelineState {
    static_assert(kNumStages >= 1 && kNumStages <= 32, "stage count");
    u32 stage = 0;
    u32 phase = 0;

    DFG_HOST_DEVICE void advance() {
        if (++stage == kNumStages) {
            stage = 0;
            phase ^= 1u;
        }
    }

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
    template <typename Body>
    DFG_HOST_DEVICE void for_each_use(u32 count, Body&& body) {
        DFG_NO_UNROLL
        for (u32 i = 0; i < count; ++i) {
            body(stage, phase, i);
            advance();
        }
    }
};

}  // namespace dfg
