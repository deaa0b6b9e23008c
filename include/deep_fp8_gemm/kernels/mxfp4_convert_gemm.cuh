// MXFP4 experts on the FP8 tensor cores, prefill tiles (issue 43): the weights converted into shared memory by a
// conversion stage, then the normal (non-swap) tile of the FP8 contiguous kernels.
//
//   contiguous (kLayout GroupedContiguous / GroupedContiguousPsum):
//       D[r, n] (bf16) = sum_kb sA[r, kb] * W_g,kb[n, :] . A[r, kb-block], g the group of row r's BLOCK_M-row block
//       (BLOCK_M = the layout's alignment, 64 or 128): the FP8 contiguous kernels' scheduler (scheduler.cuh
//       TileScheduler), so padding rows sharing a block with a group's rows get that group and padding-only blocks
//       are skipped (rows untouched), exactly as the FP8 contiguous kernels and the register-A contiguous kernel.
//
//   FP8 output (kOutput Fp8): (D, sD) = e4m3 D [M_sum, N] with 1x128 per-row scales sD of those values, the
//       FP8-output kinds' rule (epilogue_fp8.cuh), bit for bit the register-A kernel's store_fp8.
//
//   A: e4m3 [M_sum, K] with 1x128 per-token scales sA (fp32, given as [1, K/128, m_pad], M-major); W: the prepared
//   MXFP4 weights (ops/mxfp4_format.py PreparedMxfp4: per expert, 128-K block and 64-row wave a 4096-byte tile of e2m1
//   codes in register-A fragment order and a 272-byte metadata record, mxfp4.cuh), the same stored form and the same
//   Mxfp4Params as the register-A kernel (kernels/mxfp4_gemm.cuh), so one prepared checkpoint serves both paths.
//
// The tile: BLOCK_M tokens on the wgmma's M side (one 64-row m64 wave per math warpgroup, BLOCK_M / 64 warpgroups),
// BLOCK_N = 128 weight rows (two stored waves) on its N side, both operands from shared memory, K-major, 128-byte
// swizzled. The weights' e4m3 tile is written by the conversion warps, not by TMA.
//
// Numerics (the bit contract with the register-A kernels, docs/mxfp4.md): the converted operand is the register-A
// kernel's, byte for byte (mxfp4.cuh convert_word through the same pair tables: e2m1 x 2^d_s on a folded
// wave-block, e2m1 x 1 on a per-32 one), and every promotion is the same per-element arithmetic,
// acc = fma(scratch, 2^E_row x sA_token, acc):
//   folded wave-block   the 4 k32 wgmmas of the K block chained into one scratch, promoted once by 2^E x sA
//                       (the per-row B scale of the 1D1D kernels: policy_1d1d.cuh RowScalesB / WaveScales /
//                       promote_row_scaled);
//   per-32 wave-block   each k32 wgmma on the wave's 64 columns (m64n64k32) a fresh sum, promoted by 2^e_s x sA.
// With the tensor core's transposition symmetry (hal/sim/numerics.hpp, "D(A, B) = D(B, A)^T bit for bit") a token's
// values are then the register-A kernels' bits.
// Two K loops, chosen per tile (uniform over the CTA) by the waves' per-32 flags, as the register-A kernel:
//   folded   no wave of the tile has a per-32 block anywhere in K: per K block 4 x m64n128k32, one promotion;
//            the audit's K-loop figures are this loop's.
//   general  per K block and wave (64 columns), the path its metadata records.
//
// Warp roles (kNumThreads = 128 * (kNumMathWarpgroups + 1)):
//   threads [0, 128 kNumMathWarpgroups)  math warpgroups: the wgmmas, the promotion, the bf16 / e4m3 stores.
//                                        setmaxnreg.inc to kMathRegisters (240 / 232, the FP8 kernel's split).
//   producer warpgroup, warp 0           one lane (elect.sync) issues every TMA load.
//   producer warpgroup, warps 1..3       the conversion warps: per stage, the raw codes and metadata -> the e4m3
//                                        B tile (128-byte swizzle) and the per-row scales sB, then
//                                        fence.proxy.async (the wgmma reads B through the async proxy) and one
//                                        arrive per warp on full[s]. setmaxnreg.dec to kProducerRegisters (40).
//
// Barriers (shared memory, one triple per stage; pipeline.cuh's ring walked by all three roles):
//   raw[s]    producer -> conversion warps: 1 arrive.expect_tx, tx = the tile's two wave tiles + metadata records.
//   full[s]   producer + conversion -> math: 1 arrive.expect_tx (tx = A tile + sA) + kConvertWarps arrives (lane 0
//             of each conversion warp after its fence.proxy.async and bar.warp.sync).
//   empty[s]  math -> producer: kNumMathWarps arrives (lane 0 of each math warp after bar.warp.sync, once its
//             wgmmas of the stage retired and its sB / sA reads are done). The conversion warps write stage s only
//             after raw[s], which the producer arms only after empty[s]: the math warps' reads of the previous use
//             are ordered before the writes. The math warps also read the stage's metadata records (the general
//             loop's per-32 flags), which TMA writes on raw[s], a barrier they never wait on: the conversion warps'
//             wait on raw[s] acquires those bytes (a bulk copy's completion includes a generic-async proxy fence)
//             and their arrive on full[s] releases them on to the math warps' wait; those reads too come before the
//             math warps' empty[s] arrive, so the next TMA into the records waits for them.
//
// Shared memory (dynamic, 1024-aligned; = kernels/mxfp4_gemm.py Mxfp4Config.smem_bytes by static_assert):
//   A stages [kNumStages][BLOCK_M][128] (TMA, SW128) | B stages [kNumStages][128][128] e4m3 (converted, SW128) |
//   raw stages [kNumStages][2][4096] (TMA) | metadata [kNumStages][2 x 272, 128-rounded] (TMA) |
//   sA [kNumStages][BLOCK_M] fp32 (TMA) | sB [kNumStages][4][128] fp32 (converted: 2^E in [0], 2^e_s in [s] on per-32
//   waves) | pair tables (3600) | FP8 output: amax partials [math warps][2][32] u32 | raw, full, empty barriers.
//
// NOTES: the conversion stage per K block: 512 16-byte units (2 waves x 2 halves x 128 fragment threads), each one
// 16-byte load of codes, the rows' metadata (8 bytes, a quad broadcast), two 16-byte table loads, 4 x convert_word
// (36 ALU) and 8 four-byte stores (conflict-free: a warp's stores land in 8 distinct 16-byte chunks of 8 rows);
// 3 warps share them (6 / 5 / 5 warp-units). Audit (NVRTC 13.5, static): 92 instructions per unit, 618 per K block
// for the busiest conversion warp, against 512 tensor cycles of a 128x128 K block, on a sub-partition that also
// runs BLOCK_M / 64 math warps (184 each): the tile is issue-bound (docs/mxfp4.md, the cost model), slower than the
// register-A kernel's 128x64 prefill tile by the model. Two 64-column halves of one scratch accumulator as the
// general loop's sums made ptxas serialise every wgmma (C7511): they have their own array.
#pragma once
#include "../common.cuh"
#include "../epilogue_fp8.cuh"
#include "../hal.cuh"
#include "../kinds.cuh"
#include "../mma.cuh"
#include "../mxfp4.cuh"
#include "../pipeline.cuh"
#include "../policy_1d1d.cuh"
#include "../scheduler.cuh"
#include "mxfp4_gemm.cuh"

