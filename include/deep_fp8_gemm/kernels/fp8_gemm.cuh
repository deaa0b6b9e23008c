// The FP8 GEMM skeleton with fine-grained scaling, every kind of config.KINDS instantiated from it:
//   bf16 kinds (dense, contiguous, masked, psum; "1D2D"):
//       D[m, n] (bf16) = sum_kb (A[m, kb] . B[n, kb]^T) * sA[m, kb] * sB[n/128, kb]
//       A: e4m3 [rows, K] K-major with 1x128 scales sA (fp32, M-major, TMA-aligned); B: e4m3 [G, N, K] K-major with
//       128x128 scales sB (fp32 [G, ceil(N/128), ceil(K/128)]).
//   fp32 kinds (1d1d, k_grouped; "1D1D", policy_1d1d.cuh / policy_k_grouped.cuh):
//       D[m, n] (fp32) = C[m, n] + sum_kb (A[m, kb] . B[n, kb]^T) * sA[m, kb] * sB[n, kb], both 1x128 per-row
//       scales; k-grouped: per group g, with K_g a run-time value (per-group maps of A_g / B_g).
//   FP8-output kinds (dense / contiguous / masked / psum _fp8out; the kind's layout_of gives its tiles):
//       (D, sD) = per_token_cast_to_fp8 of the bf16 kinds' fp32 accumulators, multiplying by the reciprocal of the
//       scale instead of dividing (epilogue_fp8.cuh's numerics), in the epilogue (Fp8TmaStore, epilogue_fp8.cuh):
//       D e4m3 [rows, N], sD [rows, ceil(N/128)] M-major. BLOCK_N = 128: one scale group.
//   SwiGLU kinds (contiguous_swiglu, masked_swiglu; policy_swiglu.cuh): B = w13 with its gate and up 128-row
//       blocks interleaved, N = 2I; (D, sD) = the same quantisation of SiLU(gate) * up, D [rows, I].
// N, K and every tile size are compile-time constants; the row count m is a run-time argument, so one binary
// serves every m (k-grouped: every ks).
//
// Warp roles (kNumThreads = 128 * (kNumMathWarpgroups + 1)):
//   threads [0, 128 * kNumMathWarpgroups)   math warpgroups; warpgroup w owns tile rows
//                                           [w * kWgRows, (w + 1) * kWgRows), kWavesM m64 slices.
//                                           setmaxnreg.inc to kMathRegisters (232 with two math
//                                           warpgroups, 240 with one; = config.math_registers by static_assert).
//   last 128 threads                        producer warpgroup; one lane of its first warp, picked by
//                                           elect.sync, issues every TMA load.
//                                           setmaxnreg.dec to kProducerRegisters (40; = config.PRODUCER_REGISTERS).
//                                           The audit checks that the launch allocation fits this split.
//
// Per family (B's scales, the stage, the output; the policies are FamilyOf / output.cuh):
//
//   family       full[s] arrive count              stage tx bytes (kStageTxBytes)      sB in the stage
//   bf16 kinds   2: arrive.expect_tx + the          A tile + B tile + sA slice          16 bytes: the K block's
//                producer's cp.async arrive once                                      value of the tile's first
//                its sB copies landed                                                 scale block and the next
//   fp32 kinds   1: arrive.expect_tx                A + B + sA + sB slice (BLOCK_N      BLOCK_N fp32 row scales
//                                                   floats, TMA through tma_sb)          (TMA destination)
//
//   family       shared memory (dynamic, 1024-aligned; kSmem* offsets; = config.smem_bytes by static_assert)
//   bf16 kinds   D tile (bf16, BLOCK_N/16 swizzled 16-column chunks) | A stages | B stages |
//                per stage a record {sA | sB | full barrier | empty barrier} (128-byte multiple); sA is BLOCK_M
//                floats, or [BLOCK_M][4] where the masked kind reads a K- or G-major sA (kSaMajor, fp8_einsum's sx
//                where it lies; scales.cuh ScaleMajor: row r's scale at float 4 r, the stage's tx bytes with it)
//   fp32 kinds   A stages | B stages | per stage a record {sA | sB} | full barriers | empty barriers (no D tile:
//                D is written from registers)
//
//   FP8 kinds    D tile (e4m3 [BLOCK_M][128], 128-byte swizzle) + amax partials ([math warps][2 kWavesM][32] u32) |
//                A stages | B stages | records as the bf16 kinds (the SwiGLU kinds: BLOCK_N = 256 B rows)
//
//   family       epilogue (output.cuh)
//   bf16 kinds   Bf16TmaStore: stmatrix into the D tile, one TMA store per 16-column chunk, awaited before the
//                next tile's epilogue; dense split-K first SplitKReduce (split_k.cuh: the partial to the workspace,
//                the tile's last split sums all and goes on)
//   fp32 kinds   Fp32Accumulate: D = C + acc from the fragments, 8-byte global accesses, C may alias D
//   swap-AB      Bf16TransposedStore (policy_swap_ab.cuh, dense m <= 32): the transposed fragments into a
//                [BLOCK_M][BLOCK_N] bf16 tile, one unswizzled TMA box; split-K reduces first. The stages are the
//                plain kernel's; the wgmma reads the B stage as its A operand (BLOCK_N / 64 waves) and the A stage as
//                its B (N = BLOCK_M tokens), and promotes with one sB per wave and one sA per column
//   FP8 kinds    Fp8TmaStore (SwiGLU first: acc[w][i] = SiLU(acc[w][i]) * acc[w][64 + i]): per-row amax of the
//                thread's 32 values -> quad exchange through shared memory under bar.warp.sync -> scales ->
//                e4m3 into the D tile -> one TMA store per warpgroup (same named-barrier bracket and store wait
//                as Bf16TmaStore); lane % 4 == 0 stores the quad's scales; dense_fp8out split-K reduces first
//
// Barriers (shared memory, one pair per stage; the ring is pipeline.cuh):
//   full[s]   producer -> math: the arrive count and transaction bytes of the table above, whoever of the
//             cluster issued the copies (a multicasting peer's copies signal this CTA's barrier too).
//   empty[s]  math -> producers of the cluster. Arrive count kClusterSize * kNumMathWarps: after its
//             wgmma.wait (fp32 kinds: after the last wave's promotion, which reads sB from the stage), lane
//             r < kClusterSize of every math warp arrives on CTA r's empty[s], because a multicasting peer
//             writes into this CTA's stage s too.
//   named barriers 1 + w: the 128 threads of math warpgroup w around the epilogue's shared tile, and the split-K
//             reduce's arrival vote. No barrier spans two warpgroups: every exchange of the epilogues stays inside
//             one (the FP8 amax inside one quad of one warp: bar.warp.sync).
//
// Register budget and the SwiGLU tiling (policy_swiglu.cuh). A math thread holds kWavesM x BLOCK_N / 2 accumulator
// floats plus one wgmma's scratch (kMmaN / 2); with ~40-56 registers of addresses, scales and scheduler state the
// budget is 240 (one math warpgroup) or 232 (two). A 1x128 SwiGLU output group needs 256 accumulator columns (its
// gate and up) in one CTA. Options: (a) one m64n256 wgmma per wave: acc 128 + scratch 128 = 256 floats, over budget
// (no tile fits); (b) the two warpgroups split N (gate | up) over the same rows: 64 + 64 per thread, but SiLU * up
// then needs the up half moved across warpgroups (a 32-64 KB fp32 exchange in shared memory, stages lost, and a
// 256-thread barrier per tile); (c) chunked scratch: BLOCK_N = 256, the wave's two 128-column halves as two
// m64n128 wgmma chunks into one 64-float scratch, each promoted with its own sB block (kMmaN = 128, kMmaChunks =
// 2): acc 128 + scratch 64 = 192 floats, gate and up of a (row, column) in the same thread (no exchange at all).
// (c) is taken, with one m64 wave per warpgroup (BLOCK_M 64: one warpgroup at 240, BLOCK_M 128: two at 232; a
// second wave would need 256 + 64). It compiles spill-free (audit: contiguous_swiglu / masked_swiglu), and the
// chunk loop issues the same 8 wgmmas per K block as a 128 x 256 tile of two 128-column waves would; per 128
// columns the loop costs what a 128 x 128 bf16 tile's does (the audit's issue per tensor cycle 0.37 vs 0.41).
// Every other kind has kMmaChunks = 1: its SASS is unchanged by the chunk loop (nvdisasm, checked on audited kernels).
//
// Producers: the bf16 kinds and 1d1d walk TileScheduler's tiles, the k-grouped kind KGroupedScheduler's (groups x
// tiles, run-time trip counts, per-group maps fenced with fence.proxy.tensormap::generic.acquire before first use);
// both walk the ring with PipelineState::for_each_use, as the math warps do.
//
// Math per 128-wide K block and m64 wave: 4 x wgmma m64nBLOCK_Nk32 into a scratch accumulator (scale-d = 0
// on the first), wait, release the stage (after the last wave), then promote on the CUDA cores:
// acc += scratch * sA[row] * sB[col block] (promotion.cuh; fp32 kinds: per column, policy_1d1d.cuh, their
// scales read from the stage and multiplied, sA x sB, between the commit and the wait). The tensor
// cores never sum more than 128 products, which keeps FP8 GEMMs accurate (their internal accumulator keeps ~14
// bits of alignment; see ANCHORS.md, "two-level accumulation").
//
// NOTES (issue per K block, measured by the audit's K-loop analysis, deep_fp8_gemm/runtime/kloop.py):
// both K loops are one loop body per K block (PipelineState::for_each_use: an unrolled ring costs the
// compiler ~0.03-0.1 s per stage; the ring is walked in passes of one phase, so the phase and the wrap are
// per pass, not per K block); every stage-dependent address and descriptor word is one multiply-add of
// the stage index (sA, sB and the 1D2D barriers share one: the stage records), which ptxas keeps on the
// uniform datapath because the tile loop's exit is a warp vote (next_tile) and the loop-invariant bases are
// pinned in registers (consume); descriptors are patched in their low word only; the scale-straddle segment
// picks are bit masks (promotion.cuh SegmentMasks); sB sits in shared memory next to sA (copied by the
// producer with cp.async), so the math loop has no global loads; which sB block a column uses is fixed at
// compile time except for at most 128 / gcd(BLOCK_N, 128) - 1 segments (scales.cuh); the grouped kinds
// broadcast scheduler values from lane 0 so that control flow and descriptors stay on the uniform datapath.
#pragma once
#include "../common.cuh"
#include "../gemm_params.cuh"
#include "../hal.cuh"
#include "../kinds.cuh"
#include "../mma.cuh"
#include "../output.cuh"
#include "../pipeline.cuh"
#include "../policy_1d1d.cuh"
#include "../policy_block32.cuh"
#include "../policy_k_grouped.cuh"
#include "../policy_swap_ab.cuh"
#include "../promotion.cuh"
#include "../scales.cuh"
#include "../scheduler.cuh"
#include "../split_k.cuh"
#include "../tma.cuh"

