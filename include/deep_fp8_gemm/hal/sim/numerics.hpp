// deep_fp8_gemm CPU simulator: fp8 / bf16 numerics.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- numerics

// e4m3 (OCP FP8 "E4M3FN"): bias 7, no infinities, S.1111.111 is NaN.
struct E4m3Table {
    float value[256];
    E4m3Table() {
        for (int code = 0; code < 256; ++code) {
            const int exp = (code >> 3) & 15, man = code & 7;
            float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                                 : std::ldexp(static_cast<float>(8 + man), exp - 10);
            if ((code & 0x7F) == 0x7F) mag = NAN;
            value[code] = (code & 0x80) ? -mag : mag;
        }
    }
};
inline const E4m3Table g_e4m3;

// cvt.rn.satfinite.e4m3x2.f32 (PTX ISA "cvt"): round to nearest even, finite results saturate to
// +-448, NaN -> 0x7F.
DFG_SIM_API u8 float_to_e4m3(float x) {
    if (std::isnan(x)) return 0x7F;
    const u8 sign = std::signbit(x) ? 0x80 : 0;
    const float a = std::fabs(x);
    if (a >= 448.f) return sign | 0x7E;
    // Quantum of a's binade (subnormal quantum 2^-9 below 2^-6); a / q is exact, nearbyint rounds to even.
    const int e = a < 0x1p-6f ? -6 : std::ilogb(a);
    const float q = std::ldexp(1.f, e - 3);
    const float r = std::nearbyint(a / q) * q;
    if (r >= 448.f) return sign | 0x7E;
    if (r < 0x1p-6f) return sign | static_cast<u8>(r * 512.f);  // subnormal: code = r / 2^-9
    const int re = std::ilogb(r);
    const int man = static_cast<int>(std::ldexp(r, 3 - re)) - 8;
    return sign | static_cast<u8>(((re + 7) << 3) | man);
}

