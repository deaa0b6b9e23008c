// The DeepSeek-V3.2 indexer's inner block, shared by both forms of kernels/mqa_logits.cuh (dense and paged): one
// math warpgroup scores its 64 KV rows against a Q tile of kQueries x kNumHeads rows,
//
//   score[q][r] = s_kv[r] * sum_h w[q][h] * ReLU(Q[q][h][:] . KV[r][:])      (e4m3 Q and KV, fp32 w and s_kv)
//
// with the head reduction fused in registers:
//   1. kHeadDim / 32 wgmma m64nNk32, N = kQueries * kNumHeads: A = the 64 KV rows (the warpgroup's slice of the KV
//      stage), B = the Q tile, fp32 accumulators (WgmmaFragment<N>: value i of lane l holds KV row 16 w + l / 4 +
//      8 ((i / 2) % 2) and Q-tile row 8 (i / 4) + 2 (l % 4) + i % 2, i.e. query i / (H / 2), head 8 ((i / 4) % (H /
//      8)) + 2 (l % 4) + i % 2);
//   2. per thread, fma(ReLU(acc), w) over its H / 4 heads of each query, for both of its KV rows (four independent
//      chains per query: i % 4);
//   3. the quad (the four lanes l / 4 that share KV rows) sums its partials with a reduce-scatter through
//      hal::shfl_xor: each lane ends with the totals of kValuesOut (query, row) pairs instead of all 2 kQueries
//      (kQueries = 4: 6 shuffles, then each lane owns one query's two rows; 2: 3 shuffles, one pair; 1: 2 shuffles,
//      lanes l and l ^ 2 hold the same pair and only l & 2 == 0 stores). An all-reduce (every lane every pair, then
//      four lanes storing the same value, as the reference design does) costs 16 / 8 / 4 shuffles;
//   4. times the KV row's scale.
// The caller stores the values: store(query, row, value), query in [0, kQueries), row in [0, 64).
//
// NOTES: the KV row scale multiplies the quad's sum, once per owned value (2 FMUL per lane per tile at kQueries 4),
// where the reference design scales each lane's partial before the exchange (4 per lane per query pair); the
// results differ from it by fp32 rounding only, and the CPU reference (deep_fp8_gemm.attention) is exact in
// float64 anyway.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "mma.cuh"

namespace dfg {
namespace mqa {

constexpr u32 kWarpgroupRows = 64;  // KV rows one math warpgroup scores per tile (wgmma M)

template <u32 kQueries, u32 kNumHeads, u32 kHeadDim>
struct ScoreTile {
    static constexpr u32 N = kQueries * kNumHeads;  // the Q tile's rows: wgmma N
    using Frag = WgmmaFragment<N>;
    static constexpr u32 kAccValues = Frag::kValues;
    static constexpr u32 kSlices = kHeadDim / kWgmmaK;
    static constexpr u32 kWeightsPerQuery = kNumHeads / 4;  // heads 8 c + 2 (l % 4) + e of a lane, c < H / 8, e < 2
    static constexpr u32 kPairs = 2 * kQueries;             // (query, row half) partials per lane before the exchange
    static constexpr u32 kValuesOut = kPairs >= 4 ? kPairs / 4 : 1u;  // after it
    static_assert(kQueries == 1 || kQueries == 2 || kQueries == 4, "1, 2 or 4 queries per Q tile");
    static_assert(kNumHeads % 8 == 0 && N >= 8 && N <= 256, "heads: a multiple of 8, the Q tile at most 256 rows");
    static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128, "head_dim 32, 64 or 128 (one swizzled row)");

    // This thread's weights of query q: heads 8 c + 2 (lane % 4) + e of the Q stage's fp32 [kQueries][kNumHeads]
    // weights, as 8-byte pairs (c, e = 0 / 1). Read from shared memory at every tile, not held in registers.
    // NOTES: in registers they are kQueries x H / 4 = 32 floats (N = 128) next to the 64 accumulators, which left
    // the math threads (112 registers) spilling 8-112 bytes in the dense H 64 and paged H 64 next_n 2 kernels; read
    // per tile they cost kQueries x H / 8 = 16 LDS.64 per warp (each a broadcast: four distinct addresses per warp)
    // beside ~150 other instructions of the reduction, and no kernel spills.
    static DFG_DEVICE F32x2 weight_pair(const float* smem_weights, u32 q, u32 c, u32 lane) {
        return *reinterpret_cast<const F32x2*>(smem_weights + q * kNumHeads + 8 * c + 2 * (lane % 4));
    }

    // Issue and commit the tile's wgmmas: acc = KV rows (a_desc: the warpgroup's 64 rows) x Q tile (b_desc). The
    // k32 slices advance both start addresses by 32 bytes inside the swizzled rows (mma.cuh).
    static DFG_DEVICE void issue(u64 a_desc, u64 b_desc, float (&acc)[kAccValues]) {
        DFG_UNROLL
        for (u32 i = 0; i < kAccValues; ++i)
            hal::fence_operand(acc[i]);
        hal::wgmma_fence();
        DFG_UNROLL
        for (u32 s = 0; s < kSlices; ++s)
            hal::WgmmaFp8<N>::mma(desc_advance(a_desc, s * kWgmmaK), desc_advance(b_desc, s * kWgmmaK), acc, s > 0);
        hal::wgmma_commit();
    }

