// MXFP4 experts on the FP8 tensor cores, masked or contiguous layout, bf16 out (issues 42, 43; register A):
//
//   masked (kLayout GroupedMasked):   D[g, m, n] = sum_kb sA[g, m, kb] * W_g,kb[n, :] . A[g, m, kb-block]
//                                     for m < masked_m[g]
//   contiguous (GroupedContiguous / GroupedContiguousPsum): D[r, n] = the same with g the group of row r's
//                                     kGroupAlignment-row block (its first or last row's m_indices, or the psum group
//                                     holding its first row), as the FP8 contiguous kernels compute rows: padding rows
//                                     sharing such a block with a group's rows get that group, padding-only blocks
//                                     are skipped (rows untouched)
//
//   A: e4m3 [G, m_max, K] (masked) or [M_sum, K] (contiguous) with 1x128 per-token scales sA (fp32, given to the
//   kernel as [G, K/128, m_pad] / [1, K/128, m_pad], M-major);
//   W: the prepared MXFP4 weights (ops/mxfp4.py PreparedMxfp4): per expert, 128-K block and 64-row wave a 4096-byte
//   tile of e2m1 codes in fragment order and a 272-byte metadata record (mxfp4.cuh), and per wave a flag "some block
//   of mine takes the per-32 path"; rows past masked_m[g] of D are not written.
//   A folded block (its four 32-K scales within 14 binades): the operand is e2m1 x 2^d_s, exact in e4m3, the whole
//   128 K is one wgmma chain and the sum is promoted once by 2^E x sA. A per-32 wave-block (a row of the 64 spans
//   more): the operand is e2m1 x 1, each k32 wgmma is awaited and promoted by 2^e_s x sA.
//
// Swap-AB (policy_swap_ab.cuh): the weights' BLOCK_N rows are the wgmma's M side (BLOCK_N / 64 waves of 64 rows),
// the tile's BLOCK_M tokens its N side (wgmma m64 nBLOCK_M k32). A comes from registers (hal::WgmmaFp8RegA): each
// math thread converts its own fragment's packed bytes (mxfp4.cuh convert_wave) and fences them with wgmma.fence
// before the wgmma reads them; the tokens' tile is the B operand through its shared-memory descriptor.
//
// Two K loops, chosen per tile (uniform over the CTA) by the waves' per-32 flags:
//   folded   (every tile of a checkpoint whose blocks all span <= 14 binades): per K block, every wave's conversion,
//            then all waves' wgmma chains (one commit group), then each wave promoted once. The per-K-block work
//            beside the waves (barriers, scales, descriptors: ~35 issue slots) is shared by BLOCK_N / 64 waves, so
//            decode tiles take 4 (BLOCK_N 256).
//            The audit's K-loop figures are this loop's (kernels/mxfp4_gemm.py).
//   general  (a tile with some per-32 wave-block): per K block and wave, the path its metadata records.
//
// Warp roles (kNumThreads = 256):
//   threads [0, 128)    the math warpgroup: the conversion, the wgmmas, the promotion; then the transposed tile's
//                       bf16 values to D with plain stores (rows m < masked_m[g] only).
//   threads [128, 256)  producer warpgroup; one lane of its first warp (elect.sync) issues every TMA load.
//
// Barriers (shared memory, one pair per stage; pipeline.cuh's ring):
//   full[s]   producer -> math: 1 arrive.expect_tx, tx = kStageTxBytes (W tiles + A + metadata + sA boxes).
//   empty[s]  math -> producer: 4 arrives (lane 0 of each math warp after bar.warp.sync, once the last wave's
//             wgmmas retired: every lane's shared reads of the stage are then before the release).
//
// Shared memory (dynamic, 1024-aligned; = kernels/mxfp4_gemm.py smem_bytes by static_assert):
//   W stages [kNumStages][kWaves][4096] | A stages [kNumStages][BLOCK_M][128] (128-byte swizzle) |
//   metadata [kNumStages][kWaves x 272, 128-rounded] | sA [kNumStages][BLOCK_M] fp32 (128-rounded) | pair tables |
//   full, empty
//
// Registers: a math thread holds kWaves x (BLOCK_M / 2 accumulators + BLOCK_M / 2 scratch + 16 A registers); no
// setmaxnreg (256 threads launch with up to 255 registers each).
//
// NOTES: tiles come from TileScheduler<GroupedMasked> (the FP8 masked kernel's), BLOCK_M tokens x BLOCK_N weight
// rows per tile, so an expert with more than BLOCK_M tokens reads its weights once per m-block (decode: one).
#pragma once
#include "../common.cuh"
#include "../hal.cuh"
#include "../kinds.cuh"
#include "../mma.cuh"
#include "../mxfp4.cuh"
#include "../pipeline.cuh"
#include "../policy_swap_ab.cuh"
#include "../policy_swiglu.cuh"
#include "../scheduler.cuh"
#include "quant.cuh"

