// The DeepSeek-V3.2 / V4 lightning indexer on sm_90a: FP8 MQA logits, two forms of one skeleton.
//
//   logits[i][j] = s_kv[j] * sum_h w[i][h] * ReLU(q[i][h][:] . kv[j][:])   (e4m3 q and kv, fp32 w and s_kv)
//
//   Dense  (kForm = Dense, deep_fp8_gemm.attention.fp8_mqa_logits): queries i < num_rows of q [seq_len, H, D], KV
//          rows j of kv [seq_len_kv, D], a window [ks[i], ke[i]) per query (clamped to [0, seq_len_kv)). A Q tile is
//          kQueries = 128 / H consecutive queries (N = 128); its KV range is the union of their windows (start
//          rounded down to 4), walked in 256-row tiles. Logits row i, column j (compressed: column j - ks[i], only
//          j - ks[i] < logits_width). kClean: the -inf of the rest of [0, seq_len_kv) is written too.
//   Paged  (kForm = Paged, fp8_paged_mqa_logits): batch row b's kQueries = next_n queries (N = next_n * H) against
//          its cached tokens p < context_lens[b][next_n - 1], 64 per cache block, block p / 64 at
//          block_table[b][p / 64] of kv_cache [num_blocks][64 x D e4m3 | 64 fp32 scales]; a 256-token tile is four
//          blocks, the last ones skipped past the context. The CTA's tiles are those the schedule metadata
//          (get_paged_mqa_logits_metadata: [num_ctas + 1][2] of (batch row, 256-token split)) gives it, in order.
//          Logits row b * next_n + t, column p, written for p < min(context_lens[b][t], context_lens[b][next_n - 1],
//          logits_width) only.
//
// Both forms share everything but the schedule (which Q tile, which KV tiles), the KV tile's load (one 256-row box /
// four cache blocks through the block table) and the store window; the score itself is mqa_score.cuh's ScoreTile.
//
// Warp roles (kNumThreads = 640):
//   threads [0, 512)   four math warpgroups; warpgroup g scores KV rows [64 g, 64 g + 64) of every KV stage against
//                      the current Q stage (ScoreTile), then stores its values with plain global stores.
//                      setmaxnreg.inc to kMathRegisters.
//   threads [512, 640) producer warpgroup, setmaxnreg.dec to kProducerRegisters: one lane of warp 16 (elect.sync)
//                      issues every TMA load (and, paged, reads the block table); warps 17-19 write the dense form's
//                      -inf (kClean), else exit.
//
// Barriers (shared memory):
//   full_q[s]   producer -> math: 1 arrive.expect_tx, tx = Q tile + weights bytes.
//   empty_q[s]  math -> producer: 16 arrives (lane 0 of every math warp, after a bar.warp.sync that orders its
//               lanes' weight reads) once the Q tile's last KV tile retired.
//   full_kv[s]  producer -> math: 1 arrive.expect_tx, tx = the tile's loaded bytes (paged: only its blocks before
//               the context's end, 64 x D + 256 bytes each).
//   empty_kv[s] math -> producer: 16 arrives (lane 0 of every math warp, after its wgmma.wait: the scales it read
//               before the commit are ordered before the release, as the GEMM skeleton's release is).
//
// Shared memory (dynamic, 1024-aligned; = kernels/mqa_logits.py smem_bytes by static_assert):
//   Q tiles [kQStages][kQueries * H][D] | KV tiles [kKvStages][256][D] | weights [kQStages][kQueries * H] fp32 (128-byte
//   rounded) | KV scales [kKvStages][256] fp32 | full_q, empty_q, full_kv, empty_kv (8 bytes each)
//   Q and KV tiles K-major with the swizzle of one D-byte row (SW32 / SW64 / SW128: mma.cuh make_k_major_desc).
//
// Register split: 640 threads launch at 96 registers (65536 / 640, rounded down to 8); the producer warpgroup gives
// 128 x (96 - 32) = 8192 to the math warpgroups, 512 x (112 - 96). A math thread holds N / 2 = 64 accumulators
// (N = 128); its weights are read from the Q stage at every tile (mqa_score.cuh, weight_pair: why).
//
// NOTES: the four math warpgroups share one KV ring (one producer lane, one 256-row stage) rather than one ring per
// warpgroup: a stage is then one dense box, or four paged blocks whose table entries are read together (four loads,
// one latency) and the math side is the same for both forms. The reference design gives each paged warpgroup a ring
// of its own fed by a producer warp of its own (batching 32 table reads per warp with shuffles).
#pragma once
#include "../common.cuh"
#include "../hal.cuh"
#include "../mma.cuh"
#include "../mqa_score.cuh"
#include "../pipeline.cuh"

