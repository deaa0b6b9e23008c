// The BF16 GEMM family on sm_90a (issue 41): D = C + A . B^T with bf16 A and B, fp32 accumulation in registers over
// the whole K (no promotion, no scales), D bf16 or fp32. One skeleton, five forms (Bf16Form, a template parameter):
//
//   Dense          A [m, k], B [n, k], D [m, n]           (bf16_gemm_{nt,nn,tn,tt}: any of the four majors)
//   MGroupedContig A [m, k] K-major, B [G, n, k] K- or MN-major, D [m, n]; grouped_layout[m] int32 (group; -1
//                  padding).
//                  Groups are padded to a multiple of BLOCK_M rows, so a block's group is read from its first and last
//                  rows (scheduler.cuh's contiguous rule); a block of padding only is skipped (rows left untouched).
//   MGroupedMasked A [G, m, k], B [G, n, k], D [G, m, n]; group g's rows r < min(masked_m[g], m) only (grouped_layout =
//                  masked_m [G]); rows past them are neither computed nor written.
//   Batched        per batch index h < num_batches: A_h [m, k], B_h [n, k], D_h [m, n], every operand 3-D with its own
//                  row and batch strides (einsum bhr,hdr->bhd and bhd,hdr->bhr on strided views).
//   BatchedReduce  A [s, m, k], B [s, n, k], D [m, n] fp32 = C + sum_s A_s . B_s^T (einsum bmk,bnk->mn): the K loop
//                  walks s, then k.
// K is never split and its order is fixed (k blocks of 64, ascending; BatchedReduce: s outer), so a row's bits do
// not depend on m or on the tile it lands in (the library's batch-invariance contract).
//
// Warp roles (kNumThreads = 128 (kNumMathWarpgroups + 1)):
//   threads [0, 128 kNumMathWarpgroups)  math warpgroups; warpgroup w owns tile rows [w kWgRows, (w + 1) kWgRows)
//                                         in kWaves m64 waves, setmaxnreg.inc to kMathRegisters; epilogue from the
//                                         fragments with plain global accesses (D = C + acc, C read first: C may be D).
//   the last warpgroup                    producer, setmaxnreg.dec to kProducerRegisters; one elected lane of its
//                                         first warp issues every TMA load.
// Barriers (shared memory):
//   full[s]   producer -> math: 1 arrive.expect_tx, tx = A and B box bytes of the stage (OOB boxes count whole).
//   empty[s]  math -> producer: 4 kNumMathWarpgroups arrives (lane 0 of every math warp, after its wgmma.wait).
// Shared memory (dynamic, 1024-aligned; = kernels/bf16_gemm.py Bf16GemmConfig.smem_bytes() by static_assert):
//   A stages [kStages][BLOCK_M x 128 B] | B stages [kStages][BLOCK_N x 128 B] | full[kStages] | empty[kStages].
//   A K-major stage: BLOCK_M rows of BLOCK_K = 64 bf16 (128 bytes), 128-byte swizzle (one TMA box).
//   A MN-major stage: BLOCK_M / 64 boxes of 64 K rows x 64 MN elements (128 bytes), 8 KiB apart, 128-byte swizzle;
//   B likewise with BLOCK_N (MN-major B needs BLOCK_N % 64 == 0).
// Register split: producer 40, math 232 (two warpgroups) or 240 (one), as the FP8 skeleton (fp8_gemm.cuh). A math
// thread holds kWaves x BLOCK_N / 2 accumulators (at most 128).
//
// NOTES: the tile walk is decided at run time (m, n, k, the batch count are parameters, not template constants as in
// the FP8 skeleton's TileScheduler): one binary per config serves every shape, which the simulator's tests need (a
// build per shape costs seconds) and a wide-shaped einsum family wants. The epilogue stores fragment values one by
// one; an stmatrix + TMA-store epilogue (output.cuh's Bf16TmaStore) is the next step for the bf16 forms at size.
#pragma once
#include "../common.cuh"
#include "../hal.cuh"
#include "../mma.cuh"
#include "../pipeline.cuh"

