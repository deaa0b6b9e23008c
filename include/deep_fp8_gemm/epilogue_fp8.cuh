// The FP8-output kinds' tile (output.cuh's Fp8TmaStore): fp32 values -> one 1x128 scale per row -> e4m3 ->
// 128-byte-swizzled shared tile -> one TMA store per warpgroup; the scales go from registers straight to global
// memory, M-major (the layout per_token_cast_to_fp8 returns).
//
// Numerics: deep_fp8_gemm.quant.per_token_cast_to_fp8_torch(values, use_ue8m0, reciprocal=True), with the
// quantisers' own helpers (kernels/quant.cuh): amax over the |x| bit patterns (integer max: exact, a NaN
// propagates), clamped below at 1e-4, scale = amax / 448 (IEEE division), with kUe8m0 rounded up to a power of two
// on its bit pattern (quant::ceil_to_ue8m0); inv = 1 / scale, one IEEE reciprocal per row and 128-column group;
// e4m3 = RNE(x * inv) saturated to +-448 (cvt.rn.satfinite). That is the reference design's x * (1.0 / sf)
// (DeepGEMM utils/math.py). The quantisers (per_token_cast_to_fp8, silu_mul_quant) divide, x / scale: the two
// differ by one e4m3 step where x / scale lies within a float32 rounding of an e4m3 rounding tie, never with kUe8m0
// (a power-of-two scale makes both the rounding of x * 2^-e). Columns past N are exact zeros (TMA zero-fills B):
// they never raise an amax, so a partial last group is quantised as if zero-padded, as per_token_cast_to_fp8 does.
//
// NOTES: dividing every value cost 64 IEEE divisions (MUFU.RCP + fix-up, each) per thread and m64 wave: 131
// MUFU.RCP in a 256x128 kernel, ~6% of its tile time at K = 7168 and ~20% at K = 2048 by an independent review
// (issue 45). The reciprocal takes 2 per thread and wave (rows r and r + 8); the audit bounds the count
// (kernels/targets.py fp8_epilogue_max_rcp).
//
// Who holds a row (WgmmaFragment, m64nNk32): value i of lane l of warp w sits in row 16 w + l / 4 + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 (l % 4) + i % 2. A row's 128 columns are the 4 lanes of one quad (l / 4 fixed), 32 values
// each. Each lane reduces its 32 to one partial per row (rows r and r + 8 of every m64 wave), and the quad's four
// partials are exchanged through shared memory (the hal has no shuffle): every lane stores its partials,
// bar.warp.sync (the quad lives in one warp: no wider barrier is needed), every lane reads its quad's four
// partials as one 16-byte load. Lane l % 4 == 0 stores the quad's scales.
//
// Shared memory (kSmemBytes; the kernel reserves it at the start of its map):
//   D tile   [BLOCK_M][128] e4m3; row r at r * 128, its 16-byte chunk c at chunk c ^ (r % 8) (CU_TENSOR_MAP_SWIZZLE
//            _128B, CuTe Swizzle<3,4,3>). A warp's 2-byte stores of one column group j (8 rows x the quad's 8 bytes)
//            then land in 8 distinct chunks: 16 banks, no conflict. Warpgroup w's rows [w kWgRows, (w + 1) kWgRows)
//            are one TMA store (box 128 x kWgRows) of the slice at w * kWgRows * 128 (a 1024-byte multiple).
//   amax     [math warps][2 kWavesM][32 lanes] u32 partials.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "kernels/quant.cuh"
#include "mma.cuh"

