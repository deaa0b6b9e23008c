// Two-level accumulation: the CUDA-core half of the FP8 GEMM's K loop (ANCHORS.md, "two-level
// accumulation"). The tensor cores sum one 128-wide K block into a scratch accumulator; this adds it, scaled
// by sA (per row) and sB (per 128x128 block of B), into the fp32 accumulator.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "scales.cuh"

namespace dfg {

// Two-level accumulation for one m64 wave: acc += scratch * sA[row] * sB[column block], per the fragment
// layout of WgmmaFragment (values 4j + {0, 1} are row r, 4j + {2, 3} row r + 8, all in column group j).
// sb1 is only read when some tile of this width straddles. Costs 2 FMUL (4 when straddling), 2 FSEL
// per n0-dependent segment and one FFMA per value.
template <u32 BLOCK_N, u32 kNumScaleBlocksN, u32 kValues>
DFG_DEVICE void promote(float (&acc)[kValues], const float (&scratch)[kValues], float sa_lo, float sa_hi,
                        float sb0, float sb1, const ScaleColumns<BLOCK_N, kNumScaleBlocksN>& cols) {
    using Cols = ScaleColumns<BLOCK_N, kNumScaleBlocksN>;
    static_assert(kValues == BLOCK_N / 2, "fragment of m64nBLOCK_N");
    float lo0 = sa_lo * sb0, hi0 = sa_hi * sb0;
    float lo1 = lo0, hi1 = hi0;
    if constexpr (Cols::kMayStraddle) {
        lo1 = sa_lo * sb1;
        hi1 = sa_hi * sb1;
        // NOTES: opaque to the compiler, which otherwise selects between sb0 and sb1 first and multiplies
        // each segment's pick by sA again (2 FMUL per segment instead of 4 per wave).
        hal::fence_operand(lo0);
        hal::fence_operand(lo1);
        hal::fence_operand(hi0);
        hal::fence_operand(hi1);
    }
    DFG_UNROLL
    for (u32 k = 0; k < Cols::kNumSegments; ++k) {
        const bool second = cols.segment_second(k);
        const float lo = second ? lo1 : lo0;
        const float hi = second ? hi1 : hi0;
        DFG_UNROLL
        for (u32 j = k * Cols::kGroupsPerSegment; j < (k + 1) * Cols::kGroupsPerSegment; ++j) {
            acc[4 * j + 0] += scratch[4 * j + 0] * lo;
            acc[4 * j + 1] += scratch[4 * j + 1] * lo;
            acc[4 * j + 2] += scratch[4 * j + 2] * hi;
            acc[4 * j + 3] += scratch[4 * j + 3] * hi;
        }
    }
}

}  // namespace dfg