namespace dfg {
namespace mqa {

enum class Form : u32 { Dense = 0, Paged = 1 };

// The kernel's one parameter. Byte layout mirrored by deep_fp8_gemm/kernels/mqa_logits.py (MqaLogitsParams).
struct MqaLogitsParams {
    TensorMap tma_q;            // q rows (query x head) x D e4m3: dims (D, rows, 1), box (D, kQueries * H, 1), SW(D)
    TensorMap tma_weights;      // weights fp32 [queries][H]: dims (H, queries, 1), box (H, kQueries, 1)
    TensorMap tma_kv;           // dense: kv [seq_len_kv][D], dims (D, seq_len_kv, 1), box (D, 256, 1), SW(D);
                                // paged: dims (D, 64, num_blocks), box (D, 64, 1), SW(D), block stride of the cache
    TensorMap tma_kv_scales;    // dense: [seq_len_kv] fp32, dims (seq_len_kv, 1, 1), box (256, 1, 1);
                                // paged: dims (64, num_blocks, 1), box (64, 1, 1), the cache's block stride
    void* logits;               // fp32 or bf16, row r at logits + r * logits_stride elements
    u64 logits_stride;          // elements between logits rows
    const i32* ks;              // dense: cu_seq_len_k_start [num_rows]
    const i32* ke;              // dense: cu_seq_len_k_end [num_rows]
    const i32* context_lens;    // paged: [num_rows][kQueries]
    const i32* block_table;     // paged: [num_rows][block_table_stride]
    const i32* schedule;        // paged: [gridDim.x + 1][2] (batch row, 256-token split)
    u32 num_rows;               // dense: seq_len (queries); paged: batch
    u32 seq_len_kv;             // dense: KV rows; paged: 0
    u32 logits_width;           // columns of the logits view (dense: seq_len_kv or max_seqlen_k; paged: max_context_len)
    u32 block_table_stride;     // paged: elements between block-table rows
    u8 reserved[56];            // 0: the struct is a multiple of the tensor maps' 64-byte alignment
};
static_assert(DFG_OFFSETOF(MqaLogitsParams, tma_q) == 0 && DFG_OFFSETOF(MqaLogitsParams, tma_weights) == 128 &&
                  DFG_OFFSETOF(MqaLogitsParams, tma_kv) == 256 && DFG_OFFSETOF(MqaLogitsParams, tma_kv_scales) == 384 &&
                  DFG_OFFSETOF(MqaLogitsParams, logits) == 512 && DFG_OFFSETOF(MqaLogitsParams, logits_stride) == 520 &&
                  DFG_OFFSETOF(MqaLogitsParams, ks) == 528 && DFG_OFFSETOF(MqaLogitsParams, ke) == 536 &&
                  DFG_OFFSETOF(MqaLogitsParams, context_lens) == 544 &&
                  DFG_OFFSETOF(MqaLogitsParams, block_table) == 552 && DFG_OFFSETOF(MqaLogitsParams, schedule) == 560 &&
                  DFG_OFFSETOF(MqaLogitsParams, num_rows) == 568 && DFG_OFFSETOF(MqaLogitsParams, seq_len_kv) == 572 &&
                  DFG_OFFSETOF(MqaLogitsParams, logits_width) == 576 &&
                  DFG_OFFSETOF(MqaLogitsParams, block_table_stride) == 580 && sizeof(MqaLogitsParams) == 640,
              "MqaLogitsParams layout is mirrored in deep_fp8_gemm/kernels/mqa_logits.py");

// One Q tile and its KV tiles: dense, q block `q` (queries [q * kQueries, ...)), tiles at KV rows row0 + 256 t;
// paged, batch row `q`, tiles at tokens (row0 / 256 + t) * 256, its context's blocks num_blocks.
struct Group {
    u32 q;           // Q tile index (dense: q block; paged: batch row)
    u32 row0;        // KV row (dense) / token (paged) of the first tile
    u32 num_tiles;   // 256-row tiles
    u32 num_blocks;  // paged: 64-token blocks of the context (context_lens[q][next_n - 1]); dense: unused
};

constexpr u32 kNumMathWarpgroups = 4;
constexpr u32 kTileRows = kWarpgroupRows * kNumMathWarpgroups;  // 256 KV rows per stage
constexpr u32 kBlockKv = 64;                                     // tokens per paged cache block
constexpr u32 kBlocksPerTile = kTileRows / kBlockKv;

DFG_DEVICE u32 clamp_index(i32 x, u32 hi) { return x <= 0 ? 0u : (static_cast<u32>(x) < hi ? static_cast<u32>(x) : hi); }

// Dense schedule: q blocks blockIdx, blockIdx + gridDim, ...; a block's KV range is the union of its queries'
// windows, clamped to [0, seq_len_kv), its start rounded down to 4.
template <u32 kQueries>
struct DenseSchedule {
    const i32* ks;
    const i32* ke;
    u32 num_rows, seq_len_kv, block, stride, num_blocks;
    DFG_DEVICE DenseSchedule(const MqaLogitsParams& p)
        : ks(p.ks), ke(p.ke), num_rows(p.num_rows), seq_len_kv(p.seq_len_kv), block(hal::block_idx()),
          stride(hal::grid_dim()), num_blocks(ceil_div(p.num_rows, kQueries)) {}

