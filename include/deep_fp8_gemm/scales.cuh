// Which 128-column sB block each 8-column group of a BLOCK_N-wide tile uses.
//
// The tile's columns [n0, n0 + BLOCK_N) (n0 a multiple of BLOCK_N, hence of 8) touch at most two
// 128-column scale blocks (static_assert in fp8_gemm.cuh), and each 8-column group of the wgmma
// fragment lies in exactly one of them. Columns past N (a partial last tile) clamp to the last block;
// their products are zero (TMA zero-fills B) and their stores are clipped.
#pragma once
#include "common.cuh"

namespace dfg {

template <u32 BLOCK_N, u32 kNumScaleBlocksN>
struct ScaleColumns {
    static_assert(BLOCK_N % 8 == 0 && BLOCK_N / 8 <= 32, "one mask bit per 8-column group");
    u32 block0;  // scale block of column n0
    u32 block1;  // the next scale block (clamped)
    u32 mask;    // bit j set: column group j (columns n0 + 8j ..) uses block1

    DFG_HOST_DEVICE static ScaleColumns of(u32 n0) {
        ScaleColumns s;
        s.block0 = min_of(n0 / 128u, kNumScaleBlocksN - 1);
        s.block1 = min_of(n0 / 128u + 1u, kNumScaleBlocksN - 1);
        s.mask = 0;
        DFG_UNROLL
        for (u32 j = 0; j < BLOCK_N / 8; ++j)
            s.mask |= ((n0 + 8 * j) / 128u != n0 / 128u ? 1u : 0u) << j;
        return s;
    }

    DFG_HOST_DEVICE u32 block_of_group(u32 j) const { return (mask >> j) & 1u ? block1 : block0; }
};

}  // namespace dfg