namespace dfg {
namespace bf16 {

// Same values as deep_fp8_gemm/kernels/bf16_gemm.py Bf16Form.
enum class Form : u32 { Dense = 0, MGroupedContiguous = 1, MGroupedMasked = 2, Batched = 3, BatchedReduce = 4 };

// Planted bugs for the simulator tests (kernels/bf16_gemm.py PLANTED; 0 in every real build).
enum Planted : u32 {
    kNoBug = 0,
    kBugTransB = 1,        // MN-major B issued with imm-trans-b = 0
    kBugFullParity = 2,    // the math side waits on full[s] with the wrong parity (off by one phase)
    kBugIgnoreC = 3,       // the epilogue writes acc, not C + acc
    kBugMaskedRows = 4,    // the masked form stores rows past masked_m
};

// The kernel's one parameter. Byte layout mirrored by deep_fp8_gemm/kernels/bf16_gemm.py (Bf16GemmParams).
struct Bf16GemmParams {
    TensorMap tma_a;  // K-major: dims (k, m, batches), box (64, BLOCK_M, 1); MN-major: (m, k, batches), box (64, 64, 1)
    TensorMap tma_b;  // the same with n, BLOCK_N
    void* d;          // bf16 or fp32: (batch, row, col) at d + batch * d_batch_stride + row * d_row_stride + col
    const void* c;           // D's dtype, same addressing with c_*_stride; null without kAccumulate
    const i32* grouped_layout;  // contiguous: group per row [m]; masked: masked_m [num_batches]; else null
    u64 d_row_stride;        // elements
    u64 d_batch_stride;      // elements (masked, batched)
    u64 c_row_stride;
    u64 c_batch_stride;
    u32 m;                   // rows of A (contiguous: all groups' rows; masked: rows per group)
    u32 n;
    u32 k;
    u32 num_batches;         // G (grouped), h (batched), s (reduce), 1 (dense)
    u8 reserved[56];         // 0: the struct is a multiple of the tensor maps' 64-byte alignment
};
static_assert(DFG_OFFSETOF(Bf16GemmParams, tma_b) == 128 && DFG_OFFSETOF(Bf16GemmParams, d) == 256 &&
                  DFG_OFFSETOF(Bf16GemmParams, c) == 264 && DFG_OFFSETOF(Bf16GemmParams, grouped_layout) == 272 &&
                  DFG_OFFSETOF(Bf16GemmParams, d_row_stride) == 280 &&
                  DFG_OFFSETOF(Bf16GemmParams, c_batch_stride) == 304 &&
                  DFG_OFFSETOF(Bf16GemmParams, m) == 312 && DFG_OFFSETOF(Bf16GemmParams, num_batches) == 324 &&
                  sizeof(Bf16GemmParams) == 384,
              "Bf16GemmParams layout is mirrored in deep_fp8_gemm/kernels/bf16_gemm.py");

// One output tile: which batch (group / head / 0) its A, B and D come from, its block, its valid rows.
struct Bf16Tile {
    u32 batch_a;     // A's batch coordinate (masked, batched: the tile's batch; else 0)
    u32 batch_b;     // B's batch coordinate (grouped: the group; batched: h; else 0); reduce: per K iteration
    u32 batch_d;     // D's (and C's) batch (masked, batched); else 0
    u32 m_block, n_block;
    u32 rows;        // rows of D valid for this tile's batch (masked: min(masked_m[g], m); else m)
};

// The persistent tile walk: CTA b takes tiles b, b + gridDim, ...; inside a batch m-block-major, n fastest. Masked:
// groups in order, group g holding ceil(rows_g / BLOCK_M) m-blocks (none when masked_m[g] <= 0).
template <Form kForm, u32 BLOCK_M, u32 BLOCK_N, bool kBugMaskedRows>
struct Bf16Scheduler {
    const Bf16GemmParams& p;
    u32 next_tile, stride, n_blocks, m_blocks;
    u32 group = 0, group_first = 0, group_rows = 0;  // masked: the cursor's group, its first tile, its valid rows

