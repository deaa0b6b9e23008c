// Policies of the 1D1D kernel family (weight gradients, DeepSeek-V3's "1x128 x 1x128 with fp32 accumulation"):
// the GEMM skeleton (kernels/fp8_gemm.cuh) instantiated with
//   B-scale policy "per row":  B [n, k] has 1x128 scales sB [n, ceil(k/128)] like A, so the promotion multiplies
//                              by a per-column scale. sB is M-major and TMA-aligned like sA (column stride a
//                              multiple of 4 floats); the producer TMA-loads the K block's BLOCK_N values into
//                              the stage next to sA (box BLOCK_N x 1; columns past N are zero-filled).
//   output policy "fp32 accumulate": D[m, n] fp32 = C[m, n] + A . B^T, C read and D written straight from the
//                              accumulator fragments with 8-byte global accesses (C may alias D: every element is
//                              read and written by the same thread, in that order). No shared-memory D tile.
// Which family a GemmKind belongs to is FamilyOf<kKind>; the bf16-output kinds keep the 128x128-block sB
// (scales.cuh, promotion.cuh) and the TMA-store epilogue (epilogue.cuh); the FP8-output and SwiGLU kinds keep
// their layout kind's sB and tiles and change only the output (output.cuh Fp8TmaStore, policy_swiglu.cuh).
#pragma once
#include "common.cuh"
#include "kinds.cuh"
#include "hal.cuh"

