// FP8 GEMM with fine-grained scaling: D[m, n] (bf16) = sum_kb (A[m, kb] . B[n, kb]^T) * sA[m, kb] * sB[n/128, kb]
// A: e4m3 [rows, K] K-major, 1x128 scales sA (fp32, M-major, TMA-aligned); B: e4m3 [G, N, K] K-major,
// 128x128 scales sB (fp32 [G, ceil(N/128), ceil(K/128)]); D: bf16. N, K and every tile size are
// compile-time constants; the row count m is a run-time argument, so one binary serves every m.
//
// Warp roles (kNumThreads = 128 * (kNumMathWarpgroups + 1)):
//   threads [0, 128 * kNumMathWarpgroups)   math warpgroups; warpgroup w owns tile rows
//                                           [w * kWgRows, (w + 1) * kWgRows), kWavesM m64 slices.
//                                           setmaxnreg.inc to kMathRegisters (232 with two math
//                                           warpgroups, 240 with one).
//   last 128 threads                        producer warpgroup; one thread issues every TMA load.
//                                           setmaxnreg.dec to kProducerRegisters (40). The audit
//                                           checks that the launch allocation fits this split.
//
// Barriers (shared memory, one pair per stage):
//   full[s]   producer -> math. Arrive count 1 (the producer's arrive.expect_tx) + transaction bytes
//             kStageTxBytes (A tile + B tile + sA slice, whoever of the cluster issued the copies).
//   empty[s]  math -> producers of the cluster. Arrive count kClusterSize * kNumMathWarps: after its
//             wgmma.wait, lane r < kClusterSize of every math warp arrives on CTA r's empty[s],
//             because a multicasting peer writes into this CTA's stage s too.
//   named barriers 1 + w: the 128 threads of math warpgroup w around the epilogue's shared tile.
//
// Shared memory (dynamic, 1024-byte aligned; offsets kSmem* below, total kSmemBytes, equal to
// deep_fp8_gemm.config.smem_bytes by static_assert):
//   D tile (bf16, BLOCK_N/16 swizzled 16-column chunks) | A stages | B stages | sA stages | barriers
//
// Math per 128-wide K block and m64 wave: 4 x wgmma m64nBLOCK_Nk32 into a scratch accumulator (scale-d = 0
// on the first), wait, release the stage (after the last wave), then promote on the CUDA cores:
// acc += scratch * sA[row] * sB[col block], the sB values loaded one K block ahead. The tensor cores never sum more than 128 products, which keeps FP8 GEMMs accurate
// (their internal accumulator keeps ~14 bits of alignment; see ANCHORS.md, "two-level accumulation").
#pragma once
#include "../common.cuh"
#include "../epilogue.cuh"
#include "../hal.cuh"
#include "../mma.cuh"
#include "../pipeline.cuh"
#include "../scales.cuh"
#include "../scheduler.cuh"
#include "../tma.cuh"

