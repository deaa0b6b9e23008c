// tf32_hc_prenorm_gemm on sm_90a (issue 41; DeepSeek-V4's hyper-connection pre-norm): for a [m, k] bf16 K-major,
// B [n, k] fp32 K-major (n <= 32, n % 8 == 0, k % 64 == 0), per split s of K (the balanced partition of the k / 64
// K blocks: split s takes q + (s < r) consecutive blocks, q, r = divmod(k / 64, num_splits)):
//     D[s] = A[:, K_s] . B[:, K_s]^T   in TF32 on the tensor core (fp32 accumulation), [m, n] fp32
//     S[s] = sum over K_s of A^2       per row, fp32 on the CUDA cores
// A split with no K block writes zeros (the reference design's rule).
//
// One CTA per (64-row block, split): grid = ceil(m / 64) x num_splits, not persistent (n <= 32 makes a tile 64 x 32:
// a persistent walk would buy nothing the hardware scheduler does not give).
//
// Why A is converted in shared memory (SS wgmma), not issued from registers (RS): tf32 wgmma reads fp32 words; A
// arrives as bf16 (TMA, 128-byte swizzle) and must also be squared, so every element passes through a math thread's
// registers once anyway. Each math thread widens its 32 bf16 (one half row) to fp32 (exact: bf16 is the top half of
// an fp32), adds their squares to its row's partial sum, and stores them into a converted fp32 tile laid out as TMA
// would have written an fp32 [64 x 32] box with the 128-byte swizzle (two such boxes per 64-wide K block). The SS form
// then reuses the descriptors and the simulator model the BF16 kernel and the miniature GEMM check; the RS form would
// need a tf32 register-fragment model of its own. The converted tile is double-buffered, so converting K block i + 1
// never overwrites what the wgmma of block i reads (each thread retires its wgmma before the next block's barrier).
//
// Warp roles (256 threads): warpgroup 0 math (64 rows: one m64 wave, 240 registers); warpgroup 1 producer (40
// registers; one elected lane issues every TMA load).
// Barriers: full[s] producer -> math (1 arrive.expect_tx: A's 8 KiB + B's 2 x BLOCK_N x 128 bytes); empty[s] math ->
// producer (4 arrives: lane 0 of each math warp after its wgmma retired).
// Shared memory (1024-aligned): A stages [kStages][64 x 128 B] | B stages [kStages][2][BLOCK_N x 128 B] |
// converted A [2][2][64 x 128 B] | full[kStages] | empty[kStages]; = kernels/hc_prenorm.py HcPrenormConfig.smem_bytes().
#pragma once
#include "../common.cuh"
#include "../hal.cuh"
#include "../mma.cuh"
#include "../pipeline.cuh"

