// Two-level accumulation: the CUDA-core half of the FP8 GEMM's K loop (ANCHORS.md, "two-level
// accumulation"). The tensor cores sum one 128-wide K block into a scratch accumulator; this adds it, scaled
// by sA (per row) and sB (per 128x128 block of B), into the fp32 accumulator.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "scales.cuh"

namespace dfg {

// The tile's choice of scale block per n0-dependent segment as bit masks (all ones: block1), for
// hal::select_bits: one LOP3 per pick and no predicate.
// NOTES: pinned (hal::pin), once per tile. Selected with predicates (FSEL), ptxas re-derived the three segment
// predicates of BLOCK_N = 160 from n0 in every K block, since P0 also serves the barrier wait, the release lane
// and the loop exit (3 instructions per K block, the 128x160 contiguous kernel: 131 -> 128).
template <u32 BLOCK_N, u32 kNumScaleBlocksN>
struct SegmentMasks {
    using Cols = ScaleColumns<BLOCK_N, kNumScaleBlocksN>;
    u32 second[Cols::kNumSegments];
    DFG_DEVICE static SegmentMasks of(const Cols& cols) {
        SegmentMasks m;
        DFG_UNROLL
        for (u32 k = 0; k < Cols::kNumSegments; ++k)
            m.second[k] = Cols::segment_varies(k) ? hal::pin(cols.segment_second(k) ? ~0u : 0u) : 0u;
        return m;
    }
};

// Two-level accumulation for one m64 wave: acc += scratch * sA[row] * sB[column block], per the fragment
// layout of WgmmaFragment (values 4j + {0, 1} are row r, 4j + {2, 3} row r + 8, all in column group j).
// sb1 is only read when some tile of this width straddles. Costs 2 FMUL (4 when straddling), 2 LOP3
// per n0-dependent segment (SegmentMasks) and one FFMA per value.
template <u32 BLOCK_N, u32 kNumScaleBlocksN, u32 kValues>
DFG_DEVICE void promote(float (&acc)[kValues], const float (&scratch)[kValues], float sa_lo, float sa_hi,
                        float sb0, float sb1, const SegmentMasks<BLOCK_N, kNumScaleBlocksN>& masks) {
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
        // Segment 0 always reads block0 and segments past column 128 block1 (compile-time after unrolling).
        const bool varies = Cols::segment_varies(k);
        const float lo = varies ? hal::select_bits(lo0, lo1, masks.second[k]) : k == 0 ? lo0 : lo1;
        const float hi = varies ? hal::select_bits(hi0, hi1, masks.second[k]) : k == 0 ? hi0 : hi1;
        DFG_UNROLL
        for (u32 j = k * Cols::kGroupsPerSegment; j < (k + 1) * Cols::kGroupsPerSegment; ++j) {
            acc[4 * j + 0] = hal::fma_rn(scratch[4 * j + 0], lo, acc[4 * j + 0]);
            acc[4 * j + 1] = hal::fma_rn(scratch[4 * j + 1], lo, acc[4 * j + 1]);
            acc[4 * j + 2] = hal::fma_rn(scratch[4 * j + 2], hi, acc[4 * j + 2]);
            acc[4 * j + 3] = hal::fma_rn(scratch[4 * j + 3], hi, acc[4 * j + 3]);
        }
    }
}

}  // namespace dfg