namespace dfg {

// The kernel's single parameter. Byte layout mirrored by deep_fp8_gemm/kernels/gemm.py (pack_params).
struct GemmParams {
    TensorMap tma_a;            // A  [G][rows][K] e4m3: dims (K, rows, G), box (128, A rows per load, 1), SW128
    TensorMap tma_b;            // B  [G][N][K]    e4m3: dims (K, N, G),    box (128, B rows per load, 1), SW128
    TensorMap tma_sa;           // sA fp32 M-major:      dims (rows, ceil(K/128), G), box (BLOCK_M, 1, 1)
    TensorMap tma_d;            // D  [G][rows][N] bf16: dims (N, rows, G),   box (16, kWgRows, 1), SW32
    const float* sb;            // sB [G][ceil(N/128)][ceil(K/128)] fp32, row-major
    const i32* grouped_layout;  // contiguous: m_indices[rows]; psum: ends[G]; masked: masked_m[G]; dense: unused
    u32 rows;                   // dense: m; contiguous: m_sum; masked: m_max
    u32 reserved;
};
static_assert(DFG_OFFSETOF(GemmParams, tma_a) == 0 && DFG_OFFSETOF(GemmParams, tma_b) == 128 &&
                  DFG_OFFSETOF(GemmParams, tma_sa) == 256 && DFG_OFFSETOF(GemmParams, tma_d) == 384 &&
                  DFG_OFFSETOF(GemmParams, sb) == 512 && DFG_OFFSETOF(GemmParams, grouped_layout) == 520 &&
                  DFG_OFFSETOF(GemmParams, rows) == 528 && sizeof(GemmParams) == 576,
              "GemmParams layout is mirrored in deep_fp8_gemm/kernels/gemm.py");

template <GemmKind kKind, u32 SHAPE_N, u32 SHAPE_K, u32 BLOCK_M, u32 BLOCK_N, u32 kNumStages, u32 kNumGroups,
          u32 kClusterM, u32 kClusterN, u32 kNumMathWarpgroups, u32 kBandWidth, u32 kExpectedSmemBytes>
struct Fp8GemmKernel {
    // ---------------------------------------------------------------- shape of the work
    static constexpr u32 BLOCK_K = 128;
    static constexpr u32 kNumKBlocks = ceil_div(SHAPE_K, BLOCK_K);
    static constexpr u32 kNumScaleBlocksN = ceil_div(SHAPE_N, 128u);
    static constexpr u32 kClusterSize = kClusterM * kClusterN;
    static constexpr bool kMulticastA = kClusterN == 2;
    static constexpr bool kMulticastB = kClusterM == 2;
    static constexpr u32 kWgRows = BLOCK_M / kNumMathWarpgroups;
    static constexpr u32 kWavesM = kWgRows / 64;
    static constexpr u32 kAccValues = WgmmaFragment<BLOCK_N>::kValues;
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumMathWarps = kNumMathThreads / 32;
    static constexpr u32 kNumThreads = kNumMathThreads + 128;
    static constexpr u32 kProducerRegisters = 40;
    static constexpr u32 kMathRegisters = kNumMathWarpgroups == 1 ? 240 : 232;

    static_assert(SHAPE_N % 8 == 0 && SHAPE_K % 16 == 0, "TMA needs 16-byte row strides: N % 8 == 0, K % 16 == 0");
    static_assert(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 256, "BLOCK_M in {64, 128, 256}");
    static_assert(kNumMathWarpgroups == 1 || kNumMathWarpgroups == 2, "one or two math warpgroups");
    static_assert(kWgRows % 64 == 0 && kWavesM >= 1 && kWavesM <= 2, "each warpgroup owns 64 or 128 rows");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 256, "BLOCK_N: multiple of 16 in [16, 256]");
    static_assert(kKind != GemmKind::Dense || kNumGroups == 1, "dense GEMM has one group");
    static_assert((kKind != GemmKind::GroupedContiguous && kKind != GemmKind::GroupedContiguousPsum) || BLOCK_M <= 128,
                  "contiguous layout pads experts to 128 rows: a block must not straddle two experts");
    static_assert(kNumStages >= 2, "at least two stages to overlap loads with math");
    static_assert(kProducerRegisters * 128 + kMathRegisters * kNumMathThreads <= 65536, "register file is 64K");

    // Block columns [n0, n0 + BLOCK_N) with n0 a multiple of BLOCK_N start at most 128 - gcd(BLOCK_N, 128)
    // into a 128-column scale block, so they touch at most two scale blocks iff
    // BLOCK_N <= 128 + gcd(BLOCK_N, 128) (144 and 160 qualify, 176 does not). The promotion relies on it.
    static_assert(BLOCK_N <= 128 + gcd(BLOCK_N, 128u), "a block's columns must touch at most two sB blocks");