namespace dfg {
namespace mxfp4 {

// The kernel's one parameter. Byte layout mirrored by deep_fp8_gemm/kernels/mxfp4_gemm.py (Mxfp4Params).
struct Mxfp4Params {
    TensorMap tma_w;     // tiles u8 [G K/128 N/64][16][256]: dims (256, 16, G K/128 N/64), box (256, 16, kWaves)
    TensorMap tma_a;     // e4m3 [G][m_max][K] (contiguous: [1][M_sum][K]): dims (K, rows, G), box (128, BLOCK_M, 1), SW128
    TensorMap tma_meta;  // u8 [G K/128 N/64][17][16]: dims (16, 17, G K/128 N/64), box (16, 17, kWaves)
    TensorMap tma_sa;    // fp32 [G or 1][K / 128][m_pad]: dims (m_pad, K / 128, G or 1), box (BLOCK_M, 1, 1)
    u8* d;               // [G][m_max][N_out] (contiguous: [M_sum][N_out]): bf16, or e4m3 (kOutput Fp8 / SwigluFp8)
    const i32* grouped_layout;  // masked_m [G] | m_indices [M_sum] | psum group ends [G]
    const u8* wave_per32;  // [G][N / 64]: 1 where some 128-K block of the wave takes the per-32 path
    float* sd;           // FP8 outputs: the 1x128 scales of D, M-major: scale (batch, r, j) at (batch * N_out / 128 + j)
                         // * sd_rows + r (the layout per_token_cast_to_fp8 returns)
    u32 num_rows;        // m_max (masked) or M_sum (contiguous)
    u32 sd_rows;         // FP8 outputs: rows of sD's M-major layout (the TMA-aligned row count)
    u8 reserved[24];     // 0: a multiple of the tensor maps' 64-byte alignment
};
static_assert(DFG_OFFSETOF(Mxfp4Params, tma_a) == 128 && DFG_OFFSETOF(Mxfp4Params, tma_meta) == 256 &&
                  DFG_OFFSETOF(Mxfp4Params, tma_sa) == 384 && DFG_OFFSETOF(Mxfp4Params, d) == 512 &&
                  DFG_OFFSETOF(Mxfp4Params, grouped_layout) == 520 && DFG_OFFSETOF(Mxfp4Params, wave_per32) == 528 &&
                  DFG_OFFSETOF(Mxfp4Params, sd) == 536 && DFG_OFFSETOF(Mxfp4Params, num_rows) == 544 &&
                  DFG_OFFSETOF(Mxfp4Params, sd_rows) == 548 &&
                  sizeof(Mxfp4Params) == 576,
              "Mxfp4Params layout is mirrored in deep_fp8_gemm/kernels/mxfp4_gemm.py");

// What the epilogue writes: bf16 D, or e4m3 D with 1x128 scales per row (FP8-output: BLOCK_N a multiple of 128), or
// SiLU(gate) * up of the interleaved w13 quantised so (SwiGLU: BLOCK_N a multiple of 256; interleave_swiglu_mxfp4).
enum class Mxfp4Output : u32 { Bf16 = 0, Fp8 = 1, SwigluFp8 = 2 };

template <u32 SHAPE_N, u32 SHAPE_K, u32 BLOCK_M, u32 BLOCK_N, u32 kNumStages, u32 kNumGroups, u32 kExpectedSmemBytes,
          GemmKind kLayout, u32 kGroupAlignment, Mxfp4Output kOutput = Mxfp4Output::Bf16, bool kUe8m0 = false>
struct Mxfp4GroupedKernel {
    static constexpr bool kFp8Out = kOutput != Mxfp4Output::Bf16;
    static constexpr bool kSwiglu = kOutput == Mxfp4Output::SwigluFp8;
    static constexpr bool kMasked = kLayout == GemmKind::GroupedMasked;
    static_assert(kMasked || kLayout == GemmKind::GroupedContiguous || kLayout == GemmKind::GroupedContiguousPsum,
                  "the MXFP4 kernel's layouts: masked, contiguous (m_indices) and psum");
    static constexpr u32 BLOCK_K = 128;
    static constexpr u32 kNumKBlocks = SHAPE_K / BLOCK_K;
    static constexpr u32 kWaves = BLOCK_N / 64;
    static constexpr u32 kWavesPerExpert = SHAPE_N / 64;
    // Output columns: the weights' rows, or half of them (SwiGLU: a 256-row block gives 128 columns of h).
    static constexpr u32 SHAPE_N_OUT = kSwiglu ? SHAPE_N / 2 : SHAPE_N;
    static constexpr u32 kValueWaves = kSwiglu ? kWaves / 2 : kWaves;  // 64-column slices of D per tile
    static constexpr u32 kOutGroups = kValueWaves / 2;                  // 128-column scale groups per tile
    static_assert(!kFp8Out || (kSwiglu ? BLOCK_N % 256 == 0 : BLOCK_N % 128 == 0),
                  "FP8 outputs quantise whole 128-column groups in the tile: BLOCK_N 128 / 256 (SwiGLU: 256)");
    static constexpr u32 kAccValues = WgmmaFragment<BLOCK_M>::kValues;
    static constexpr u32 kNumMathThreads = 128;
    static constexpr u32 kNumMathWarps = 4;
    static constexpr u32 kNumThreads = 256;
    static_assert(SHAPE_K % BLOCK_K == 0 && SHAPE_N % BLOCK_N == 0, "K a multiple of 128, N of BLOCK_N");
    static_assert(BLOCK_M == 8 || BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64 || BLOCK_M == 128,
                  "tokens per tile: 8..128 (sA box: 16-byte multiples)");
    static_assert(BLOCK_M <= 32 || BLOCK_N == 64, "64 / 128 tokens (prefill tiles): one wave, for the registers");
    static_assert(BLOCK_N == 64 || BLOCK_N == 128 || (BLOCK_N == 256 && BLOCK_M <= 16),
                  "one math warpgroup of one, two or four 64-row waves (four: at most 16 tokens, for the registers)");

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kSmemWBytes = kWaves * kWaveTileBytes;
    static constexpr u32 kSmemABytes = BLOCK_M * BLOCK_K;
    static constexpr u32 kSmemMetaBytes = round_up(kWaves * kWaveMetaBytes, 128u);  // TMA destinations: 128-aligned
    static constexpr u32 kSmemSaBytes = round_up(BLOCK_M * 4u, 128u);
    static constexpr u32 kSmemW = 0;
    static constexpr u32 kSmemA = kSmemW + kNumStages * kSmemWBytes;
    static constexpr u32 kSmemMeta = kSmemA + kNumStages * kSmemABytes;
    static constexpr u32 kSmemSa = kSmemMeta + kNumStages * kSmemMetaBytes;
    static constexpr u32 kSmemTables = round_up(kSmemSa + kNumStages * kSmemSaBytes, 16u);
    static constexpr u32 kSmemRed = kSmemTables + kPairTableBytes;  // FP8 outputs: [groups][4 warps][BLOCK_M] amax
    static constexpr u32 kSmemRedBytes = kFp8Out ? kOutGroups * 4 * BLOCK_M * 4 : 0;
    static constexpr u32 kSmemFull = kSmemRed + kSmemRedBytes;
    static constexpr u32 kSmemEmpty = kSmemFull + 8 * kNumStages;
    static constexpr u32 kSmemBytes = kSmemEmpty + 8 * kNumStages;
    static constexpr u32 kStageTxBytes = kSmemWBytes + kSmemABytes + kWaves * kWaveMetaBytes + BLOCK_M * 4;
    static_assert(kSmemWBytes % 1024 == 0 && kSmemABytes % 1024 == 0, "tiles keep their swizzle patterns' alignment");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes + 1024 <= kMaxSmemWindow, "desc_advance needs shared addresses below 2^18");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/kernels/mxfp4_gemm.py: keep the two maps identical");

