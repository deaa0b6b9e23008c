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
inline u8 float_to_e4m3(float x) {
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
inline u16 float_to_bf16(float x) {
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
// truncated to a float with kMmaAccBits mantissa bits (e8m13). NaN / Inf inputs follow IEEE addition.
// This is not claimed to be bit-exact to the hardware; it reproduces the effect that matters for the
// kernels: addends much smaller than the running sum lose their low bits, so a long K reduction inside the
// tensor core drifts, which is why the kernels promote to fp32 on the CUDA cores every 128 K.
constexpr int kMmaAlignBits = 13;
constexpr int kMmaAccBits = 13;
constexpr u32 kMmaGroup = 16;

inline int float_exponent(float x) {  // floor(log2|x|) of a finite nonzero float
    u32 bits;
    std::memcpy(&bits, &x, 4);
    const int biased = int((bits >> 23) & 0xFF);
    return biased ? biased - 127 : std::ilogb(x);
}

// x truncated toward zero to `bits` mantissa bits (plus the leading one).
inline double truncate_mantissa(double x, int bits) {
    if (x == 0.0 || !std::isfinite(x)) return x;
    const int e = std::ilogb(x);
    const double q = std::ldexp(1.0, e - bits);
    return std::trunc(x / q) * q;
}

inline float mma_fp8_k32(const float* a, const float* b, float c) {
    float acc = c;
    for (u32 g = 0; g < 32; g += kMmaGroup) {
        float p[kMmaGroup];
        int emax = acc != 0.f && std::isfinite(acc) ? float_exponent(acc) : INT32_MIN;
        bool special = !std::isfinite(acc);
        for (u32 k = 0; k < kMmaGroup; ++k) {
            p[k] = a[g + k] * b[g + k];  // exact: 4-bit x 4-bit significands, exponents within float range
            if (!std::isfinite(p[k])) special = true;
            else if (p[k] != 0.f) emax = std::max(emax, float_exponent(p[k]));
        }
        if (special) {
            for (u32 k = 0; k < kMmaGroup; ++k) acc += p[k];
            continue;
        }
        if (emax == INT32_MIN) continue;  // all zero
        const double scale = std::ldexp(1.0, kMmaAlignBits - emax), quantum = std::ldexp(1.0, emax - kMmaAlignBits);
        double sum = std::trunc(double(acc) * scale);
        for (u32 k = 0; k < kMmaGroup; ++k) sum += std::trunc(double(p[k]) * scale);
        acc = static_cast<float>(truncate_mantissa(sum * quantum, kMmaAccBits));
    }
    return acc;
}

}  // namespace dfg::sim::detail