    using Scheduler = TileScheduler<kKind, SHAPE_N, BLOCK_M, BLOCK_N, kNumGroups, kClusterM, kClusterN, kBandWidth>;
    using Store = Epilogue<BLOCK_M, BLOCK_N, kWavesM>;
    using Pipe = PipelineState<kNumStages>;

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kSmemD = 0;
    static constexpr u32 kSmemDBytes = round_up(Store::kSmemBytes, 1024u);
    static constexpr u32 kSmemABytes = BLOCK_M * BLOCK_K;  // one stage; 1024-byte multiple
    static constexpr u32 kSmemBBytes = BLOCK_N * BLOCK_K;
    static constexpr u32 kSmemSABytes = round_up(BLOCK_M * 4u, 128u);
    static constexpr u32 kSmemA = kSmemD + kSmemDBytes;
    static constexpr u32 kSmemB = kSmemA + kNumStages * kSmemABytes;
    static constexpr u32 kSmemSA = kSmemB + kNumStages * kSmemBBytes;
    static constexpr u32 kSmemBarriers = kSmemSA + kNumStages * kSmemSABytes;
    static constexpr u32 kSmemBytes = kSmemBarriers + 2 * kNumStages * 8;
    static constexpr u32 kStageTxBytes = kSmemABytes + kSmemBBytes + BLOCK_M * 4;
    static_assert(kSmemABytes % 1024 == 0 && kSmemBBytes % 1024 == 0, "stages keep 1024-byte alignment");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/config.py: keep the two maps identical");

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const GemmParams& params) {
        u8* smem = hal::dynamic_smem();
        u64* full = reinterpret_cast<u64*>(smem + kSmemBarriers);
        u64* empty = full + kNumStages;
        const u32 thread = hal::thread_idx();
        const u32 warp = hal::warp_idx();
        const u32 lane = hal::lane_idx();

        if (thread == kNumMathThreads) {
            // Swizzle patterns are computed from address bits: the map above assumes a 1024-aligned base.
            if (hal::smem_addr(smem) % 1024 != 0)
                hal::trap("dynamic shared memory is not 1024-byte aligned");
            // A cluster kernel launched without its cluster would multicast / arrive into a missing peer.
            if (hal::cluster_num_ctas() != kClusterSize)
                hal::trap("launched with a cluster size other than the kernel's");
            hal::tma_prefetch(&params.tma_a);
            hal::tma_prefetch(&params.tma_b);
            hal::tma_prefetch(&params.tma_sa);
            hal::tma_prefetch(&params.tma_d);
            for (u32 s = 0; s < kNumStages; ++s) {
                hal::mbar_init(&full[s], 1);
                hal::mbar_init(&empty[s], kClusterSize * kNumMathWarps);
            }
            // Barrier initialisation visible to the async proxy (TMA complete_tx) and to the cluster.
            hal::fence_view_async_shared();
            hal::fence_barrier_init();
        }
        // The peer CTA's barriers must be initialised before anyone multicasts or arrives remotely.
        if constexpr (kClusterSize > 1)
            hal::cluster_sync();
        else
            hal::sync_threads();

        if (thread >= kNumMathThreads) {
            hal::setmaxnreg_dec<kProducerRegisters>();
            if (thread == kNumMathThreads)
                produce(params, smem, full, empty);
        } else {
            hal::setmaxnreg_inc<kMathRegisters>();
            consume(params, smem, full, empty, warp, lane);
        }

        // No CTA may exit while its peer can still multicast into it or arrive on its barriers.
        if constexpr (kClusterSize > 1)
            hal::cluster_sync();
    }

    // ---------------------------------------------------------------- producer (one thread)
    static DFG_DEVICE void produce(const GemmParams& params, u8* smem, u64* full, u64* empty) {
        const u32 rank = kClusterSize > 1 ? hal::cluster_cta_rank() : 0u;
        Scheduler scheduler(params.rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (scheduler.next(tile)) {
            const i32 row0 = static_cast<i32>(tile.m_block * BLOCK_M);
            const i32 n0 = static_cast<i32>(tile.n_block * BLOCK_N);
            // A / sA / D batch index: the group for the masked layout (3-D maps), else 0.
            const i32 a_batch = kKind == GemmKind::GroupedMasked ? static_cast<i32>(tile.group) : 0;
            const i32 b_batch = static_cast<i32>(tile.group);
            for (u32 kb = 0; kb < kNumKBlocks; ++kb) {
                hal::mbar_wait(&empty[pipe.stage], pipe.phase ^ 1u, empty_barrier(pipe.stage));
                u64* bar = &full[pipe.stage];
                hal::mbar_arrive_expect_tx(bar, kStageTxBytes);
                const i32 k0 = static_cast<i32>(kb * BLOCK_K);
                tma_load_tile<BLOCK_M, BLOCK_K, kMulticastA>(smem + kSmemA + pipe.stage * kSmemABytes, &params.tma_a,
                                                             bar, k0, row0, a_batch, rank);
                tma_load_tile<BLOCK_N, BLOCK_K, kMulticastB>(smem + kSmemB + pipe.stage * kSmemBBytes, &params.tma_b,
                                                             bar, k0, n0, b_batch, rank, tile.multicast);
                hal::tma_load_3d(smem + kSmemSA + pipe.stage * kSmemSABytes, &params.tma_sa, bar, row0,
                                 static_cast<i32>(kb), a_batch);
                pipe.advance();
            }
        }
    }

    // ---------------------------------------------------------------- math warpgroups
    static DFG_DEVICE void consume(const GemmParams& params, u8* smem, u64* full, u64* empty, u32 warp, u32 lane) {
        const u32 wg = warp / 4;
        const u32 warp_in_wg = warp % 4;
        const u32 wg_row0 = wg * kWgRows;
        const bool store_leader = warp_in_wg == 0 && lane == 0;
        // Rows of this thread's fragment inside the tile, per wave: r and r + 8 (WgmmaFragment::row).
        const u32 frag_row = wg_row0 + warp_in_wg * 16 + lane / 4;

        float acc[kWavesM][kAccValues];
        float scratch[kAccValues];

        Scheduler scheduler(params.rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (scheduler.next(tile)) {
            if (tile.group >= kNumGroups)
                hal::trap("grouped layout names a group >= num_groups");
            const u32 n0 = tile.n_block * BLOCK_N;
            const auto scale_cols = ScaleColumns<BLOCK_N, kNumScaleBlocksN>::of(n0);
            const float* sb_row0 = params.sb + (tile.group * kNumScaleBlocksN + scale_cols.block0) * kNumKBlocks;
            const float* sb_row1 = params.sb + (tile.group * kNumScaleBlocksN + scale_cols.block1) * kNumKBlocks;

            DFG_UNROLL
            for (u32 w = 0; w < kWavesM; ++w)
                DFG_UNROLL
                for (u32 i = 0; i < kAccValues; ++i)
                    acc[w][i] = 0.0f;

            // sB values are loaded one K block ahead: a global load per K block would otherwise sit on
            // the critical path between the full-barrier wait and the promotion.
            float next_sb0 = hal::ld_global_nc(sb_row0);
            float next_sb1 = hal::ld_global_nc(sb_row1);
            for (u32 kb = 0; kb < kNumKBlocks; ++kb) {
                const float sb0 = next_sb0;
                const float sb1 = next_sb1;
                if (kb + 1 < kNumKBlocks) {
                    next_sb0 = hal::ld_global_nc(sb_row0 + kb + 1);
                    next_sb1 = hal::ld_global_nc(sb_row1 + kb + 1);
                }
                hal::mbar_wait(&full[pipe.stage], pipe.phase, full_barrier(pipe.stage));
                const float* sa = reinterpret_cast<const float*>(smem + kSmemSA + pipe.stage * kSmemSABytes);
                const u8* a_stage = smem + kSmemA + pipe.stage * kSmemABytes;
                const u8* b_stage = smem + kSmemB + pipe.stage * kSmemBBytes;
                DFG_UNROLL
                for (u32 w = 0; w < kWavesM; ++w) {
                    // Read the row scales before the stage can be released.
                    const float sa_lo = sa[frag_row + w * 64];
                    const float sa_hi = sa[frag_row + w * 64 + 8];
                    const u8* a_tile = a_stage + (wg_row0 + w * 64) * BLOCK_K;
                    DFG_UNROLL
                    for (u32 i = 0; i < kAccValues; ++i)
                        hal::fence_operand(scratch[i]);
                    hal::wgmma_fence();
                    DFG_UNROLL
                    for (u32 ks = 0; ks < BLOCK_K / kWgmmaK; ++ks)
                        hal::WgmmaFp8<BLOCK_N>::mma(k_slice_desc(a_tile, ks), k_slice_desc(b_stage, ks), scratch, ks > 0);
                    hal::wgmma_commit();
                    hal::wgmma_wait<0>();
                    DFG_UNROLL
                    for (u32 i = 0; i < kAccValues; ++i)
                        hal::fence_operand(scratch[i]);
                    if (w + 1 == kWavesM)
                        release_stage(empty, pipe.stage, lane);
                    promote(acc[w], scratch, sa_lo, sa_hi, sb0, sb1, scale_cols.mask);
                }
                pipe.advance();
            }

            // Epilogue: the previous tile's TMA store must have finished reading the shared tile.
            if (store_leader)
                hal::tma_store_wait_read<0>();
            hal::named_barrier_sync(1 + wg, 128);
            Store::write_smem(smem + kSmemD, acc, wg_row0, warp_in_wg, lane);
            hal::fence_view_async_shared();
            hal::named_barrier_sync(1 + wg, 128);
            if (store_leader) {
                const i32 batch = kKind == GemmKind::GroupedMasked ? static_cast<i32>(tile.group) : 0;
                Store::issue_stores(&params.tma_d, smem + kSmemD, wg_row0, static_cast<i32>(n0),
                                    static_cast<i32>(tile.m_block * BLOCK_M), batch, SHAPE_N);
            }
        }
        if (store_leader)
            hal::tma_store_wait_all();
    }

    // Lane r < kClusterSize of each math warp releases the stage on CTA r of the cluster.
    static DFG_DEVICE void release_stage(u64* empty, u32 stage, u32 lane) {
        if constexpr (kClusterSize == 1) {
            if (lane == 0)
                hal::mbar_arrive(&empty[stage]);
        } else {
            if (lane < kClusterSize)
                hal::mbar_arrive_cluster(&empty[stage], lane);
        }
    }

    // acc += scratch * sA[row] * sB[column block], per the fragment layout of WgmmaFragment:
    // values 4j + {0, 1} are row r, 4j + {2, 3} row r + 8, all in column group j.
    static DFG_DEVICE void promote(float (&acc)[kAccValues], const float (&scratch)[kAccValues], float sa_lo,
                                   float sa_hi, float sb0, float sb1, u32 second_block_mask) {
        const float lo0 = sa_lo * sb0, lo1 = sa_lo * sb1, hi0 = sa_hi * sb0, hi1 = sa_hi * sb1;
        DFG_UNROLL
        for (u32 j = 0; j < kAccValues / 4; ++j) {
            const bool second = (second_block_mask >> j) & 1u;
            const float lo = second ? lo1 : lo0;
            const float hi = second ? hi1 : hi0;
            acc[4 * j + 0] += scratch[4 * j + 0] * lo;
            acc[4 * j + 1] += scratch[4 * j + 1] * lo;
            acc[4 * j + 2] += scratch[4 * j + 2] * hi;
            acc[4 * j + 3] += scratch[4 * j + 3] * hi;
        }
    }
};

}  // namespace dfg