    DFG_DEVICE explicit Bf16Scheduler(const Bf16GemmParams& params)
        : p(params), next_tile(hal::block_idx()), stride(hal::grid_dim()), n_blocks(ceil_div(params.n, BLOCK_N)),
          m_blocks(ceil_div(params.m, BLOCK_M)) {
        if constexpr (kForm == Form::MGroupedMasked)
            group_rows = masked_rows(0);
    }

    DFG_DEVICE u32 masked_rows(u32 g) const {
        if (g >= p.num_batches)
            return 0u;
        const i32 valid = p.grouped_layout[g];
        return valid <= 0 ? 0u : min_of(static_cast<u32>(valid), p.m);
    }

    DFG_DEVICE bool next(Bf16Tile& t) {
        if constexpr (kForm == Form::MGroupedMasked) {
            const u32 tile = next_tile;
            while (group < p.num_batches && tile >= group_first + ceil_div(group_rows, BLOCK_M) * n_blocks) {
                group_first += ceil_div(group_rows, BLOCK_M) * n_blocks;
                group_rows = masked_rows(++group);
            }
            if (group >= p.num_batches)
                return false;
            next_tile += stride;
            const u32 in_group = tile - group_first;
            t = Bf16Tile{group, group, group, in_group / n_blocks, in_group % n_blocks,
                         kBugMaskedRows ? p.m : group_rows};
            return true;
        } else {
            const u32 batches = kForm == Form::Batched ? p.num_batches : 1u;
            const u32 per_batch = m_blocks * n_blocks;
            while (next_tile < batches * per_batch) {
                const u32 tile = next_tile;
                next_tile += stride;
                const u32 batch = tile / per_batch, in_batch = tile % per_batch;
                t = Bf16Tile{batch, batch, batch, in_batch / n_blocks, in_batch % n_blocks, p.m};
                if constexpr (kForm == Form::MGroupedContiguous) {
                    // A block lies inside one group (groups padded to BLOCK_M rows): its first or last row names it.
                    const u32 first = t.m_block * BLOCK_M, last = min_of(first + BLOCK_M, p.m) - 1;
                    const i32 g = max_of(p.grouped_layout[first], p.grouped_layout[last]);
                    if (g < 0)
                        continue;  // padding only: no loads, no MMAs, no stores
                    t.batch_a = 0;
                    t.batch_b = static_cast<u32>(g);
                    t.batch_d = 0;
                }
                return true;
            }
            return false;
        }
    }
};

// Descriptor of a k16 slice of an MN-major bf16 tile with the 128-byte swizzle (make_gmma_desc<Major::MN>, SW128,
// CuTe's ((8,8,m),(8,k)):((1,8,LBO),(64,SBO)) in elements): 64 MN elements (128 bytes) per K row, 8 K rows per
// 1024-byte atom (SBO), the next 64 MN elements one TMA box (64 K rows, 8 KiB) further (LBO). A k16 slice is two
// atoms: slice j starts 2048 j bytes into the box.
constexpr u32 kMnBoxBytes = 64 * 128;
DFG_HOST_DEVICE constexpr u64 make_mn_major_sw128_desc(u32 smem_byte_addr) {
    return static_cast<u64>((smem_byte_addr >> 4) & 0x3FFFu) | (static_cast<u64>(kMnBoxBytes >> 4) << 16) |
           (static_cast<u64>(kSwizzle128BAtomBytes >> 4) << 32) | (static_cast<u64>(1u) << 62);
}

template <Form kForm, u32 BLOCK_M, u32 BLOCK_N, u32 kStages, u32 kNumMathWarpgroups, bool kMnMajorA, bool kMnMajorB,
          bool kFp32Out, bool kAccumulate, u32 kPlanted, u32 kExpectedSmemBytes>
struct Bf16GemmKernel {
    static constexpr u32 BLOCK_K = 64;  // bf16 elements: one 128-byte swizzled row
    static constexpr u32 kRowBytes = BLOCK_K * 2;
    static constexpr u32 kSlices = BLOCK_K / 16;  // k16 wgmmas per K block
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumMathWarps = kNumMathThreads / 32;
    static constexpr u32 kNumThreads = kNumMathThreads + 128;
    static constexpr u32 kWgRows = BLOCK_M / kNumMathWarpgroups;
    static constexpr u32 kWaves = kWgRows / 64;
    static constexpr u32 kValues = BLOCK_N / 2;
    static constexpr u32 kProducerRegisters = 40;
    static constexpr u32 kMathRegisters = kNumMathWarpgroups == 1 ? 240 : 232;
    // The transpose immediate the wgmma is issued with (planted: MN-major B as if K-major).
    static constexpr int kTransB = kMnMajorB && kPlanted != kBugTransB ? 1 : 0;
    using Out = typename Select<kFp32Out, float, u16>::type;