namespace dfg {

template <GemmKind kKind, u32 SHAPE_N, u32 SHAPE_K, u32 BLOCK_M, u32 BLOCK_N, u32 kNumStages, u32 kNumGroups,
          u32 kClusterM, u32 kClusterN, u32 kNumMathWarpgroups, u32 kBandWidth, u32 kExpectedSmemBytes,
          u32 kExpectedMathRegisters, u32 kExpectedProducerRegisters, u32 kSplitK = 1, bool kUe8m0 = false,
          bool kSwapAB = false, u32 kPsumAlignment = 128, ScaleMajor kSaMajor = ScaleMajor::M>
struct Fp8GemmKernel {
    // ---------------------------------------------------------------- shape of the work
    static constexpr u32 BLOCK_K = 128;
    static constexpr u32 kNumKBlocks = ceil_div(SHAPE_K, BLOCK_K);
    static constexpr u32 kKBlocksPerSplit = kNumKBlocks / kSplitK;  // K blocks of one split (split_k.cuh)
    static constexpr u32 kNumScaleBlocksN = ceil_div(SHAPE_N, 128u);
    static constexpr u32 kClusterSize = kClusterM * kClusterN;
    static constexpr bool kMulticastA = kClusterN == 2;
    static constexpr bool kMulticastB = kClusterM == 2;
    // The wgmma tile: its M side (rows of the fragments, m64 waves) and N side. Swap-AB (policy_swap_ab.cuh) computes
    // the tile transposed: the weights' BLOCK_N rows on the M side, the tokens' BLOCK_M on the N side.
    static constexpr u32 kMmaRows = kSwapAB ? BLOCK_N : BLOCK_M;
    static constexpr u32 kMmaCols = kSwapAB ? BLOCK_M : BLOCK_N;
    static constexpr u32 kWgRows = kMmaRows / kNumMathWarpgroups;
    static constexpr u32 kWavesM = kWgRows / 64;
    static constexpr u32 kAccValues = WgmmaFragment<kMmaCols>::kValues;
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumMathWarps = kNumMathThreads / 32;
    static constexpr u32 kNumThreads = kNumMathThreads + 128;
    static constexpr u32 kProducerRegisters = 40;
    static constexpr u32 kMathRegisters = kNumMathWarpgroups == 1 ? 240 : 232;
    // Family policies (policy_1d1d.cuh): how B is scaled, what the output is.
    static constexpr bool kRowScaledB = FamilyOf<kKind>::kRowScaledB;
    static constexpr bool kFp32Accumulate = FamilyOf<kKind>::kFp32Accumulate;
    static constexpr bool kKGrouped = FamilyOf<kKind>::kKGrouped;  // run-time K per group (policy_k_grouped.cuh)
    static constexpr GemmKind kLayout = FamilyOf<kKind>::kLayout;    // how tiles are enumerated (common.cuh)
    static constexpr bool kFp8Output = FamilyOf<kKind>::kFp8Output;  // e4m3 D + 1x128 scales (output.cuh)
    static constexpr bool kSwiglu = FamilyOf<kKind>::kSwiglu;        // SiLU(gate) * up first (policy_swiglu.cuh)
    static constexpr bool kBlock32 = FamilyOf<kKind>::kBlock32;      // 1x32 / 32x32 scales (policy_block32.cuh)
    // The 1x32 recipe's tile constants (a placeholder instantiation for the other kinds).
    using B32 = typename Select<kBlock32, Block32<BLOCK_M, BLOCK_N>, Block32<64, 32>>::type;
    static constexpr u32 kNumScaleBlocksN32 = ceil_div(SHAPE_N, 32u);  // sB rows of the 1x32 recipe
    static constexpr u32 kNumSlicesK = ceil_div(SHAPE_K, 32u);        // sA / sB columns of the 1x32 recipe
    // Columns of one wgmma: the whole tile, or a chunk of it (the SwiGLU kinds: gate, then up; policy_swiglu.cuh).
    static constexpr u32 kMmaN = kSwiglu ? kSwigluMmaN : kMmaCols;
    static constexpr u32 kMmaChunks = kMmaCols / kMmaN;
    static constexpr u32 kMmaValues = WgmmaFragment<kMmaN>::kValues;  // the scratch accumulator
    static constexpr u32 SHAPE_N_OUT = kSwiglu ? SHAPE_N / 2 : SHAPE_N;  // D's columns
    // sA's global layout (scales.cuh ScaleMajor) and the floats between two rows' scales in a stage: 1, or 4 where
    // the box's unit-stride dimension is not the rows (fp8_einsum's sx read where it lies).
    static constexpr u32 kSaPitch = scale_row_pitch(kSaMajor);

