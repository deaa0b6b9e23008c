// Output policies of the GEMM skeleton (kernels/fp8_gemm.cuh): where a tile's fp32 accumulators go once its K
// loop is done. The skeleton's math warpgroups run "K loop, then Output::store(...)" per tile and
// "Output::finish(...)" once after their last tile; each family picks its policy (FamilyOf, policy_1d1d.cuh):
//
//   Bf16TmaStore    the bf16 kinds (dense, contiguous, masked, psum): accumulators -> bf16 -> stmatrix into the
//                   32-byte-swizzled shared tile (epilogue.cuh) -> one TMA store per 16-column chunk, whose
//                   reads of the tile are awaited only before the next tile's epilogue writes it (the store
//                   overlaps the next tile's K loop). Named barrier 1 + w brackets warpgroup w's shared writes.
//   Fp32Accumulate  the fp32 kinds (1D1D, k-grouped): D = C + acc from the fragments with 8-byte global
//                   accesses (policy_1d1d.cuh); no shared tile. C may alias D.
//   SplitKReduce    dense split-K (split_k.cuh): the split's partial goes to the workspace; only the tile's
//                   last split goes on, to the inner policy, with the sum of all splits in acc.
//   Fp8TmaStore     the FP8-output kinds (dense / contiguous / masked / psum _fp8out, and the SwiGLU kinds after
//                   SiLU(gate) * up, policy_swiglu.cuh): one 1x128 scale per row from the fp32 values (the quad's
//                   amax, epilogue_fp8.cuh) -> e4m3 into the 128-byte-swizzled shared tile -> one TMA store per
//                   warpgroup, awaited like Bf16TmaStore's; the scales from registers to global memory, M-major.
//
// Every policy has kSmemBytes (its shared-memory tile, the skeleton's map reserves it first) and the same two
// entry points; a new output is one more policy here.
#pragma once
#include "common.cuh"
#include "kinds.cuh"
#include "epilogue.cuh"
#include "epilogue_fp8.cuh"
#include "gemm_params.cuh"
#include "hal.cuh"
#include "policy_1d1d.cuh"
#include "policy_swiglu.cuh"
#include "scheduler.cuh"
#include "split_k.cuh"

namespace dfg {

// A math thread's place in its warpgroup and the column of the tile it stores: what every output policy
// addresses its fragments with (n0 is set per tile; the rest once).
struct TileThread {
    u32 wg;          // math warpgroup (0 with one)
    u32 warp_in_wg;  // 0..3
    u32 lane;        // 0..31
    u32 wg_row0;     // the warpgroup's first row in the tile
    u32 frag_row;    // this thread's first fragment row in the tile (WgmmaFragment::row)
    u32 n0;          // the tile's first column
    DFG_DEVICE bool store_leader() const { return warp_in_wg == 0 && lane == 0; }
};

template <GemmKind kKind, u32 SHAPE_N, u32 BLOCK_M, u32 BLOCK_N, u32 kWavesM>
struct Bf16TmaStore {
    using Tile = Epilogue<BLOCK_M, BLOCK_N, kWavesM>;
    static constexpr u32 kSmemBytes = round_up(Tile::kSmemBytes, 1024u);

    template <u32 kValues>
    static DFG_DEVICE void store(const GemmParams& params, u8* smem_d, const TileInfo& tile, const TileThread& t,
                                 float (&acc)[kWavesM][kValues]) {
        const bool leader = t.store_leader();
        // The previous tile's TMA store must have finished reading the shared tile.
        if (leader)
            hal::tma_store_wait_read<0>();
        hal::named_barrier_sync(1 + t.wg, 128);
        Tile::write_smem(smem_d, acc, t.wg_row0, t.warp_in_wg, t.lane);
        hal::fence_view_async_shared();
        hal::named_barrier_sync(1 + t.wg, 128);
        if (leader) {
            const i32 batch = kKind == GemmKind::GroupedMasked ? static_cast<i32>(tile.group) : 0;
            Tile::issue_stores(&params.tma_d, smem_d, t.wg_row0, static_cast<i32>(t.n0),
                               static_cast<i32>(tile.m_block * BLOCK_M), batch, SHAPE_N);
        }
    }

    static DFG_DEVICE void finish(const TileThread& t) {
        if (t.store_leader())
            hal::tma_store_wait_all();
    }
};

// kLayout: the tiles' layout kind (A / D batch = the group for GroupedMasked); SHAPE_N_OUT: D's columns (N, or
// N / 2 for kSwiglu); BLOCK_N: the tile's accumulator columns (128, or 256 = gate | up for kSwiglu), one 128-column
// output group per tile.
template <GemmKind kLayout, u32 SHAPE_N_OUT, u32 BLOCK_M, u32 BLOCK_N, u32 kWavesM, bool kSwiglu, bool kUe8m0>
struct Fp8TmaStore {
    using Tile = Fp8Tile<BLOCK_M, kWavesM>;
    static constexpr u32 kSmemBytes = round_up(Tile::kSmemBytes, 1024u);
    static constexpr u32 kScaleCols = ceil_div(SHAPE_N_OUT, Tile::kGroupCols);  // sD columns per group
    static_assert(BLOCK_N == (kSwiglu ? kSwigluBlockN : Tile::kGroupCols),
                  "FP8 output: a tile is one 128-column output group (SwiGLU: its gate and up halves)");

