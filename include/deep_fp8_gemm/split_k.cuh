// Split-K for problems with fewer output tiles than SMs (dense kind only).
//
// With kSplitK > 1 the K blocks are cut into kSplitK equal slices of kNumKBlocks / kSplitK blocks (kSplitK
// divides the block count, so every slice has the same compile-time trip count and the unrolled K loops stay
// as they are); work item w of the scheduler is slice w % kSplitK of tile w / kSplitK (scheduler.cuh), so
// each tile is computed by kSplitK CTAs that run at the same time. Each math warpgroup then, per tile:
//
//   1. stores its fp32 accumulators to the workspace, in fragment order (thread t's values j..j+3 at
//      [j / 4][t][4]: coalesced 16-byte stores, no bounds checks: rows >= m and columns >= N are stored too,
//      the workspace holds whole tiles);
//   2. bar.sync of its 128 threads (all stores of the warpgroup before the next step), then thread 0:
//      old = atom.add.acq_rel.gpu(counter[tile][wg], 1). Release: the warpgroup's partial (ordered before
//      the atom by the bar.sync, release is cumulative) is visible to whoever acquires the counter later;
//      acquire: the partials of the splits that incremented before are visible to this one;
//   3. bar.red.or broadcasts "old == kSplitK - 1" to the warpgroup. All but the last arriving split are
//      done with the tile. The last one resets the counter to 0 (every split has incremented it and no one
//      touches it again in this launch, so the next launch, stream-ordered after this one, sees 0: CUDA graph
//      replays stay correct) and sums the kSplitK partials from the workspace in the fixed order 0, 1, ...,
//      kSplitK - 1 (its own read back too: program order makes it visible to the thread that stored it):
//      the result does not depend on which split arrives last, so it is bitwise reproducible. The sum
//      replaces acc and the usual bf16 epilogue stores the tile.
//
// No CTA ever waits for another (no spinning), so the scheme cannot deadlock whatever the residency.
//
// Workspace (deep_fp8_gemm/split_k.py allocates and caches it per device and stream):
//   counters  u32 [num_tiles * kNumMathWarpgroups], zero before the launch, zero after it;
//   partials  f32 [num_tiles][kSplitK][kNumMathWarpgroups][kWgRows * BLOCK_N]; num_tiles = m-blocks x n-blocks.
#pragma once
#include "common.cuh"
#include "kinds.cuh"
#include "hal.cuh"
#include "mma.cuh"

#if defined(DFG_SIMULATOR)
#define DFG_SPLIT_K_NO_UNROLL
#else
#define DFG_SPLIT_K_NO_UNROLL _Pragma("unroll 1")
#endif

namespace dfg {

// 16 bytes, 16-byte aligned: the compiler moves it with one vector load / store.
struct alignas(16) Float4 {
    float v[4];
};

template <u32 kSplitK, u32 kNumKBlocks, GemmKind kKind, u32 kClusterSize, u32 kNumMathWarpgroups, u32 BLOCK_M,
          u32 BLOCK_N>
struct SplitK {
    static constexpr u32 kWgRows = BLOCK_M / kNumMathWarpgroups;
    static constexpr u32 kWavesM = kWgRows / 64;
    static constexpr u32 kValues = WgmmaFragment<BLOCK_N>::kValues;  // per thread and m64 wave
    static constexpr u32 kVectors = kWavesM * kValues / 4;           // Float4 per thread
    static constexpr u32 kWgFloats = kWgRows * BLOCK_N;              // one warpgroup's partial
    static_assert(kSplitK >= 1 && kNumKBlocks % kSplitK == 0, "split-K: the split count divides the K block count");
    static_assert(kSplitK == 1 || (kKind == GemmKind::Dense && kClusterSize == 1), "split-K: dense, no clusters");
    static_assert(kValues % 4 == 0 && kVectors * 4 * 128 == kWgFloats, "fragment order covers the warpgroup's rows");

    // Steps 1-3 above for math warpgroup `wg` (thread `t` of it, 0..127) and `tile`. Returns true in the last
    // split of the tile, with acc holding the sum of all splits; false in the others (acc unspecified).
    template <u32 kV>
    static DFG_DEVICE bool reduce(u32* counters, float* partials, const TileInfo& tile, u32 num_n_blocks, u32 wg, u32 t,
                                  float (&acc)[kWavesM][kV]) {
        static_assert(kV == kValues, "fragment of m64nBLOCK_N");
        const u32 tile_idx = tile.m_block * num_n_blocks + tile.n_block;
        float* base = partials + (static_cast<u64>(tile_idx) * kSplitK * kNumMathWarpgroups + wg) * kWgFloats;
        constexpr u64 kSplitStride = static_cast<u64>(kNumMathWarpgroups) * kWgFloats;
        Float4* mine = reinterpret_cast<Float4*>(base + tile.split * kSplitStride) + t;
        DFG_UNROLL
        for (u32 j = 0; j < kVectors; ++j) {
            Float4 v;
            DFG_UNROLL
            for (u32 e = 0; e < 4; ++e)
                v.v[e] = acc[(4 * j) / kValues][(4 * j) % kValues + e];
            mine[j * 128] = v;
        }
        hal::named_barrier_sync(1 + wg, 128);
        u32 last = 0;
        if (t == 0) {
            u32* counter = counters + tile_idx * kNumMathWarpgroups + wg;
            last = hal::atomic_add_acq_rel_gpu(counter, 1u) == kSplitK - 1 ? 1u : 0u;
            if (last)
                *counter = 0;  // all kSplitK increments happened before (acquired): no one else writes it now
        }
        if (!hal::named_barrier_sync_or(1 + wg, 128, last != 0))
            return false;
        // acc = partial 0, then += partial 1, 2, ...: one split's vectors in flight at a time (unrolling the
        // split loop let the compiler hoist every split's loads and spill).
        const Float4* src = reinterpret_cast<const Float4*>(base) + t;
        DFG_UNROLL
        for (u32 j = 0; j < kVectors; ++j) {
            const Float4 p = src[j * 128];
            DFG_UNROLL
            for (u32 e = 0; e < 4; ++e)
                acc[(4 * j) / kValues][(4 * j) % kValues + e] = p.v[e];
        }
        DFG_SPLIT_K_NO_UNROLL
        for (u32 s = 1; s < kSplitK; ++s) {
            src = reinterpret_cast<const Float4*>(base + s * kSplitStride) + t;
            DFG_UNROLL
            for (u32 j = 0; j < kVectors; ++j) {
                const Float4 p = src[j * 128];
                DFG_UNROLL
                for (u32 e = 0; e < 4; ++e)
                    acc[(4 * j) / kValues][(4 * j) % kValues + e] += p.v[e];
            }
        }
        return true;
    }
};

}  // namespace dfg