    static_assert(kNumMathWarpgroups == 1 || kNumMathWarpgroups == 2, "one or two math warpgroups");
    static_assert(kWgRows == 64 || kWgRows == 128, "64 or 128 rows (one or two m64 waves) per math warpgroup");
    static_assert(BLOCK_N % 8 == 0 && BLOCK_N >= 8 && BLOCK_N <= 256, "wgmma N: a multiple of 8 in [8, 256]");
    static_assert(kWaves * kValues <= 128, "at most 128 accumulators per math thread");
    static_assert(!kMnMajorB || BLOCK_N % 64 == 0, "MN-major B comes in 64-column TMA boxes");
    // The contiguous form takes an MN-major B too (m_grouped_bf16_gemm_nn_contiguous: B [G, k, n]); A stays K-major.
    static_assert(kForm != Form::MGroupedContiguous || !kMnMajorA, "the contiguous form's A is K-major");
    static_assert(kForm != Form::MGroupedMasked || (!kMnMajorA && !kMnMajorB), "grouped forms are K-major");
    static_assert(kForm != Form::BatchedReduce || kFp32Out, "the reduce form accumulates into fp32 D");
    static_assert(kStages >= 2 && kStages <= 32, "stage count");
    static_assert(kProducerRegisters * 128 + kMathRegisters * kNumMathThreads <= 65536, "register file is 64K");

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kSmemABytes = BLOCK_M * kRowBytes;
    static constexpr u32 kSmemBBytes = BLOCK_N * kRowBytes;
    static constexpr u32 kSmemA = 0;
    static constexpr u32 kSmemB = kSmemA + kStages * kSmemABytes;
    static constexpr u32 kSmemFull = kSmemB + kStages * kSmemBBytes;
    static constexpr u32 kSmemEmpty = kSmemFull + 8 * kStages;
    static constexpr u32 kSmemBytes = kSmemEmpty + 8 * kStages;
    static constexpr u32 kStageTxBytes = kSmemABytes + kSmemBBytes;
    static_assert(kSmemABytes % 1024 == 0 && kSmemBBytes % 1024 == 0, "stages keep the swizzle atoms' alignment");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes + 1024 <= kMaxSmemWindow, "desc_advance needs shared addresses below 2^18");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/kernels/bf16_gemm.py: keep the two maps identical");

    using Pipe = PipelineState<kStages>;
    using Barriers = StageBarriers<8>;
    using Scheduler = Bf16Scheduler<kForm, BLOCK_M, BLOCK_N, kPlanted == kBugMaskedRows>;
    using Fragment = WgmmaFragment<BLOCK_N>;

    // K iterations (one 64-wide K block each) of a tile: the reduce form walks every s.
    static DFG_DEVICE u32 k_iterations(const Bf16GemmParams& p) {
        const u32 k_blocks = ceil_div(p.k, BLOCK_K);
        return kForm == Form::BatchedReduce ? k_blocks * p.num_batches : k_blocks;
    }

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const Bf16GemmParams& params) {
        u8* smem = hal::dynamic_smem();
        const Barriers full{smem + kSmemFull}, empty{smem + kSmemEmpty};
        const u32 warp = hal::warp_idx();

        if (hal::thread_idx() == kNumMathThreads) {
            if (hal::smem_addr(smem) % 1024 != 0)
                hal::trap("dynamic shared memory is not 1024-byte aligned");
            hal::tma_prefetch(&params.tma_a);
            hal::tma_prefetch(&params.tma_b);
            for (u32 s = 0; s < kStages; ++s) {
                hal::mbar_init(&full[s], 1);
                hal::mbar_init(&empty[s], kNumMathWarps);
            }
            hal::fence_view_async_shared();
            hal::fence_barrier_init();
        }
        hal::sync_threads();

        // PDL: everything above touches only shared memory and the parameter block.
        if (warp >= kNumMathWarps) {
            hal::setmaxnreg_dec<kProducerRegisters>();
            hal::grid_dependency_wait();
            if (warp == kNumMathWarps && hal::elect_one_sync()) {
                produce(params, smem, full, empty);
                hal::launch_dependents();
            }
        } else {
            hal::setmaxnreg_inc<kMathRegisters>();
            hal::grid_dependency_wait();
            consume(params, smem, full, empty, warp);
        }
    }