// cvt.rn.bf16x2.f32: round to nearest even; NaN -> canonical NaN 0x7FFF.
DFG_SIM_API u16 float_to_bf16(float x) {
    if (std::isnan(x)) return 0x7FFF;
    u32 bits;
    std::memcpy(&bits, &x, 4);
    return static_cast<u16>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------- the FP8 tensor-core inner product
// Our model of wgmma .f32.e4m3.e4m3 on H100 / H200, from the published facts (DeepSeek-V3 report; Khattak &
// Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004; MMA-Sim, Xie et al. 2025): the
// products of two e4m3 values are exact; the accumulator does not keep fp32 precision but ~13 mantissa bits.
// Modelled: the k32 step is two fused additions, each of 16 exact products and the incoming accumulator;
// every addend is aligned to the largest exponent among them and truncated (toward zero) to
// kMmaAlignBits bits below that leading bit; the aligned addends are summed exactly and the sum is
// truncated to kMmaAccBits mantissa bits (e8m13) before it is stored as an fp32 accumulator. NaN / Inf
// follow IEEE addition. This is not claimed to be bit-exact to the hardware; it reproduces the effect that
// matters for the kernels: addends much smaller than the running sum lose their low bits, so a long K
// reduction inside the tensor core drifts, which is why the kernels promote to fp32 every 128 K.
//
// Stated assumptions (what the model takes to be true of the hardware, and what code above this layer may rely
// on; the first GPU run confirms them: tests/test_sim_register_a.py, test_gpu_confirms_the_model_assumptions_and_
// the_fragment_layout, runs the same probe on an sm_90 device):
//   * The inner product is symmetric in its operands: D(A, B) = D(B, A)^T bit for bit. Here by construction (the
//     products of two e4m3 values are exact and commute; the alignment, truncation and sum of a group depend on
//     the set of its 16 products and the accumulator only), which the batch-invariance work relies on when it
//     swaps A and B (swap-AB computes the transposed tile).
//   * The per-k-group accumulation is the same whether A comes from shared memory (a descriptor) or registers
//     (WgmmaFp8RegA): both are the same tensor-core datapath fed the same e4m3 values in the same k order, so a
//     kernel that forms A in registers (MXFP4 weights converted on the CUDA cores) gets the bits of the same A
//     through shared memory. Here both paths gather A's codes and call mma_fp8_k32 identically (wgmma.hpp, execute).
//   * The k order is fixed: k32 = two groups of 16 in ascending k, each fused with the incoming accumulator.
// Fixed point: an e4m3 value is an integer number of 2^-9 (its subnormal quantum), at most 448 * 2^9 < 2^18,
// so a product is an exact integer number of 2^-18 below 2^36 and a group of 16 sums exactly in 64 bits.
constexpr int kMmaAlignBits = 13;
constexpr int kMmaAccBits = 13;
constexpr u32 kMmaGroup = 16;

struct E4m3Fixed {
    u32 mag[256];  // |value| / 2^-9 (0 for NaN codes)
    u32 neg[256];  // 1 for negative codes
    bool nan[256];
    E4m3Fixed() {
        for (int code = 0; code < 256; ++code) {
            nan[code] = (code & 0x7F) == 0x7F;
            const int exp = (code >> 3) & 15, man = code & 7;
            mag[code] = nan[code] ? 0 : exp == 0 ? u32(man) : u32(8 + man) << (exp - 1);
            neg[code] = code >> 7;
        }
    }
};
inline const E4m3Fixed g_e4m3_fixed;

inline int leading_bit(u64 x) { return 63 - __builtin_clzll(x); }

// One k32 step for one accumulator. a_mag / b_mag: |e4m3 value| in units of 2^-9; a_neg / b_neg: 1 where
// negative; c: the accumulator. Magnitude and sign are kept apart so that the loops vectorise (SSE2 has
// unsigned 32x32->64 multiplies and uniform 64-bit shifts).
inline float mma_fp8_k32(const u32* a_mag, const u32* a_neg, const u32* b_mag, const u32* b_neg, float c) {
    float acc = c;
    for (u32 g = 0; g < 32; g += kMmaGroup) {
        u64 mag[kMmaGroup], neg[kMmaGroup];
        u64 any = 0;  // OR of the magnitudes: same leading bit as the largest
        for (u32 k = 0; k < kMmaGroup; ++k) {
            mag[k] = u64(a_mag[g + k]) * b_mag[g + k];  // exact, units of 2^-18, < 2^36
            neg[k] = u64(0) - u64(a_neg[g + k] ^ b_neg[g + k]);  // all ones when negative
            any |= mag[k];
        }
        if (!std::isfinite(acc)) continue;  // Inf / NaN absorb finite addends
        int acc_exp = INT32_MIN;  // leading-bit exponent of the accumulator
        i64 acc_sig = 0;          // |acc| = acc_sig * 2^(acc_exp - 23)
        u32 bits;
        std::memcpy(&bits, &acc, 4);
        if (bits & 0x7F800000u) {  // normal (finite, checked above)
            acc_exp = int((bits >> 23) & 0xFF) - 127;
            acc_sig = i64((bits & 0x7FFFFFu) | 0x800000u);
        } else if (bits & 0x7FFFFFu) {  // subnormal
            int e;
            const float f = std::frexp(acc, &e);
            acc_exp = e - 1;
            acc_sig = static_cast<i64>(std::fabs(std::ldexp(f, 24)));
        }
        if (any == 0 && acc_sig == 0) continue;
        const int prod_exp = any ? leading_bit(any) - 18 : INT32_MIN;
        const int emax = prod_exp > acc_exp ? prod_exp : acc_exp;
        // Every addend in units of q = 2^(emax - kMmaAlignBits), truncated toward zero.
        const int shift = emax - kMmaAlignBits + 18;  // product units 2^-18 -> units of q
        const int right = shift < 0 ? 0 : shift > 63 ? 63 : shift, left = shift < 0 ? -shift : 0;
        u64 sum = 0;  // two's complement
        for (u32 k = 0; k < kMmaGroup; ++k) sum += (((mag[k] >> right) << left) ^ neg[k]) - neg[k];
        if (acc_sig) {
            const int s = emax - acc_exp + 23 - kMmaAlignBits;  // >= 10
            const u64 t = s < 64 ? u64(acc_sig) >> s : 0;
            sum += (bits >> 31) ? u64(0) - t : t;
        }
        const i64 total = static_cast<i64>(sum);
        if (total == 0) {
            acc = 0.f;
            continue;
        }
        u64 m = u64(total < 0 ? -total : total);
        const int lead = leading_bit(m);
        if (lead > kMmaAccBits) m = m >> (lead - kMmaAccBits) << (lead - kMmaAccBits);  // e8m13, toward zero
        const int biased = emax - kMmaAlignBits + lead + 127;
        if (biased >= 1 && biased <= 254) {  // build the float: m has at most 14 significant bits
            const u32 out = (total < 0 ? 0x80000000u : 0u) | (u32(biased) << 23) | (u32(m << (23 - lead)) & 0x7FFFFFu);
            std::memcpy(&acc, &out, 4);
        } else {
            acc = std::ldexp(static_cast<float>(m), emax - kMmaAlignBits);
            if (total < 0) acc = -acc;
        }
    }
    return acc;
}

// ---------------------------------------------------------------- the BF16 / TF32 tensor-core inner product
// Our model of wgmma .f32.bf16.bf16 (k16) and .f32.tf32.tf32 (k8) on H100 / H200. Both read 32 bytes of K per row
// of A and B per instruction, as the e4m3 k32 does, so the descriptors and their decoding are the same
// (wgmma.hpp, decode_operand); only the element width and this arithmetic differ. Not claimed bit-exact; the
// model reproduces what the kernels rely on: fp32 accumulation inside the tensor core, so no promotion is needed.
//
// Stated assumptions (the first GPU run checks them against float64 through tests/kernels/test_sim_wide_mma.py):
//   * Operands: bf16 values are exact (bits << 16 as fp32). A tf32 operand is an fp32 bit pattern of which the
//     tensor core reads the sign, the 8 exponent bits and the top 10 mantissa bits: the low 13 mantissa bits are
//     ignored (truncation toward zero; a kernel that wants round-to-nearest converts with cvt.rna.tf32.f32 first).
//   * Products are exact (8 x 8 or 11 x 11 significand bits; here in double).
//   * Accumulation: each k-slice is kWideGroups fused additions of kWideGroup products (8 for bf16, 4 for tf32) in
//     ascending k, each fused with the incoming accumulator. Every addend is aligned to the largest exponent among
//     them and truncated (toward zero) to kWideAlignBits bits below it, the aligned addends summed exactly, and the
//     sum truncated toward zero to fp32's 24-bit significand (a result below fp32's normal range is rounded by
//     the conversion to float). NaN / Inf operands or accumulators take IEEE fp32 addition.
//   * Symmetric in A and B (the products commute and each group depends on their set): D(A, B) = D(B, A)^T.
//   * MN-major (transposed) operands, legal for bf16 only, change where the values come from, not this arithmetic.
constexpr int kWideAlignBits = 26;  // fp32's 24 bits + 2 guard bits before the truncation
constexpr u32 kBf16Group = 8, kTf32Group = 4;

inline float bf16_bits_to_float(u16 bits) {
    const u32 w = u32(bits) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return f;
}

inline float tf32_bits_to_float(u32 bits) {
    if ((bits & 0x7F800000u) != 0x7F800000u) bits &= 0xFFFFE000u;  // finite: the low 13 mantissa bits are ignored
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// One k-slice (k values of a and b, already converted from bf16 / tf32) for one accumulator, groups of `group`.
inline float mma_wide_slice(const float* a, const float* b, u32 k, u32 group, float c) {
    float acc = c;
    for (u32 g = 0; g < k; g += group) {
        bool finite = std::isfinite(acc);
        for (u32 j = g; j < g + group; ++j) finite = finite && std::isfinite(a[j]) && std::isfinite(b[j]);
        if (!finite) {  // IEEE semantics for NaN / Inf
            for (u32 j = g; j < g + group; ++j) acc += a[j] * b[j];
            continue;
        }
        double prod[16];
        int emax = INT32_MIN;
        for (u32 j = 0; j < group; ++j) {
            prod[j] = double(a[g + j]) * double(b[g + j]);  // exact
            if (prod[j] != 0.0) emax = std::max(emax, std::ilogb(prod[j]));
        }
        if (acc != 0.f) emax = std::max(emax, std::ilogb(acc));
        if (emax == INT32_MIN) {  // all addends zero: IEEE sign rules
            for (u32 j = 0; j < group; ++j) acc += float(prod[j]);
            continue;
        }
        // Units of q = 2^(emax - kWideAlignBits): every addend truncated to a whole number of q (< 2^(align + 1)),
        // the sum of at most 17 of them exact in double.
        const int unit = emax - kWideAlignBits;
        double sum = std::trunc(std::ldexp(double(acc), -unit));
        for (u32 j = 0; j < group; ++j) sum += std::trunc(std::ldexp(prod[j], -unit));
        if (sum != 0.0) {
            const int lead = std::ilogb(sum);
            if (lead > 23) sum = std::ldexp(std::trunc(std::ldexp(sum, 23 - lead)), lead - 23);  // 24 bits, toward 0
        }
        acc = float(std::ldexp(sum, unit));
    }
    return acc;
}

}  // namespace dfg::sim::detail