namespace dfg {
namespace hc_prenorm {

// Planted bugs for the simulator tests (kernels/hc_prenorm.py PLANTED; 0 in every real build).
enum Planted : u32 {
    kNoBug = 0,
    kBugSplitRange = 1,   // the sum of squares skips the split's first K block
    kBugNoSwizzle = 2,    // the converted tile is stored without the 128-byte swizzle
    kBugRowsPastM = 3,    // the epilogue writes rows of the last block past m
    kBugNoProxyFence = 4, // the converted tile is read by wgmma without fence.proxy.async
};

// The kernel's one parameter. Byte layout mirrored by deep_fp8_gemm/kernels/hc_prenorm.py (HcPrenormParams).
struct HcPrenormParams {
    TensorMap tma_a;  // bf16 a: dims (k, m, 1), box (64, 64, 1), 128-byte swizzle
    TensorMap tma_b;  // fp32 b: dims (k, n, 1), box (32, BLOCK_N, 1), 128-byte swizzle
    float* d;         // [num_splits][m][n] (num_splits 1: [m][n]), contiguous
    float* sqr_sum;   // [num_splits][m], contiguous
    u32 m;
    u32 n;
    u32 k;
    u32 num_splits;
    u8 reserved[32];  // 0: the struct is a multiple of the tensor maps' 64-byte alignment
};
static_assert(DFG_OFFSETOF(HcPrenormParams, tma_b) == 128 && DFG_OFFSETOF(HcPrenormParams, d) == 256 &&
                  DFG_OFFSETOF(HcPrenormParams, sqr_sum) == 264 && DFG_OFFSETOF(HcPrenormParams, m) == 272 &&
                  DFG_OFFSETOF(HcPrenormParams, num_splits) == 284 && sizeof(HcPrenormParams) == 320,
              "HcPrenormParams layout is mirrored in deep_fp8_gemm/kernels/hc_prenorm.py");

// 16-byte shared-memory accesses (one LDS.128 / STS.128 each on the GPU; element-wise in the simulator).
struct alignas(16) Words4 {
    u32 w[4];
};
struct alignas(16) Floats4 {
    float f[4];
};
DFG_HOST_DEVICE float as_float(u32 bits) { return __builtin_bit_cast(float, bits); }

// The K blocks [first, first + count) of split s (the balanced partition; the reference's and
// _core/hc_prenorm_math.split_ranges').
struct SplitRange {
    u32 first, count;
    DFG_DEVICE static SplitRange of(u32 k_blocks, u32 splits, u32 s) {
        const u32 q = k_blocks / splits, r = k_blocks % splits;
        return SplitRange{s * q + min_of(s, r), q + (s < r ? 1u : 0u)};
    }
};

template <u32 BLOCK_N, u32 kStages, u32 kPlanted, u32 kExpectedSmemBytes>
struct HcPrenormKernel {
    static constexpr u32 BLOCK_M = 64;
    static constexpr u32 BLOCK_K = 64;              // elements per K block: one 128-byte bf16 row of A
    static constexpr u32 kHalfK = 32;               // fp32 elements of one 128-byte swizzled row (a TMA box's width)
    static constexpr u32 kNumMathThreads = 128;
    static constexpr u32 kNumThreads = 256;
    static constexpr u32 kValues = BLOCK_N / 2;     // accumulators per math thread
    static constexpr u32 kProducerRegisters = 40;
    static constexpr u32 kMathRegisters = 240;
    static constexpr u32 kBarrierConverted = 1;     // named barrier: the math warpgroup's converted tile is complete

    static_assert(BLOCK_N == 16 || BLOCK_N == 32, "n <= 32: BLOCK_N = align(n, 16)");
    static_assert(kStages >= 2 && kStages <= 16, "stage count");

    // ---------------------------------------------------------------- shared-memory map
    static constexpr u32 kRowBytes = 128;
    static constexpr u32 kSmemABytes = BLOCK_M * kRowBytes;          // bf16 [64 x 64]
    static constexpr u32 kSmemBHalfBytes = BLOCK_N * kRowBytes;      // fp32 [BLOCK_N x 32]
    static constexpr u32 kSmemBBytes = 2 * kSmemBHalfBytes;
    static constexpr u32 kSmemCvtHalfBytes = BLOCK_M * kRowBytes;    // fp32 [64 x 32]
    static constexpr u32 kSmemCvtBytes = 2 * kSmemCvtHalfBytes;
    static constexpr u32 kSmemA = 0;
    static constexpr u32 kSmemB = kSmemA + kStages * kSmemABytes;
    static constexpr u32 kSmemCvt = kSmemB + kStages * kSmemBBytes;
    static constexpr u32 kSmemFull = kSmemCvt + 2 * kSmemCvtBytes;
    static constexpr u32 kSmemEmpty = kSmemFull + 8 * kStages;
    static constexpr u32 kSmemBytes = kSmemEmpty + 8 * kStages;
    static constexpr u32 kStageTxBytes = kSmemABytes + kSmemBBytes;
    static_assert(kSmemBHalfBytes % 1024 == 0 && kSmemABytes % 1024 == 0, "boxes keep the swizzle atoms' alignment");
    static_assert(kSmemBytes <= 232448, "227 KB of shared memory per block");
    static_assert(kSmemBytes + 1024 <= kMaxSmemWindow, "desc_advance needs shared addresses below 2^18");
    static_assert(kSmemBytes == kExpectedSmemBytes,
                  "shared-memory size disagrees with deep_fp8_gemm/kernels/hc_prenorm.py: keep the two maps identical");

    using Pipe = PipelineState<kStages>;
    using Barriers = StageBarriers<8>;
    using Fragment = WgmmaFragment<BLOCK_N>;

