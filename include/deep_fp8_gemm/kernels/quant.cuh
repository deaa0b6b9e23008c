// deep_fp8_gemm fused quantisation kernels: bf16 / fp16 / fp32 -> e4m3 with fp32 scales, memory-bound.
//
// Five kinds. Three share one parameter struct (QuantParams, mirrored by ctypes in deep_fp8_gemm/kernels/quant.py):
//   PerToken        x [rows, k]  -> e4m3 [rows, k] + one scale per (row, 128 columns), written straight into
//                   the TMA-aligned M-major layout the GEMMs read (no transpose afterwards):
//                   scales[(row / rows_per_batch) * scale_batch_stride + group * scale_row_stride
//                          + row % rows_per_batch]
//                   (2-D: rows_per_batch = rows, scale_row_stride = aligned m; 3-D [G, m, k]: rows_per_batch = m).
//   PerBlock        w [batch, n, k] -> e4m3 + one scale per 128x128 block:
//                   scales[batch * scale_batch_stride + block_n * scale_row_stride + block_k].
//   SiluMulPerToken x [rows, 2I] (gate | up) -> y = SiLU(gate) * up in fp32, quantised like PerToken to [rows, I].
// and the cast-transpose kinds CastTranspose / KGroupedTranspose (TransposeParams) quantise x and / or xᵀ from one
// read of x through a shared-memory tile: see their section below.
//
// Numerics (identical to deep_fp8_gemm.quant): per group amax = max |x| clamped below at 1e-4,
// scale = amax / 448, value = x / scale in fp32 (IEEE division, as torch), e4m3 by round-to-nearest-even
// with saturation to +-448 (cvt.rn.satfinite). A k that is not a multiple of 128 behaves as if zero-padded.
// kUe8m0 (UE8M0 / power-of-two scales, the reference design's use_ue8m0): the fp32 quotient amax / 448 is
// rounded up to 2^ceil(log2(.)) on its bit pattern (exact: no log2 in floating point), see ceil_to_ue8m0.
// Variants (the bodies' last template argument kVariant, a set of bits; jit/quant.cu passes USE_UE8M0 there, so
// `true` is kUe8m0Scales alone): kDeepGemmCuda computes the reference design's casts (DeepGEMM
// deep_gemm/utils/math.py) as ATen runs them on CUDA, scale = amax * fl(1/448) (ATen divides by a CPU scalar as a
// multiply by its reciprocal, BinaryDivTrueKernel.cu) and value = x * fl(1 / scale) (`x * (1.0 / sf)`), for the
// per-token and per-block kinds; the cast is the same (torch's float8_e4m3fn cast saturates as cvt.satfinite does).
//
// Inputs: bf16, fp16 (widened exactly in software: the hal has no half conversion and none is needed) or fp32.
//
// Work split: every thread owns 16 consecutive elements of one group (two 16-byte bf16/fp16 loads or four
// fp32 loads, one 16-byte e4m3 store), so a 128-element group is 8 consecutive threads of one warp.
//   PerToken / SiluMul: a CTA of kNumThreads threads handles kNumThreads / 8 (row, group) units, ordered
//     group-major (consecutive units = consecutive rows of one scale column, so a warp's scale stores are
//     contiguous). The group amax is exchanged through shared memory: partial[tid] is written, one
//     __syncthreads orders it, and each thread reads its group's 8 partials (two 16-byte broadcast loads).
//   PerBlock: one CTA per 128x128 block; each thread owns 16 columns of 128 / (kNumThreads / 8) rows.
//     Block amax: partial[tid] -> __syncthreads -> the first kNumThreads / 8 threads reduce 8 each into
//     partial[kNumThreads + i] -> __syncthreads -> every thread reduces those.
// Shared memory: (kNumThreads + kNumThreads / 8) * 4 bytes of dynamic shared memory (quant_smem_bytes).
// Amax is reduced on the IEEE bit patterns of |x| (integer max): exact, and a NaN input propagates as in torch.
//
// NOTES: the hal has no warp shuffle, so the 8-thread amax goes through shared memory. A per-warp named
// barrier (bar.sync 1 + warp, 32) would avoid the CTA-wide wait, but a runtime barrier id makes ptxas reserve
// all 16 hardware barriers per CTA, which may limit CTAs per SM; this one-pass kernel has ~6 resident CTAs
// per SM to hide a CTA-wide wait. With a hal shfl_xor the exchange would need no barrier at all.
#pragma once
#include "../hal.cuh"
#if defined(DFG_SIMULATOR)
#include <cmath>  // expf for the host build; NVRTC declares the CUDA math functions itself
#endif

