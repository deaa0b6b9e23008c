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

    // Runs body(stage, phase, i) for the next kCount uses of the ring (i = 0 .. kCount - 1) and moves the
    // cursor past them.
    //
    // NOTES: each pass over the ring is unrolled, so `stage` is a constant in every copy of the body and
    // barrier, shared-memory and descriptor addresses fold into immediates (the per-use stage/phase
    // arithmetic and address recomputation were ~20 instructions per K block). A tile's kCount uses start
    // anywhere in the ring (kCount need not be a multiple of kNumStages; keeping the ring order across
    // tiles keeps the producer kNumStages loads ahead at tile boundaries), so the first pass skips the
    // stages before the start and the last one stops after kCount uses: one uniform compare per copy.
    template <u32 kCount, bool kUnrollRing = true, typename Body>
    DFG_HOST_DEVICE void for_each_use(Body&& body) {
        static_assert(kCount >= 1, "at least one use");
        if constexpr (!kUnrollRing) {
            for (u32 i = 0; i < kCount; ++i) {
                body(stage, phase, i);
                advance();
            }
            return;
        }
        for_each_use_n(kCount, static_cast<Body&&>(body));
    }

    // for_each_use with a run-time count (0 allowed: the cursor does not move), in the same unrolled ring
    // passes; with a compile-time count (for_each_use) the pass bounds fold to constants.
    template <typename Body>
    DFG_HOST_DEVICE void for_each_use_n(u32 count, Body&& body) {
        const u32 start = stage;
        u32 first = start;          // first stage of this pass that runs
        u32 end = start + count;    // one past the last use, counted from stage 0 of this pass
        u32 index0 = 0u - start;    // use index of stage 0 of this pass (wraps on the first pass)
        u32 ph = phase;
        while (true) {
            DFG_UNROLL
            for (u32 s = 0; s < kNumStages; ++s) {
                if (s >= first && s < end)
                    body(s, ph, index0 + s);
            }
            if (end <= kNumStages)
                break;
            end -= kNumStages;
            first = 0;
            index0 += kNumStages;
            ph ^= 1u;
        }
        stage = (start + count) % kNumStages;
        phase ^= ((start + count) / kNumStages) & 1u;
    }
};

}  // namespace dfg
