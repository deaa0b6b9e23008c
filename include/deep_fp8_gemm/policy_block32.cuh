// The 1x32/32x32 scale recipe (DeepSeek-V4.1's dense FP8 checkpoints; kinds table granularity "1x32/32x32"):
//   D[m, n] (bf16) = sum_j (A[m, 32j:32j+32] . B[n, 32j:32j+32]^T) * sA[m, j] * sB[n / 32, j]
// A e4m3 with one fp32 scale per token per 32 K (sA [rows, ceil(K/32)], M-major TMA-aligned), B e4m3 with one per
// 32x32 block (sB [ceil(N/32), ceil(K/32)] fp32, row-major). Powers of two (UE8M0 checkpoints) are fp32 values too.
//
// Why a policy of its own. The tensor cores may sum the products of one scale group only, so each k32 wgmma of a
// 128-K stage goes into a fresh partial ("bank", scale-d = 0) that the CUDA cores promote: acc += bank * sA * sB,
// one FFMA per accumulator value per 32 K. That FFMA is the floor of any per-32 promotion on FP8 wgmma: an SM's
// 4096 FP8 MAC per clock against its 128 FFMA lanes is a ratio of 32, so at any tile the promotion alone issues
// one slot per tensor cycle (the audit's issue_per_tensor_cycle, docs/block32.md). Everything else per value is
// kept off the math warps:
//   * two banks alternate: wgmma k+1 runs into one while the other is promoted (wgmma.wait_group 1), and the
//     stage's last bank is promoted under the next stage's first wgmma, so the tensor pipe never drains inside
//     a tile;
//   * the products sA[r, j] * sB[c, j] are not formed in the math warps (8 FMULs per 32 K per thread at 128x128,
//     plus their loads) but by the producer warpgroup's idle warps, the "scale warps", which write each row
//     pair's products into the stage; a math thread reads its 2 x BLOCK_N/32 products with one or two 16-byte
//     shared loads per 32 K (Block32Products);
//   * N and K are compile-time constants (as for every kind here), which keeps every index in registers: the
//     fork that runs this recipe on SM90 spills 4.4 KB at run-time N / K (docs/block32.md).
//
// Tiles: one m64 wave per math warpgroup (BLOCK_M 64 or 128), BLOCK_N in {32, 64, 96, 128}: a thread holds the
// accumulator and two banks, 3 x BLOCK_N / 2 floats (192 at 128 columns, under the 232-register budget with the
// kernel's ~40 of addresses and state; a second wave or BLOCK_N 160 would not fit).
//
// Stage record (after the A and B tiles; kernels/fp8_gemm.cuh keeps the layout, config.block32_record_bytes the
// same numbers):
//   sA        [4][BLOCK_M] fp32     TMA box (BLOCK_M, 4) of the M-major sA: the stage's four k32 columns
//   products  [4][BLOCK_M / 2][kProductFloats] fp32 (layout below), then each scale warp's staging of the stage's
//             sB values ([4][4] fp32) and the producer's Block32Header (16 bytes)
//             row pair p = rows (16 (p / 8) + p % 8, that + 8) of the tile, the pair a math thread's fragment
//             holds (WgmmaFragment: rows r and r + 8, r = 16 warp + lane / 4): sA[r] sB[c] for c < BLOCK_N / 32,
//             then sA[r + 8] sB[c], padded to whole 16-byte loads
//   full      producer -> math: 1 arrive.expect_tx (A and B tiles) + one arrive per scale warp (its products)
//   empty     math -> producers: as every kind (kClusterSize x math warps)
//   scales    producer -> scale warps: 1 arrive.expect_tx (the sA box)
// The scale warps need no barrier of their own before overwriting a stage's products: the sA load they wait for
// is issued only after the producer's empty wait, so the math warps' release of the stage happens before it. They
// walk the ring from the producer's headers (Block32Header), not a tile scheduler.
//
// Math per stage (kernels/fp8_gemm.cuh consume_block32), for ks = 0..3: fence the bank ks % 2, wgmma k32 slice ks
// into it (scale-d 0), commit; then wait until one group is in flight, and promote the bank of slice ks - 1
// (ks = 0: the previous stage's slice 3, then release the previous stage). The tile's last bank is promoted after
// a full wait. The products of a slice are read right before its promotion.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "mma.cuh"