    // ---------------------------------------------------------------- entry
    static DFG_DEVICE void run(const HcPrenormParams& params) {
        u8* smem = hal::dynamic_smem();
        const Barriers full{smem + kSmemFull}, empty{smem + kSmemEmpty};
        const u32 warp = hal::warp_idx();
        const u32 m_blocks = ceil_div(params.m, BLOCK_M);
        const u32 m_block = hal::block_idx() % m_blocks, split = hal::block_idx() / m_blocks;
        const SplitRange range = SplitRange::of(params.k / BLOCK_K, params.num_splits, split);

        if (hal::thread_idx() == kNumMathThreads) {
            if (hal::smem_addr(smem) % 1024 != 0)
                hal::trap("dynamic shared memory is not 1024-byte aligned");
            hal::tma_prefetch(&params.tma_a);
            hal::tma_prefetch(&params.tma_b);
            for (u32 s = 0; s < kStages; ++s) {
                hal::mbar_init(&full[s], 1);
                hal::mbar_init(&empty[s], kNumMathThreads / 32);
            }
            hal::fence_view_async_shared();
            hal::fence_barrier_init();
        }
        hal::sync_threads();

        // PDL: everything above touches only shared memory and the parameter block.
        if (warp >= kNumMathThreads / 32) {
            hal::setmaxnreg_dec<kProducerRegisters>();
            hal::grid_dependency_wait();
            if (warp == kNumMathThreads / 32 && hal::elect_one_sync()) {
                produce(params, smem, full, empty, m_block, range);
                hal::launch_dependents();
            }
        } else {
            hal::setmaxnreg_inc<kMathRegisters>();
            hal::grid_dependency_wait();
            consume(params, smem, full, empty, warp, m_block, split, range);
        }
    }

    // ---------------------------------------------------------------- producer (one lane)
    static DFG_DEVICE void produce(const HcPrenormParams& params, u8* smem, Barriers full, Barriers empty, u32 m_block,
                                   SplitRange range) {
        Pipe pipe;
        pipe.for_each_use(range.count, [&](u32 stage, u32 phase, u32 i) {
            const i32 k0 = static_cast<i32>((range.first + i) * BLOCK_K);
            hal::mbar_wait(&empty[stage], phase ^ 1u, empty_barrier(stage));
            u64* bar = &full[stage];
            hal::mbar_arrive_expect_tx(bar, kStageTxBytes);
            hal::tma_load_3d(smem + kSmemA + stage * kSmemABytes, &params.tma_a, bar, k0,
                             static_cast<i32>(m_block * BLOCK_M), 0);
            u8* b = smem + kSmemB + stage * kSmemBBytes;
            hal::tma_load_3d(b, &params.tma_b, bar, k0, 0, 0);
            hal::tma_load_3d(b + kSmemBHalfBytes, &params.tma_b, bar, k0 + static_cast<i32>(kHalfK), 0, 0);
        });
    }

    // ---------------------------------------------------------------- math warpgroup
    // Byte offset of 16-byte chunk `chunk` of row `row` in a [rows x 128 B] tile with the 128-byte swizzle (TMA's
    // Swizzle<3, 4, 3>: the chunk index XOR the row within its 8-row, 1024-byte atom).
    static DFG_DEVICE u32 swizzled(u32 row, u32 chunk) {
        return row * kRowBytes + 16 * (kPlanted == kBugNoSwizzle ? chunk : (chunk ^ (row % 8)));
    }

    // Thread t widens row t / 2's K elements [32 h, 32 h + 32) (h = t % 2) of the stage's bf16 tile into the converted
    // tile's box h, and returns the sum of their squares (in K order; fp32).
    static DFG_DEVICE float convert(const u8* a_tile, u8* cvt, u32 row, u32 half, bool count_squares) {
        float squares = 0.0f;
        DFG_UNROLL
        for (u32 c = 0; c < 4; ++c) {  // 4 chunks of 8 bf16 (16 bytes) in, 8 chunks of 4 fp32 out
            const Words4 in = *reinterpret_cast<const Words4*>(a_tile + swizzled(row, 4 * half + c));
            float values[8];
            DFG_UNROLL
            for (u32 j = 0; j < 4; ++j) {
                values[2 * j] = as_float(in.w[j] << 16);  // bf16 -> fp32: exact (the low element first)
                values[2 * j + 1] = as_float(in.w[j] & 0xFFFF0000u);
            }
            DFG_UNROLL
            for (u32 j = 0; j < 8; ++j)
                squares = hal::fma_rn(values[j], values[j], squares);
            DFG_UNROLL
            for (u32 j = 0; j < 2; ++j) {
                const Floats4 out{{values[4 * j], values[4 * j + 1], values[4 * j + 2], values[4 * j + 3]}};
                *reinterpret_cast<Floats4*>(cvt + half * kSmemCvtHalfBytes + swizzled(row, 2 * c + j)) = out;
            }
        }
        return count_squares ? squares : 0.0f;
    }

