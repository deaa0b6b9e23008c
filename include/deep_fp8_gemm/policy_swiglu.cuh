// Policies of the SwiGLU up-projection kinds (GroupedContiguousSwiglu, GroupedMaskedSwiglu): the MoE expert's
//   y = SiLU(x . W1^T) * (x . W3^T)   quantised to e4m3 with 1x128 per-row scales,
// from the fp32 accumulators in the epilogue (output.cuh Fp8TmaStore), instead of a bf16 [m, 2I] GEMM output and a
// second kernel (kernels/quant.cuh SiluMulPerToken) that reads it back.
//
// B layout (deep_fp8_gemm.ops.fp8_output.interleave_swiglu_weights, derived once when a layer loads its weights):
// w13 [G, 2I, H] (gate rows [0, I), up rows [I, 2I)) re-ordered in 128-row blocks, gate block c then up block c:
//   B'[256 c + r] = W1[128 c + r],  B'[256 c + 128 + r] = W3[128 c + r]   (r < 128, c < I / 128),
// and the 128x128 block scales move with their blocks (sB'[2c] = sB[c], sB'[2c + 1] = sB[I / 128 + c]): a
// permutation, exact. A tile is BLOCK_N = 256 columns of B' at n0 = 256 c (n-block c): its columns [0, 128) are the
// gate, [128, 256) the up projection of output columns [128 c, 128 c + 128), one 1x128 output group, which is
// therefore reduced inside one CTA. The tile straddles the two sB blocks 2c and 2c + 1 at column 128 exactly.
//
// MMA chunks (kernels/fp8_gemm.cuh, kMmaN): the K loop computes the tile as two m64n128 wgmma chunks (gate, then
// up) into one 64-float scratch accumulator, each promoted with its own sB block, rather than one m64n256 wgmma
// into a 128-float scratch: acc 128 + scratch 64 floats per thread instead of 128 + 128 (the register budget is
// in the kernel's opening comment). A chunk's values are acc[w][64 c + i], the positions the n256 fragment would
// give them (WgmmaFragment<256>: value 64 c + i is column 128 c + that of value i of WgmmaFragment<128>), so a
// thread holds gate and up of the same (row, column) at i and 64 + i, and SiLU * mul is per thread.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "kernels/quant.cuh"

namespace dfg {

// Columns of B per wgmma in the SwiGLU kinds (the chunk), and the tile width: one gate and one up block.
constexpr u32 kSwigluMmaN = 128;
constexpr u32 kSwigluBlockN = 2 * kSwigluMmaN;

// h = SiLU(gate) * up in fp32, with the SiLU of the fused SiLU·mul quantiser (quant::silu, x / (1 + e^-x)).
DFG_DEVICE float swiglu(float gate, float up) { return quant::silu(gate) * up; }

// acc[w][i] = swiglu(gate = acc[w][i], up = acc[w][kHalf + i]) for i < kHalf: the tile's output values in the first
// half of each wave's fragment (the FP8 epilogue reads them as an m64n128 fragment).
template <u32 kWavesM, u32 kValues>
DFG_DEVICE void swiglu_in_place(float (&acc)[kWavesM][kValues]) {
    constexpr u32 kHalf = kValues / 2;
    DFG_UNROLL
    for (u32 w = 0; w < kWavesM; ++w)
        DFG_UNROLL
        for (u32 i = 0; i < kHalf; ++i)
            acc[w][i] = swiglu(acc[w][i], acc[w][kHalf + i]);
}

}  // namespace dfg
