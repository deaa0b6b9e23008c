// Which 128-column sB block each column of a BLOCK_N-wide tile uses, decided as much as possible at
// compile time.
//
// The tile's columns [n0, n0 + BLOCK_N) (n0 a multiple of BLOCK_N) touch at most two 128-column scale
// blocks (static_assert in fp8_gemm.cuh). n0 % 128 is a multiple of g = gcd(BLOCK_N, 128), so the tile
// splits into BLOCK_N / g *segments* of g columns that never straddle a scale-block boundary: segment k
// (columns [k g, (k + 1) g)) uses the second block iff n0 % 128 >= 128 - k g. Segment 0 never does,
// segments with k g >= 128 always do; only the ones between depend on n0, through one per-tile value.
// So BLOCK_N dividing 128 (16, 32, 64, 128) has one segment and a single scale per tile: no selection
// at all; BLOCK_N = 160 has 5 segments of 32 columns, 3 of them decided per tile.
// Columns past N (a partial last tile) clamp to the last block; their products are zero (TMA zero-fills
// B) and their stores are clipped.
#pragma once
#include "common.cuh"

namespace dfg {

// Which dimension of sA [G][rows][ceil(K/128)] (the 1x128 per-row scales of A) is unit-stride in global memory, and so
// how a stage's BLOCK_M scales are loaded (Fp8GemmKernel's kSaMajor; deep_fp8_gemm GemmConfig.sa_major "m" / "k" /
// "g"). TMA reads 16-byte multiples along the unit-stride dimension and needs every other stride a 16-byte multiple:
//   M  M-major, TMA-aligned (the library's layout): map dims (rows, kb, G), box (BLOCK_M, 1, 1), coordinates
//      (row0, kb, g); the stage holds row r's scale at float r.
//   K  K-major, e.g. fp8_einsum's row-major sx [b, h, kb] as [h][b][kb] (kb % 4 == 0): dims (kb, rows, G), box
//      (4, BLOCK_M, 1), coordinates (kb, row0, g).
//   G  G-major, e.g. per_token_cast_to_fp8's M-major [b * h, kb] viewed as [h][b][kb] (strides 1, h, align(b h, 4);
//      h % 4 == 0): dims (G, rows, kb), box (4, BLOCK_M, 1), coordinates (g, row0, kb).
// K and G land as [BLOCK_M][4] floats: row r's scale at float 4 r (scale_row_pitch), the other three the next K
// blocks' / groups' or TMA's zero fill, never read. Only the masked bf16 kind takes K or G (config.check_config).
enum class ScaleMajor : u32 { M = 0, K = 1, G = 2 };

// Floats between two rows' scales in a stage's sA (the box's inner extent: one float, or 16 bytes).
DFG_HOST_DEVICE constexpr u32 scale_row_pitch(ScaleMajor major) { return major == ScaleMajor::M ? 1u : 4u; }

template <u32 BLOCK_N, u32 kNumScaleBlocksN>
struct ScaleColumns {
    static_assert(BLOCK_N % 8 == 0, "column groups of 8");
    static constexpr u32 kSegmentCols = gcd(BLOCK_N, 128u);
    static constexpr u32 kNumSegments = BLOCK_N / kSegmentCols;
    static constexpr u32 kGroupsPerSegment = kSegmentCols / 8;
    // Some tile of this width reads two scale blocks (otherwise block1 is never used).
    static constexpr bool kMayStraddle = kNumSegments > 1;

    u32 block0;   // scale block of column n0
    u32 block1;   // the next scale block (clamped)
    u32 offset;   // n0 % 128

    DFG_HOST_DEVICE static ScaleColumns of(u32 n0) {
        ScaleColumns s;
        s.block0 = min_of(n0 / 128u, kNumScaleBlocksN - 1);
        s.block1 = min_of(n0 / 128u + 1u, kNumScaleBlocksN - 1);
        s.offset = n0 % 128u;
        return s;
    }

    // Whether segment k's block depends on n0 (otherwise segment 0 uses block0, segments from column 128 on block1).
    DFG_HOST_DEVICE static constexpr bool segment_varies(u32 k) { return k > 0 && k * kSegmentCols < 128u; }

    // Whether segment k (a compile-time constant in the kernel's unrolled loops) uses block1.
    DFG_HOST_DEVICE constexpr bool segment_second(u32 k) const {
        return k == 0 ? false : k * kSegmentCols >= 128u ? true : offset >= 128u - k * kSegmentCols;
    }

    DFG_HOST_DEVICE u32 block_of_group(u32 j) const {
        return segment_second(j / kGroupsPerSegment) ? block1 : block0;
    }
};

}  // namespace dfg
