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

}  // namespace dfg::sim::detail
