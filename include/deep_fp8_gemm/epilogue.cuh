// The bf16 kinds' output tile (output.cuh's Bf16TmaStore): fp32 accumulators -> bf16 -> swizzled shared-memory
// tile (stmatrix) -> TMA store.
//
// The D tile is kept as BLOCK_N / 16 column chunks of 16 bf16 (32 bytes per row). Chunk c occupies
// BLOCK_M * 32 bytes at offset c * BLOCK_M * 32; row r of a chunk sits at r * 32, and its two 16-byte
// halves are swapped when bit 2 of r is set: CU_TENSOR_MAP_SWIZZLE_32B, i.e. byte-address bit 4 ^= bit 7
// (CuTe Swizzle<1,4,3>). An stmatrix 8x8 matrix then covers 8 rows x 16 bytes spread over all 32
// banks: conflict-free. Each math warpgroup stores its own rows with one TMA store per chunk (box
// 16 x kWgRows), whose reads of shared memory are awaited only before the next tile's epilogue writes
// the same buffer, so the store overlaps the next tile's main loop.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "mma.cuh"

namespace dfg {

template <u32 BLOCK_M, u32 BLOCK_N, u32 kWavesM>
struct Epilogue {
    static constexpr u32 kChunkCols = 16;
    static constexpr u32 kNumChunks = BLOCK_N / kChunkCols;
    static constexpr u32 kRowBytes = kChunkCols * 2;
    static constexpr u32 kChunkBytes = BLOCK_M * kRowBytes;
    static constexpr u32 kWgRows = kWavesM * 64;
    static constexpr u32 kSmemBytes = kNumChunks * kChunkBytes;
    static_assert(BLOCK_N % kChunkCols == 0, "BLOCK_N must be a multiple of 16");
    static_assert(kChunkBytes % 256 == 0 && (kWgRows * kRowBytes) % 256 == 0,
                  "32-byte swizzle repeats every 256 bytes: chunks and warpgroup slices must be aligned to it");

    // Byte offset of (row, 16-byte half) inside a chunk, swizzled.
    DFG_HOST_DEVICE static constexpr u32 swizzled_offset(u32 row, u32 half) {
        return row * kRowBytes + ((half ^ ((row >> 2) & 1u)) * 16u);
    }

    // Writes this warpgroup's accumulators (kWavesM x 64 rows starting at tile row wg_row0) as bf16.
    template <u32 kValues>
    DFG_DEVICE static void write_smem(u8* smem_d, const float (&acc)[kWavesM][kValues], u32 wg_row0, u32 warp_in_wg,
                                      u32 lane) {
        static_assert(kValues == BLOCK_N / 2, "fragment of m64nBLOCK_N");
        // stmatrix.x4: lanes 8q..8q+7 address the rows of matrix q; matrices are
        // (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15)
        // of this warp's 16 rows and the chunk's 16 columns; their registers are the fragment values
        // 8c + {0,1}, {2,3}, {4,5}, {6,7} (see WgmmaFragment).
        const u32 matrix = lane / 8;
        const u32 row_in_warp = (lane % 8) + (matrix & 1u) * 8;
        const u32 half = matrix >> 1;
        DFG_UNROLL
        for (u32 wave = 0; wave < kWavesM; ++wave) {
            const u32 row = wg_row0 + wave * 64 + warp_in_wg * 16 + row_in_warp;
            DFG_UNROLL
            for (u32 c = 0; c < kNumChunks; ++c) {
                const float* v = acc[wave] + 8 * c;
                hal::stmatrix_x4(smem_d + c * kChunkBytes + swizzled_offset(row, half), hal::pack_bf16x2(v[0], v[1]),
                                 hal::pack_bf16x2(v[2], v[3]), hal::pack_bf16x2(v[4], v[5]),
                                 hal::pack_bf16x2(v[6], v[7]));
            }
        }
    }

    // One thread: TMA-store the warpgroup's rows, chunk by chunk; columns >= shape_n are skipped
    // (whole chunks) or clipped by the tensor map (partial chunks), rows >= m are clipped.
    DFG_DEVICE static void issue_stores(const TensorMap* map, const u8* smem_d, u32 wg_row0, i32 n0, i32 row0,
                                        i32 batch, u32 shape_n) {
        DFG_UNROLL
        for (u32 c = 0; c < kNumChunks; ++c) {
            const i32 col = n0 + static_cast<i32>(c * kChunkCols);
            if (col < static_cast<i32>(shape_n))
                hal::tma_store_3d(map, smem_d + c * kChunkBytes + wg_row0 * kRowBytes, col,
                                  row0 + static_cast<i32>(wg_row0), batch);
        }
        hal::tma_store_commit();
    }
};

}  // namespace dfg