    // ---------------------------------------------------------------- producer (one lane)
    // One operand's K block: K-major, one box (64 K, rows); MN-major, rows / 64 boxes of (64 MN, 64 K).
    template <u32 kRows, bool kMnMajor>
    static DFG_DEVICE void load(u8* dst, const TensorMap* map, u64* bar, u32 row0, u32 k0, u32 batch) {
        if constexpr (kMnMajor) {
            DFG_UNROLL
            for (u32 j = 0; j < kRows / 64; ++j)
                hal::tma_load_3d(dst + j * kMnBoxBytes, map, bar, static_cast<i32>(row0 + 64 * j), static_cast<i32>(k0),
                                 static_cast<i32>(batch));
        } else {
            hal::tma_load_3d(dst, map, bar, static_cast<i32>(k0), static_cast<i32>(row0), static_cast<i32>(batch));
        }
    }

    static DFG_DEVICE void produce(const Bf16GemmParams& params, u8* smem, Barriers full, Barriers empty) {
        Scheduler scheduler(params);
        Pipe pipe;
        Bf16Tile t;
        const u32 k_blocks = ceil_div(params.k, BLOCK_K);
        const u32 iterations = k_iterations(params);
        while (scheduler.next(t)) {
            pipe.for_each_use(iterations, [&](u32 stage, u32 phase, u32 i) {
                // The reduce form's iteration i is K block i % k_blocks of batch s = i / k_blocks.
                const u32 s = kForm == Form::BatchedReduce ? i / k_blocks : 0u;
                const u32 k0 = (kForm == Form::BatchedReduce ? i - s * k_blocks : i) * BLOCK_K;
                hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
                u64* bar = &full[stage];
                hal::mbar_arrive_expect_tx(bar, kStageTxBytes);
                load<BLOCK_M, kMnMajorA>(smem + kSmemA + stage * kSmemABytes, &params.tma_a, bar, t.m_block * BLOCK_M,
                                         k0, kForm == Form::BatchedReduce ? s : t.batch_a);
                load<BLOCK_N, kMnMajorB>(smem + kSmemB + stage * kSmemBBytes, &params.tma_b, bar, t.n_block * BLOCK_N,
                                         k0, kForm == Form::BatchedReduce ? s : t.batch_b);
            });
        }
    }

    // ---------------------------------------------------------------- math warpgroups
    // Descriptor of stage 0's k16 slice 0 for the 64 rows starting at tile row `row0` (a multiple of 64).
    template <bool kMnMajor>
    static DFG_DEVICE u64 first_desc(const u8* tile, u32 row0) {
        return kMnMajor ? make_mn_major_sw128_desc(hal::smem_addr(tile) + row0 / 64 * kMnBoxBytes)
                        : make_k_major_sw128_desc(hal::smem_addr(tile) + row0 * kRowBytes);
    }
    // Bytes from k16 slice j to j + 1: 32 bytes along a K-major row, two 8-row atoms of an MN-major box.
    template <bool kMnMajor>
    static constexpr u32 kSliceBytes = kMnMajor ? 2 * kSwizzle128BAtomBytes : 32;

