// Swap-AB: the dense GEMM for few rows (decode, m <= 32; config.GemmConfig.swap_ab), computed transposed.
//
// A 64-row wgmma tile wastes most of its work and shared memory on rows that do not exist when m is 1..32: the
// A box is zero-filled to 64 rows in every stage, every wgmma reads it, every thread promotes it. Swap-AB gives
// the weights the wgmma's M side and the tokens its N side:
//     D^T[n, m] (tile BLOCK_N x BLOCK_M) = B[n, :] . A[m, :]^T,   wgmma m64 n(BLOCK_M) k32, BLOCK_N / 64 waves,
// with BLOCK_M in {8, 16, 24, 32} (the tokens of the tile) and BLOCK_N in {64, 128} (one math warpgroup). The
// stages hold the same boxes as the plain kernel's (A: BLOCK_M rows of tokens, B: BLOCK_N rows of weights; the
// host's maps are the same), only the wgmma's operands trade places: its A descriptor points into the B stage
// (wave w: weight rows w * 64 ..), its B descriptor into the A stage.
//
// Promotion (promote_swap_ab): the scratch fragment's row is a weight row n, its column a token m, so
//     acc[n, m] += scratch[n, m] * sB[n / 128, kb] * sA[m, kb].
// A wave's 64 weight rows start at a multiple of 64, so they lie in one 128-row scale block: sB is one scalar per
// wave and K block (BLOCK_N = 64 or 128 never straddles); sA is one value per column, BLOCK_M / 4 distinct columns
// per thread (8j + 2 (lane % 4) + {0, 1}), read as 8-byte pairs from the stage's sA slice.
//
// Output (Bf16TransposedStore): the fragments go transposed into a [BLOCK_M][BLOCK_N] bf16 shared tile (token-major,
// as D is row-major), and one TMA store of box (BLOCK_N, BLOCK_M, 1) through tma_d (dims (N, m, 1), no swizzle)
// writes it; TMA drops rows >= m and columns >= N. As Bf16TmaStore, the store's reads of the tile are awaited only
// before the next tile's epilogue writes it. Split-K composes: SplitKReduce sums the transposed fragments first.
#pragma once
#include "common.cuh"
#include "gemm_params.cuh"
#include "hal.cuh"
#include "mma.cuh"
#include "scheduler.cuh"

namespace dfg {

// The tile's token scales this thread's columns need in one K block: BLOCK_M / 8 pairs (columns 8j + 2 (lane % 4)
// and the next), read from the stage's sA slice (8-byte shared loads) before the stage is released.
template <u32 BLOCK_M>
struct SwapAbColumnScales {
    F32x2 pair[BLOCK_M / 8];
    DFG_DEVICE void load(const float* sa, u32 lane) {
        DFG_UNROLL
        for (u32 j = 0; j < BLOCK_M / 8; ++j)
            pair[j] = *reinterpret_cast<const F32x2*>(sa + 8 * j + 2 * (lane % 4));
    }
};

// acc += scratch * sb * sA[column], for one m64 wave of the transposed tile (fragment of m64nBLOCK_M; values
// 4j + {0, 1}: row r, columns c, c + 1; 4j + {2, 3}: row r + 8, the same columns; c = 8j + 2 (lane % 4)).
// Costs BLOCK_M / 4 FMUL and one FFMA per value.
template <u32 BLOCK_M, u32 kValues>
DFG_DEVICE void promote_swap_ab(float (&acc)[kValues], const float (&scratch)[kValues], float sb,
                                const SwapAbColumnScales<BLOCK_M>& sa) {
    static_assert(kValues == BLOCK_M / 2, "fragment of m64nBLOCK_M");
    DFG_UNROLL
    for (u32 j = 0; j < BLOCK_M / 8; ++j) {
        const float s0 = sa.pair[j].x * sb, s1 = sa.pair[j].y * sb;
        acc[4 * j + 0] = hal::fma_rn(scratch[4 * j + 0], s0, acc[4 * j + 0]);
        acc[4 * j + 1] = hal::fma_rn(scratch[4 * j + 1], s1, acc[4 * j + 1]);
        acc[4 * j + 2] = hal::fma_rn(scratch[4 * j + 2], s0, acc[4 * j + 2]);
        acc[4 * j + 3] = hal::fma_rn(scratch[4 * j + 3], s1, acc[4 * j + 3]);
    }
}

// The swap-AB kernels' output policy (output.cuh's interface: kSmemBytes, store, finish). Thread t of the one math
// warpgroup holds, per wave w, rows w * 64 + WgmmaFragment::row (weight rows n - n0) and columns
// WgmmaFragment::col (token rows m - m0) of the transposed tile.
template <u32 SHAPE_N, u32 BLOCK_M, u32 BLOCK_N, u32 kWaves>
struct Bf16TransposedStore {
    using Fragment = WgmmaFragment<BLOCK_M>;
    static constexpr u32 kSmemBytes = round_up(BLOCK_M * BLOCK_N * 2u, 1024u);
    static_assert(BLOCK_N == kWaves * 64 && BLOCK_N * 2 <= 256 * 2, "box inner extent: BLOCK_N bf16");

    template <typename Thread, u32 kValues>
    static DFG_DEVICE void store(const GemmParams& params, u8* smem_d, const TileInfo& tile, const Thread& t,
                                 float (&acc)[kWaves][kValues]) {
        static_assert(kValues == Fragment::kValues, "fragment of m64nBLOCK_M");
        const bool leader = t.store_leader();
        if (leader)
            hal::tma_store_wait_read<0>();  // the previous tile's store has read the shared tile
        hal::named_barrier_sync(1, 128);
        u16* d = reinterpret_cast<u16*>(smem_d);
        DFG_UNROLL
        for (u32 w = 0; w < kWaves; ++w)
            DFG_UNROLL
            for (u32 i = 0; i < kValues; ++i) {
                const u32 n = w * 64 + Fragment::row(t.warp_in_wg, t.lane, i);
                const u32 m = Fragment::col(t.lane, i);
                d[m * BLOCK_N + n] = static_cast<u16>(hal::pack_bf16x2(acc[w][i], 0.0f) & 0xffffu);
            }
        hal::fence_view_async_shared();
        hal::named_barrier_sync(1, 128);
        if (leader) {
            hal::tma_store_3d(&params.tma_d, smem_d, static_cast<i32>(tile.n_block * BLOCK_N),
                              static_cast<i32>(tile.m_block * BLOCK_M), 0);
            hal::tma_store_commit();
        }
    }

    template <typename Thread>
    static DFG_DEVICE void finish(const Thread& t) {
        if (t.store_leader())
            hal::tma_store_wait_all();
    }
};

}  // namespace dfg
