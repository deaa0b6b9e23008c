// Generated from deep_fp8_gemm/kinds.py by `python -m deep_fp8_gemm kinds --header`: do not edit by hand.
// tests/ops/test_kinds.py fails when this file and the Python table differ, and compiles it for sm_90a.
//
// The GEMM kinds as axes: each kind one legal point (the table's rows); the kernel template reads a
// kind's axis values through kind_axes() and its layout kind (the kind whose scheduler and A / D
// addressing it shares) through layout_of().
#pragma once
#include "common.cuh"

namespace dfg {

// layout: how the tiles are enumerated and A / D addressed (scheduler.cuh)
enum class KindLayout : int {
    Dense = 0,  // dense: D[m, n] = A[m, k] . B[n, k]^T
    Contiguous = 1,  // contiguous: rows of A grouped by expert, m_indices[row] = expert or -1
    Psum = 2,  // psum: rows of A grouped by expert, group ends (prefix sums) per group
    Masked = 3,  // masked: A[G, m_max, k], masked_m[g] valid rows of group g
    KGrouped = 4,  // k_grouped: G groups of run-time K_g (weight gradients)
};

// operand: the type of A and B as the tensor core reads them
enum class KindOperand : int {
    E4m3 = 0,  // e4m3: float8_e4m3fn, promoted to fp32 every 128 K
    Bf16 = 1,  // bf16: bfloat16 (wgmma .bf16 k16, K- or MN-major), fp32 accumulate, no promotion
    Tf32 = 2,  // tf32: fp32 values read as tf32 (wgmma .tf32 k8, K-major only), fp32 accumulate, no promotion
};

// accumulation: how the tensor core's partial sums are promoted into fp32
enum class KindAccumulation : int {
    Promote1D2D = 0,  // 1d2d: per 128 K: sA per row x sB per 128x128 block (promotion.cuh)
    Promote1D1D = 1,  // 1d1d: per 128 K: sA per row x sB per column (policy_1d1d.cuh)
    PromoteMx = 2,  // mx: per 128 K: sA per token x 2^E per weight row (MXFP4 blocks folded to one exponent); per 32 K where a block spans more than 14 binades (ops/mxfp4.py)
    TensorCore = 3,  // none: none: the tensor core's fp32 accumulator holds the whole K (BF16 / TF32 operands, whose wgmma accumulates in fp32)
};

// granularity: the scale blocks of A and B
enum class KindScaleGranularity : int {
    Block128 = 0,  // 1x128/128x128: A 1x128 per token, B 128x128 per block (recipe (1, 128, 128))
    Row128 = 1,  // 1x128/1x128: A and B 1x128 per row (recipe (1, 1, 128))
    Block32 = 2,  // 1x32/32x32: A 1x32 per token, B 32x32 per block (recipe (1, 32, 32), DeepSeek-V4.1; promoted every 32 K, policy_block32.cuh)
    Mx32 = 3,  // 1x128/1x32: A 1x128 per token, B 1x32 UE8M0 per row (recipe_a (1, 128), recipe_b (1, 32): MXFP4 experts), folded to one power of two per row per 128 K where a block spans <= 14 binades (ops/mxfp4.py)
    Unscaled = 4,  // none: no scale factors (BF16 / TF32 operands)
};

// scale_dtype: how the scales are stored
enum class KindScaleDtype : int {
    Fp32 = 0,  // fp32: float32 scale factors
    NoScales = 1,  // none: no scale factors to store (unscaled operands)
};

// packing: how B's values are stored in memory
enum class KindWeightPacking : int {
    E4m3 = 0,  // e4m3: one float8_e4m3fn per byte
    E2m1x2 = 1,  // e2m1x2: MXFP4: two e2m1 codes per byte (low nibble first), converted to e4m3 in registers (the register-A operand of swap-AB)
    Bf16 = 2,  // bf16: one bfloat16 per two bytes
    Fp32 = 3,  // fp32: one float32 per four bytes, read by the tensor core as tf32
};

// output: what the epilogue writes (output.cuh)
enum class KindOutput : int {
    Bf16 = 0,  // bf16: bf16 D (TMA store)
    Fp32Accumulate = 1,  // fp32_acc: fp32 D = C + A . B^T (fragments, 8-byte accesses)
    Fp8 = 2,  // fp8: e4m3 D + 1x128 per-row scales quantised from the accumulators (epilogue_fp8.cuh)
    SwigluFp8 = 3,  // swiglu_fp8: SiLU(gate) * up of interleaved gate / up blocks, then as fp8 (policy_swiglu.cuh)
};

// order: which operand is the wgmma's M side (a config choice within a kind)
enum class KindOperandOrder : int {
    AB = 0,  // ab: A's rows on the wgmma's M side
    SwapAB = 1,  // swap_ab: B's rows on the M side, tokens on N (policy_swap_ab.cuh; decode, m <= 32)
    RegisterA = 2,  // register_a: B's rows on the M side as wgmma's register A operand, converted in registers; tokens on N (kernels/mxfp4_gemm.cuh; decode)
    ConvertSmem = 3,  // convert_smem: A's rows on the M side, B converted into shared memory by a conversion stage between its TMA load and the wgmma (kernels/mxfp4_convert_gemm.cuh; prefill)
};

// The kinds (deep_fp8_gemm.config.GemmKind: same names and values).
enum class GemmKind : int {
    Dense = 0,  // dense
    GroupedContiguous = 1,  // contiguous
    GroupedMasked = 2,  // masked
    GroupedContiguousPsum = 3,  // psum
    Dense1D1D = 4,  // 1d1d
    KGrouped1D1D = 5,  // k_grouped
    DenseFp8Out = 6,  // dense_fp8out
    GroupedContiguousFp8Out = 7,  // contiguous_fp8out
    GroupedMaskedFp8Out = 8,  // masked_fp8out
    GroupedContiguousPsumFp8Out = 9,  // psum_fp8out
    GroupedContiguousSwiglu = 10,  // contiguous_swiglu
    GroupedMaskedSwiglu = 11,  // masked_swiglu
    DenseBlock32 = 12,  // dense_block32
    Bf16Dense = 13,  // bf16_dense
    Bf16DenseFp32 = 14,  // bf16_dense_fp32
    Bf16GroupedContiguous = 15,  // bf16_contiguous
    Bf16GroupedMasked = 16,  // bf16_masked
    Tf32HcPrenorm = 17,  // tf32_hc_prenorm
    Mxfp4GroupedMasked = 18,  // mxfp4_masked
    Mxfp4GroupedContiguous = 19,  // mxfp4_contiguous
    Mxfp4GroupedContiguousPsum = 20,  // mxfp4_psum
    Mxfp4GroupedMaskedFp8Out = 21,  // mxfp4_masked_fp8out
    Mxfp4GroupedContiguousFp8Out = 22,  // mxfp4_contiguous_fp8out
    Mxfp4GroupedContiguousPsumFp8Out = 23,  // mxfp4_psum_fp8out
    Mxfp4GroupedMaskedSwiglu = 24,  // mxfp4_masked_swiglu
    Mxfp4GroupedContiguousSwiglu = 25,  // mxfp4_contiguous_swiglu
};
DFG_HOST_DEVICE constexpr int num_gemm_kinds() { return 26; }

// A kind's point on the axes (operand orders: supports_order).
struct KindAxes {
    KindLayout layout;
    KindOperand operand;
    KindAccumulation accumulation;
    KindScaleGranularity granularity;
    KindScaleDtype scale_dtype;
    KindWeightPacking packing;
    KindOutput output;
};

DFG_HOST_DEVICE constexpr KindAxes kind_axes(GemmKind kind) {
    switch (kind) {
        case GemmKind::Dense: return KindAxes{KindLayout::Dense, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Bf16};
        case GemmKind::GroupedContiguous: return KindAxes{KindLayout::Contiguous, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Bf16};
        case GemmKind::GroupedMasked: return KindAxes{KindLayout::Masked, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Bf16};
        case GemmKind::GroupedContiguousPsum: return KindAxes{KindLayout::Psum, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Bf16};
        case GemmKind::Dense1D1D: return KindAxes{KindLayout::Dense, KindOperand::E4m3, KindAccumulation::Promote1D1D, KindScaleGranularity::Row128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Fp32Accumulate};
        case GemmKind::KGrouped1D1D: return KindAxes{KindLayout::KGrouped, KindOperand::E4m3, KindAccumulation::Promote1D1D, KindScaleGranularity::Row128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Fp32Accumulate};
        case GemmKind::DenseFp8Out: return KindAxes{KindLayout::Dense, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Fp8};
        case GemmKind::GroupedContiguousFp8Out: return KindAxes{KindLayout::Contiguous, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Fp8};
        case GemmKind::GroupedMaskedFp8Out: return KindAxes{KindLayout::Masked, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Fp8};
        case GemmKind::GroupedContiguousPsumFp8Out: return KindAxes{KindLayout::Psum, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Fp8};
        case GemmKind::GroupedContiguousSwiglu: return KindAxes{KindLayout::Contiguous, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::SwigluFp8};
        case GemmKind::GroupedMaskedSwiglu: return KindAxes{KindLayout::Masked, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block128, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::SwigluFp8};
        case GemmKind::DenseBlock32: return KindAxes{KindLayout::Dense, KindOperand::E4m3, KindAccumulation::Promote1D2D, KindScaleGranularity::Block32, KindScaleDtype::Fp32, KindWeightPacking::E4m3, KindOutput::Bf16};
        case GemmKind::Bf16Dense: return KindAxes{KindLayout::Dense, KindOperand::Bf16, KindAccumulation::TensorCore, KindScaleGranularity::Unscaled, KindScaleDtype::NoScales, KindWeightPacking::Bf16, KindOutput::Bf16};
        case GemmKind::Bf16DenseFp32: return KindAxes{KindLayout::Dense, KindOperand::Bf16, KindAccumulation::TensorCore, KindScaleGranularity::Unscaled, KindScaleDtype::NoScales, KindWeightPacking::Bf16, KindOutput::Fp32Accumulate};
        case GemmKind::Bf16GroupedContiguous: return KindAxes{KindLayout::Contiguous, KindOperand::Bf16, KindAccumulation::TensorCore, KindScaleGranularity::Unscaled, KindScaleDtype::NoScales, KindWeightPacking::Bf16, KindOutput::Bf16};
        case GemmKind::Bf16GroupedMasked: return KindAxes{KindLayout::Masked, KindOperand::Bf16, KindAccumulation::TensorCore, KindScaleGranularity::Unscaled, KindScaleDtype::NoScales, KindWeightPacking::Bf16, KindOutput::Bf16};
        case GemmKind::Tf32HcPrenorm: return KindAxes{KindLayout::Dense, KindOperand::Tf32, KindAccumulation::TensorCore, KindScaleGranularity::Unscaled, KindScaleDtype::NoScales, KindWeightPacking::Fp32, KindOutput::Fp32Accumulate};
        case GemmKind::Mxfp4GroupedMasked: return KindAxes{KindLayout::Masked, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::Bf16};
        case GemmKind::Mxfp4GroupedContiguous: return KindAxes{KindLayout::Contiguous, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::Bf16};
        case GemmKind::Mxfp4GroupedContiguousPsum: return KindAxes{KindLayout::Psum, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::Bf16};
        case GemmKind::Mxfp4GroupedMaskedFp8Out: return KindAxes{KindLayout::Masked, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::Fp8};
        case GemmKind::Mxfp4GroupedContiguousFp8Out: return KindAxes{KindLayout::Contiguous, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::Fp8};
        case GemmKind::Mxfp4GroupedContiguousPsumFp8Out: return KindAxes{KindLayout::Psum, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::Fp8};
        case GemmKind::Mxfp4GroupedMaskedSwiglu: return KindAxes{KindLayout::Masked, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::SwigluFp8};
        case GemmKind::Mxfp4GroupedContiguousSwiglu: return KindAxes{KindLayout::Contiguous, KindOperand::E4m3, KindAccumulation::PromoteMx, KindScaleGranularity::Mx32, KindScaleDtype::Fp32, KindWeightPacking::E2m1x2, KindOutput::SwigluFp8};
        default: return KindAxes{};  // unreachable: every enumerator has a case
    }
}

// The kind whose scheduler and A / D addressing a kind shares (same point, base output and granularity).
DFG_HOST_DEVICE constexpr GemmKind layout_of(GemmKind kind) {
    switch (kind) {
        case GemmKind::Dense: return GemmKind::Dense;
        case GemmKind::GroupedContiguous: return GemmKind::GroupedContiguous;
        case GemmKind::GroupedMasked: return GemmKind::GroupedMasked;
        case GemmKind::GroupedContiguousPsum: return GemmKind::GroupedContiguousPsum;
        case GemmKind::Dense1D1D: return GemmKind::Dense1D1D;
        case GemmKind::KGrouped1D1D: return GemmKind::KGrouped1D1D;
        case GemmKind::DenseFp8Out: return GemmKind::Dense;
        case GemmKind::GroupedContiguousFp8Out: return GemmKind::GroupedContiguous;
        case GemmKind::GroupedMaskedFp8Out: return GemmKind::GroupedMasked;
        case GemmKind::GroupedContiguousPsumFp8Out: return GemmKind::GroupedContiguousPsum;
        case GemmKind::GroupedContiguousSwiglu: return GemmKind::GroupedContiguous;
        case GemmKind::GroupedMaskedSwiglu: return GemmKind::GroupedMasked;
        case GemmKind::DenseBlock32: return GemmKind::Dense;
        case GemmKind::Bf16Dense: return GemmKind::Bf16Dense;
        case GemmKind::Bf16DenseFp32: return GemmKind::Bf16Dense;
        case GemmKind::Bf16GroupedContiguous: return GemmKind::Bf16GroupedContiguous;
        case GemmKind::Bf16GroupedMasked: return GemmKind::Bf16GroupedMasked;
        case GemmKind::Tf32HcPrenorm: return GemmKind::Tf32HcPrenorm;
        case GemmKind::Mxfp4GroupedMasked: return GemmKind::Mxfp4GroupedMasked;
        case GemmKind::Mxfp4GroupedContiguous: return GemmKind::Mxfp4GroupedContiguous;
        case GemmKind::Mxfp4GroupedContiguousPsum: return GemmKind::Mxfp4GroupedContiguousPsum;
        case GemmKind::Mxfp4GroupedMaskedFp8Out: return GemmKind::Mxfp4GroupedMaskedFp8Out;
        case GemmKind::Mxfp4GroupedContiguousFp8Out: return GemmKind::Mxfp4GroupedContiguousFp8Out;
        case GemmKind::Mxfp4GroupedContiguousPsumFp8Out: return GemmKind::Mxfp4GroupedContiguousPsumFp8Out;
        case GemmKind::Mxfp4GroupedMaskedSwiglu: return GemmKind::Mxfp4GroupedMaskedSwiglu;
        case GemmKind::Mxfp4GroupedContiguousSwiglu: return GemmKind::Mxfp4GroupedContiguousSwiglu;
        default: return kind;
    }
}

// Whether a config of the kind may take an operand order.
DFG_HOST_DEVICE constexpr bool supports_order(GemmKind kind, KindOperandOrder order) {
    switch (kind) {
        case GemmKind::Dense: return order == KindOperandOrder::AB || order == KindOperandOrder::SwapAB;
        case GemmKind::GroupedContiguous: return order == KindOperandOrder::AB;
        case GemmKind::GroupedMasked: return order == KindOperandOrder::AB;
        case GemmKind::GroupedContiguousPsum: return order == KindOperandOrder::AB;
        case GemmKind::Dense1D1D: return order == KindOperandOrder::AB;
        case GemmKind::KGrouped1D1D: return order == KindOperandOrder::AB;
        case GemmKind::DenseFp8Out: return order == KindOperandOrder::AB;
        case GemmKind::GroupedContiguousFp8Out: return order == KindOperandOrder::AB;
        case GemmKind::GroupedMaskedFp8Out: return order == KindOperandOrder::AB;
        case GemmKind::GroupedContiguousPsumFp8Out: return order == KindOperandOrder::AB;
        case GemmKind::GroupedContiguousSwiglu: return order == KindOperandOrder::AB;
        case GemmKind::GroupedMaskedSwiglu: return order == KindOperandOrder::AB;
        case GemmKind::DenseBlock32: return order == KindOperandOrder::AB;
        case GemmKind::Bf16Dense: return order == KindOperandOrder::AB;
        case GemmKind::Bf16DenseFp32: return order == KindOperandOrder::AB;
        case GemmKind::Bf16GroupedContiguous: return order == KindOperandOrder::AB;
        case GemmKind::Bf16GroupedMasked: return order == KindOperandOrder::AB;
        case GemmKind::Tf32HcPrenorm: return order == KindOperandOrder::AB;
        case GemmKind::Mxfp4GroupedMasked: return order == KindOperandOrder::RegisterA;
        case GemmKind::Mxfp4GroupedContiguous: return order == KindOperandOrder::RegisterA || order == KindOperandOrder::ConvertSmem;
        case GemmKind::Mxfp4GroupedContiguousPsum: return order == KindOperandOrder::RegisterA || order == KindOperandOrder::ConvertSmem;
        case GemmKind::Mxfp4GroupedMaskedFp8Out: return order == KindOperandOrder::RegisterA;
        case GemmKind::Mxfp4GroupedContiguousFp8Out: return order == KindOperandOrder::RegisterA || order == KindOperandOrder::ConvertSmem;
        case GemmKind::Mxfp4GroupedContiguousPsumFp8Out: return order == KindOperandOrder::RegisterA || order == KindOperandOrder::ConvertSmem;
        case GemmKind::Mxfp4GroupedMaskedSwiglu: return order == KindOperandOrder::RegisterA;
        case GemmKind::Mxfp4GroupedContiguousSwiglu: return order == KindOperandOrder::RegisterA;
        default: return false;
    }
}

}  // namespace dfg