    DFG_DEVICE bool next(Group& g) {
        if (block >= num_blocks)
            return false;
        u32 start = seq_len_kv, end = 0;
        DFG_UNROLL
        for (u32 t = 0; t < kQueries; ++t) {
            const u32 i = block * kQueries + t;
            if (i < num_rows) {
                const u32 lo = clamp_index(ks[i], seq_len_kv), hi = clamp_index(ke[i], seq_len_kv);
                if (lo < hi) {
                    start = min_of(start, lo);
                    end = max_of(end, hi);
                }
            }
        }
        start = start / 4 * 4;
        g = Group{block, start, start < end ? ceil_div(end - start, kTileRows) : 0u, 0u};
        block += stride;
        return true;
    }
};

// Paged schedule: this CTA's (batch row, split) range [schedule[cta], schedule[cta + 1]) in lexicographic order, a
// split being 256 tokens of a row with ceil(context_lens[row][next_n - 1] / 256) splits.
template <u32 kQueries>
struct PagedSchedule {
    const i32* context_lens;
    u32 num_rows, q, split, q_end, split_end;
    DFG_DEVICE PagedSchedule(const MqaLogitsParams& p) : context_lens(p.context_lens), num_rows(p.num_rows) {
        const i32* s = p.schedule + 2 * hal::block_idx();
        q = static_cast<u32>(s[0]);
        split = static_cast<u32>(s[1]);
        q_end = static_cast<u32>(s[2]);
        split_end = static_cast<u32>(s[3]);
    }

    DFG_DEVICE bool next(Group& g) {
        while (q < q_end || (q == q_end && split < split_end)) {
            if (q >= num_rows)
                hal::trap("paged MQA logits: the schedule metadata names a batch row past the batch");
            const i32 len = context_lens[q * kQueries + kQueries - 1];
            const u32 tokens = len > 0 ? static_cast<u32>(len) : 0u;
            const u32 splits = ceil_div(tokens, kTileRows);
            const u32 last = q == q_end ? min_of(split_end, splits) : splits;
            const u32 first = split;
            const u32 row = q;
            ++q;
            split = 0;
            if (first < last) {
                g = Group{row, first * kTileRows, last - first, ceil_div(tokens, kBlockKv)};
                return true;
            }
        }
        return false;
    }
};

template <Form kForm, u32 kNumHeads, u32 kHeadDim, u32 kQueries, bool kBf16Logits, bool kClean, bool kCompressed,
          u32 kQStages, u32 kKvStages, u32 kExpectedSmemBytes>
struct MqaLogitsKernel {
    static constexpr bool kPaged = kForm == Form::Paged;
    using Score = ScoreTile<kQueries, kNumHeads, kHeadDim>;
    using Schedule = typename Select<kPaged, PagedSchedule<kQueries>, DenseSchedule<kQueries>>::type;
    using Logit = typename Select<kBf16Logits, u16, float>::type;
    static constexpr u32 kQRows = Score::N;
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumMathWarps = kNumMathThreads / 32;
    static constexpr u32 kNumThreads = kNumMathThreads + 128;
    static constexpr u32 kProducerRegisters = 32;
    static constexpr u32 kMathRegisters = 112;