namespace dfg {

template <u32 BLOCK_M, u32 kWavesM>
struct Fp8Tile {
    static constexpr u32 kGroupCols = 128;  // output columns per tile: one 1x128 scale group
    static constexpr u32 kRowBytes = kGroupCols;
    static constexpr u32 kWgRows = kWavesM * 64;
    static constexpr u32 kNumMathWarps = BLOCK_M / kWgRows * 4;
    static constexpr u32 kValues = WgmmaFragment<kGroupCols>::kValues;  // per thread and m64 wave
    static constexpr u32 kPartials = 2 * kWavesM;                       // per lane: rows r, r + 8 of every wave
    static constexpr u32 kTileBytes = BLOCK_M * kRowBytes;
    static constexpr u32 kAmaxBytes = kNumMathWarps * kPartials * 32 * 4;
    static constexpr u32 kSmemBytes = kTileBytes + kAmaxBytes;
    static_assert((kWgRows * kRowBytes) % 1024 == 0, "a warpgroup's slice must start on a 128-byte-swizzle atom");

    // Byte offset of (row, byte) in the tile, swizzled.
    DFG_HOST_DEVICE static constexpr u32 swizzled_offset(u32 row, u32 byte) {
        return row * kRowBytes + ((((byte >> 4) ^ (row & 7u)) << 4) | (byte & 15u));
    }

    // The per-row scales of one warp's rows: scale[w][h] is that of row frag_row + 64 w + 8 h, from the values
    // v[w][0, kValues) (an m64n128 fragment; v may be wider: the SwiGLU kinds keep their outputs in the first
    // half). `partials` is the warp's [kPartials][32] slice of the amax area; the caller's barrier orders the
    // previous tile's reads of it before these writes.
    template <bool kUe8m0, u32 kV>
    DFG_DEVICE static void row_scales(u32* partials, u32 lane, const float (&v)[kWavesM][kV],
                                      float (&scale)[kWavesM][2]) {
        static_assert(kV >= kValues, "an m64n128 fragment per wave");
        DFG_UNROLL
        for (u32 w = 0; w < kWavesM; ++w) {
            u32 lo = 0, hi = 0;
            DFG_UNROLL
            for (u32 i = 0; i < kValues; ++i) {
                const u32 bits = quant::float_to_bits(v[w][i]) & 0x7FFFFFFFu;
                if ((i / 2) % 2 == 0)
                    lo = max_of(lo, bits);
                else
                    hi = max_of(hi, bits);
            }
            partials[(2 * w) * 32 + lane] = lo;
            partials[(2 * w + 1) * 32 + lane] = hi;
        }
        // The quad's partials: written by its four lanes, read by each of them.
        hal::warp_sync();
        DFG_UNROLL
        for (u32 p = 0; p < kPartials; ++p) {
            const quant::Vec16B quad = *reinterpret_cast<const quant::Vec16B*>(partials + p * 32 + (lane & ~3u));
            scale[p / 2][p % 2] = quant::amax_to_scale<kUe8m0>(quant::max_of_vec(quad));
        }
    }

    // e4m3 of this thread's values into the tile (rows frag_row + 64 w + 8 h, columns 8 j + 2 (lane % 4) + {0, 1}).
    template <u32 kV>
    DFG_DEVICE static void write_smem(u8* tile, u32 frag_row, u32 lane, const float (&v)[kWavesM][kV],
                                      const float (&scale)[kWavesM][2]) {
        static_assert(kV >= kValues, "an m64n128 fragment per wave");
        DFG_UNROLL
        for (u32 w = 0; w < kWavesM; ++w) {
            DFG_UNROLL
            for (u32 h = 0; h < 2; ++h) {
                const float inv = 1.0f / scale[w][h];  // the row's one IEEE reciprocal (see the file comment)
                const u32 row = frag_row + 64 * w + 8 * h;
                DFG_UNROLL
                for (u32 j = 0; j < kGroupCols / 8; ++j) {
                    const float x0 = v[w][4 * j + 2 * h], x1 = v[w][4 * j + 2 * h + 1];
                    const u16 packed = hal::pack_e4m3x2(x0 * inv, x1 * inv);
                    *reinterpret_cast<u16*>(tile + swizzled_offset(row, 8 * j + 2 * (lane % 4))) = packed;
                }
            }
        }
    }
};

}  // namespace dfg
