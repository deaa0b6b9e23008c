// The GEMM kernel's single parameter, for every kind. Byte layout mirrored by deep_fp8_gemm/kernels/gemm.py
// (the ctypes structure GemmParams, same field names; both paths pack it by name). Fields are named for what
// they hold; where two kinds use one slot for different things it is a union, each member named for its use.
#pragma once
#include "common.cuh"
#include "hal.cuh"

namespace dfg {

struct GemmParams {
    TensorMap tma_a;            // A  [G][rows][K] e4m3: dims (K, rows, G), box (128, A rows per load, 1), SW128;
                                // k-grouped: unused (per-group maps at group_maps)
    TensorMap tma_b;            // B  [G][N][K]    e4m3: dims (K, N, G),    box (128, B rows per load, 1), SW128;
                                // k-grouped: unused
    TensorMap tma_sa;           // sA fp32 M-major:      dims (rows, ceil(K/128), G), box (BLOCK_M, 1, 1);
                                // K- / G-major (kSaMajor, scales.cuh ScaleMajor): box (4, BLOCK_M, 1)
    union {
        TensorMap tma_d;        // bf16 kinds: D [G][rows][N] bf16, dims (N, rows, G), box (16, kWgRows, 1), SW32;
                                // FP8-output kinds: D [G][rows][N_out] e4m3, dims (N_out, rows, G),
                                // box (128, kWgRows, 1), SW128 (N_out = N, SwiGLU N / 2)
        TensorMap tma_sb;       // fp32 kinds (1D1D, k-grouped): sB fp32 M-major, dims (N, ceil(K/128), 1),
                                // box (BLOCK_N, 1, 1)
    };
    const float* sb;            // bf16 kinds: sB [G][ceil(N/128)][ceil(K/128)] fp32, row-major; fp32 kinds: 0
    const i32* grouped_layout;  // contiguous: m_indices[rows]; psum: ends[G]; masked: masked_m[G];
                                // k-grouped: ks[G] (ks_tensor); dense and 1D1D: 0
    u32 rows;                   // rows of A: dense / 1D1D m; contiguous / psum m_sum; masked m_max;
                                // k-grouped m of every group
    u32 reserved;               // 0: pads d_f32 to its 8-byte alignment
    union {
        float* d_f32;           // fp32 kinds: D [rows][N] fp32 (k-grouped [G][rows][N]), row stride ld_d floats
        float* sd;              // FP8-output kinds: D's 1x128 scales, M-major: [G][ceil(N_out/128)][ld_sd] fp32,
                                // (g, row, j) at (g * ceil(N_out/128) + j) * ld_sd + row
    };
    const float* c_f32;         // fp32 kinds: C, same shape, row stride ld_c floats; may equal d_f32
    union {
        u32 ld_d;
        u32 ld_sd;              // FP8-output kinds: sD's column stride, rows rounded up to 4 (TMA-aligned)
    };
    u32 ld_c;
    union {
        const TensorMap* group_maps;  // k-grouped: A_g at [2g], B_g at [2g + 1] in global memory (policy_k_grouped.cuh)
        u32* split_counters;          // dense, SPLIT_K > 1: per (tile, math warpgroup) arrival counters, zero between launches
    };
    float* split_partials;      // dense, SPLIT_K > 1: fp32 partial tiles [tiles][SPLIT_K][warpgroups][fragment order]
};
static_assert(DFG_OFFSETOF(GemmParams, tma_a) == 0 && DFG_OFFSETOF(GemmParams, tma_b) == 128 &&
                  DFG_OFFSETOF(GemmParams, tma_sa) == 256 && DFG_OFFSETOF(GemmParams, tma_d) == 384 &&
                  DFG_OFFSETOF(GemmParams, tma_sb) == 384 && DFG_OFFSETOF(GemmParams, sb) == 512 &&
                  DFG_OFFSETOF(GemmParams, grouped_layout) == 520 && DFG_OFFSETOF(GemmParams, rows) == 528 &&
                  DFG_OFFSETOF(GemmParams, d_f32) == 536 && DFG_OFFSETOF(GemmParams, sd) == 536 &&
                  DFG_OFFSETOF(GemmParams, ld_sd) == 552 && DFG_OFFSETOF(GemmParams, ld_c) == 556 &&
                  DFG_OFFSETOF(GemmParams, group_maps) == 560 && DFG_OFFSETOF(GemmParams, split_counters) == 560 &&
                  DFG_OFFSETOF(GemmParams, split_partials) == 568 && sizeof(GemmParams) == 576,
              "GemmParams layout is mirrored in deep_fp8_gemm/kernels/gemm.py");

}  // namespace dfg