    static DFG_DEVICE void consume(const HcPrenormParams& params, u8* smem, Barriers full, Barriers empty, u32 warp,
                                   u32 m_block, u32 split, SplitRange range) {
        const u32 lane = hal::lane_idx(), t = hal::thread_idx();
        const u32 row = t / 2, half = t % 2;
        const u64 b_desc0 = make_k_major_sw128_desc(hal::smem_addr(smem + kSmemB));
        const u64 cvt_desc0 = make_k_major_sw128_desc(hal::smem_addr(smem + kSmemCvt));
        float acc[kValues];
        DFG_UNROLL
        for (u32 i = 0; i < kValues; ++i)
            acc[i] = 0.0f;
        float squares = 0.0f;

        Pipe pipe;
        pipe.for_each_use(range.count, [&](u32 stage, u32 phase, u32 i) {
            hal::mbar_wait(&full[stage], phase, full_barrier(stage));
            const u32 buffer = i % 2;
            u8* cvt = smem + kSmemCvt + buffer * kSmemCvtBytes;
            squares += convert(smem + kSmemA + stage * kSmemABytes, cvt, row, half,
                               kPlanted != kBugSplitRange || i > 0);
            if constexpr (kPlanted != kBugNoProxyFence)
                hal::fence_view_async_shared();  // the generic-proxy stores above, before wgmma's async reads
            hal::named_barrier_sync(kBarrierConverted, kNumMathThreads);
            DFG_UNROLL
            for (u32 v = 0; v < kValues; ++v)
                hal::fence_operand(acc[v]);
            hal::wgmma_fence();
            DFG_UNROLL
            for (u32 j = 0; j < BLOCK_K / 8; ++j) {  // 8 k8 slices: 4 per 32-wide box, 32 bytes apart
                const u32 box = j / 4, slice_bytes = (j % 4) * 32;
                const u64 a = desc_advance(cvt_desc0, buffer * kSmemCvtBytes + box * kSmemCvtHalfBytes + slice_bytes);
                const u64 b = desc_advance(b_desc0, stage * kSmemBBytes + box * kSmemBHalfBytes + slice_bytes);
                hal::WgmmaTf32<BLOCK_N>::mma(a, b, acc, true);
            }
            hal::wgmma_commit();
            hal::wgmma_wait<0>();
            DFG_UNROLL
            for (u32 v = 0; v < kValues; ++v)
                hal::fence_operand(acc[v]);
            if (lane == 0)
                hal::mbar_arrive(&empty[stage]);
        });
        store(params, m_block, split, acc, squares, warp, lane, row, half);
    }

    // D[split] rows of this block (< m), columns < n; S[split][row] = the two half rows' sums (half 0 + half 1, the
    // same order in both threads, so the pair agrees bit for bit).
    static DFG_DEVICE void store(const HcPrenormParams& params, u32 m_block, u32 split, const float (&acc)[kValues],
                                 float squares, u32 warp, u32 lane, u32 row, u32 half) {
        const u32 rows = kPlanted == kBugRowsPastM ? (m_block + 1) * BLOCK_M : params.m;
        float* d = params.d + static_cast<u64>(split) * params.m * params.n;
        DFG_UNROLL
        for (u32 i = 0; i < kValues; ++i) {
            const u32 r = m_block * BLOCK_M + Fragment::row(warp, lane, i), col = Fragment::col(lane, i);
            if (r < rows && col < params.n)
                d[static_cast<u64>(r) * params.n + col] = acc[i];
        }
        const float other = hal::shfl_xor(squares, 1);
        const float total = half == 0 ? squares + other : other + squares;
        const u32 r = m_block * BLOCK_M + row;
        if (half == 0 && r < rows)
            params.sqr_sum[static_cast<u64>(split) * params.m + r] = total;
    }
};

}  // namespace hc_prenorm
}  // namespace dfg
