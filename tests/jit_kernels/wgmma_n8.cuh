// The FP8 wgmma m64n8k32 specialisation the probe kernel needs, passed to render() as extra code
// (PTX string as in cute/arch/mma_sm90_gmma.hpp, MMA_64x8x32_F32E4M3E4M3_SS_TN).
namespace dfg::hal {
template <>
struct WgmmaFp8<8> {
    // d[0..3] (+)= A . B^T; `accumulate` false overwrites d (scale-d predicate).
    static __device__ __forceinline__ void mma(u64 desc_a, u64 desc_b, float (&d)[4], bool accumulate) {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "setp.ne.b32 p, %6, 0;\n\t"
            "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n\t}"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
    }
};
}  // namespace dfg::hal