namespace dfg {
namespace mxfp4 {

template <u32 SHAPE_N, u32 SHAPE_K, u32 BLOCK_M, u32 BLOCK_N, u32 kNumStages, u32 kNumGroups, u32 kExpectedSmemBytes,
          GemmKind kLayout, Mxfp4Output kOutput = Mxfp4Output::Bf16, bool kUe8m0 = false>
struct Mxfp4ConvertKernel {
    static constexpr bool kFp8Out = kOutput == Mxfp4Output::Fp8;
    static_assert(kOutput != Mxfp4Output::SwigluFp8,
                  "SwiGLU needs gate and up in one tile (BLOCK_N 256): over the register budget with per-row scales");
    static_assert(!kUe8m0 || kFp8Out, "power-of-two scales are an FP8-output option");
    // FP8 output: the tile's 128 columns are one scale group (epilogue_fp8.cuh's tile helpers, one m64 wave per
    // math warpgroup).
    using Fp8Rows = Fp8Tile<BLOCK_M, 1>;
    static_assert(kLayout == GemmKind::GroupedContiguous || kLayout == GemmKind::GroupedContiguousPsum,
                  "the conversion kernel's layouts: contiguous (m_indices) and psum");
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "BLOCK_M = the layout's alignment: one m64 wave per warpgroup");
    static_assert(BLOCK_N == 128, "two stored 64-row waves per tile");
    static constexpr u32 BLOCK_K = 128;
    static constexpr u32 kNumKBlocks = SHAPE_K / BLOCK_K;
    static constexpr u32 kWaves = BLOCK_N / 64;
    static constexpr u32 kWavesPerExpert = SHAPE_N / 64;
    static constexpr u32 kNumMathWarpgroups = BLOCK_M / 64;
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumMathWarps = kNumMathThreads / 32;
    static constexpr u32 kNumThreads = kNumMathThreads + 128;
    static constexpr u32 kConvertWarps = 3;  // the producer warpgroup's warps 1..3
    static constexpr u32 kProducerRegisters = 40;
    static constexpr u32 kMathRegisters = kNumMathWarpgroups == 1 ? 240 : 232;
    static constexpr u32 kAccValues = WgmmaFragment<BLOCK_N>::kValues;
    static constexpr u32 kWaveValues = WgmmaFragment<64>::kValues;  // one stored wave's 64 columns
    // The conversion's units per K block: (wave, half, fragment warp) x 32 lanes, 16 bytes of codes each.
    static constexpr u32 kConvertUnits = kWaves * 2 * 4;
    // The pair-table entry {table(0), table(0)}: a per-32 wave's operand is e2m1 x 1.
    static constexpr u32 kUnscaledEntry = kNumTables * kShift0 + kShift0;
    static_assert(pair_table_word(kUnscaledEntry, 0) == kE4m3Tables[kShift0][0] &&
                      pair_table_word(kUnscaledEntry, 2) == kE4m3Tables[kShift0][0],
                  "the unscaled entry holds the shift-0 table twice");
    static_assert(SHAPE_K % BLOCK_K == 0 && SHAPE_N % BLOCK_N == 0, "K a multiple of 128, N of BLOCK_N");
    static_assert(kProducerRegisters * 128 + kMathRegisters * kNumMathThreads <= 65536, "register file is 64K");

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kSmemABytes = BLOCK_M * BLOCK_K;
    static constexpr u32 kSmemBBytes = BLOCK_N * BLOCK_K;
    static constexpr u32 kSmemRawBytes = kWaves * kWaveTileBytes;
    static constexpr u32 kSmemMetaBytes = round_up(kWaves * kWaveMetaBytes, 128u);
    static constexpr u32 kSmemSaBytes = round_up(BLOCK_M * 4u, 128u);
    static constexpr u32 kSmemSbBytes = kSubBlocks * BLOCK_N * 4;
    static constexpr u32 kSmemA = 0;
    static constexpr u32 kSmemB = kSmemA + kNumStages * kSmemABytes;
    static constexpr u32 kSmemRaw = kSmemB + kNumStages * kSmemBBytes;
    static constexpr u32 kSmemMeta = kSmemRaw + kNumStages * kSmemRawBytes;
    static constexpr u32 kSmemSa = kSmemMeta + kNumStages * kSmemMetaBytes;
    static constexpr u32 kSmemSb = kSmemSa + kNumStages * kSmemSaBytes;
    static constexpr u32 kSmemTables = kSmemSb + kNumStages * kSmemSbBytes;
    // FP8 output: the quads' amax partials (epilogue_fp8.cuh, [math warps][2][32] u32).
    static constexpr u32 kSmemRed = kSmemTables + kPairTableBytes;
    static constexpr u32 kSmemRedBytes = kFp8Out ? Fp8Rows::kAmaxBytes : 0u;
    static constexpr u32 kSmemRawBar = round_up(kSmemRed + kSmemRedBytes, 8u);
    static constexpr u32 kSmemFull = kSmemRawBar + 8 * kNumStages;
    static constexpr u32 kSmemEmpty = kSmemFull + 8 * kNumStages;
    static constexpr u32 kSmemBytes = kSmemEmpty + 8 * kNumStages;
    static constexpr u32 kRawTxBytes = kSmemRawBytes + kWaves * kWaveMetaBytes;
    static constexpr u32 kFullTxBytes = kSmemABytes + BLOCK_M * 4;
    static_assert(kSmemABytes % 1024 == 0 && kSmemBBytes % 1024 == 0, "tiles keep their swizzle patterns' alignment");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes + 1024 <= kMaxSmemWindow, "desc_advance needs shared addresses below 2^18");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/kernels/mxfp4_gemm.py: keep the two maps identical");