    static_assert(kPaged ? (kQueries == 1 || kQueries == 2) : kQueries * kNumHeads == 128,
                  "dense: 128 / H queries per Q tile (N = 128); paged: next_n 1 or 2 queries");
    static_assert(kNumHeads == 32 || kNumHeads == 64, "SM90: 32 or 64 heads");
    static_assert(!kPaged || (!kClean && !kCompressed), "the paged form neither cleans nor compresses");
    static_assert(!(kClean && kCompressed), "compressed logits are not cleaned");
    static_assert(kQStages >= 2 && kKvStages >= 2, "two stages at least on each ring");
    static_assert(kProducerRegisters * 128 + kMathRegisters * kNumMathThreads <= 65536, "register file is 64K");

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kSmemQBytes = kQRows * kHeadDim;
    static constexpr u32 kSmemKvBytes = kTileRows * kHeadDim;
    static constexpr u32 kSmemWeightsBytes = round_up(kQRows * 4u, 128u);
    static constexpr u32 kSmemScalesBytes = kTileRows * 4;
    static constexpr u32 kSmemQ = 0;
    static constexpr u32 kSmemKv = kSmemQ + kQStages * kSmemQBytes;
    static constexpr u32 kSmemWeights = kSmemKv + kKvStages * kSmemKvBytes;
    static constexpr u32 kSmemScales = kSmemWeights + kQStages * kSmemWeightsBytes;
    static constexpr u32 kSmemFullQ = kSmemScales + kKvStages * kSmemScalesBytes;
    static constexpr u32 kSmemEmptyQ = kSmemFullQ + 8 * kQStages;
    static constexpr u32 kSmemFullKv = kSmemEmptyQ + 8 * kQStages;
    static constexpr u32 kSmemEmptyKv = kSmemFullKv + 8 * kKvStages;
    static constexpr u32 kSmemBytes = kSmemEmptyKv + 8 * kKvStages;
    static constexpr u32 kQTxBytes = kSmemQBytes + kQRows * 4;
    static constexpr u32 kBlockTxBytes = kBlockKv * kHeadDim + kBlockKv * 4;  // one paged block and its scales
    static_assert(kSmemQBytes % 1024 == 0 && kSmemKvBytes % 1024 == 0, "tiles keep the swizzle patterns' alignment");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes + 1024 <= kMaxSmemWindow, "desc_advance needs shared addresses below 2^18");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/kernels/mqa_logits.py: keep the two maps identical");