namespace dfg {

struct alignas(16) F32x4 {
    float x, y, z, w;
};

// What the producer tells the scale warps about a stage (written before its arrive on the scales barrier): the
// tile's group's sB plane, its first 32-column block and the stage's first k32 slice; or, after its last tile,
// kDone (the scale warps' walk ends: they run no tile scheduler of their own, whose state overflowed the producer
// warpgroup's 40 registers in the cluster kernels).
struct alignas(16) Block32Header {
    static constexpr u32 kDone = ~0u;
    u32 group_base;  // floats from params.sb to the group's sB plane, group * ceil(N/32) * ceil(K/32)
    u32 col_block0;  // the tile's first sB row (32-column block); kDone: no more stages
    u32 slice0;      // the stage's first k32 slice
    u32 reserved;
};

template <u32 BLOCK_M, u32 BLOCK_N>
struct Block32 {
    static constexpr u32 kGran = 32;                   // K elements per scale; B rows per scale block
    static constexpr u32 kSlices = 128 / kGran;        // k32 slices (= wgmmas, = sA columns) per 128-K stage
    static constexpr u32 kColBlocks = BLOCK_N / kGran; // sB blocks a tile's columns span
    static constexpr u32 kRowPairs = BLOCK_M / 2;
    static constexpr u32 kProductFloats = kColBlocks == 1 ? 2u : round_up(2 * kColBlocks, 4u);
    static constexpr u32 kSmemSABytes = kSlices * BLOCK_M * 4;
    static constexpr u32 kSliceProductBytes = kRowPairs * kProductFloats * 4;
    static constexpr u32 kSmemProductBytes = kSlices * kSliceProductBytes;
    static constexpr u32 kScaleWarps = BLOCK_M / 64;   // one thread per row pair
    // Each scale warp's copy of the stage's sB values, [slice][4 column blocks] (padded to 4), after the products.
    static constexpr u32 kStagingBytes = kScaleWarps * kSlices * 4 * 4;
    static constexpr u32 kSATxBytes = kSmemSABytes;    // the scales barrier's transaction bytes
    static constexpr u32 kHeaderBytes = 16;            // Block32Header, after the staging
    // Everything of the record before the barriers: sA, products, staging, header (the kernel's smem map adds 24).
    static constexpr u32 kRecordBytesBeforeBarriers = kSmemSABytes + kSmemProductBytes + kStagingBytes + kHeaderBytes;
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "one m64 wave per math warpgroup");
    static_assert(BLOCK_N % kGran == 0 && BLOCK_N >= 32 && BLOCK_N <= 128, "whole 32-column scale blocks, <= 128");
    static_assert(kSmemSABytes % 128 == 0 && kSmemProductBytes % 16 == 0, "record alignment");

    // The row pair of a math thread's fragment (warpgroup wg, warp w of it, lane l): rows 16 w + l / 4 (+ 8).
    DFG_HOST_DEVICE static constexpr u32 row_pair(u32 wg, u32 warp_in_wg, u32 lane) {
        return wg * 32 + warp_in_wg * 8 + lane / 4;
    }
    // The lower row of row pair p (the upper is + 8).
    DFG_HOST_DEVICE static constexpr u32 pair_row(u32 p) { return 16 * (p / 8) + p % 8; }

