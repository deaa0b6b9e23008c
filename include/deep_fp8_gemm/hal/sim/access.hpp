// deep_fp8_gemm CPU simulator: shared-memory access checks.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- shared memory access checks

DFG_SIM_API u32 smem_offset(const void* ptr, const char* what) {
    const Launch& l = L();
    const u8* p = static_cast<const u8*>(ptr);
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        const u8* base = l.ctas[c].smem;
        if (p >= base && p < base + l.cfg.dynamic_smem_bytes) {
            if (c != me().cta)
                fail(format("%s: pointer into the shared memory of cta %u, not this CTA's", what, c));
            return static_cast<u32>(p - base);
        }
    }
    fail(format("%s: %p is not a pointer into this CTA's shared memory (%u bytes)", what, ptr,
                l.cfg.dynamic_smem_bytes));
}

inline void check_smem_range(u32 offset, u64 bytes, const char* what) {
    if (offset + bytes > L().cfg.dynamic_smem_bytes)
        fail(format("%s: shared-memory access [%#x, %#llx) out of bounds (dynamic smem is %#x bytes)", what, offset,
                    static_cast<unsigned long long>(offset + bytes), L().cfg.dynamic_smem_bytes));
}

// A bulk write into [offset, offset+bytes) of `cta` must not clobber an initialised mbarrier.
inline void check_no_mbarrier_overlap(u32 cta, u32 offset, u64 bytes, const char* what) {
    for (const auto& [bar, state] : L().ctas[cta].mbarriers) {
        (void)state;
        if (bar + 8 > offset && bar < offset + bytes)
            fail(format("%s: write into [%#x, %#llx) of cta %u overlaps the mbarrier at smem+%#x", what, offset,
                        static_cast<unsigned long long>(offset + bytes), cta, bar));
    }
}

// PTX ISA "Tensor copy swizzling modes": the 16-byte chunk index (address bits [4, 4+B)) is XORed with
// address bits [7, 7+B): B = 3 / 2 / 1 for the 128 / 64 / 32-byte swizzle = CuTe Swizzle<B,4,3> on byte
// addresses. The same function governs wgmma's view of swizzled operands.
inline u32 swizzle(u32 addr, u32 bits) { return addr ^ ((addr >> 3) & (((1u << bits) - 1) << 4)); }

}  // namespace dfg::sim::detail
