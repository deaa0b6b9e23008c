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
};

}  // namespace dfg