    // Scale warp `warp` (lane `lane`, row pair p = 32 warp + lane): row pair p's products of the stage's four slices
    // into the stage's record (sA [4][BLOCK_M] at its start, written by TMA; the products after it). sB comes from
    // global memory (row-major [G][ceil(N/32)][ceil(K/32)] at sb) once per warp and stage: lane j < 16 loads the
    // value of slice j / 4 and column block j % 4 into the warp's staging area, which every lane then reads as one
    // 16-byte broadcast per slice. Blocks past N and slices past K are clamped to the last one: their partials are
    // zero (TMA zero-fills A, B and sA there) and columns past N are never stored.
    // NOTES: one record pointer (not an sA and a products pointer), no bounds test per value: the producer warpgroup
    // has 40 registers (setmaxnreg.dec), and every instruction here is issued on a sub-partition the math warps
    // share (the audit's kloop.scale_warps).
    template <u32 kNumColBlocksN, u32 kNumSlicesK>
    DFG_DEVICE static void write_products(u8* record, const float* sb, const Block32Header& h, u32 warp, u32 lane) {
        float* staging = reinterpret_cast<float*>(record + kSmemSABytes + kSmemProductBytes) + warp * kSlices * 4;
        {  // every lane loads (lanes 16..31 repeat 0..15: no divergent branch), lanes 0..15 store
            const u32 j = lane % (kSlices * 4);
            const u32 c = min_of(j % 4, kColBlocks - 1);
            const u32 row = min_of(h.col_block0 + c, kNumColBlocksN - 1);
            const u32 slice = min_of(h.slice0 + j / 4, kNumSlicesK - 1);
            const float value = sb[h.group_base + row * kNumSlicesK + slice];
            if (lane < kSlices * 4)
                staging[lane] = value;
        }
        hal::warp_sync();
        const u32 p = warp * 32 + lane;
        const u32 r = pair_row(p);
        DFG_UNROLL
        for (u32 s = 0; s < kSlices; ++s) {
            const float* sa = reinterpret_cast<const float*>(record) + s * BLOCK_M;
            const float lo = sa[r];
            const float hi = sa[r + 8];
            const F32x4 b = reinterpret_cast<const F32x4*>(staging)[s];
            const float sbv[4] = {b.x, b.y, b.z, b.w};
            F32x4 v[kProductFloats >= 4 ? kProductFloats / 4 : 1] = {};
            float* out = reinterpret_cast<float*>(v);
            DFG_UNROLL
            for (u32 c = 0; c < kColBlocks; ++c) {
                out[c] = lo * sbv[c];
                out[kColBlocks + c] = hi * sbv[c];
            }
            float* dst = reinterpret_cast<float*>(record + kSmemSABytes + s * kSliceProductBytes) + p * kProductFloats;
            if constexpr (kProductFloats == 2) {
                *reinterpret_cast<F32x2*>(dst) = F32x2{out[0], out[1]};
            } else {
                DFG_UNROLL
                for (u32 q = 0; q < kProductFloats / 4; ++q)
                    reinterpret_cast<F32x4*>(dst)[q] = v[q];
            }
        }
    }
};

// A math thread's products of one slice: lo[c] = sA[r] sB[c], hi[c] = sA[r + 8] sB[c].
template <u32 kColBlocks, u32 kProductFloats>
struct Block32Products {
    float v[kProductFloats];
    // src: the slice's products of this thread's row pair (16-byte aligned; 8 with one column block).
    DFG_DEVICE void load(const float* src) {
        if constexpr (kProductFloats == 2) {
            const F32x2 t = *reinterpret_cast<const F32x2*>(src);
            v[0] = t.x;
            v[1] = t.y;
        } else {
            DFG_UNROLL
            for (u32 q = 0; q < kProductFloats / 4; ++q) {
                const F32x4 t = reinterpret_cast<const F32x4*>(src)[q];
                v[4 * q + 0] = t.x;
                v[4 * q + 1] = t.y;
                v[4 * q + 2] = t.z;
                v[4 * q + 3] = t.w;
            }
        }
    }
    DFG_DEVICE float lo(u32 c) const { return v[c]; }
    DFG_DEVICE float hi(u32 c) const { return v[kColBlocks + c]; }
};

// acc += bank * product for one slice, per the fragment layout of WgmmaFragment (values 4j + {0, 1}: row r,
// 4j + {2, 3}: row r + 8, column group j of 8 columns, in 32-column block j / 4): one FFMA per value.
template <u32 BLOCK_N, u32 kValues, u32 kColBlocks, u32 kProductFloats>
DFG_DEVICE void promote_block32(float (&acc)[kValues], const float (&bank)[kValues],
                                const Block32Products<kColBlocks, kProductFloats>& pr) {
    static_assert(kValues == BLOCK_N / 2, "fragment of m64nBLOCK_N");
    DFG_UNROLL
    for (u32 j = 0; j < BLOCK_N / 8; ++j) {
        const float lo = pr.lo(j / 4), hi = pr.hi(j / 4);
        acc[4 * j + 0] = hal::fma_rn(bank[4 * j + 0], lo, acc[4 * j + 0]);
        acc[4 * j + 1] = hal::fma_rn(bank[4 * j + 1], lo, acc[4 * j + 1]);
        acc[4 * j + 2] = hal::fma_rn(bank[4 * j + 2], hi, acc[4 * j + 2]);
        acc[4 * j + 3] = hal::fma_rn(bank[4 * j + 3], hi, acc[4 * j + 3]);
    }
}

}  // namespace dfg