namespace dfg {

template <GemmKind kKind>
struct FamilyOf {
    // From the kind's point on the axes (kinds.cuh, generated from deep_fp8_gemm/kinds.py). kind_axes() is called
    // per trait rather than kept as a static member: a static constexpr object is emitted into the cubin as a symbol.
    // per-row sB, TMA-loaded per stage
    static constexpr bool kRowScaledB = kind_axes(kKind).accumulation == KindAccumulation::Promote1D1D;
    // D = C + A . B^T in fp32
    static constexpr bool kFp32Accumulate = kind_axes(kKind).output == KindOutput::Fp32Accumulate;
    static constexpr bool kKGrouped = kind_axes(kKind).layout == KindLayout::KGrouped;  // policy_k_grouped.cuh
    // Tile enumeration, A / D batch addressing and the sB policy: those of this kind (kinds.cuh layout_of).
    static constexpr GemmKind kLayout = layout_of(kKind);
    // SiLU(gate) * up of the tile's two 128-column halves, then FP8 (policy_swiglu.cuh).
    static constexpr bool kSwiglu = kind_axes(kKind).output == KindOutput::SwigluFp8;
    // e4m3 D with 1x128 per-row scales quantised from the fp32 accumulators (output.cuh Fp8TmaStore).
    static constexpr bool kFp8Output = kSwiglu || kind_axes(kKind).output == KindOutput::Fp8;
    // 1x32 / 32x32 scales, promoted every 32 K with products from the scale warps (policy_block32.cuh).
    static constexpr bool kBlock32 = kind_axes(kKind).granularity == KindScaleGranularity::Block32;
    static_assert(kRowScaledB == kFp32Accumulate, "the 1D1D kernels are the fp32-accumulating ones (kinds.py RULES)");
};

// Per-row (1x128) scales of B: the stage holds the K block's BLOCK_N values (TMA destination, 128-aligned).
// In registers, the K block's scales of this thread's fragment columns 8j + 2 (lane % 4) + {0, 1}
// (WgmmaFragment::col): BLOCK_N / 8 pairs, read with BLOCK_N / 8 8-byte shared loads once per K block for
// every m64 wave (256x96: 12 loads, not 12 per wave).
template <u32 BLOCK_N>
struct RowScalesB {
    static constexpr u32 kSmemBytes = round_up(BLOCK_N * 4u, 128u);  // one stage
    F32x2 pair[BLOCK_N / 8];
    // sb_thread: the stage's sB slice + 2 (lane % 4), this thread's first column.
    DFG_DEVICE void load(const float* sb_thread) {
        DFG_UNROLL
        for (u32 j = 0; j < BLOCK_N / 8; ++j)
            pair[j] = *reinterpret_cast<const F32x2*>(sb_thread + 8 * j);
    }
};

// One m64 wave's combined scales sA[row] * sB[col], in the fragment's order (values 4j + {0, 1}: row r,
// columns c, c + 1; 4j + {2, 3}: row r + 8, the same columns): BLOCK_N / 2 FMULs.
template <u32 BLOCK_N>
struct WaveScales {
    float v[BLOCK_N / 2];
    DFG_DEVICE void combine(const RowScalesB<BLOCK_N>& sb, float sa_lo, float sa_hi) {
        DFG_UNROLL
        for (u32 j = 0; j < BLOCK_N / 8; ++j) {
            v[4 * j + 0] = sa_lo * sb.pair[j].x;
            v[4 * j + 1] = sa_lo * sb.pair[j].y;
            v[4 * j + 2] = sa_hi * sb.pair[j].x;
            v[4 * j + 3] = sa_hi * sb.pair[j].y;
        }
    }
};

// Two-level accumulation with per-column B scales for one m64 wave: acc += scratch * (sA[row] * sB[col]), one
// FFMA per value. Order in the kernel (fp8_gemm.cuh): the wave's wgmmas are issued and committed, then the K
// block's RowScalesB (with the first wave) and the wave's two sA values are read from the stage and multiplied
// into WaveScales (BLOCK_N / 2 FMULs) while the tensor cores run, then the wait, the stage's release (nothing
// reads it afterwards) and these FFMAs. So the drain from the wait to the next wgmma is the FFMAs and the loop's
// bookkeeping (audit, 128x128: 84 instructions; 166 when sB was read pair by pair after the wait and multiplied
// in twice, (scratch x sB) x sA, with the stage released after the last promotion; the reference design 117).
// Live across the wgmma: acc, scratch and the wave's BLOCK_N / 2 products, with a second wave to come also the
// BLOCK_N / 4 sB (128x128: 64 + 64 + 64 of setmaxnreg's 232; 256x96: 96 + 48 + 48 + 24). Every audited pick
// compiles spill-free, the one-warpgroup 64x128 included (it spilled when an earlier version held sB across the
// wgmma).
// ptxas keeps the FMULs under the wgmma only while the math warps get setmaxnreg's registers: a trap reachable
// from them holds them to the launch bound (KGroupedScheduler, policy_k_grouped.cuh).
template <u32 BLOCK_N, u32 kValues>
DFG_DEVICE void promote_row_scaled(float (&acc)[kValues], const float (&scratch)[kValues],
                                   const WaveScales<BLOCK_N>& scale) {
    static_assert(kValues == BLOCK_N / 2, "fragment of m64nBLOCK_N");
    DFG_UNROLL
    for (u32 i = 0; i < kValues; ++i)
        acc[i] = hal::fma_rn(scratch[i], scale.v[i], acc[i]);
}

// fp32-accumulate epilogue of one warpgroup: D[row, col] = C[row, col] + acc for the thread's fragment
// values, rows >= num_rows and columns >= SHAPE_N skipped. Each fragment value pair (cols col, col + 1) moves as
// one 8-byte load of C and one 8-byte store of D (LDG.E.64 / STG.E.64: half the L2 requests of scalar accesses).
// That needs d and c 8-byte aligned and ld_d / ld_c even (row strides in floats): the hosts refuse anything else
// (kernels/gemm.py, check_fp32_output); SHAPE_N even makes a pair either wholly inside or wholly past N.
template <u32 SHAPE_N, u32 BLOCK_N, u32 kWavesM, u32 kValues>
DFG_DEVICE void store_fp32_accumulate(float* d, const float* c, u32 ld_d, u32 ld_c, u32 num_rows, u32 row0, u32 n0,
                                      u32 frag_row, u32 lane, const float (&acc)[kWavesM][kValues]) {
    static_assert(kValues == BLOCK_N / 2, "fragment of m64nBLOCK_N");
    static_assert(SHAPE_N % 2 == 0, "column pairs");
    DFG_UNROLL
    for (u32 w = 0; w < kWavesM; ++w) {
        DFG_UNROLL
        for (u32 h = 0; h < 2; ++h) {
            const u32 row = row0 + frag_row + w * 64 + h * 8;
            if (row >= num_rows)
                continue;
            DFG_UNROLL
            for (u32 j = 0; j < BLOCK_N / 8; ++j) {
                const u32 col = n0 + 8 * j + 2 * (lane % 4);
                if (col >= SHAPE_N)
                    continue;
                const F32x2 cv = hal::ld_global_f32x2(c + static_cast<u64>(row) * ld_c + col);
                hal::st_global_f32x2(d + static_cast<u64>(row) * ld_d + col,
                                     F32x2{cv.x + acc[w][4 * j + 2 * h + 0], cv.y + acc[w][4 * j + 2 * h + 1]});
            }
        }
    }
}

}  // namespace dfg