    using Pipe = PipelineState<kNumStages>;
    using Barriers = StageBarriers<8>;
    // The FP8 contiguous kernels' walk, their BLOCK_M being the alignment: the same blocks, groups and skips.
    using Scheduler = TileScheduler<kLayout, SHAPE_N, BLOCK_M, BLOCK_N, kNumGroups, 1, 1, 1, 1, BLOCK_M>;

    static DFG_DEVICE bool next_tile(Scheduler& scheduler, TileInfo& tile) {
        const bool more = scheduler.next(tile);
        tile.m_block = hal::warp_broadcast(tile.m_block);
        tile.n_block = hal::warp_broadcast(tile.n_block);
        tile.group = hal::warp_broadcast(tile.group);
        return hal::warp_all(more);
    }

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const Mxfp4Params& params) {
        u8* smem = hal::dynamic_smem();
        const Barriers raw{smem + kSmemRawBar}, full{smem + kSmemFull}, empty{smem + kSmemEmpty};
        const u32 thread = hal::thread_idx();
        const u32 warp = hal::warp_idx();
        const u32 lane = hal::lane_idx();

        if (thread == kNumMathThreads) {
            if (hal::smem_addr(smem) % 1024 != 0)
                hal::trap("dynamic shared memory is not 1024-byte aligned");
            hal::tma_prefetch(&params.tma_w);
            hal::tma_prefetch(&params.tma_a);
            hal::tma_prefetch(&params.tma_meta);
            hal::tma_prefetch(&params.tma_sa);
            for (u32 s = 0; s < kNumStages; ++s) {
                hal::mbar_init(&raw[s], 1);
                hal::mbar_init(&full[s], 1 + kConvertWarps);
                hal::mbar_init(&empty[s], kNumMathWarps);
            }
            hal::fence_view_async_shared();
            hal::fence_barrier_init();
        }
        // The pair tables: compile-time constants, no global read.
        for (u32 i = thread; i < kPairTableBytes / 4; i += kNumThreads)
            reinterpret_cast<u32*>(smem + kSmemTables)[i] = pair_table_word(i / 4, i % 4);
        hal::sync_threads();

        if (warp >= kNumMathWarps) {
            hal::setmaxnreg_dec<kProducerRegisters>();
            // PDL (deep_fp8_gemm.set_pdl): everything above touches only shared memory and the parameter block.
            hal::grid_dependency_wait();
            if (warp == kNumMathWarps) {
                if (hal::elect_one_sync()) {
                    produce(params, smem, raw, full, empty);
                    hal::launch_dependents();
                }
            } else {
                convert(params, smem, raw, full, warp - kNumMathWarps - 1, lane);
            }
        } else {
            hal::setmaxnreg_inc<kMathRegisters>();
            hal::grid_dependency_wait();
            consume(params, smem, full, empty, warp, lane);
        }
    }

    // ---------------------------------------------------------------- producer (one lane)
    static DFG_DEVICE void produce(const Mxfp4Params& params, u8* smem, Barriers raw, Barriers full, Barriers empty) {
        Scheduler scheduler(params.num_rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (scheduler.next(tile)) {
            if (tile.group >= kNumGroups)
                hal::trap("grouped layout names a group >= num_groups");
            const i32 m0 = static_cast<i32>(tile.m_block * BLOCK_M);
            pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 kb) {
                hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
                // the tile's kWaves consecutive records of (expert g, K block kb): [G][K/128][N/64] order
                const i32 wave = static_cast<i32>((tile.group * kNumKBlocks + kb) * kWavesPerExpert +
                                                  tile.n_block * kWaves);
                hal::mbar_arrive_expect_tx(&raw[stage], kRawTxBytes);
                hal::tma_load_3d(smem + kSmemRaw + stage * kSmemRawBytes, &params.tma_w, &raw[stage], 0, 0, wave);
                hal::tma_load_3d(smem + kSmemMeta + stage * kSmemMetaBytes, &params.tma_meta, &raw[stage], 0, 0, wave);
                hal::mbar_arrive_expect_tx(&full[stage], kFullTxBytes);
                hal::tma_load_3d(smem + kSmemA + stage * kSmemABytes, &params.tma_a, &full[stage],
                                 static_cast<i32>(kb * BLOCK_K), m0, 0);
                hal::tma_load_3d(smem + kSmemSa + stage * kSmemSaBytes, &params.tma_sa, &full[stage], m0,
                                 static_cast<i32>(kb), 0);
            });
        }
    }

    // ---------------------------------------------------------------- conversion warps
    // Warp `cw` (0..2) of the conversion: units u = cw, cw + 3, ... of each stage; unit u is (wave, half, fragment
    // warp) = (u / 8, (u / 4) % 2, u % 4) and lane l converts fragment thread t = 32 (u % 4) + l's 16 bytes of that
    // half: words j = 0..3, sub-block 2 half + j / 2, row r0 + 8 (j % 2) (r0 = 16 (u % 4) + l / 4), the low / high
    // 16 bits K 4q.. / 16 + 4q.. of the sub-block (q = l % 4), as mxfp4.cuh's stored form. Each becomes two 4-byte
    // e4m3 stores into the B tile: row n = 64 wave + r, K byte 32 s + 4q (+16), chunk (K / 16) ^ (n % 8) of the
    // 128-byte swizzle (n % 8 = l / 4). Then the tile's 128 rows' scales into sB (one row per lane, 32 cw + lane
    // and + 96), out of the unit loop so that its body is the conversion alone.
    static DFG_DEVICE void convert(const Mxfp4Params& params, u8* smem, Barriers raw, Barriers full, u32 cw, u32 lane) {
        const u8* tables = smem + kSmemTables;
        // Where a unit's stores land: chunk c' (0..3: sub-block 2 half + c' / 2, its low / high 16 K) of a half is the
        // row's 16-byte chunk (4 half + c') ^ x (x = n % 8 = lane / 4); the half's bit and the low two bits XOR apart,
        // so four per-thread offsets (row x's byte 4q included) and one per-unit term serve every unit.
        const u32 x = lane / 4;
        u32 chunk[4];
        DFG_UNROLL
        for (u32 c = 0; c < 4; ++c)
            chunk[c] = x * BLOCK_K + 4 * (lane % 4) + ((c ^ (x & 3u)) << 4);
        const u32 half_x = (x & 4u) << 4;
        Scheduler scheduler(params.num_rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (next_tile(scheduler, tile)) {
            pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 /*kb*/) {
                hal::mbar_wait(&raw[stage], phase, BarrierName{"raw", stage});
                const u8* codes = smem + kSmemRaw + stage * kSmemRawBytes;
                const u8* meta = smem + kSmemMeta + stage * kSmemMetaBytes;
                u8* b_tile = smem + kSmemB + stage * kSmemBBytes;
                float* sb = reinterpret_cast<float*>(smem + kSmemSb + stage * kSmemSbBytes);
                DFG_NO_UNROLL
                for (u32 u = cw; u < kConvertUnits; u += kConvertWarps) {
                    const u32 wave = u / 8, half = (u / 4) % 2, fw = u % 4;
                    const U32x4 words =
                        *reinterpret_cast<const U32x4*>(codes + wave * kWaveTileBytes + half * 2048 + 16 * (32 * fw + lane));
                    const u8* wave_meta = meta + wave * kWaveMetaBytes;
                    const WaveMeta m = WaveMeta::load(wave_meta, fw, lane);
                    const bool per32 = WaveMeta::per32(wave_meta);
                    const u32 w[4] = {words.x, words.y, words.z, words.w};
                    u8* base = b_tile + (wave * 64 + 16 * fw) * BLOCK_K + ((64 * half) ^ half_x);
                    DFG_UNROLL
                    for (u32 j = 0; j < 2; ++j) {  // rows r0, r0 + 8 (8 rows = 1024 bytes apart)
                        // The row's tables of sub-blocks 2 half, 2 half + 1: its pair-table entry, or a per-32
                        // wave's shift 0 for both (one select, no branch).
                        const u32 entry = per32 ? kUnscaledEntry : hal::prmt(m.row[j], 0u, 0x4440u | half);
                        const U32x4 t = *reinterpret_cast<const U32x4*>(tables + 16 * entry);
                        DFG_UNROLL
                        for (u32 i = 0; i < 2; ++i) {  // sub-blocks 2 half + i
                            u32 lo, hi;
                            convert_word(w[2 * i + j], i == 0 ? t.x : t.z, i == 0 ? t.y : t.w, lo, hi);
                            *reinterpret_cast<u32*>(base + 1024 * j + chunk[2 * i]) = lo;
                            *reinterpret_cast<u32*>(base + 1024 * j + chunk[2 * i + 1]) = hi;
                        }
                    }
                }
                // The per-row scales (sB, fp32): row r = 32 cw + lane (+ 96) of the tile's 128; its metadata word is
                // pair 8 (rr / 16) + rr % 8, half (rr / 8) % 2 of its wave's record (rr = r % 64).
                DFG_NO_UNROLL
                for (u32 r = 32 * cw + lane; r < BLOCK_N; r += 32 * kConvertWarps) {
                    const u32 rr = r % 64;
                    const u8* wave_meta = meta + (r / 64) * kWaveMetaBytes;
                    const u32 word = *reinterpret_cast<const u32*>(wave_meta + 8 * (8 * (rr / 16) + rr % 8) + 4 * ((rr / 8) % 2));
                    const WaveMeta m{{word, word}};
                    if (WaveMeta::per32(wave_meta)) {
                        DFG_UNROLL
                        for (u32 s = 0; s < kSubBlocks; ++s)
                            sb[s * BLOCK_N + r] = m.sub_block_scale(0, s);
                    } else {
                        sb[r] = m.block_scale(0);
                    }
                }
                // The B tile was written through the generic proxy; the wgmma reads it through the async proxy.
                hal::fence_view_async_shared();  // the converted B tile to the async proxy
                // Lane 0 arrives for the warp: every lane's stores (and fence) are ordered before it.
                hal::warp_sync();
                if (lane == 0)
                    hal::mbar_arrive(&full[stage]);
            });
        }
    }

    // ---------------------------------------------------------------- math warpgroups
    // One stored wave's 64 columns of the general loop: the k32 wgmmas of sub-blocks [s0, s1) (m64n64k32) chained
    // into `part` (a fresh sum), awaited, promoted by the wave's scales sb_wave (sB row of those sub-blocks' scale,
    // this thread's first column) x sA: into += part * (sb x sA).
    static DFG_DEVICE void wave_block(u64 a_desc, u32 a_lo, u64 b_desc, u32 b_wave, float (&part)[kWaveValues],
                                      float (&into)[kWaveValues], u32 s0, u32 s1, const float* sb_wave, float sa_lo,
                                      float sa_hi) {
        DFG_UNROLL
        for (u32 i = 0; i < kWaveValues; ++i)
            hal::fence_operand(part[i]);
        hal::wgmma_fence();
        DFG_UNROLL
        for (u32 s = s0; s < s1; ++s)
            hal::WgmmaFp8<64>::mma(desc_with_low_word(a_desc, a_lo + ((s * kWgmmaK) >> 4)),
                                   desc_with_low_word(b_desc, b_wave + ((s * kWgmmaK) >> 4)), part, s > s0);
        hal::wgmma_commit();
        RowScalesB<64> sb_cols;
        sb_cols.load(sb_wave);
        WaveScales<64> scales;
        scales.combine(sb_cols, sa_lo, sa_hi);
        hal::wgmma_wait<0>();
        DFG_UNROLL
        for (u32 i = 0; i < kWaveValues; ++i)
            hal::fence_operand(part[i]);
        promote_row_scaled<64>(into, part, scales);
    }

    static DFG_DEVICE void consume(const Mxfp4Params& params, u8* smem, Barriers full, Barriers empty, u32 warp,
                                   u32 lane) {
        const u32 wg = kNumMathWarpgroups == 1 ? 0u : warp / 4;
        const u32 warp_in_wg = warp % 4;
        const u32 frag_row = hal::pin(warp_in_wg * 16 + lane / 4);  // inside the warpgroup's 64 rows
        const u32 frag_col = hal::pin(2 * (lane % 4));
        const u64 smem_desc = make_k_major_sw128_desc(hal::smem_addr(smem));
        const u64 a_desc = desc_advance(smem_desc, kSmemA + wg * 64 * BLOCK_K) | (static_cast<u64>(warp >> 5) << 32);
        const u64 b_desc = desc_advance(smem_desc, kSmemB) | (static_cast<u64>(warp >> 6) << 32);
        const u32 a_lo0 = hal::warp_broadcast(static_cast<u32>(a_desc));
        const u32 b_lo0 = hal::warp_broadcast(static_cast<u32>(b_desc));

        float acc[kAccValues];
        float scratch[kAccValues];
        // NOTES: the general loop's m64n64 sums in an array of their own: in halves of `scratch` (the folded loop's
        // m64n128 accumulator), or both waves' in its first half, ptxas serialised every wgmma of the kernel (C7511,
        // "insufficient register resources for the wgmma pipeline"; NVRTC 13.5).
        float part[kWaveValues];

        Scheduler scheduler(params.num_rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (next_tile(scheduler, tile)) {
            DFG_UNROLL
            for (u32 i = 0; i < kAccValues; ++i)
                acc[i] = 0.0f;
            // The tile's path, uniform over the CTA: any wave with a per-32 block anywhere in K takes the general loop.
            bool general = false;
            DFG_UNROLL
            for (u32 w = 0; w < kWaves; ++w)
                general |= params.wave_per32[tile.group * kWavesPerExpert + tile.n_block * kWaves + w] != 0;
            if (!general) {  // folded: the 1D1D kernel's K block (fp8_gemm.cuh consume, kRowScaledB)
                pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 /*kb*/) {
                    const u32 a_lo = a_lo0 + stage * (kSmemABytes >> 4);
                    const u32 b_lo = b_lo0 + stage * (kSmemBBytes >> 4);
                    hal::mbar_wait(&full[stage], phase, full_barrier(stage));
                    const float* sa = reinterpret_cast<const float*>(smem + kSmemSa + stage * kSmemSaBytes);
                    const float* sb = reinterpret_cast<const float*>(smem + kSmemSb + stage * kSmemSbBytes);
                    DFG_UNROLL
                    for (u32 i = 0; i < kAccValues; ++i)
                        hal::fence_operand(scratch[i]);
                    hal::wgmma_fence();
                    DFG_UNROLL
                    for (u32 ks = 0; ks < BLOCK_K / kWgmmaK; ++ks)
                        hal::WgmmaFp8<BLOCK_N>::mma(desc_with_low_word(a_desc, a_lo + ((ks * kWgmmaK) >> 4)),
                                                    desc_with_low_word(b_desc, b_lo + ((ks * kWgmmaK) >> 4)), scratch,
                                                    ks > 0);
                    hal::wgmma_commit();
                    RowScalesB<BLOCK_N> sb_cols;
                    sb_cols.load(sb + frag_col);
                    WaveScales<BLOCK_N> scales;
                    scales.combine(sb_cols, sa[wg * 64 + frag_row], sa[wg * 64 + frag_row + 8]);
                    hal::wgmma_wait<0>();
                    DFG_UNROLL
                    for (u32 i = 0; i < kAccValues; ++i)
                        hal::fence_operand(scratch[i]);
                    hal::warp_sync();
                    if (lane == 0)
                        hal::mbar_arrive(&empty[stage]);
                    promote_row_scaled<BLOCK_N>(acc, scratch, scales);
                });
            } else {  // general: per K block and stored wave (64 columns), the recorded path
                pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 /*kb*/) {
                    const u32 a_lo = a_lo0 + stage * (kSmemABytes >> 4);
                    const u32 b_lo = b_lo0 + stage * (kSmemBBytes >> 4);
                    hal::mbar_wait(&full[stage], phase, full_barrier(stage));
                    const float* sa = reinterpret_cast<const float*>(smem + kSmemSa + stage * kSmemSaBytes);
                    const float* sb = reinterpret_cast<const float*>(smem + kSmemSb + stage * kSmemSbBytes);
                    const u8* meta = smem + kSmemMeta + stage * kSmemMetaBytes;
                    const float sa_lo = sa[wg * 64 + frag_row], sa_hi = sa[wg * 64 + frag_row + 8];
                    DFG_UNROLL
                    for (u32 w = 0; w < kWaves; ++w) {
                        float (&into)[kWaveValues] = *reinterpret_cast<float(*)[kWaveValues]>(&acc[w * kWaveValues]);
                        const u32 b_wave = b_lo + ((w * 64 * BLOCK_K) >> 4);
                        const float* sb_wave = sb + w * 64 + frag_col;
                        if (!WaveMeta::per32(meta + w * kWaveMetaBytes)) {
                            wave_block(a_desc, a_lo, b_desc, b_wave, part, into, 0, kSubBlocks, sb_wave, sa_lo, sa_hi);
                        } else {  // each k32 sum promoted by its own scale
                            DFG_UNROLL
                            for (u32 s = 0; s < kSubBlocks; ++s)
                                wave_block(a_desc, a_lo, b_desc, b_wave, part, into, s, s + 1, sb_wave + s * BLOCK_N,
                                           sa_lo, sa_hi);
                        }
                    }
                    hal::warp_sync();
                    if (lane == 0)
                        hal::mbar_arrive(&empty[stage]);
                });
            }
            if constexpr (kFp8Out)
                store_fp8(params, tile, wg, lane, frag_row,
                          reinterpret_cast<u32*>(smem + kSmemRed) + warp * Fp8Rows::kPartials * 32, acc);
            else
                store(params, tile, wg, warp_in_wg, lane, acc);
        }
    }

    // FP8 output: D[r, n] e4m3 = RNE(x * fl(1 / s_r)) with s_r the row's 1x128 scale (epilogue_fp8.cuh's rule, the
    // register-A kernel's store_fp8 numerics): the quad's amax through `partials` (this warp's slice), one reciprocal
    // per row; 2-byte plain stores of the column pairs, lane % 4 == 0 stores the row's scale at
    // sd[n_block * sd_rows + r] (D's scale group = the tile's n-block: BLOCK_N 128).
    static DFG_DEVICE void store_fp8(const Mxfp4Params& params, const TileInfo& tile, u32 wg, u32 lane, u32 frag_row,
                                     u32* partials, const float (&acc)[kAccValues]) {
        const float (&v)[1][kAccValues] = *reinterpret_cast<const float(*)[1][kAccValues]>(&acc);
        float scale[1][2];
        hal::warp_sync();  // the previous tile's reads of the partials before these writes
        Fp8Rows::template row_scales<kUe8m0>(partials, lane, v, scale);
        u8* d = params.d + tile.n_block * BLOCK_N + 2 * (lane % 4);
        DFG_UNROLL
        for (u32 h = 0; h < 2; ++h) {
            const u32 row = tile.m_block * BLOCK_M + wg * 64 + frag_row + 8 * h;
            if (row >= params.num_rows)
                continue;
            const float inv = 1.0f / scale[0][h];
            DFG_UNROLL
            for (u32 j = 0; j < BLOCK_N / 8; ++j)
                *reinterpret_cast<u16*>(d + static_cast<u64>(row) * SHAPE_N + 8 * j) =
                    hal::pack_e4m3x2(v[0][4 * j + 2 * h] * inv, v[0][4 * j + 2 * h + 1] * inv);
            if (lane % 4 == 0)
                params.sd[static_cast<u64>(tile.n_block) * params.sd_rows + row] = scale[0][h];
        }
        hal::warp_sync();
    }

    // The tile's bf16 values to D[M_sum][N]: rows m_block BLOCK_M + 64 wg + frag_row (+ 8), below M_sum; a thread's
    // column pair (8j + 2 (lane % 4), + 1) as one 4-byte store.
    static DFG_DEVICE void store(const Mxfp4Params& params, const TileInfo& tile, u32 wg, u32 warp_in_wg, u32 lane,
                                 const float (&acc)[kAccValues]) {
        u16* d = reinterpret_cast<u16*>(params.d) + tile.n_block * BLOCK_N + 2 * (lane % 4);
        DFG_UNROLL
        for (u32 h = 0; h < 2; ++h) {
            const u32 row = tile.m_block * BLOCK_M + wg * 64 + warp_in_wg * 16 + lane / 4 + 8 * h;
            if (row >= params.num_rows)
                continue;
            DFG_UNROLL
            for (u32 j = 0; j < BLOCK_N / 8; ++j)
                *reinterpret_cast<u32*>(d + static_cast<u64>(row) * SHAPE_N + 8 * j) =
                    hal::pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
        // Reconverge after the lane-dependent bounds checks: the next tile's K loop stays on the uniform datapath.
        hal::warp_sync();
    }
};

}  // namespace mxfp4
}  // namespace dfg