    using QPipe = PipelineState<kQStages>;
    using KvPipe = PipelineState<kKvStages>;
    using Barriers = StageBarriers<8>;

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const MqaLogitsParams& params) {
        u8* smem = hal::dynamic_smem();
        const Barriers full_q{smem + kSmemFullQ}, empty_q{smem + kSmemEmptyQ};
        const Barriers full_kv{smem + kSmemFullKv}, empty_kv{smem + kSmemEmptyKv};
        const u32 thread = hal::thread_idx();
        const u32 warp = hal::warp_idx();
        const u32 lane = hal::lane_idx();

        if (thread == kNumMathThreads) {
            if (hal::smem_addr(smem) % 1024 != 0)
                hal::trap("dynamic shared memory is not 1024-byte aligned");
            hal::tma_prefetch(&params.tma_q);
            hal::tma_prefetch(&params.tma_weights);
            hal::tma_prefetch(&params.tma_kv);
            hal::tma_prefetch(&params.tma_kv_scales);
            for (u32 s = 0; s < kQStages; ++s) {
                hal::mbar_init(&full_q[s], 1);
                hal::mbar_init(&empty_q[s], kNumMathWarps);
            }
            for (u32 s = 0; s < kKvStages; ++s) {
                hal::mbar_init(&full_kv[s], 1);
                hal::mbar_init(&empty_kv[s], kNumMathWarps);
            }
            hal::fence_view_async_shared();
            hal::fence_barrier_init();
        }
        hal::sync_threads();

        // PDL (deep_fp8_gemm.set_pdl): everything above touches only shared memory and the parameter block.
        if (warp >= kNumMathWarps) {
            hal::setmaxnreg_dec<kProducerRegisters>();
            hal::grid_dependency_wait();
            if (warp == kNumMathWarps) {
                if (hal::elect_one_sync()) {
                    produce(params, smem, full_q, empty_q, full_kv, empty_kv);
                    hal::launch_dependents();
                }
            } else if constexpr (kClean) {
                clean(params, warp - kNumMathWarps - 1, lane);
            }
        } else {
            hal::setmaxnreg_inc<kMathRegisters>();
            hal::grid_dependency_wait();
            consume(params, smem, full_q, empty_q, full_kv, empty_kv, warp, lane);
        }
    }

    // ---------------------------------------------------------------- producer (one lane)
    static DFG_DEVICE void produce(const MqaLogitsParams& params, u8* smem, Barriers full_q, Barriers empty_q,
                                   Barriers full_kv, Barriers empty_kv) {
        Schedule schedule(params);
        QPipe q_pipe;
        KvPipe kv_pipe;
        Group g;
        while (schedule.next(g)) {
            q_pipe.for_each_use(1, [&](u32 stage, u32 phase, u32) {
                hal::mbar_wait(&empty_q[stage], phase ^ 1u, empty_barrier(stage));
                u64* bar = &full_q[stage];
                hal::mbar_arrive_expect_tx(bar, kQTxBytes);
                hal::tma_load_3d(smem + kSmemQ + stage * kSmemQBytes, &params.tma_q, bar, 0,
                                 static_cast<i32>(g.q * kQRows), 0);
                hal::tma_load_3d(smem + kSmemWeights + stage * kSmemWeightsBytes, &params.tma_weights, bar, 0,
                                 static_cast<i32>(g.q * kQueries), 0);
            });
            kv_pipe.for_each_use(g.num_tiles, [&](u32 stage, u32 phase, u32 t) {
                const u32 row0 = g.row0 + t * kTileRows;
                u8* tile = smem + kSmemKv + stage * kSmemKvBytes;
                u8* scales = smem + kSmemScales + stage * kSmemScalesBytes;
                u64* bar = &full_kv[stage];
                if constexpr (kPaged) {
                    // The tile's cache blocks before the context's end, their table entries read before the wait.
                    const u32 block0 = row0 / kBlockKv;
                    const u32 count = min_of(kBlocksPerTile, g.num_blocks - block0);
                    const i32* entries = params.block_table + static_cast<u64>(g.q) * params.block_table_stride + block0;
                    i32 physical[kBlocksPerTile];
                    DFG_UNROLL
                    for (u32 b = 0; b < kBlocksPerTile; ++b)
                        physical[b] = b < count ? entries[b] : 0;
                    hal::mbar_wait(&empty_kv[stage], phase ^ 1u, empty_barrier(stage));
                    hal::mbar_arrive_expect_tx(bar, count * kBlockTxBytes);
                    DFG_UNROLL
                    for (u32 b = 0; b < kBlocksPerTile; ++b) {
                        if (b < count) {
                            hal::tma_load_3d(tile + b * kBlockKv * kHeadDim, &params.tma_kv, bar, 0, 0, physical[b]);
                            hal::tma_load_3d(scales + b * kBlockKv * 4, &params.tma_kv_scales, bar, 0, physical[b], 0);
                        }
                    }
                } else {
                    hal::mbar_wait(&empty_kv[stage], phase ^ 1u, empty_barrier(stage));
                    hal::mbar_arrive_expect_tx(bar, kSmemKvBytes + kSmemScalesBytes);
                    hal::tma_load_3d(tile, &params.tma_kv, bar, 0, static_cast<i32>(row0), 0);
                    hal::tma_load_3d(scales, &params.tma_kv_scales, bar, static_cast<i32>(row0), 0, 0);
                }
            });
        }
    }