    static DFG_DEVICE void wait(float (&acc)[kAccValues]) {
        hal::wgmma_wait<0>();
        DFG_UNROLL
        for (u32 i = 0; i < kAccValues; ++i)
            hal::fence_operand(acc[i]);
    }

    static DFG_DEVICE float relu(float x) { return x > 0.0f ? x : 0.0f; }  // NaN -> 0, as fmaxf(x, 0)

    // The (query, row half) of value j of this lane after the exchange (see step 3 above): pair index
    // b0 * P / 2 + b1 * P / 4 + j for P = kPairs >= 4, b0 for P = 2, with b0 = lane & 1, b1 = (lane >> 1) & 1.
    static DFG_HOST_DEVICE constexpr u32 pair_of(u32 lane, u32 j) {
        return kPairs >= 4 ? (lane & 1u) * (kPairs / 2) + ((lane >> 1) & 1u) * (kPairs / 4) + j : (lane & 1u);
    }
    static DFG_HOST_DEVICE constexpr u32 query_of(u32 lane, u32 j) { return pair_of(lane, j) / 2; }
    static DFG_HOST_DEVICE constexpr u32 half_of(u32 lane, u32 j) { return pair_of(lane, j) % 2; }
    // Lanes whose values are not duplicates (kPairs = 2 leaves lanes l and l ^ 2 with the same pair).
    static DFG_HOST_DEVICE constexpr bool stores(u32 lane) { return kPairs >= 4 || (lane & 2u) == 0; }

    // Steps 2-4 on retired accumulators. smem_weights: the Q stage's weights; scale_lo / scale_hi: the KV scales
    // of this thread's rows r and r + 8 (r = 16 warp_in_wg + lane / 4); store(query, row, value) for each value
    // this lane owns.
    template <typename Store>
    static DFG_DEVICE void reduce(const float (&acc)[kAccValues], const float* smem_weights, float scale_lo,
                                  float scale_hi, u32 warp_in_wg, u32 lane, Store&& store) {
        // 2. Partials: pair[2 q + half] over the thread's heads, four chains per query (i % 4 = 2 half + e). Values
        // i = 4 c' .. 4 c' + 3 (c' = i / 4) share head pair c = c' % (H / 8) of query c' / (H / 8).
        float chain[kQueries][4];
        DFG_UNROLL
        for (u32 g = 0; g < kAccValues / 4; ++g) {
            const u32 q = g / (kNumHeads / 8);
            const F32x2 w = weight_pair(smem_weights, q, g % (kNumHeads / 8), lane);
            DFG_UNROLL
            for (u32 k = 0; k < 4; ++k) {
                const float x = relu(acc[4 * g + k]);
                const float wk = k % 2 ? w.y : w.x;
                chain[q][k] = g % (kNumHeads / 8) == 0 ? x * wk : hal::fma_rn(x, wk, chain[q][k]);
            }
        }
        float pair[kPairs];
        DFG_UNROLL
        for (u32 q = 0; q < kQueries; ++q) {
            pair[2 * q] = chain[q][0] + chain[q][1];
            pair[2 * q + 1] = chain[q][2] + chain[q][3];
        }
        // 3. Reduce-scatter over the quad. Step over lane bit 0: keep the half of the pairs this lane owns, send
        // the other half (selects, not an index by lane: a register array indexed at run time would go to local
        // memory).
        const bool b0 = (lane & 1u) != 0, b1 = (lane & 2u) != 0;
        constexpr u32 kHalf = kPairs / 2;
        float kept[kHalf];
        DFG_UNROLL
        for (u32 j = 0; j < kHalf; ++j) {
            const float send = b0 ? pair[j] : pair[kHalf + j];
            const float keep = b0 ? pair[kHalf + j] : pair[j];
            kept[j] = keep + hal::shfl_xor(send, 1);
        }
        float out[kValuesOut];
        if constexpr (kHalf >= 2) {  // step over lane bit 1 the same way
            constexpr u32 kQuarter = kHalf / 2;
            DFG_UNROLL
            for (u32 j = 0; j < kQuarter; ++j) {
                const float send = b1 ? kept[j] : kept[kQuarter + j];
                const float keep = b1 ? kept[kQuarter + j] : kept[j];
                out[j] = keep + hal::shfl_xor(send, 2);
            }
        } else {  // one pair left: lanes l and l ^ 2 both end with the sum (a + b == b + a: the same bits)
            out[0] = kept[0] + hal::shfl_xor(kept[0], 2);
        }
        // 4. The row scale, then the caller's store.
        if (!stores(lane))
            return;
        DFG_UNROLL
        for (u32 j = 0; j < kValuesOut; ++j) {
            const u32 half = half_of(lane, j);
            const float scale = half ? scale_hi : scale_lo;
            store(query_of(lane, j), 16 * warp_in_wg + lane / 4 + 8 * half, out[j] * scale);
        }
    }
};

}  // namespace mqa
}  // namespace dfg