    template <u32 kValues>
    static DFG_DEVICE void store(const GemmParams& params, u8* smem_d, const TileInfo& tile, const TileThread& t,
                                 float (&acc)[kWavesM][kValues]) {
        static_assert(kValues == BLOCK_N / 2, "fragment of m64nBLOCK_N");
        if constexpr (kSwiglu)
            swiglu_in_place(acc);  // the outputs: acc[w][0, 64)
        const bool leader = t.store_leader();
        // The previous tile's TMA store must have finished reading the shared tile; the barrier also orders every
        // lane's reads of the previous tile's amax partials before this tile's writes.
        if (leader)
            hal::tma_store_wait_read<0>();
        hal::named_barrier_sync(1 + t.wg, 128);
        u32* partials = reinterpret_cast<u32*>(smem_d + Tile::kTileBytes) +
                        (t.wg * 4 + t.warp_in_wg) * Tile::kPartials * 32;
        float scale[kWavesM][2];
        Tile::template row_scales<kUe8m0>(partials, t.lane, acc, scale);
        Tile::write_smem(smem_d, t.frag_row, t.lane, acc, scale);

        const u32 n0_out = tile.n_block * Tile::kGroupCols;  // D column of the tile = its sD column * 128
        const bool in_n = n0_out < SHAPE_N_OUT;              // false only for a phantom tile (scheduler.cuh)
        const u32 batch = kLayout == GemmKind::GroupedMasked ? tile.group : 0u;
        const u32 row0 = tile.m_block * BLOCK_M;
        if (t.lane % 4 == 0 && in_n) {
            float* sd = params.sd + static_cast<u64>(batch * kScaleCols + tile.n_block) * params.ld_sd;
            DFG_UNROLL
            for (u32 w = 0; w < kWavesM; ++w)
                DFG_UNROLL
                for (u32 h = 0; h < 2; ++h) {
                    const u32 row = row0 + t.frag_row + 64 * w + 8 * h;
                    if (row < params.rows)
                        sd[row] = scale[w][h];
                }
        }
        hal::fence_view_async_shared();
        hal::named_barrier_sync(1 + t.wg, 128);
        if (leader && in_n) {
            hal::tma_store_3d(&params.tma_d, smem_d + t.wg_row0 * Tile::kRowBytes, static_cast<i32>(n0_out),
                              static_cast<i32>(row0 + t.wg_row0), static_cast<i32>(batch));
            hal::tma_store_commit();
        }
    }

    static DFG_DEVICE void finish(const TileThread& t) {
        if (t.store_leader())
            hal::tma_store_wait_all();
    }
};

template <bool kKGrouped, u32 SHAPE_N, u32 BLOCK_M, u32 BLOCK_N, u32 kWavesM>
struct Fp32Accumulate {
    static constexpr u32 kSmemBytes = 0;

    template <u32 kValues>
    static DFG_DEVICE void store(const GemmParams& params, u8* /*smem_d*/, const TileInfo& tile, const TileThread& t,
                                 float (&acc)[kWavesM][kValues]) {
        const u64 group_rows = kKGrouped ? static_cast<u64>(tile.group) * params.rows : 0u;  // D / C [G][rows][N]
        store_fp32_accumulate<SHAPE_N, BLOCK_N>(params.d_f32 + group_rows * params.ld_d,
                                                params.c_f32 + group_rows * params.ld_c, params.ld_d, params.ld_c,
                                                params.rows, tile.m_block * BLOCK_M, t.n0, t.frag_row, t.lane, acc);
        // NOTES: the stores' lane-dependent bounds checks diverge; reconverging here lets ptxas keep the next
        // tile's K loop on the uniform datapath (-21 instructions per K block, k-grouped).
        hal::warp_sync();
    }

    static DFG_DEVICE void finish(const TileThread&) {}
};

template <typename Split, u32 kNumNBlocks, typename Inner>
struct SplitKReduce {
    static constexpr u32 kSmemBytes = Inner::kSmemBytes;

    template <u32 kWavesM, u32 kValues>
    static DFG_DEVICE void store(const GemmParams& params, u8* smem_d, const TileInfo& tile, const TileThread& t,
                                 float (&acc)[kWavesM][kValues]) {
        if (Split::reduce(params.split_counters, params.split_partials, tile, kNumNBlocks, t.wg,
                          t.warp_in_wg * 32 + t.lane, acc))
            Inner::store(params, smem_d, tile, t, acc);
    }

    static DFG_DEVICE void finish(const TileThread& t) { Inner::finish(t); }
};

}  // namespace dfg