    // ---------------------------------------------------------------- math warpgroups
    // Where this lane's query of a Q tile stores: row pointer, the KV window [lo, hi) it writes, and the column of
    // KV row lo (compressed: 0; else lo).
    struct Window {
        Logit* row;
        u32 lo, hi, col_lo;
    };

    static DFG_DEVICE Window window_of(const MqaLogitsParams& params, const Group& g, u32 query) {
        Logit* logits = static_cast<Logit*>(params.logits);
        if constexpr (kPaged) {
            // The row's work ends at the last query's context (the schedule's), whatever this query's.
            const u32 r = g.q * kQueries + query;
            const i32 len = min_of(params.context_lens[r], params.context_lens[g.q * kQueries + kQueries - 1]);
            const u32 hi = min_of(len > 0 ? static_cast<u32>(len) : 0u, params.logits_width);
            return Window{logits + r * params.logits_stride, 0u, hi, 0u};
        } else {
            const u32 i = g.q * kQueries + query;
            if (i >= params.num_rows)
                return Window{logits, 0u, 0u, 0u};
            const u32 lo = clamp_index(params.ks[i], params.seq_len_kv);
            u32 hi = clamp_index(params.ke[i], params.seq_len_kv);
            if constexpr (kCompressed)  // column j - lo, below logits_width (max_seqlen_k)
                hi = min_of(hi, lo + params.logits_width);
            return Window{logits + i * params.logits_stride, lo, hi, kCompressed ? 0u : lo};
        }
    }

    static DFG_DEVICE void store(const Window& w, u32 row, float value) {
        if (w.lo <= row && row < w.hi) {
            if constexpr (kBf16Logits)
                w.row[row - w.lo + w.col_lo] = static_cast<u16>(hal::pack_bf16x2(value, 0.0f) & 0xFFFFu);
            else
                w.row[row - w.lo + w.col_lo] = value;
        }
    }

    static DFG_DEVICE void consume(const MqaLogitsParams& params, u8* smem, Barriers full_q, Barriers empty_q,
                                   Barriers full_kv, Barriers empty_kv, u32 warp, u32 lane) {
        const u32 wg = warp / 4;
        const u32 warp_in_wg = warp % 4;
        // This thread's KV rows of the stage (r, r + 8) and its query of each value (ScoreTile::query_of) are fixed.
        const u32 frag_row = wg * kWarpgroupRows + 16 * warp_in_wg + lane / 4;
        const u64 a_desc0 = make_k_major_desc<kHeadDim>(hal::smem_addr(smem + kSmemKv + wg * kWarpgroupRows * kHeadDim));
        const u64 b_desc0 = make_k_major_desc<kHeadDim>(hal::smem_addr(smem + kSmemQ));

        Schedule schedule(params);
        QPipe q_pipe;
        KvPipe kv_pipe;
        Group g;
        float acc[Score::kAccValues];
        while (schedule.next(g)) {
            q_pipe.for_each_use(1, [&](u32 q_stage, u32 q_phase, u32) {
                hal::mbar_wait(&full_q[q_stage], q_phase, full_barrier(q_stage));
                const float* weights = reinterpret_cast<const float*>(smem + kSmemWeights + q_stage * kSmemWeightsBytes);
                // One window per value this lane owns: kValuesOut values of one query (query_of is the same for all j).
                const Window w = window_of(params, g, Score::query_of(lane, 0));
                const u64 b_desc = desc_advance(b_desc0, q_stage * kSmemQBytes);
                kv_pipe.for_each_use(g.num_tiles, [&](u32 stage, u32 phase, u32 t) {
                    const u32 row0 = g.row0 + t * kTileRows;
                    // Paged: a warpgroup whose cache block lies past the context has nothing loaded to score.
                    const bool active = !kPaged || row0 / kBlockKv + wg < g.num_blocks;
                    hal::mbar_wait(&full_kv[stage], phase, full_barrier(stage));
                    float scale_lo = 0.0f, scale_hi = 0.0f;
                    if (active) {
                        const float* scales = reinterpret_cast<const float*>(smem + kSmemScales + stage * kSmemScalesBytes);
                        scale_lo = scales[frag_row];
                        scale_hi = scales[frag_row + 8];
                        Score::issue(desc_advance(a_desc0, stage * kSmemKvBytes), b_desc, acc);
                        Score::wait(acc);
                    }
                    if (lane == 0)
                        hal::mbar_arrive(&empty_kv[stage]);
                    if (active)
                        Score::reduce(acc, weights, scale_lo, scale_hi, warp_in_wg, lane,
                                      [&](u32 /*query*/, u32 row, float value) {
                                          store(w, row0 + wg * kWarpgroupRows + row, value);
                                      });
                });
                // Every lane read weights: order those reads before lane 0 releases the stage (the tiles' wgmma
                // waits order only what was read before their commits).
                hal::warp_sync();
                if (lane == 0)
                    hal::mbar_arrive(&empty_q[q_stage]);
            });
        }
    }