    static DFG_DEVICE void consume(const Bf16GemmParams& params, u8* smem, Barriers full, Barriers empty, u32 warp) {
        const u32 wg = warp / 4, warp_in_wg = warp % 4, lane = hal::lane_idx();
        const u32 wg_row0 = wg * kWgRows;
        u64 a_desc0[kWaves];
        DFG_UNROLL
        for (u32 w = 0; w < kWaves; ++w)
            a_desc0[w] = first_desc<kMnMajorA>(smem + kSmemA, wg_row0 + 64 * w);
        const u64 b_desc0 = first_desc<kMnMajorB>(smem + kSmemB, 0);

        Scheduler scheduler(params);
        Pipe pipe;
        Bf16Tile t;
        const u32 iterations = k_iterations(params);
        float acc[kWaves][kValues];
        while (scheduler.next(t)) {
            // Zero, then accumulate every slice: no first-slice special case, and k = 0 leaves D = C.
            DFG_UNROLL
            for (u32 w = 0; w < kWaves; ++w) {
                DFG_UNROLL
                for (u32 i = 0; i < kValues; ++i)
                    acc[w][i] = 0.0f;
            }
            pipe.for_each_use(iterations, [&](u32 stage, u32 phase, u32) {
                hal::mbar_wait(&full[stage], kPlanted == kBugFullParity ? phase ^ 1u : phase, full_barrier(stage));
                DFG_UNROLL
                for (u32 w = 0; w < kWaves; ++w) {
                    DFG_UNROLL
                    for (u32 i = 0; i < kValues; ++i)
                        hal::fence_operand(acc[w][i]);
                }
                hal::wgmma_fence();
                DFG_UNROLL
                for (u32 w = 0; w < kWaves; ++w) {
                    DFG_UNROLL
                    for (u32 j = 0; j < kSlices; ++j) {
                        const u64 a = desc_advance(a_desc0[w], stage * kSmemABytes + j * kSliceBytes<kMnMajorA>);
                        const u64 b = desc_advance(b_desc0, stage * kSmemBBytes + j * kSliceBytes<kMnMajorB>);
                        hal::WgmmaBf16<BLOCK_N, kMnMajorA ? 1 : 0, kTransB>::mma(a, b, acc[w], true);
                    }
                }
                hal::wgmma_commit();
                hal::wgmma_wait<0>();
                DFG_UNROLL
                for (u32 w = 0; w < kWaves; ++w) {
                    DFG_UNROLL
                    for (u32 i = 0; i < kValues; ++i)
                        hal::fence_operand(acc[w][i]);
                }
                if (lane == 0)
                    hal::mbar_arrive(&empty[stage]);
            });
            store(params, t, acc, wg_row0, warp_in_wg, lane);
        }
    }

    static DFG_DEVICE float load_out(const Out* p) {
        if constexpr (kFp32Out) {
            return *p;
        } else {
            union {
                u32 bits;
                float value;
            } u{static_cast<u32>(*p) << 16};
            return u.value;
        }
    }

    // D = C + acc (or acc) for the thread's fragment values inside the tile's valid rows and n; C is read before D is
    // written by the same thread, so C may be D.
    static DFG_DEVICE void store(const Bf16GemmParams& params, const Bf16Tile& t, const float (&acc)[kWaves][kValues],
                                 u32 wg_row0, u32 warp_in_wg, u32 lane) {
        Out* d = static_cast<Out*>(params.d) + static_cast<u64>(t.batch_d) * params.d_batch_stride;
        const Out* c = static_cast<const Out*>(params.c) + static_cast<u64>(t.batch_d) * params.c_batch_stride;
        DFG_UNROLL
        for (u32 w = 0; w < kWaves; ++w) {
            DFG_UNROLL
            for (u32 i = 0; i < kValues; ++i) {
                const u32 row = t.m_block * BLOCK_M + wg_row0 + 64 * w + Fragment::row(warp_in_wg, lane, i);
                const u32 col = t.n_block * BLOCK_N + Fragment::col(lane, i);
                if (row >= t.rows || col >= params.n)
                    continue;
                float value = acc[w][i];
                if constexpr (kAccumulate && kPlanted != kBugIgnoreC)
                    value += load_out(c + row * params.c_row_stride + col);
                Out* out = d + row * params.d_row_stride + col;
                if constexpr (kFp32Out)
                    *out = value;
                else
                    *out = static_cast<u16>(hal::pack_bf16x2(value, 0.0f) & 0xFFFFu);
            }
        }
    }
};

}  // namespace bf16
}  // namespace dfg
