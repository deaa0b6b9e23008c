// deep_fp8_gemm fused quantisation kernels: bf16 / fp16 / fp32 -> e4m3 with fp32 scales, memory-bound.
//
// Three kinds, one parameter struct (QuantParams, mirrored by ctypes in deep_fp8_gemm/kernels/quant.py):
//   PerToken        x [rows, k]  -> e4m3 [rows, k] + one scale per (row, 128 columns), written straight into
//                   the TMA-aligned M-major layout the GEMMs read (no transpose afterwards):
//                   scales[(row / rows_per_batch) * scale_batch_stride + group * scale_row_stride
//                          + row % rows_per_batch]
//                   (2-D: rows_per_batch = rows, scale_row_stride = aligned m; 3-D [G, m, k]: rows_per_batch = m).
//   PerBlock        w [batch, n, k] -> e4m3 + one scale per 128x128 block:
//                   scales[batch * scale_batch_stride + block_n * scale_row_stride + block_k].
//   SiluMulPerToken x [rows, 2I] (gate | up) -> y = SiLU(gate) * up in fp32, quantised like PerToken to [rows, I].
//
// Numerics (identical to deep_fp8_gemm.quant): per group amax = max |x| clamped below at 1e-4,
// scale = amax / 448, value = x / scale in fp32 (IEEE division, as torch), e4m3 by round-to-nearest-even
// with saturation to +-448 (cvt.rn.satfinite). A k that is not a multiple of 128 behaves as if zero-padded.
// kUe8m0 (UE8M0 / power-of-two scales, the reference design's use_ue8m0): the fp32 quotient amax / 448 is
// rounded up to 2^ceil(log2(.)) on its bit pattern (exact: no log2 in floating point), see ceil_to_ue8m0.
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
};

enum class InputType : int {
    BF16 = 0,
    FP16 = 1,
    FP32 = 2,
};

constexpr u32 kGroupSize = 128;
constexpr u32 kElemsPerThread = 16;
constexpr u32 kThreadsPerGroup = kGroupSize / kElemsPerThread;
constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-4f;

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

// Quantises 16 values with `scale` (x / scale, IEEE division as torch) and stores the `valid` leading bytes at dst.
template <bool kVectorized>
DFG_DEVICE void quantize_store16(u8* dst, u32 valid, const float (&v)[kElemsPerThread], float scale) {
    Vec16B packed;
    DFG_UNROLL
    for (u32 i = 0; i < 4; ++i) {
        const u32 lo = hal::pack_e4m3x2(v[4 * i] / scale, v[4 * i + 1] / scale);
        const u32 hi = hal::pack_e4m3x2(v[4 * i + 2] / scale, v[4 * i + 3] / scale);
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
template <bool kUe8m0>
DFG_DEVICE float amax_to_scale(u32 amax_bits) {
    float amax = bits_to_float(amax_bits);
    amax = amax < kAmaxFloor ? kAmaxFloor : amax;  // NaN compares false and stays NaN, as torch.clamp
    const float scale = amax / kE4m3Max;
    return kUe8m0 ? ceil_to_ue8m0(scale) : scale;
}

DFG_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

// PerToken and SiluMulPerToken: see the file comment.
template <QuantKind kKind, InputType kType, bool kVectorized, u32 kNumThreads, bool kUe8m0 = false>
DFG_DEVICE void per_token_body(const QuantParams& p) {
    static_assert(kKind == QuantKind::PerToken || kKind == QuantKind::SiluMulPerToken, "per-token kinds");
    static_assert(kNumThreads % 32 == 0 && kNumThreads <= 1024, "whole warps, at most 1024 threads");
    constexpr u32 kUnitsPerBlock = kNumThreads / kThreadsPerGroup;

    const u32 tid = hal::thread_idx();
    const u32 num_groups = ceil_div(p.num_cols, kGroupSize);
    const u32 unit = hal::block_idx() * kUnitsPerBlock + tid / kThreadsPerGroup;
    const bool active = unit < p.num_rows * num_groups;  // host guarantees the product fits in 31 bits
    const u32 group = active ? unit / p.num_rows : 0;
    const u32 row = active ? unit % p.num_rows : 0;
    const u32 col = group * kGroupSize + (tid % kThreadsPerGroup) * kElemsPerThread;
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
    const Vec16B* mine = reinterpret_cast<const Vec16B*>(partial + (tid / kThreadsPerGroup) * kThreadsPerGroup);
    const u32 amax_bits = max_of(max_of_vec(mine[0]), max_of_vec(mine[1]));

    const float scale = amax_to_scale<kUe8m0>(amax_bits);
    quantize_store16<kVectorized>(p.output + u64(row) * p.output_row_stride + col, valid, v, scale);
    if (active && tid % kThreadsPerGroup == 0) {
        const u32 batch = row / p.rows_per_batch;
        const u32 row_in_batch = row - batch * p.rows_per_batch;
        p.scales[u64(batch) * p.scale_batch_stride + u64(group) * p.scale_row_stride + row_in_batch] = scale;
    }
}

// PerBlock: see the file comment.
template <InputType kType, bool kVectorized, u32 kNumThreads, bool kUe8m0 = false>
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

    const float scale = amax_to_scale<kUe8m0>(block_amax);
    DFG_UNROLL
    for (u32 pass = 0; pass < kPasses; ++pass) {
        const u32 r = block_n * kGroupSize + pass * kRowsPerPass + tid / kThreadsPerGroup;
        const u32 valid = r < n ? col_valid : 0;
        const u64 global_row = u64(batch) * n + r;
        quantize_store16<kVectorized>(p.output + global_row * p.output_row_stride + col, valid, v[pass], scale);
    }
    if (tid == 0)
        p.scales[u64(batch) * p.scale_batch_stride + u64(block_n) * p.scale_row_stride + block_k] = scale;
}

template <QuantKind kKind, InputType kType, bool kVectorized, u32 kNumThreads, bool kUe8m0 = false>
DFG_DEVICE void quant_body(const QuantParams& p) {
    if constexpr (kKind == QuantKind::PerBlock) {
        per_block_body<kType, kVectorized, kNumThreads, kUe8m0>(p);
    } else {
        per_token_body<kKind, kType, kVectorized, kNumThreads, kUe8m0>(p);
    }
}

}  // namespace quant
}  // namespace dfg