    static_assert(SHAPE_N % 8 == 0 && SHAPE_K % 16 == 0, "TMA needs 16-byte row strides: N % 8 == 0, K % 16 == 0");
    static_assert(kSwapAB ? (BLOCK_M % 8 == 0 && BLOCK_M >= 8 && BLOCK_M <= 32)
                          : (BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 256),
                  "BLOCK_M in {64, 128, 256}; swap-AB: the tokens of the tile, 8, 16, 24 or 32");
    static_assert(!kSwapAB || (kKind == GemmKind::Dense && kClusterSize == 1 && kNumMathWarpgroups == 1 &&
                               (BLOCK_N == 64 || BLOCK_N == 128)),
                  "swap-AB: the dense bf16 kind, no clusters, one math warpgroup of BLOCK_N / 64 waves (64 or 128)");
    static_assert(kNumMathWarpgroups == 1 || kNumMathWarpgroups == 2, "one or two math warpgroups");
    static_assert(kWgRows % 64 == 0 && kWavesM >= 1 && kWavesM <= 2, "each warpgroup owns 64 or 128 rows");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 256, "BLOCK_N: multiple of 16 in [16, 256]");
    static_assert((kLayout != GemmKind::Dense && kLayout != GemmKind::Dense1D1D) || kNumGroups == 1,
                  "dense GEMM has one group");
    static_assert(!kRowScaledB || kClusterSize == 1, "1D1D: no multicast (the sB slice is not multicast)");
    static_assert((kLayout != GemmKind::GroupedContiguous && kLayout != GemmKind::GroupedContiguousPsum) ||
                      BLOCK_M <= 128,
                  "contiguous layout pads experts to 128 rows: a block must not straddle two experts");
    static_assert(kMmaCols % kMmaN == 0 && kMmaChunks <= 2 && (kMmaChunks == 1 || (!kRowScaledB && kMmaN == 128)),
                  "MMA chunks: at most two of 128 columns, each inside one sB block");
    static_assert(!kFp8Output || (BLOCK_N == (kSwiglu ? kSwigluBlockN : 128u) && SHAPE_N_OUT % 16 == 0),
                  "FP8 output: one 128-column output group per tile (SwiGLU: gate | up), 16-byte e4m3 D rows");
    static_assert(!kSwiglu || (SHAPE_N % kSwigluBlockN == 0 && kWavesM == 1),
                  "SwiGLU: N = 2I with I % 128 == 0; one m64 wave per warpgroup (register budget, see above)");
    static_assert(!kUe8m0 || kFp8Output, "power-of-two scales are an FP8-output option");
    static_assert(kSaMajor == ScaleMajor::M || (kKind == GemmKind::GroupedMasked && !kSwapAB),
                  "a K- or G-major sA: the masked bf16 kind (its 3-D sA map; config.check_config)");
    static_assert(kNumStages >= 2, "at least two stages to overlap loads with math");
    static_assert(!kBlock32 || (kSplitK == 1 && !kSwapAB && kWavesM == 1 && kMmaChunks == 1 && !kFp8Output),
                  "the 1x32 recipe: bf16 out, no split-K or swap-AB, one m64 wave per math warpgroup");
    static_assert(kProducerRegisters * 128 + kMathRegisters * kNumMathThreads <= 65536, "register file is 64K");
    static_assert(kMathRegisters == kExpectedMathRegisters && kProducerRegisters == kExpectedProducerRegisters,
                  "the setmaxnreg split disagrees with deep_fp8_gemm/config.py (math_registers, PRODUCER_REGISTERS)");

    // Block columns [n0, n0 + BLOCK_N) with n0 a multiple of BLOCK_N start at most 128 - gcd(BLOCK_N, 128)
    // into a 128-column scale block, so they touch at most two scale blocks iff
    // BLOCK_N <= 128 + gcd(BLOCK_N, 128) (144 and 160 qualify, 176 does not). The promotion relies on it.
    static_assert(BLOCK_N <= 128 + gcd(BLOCK_N, 128u), "a block's columns must touch at most two sB blocks");