    // ---------------------------------------------------------------- -inf (dense, kClean; three warps)
    // For each query of each of this CTA's q blocks: -inf over [0, seq_len_kv) outside the query's window. The math
    // warpgroups write exactly the window, so the two sets of stores never touch the same element.
    static DFG_DEVICE void clean(const MqaLogitsParams& params, u32 clean_warp, u32 lane) {
        constexpr u32 kCleanWarps = 3;
        DenseSchedule<kQueries> schedule(params);
        Group g;
        u32 n = 0;  // (q block, query) pairs seen, dealt to the warps in turn
        while (schedule.next(g)) {
            for (u32 t = 0; t < kQueries; ++t, ++n) {
                const u32 i = g.q * kQueries + t;
                if (n % kCleanWarps != clean_warp || i >= params.num_rows)
                    continue;
                const Window w = window_of(params, g, t);
                Logit* row = static_cast<Logit*>(params.logits) + i * params.logits_stride;
                if (w.lo < w.hi) {
                    fill_neg_inf(row, 0, w.lo, lane);
                    fill_neg_inf(row, w.hi, params.seq_len_kv, lane);
                } else {
                    fill_neg_inf(row, 0, params.seq_len_kv, lane);
                }
            }
        }
    }

    // row[a, b) = -inf by the warp: 16-byte stores where a whole chunk lies inside, element stores at the ends.
    static DFG_DEVICE void fill_neg_inf(Logit* row, u32 a, u32 b, u32 lane) {
        constexpr u32 kPerChunk = 16 / sizeof(Logit);
        const Logit neg_inf = neg_inf_logit();
        if (a >= b)
            return;
        // First element of [a, b) on a 16-byte boundary, and the end of the whole chunks.
        const u32 misalign = static_cast<u32>(reinterpret_cast<u64>(row + a) % 16) / sizeof(Logit);
        const u32 head_end = min_of(b, a + (misalign ? kPerChunk - misalign : 0u));
        const u32 body_end = head_end + (b - head_end) / kPerChunk * kPerChunk;
        for (u32 j = a + lane; j < head_end; j += 32)
            row[j] = neg_inf;
        struct alignas(16) Chunk {
            u32 bits[4];
        };
        const u32 word = kBf16Logits ? 0xFF80FF80u : 0xFF800000u;
        const Chunk chunk{{word, word, word, word}};
        for (u32 c = head_end + lane * kPerChunk; c < body_end; c += 32 * kPerChunk)
            *reinterpret_cast<Chunk*>(row + c) = chunk;
        for (u32 j = body_end + lane; j < b; j += 32)
            row[j] = neg_inf;
    }

    static DFG_DEVICE Logit neg_inf_logit() {
        if constexpr (kBf16Logits) {
            return static_cast<u16>(0xFF80u);
        } else {
            union {
                u32 bits;
                float value;
            } u{0xFF800000u};
            return u.value;
        }
    }
};

}  // namespace mqa
}  // namespace dfg