    using Pipe = PipelineState<kNumStages>;
    using Barriers = StageBarriers<8>;
    // Masked: the FP8 masked kernel's walk. Contiguous layouts: a dense walk of the M_sum rows in BLOCK_M blocks, each
    // block's group that of its kGroupAlignment-row block (GroupLookup: the FP8 contiguous / psum kernels' blocks,
    // whose BLOCK_M is the alignment), so that exactly the FP8 kernels' rows are computed, padding rows sharing a block
    // with a group's rows included, and padding-only alignment blocks skipped.
    static constexpr GemmKind kWalk = kMasked ? kLayout : GemmKind::Dense;
    using Scheduler = TileScheduler<kWalk, SHAPE_N, BLOCK_M, BLOCK_N, kMasked ? kNumGroups : 1u, 1, 1, 1>;
    using GroupLookup = TileScheduler<kLayout, SHAPE_N, kGroupAlignment, BLOCK_N, kNumGroups, 1, 1, 1, 1,
                                      kGroupAlignment>;
    static_assert(kMasked || kGroupAlignment % BLOCK_M == 0, "a tile lies in one alignment block");

    // The next tile of this CTA with its group (contiguous: padding-only alignment blocks skipped).
    static DFG_DEVICE bool next_tile(Scheduler& scheduler, const Mxfp4Params& params, TileInfo& tile) {
        while (scheduler.next(tile)) {
            if constexpr (!kMasked) {
                const GroupLookup lookup(params.num_rows, params.grouped_layout, 0, 1);
                const u32 block = tile.m_block * BLOCK_M / kGroupAlignment;
                const i32 group = kLayout == GemmKind::GroupedContiguous ? lookup.contiguous_block_expert(block)
                                                                         : lookup.psum_block_group(block);
                if (group < 0)
                    continue;  // padding-only: no loads, no MMAs, no stores
                tile.group = static_cast<u32>(group);
            }
            return true;
        }
        return false;
    }

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const Mxfp4Params& params) {
        u8* smem = hal::dynamic_smem();
        const Barriers full{smem + kSmemFull}, empty{smem + kSmemEmpty};
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
                hal::mbar_init(&full[s], 1);
                hal::mbar_init(&empty[s], kNumMathWarps);
            }
            hal::fence_view_async_shared();
            hal::fence_barrier_init();
        }
        // The pair tables: compile-time constants, no global read.
        for (u32 i = thread; i < kPairTableBytes / 4; i += kNumThreads)
            reinterpret_cast<u32*>(smem + kSmemTables)[i] = pair_table_word(i / 4, i % 4);
        hal::sync_threads();

        // PDL (deep_fp8_gemm.set_pdl): everything above touches only shared memory and the parameter block.
        hal::grid_dependency_wait();
        if (warp >= kNumMathWarps) {
            if (warp == kNumMathWarps && hal::elect_one_sync()) {
                produce(params, smem, full, empty);
                hal::launch_dependents();
            }
        } else {
            consume(params, smem, full, empty, warp, lane);
        }
    }

    // ---------------------------------------------------------------- producer (one lane)
    static DFG_DEVICE void produce(const Mxfp4Params& params, u8* smem, Barriers full, Barriers empty) {
        Scheduler scheduler(params.num_rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (next_tile(scheduler, params, tile)) {
            const i32 m0 = static_cast<i32>(tile.m_block * BLOCK_M);
            const i32 g = kMasked ? static_cast<i32>(tile.group) : 0;  // A / sA batch: contiguous rows are one
            pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 kb) {
                hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
                u64* bar = &full[stage];
                hal::mbar_arrive_expect_tx(bar, kStageTxBytes);
                // the tile's kWaves consecutive records of (expert g, K block kb): [G][K/128][N/64] order
                const i32 wave = static_cast<i32>((tile.group * kNumKBlocks + kb) * kWavesPerExpert +
                                                  tile.n_block * kWaves);
                hal::tma_load_3d(smem + kSmemW + stage * kSmemWBytes, &params.tma_w, bar, 0, 0, wave);
                hal::tma_load_3d(smem + kSmemA + stage * kSmemABytes, &params.tma_a, bar,
                                 static_cast<i32>(kb * BLOCK_K), m0, g);
                hal::tma_load_3d(smem + kSmemMeta + stage * kSmemMetaBytes, &params.tma_meta, bar, 0, 0, wave);
                hal::tma_load_3d(smem + kSmemSa + stage * kSmemSaBytes, &params.tma_sa, bar, m0,
                                 static_cast<i32>(kb), g);
            });
        }
    }

    // ---------------------------------------------------------------- math warpgroup
    using Fragments = u32[kSubBlocks][WgmmaFragmentA::kRegisters];

    // One wave's k32 wgmmas over sub-blocks [s0, s1) into `scratch` (a fresh sum), committed as one group.
    static DFG_DEVICE void issue(const Fragments& a, u64 b_desc, float (&scratch)[kAccValues], u32 s0, u32 s1) {
        DFG_UNROLL
        for (u32 i = 0; i < kAccValues; ++i)
            hal::fence_operand(scratch[i]);
        DFG_UNROLL
        for (u32 s = s0; s < s1; ++s)
            hal::WgmmaFp8RegA<BLOCK_M>::mma(a[s], desc_advance(b_desc, s * kWgmmaK), scratch, s > s0);
        hal::wgmma_commit();
    }

    static DFG_DEVICE void fence_fragments(Fragments& a) {
        DFG_UNROLL
        for (u32 s = 0; s < kSubBlocks; ++s)
            DFG_UNROLL
            for (u32 j = 0; j < WgmmaFragmentA::kRegisters; ++j)
                hal::fence_operand(a[s][j]);
    }

    static DFG_DEVICE void retire(float (&scratch)[kAccValues]) {
        DFG_UNROLL
        for (u32 i = 0; i < kAccValues; ++i)
            hal::fence_operand(scratch[i]);
    }

    static DFG_DEVICE void consume(const Mxfp4Params& params, u8* smem, Barriers full, Barriers empty, u32 warp,
                                   u32 lane) {
        const u32 thread = 32 * warp + lane;
        const u8* tables = smem + kSmemTables;
        const u64 b_desc0 = make_k_major_sw128_desc(hal::smem_addr(smem + kSmemA));

        float acc[kWaves][kAccValues];
        float scratch[kWaves][kAccValues];
        Fragments a[kWaves];

        Scheduler scheduler(params.num_rows, params.grouped_layout, hal::block_idx(), hal::grid_dim());
        Pipe pipe;
        TileInfo tile;
        while (next_tile(scheduler, params, tile)) {
            DFG_UNROLL
            for (u32 w = 0; w < kWaves; ++w)
                DFG_UNROLL
                for (u32 i = 0; i < kAccValues; ++i)
                    acc[w][i] = 0.0f;
            // The tile's path, uniform over the CTA: any wave with a per-32 block anywhere in K takes the general loop.
            bool general = false;
            DFG_UNROLL
            for (u32 w = 0; w < kWaves; ++w)
                general |= params.wave_per32[tile.group * kWavesPerExpert + tile.n_block * kWaves + w] != 0;

            if (!general) {  // folded: every wave's chain issued, then each awaited and promoted once
                pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 /*kb*/) {
                    hal::mbar_wait(&full[stage], phase, full_barrier(stage));
                    const u8* w_tile = smem + kSmemW + stage * kSmemWBytes;
                    const u8* meta = smem + kSmemMeta + stage * kSmemMetaBytes;
                    const u64 b_desc = desc_advance(b_desc0, stage * kSmemABytes);
                    SwapAbColumnScales<BLOCK_M> sa_cols;
                    sa_cols.load(reinterpret_cast<const float*>(smem + kSmemSa + stage * kSmemSaBytes), lane);
                    WaveMeta m[kWaves];
                    DFG_UNROLL
                    for (u32 w = 0; w < kWaves; ++w) {
                        u32 words[2 * kSubBlocks];
                        load_fragment(w_tile + w * kWaveTileBytes, thread, words);
                        m[w] = WaveMeta::load(meta + w * kWaveMetaBytes, warp, lane);
                        convert_wave(words, tables, m[w], false, a[w]);
                        fence_fragments(a[w]);
                    }
                    // Every wave's chain, sub-block by sub-block (the waves' wgmmas of one sub-block read the same
                    // tokens), one commit group after all the conversions: decode is bound by the weights' HBM bytes,
                    // not by this serialisation (at 16x256 ~510 issue + ~200 wgmma cycles per K block against ~880
                    // of HBM), and it issues fewer instructions than a commit group and a wait per wave.
                    DFG_UNROLL
                    for (u32 w = 0; w < kWaves; ++w)
                        retire(scratch[w]);
                    hal::wgmma_fence();  // folded chains: orders the converted A registers
                    DFG_UNROLL
                    for (u32 s = 0; s < kSubBlocks; ++s) {
                        const u64 desc = desc_advance(b_desc, s * kWgmmaK);
                        DFG_UNROLL
                        for (u32 w = 0; w < kWaves; ++w)
                            hal::WgmmaFp8RegA<BLOCK_M>::mma(a[w][s], desc, scratch[w], s > 0);
                    }
                    hal::wgmma_commit();
                    hal::wgmma_wait<0>();
                    DFG_UNROLL
                    for (u32 w = 0; w < kWaves; ++w) {
                        retire(scratch[w]);
                        promote_rows<BLOCK_M>(acc[w], scratch[w], m[w].block_scale(0), m[w].block_scale(1), sa_cols);
                    }
                    DFG_UNROLL
                    for (u32 w = 0; w < kWaves; ++w)
                        fence_fragments(a[w]);
                    // Lane 0 arrives for the warp: every lane's reads of the stage are ordered before it.
                    hal::warp_sync();
                    if (lane == 0)
                        hal::mbar_arrive(&empty[stage]);
                });
            } else {  // general: per K block and wave, the recorded path
                pipe.for_each_use(kNumKBlocks, [&](u32 stage, u32 phase, u32 /*kb*/) {
                    hal::mbar_wait(&full[stage], phase, full_barrier(stage));
                    const u8* w_tile = smem + kSmemW + stage * kSmemWBytes;
                    const u8* meta = smem + kSmemMeta + stage * kSmemMetaBytes;
                    const u64 b_desc = desc_advance(b_desc0, stage * kSmemABytes);
                    SwapAbColumnScales<BLOCK_M> sa_cols;
                    sa_cols.load(reinterpret_cast<const float*>(smem + kSmemSa + stage * kSmemSaBytes), lane);
                    DFG_UNROLL
                    for (u32 w = 0; w < kWaves; ++w) {
                        u32 words[2 * kSubBlocks];
                        load_fragment(w_tile + w * kWaveTileBytes, thread, words);
                        const WaveMeta m = WaveMeta::load(meta + w * kWaveMetaBytes, warp, lane);
                        const bool per32 = WaveMeta::per32(meta + w * kWaveMetaBytes);
                        convert_wave(words, tables, m, per32, a[w]);
                        fence_fragments(a[w]);
                        if (!per32) {
                            hal::wgmma_fence();
                            issue(a[w], b_desc, scratch[w], 0, kSubBlocks);
                            hal::wgmma_wait<0>();
                            retire(scratch[w]);
                            promote_rows<BLOCK_M>(acc[w], scratch[w], m.block_scale(0), m.block_scale(1), sa_cols);
                        } else {  // per-32: each k32 sum promoted by its own scale
                            DFG_UNROLL
                            for (u32 s = 0; s < kSubBlocks; ++s) {
                                hal::wgmma_fence();
                                issue(a[w], b_desc, scratch[w], s, s + 1);
                                hal::wgmma_wait<0>();
                                retire(scratch[w]);
                                promote_rows<BLOCK_M>(acc[w], scratch[w], m.sub_block_scale(0, s),
                                                      m.sub_block_scale(1, s), sa_cols);
                            }
                        }
                        fence_fragments(a[w]);
                    }
                    hal::warp_sync();
                    if (lane == 0)
                        hal::mbar_arrive(&empty[stage]);
                });
            }
            if constexpr (kFp8Out) {
                store_fp8(params, tile, warp, lane, acc, reinterpret_cast<u32*>(smem + kSmemRed));
            } else {
                store(params, tile, warp, lane, acc);
                // The math warpgroup converges once per tile (as store_fp8's barriers make it): with that, NVRTC keeps
                // the K loops' stage arithmetic and the tokens' descriptors in uniform registers instead of moving
                // each descriptor with R2UR before every wgmma (measured: 32 issue slots per K block at 4 waves,
                // 474 -> 442 at 8x256). One bar.sync per tile.
                hal::named_barrier_sync(1, kNumMathThreads);
            }
        }
    }

    // The transposed tile's values to D in bf16: masked, D[g, m0 + column, n0 + row] for columns below masked_m[g]
    // (and m_max); contiguous, D[m0 + column, n0 + row] below M_sum (the tile's alignment block is its group's).
    static DFG_DEVICE void store(const Mxfp4Params& params, const TileInfo& tile, u32 warp, u32 lane,
                                 const float (&acc)[kWaves][kAccValues]) {
        u32 rows = params.num_rows;
        u16* d = reinterpret_cast<u16*>(params.d) + tile.n_block * BLOCK_N;
        if constexpr (kMasked) {
            const i32 valid = params.grouped_layout[tile.group];
            rows = valid <= 0 ? 0u : min_of(static_cast<u32>(valid), params.num_rows);
            d += static_cast<u64>(tile.group) * params.num_rows * SHAPE_N;
        }
        DFG_UNROLL
        for (u32 w = 0; w < kWaves; ++w)
            DFG_UNROLL
            for (u32 i = 0; i < kAccValues; ++i) {
                const u32 n = w * 64 + WgmmaFragment<BLOCK_M>::row(warp, lane, i);
                const u32 m = tile.m_block * BLOCK_M + WgmmaFragment<BLOCK_M>::col(lane, i);
                if (m < rows)
                    d[static_cast<u64>(m) * SHAPE_N + n] = static_cast<u16>(hal::pack_bf16x2(acc[w][i], 0.0f) & 0xFFFFu);
            }
    }

    // FP8 outputs: the tile's D columns as e4m3 with one scale per row (token) and 128 columns, the rule of
    // epilogue_fp8.cuh (per_token_cast_to_fp8_torch(values, use_ue8m0, reciprocal=True)). A token's 128 values of
    // one group lie in two 64-row slices, over the 8 lanes of a lane % 4 class in each of the 4 warps: its amax is
    // reduced over those lanes by shuffles, then over the warps through shared memory (`red`, one named barrier for
    // the math warpgroup before the reads and one after, so that the next tile's partials wait for them).
    static DFG_DEVICE void store_fp8(const Mxfp4Params& params, const TileInfo& tile, u32 warp, u32 lane,
                                     const float (&acc)[kWaves][kAccValues], u32* red) {
        float v[kValueWaves][kAccValues];
        DFG_UNROLL
        for (u32 w = 0; w < kValueWaves; ++w)
            DFG_UNROLL
            for (u32 i = 0; i < kAccValues; ++i) {
                if constexpr (kSwiglu)  // interleaved w13: per 256 rows, gate slices 0, 1 then up slices 2, 3
                    v[w][i] = swiglu(acc[4 * (w / 2) + w % 2][i], acc[4 * (w / 2) + 2 + w % 2][i]);
                else
                    v[w][i] = acc[w][i];
            }
        constexpr u32 kColSlots = BLOCK_M / 4;  // columns per thread: 8 j + 2 (lane % 4) + b
        u32 rows = params.num_rows;
        u8* d = params.d;
        u32 batch = 0;
        if constexpr (kMasked) {
            const i32 valid = params.grouped_layout[tile.group];
            rows = valid <= 0 ? 0u : min_of(static_cast<u32>(valid), params.num_rows);
            batch = tile.group;
            d += static_cast<u64>(tile.group) * params.num_rows * SHAPE_N_OUT;
        }
        DFG_UNROLL
        for (u32 g = 0; g < kOutGroups; ++g) {
            DFG_UNROLL
            for (u32 c = 0; c < kColSlots; ++c) {
                const u32 j = c / 2, b = c % 2;
                u32 bits = 0;
                DFG_UNROLL
                for (u32 w = 2 * g; w < 2 * g + 2; ++w)
                    DFG_UNROLL
                    for (u32 h = 0; h < 2; ++h)
                        bits = max_of(bits, quant::float_to_bits(v[w][4 * j + 2 * h + b]) & 0x7FFFFFFFu);
                DFG_UNROLL
                for (u32 mask = 4; mask <= 16; mask *= 2)
                    bits = max_of(bits, quant::float_to_bits(hal::shfl_xor(quant::bits_to_float(bits), mask)));
                if (lane < 4)
                    red[(g * 4 + warp) * BLOCK_M + 8 * j + 2 * lane + b] = bits;
            }
        }
        hal::named_barrier_sync(1, kNumMathThreads);
        DFG_UNROLL
        for (u32 g = 0; g < kOutGroups; ++g) {
            DFG_UNROLL
            for (u32 c = 0; c < kColSlots; ++c) {
                const u32 j = c / 2, b = c % 2;
                const u32 col = 8 * j + 2 * (lane % 4) + b;
                u32 bits = 0;
                DFG_UNROLL
                for (u32 wp = 0; wp < 4; ++wp)
                    bits = max_of(bits, red[(g * 4 + wp) * BLOCK_M + col]);
                const float scale = quant::amax_to_scale<kUe8m0 ? quant::kUe8m0Scales : 0u>(bits);
                const float inv = 1.0f / scale;  // one IEEE reciprocal per token and group (epilogue_fp8.cuh)
                const u32 m = tile.m_block * BLOCK_M + col;
                if (m >= rows)
                    continue;
                const u32 n_group = tile.n_block * kValueWaves / 2 + g;  // the scale group's index in D's columns
                DFG_UNROLL
                for (u32 w = 2 * g; w < 2 * g + 2; ++w)
                    DFG_UNROLL
                    for (u32 h = 0; h < 2; ++h) {
                        const u32 n = tile.n_block * kValueWaves * 64 + w * 64 + 16 * warp + lane / 4 + 8 * h;
                        d[static_cast<u64>(m) * SHAPE_N_OUT + n] =
                            static_cast<u8>(hal::pack_e4m3x2(v[w][4 * j + 2 * h + b] * inv, 0.0f) & 0xFFu);
                    }
                if (warp == 0 && lane < 4)
                    params.sd[(static_cast<u64>(batch) * (SHAPE_N_OUT / 128) + n_group) * params.sd_rows + m] = scale;
            }
        }
        hal::named_barrier_sync(1, kNumMathThreads);  // the next tile's partials after every read of these
    }
};

}  // namespace mxfp4
}  // namespace dfg