namespace dfg {
namespace quant {

enum class QuantKind : int {
    PerToken = 0,
    PerBlock = 1,
    SiluMulPerToken = 2,
    CastTranspose = 3,      // see "Cast-transpose kinds" below
    KGroupedTranspose = 4,
    PerToken32 = 5,         // PerToken with 1x32 groups (DeepSeek-V4.1's recipe; kernels/fp8_gemm.cuh's block32 A)
};

enum class InputType : int {
    BF16 = 0,
    FP16 = 1,
    FP32 = 2,
};

constexpr u32 kGroupSize = 128;
// Elements per scale group of a per-token kind: 128, or 32 for PerToken32.
DFG_HOST_DEVICE constexpr u32 group_size_of(QuantKind kind) { return kind == QuantKind::PerToken32 ? 32u : kGroupSize; }
constexpr u32 kElemsPerThread = 16;
constexpr u32 kThreadsPerGroup = kGroupSize / kElemsPerThread;
constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-4f;
constexpr u32 kUe8m0Scales = 1u;   // variant bit: power-of-two scales
constexpr u32 kDeepGemmCuda = 2u;  // variant bit: the reference design's CUDA arithmetic (see the file comment)
constexpr float kInvE4m3Max = 1.0f / kE4m3Max;  // fl(1/448), as ATen computes it on the host

// Byte layout mirrored by deep_fp8_gemm.kernels.quant._QuantParams (72 bytes, 8-byte aligned).
struct QuantParams {
    const void* input;        // bf16, fp16 or fp32 elements, rows with stride input_row_stride, last dim contiguous
    u8* output;               // e4m3 bytes, rows with stride output_row_stride
    float* scales;            // see the layout formulas above
    u64 input_row_stride;     // elements
    u64 output_row_stride;    // elements (= bytes)
    u64 up_offset;            // SiluMulPerToken: elements from a gate value to its up value (I); else 0
    u64 scale_batch_stride;   // elements between the scale planes of consecutive batches
    u32 num_rows;             // rows over all batches
    u32 num_cols;             // output columns k (SiluMul: I)
    u32 rows_per_batch;       // PerToken/SiluMul: rows sharing one scale plane; PerBlock: n
    u32 scale_row_stride;     // PerToken/SiluMul: aligned m (stride between scale columns); PerBlock: ceil(k/128)
};
static_assert(sizeof(QuantParams) == 72, "QuantParams layout is mirrored on the host");

struct alignas(16) Vec16B {
    u32 w[4];
};
struct alignas(8) Vec8B {
    u32 w[2];
};

template <u32 kNumThreads>
DFG_HOST_DEVICE constexpr u32 quant_smem_bytes() {
    return (kNumThreads + kNumThreads / kThreadsPerGroup) * 4;
}

DFG_HOST_DEVICE float bits_to_float(u32 bits) { return __builtin_bit_cast(float, bits); }
DFG_HOST_DEVICE u32 float_to_bits(float value) { return __builtin_bit_cast(u32, value); }

// 16-bit storage -> float, exactly. bf16 is the top half of an fp32. For fp16, placing exponent and mantissa
// 13 bits up gives an fp32 2^112 too small (normals and subnormals alike), fixed by one exact multiply;
// exponent 31 (inf / NaN) is mapped separately.
template <InputType kType>
DFG_HOST_DEVICE float half_bits_to_float(u32 bits) {
    if (kType == InputType::BF16) return bits_to_float(bits << 16);
    const u32 sign = (bits & 0x8000u) << 16;
    const u32 magnitude = (bits & 0x7FFFu) << 13;
    const float value = (bits & 0x7C00u) == 0x7C00u ? bits_to_float(magnitude | 0x7F800000u)
                                                    : bits_to_float(magnitude) * 5.192296858534828e33f;  // 2^112
    return bits_to_float(float_to_bits(value) | sign);
}

// Loads `valid` (0..16) elements starting at element `offset` of `base` as floats; the rest read as 0.
// kVectorized promises valid is 0 or 16 and the 16 elements are 16-byte aligned.
template <InputType kType, bool kVectorized>
DFG_DEVICE void load16(const void* base, u64 offset, u32 valid, float (&v)[kElemsPerThread]) {
    if (kVectorized) {
        if (valid == 0) {
            DFG_UNROLL
            for (u32 i = 0; i < kElemsPerThread; ++i) v[i] = 0.0f;
            return;
        }
        if (kType == InputType::FP32) {
            const Vec16B* src = reinterpret_cast<const Vec16B*>(static_cast<const float*>(base) + offset);
            DFG_UNROLL
            for (u32 j = 0; j < 4; ++j) {
                const Vec16B chunk = src[j];
                DFG_UNROLL
                for (u32 i = 0; i < 4; ++i) v[j * 4 + i] = bits_to_float(chunk.w[i]);
            }
        } else {
            const Vec16B* src = reinterpret_cast<const Vec16B*>(static_cast<const u16*>(base) + offset);
            DFG_UNROLL
            for (u32 j = 0; j < 2; ++j) {
                const Vec16B chunk = src[j];
                DFG_UNROLL
                for (u32 i = 0; i < 4; ++i) {
                    v[j * 8 + 2 * i] = half_bits_to_float<kType>(chunk.w[i] & 0xFFFFu);
                    v[j * 8 + 2 * i + 1] = half_bits_to_float<kType>(chunk.w[i] >> 16);
                }
            }
        }
    } else {
        DFG_UNROLL
        for (u32 i = 0; i < kElemsPerThread; ++i) {
            if (i < valid) {
                v[i] = kType == InputType::FP32 ? static_cast<const float*>(base)[offset + i]
                                                : half_bits_to_float<kType>(static_cast<const u16*>(base)[offset + i]);
            } else {
                v[i] = 0.0f;
            }
        }
    }
}

// The value quantised: x / scale (IEEE division, as torch), or with kDeepGemmCuda x * inv, inv = fl(1 / scale).
template <u32 kVariant>
DFG_DEVICE float scaled_value(float x, float scale, float inv) {
    if constexpr ((kVariant & kDeepGemmCuda) != 0u) {
        return x * inv;
    } else {
        return x / scale;
    }
}

// Quantises 16 values with `scale` (see scaled_value) and stores the `valid` leading bytes at dst.
template <bool kVectorized, u32 kVariant = 0u>
DFG_DEVICE void quantize_store16(u8* dst, u32 valid, const float (&v)[kElemsPerThread], float scale) {
    float inv = 0.0f;
    if constexpr ((kVariant & kDeepGemmCuda) != 0u) inv = 1.0f / scale;
    Vec16B packed;
    DFG_UNROLL
    for (u32 i = 0; i < 4; ++i) {
        const u32 lo = hal::pack_e4m3x2(scaled_value<kVariant>(v[4 * i], scale, inv),
                                        scaled_value<kVariant>(v[4 * i + 1], scale, inv));
        const u32 hi = hal::pack_e4m3x2(scaled_value<kVariant>(v[4 * i + 2], scale, inv),
                                        scaled_value<kVariant>(v[4 * i + 3], scale, inv));
        packed.w[i] = lo | (hi << 16);
    }
    if (kVectorized) {
        if (valid != 0) *reinterpret_cast<Vec16B*>(dst) = packed;
    } else {
        DFG_UNROLL
        for (u32 i = 0; i < kElemsPerThread; ++i)
            if (i < valid) dst[i] = static_cast<u8>(packed.w[i / 4] >> (8 * (i % 4)));
    }
}

DFG_DEVICE u32 abs_max_bits(const float (&v)[kElemsPerThread]) {
    u32 amax = 0;
    DFG_UNROLL
    for (u32 i = 0; i < kElemsPerThread; ++i) amax = max_of(amax, float_to_bits(v[i]) & 0x7FFFFFFFu);
    return amax;
}

DFG_DEVICE u32 max_of_vec(const Vec16B& a) { return max_of(max_of(a.w[0], a.w[1]), max_of(a.w[2], a.w[3])); }

// Smallest power of two >= |scale| (UE8M0: an 8-bit exponent, no mantissa), from the fp32 bit pattern:
// the exponent field, plus one when any mantissa bit is set, clamped to [1, 254] (so the result is a
// finite normal; a NaN / inf scale becomes 2^127). Same arithmetic as deep_fp8_gemm.quant.ceil_to_ue8m0.
DFG_HOST_DEVICE float ceil_to_ue8m0(float scale) {
    const u32 bits = float_to_bits(scale);
    u32 exponent = ((bits >> 23) & 0xFFu) + ((bits & 0x7FFFFFu) != 0u ? 1u : 0u);
    exponent = exponent < 1u ? 1u : (exponent > 254u ? 254u : exponent);
    return bits_to_float(exponent << 23);
}

// amax (as |x| bits) -> the scale: values are divided by it before the cast, and the GEMM multiplies by it.
template <u32 kVariant>
DFG_DEVICE float amax_to_scale(u32 amax_bits) {
    float amax = bits_to_float(amax_bits);
    amax = amax < kAmaxFloor ? kAmaxFloor : amax;  // NaN compares false and stays NaN, as torch.clamp
    const float scale = (kVariant & kDeepGemmCuda) != 0u ? amax * kInvE4m3Max : amax / kE4m3Max;
    return (kVariant & kUe8m0Scales) != 0u ? ceil_to_ue8m0(scale) : scale;
}

DFG_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

// PerToken, PerToken32 and SiluMulPerToken: see the file comment (PerToken32: a group is 2 threads of 16 elements).
template <QuantKind kKind, InputType kType, bool kVectorized, u32 kNumThreads, u32 kVariant = 0u>
DFG_DEVICE void per_token_body(const QuantParams& p) {
    static_assert(kKind == QuantKind::PerToken || kKind == QuantKind::PerToken32 || kKind == QuantKind::SiluMulPerToken,
                  "per-token kinds");
    static_assert(kKind != QuantKind::SiluMulPerToken || (kVariant & kDeepGemmCuda) == 0u,
                  "the reference design's arithmetic is a variant of the per-token and per-block casts only");
    static_assert(kNumThreads % 32 == 0 && kNumThreads <= 1024, "whole warps, at most 1024 threads");
    constexpr u32 kGroup = group_size_of(kKind);
    constexpr u32 kThreads = kGroup / kElemsPerThread;  // threads per group: 8, or 2 for PerToken32
    constexpr u32 kUnitsPerBlock = kNumThreads / kThreads;

    const u32 tid = hal::thread_idx();
    const u32 num_groups = ceil_div(p.num_cols, kGroup);
    const u32 unit = hal::block_idx() * kUnitsPerBlock + tid / kThreads;
    const bool active = unit < p.num_rows * num_groups;  // host guarantees the product fits in 31 bits
    const u32 group = active ? unit / p.num_rows : 0;
    const u32 row = active ? unit % p.num_rows : 0;
    const u32 col = group * kGroup + (tid % kThreads) * kElemsPerThread;
    const u32 valid = (active && col < p.num_cols) ? min_of(kElemsPerThread, p.num_cols - col) : 0;

    float v[kElemsPerThread];
    const u64 in_offset = u64(row) * p.input_row_stride + col;
    if (kKind == QuantKind::SiluMulPerToken) {
        float up[kElemsPerThread];
        load16<kType, kVectorized>(p.input, in_offset, valid, v);
        load16<kType, kVectorized>(p.input, in_offset + p.up_offset, valid, up);
        DFG_UNROLL
        for (u32 i = 0; i < kElemsPerThread; ++i) v[i] = silu(v[i]) * up[i];
    } else {
        load16<kType, kVectorized>(p.input, in_offset, valid, v);
    }

    u32* partial = reinterpret_cast<u32*>(hal::dynamic_smem());
    partial[tid] = abs_max_bits(v);
    hal::sync_threads();
    u32 amax_bits;
    if constexpr (kThreads == 8) {  // two 16-byte broadcast loads
        const Vec16B* mine = reinterpret_cast<const Vec16B*>(partial + (tid / kThreads) * kThreads);
        amax_bits = max_of(max_of_vec(mine[0]), max_of_vec(mine[1]));
    } else {  // PerToken32: the pair's two partials, one 8-byte load
        static_assert(kThreads == 2, "1x32 groups: two threads");
        const Vec8B pair = *reinterpret_cast<const Vec8B*>(partial + (tid / kThreads) * kThreads);
        amax_bits = max_of(pair.w[0], pair.w[1]);
    }

    const float scale = amax_to_scale<kVariant>(amax_bits);
    quantize_store16<kVectorized, kVariant>(p.output + u64(row) * p.output_row_stride + col, valid, v, scale);
    if (active && tid % kThreads == 0) {
        const u32 batch = row / p.rows_per_batch;
        const u32 row_in_batch = row - batch * p.rows_per_batch;
        p.scales[u64(batch) * p.scale_batch_stride + u64(group) * p.scale_row_stride + row_in_batch] = scale;
    }
}

// PerBlock: see the file comment.
template <InputType kType, bool kVectorized, u32 kNumThreads, u32 kVariant = 0u>
DFG_DEVICE void per_block_body(const QuantParams& p) {
    constexpr u32 kRowsPerPass = kNumThreads / kThreadsPerGroup;
    static_assert(kGroupSize % kRowsPerPass == 0, "the block's 128 rows split into whole passes");
    static_assert(kRowsPerPass % 4 == 0, "the second reduction stage reads 16-byte vectors");
    constexpr u32 kPasses = kGroupSize / kRowsPerPass;

    const u32 tid = hal::thread_idx();
    const u32 n = p.rows_per_batch;
    const u32 blocks_k = ceil_div(p.num_cols, kGroupSize);
    const u32 blocks_n = ceil_div(n, kGroupSize);
    const u32 bid = hal::block_idx();
    const u32 block_k = bid % blocks_k;
    const u32 block_n = (bid / blocks_k) % blocks_n;
    const u32 batch = bid / (blocks_k * blocks_n);
    const u32 col = block_k * kGroupSize + (tid % kThreadsPerGroup) * kElemsPerThread;
    const u32 col_valid = col < p.num_cols ? min_of(kElemsPerThread, p.num_cols - col) : 0;

    float v[kPasses][kElemsPerThread];
    u32 amax = 0;
    DFG_UNROLL
    for (u32 pass = 0; pass < kPasses; ++pass) {
        const u32 r = block_n * kGroupSize + pass * kRowsPerPass + tid / kThreadsPerGroup;
        const u32 valid = r < n ? col_valid : 0;
        const u64 global_row = u64(batch) * n + r;
        load16<kType, kVectorized>(p.input, global_row * p.input_row_stride + col, valid, v[pass]);
        amax = max_of(amax, abs_max_bits(v[pass]));
    }

    u32* partial = reinterpret_cast<u32*>(hal::dynamic_smem());
    partial[tid] = amax;
    hal::sync_threads();
    if (tid < kRowsPerPass) {
        const Vec16B* src = reinterpret_cast<const Vec16B*>(partial + tid * kThreadsPerGroup);
        partial[kNumThreads + tid] = max_of(max_of_vec(src[0]), max_of_vec(src[1]));
    }
    hal::sync_threads();
    const Vec16B* second = reinterpret_cast<const Vec16B*>(partial + kNumThreads);
    u32 block_amax = 0;
    DFG_UNROLL
    for (u32 i = 0; i < kRowsPerPass / 4; ++i) block_amax = max_of(block_amax, max_of_vec(second[i]));

    const float scale = amax_to_scale<kVariant>(block_amax);
    DFG_UNROLL
    for (u32 pass = 0; pass < kPasses; ++pass) {
        const u32 r = block_n * kGroupSize + pass * kRowsPerPass + tid / kThreadsPerGroup;
        const u32 valid = r < n ? col_valid : 0;
        const u64 global_row = u64(batch) * n + r;
        quantize_store16<kVectorized, kVariant>(p.output + global_row * p.output_row_stride + col, valid, v[pass],
                                                scale);
    }
    if (tid == 0)
        p.scales[u64(batch) * p.scale_batch_stride + u64(block_n) * p.scale_row_stride + block_k] = scale;
}

// ------------------------------------------------------------------------------------------------------------
// Cast-transpose kinds: one read of x [rows, cols], the 1x128 quantisation of xᵀ (groups of 128 consecutive
// rows of x, one scale per (column, 128-row block)) and, for CastTranspose, that of x itself.
//   CastTranspose      x [m, k] -> output   x_fp8 [m, k] row-major, scales x_sf M-major: scales[g * scale_stride + r]
//                                  output_t xt_fp8 [k, m] row-major, scales_t xt_sf M-major:
//                                           scales_t[j * scale_t_stride + c]   (j = 128-row block of x)
//   KGroupedTranspose  x [sum(ks), n] (rows grouped, every ks[g] a multiple of 128) -> only the xᵀ side:
//                      row block j of x lies in group g (group_prefix[g] <= 128 j < group_prefix[g + 1], found by
//                      binary search over the G + 1 prefix sums), and element (r, c) goes to
//                      output_t[n * group_prefix[g] + c * ks[g] + (r - group_prefix[g])] (group g's [n, K_g] block);
//                      scales_t as above ([n, sum(ks) / 128], column j = row block j).
// Numerics are those of the per-token kind on x and on xᵀ (same amax_to_scale, same division), bit for bit.
//
// Work split: one CTA of 256 threads per 128 x 128 tile of x (tile = block_idx: row block major). Thread t owns
// the 4 consecutive rows 4 * (t / 8) .. + 3 ("slot" t / 8) and the 16 columns 16 * (t % 8) .. + 15 of the tile:
// four 16-element loads, each 8 consecutive threads reading one row's 128 contiguous elements (coalesced). Four
// rows of one column quantise into one e4m3 word of xᵀ, so the transposed tile is built from 32-bit stores.
// Barriers (all bar.sync of the whole CTA):
//   1. row partials (|x| bit maxima of each thread's 16 columns, per row) and column partials (per slot, per
//      column) written -> read: the x row scales by every thread, the 128 column maxima by threads 0..127;
//   2. column scales written -> read by every thread; the column partials are dead, the region becomes xᵀ;
//   3. quantised xᵀ words written -> read as 16-byte rows of xᵀ, each 8 consecutive threads storing 128
//      contiguous bytes of one xᵀ row (coalesced).
// Shared memory (transpose_smem_bytes): row partials u32 [4][256] (4 KB) | column partials u32 [32 slots][128],
// reused as the e4m3 tile of xᵀ u32 [128 columns][32 words] (16 KB) | column scales f32 [128] (512 B).
// Bank conflicts: the column partials and scales are stored with their 16-byte chunks XOR-swizzled
// (swizzle_col_word) and the xᵀ tile's words with swizzle_xt_word, so that every store and load of a warp (or,
// for 16-byte accesses, of each quarter warp) touches 32 distinct banks.
// NOTES: bf16 traffic per element: 2 bytes read + 2 written (x_fp8, xt_fp8); two separate per-token quantisations
// of x and of a transposed copy move 2 + 2 + 2 + 2 (read x twice, write and read the copy) + 2. Bandwidth not yet
// measured on a GPU (bench-quant's cast_transpose row).

// Byte layout mirrored by deep_fp8_gemm.kernels.quant.TransposeParams (80 bytes).
struct TransposeParams {
    const void* input;        // x: bf16, fp16 or fp32, rows with stride input_row_stride, last dim contiguous
    u8* output;               // CastTranspose: x_fp8 [rows, cols] row-major; KGroupedTranspose: unused
    float* scales;            // CastTranspose: x_sf, see above; KGroupedTranspose: unused
    u8* output_t;             // xᵀ e4m3, see above
    float* scales_t;          // xᵀ scales, see above
    const i32* group_prefix;  // KGroupedTranspose: G + 1 prefix sums of ks (rows; [0] = 0, [G] = rows)
    u64 input_row_stride;     // elements
    u32 num_rows;             // rows of x (KGroupedTranspose: sum(ks), a multiple of 128)
    u32 num_cols;             // columns of x
    u32 scale_stride;         // x_sf: stride between scale columns (aligned rows)
    u32 scale_t_stride;       // xᵀ scales: stride between scale columns (aligned cols)
    u32 num_groups;           // KGroupedTranspose: G
    u32 reserved;
};
static_assert(sizeof(TransposeParams) == 80, "TransposeParams layout is mirrored on the host");

DFG_HOST_DEVICE constexpr bool is_transpose_kind(QuantKind kind) {
    return kind == QuantKind::CastTranspose || kind == QuantKind::KGroupedTranspose;
}

template <bool kTranspose>
struct ParamsSelect {
    using type = QuantParams;
};
template <>
struct ParamsSelect<true> {
    using type = TransposeParams;
};

constexpr u32 kTile = 128;                                 // tile edge = scale group
constexpr u32 kRowsPerThread = 4;                          // consecutive rows of x: one e4m3 word of xᵀ
constexpr u32 kRowSlots = kTile / kRowsPerThread;          // 32
constexpr u32 kTransposeThreads = kRowSlots * kThreadsPerGroup;  // 256
constexpr u32 kWordsPerTileRow = kTile / 4;                // u32 words in a 128-byte row of the xᵀ tile

DFG_HOST_DEVICE constexpr u32 transpose_smem_bytes() {
    return (kRowsPerThread * kTransposeThreads + kRowSlots * kTile + kTile) * 4;
}

// Word of column c (0..127) in a 128-word row: the 16-byte chunk c / 4 XORed with bits 3..4 of itself. A
// quarter warp storing chunks 4 (t % 8) + q (q fixed) then hits 8 distinct bank quads, and 32 threads reading
// consecutive columns stay inside one permuted group of 8 chunks (32 distinct banks).
DFG_HOST_DEVICE constexpr u32 swizzle_col_chunk(u32 chunk) { return chunk ^ ((chunk >> 3) & 3u); }
DFG_HOST_DEVICE constexpr u32 swizzle_col_word(u32 c) { return swizzle_col_chunk(c / 4) * 4 + c % 4; }

// Word of (xᵀ row c, word w = rows 4w..4w+3 of x) in the xᵀ tile: w XORed with 4 * (c / 16 % 8). A warp's
// stores (w = 4 * warp + lane / 8, c / 16 = lane % 8) cover all 32 banks; 16-byte chunks stay intact (the low
// two bits of w are unchanged), so a quarter warp reads one whole 128-byte row.
DFG_HOST_DEVICE constexpr u32 swizzle_xt_word(u32 c, u32 w) { return c * kWordsPerTileRow + (w ^ (((c >> 4) & 7u) << 2)); }

// Group of the 128-row block starting at row: the g with prefix[g] <= row < prefix[g + 1] (empty groups have
// prefix[g] == prefix[g + 1] and are never chosen). Invariant of the search: prefix[lo] <= row < prefix[hi].
DFG_DEVICE u32 find_group(const i32* prefix, u32 num_groups, u32 row) {
    u32 lo = 0, hi = num_groups;
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (u32(prefix[mid]) <= row) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Stores the `valid` leading bytes of a 16-byte chunk.
template <bool kVectorized>
DFG_DEVICE void store16(u8* dst, u32 valid, const Vec16B& chunk) {
    if (kVectorized) {
        if (valid != 0) *reinterpret_cast<Vec16B*>(dst) = chunk;
    } else {
        DFG_UNROLL
        for (u32 i = 0; i < kElemsPerThread; ++i)
            if (i < valid) dst[i] = static_cast<u8>(chunk.w[i / 4] >> (8 * (i % 4)));
    }
}

// CastTranspose and KGroupedTranspose: see the section comment. kVectorized: 16-byte loads of x and stores of
// x_fp8 / xᵀ (the host requires cols % 16 == 0, 16-byte aligned rows and, for CastTranspose, rows % 16 == 0).
template <QuantKind kKind, InputType kType, bool kVectorized, u32 kNumThreads, u32 kVariant = 0u>
DFG_DEVICE void cast_transpose_body(const TransposeParams& p) {
    static_assert(is_transpose_kind(kKind), "cast-transpose kinds");
    static_assert((kVariant & kDeepGemmCuda) == 0u, "the cast-transposes use this library's arithmetic only");
    static_assert(kNumThreads == kTransposeThreads, "one thread per (4 rows, 16 columns) of a 128 x 128 tile");
    constexpr bool kWithRows = kKind == QuantKind::CastTranspose;

    const u32 tid = hal::thread_idx();
    const u32 tiles_c = ceil_div(p.num_cols, kTile);
    const u32 tile_r = hal::block_idx() / tiles_c;
    const u32 tile_c = hal::block_idx() % tiles_c;
    const u32 row0 = tile_r * kTile;
    const u32 col0 = tile_c * kTile;
    const u32 slot = tid / kThreadsPerGroup;
    const u32 first_col = (tid % kThreadsPerGroup) * kElemsPerThread;  // in the tile
    const u32 col = col0 + first_col;
    const u32 col_valid = col < p.num_cols ? min_of(kElemsPerThread, p.num_cols - col) : 0;

    // KGroupedTranspose: where this row block's group starts and its row count (uniform over the CTA).
    u32 group_start = 0, group_rows = p.num_rows;
    if constexpr (!kWithRows) {
        const u32 g = find_group(p.group_prefix, p.num_groups, row0);
        group_start = u32(p.group_prefix[g]);
        group_rows = u32(p.group_prefix[g + 1]) - group_start;
    }

    float v[kRowsPerThread][kElemsPerThread];
    DFG_UNROLL
    for (u32 j = 0; j < kRowsPerThread; ++j) {
        const u32 r = row0 + slot * kRowsPerThread + j;
        load16<kType, kVectorized>(p.input, u64(r) * p.input_row_stride + col, r < p.num_rows ? col_valid : 0, v[j]);
    }

    u32* row_partial = reinterpret_cast<u32*>(hal::dynamic_smem());   // [kRowsPerThread][kNumThreads]
    u32* col_partial = row_partial + kRowsPerThread * kNumThreads;     // [kRowSlots][kTile], then the xᵀ tile
    float* col_scale = reinterpret_cast<float*>(col_partial + kRowSlots * kTile);  // [kTile], swizzled
    if constexpr (kWithRows) {
        DFG_UNROLL
        for (u32 j = 0; j < kRowsPerThread; ++j) row_partial[j * kNumThreads + tid] = abs_max_bits(v[j]);
    }
    DFG_UNROLL
    for (u32 q = 0; q < kElemsPerThread / 4; ++q) {
        Vec16B chunk;
        DFG_UNROLL
        for (u32 i = 0; i < 4; ++i) {
            u32 amax = 0;
            DFG_UNROLL
            for (u32 j = 0; j < kRowsPerThread; ++j) amax = max_of(amax, float_to_bits(v[j][4 * q + i]) & 0x7FFFFFFFu);
            chunk.w[i] = amax;
        }
        const u32 dst_chunk = swizzle_col_chunk(first_col / 4 + q);
        *reinterpret_cast<Vec16B*>(col_partial + slot * kTile + dst_chunk * 4) = chunk;
    }
    hal::sync_threads();  // 1: partials

    if (tid < kTile) {  // column tid of the tile: the scale of its 128-row group (one row of xᵀ)
        u32 amax = 0;
        DFG_UNROLL
        for (u32 s = 0; s < kRowSlots; ++s) amax = max_of(amax, col_partial[s * kTile + swizzle_col_word(tid)]);
        const float scale = amax_to_scale<kVariant>(amax);
        col_scale[swizzle_col_word(tid)] = scale;
        if (col0 + tid < p.num_cols) p.scales_t[u64(tile_r) * p.scale_t_stride + col0 + tid] = scale;
    }
    if constexpr (kWithRows) {  // the rows of x: 8 threads per row and 128-column group, as PerToken
        DFG_UNROLL
        for (u32 j = 0; j < kRowsPerThread; ++j) {
            const Vec16B* group = reinterpret_cast<const Vec16B*>(row_partial + j * kNumThreads + slot * kThreadsPerGroup);
            const float scale = amax_to_scale<kVariant>(max_of(max_of_vec(group[0]), max_of_vec(group[1])));
            const u32 r = row0 + slot * kRowsPerThread + j;
            const u32 valid = r < p.num_rows ? col_valid : 0;
            quantize_store16<kVectorized>(p.output + u64(r) * p.num_cols + col, valid, v[j], scale);
            if (tid % kThreadsPerGroup == 0 && r < p.num_rows) p.scales[u64(tile_c) * p.scale_stride + r] = scale;
        }
    }
    hal::sync_threads();  // 2: column scales; the column partials are dead

    float scale_t[kElemsPerThread];  // of this thread's 16 columns (xᵀ rows); divided by, as torch does
    DFG_UNROLL
    for (u32 q = 0; q < kElemsPerThread / 4; ++q) {
        const Vec16B chunk =
            *reinterpret_cast<const Vec16B*>(col_scale + swizzle_col_chunk(first_col / 4 + q) * 4);
        DFG_UNROLL
        for (u32 i = 0; i < 4; ++i) scale_t[4 * q + i] = bits_to_float(chunk.w[i]);
    }
    u32* xt_tile = col_partial;
    DFG_UNROLL
    for (u32 i = 0; i < kElemsPerThread; ++i) {
        const u32 lo = hal::pack_e4m3x2(v[0][i] / scale_t[i], v[1][i] / scale_t[i]);
        const u32 hi = hal::pack_e4m3x2(v[2][i] / scale_t[i], v[3][i] / scale_t[i]);
        xt_tile[swizzle_xt_word(first_col + i, slot)] = lo | (hi << 16);
    }
    hal::sync_threads();  // 3: the e4m3 tile of xᵀ

    constexpr u32 kXtRowsPerPass = kNumThreads / kThreadsPerGroup;  // 8 threads x 16 bytes per xᵀ row
    DFG_UNROLL
    for (u32 pass = 0; pass < kTile / kXtRowsPerPass; ++pass) {
        const u32 c = pass * kXtRowsPerPass + tid / kThreadsPerGroup;  // xᵀ row in the tile (column of x)
        const u32 w = (tid % kThreadsPerGroup) * 4;                    // first word: rows 4w.. of x
        const Vec16B chunk = *reinterpret_cast<const Vec16B*>(xt_tile + swizzle_xt_word(c, w));
        const u32 r = row0 + 4 * w;  // first row of x (column of xᵀ) of the chunk
        const bool in_cols = col0 + c < p.num_cols;
        const u32 valid = in_cols && r < p.num_rows ? min_of(kElemsPerThread, p.num_rows - r) : 0;
        u8* dst = kWithRows ? p.output_t + u64(col0 + c) * p.num_rows + r
                            : p.output_t + u64(p.num_cols) * group_start + u64(col0 + c) * group_rows + (r - group_start);
        // KGroupedTranspose: ks[g] % 128 == 0 keeps every chunk 16-byte aligned, whatever the input.
        if constexpr (kWithRows) {
            store16<kVectorized>(dst, valid, chunk);
        } else {
            store16<true>(dst, valid, chunk);
        }
    }
}

// The parameter struct of a kind: QuantParams, or TransposeParams for the cast-transpose kinds.
template <QuantKind kKind>
using ParamsOf = typename ParamsSelect<is_transpose_kind(kKind)>::type;

// kVariant: the variant bits (kUe8m0Scales, kDeepGemmCuda); the entry's `true` / `false` are 1 / 0.
template <QuantKind kKind, InputType kType, bool kVectorized, u32 kNumThreads, u32 kVariant = 0u>
DFG_DEVICE void quant_body(const ParamsOf<kKind>& p) {
    // PDL (deep_fp8_gemm.set_pdl): wait for the previous kernel of the stream before the first global access;
    // every CTA of this grid is then running, so the next kernel may launch at once (it waits for this one).
    hal::grid_dependency_wait();
    hal::launch_dependents();
    if constexpr (kKind == QuantKind::PerBlock) {
        per_block_body<kType, kVectorized, kNumThreads, kVariant>(p);
    } else if constexpr (is_transpose_kind(kKind)) {
        cast_transpose_body<kKind, kType, kVectorized, kNumThreads, kVariant>(p);
    } else {
        per_token_body<kKind, kType, kVectorized, kNumThreads, kVariant>(p);
    }
}

}  // namespace quant
}  // namespace dfg