    using Scheduler = typename Select<kKGrouped,
                                      KGroupedScheduler<SHAPE_N, BLOCK_M, BLOCK_N, kNumGroups, kBandWidth, true>,
                                      TileScheduler<kLayout, SHAPE_N, BLOCK_M, BLOCK_N, kNumGroups, kClusterM,
                                                    kClusterN, kBandWidth, kSplitK, kPsumAlignment>>::type;
    // The math warps' walk: the same tiles; the k-grouped one without the producer's K check (policy_k_grouped.cuh).
    using MathScheduler = typename Select<kKGrouped,
                                          KGroupedScheduler<SHAPE_N, BLOCK_M, BLOCK_N, kNumGroups, kBandWidth, false>,
                                          Scheduler>::type;
    using Split = SplitK<kSplitK, kNumKBlocks, kLayout, kClusterM * kClusterN, kNumMathWarpgroups, kMmaRows, kMmaCols>;
    using Scales = ScaleColumns<BLOCK_N, kNumScaleBlocksN>;
    using Pipe = PipelineState<kNumStages>;
    // Where a finished tile goes (output.cuh): the family's output, after the split-K reduce when K is split.
    using Bf16Output = typename Select<kSwapAB, Bf16TransposedStore<SHAPE_N, BLOCK_M, BLOCK_N, kWavesM>,
                                       Bf16TmaStore<kLayout, SHAPE_N, BLOCK_M, BLOCK_N, kWavesM>>::type;
    using TileOutput = typename Select<
        kFp8Output, Fp8TmaStore<kLayout, SHAPE_N_OUT, BLOCK_M, BLOCK_N, kWavesM, kSwiglu, kUe8m0>, Bf16Output>::type;
    using Output = typename Select<
        kFp32Accumulate, Fp32Accumulate<kKGrouped, SHAPE_N, BLOCK_M, BLOCK_N, kWavesM>,
        typename Select<(kSplitK > 1), SplitKReduce<Split, Scheduler::kNumNBlocks, TileOutput>, TileOutput>::type>::type;

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kSmemD = 0;
    static constexpr u32 kSmemDBytes = Output::kSmemBytes;  // the output's shared tile (0 for the fp32 kinds)
    static constexpr u32 kSmemABytes = BLOCK_M * BLOCK_K;  // one stage; 1024-byte multiple
    static constexpr u32 kSmemBBytes = BLOCK_N * BLOCK_K;
    // 1x32 recipe: the stage's four sA columns (policy_block32.cuh).
    static constexpr u32 kSmemSABytes = kBlock32 ? B32::kSmemSABytes : round_up(BLOCK_M * 4u * kSaPitch, 128u);
    // 1D2D: sB of scale blocks block0 and block1 (8 bytes used); 1D1D: the K block's BLOCK_N row scales of B; the
    // 1x32 recipe: the scale warps' sA x sB products.
    static constexpr u32 kSmemSBBytes =
        kRowScaledB ? RowScalesB<BLOCK_N>::kSmemBytes : kBlock32 ? B32::kSmemProductBytes : 16u;
    static constexpr u32 kSmemA = kSmemD + kSmemDBytes;
    static constexpr u32 kSmemB = kSmemA + kNumStages * kSmemABytes;
    // The rest of a stage is one record per stage, kSmemRecordBytes apart (a multiple of 128: sA is a TMA
    // destination): sA, sB and, for the 1D2D kinds, the stage's full and empty barriers. Everything the K loop
    // addresses per stage but the operand tiles is then one offset from one base: the 1D2D math loop derives
    // one address per K block instead of three (2 instructions per K block). 1D1D keeps the barriers in arrays
    // of their own after the records.
    // NOTES: with the barriers in its records, ptxas re-formed the shared window's base (S2UR SR_CgaCtaId) in
    // every K block of the 1D1D 128x128 kernel, 2 instructions more than it saved; sA and sB alone, both 512
    // bytes there, already come from one address.
    static constexpr bool kBarriersInRecord = !kRowScaledB;
    static constexpr u32 kSmemSA = kSmemB + kNumStages * kSmemBBytes;  // stage 0's record
    static constexpr u32 kSmemSB = kSmemSA + kSmemSABytes;
    // 1x32: the scale warps' staging and the producer's header (Block32Header), then the full, empty and scales
    // barriers.
    static constexpr u32 kRecordBarrierBytes =
        kBarriersInRecord ? (kBlock32 ? B32::kStagingBytes + B32::kHeaderBytes + 24u : 16u) : 0u;
    static constexpr u32 kSmemRecordBytes = round_up(kSmemSABytes + kSmemSBBytes + kRecordBarrierBytes, 128u);
    static constexpr u32 kSmemRecordsEnd = kSmemSA + kNumStages * kSmemRecordBytes;
    static constexpr u32 kSmemHeader = kSmemSB + kSmemSBBytes + B32::kStagingBytes;  // the 1x32 recipe's Block32Header
    static constexpr u32 kSmemFull =
        kBarriersInRecord ? kSmemSB + kSmemSBBytes + (kBlock32 ? B32::kStagingBytes + B32::kHeaderBytes : 0u)
                          : kSmemRecordsEnd;
    static constexpr u32 kSmemEmpty = kSmemFull + (kBarriersInRecord ? 8u : kNumStages * 8u);
    static constexpr u32 kSmemScales = kSmemEmpty + 8u;  // the 1x32 recipe's scales barrier (in the record)
    using Barriers = StageBarriers<kBarriersInRecord ? kSmemRecordBytes : 8u>;
    // The wgmma's operands: A (its M side) and B (its N side) stages; swap-AB reads the B stages as A and v.v.
    static constexpr u32 kSmemOpA = kSwapAB ? kSmemB : kSmemA;
    static constexpr u32 kSmemOpABytes = kSwapAB ? kSmemBBytes : kSmemABytes;
    static constexpr u32 kSmemOpB = kSwapAB ? kSmemA : kSmemB;
    static constexpr u32 kSmemOpBBytes = kSwapAB ? kSmemABytes : kSmemBBytes;
    static constexpr u32 kSmemBytes = kSmemRecordsEnd + (kBarriersInRecord ? 0u : 2 * kNumStages * 8u);
    // The full barrier's bytes (the 1x32 recipe's sA arrives on the scales barrier, B32::kSATxBytes).
    static constexpr u32 kStageTxBytes =
        kSmemABytes + kSmemBBytes + (kBlock32 ? 0u : BLOCK_M * 4 * kSaPitch) + (kRowScaledB ? BLOCK_N * 4 : 0u);
    static_assert(kSmemABytes % 1024 == 0 && kSmemBBytes % 1024 == 0, "stages keep 1024-byte alignment");
    static_assert(!kBlock32 || (kSmemSB == kSmemSA + B32::kSmemSABytes &&
                                kSmemFull == kSmemSA + B32::kRecordBytesBeforeBarriers),
                  "the 1x32 record: sA, the products, the staging, the header (Block32::write_products addresses them "
                  "from the record)");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes + 1024 <= kMaxSmemWindow, "desc_advance needs shared addresses below 2^18");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/config.py: keep the two maps identical");

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const GemmParams& params) {
        u8* smem = hal::dynamic_smem();
        const Barriers full{smem + kSmemFull};
        const Barriers empty{smem + kSmemEmpty};
        const Barriers scales{smem + kSmemScales};  // the 1x32 recipe only
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
            if constexpr (!kKGrouped) {  // k-grouped: per-group maps in global memory (produce_k_grouped)
                hal::tma_prefetch(&params.tma_a);
                hal::tma_prefetch(&params.tma_b);
            }
            hal::tma_prefetch(&params.tma_sa);
            hal::tma_prefetch(kRowScaledB ? &params.tma_sb : &params.tma_d);
            for (u32 s = 0; s < kNumStages; ++s) {
                // 1D1D: no cp.async arrive; 1x32: the TMA arrive and one per scale warp
                hal::mbar_init(&full[s], kRowScaledB ? 1 : kBlock32 ? 1 + B32::kScaleWarps : 2);
                hal::mbar_init(&empty[s], kClusterSize * kNumMathWarps);
                if constexpr (kBlock32)
                    hal::mbar_init(&scales[s], 1);
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

        // Role split on the warp index, which is provably warp-uniform: the math path stays convergent.
        // PDL (deep_fp8_gemm.set_pdl): everything above touches only shared memory and the parameter block; every
        // thread waits for the previous kernel of the stream here, before its first global access (A, the scales,
        // grouped layouts, ks, the device-built maps, split-K workspaces, D).
        if (warp >= kNumMathWarps) {
            hal::setmaxnreg_dec<kProducerRegisters>();
            hal::grid_dependency_wait();
            // One lane runs the producer, picked by elect.sync rather than by thread index: ptxas then knows
            // a single thread issues each TMA / cp.async and emits no ELECT waterfall around them.
            if (warp == kNumMathWarps && hal::elect_one_sync()) {
                produce(params, smem, full, empty, scales);
                // Every load of this CTA is issued: the next kernel of the stream may launch (its own wait still
                // waits for this grid to finish), so its launch and prologue overlap this CTA's last tiles.
                hal::launch_dependents();
            }
            if constexpr (kBlock32) {  // the scale warps (policy_block32.cuh)
                if (warp > kNumMathWarps && warp <= kNumMathWarps + B32::kScaleWarps)
                    produce_scales(params, smem, full, scales, warp - kNumMathWarps - 1, lane);
            }
        } else {
            hal::setmaxnreg_inc<kMathRegisters>();
            hal::grid_dependency_wait();
            if constexpr (kBlock32)
                consume_block32(params, smem, full, empty, warp, lane);
            else
                consume(params, smem, full, empty, warp, lane);
        }

        // No CTA may exit while its peer can still multicast into it or arrive on its barriers.
        if constexpr (kClusterSize > 1)
            hal::cluster_sync();
    }

    // ---------------------------------------------------------------- producer (one thread)
    static DFG_DEVICE void produce(const GemmParams& params, u8* smem, Barriers full, Barriers empty, Barriers scales) {
        if constexpr (kKGrouped) {
            produce_k_grouped(params, smem, full, empty);
            return;
        }
        const u32 rank = kClusterSize > 1 ? hal::cluster_cta_rank() : 0u;
        Scheduler scheduler(params.rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (scheduler.next(tile)) {
            if (tile.group >= kNumGroups)
                hal::trap("grouped layout names a group >= num_groups");
            const i32 row0 = static_cast<i32>(tile.m_block * BLOCK_M);
            const i32 n0 = static_cast<i32>(tile.n_block * BLOCK_N);
            // A / sA / D batch index: the group for the masked layout (3-D maps), else 0.
            const i32 a_batch = kLayout == GemmKind::GroupedMasked ? static_cast<i32>(tile.group) : 0;
            const i32 b_batch = static_cast<i32>(tile.group);
            const auto cols = Scales::of(static_cast<u32>(n0));
            const float* sb_row0 = params.sb + (tile.group * kNumScaleBlocksN + cols.block0) * kNumKBlocks;
            const float* sb_row1 = params.sb + (tile.group * kNumScaleBlocksN + cols.block1) * kNumKBlocks;
            pipe.for_each_use(kKBlocksPerSplit, [&](u32 stage, u32 phase, u32 kb) {
                kb += tile.split * kKBlocksPerSplit;  // this split's K blocks (0 without split-K)
                hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
                u64* bar = &full[stage];
                u8* sb = smem + kSmemSB + stage * kSmemRecordBytes;
                if constexpr (kBlock32) {  // the stage's header and four sA columns, for the scale warps
                    u64* scales_bar = &scales[stage];
                    const u32 col_block0 = static_cast<u32>(n0) / B32::kGran;
                    *reinterpret_cast<Block32Header*>(smem + kSmemHeader + stage * kSmemRecordBytes) = Block32Header{
                        tile.group * kNumScaleBlocksN32 * kNumSlicesK, col_block0, kb * B32::kSlices, 0u};
                    hal::mbar_arrive_expect_tx(scales_bar, B32::kSATxBytes);  // releases the header store
                    hal::tma_load_3d(smem + kSmemSA + stage * kSmemRecordBytes, &params.tma_sa, scales_bar, row0,
                                     static_cast<i32>(kb * B32::kSlices), a_batch);
                } else if constexpr (kRowScaledB) {
                    hal::tma_load_3d(sb, &params.tma_sb, bar, n0, static_cast<i32>(kb), 0);
                } else {
                    hal::cp_async_4(sb, sb_row0 + kb);
                    if constexpr (Scales::kMayStraddle)
                        hal::cp_async_4(sb + 4, sb_row1 + kb);
                    hal::cp_async_mbar_arrive(bar);
                }
                hal::mbar_arrive_expect_tx(bar, kStageTxBytes);
                const i32 k0 = static_cast<i32>(kb * BLOCK_K);
                tma_load_tile<BLOCK_M, BLOCK_K, kMulticastA>(smem + kSmemA + stage * kSmemABytes, &params.tma_a, bar,
                                                             k0, row0, a_batch, rank);
                tma_load_tile<BLOCK_N, BLOCK_K, kMulticastB>(smem + kSmemB + stage * kSmemBBytes, &params.tma_b, bar,
                                                             k0, n0, b_batch, rank, tile.multicast);
                if constexpr (kSaMajor == ScaleMajor::K)  // the box's four floats per row: K blocks kb..kb + 3
                    hal::tma_load_3d(smem + kSmemSA + stage * kSmemRecordBytes, &params.tma_sa, bar,
                                     static_cast<i32>(kb), row0, a_batch);
                else if constexpr (kSaMajor == ScaleMajor::G)  // groups a_batch..a_batch + 3
                    hal::tma_load_3d(smem + kSmemSA + stage * kSmemRecordBytes, &params.tma_sa, bar, a_batch, row0,
                                     static_cast<i32>(kb));
                else if constexpr (!kBlock32)
                    hal::tma_load_3d(smem + kSmemSA + stage * kSmemRecordBytes, &params.tma_sa, bar, row0,
                                     static_cast<i32>(kb), a_batch);
            });
        }
        if constexpr (kBlock32) {  // the scale warps' walk ends at the next stage's header
            pipe.for_each_use(1, [&](u32 stage, u32 phase, u32) {
                hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
                *reinterpret_cast<Block32Header*>(smem + kSmemHeader + stage * kSmemRecordBytes) =
                    Block32Header{0u, Block32Header::kDone, 0u, 0u};
                hal::mbar_arrive(&scales[stage]);
            });
        }
    }

    // The k-grouped kind's producer: per-group A_g / B_g maps (fenced once per group, see policy_k_grouped.cuh),
    // sA / sB columns k_block0 + kb, and the tile's run-time K-block count (0: nothing to load).
    static DFG_DEVICE void produce_k_grouped(const GemmParams& params, u8* smem, Barriers full, Barriers empty) {
        Scheduler scheduler(params.rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        u32 fenced_groups = 0;  // groups [0, fenced_groups) are behind this CTA: their maps were fenced or unused
        while (scheduler.next(tile)) {
            const TensorMap* map_a = params.group_maps + 2 * tile.group;
            const TensorMap* map_b = map_a + 1;
            if (tile.group >= fenced_groups && tile.num_k_blocks > 0) {
                hal::tensormap_fence_acquire(map_a);
                hal::tensormap_fence_acquire(map_b);
                fenced_groups = tile.group + 1;
            }
            const i32 row0 = static_cast<i32>(tile.m_block * BLOCK_M);
            const i32 n0 = static_cast<i32>(tile.n_block * BLOCK_N);
            pipe.for_each_use(tile.num_k_blocks, [&](u32 stage, u32 phase, u32 kb) {
                hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
                u64* bar = &full[stage];
                const i32 k0 = static_cast<i32>(kb * BLOCK_K);
                const i32 col = static_cast<i32>(tile.k_block0 + kb);
                hal::tma_load_3d(smem + kSmemSB + stage * kSmemRecordBytes, &params.tma_sb, bar, n0, col, 0);
                hal::mbar_arrive_expect_tx(bar, kStageTxBytes);
                hal::tma_load_3d(smem + kSmemA + stage * kSmemABytes, map_a, bar, k0, row0, 0);
                hal::tma_load_3d(smem + kSmemB + stage * kSmemBBytes, map_b, bar, k0, n0, 0);
                hal::tma_load_3d(smem + kSmemSA + stage * kSmemRecordBytes, &params.tma_sa, bar, row0, col, 0);
            });
        }
    }

    // Next tile of the math warps. Grouped kinds read the scheduler's decisions from global memory, which
    // the compiler cannot prove warp-uniform; broadcasting them from lane 0 keeps the tile loop convergent
    // and the K loop's descriptors and barrier addresses in uniform registers. Every kind votes on "more
    // tiles" (all lanes compute it identically): with the loop's exit a vote, ptxas keeps the K loop's ring
    // cursor in uniform registers (the dense 64x64 kernel: 99 -> 83 instructions per K block).
    static DFG_DEVICE bool next_tile(MathScheduler& scheduler, TileInfo& tile) {
        const bool more = scheduler.next(tile);
        if constexpr (kLayout == GemmKind::Dense || kLayout == GemmKind::Dense1D1D) {
            return hal::warp_all(more);
        } else {
            tile.m_block = hal::warp_broadcast(tile.m_block);
            tile.n_block = hal::warp_broadcast(tile.n_block);
            tile.group = hal::warp_broadcast(tile.group);
            if constexpr (kKGrouped)
                tile.num_k_blocks = hal::warp_broadcast(tile.num_k_blocks);
            return hal::warp_all(more);
        }
    }

    // ---------------------------------------------------------------- math warpgroups
    static DFG_DEVICE void consume(const GemmParams& params, u8* smem, Barriers full, Barriers empty, u32 warp,
                                   u32 lane) {
        const u32 wg = kNumMathWarpgroups == 1 ? 0u : warp / 4;  // a constant with one warpgroup
        const u32 warp_in_wg = warp % 4;
        const u32 wg_row0 = wg * kWgRows;
        // Rows of this thread's fragment inside the tile, per wave: r and r + 8 (WgmmaFragment::row).
        // NOTES: pinned, or ptxas re-derives it from the thread index inside the K loop (5 instructions per K
        // block in the one-warpgroup kernels).
        const u32 frag_row = hal::pin(wg_row0 + warp_in_wg * 16 + lane / 4);
        // This thread's first fragment column in a column group, 2 (lane % 4) (WgmmaFragment::col): the 1D1D sB
        // reads' offset. NOTES: pinned for the same reason (2 instructions per K block at 1D1D 128x128).
        const u32 frag_col = hal::pin(2 * (lane % 4));
        TileThread me{wg, warp_in_wg, lane, wg_row0, frag_row, 0};
        // Descriptors: the tile's A (this warpgroup's rows) / B in stage s, k32 slice ks start a_desc / b_desc
        // + s * stage stride + ks * 32 bytes; only the low word changes (desc_advance), by one multiply-add
        // per K block and one add per wgmma.
        // NOTES: ptxas re-materialises constant high words (stride, swizzle) into the wgmma's descriptor
        // registers before every wgmma (2 instructions each). ORing in a zero it cannot see through (the
        // warp index is < 32: at most 1024 threads per block) keeps them in registers.
        const u64 smem_desc = make_k_major_sw128_desc(hal::smem_addr(smem));
        const u64 a_desc = desc_advance(smem_desc, kSmemOpA + wg_row0 * BLOCK_K) | (static_cast<u64>(warp >> 5) << 32);
        const u64 b_desc = desc_advance(smem_desc, kSmemOpB) | (static_cast<u64>(warp >> 6) << 32);
        // NOTES: broadcast, or ptxas re-derives their low words from the shared-window base inside the K loop
        // (~6 instructions per K block); broadcast values are also provably uniform.
        const u32 a_lo0 = hal::warp_broadcast(static_cast<u32>(a_desc));
        const u32 b_lo0 = hal::warp_broadcast(static_cast<u32>(b_desc));

        // Cluster kernels: where the shared memory of the CTA this lane releases stages on (release_stage) lies in
        // the shared::cluster window, relative to this CTA's shared addresses: mapped once here rather than by a
        // mapa per release (3 instructions per K block; the sum below folds into the arrive's address operand).
        const u32 peer_window =
            kClusterSize > 1 ? hal::cluster_smem_address(&empty[0], lane % kClusterSize) - hal::smem_addr(&empty[0])
                             : 0u;

        float acc[kWavesM][kAccValues];
        float scratch[kMmaValues];

        MathScheduler scheduler(params.rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (next_tile(scheduler, tile)) {
            const u32 n0 = tile.n_block * BLOCK_N;
            me.n0 = n0;
            const auto masks = SegmentMasks<BLOCK_N, kNumScaleBlocksN>::of(Scales::of(n0));

            DFG_UNROLL
            for (u32 w = 0; w < kWavesM; ++w)
                DFG_UNROLL
                for (u32 i = 0; i < kAccValues; ++i)
                    acc[w][i] = 0.0f;

            const auto k_block = [&](u32 stage, u32 phase, u32 /*kb*/) {
                const u32 a_lo = a_lo0 + stage * (kSmemOpABytes >> 4);
                const u32 b_lo = b_lo0 + stage * (kSmemOpBBytes >> 4);
                hal::mbar_wait(&full[stage], phase, full_barrier(stage));
                // Scales are read before the stage can be released.
                const float* sb = reinterpret_cast<const float*>(smem + kSmemSB + stage * kSmemRecordBytes);
                const float sb0 = kRowScaledB ? 0.0f : sb[0];
                const float sb1 = Scales::kMayStraddle && !kRowScaledB ? sb[1] : sb0;
                const float* sa = reinterpret_cast<const float*>(smem + kSmemSA + stage * kSmemRecordBytes);
                SwapAbColumnScales<kSwapAB ? BLOCK_M : 8u> sa_cols;
                if constexpr (kSwapAB)
                    sa_cols.load(sa, lane);
                RowScalesB<kRowScaledB ? BLOCK_N : 16u> sb_cols;  // 1D1D: read once per K block, for every wave
                DFG_UNROLL
                for (u32 w = 0; w < kWavesM; ++w) {
                    // Per-row sA (swap-AB: per column, read by promote_swap_ab; 1D1D: read under the wgmma).
                    const float sa_lo = kSwapAB || kRowScaledB ? 0.0f : sa[(frag_row + w * 64) * kSaPitch];
                    const float sa_hi = kSwapAB || kRowScaledB ? 0.0f : sa[(frag_row + w * 64 + 8) * kSaPitch];
                    DFG_UNROLL
                    for (u32 c = 0; c < kMmaChunks; ++c) {  // one chunk (the whole tile) but for the SwiGLU kinds
                        DFG_UNROLL
                        for (u32 i = 0; i < kMmaValues; ++i)
                            hal::fence_operand(scratch[i]);
                        hal::wgmma_fence();
                        DFG_UNROLL
                        for (u32 ks = 0; ks < BLOCK_K / kWgmmaK; ++ks)
                            hal::WgmmaFp8<kMmaN>::mma(
                                desc_with_low_word(a_desc, a_lo + ((w * 64 * BLOCK_K + ks * kWgmmaK) >> 4)),
                                desc_with_low_word(b_desc, b_lo + ((c * kMmaN * BLOCK_K + ks * kWgmmaK) >> 4)),
                                scratch, ks > 0);
                        hal::wgmma_commit();
                        // 1D1D: the wave's scales read (sB with the first wave) and multiplied, sA x sB, while
                        // the tensor cores run; the stage is held until after the wait (policy_1d1d.cuh).
                        WaveScales<kRowScaledB ? BLOCK_N : 16u> wave_scales;
                        if constexpr (kRowScaledB) {
                            if (w == 0)
                                sb_cols.load(sb + frag_col);
                            wave_scales.combine(sb_cols, sa[frag_row + w * 64], sa[frag_row + w * 64 + 8]);
                        }
                        hal::wgmma_wait<0>();
                        DFG_UNROLL
                        for (u32 i = 0; i < kMmaValues; ++i)
                            hal::fence_operand(scratch[i]);
                        const bool last = w + 1 == kWavesM && c + 1 == kMmaChunks;
                        if constexpr (kRowScaledB) {  // every scale is in registers: release, then promote
                            if (last) {
                                // Only lane 0 arrives: every lane's sA / sB reads must be ordered before its
                                // release (its arrive releases its own accesses only).
                                hal::warp_sync();
                                release_stage(empty, peer_window, stage, lane);
                            }
                            promote_row_scaled<BLOCK_N>(acc[w], scratch, wave_scales);
                        } else {
                            if (last)
                                release_stage(empty, peer_window, stage, lane);
                            if constexpr (kSwapAB) {  // the wave's weight rows lie in one sB block: sb0
                                promote_swap_ab<BLOCK_M>(acc[w], scratch, sb0, sa_cols);
                            } else if constexpr (kMmaChunks == 1) {
                                promote(acc[w], scratch, sa_lo, sa_hi, sb0, sb1, masks);
                            } else {  // chunk c: columns [128 c, 128 c + 128), all in sB block c of the tile
                                const float sbc = c == 0 ? sb0 : sb1;
                                promote(*reinterpret_cast<float(*)[kMmaValues]>(&acc[w][c * kMmaValues]), scratch,
                                        sa_lo, sa_hi, sbc, sbc, SegmentMasks<kMmaN, kNumScaleBlocksN>{});
                            }
                        }
                    }
                }
            };
            // The tile's K blocks (k-grouped: the group's, 0 gives D_g = C_g + 0).
            pipe.for_each_use(kKGrouped ? tile.num_k_blocks : kKBlocksPerSplit, k_block);

            Output::store(params, smem + kSmemD, tile, me, acc);
        }
        Output::finish(me);
    }

    // ---------------------------------------------------------------- the 1x32 recipe (policy_block32.cuh)
    // Scale warp `scale_warp` (of B32::kScaleWarps after the producer warp): for each stage use the producer
    // announces (Block32Header), wait for its sA columns, write row pair (32 scale_warp + lane)'s products into the
    // stage, then arrive on the stage's full barrier (lane 0, after bar.warp.sync orders the warp's stores before
    // it); a kDone header ends the walk.
    static DFG_DEVICE void produce_scales(const GemmParams& params, u8* smem, Barriers full, Barriers scales,
                                          u32 scale_warp, u32 lane) {
        u32 stage = 0, phase = 0;
        DFG_NO_UNROLL
        while (true) {
            hal::mbar_wait(&scales[stage], phase, scales_barrier(stage));
            u8* record = smem + kSmemSA + stage * kSmemRecordBytes;
            const Block32Header header = *reinterpret_cast<const Block32Header*>(smem + kSmemHeader +
                                                                                   stage * kSmemRecordBytes);
            if (header.col_block0 == Block32Header::kDone)
                break;
            B32::template write_products<kNumScaleBlocksN32, kNumSlicesK>(record, params.sb, header, scale_warp, lane);
            hal::warp_sync();
            if (lane == 0)
                hal::mbar_arrive(&full[stage]);
            if (++stage == kNumStages) {
                stage = 0;
                phase ^= 1u;
            }
        }
    }

    // The math warpgroups of the 1x32 recipe: per stage four k32 wgmmas into alternating banks, each bank promoted
    // while the next slice runs (policy_block32.cuh, "Math per stage").
    static DFG_DEVICE void consume_block32(const GemmParams& params, u8* smem, Barriers full, Barriers empty, u32 warp,
                                           u32 lane) {
        using Products = Block32Products<B32::kColBlocks, B32::kProductFloats>;
        const u32 wg = kNumMathWarpgroups == 1 ? 0u : warp / 4;
        const u32 warp_in_wg = warp % 4;
        const u32 wg_row0 = wg * kWgRows;
        const u32 frag_row = hal::pin(wg_row0 + warp_in_wg * 16 + lane / 4);
        TileThread me{wg, warp_in_wg, lane, wg_row0, frag_row, 0};
        // This thread's row pair's products in stage 0's record; slice s is s * kSliceProductBytes further.
        const u32 products0 =
            hal::pin(kSmemSB + B32::row_pair(wg, warp_in_wg, lane) * B32::kProductFloats * 4u);
        // Descriptors as consume(): low words patched per stage and slice.
        const u64 smem_desc = make_k_major_sw128_desc(hal::smem_addr(smem));
        const u64 a_desc = desc_advance(smem_desc, kSmemOpA + wg_row0 * BLOCK_K) | (static_cast<u64>(warp >> 5) << 32);
        const u64 b_desc = desc_advance(smem_desc, kSmemOpB) | (static_cast<u64>(warp >> 6) << 32);
        const u32 a_lo0 = hal::warp_broadcast(static_cast<u32>(a_desc));
        const u32 b_lo0 = hal::warp_broadcast(static_cast<u32>(b_desc));
        const u32 peer_window =
            kClusterSize > 1 ? hal::cluster_smem_address(&empty[0], lane % kClusterSize) - hal::smem_addr(&empty[0])
                             : 0u;

        float acc[1][kAccValues];
        float bank[2][kAccValues];

        MathScheduler scheduler(params.rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (next_tile(scheduler, tile)) {
            me.n0 = tile.n_block * BLOCK_N;
            DFG_UNROLL
            for (u32 i = 0; i < kAccValues; ++i)
                acc[0][i] = 0.0f;

            // acc += bank * products of `slice` in `stage` (its wgmma retired: a wgmma_wait before): the register
            // fence on the bank after the wait, the products' shared loads, one FFMA per value.
            const auto promote_slice = [&](float (&b)[kAccValues], u32 stage, u32 slice) {
                DFG_UNROLL
                for (u32 i = 0; i < kAccValues; ++i)
                    hal::fence_operand(b[i]);
                Products pr;
                pr.load(reinterpret_cast<const float*>(smem + products0 + stage * kSmemRecordBytes +
                                                       slice * B32::kSliceProductBytes));
                promote_block32<BLOCK_N>(acc[0], b, pr);
            };
            const auto k_block = [&](u32 stage, u32 phase, u32 /*kb*/) {
                const u32 a_lo = a_lo0 + stage * (kSmemOpABytes >> 4);
                const u32 b_lo = b_lo0 + stage * (kSmemOpBBytes >> 4);
                hal::mbar_wait(&full[stage], phase, full_barrier(stage));
                DFG_UNROLL
                for (u32 ks = 0; ks < B32::kSlices; ++ks) {
                    float (&into)[kAccValues] = bank[ks % 2];
                    DFG_UNROLL
                    for (u32 i = 0; i < kAccValues; ++i)
                        hal::fence_operand(into[i]);
                    hal::wgmma_fence();
                    hal::WgmmaFp8<BLOCK_N>::mma(desc_with_low_word(a_desc, a_lo + ((ks * kWgmmaK) >> 4)),
                                                desc_with_low_word(b_desc, b_lo + ((ks * kWgmmaK) >> 4)), into, false);
                    hal::wgmma_commit();
                    if (ks > 0) {  // the slice before retires while this one runs
                        hal::wgmma_wait<1>();
                        promote_slice(bank[(ks - 1) % 2], stage, ks - 1);
                    }
                }
                // The stage's last slice, after a full wait: then the stage is free.
                // NOTES: the last slice is not promoted under the next stage's first wgmma, which would leave a
                // wgmma in flight across the loop's back edge: ptxas cannot prove that a wait_group 1 in the next
                // iteration retires it and serialises every wgmma of the kernel (C7514), whatever the group count
                // at the loop's entry. The other math warpgroup's wgmmas cover this warpgroup's drain (as in
                // FlashAttention-3's intra-warpgroup overlap, which also ends each iteration with wait_group 0).
                hal::wgmma_wait<0>();
                float (&last)[kAccValues] = bank[(B32::kSlices - 1) % 2];
                DFG_UNROLL
                for (u32 i = 0; i < kAccValues; ++i)
                    hal::fence_operand(last[i]);
                Products pr;
                pr.load(reinterpret_cast<const float*>(smem + products0 + stage * kSmemRecordBytes +
                                                       (B32::kSlices - 1) * B32::kSliceProductBytes));
                // Lane 0 (lane r < cluster size) arrives for the warp: every lane's product reads before it.
                hal::warp_sync();
                release_stage(empty, peer_window, stage, lane);
                promote_block32<BLOCK_N>(acc[0], last, pr);
            };
            pipe.for_each_use(kKBlocksPerSplit, k_block);

            Output::store(params, smem + kSmemD, tile, me, acc);
        }
        Output::finish(me);
    }

    // Lane r < kClusterSize of each math warp releases the stage on CTA r of the cluster, whose shared memory
    // lies at this CTA's shared addresses + peer_window in the shared::cluster window (consume).
    static DFG_DEVICE void release_stage(Barriers empty, u32 peer_window, u32 stage, u32 lane) {
        if constexpr (kClusterSize == 1) {
            if (lane == 0)
                hal::mbar_arrive(&empty[stage]);
        } else {
            if (lane < kClusterSize)
                hal::mbar_arrive_cluster_address(hal::smem_addr(&empty[stage]) + peer_window);
        }
    }
};

}  // namespace dfg
