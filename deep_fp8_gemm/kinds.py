"""The GEMM kinds as axes: one torch-free table of legal rows, and one legality predicate.

A kernel kind is a point of the product of the axes below (what A and B hold, how they are scaled and promoted,
how the tiles are enumerated, what the epilogue writes). The axes are not orthogonal — SwiGLU only for the
contiguous and masked layouts, FP8 output only for the 1D2D kinds, swap-AB only for the dense bf16 kernel — so
the table lists the legal points as rows (:data:`TABLE`), and :func:`KindTable.conflict` (one predicate, made of
pairwise :data:`RULES`) refuses every other point, naming the two axis values that conflict.
``tests/ops/test_kinds.py`` walks the whole product and checks that each point is a row or refused, and that the
rows pass the predicate: the rows and the rules are two independent statements of the same set.

Everything else is derived from :data:`TABLE`: ``config.KINDS`` / ``config.GemmKind`` and the kind sets the config
rules use, the CLI's ``--kind`` choices, the audit's kernel list (``kernels.targets``), the op families and their
``torch.library`` registration (``ops.FAMILIES``: a layout family plus an output policy per row), and the kernel
template's compile-time switches through the generated header ``include/deep_fp8_gemm/kinds.cuh``
(:meth:`KindTable.render_header`; ``python -m deep_fp8_gemm kinds --header`` prints it, a test compiles it with NVRTC
and fails when the checked-in file and this table disagree).

Adding a value (a scale recipe, a weight format, an operand type, an output) is: the value on its axis (with the
traits the config rules read), the rules it obeys, the rows it makes legal, and its policy where the value needs
code (an output policy in ``ops.outputs``, a kernel policy header). Nothing else names the kinds one by one.

Kernels that are not GEMMs of this product (the quantisers, the DeepSeek-V3.2 indexer) are not rows: they live
beside the op families as their own modules (``quant``, ``kernels.quant``) with their own audit kinds.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class AxisValue:
    """One value of an axis: its name (Python, kernel names), its C++ enumerator and what it means. ``traits``: the
    per-value facts the config rules read (e.g. an output's fixed tile width), so that a new value brings its own."""

    name: str
    cpp: str
    doc: str
    traits: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "traits", dict(self.traits))


@dataclasses.dataclass(frozen=True)
class Axis:
    """An axis: its name, its C++ enum and its values, in the order of the enum."""

    name: str
    cpp: str
    doc: str
    values: tuple[AxisValue, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.values)

    def value(self, name: str) -> AxisValue:
        for v in self.values:
            if v.name == name:
                return v
        raise ValueError(f"{self.name} must be one of {self.names}, got {name!r}")


#: Traits of the granularity values: ``gran_k`` K elements per scale of A and B (the promotion interval),
#: ``gran_n`` B rows per scale (1: per row), ``op_suffix`` the op names' suffix (``gemm_fp8_fp8_bf16_nt_block32``).
#: Traits of the output values (read by ``config``): ``block_n`` a fixed tile width (None: the heuristic picks),
#: ``mma_n`` the columns of one wgmma when a tile is computed in chunks, ``columns_divisor`` D has n / it columns,
#: ``d_bytes`` bytes per D element, ``row_scales`` D carries 1x128 scales, ``reads_c`` D = C + A·Bᵀ,
#: ``epilogue_issue_per_value`` issue slots per output value beyond the bf16 store (a model term).
_BF16 = dict(block_n=None, mma_n=None, columns_divisor=1, d_bytes=2, row_scales=False, reads_c=False,
             epilogue_issue_per_value=0)

AXES: tuple[Axis, ...] = (
    Axis("layout", "KindLayout", "how the tiles are enumerated and A / D addressed (scheduler.cuh)", (
        AxisValue("dense", "Dense", "D[m, n] = A[m, k] . B[n, k]^T"),
        AxisValue("contiguous", "Contiguous", "rows of A grouped by expert, m_indices[row] = expert or -1"),
        AxisValue("psum", "Psum", "rows of A grouped by expert, group ends (prefix sums) per group"),
        AxisValue("masked", "Masked", "A[G, m_max, k], masked_m[g] valid rows of group g"),
        AxisValue("k_grouped", "KGrouped", "G groups of run-time K_g (weight gradients)"),
    )),
    Axis("operand", "KindOperand", "the type of A and B as the tensor core reads them", (
        AxisValue("e4m3", "E4m3", "float8_e4m3fn, promoted to fp32 every 128 K"),
        AxisValue("bf16", "Bf16", "bfloat16 (wgmma .bf16 k16, K- or MN-major), fp32 accumulate, no promotion"),
        AxisValue("tf32", "Tf32", "fp32 values read as tf32 (wgmma .tf32 k8, K-major only), fp32 accumulate, no "
                  "promotion"),
    )),
    Axis("accumulation", "KindAccumulation", "how the tensor core's partial sums are promoted into fp32", (
        AxisValue("1d2d", "Promote1D2D", "per 128 K: sA per row x sB per 128x128 block (promotion.cuh)"),
        AxisValue("1d1d", "Promote1D1D", "per 128 K: sA per row x sB per column (policy_1d1d.cuh)"),
        AxisValue("mx", "PromoteMx", "per 128 K: sA per token x 2^E per weight row (MXFP4 blocks folded to one "
                  "exponent); per 32 K where a block spans more than 14 binades (ops/mxfp4.py)"),
        AxisValue("none", "TensorCore", "none: the tensor core's fp32 accumulator holds the whole K (BF16 / TF32 "
                  "operands, whose wgmma accumulates in fp32)"),
    )),
    Axis("granularity", "KindScaleGranularity", "the scale blocks of A and B", (
        AxisValue("1x128/128x128", "Block128", "A 1x128 per token, B 128x128 per block (recipe (1, 128, 128))",
                  dict(gran_k=128, gran_n=128, op_suffix="")),
        AxisValue("1x128/1x128", "Row128", "A and B 1x128 per row (recipe (1, 1, 128))",
                  dict(gran_k=128, gran_n=1, op_suffix="")),
        AxisValue("1x32/32x32", "Block32", "A 1x32 per token, B 32x32 per block (recipe (1, 32, 32), DeepSeek-V4.1; "
                  "promoted every 32 K, policy_block32.cuh)", dict(gran_k=32, gran_n=32, op_suffix="_block32")),
        AxisValue("1x128/1x32", "Mx32", "A 1x128 per token, B 1x32 UE8M0 per row (recipe_a (1, 128), recipe_b (1, 32): "
                  "MXFP4 experts), folded to one power of two per row per 128 K where a block spans <= 14 binades "
                  "(ops/mxfp4.py)", dict(gran_k=128, gran_n=1, op_suffix="_mxfp4")),
        AxisValue("none", "Unscaled", "no scale factors (BF16 / TF32 operands)",
                  dict(gran_k=None, gran_n=None, op_suffix="")),
    )),
    Axis("scale_dtype", "KindScaleDtype", "how the scales are stored", (
        AxisValue("fp32", "Fp32", "float32 scale factors"),
        AxisValue("none", "NoScales", "no scale factors to store (unscaled operands)"),
    )),
    Axis("packing", "KindWeightPacking", "how B's values are stored in memory", (
        AxisValue("e4m3", "E4m3", "one float8_e4m3fn per byte"),
        AxisValue("e2m1x2", "E2m1x2", "MXFP4: two e2m1 codes per byte (low nibble first), converted to e4m3 in "
                  "registers (the register-A operand of swap-AB)"),
        AxisValue("bf16", "Bf16", "one bfloat16 per two bytes"),
        AxisValue("fp32", "Fp32", "one float32 per four bytes, read by the tensor core as tf32"),
    )),
    Axis("output", "KindOutput", "what the epilogue writes (output.cuh)", (
        AxisValue("bf16", "Bf16", "bf16 D (TMA store)", _BF16),
        AxisValue("fp32_acc", "Fp32Accumulate", "fp32 D = C + A . B^T (fragments, 8-byte accesses)",
                  dict(_BF16, d_bytes=4, reads_c=True)),
        AxisValue("fp8", "Fp8", "e4m3 D + 1x128 per-row scales quantised from the accumulators (epilogue_fp8.cuh)",
                  dict(_BF16, block_n=128, d_bytes=1, row_scales=True, epilogue_issue_per_value=3)),
        AxisValue("swiglu_fp8", "SwigluFp8", "SiLU(gate) * up of interleaved gate / up blocks, then as fp8 "
                  "(policy_swiglu.cuh)", dict(_BF16, block_n=256, mma_n=128, columns_divisor=2, d_bytes=1,
                                             row_scales=True, epilogue_issue_per_value=15)),
    )),
    Axis("order", "KindOperandOrder", "which operand is the wgmma's M side (a config choice within a kind)", (
        AxisValue("ab", "AB", "A's rows on the wgmma's M side"),
        AxisValue("swap_ab", "SwapAB", "B's rows on the M side, tokens on N (policy_swap_ab.cuh; decode, m <= 32)"),
        AxisValue("register_a", "RegisterA", "B's rows on the M side as wgmma's register A operand, converted in "
                  "registers; tokens on N (kernels/mxfp4_gemm.cuh; decode)"),
        AxisValue("convert_smem", "ConvertSmem", "A's rows on the M side, B converted into shared memory by a "
                  "conversion stage between its TMA load and the wgmma (kernels/mxfp4_convert_gemm.cuh; prefill)"),
    )),
)


@dataclasses.dataclass(frozen=True)
class Rule:
    """``axis = value`` is legal only with ``other`` in ``allowed``; ``why`` says so in the message."""

    axis: str
    value: str
    other: str
    allowed: tuple[str, ...]
    why: str


#: The legality relation, pairwise. A point obeying every rule is a row of the table, and every row obeys them.
RULES: tuple[Rule, ...] = (
    Rule("accumulation", "1d2d", "granularity", ("1x128/128x128", "1x32/32x32"), "the 1D2D promotion multiplies "
         "by B's block scale (128x128, or 32x32 every 32 K)"),
    Rule("granularity", "1x32/32x32", "layout", ("dense",), "the 32x32 recipe is DeepSeek-V4.1's dense projections "
         "this round (its experts: docs/block32.md)"),
    Rule("granularity", "1x32/32x32", "output", ("bf16",), "the 32x32 kernel stores bf16 (an FP8 output would need "
         "1x32 output scales, not the epilogue's 1x128)"),
    Rule("granularity", "1x32/32x32", "order", ("ab",), "swap-AB promotes per 128 K; the 32x32 kernel has no "
         "transposed tile"),
    Rule("accumulation", "1d1d", "granularity", ("1x128/1x128",), "the 1D1D promotion multiplies by B's per-row "
         "scales"),
    Rule("accumulation", "1d1d", "output", ("fp32_acc",), "the 1D1D kernels accumulate into fp32 D = C + A.B^T"),
    Rule("output", "fp32_acc", "accumulation", ("1d1d", "none"), "fp32 accumulation is the 1D1D (weight-gradient) "
         "epilogue, or an unpromoted BF16 / TF32 kernel's"),
    Rule("accumulation", "1d1d", "layout", ("dense", "k_grouped"), "the 1D1D recipe serves weight gradients: dense "
         "or k-grouped"),
    Rule("layout", "k_grouped", "accumulation", ("1d1d",), "the k-grouped layout runs the 1D1D kernel"),
    Rule("output", "swiglu_fp8", "layout", ("contiguous", "masked"), "SwiGLU is the MoE up-projection (M-grouped "
         "contiguous or masked)"),
    Rule("order", "swap_ab", "layout", ("dense",), "swap-AB is the dense decode kernel"),
    Rule("order", "swap_ab", "output", ("bf16",), "swap-AB stores the transposed tile in bf16"),
    # MXFP4 experts (issue 42): the decode path, one kernel (kernels/mxfp4_gemm.cuh). Its weights are wgmma's
    # register-A operand (converted from e2m1 in registers): an order of its own, not the dense swap-AB kernel's.
    Rule("packing", "e2m1x2", "granularity", ("1x128/1x32",), "MXFP4 weights carry 1x32 UE8M0 scales with 1x128 "
         "activation scales"),
    Rule("granularity", "1x128/1x32", "packing", ("e2m1x2",), "the 1x32 per-row weight recipe is MXFP4's"),
    Rule("packing", "e2m1x2", "layout", ("masked", "contiguous", "psum"), "MXFP4 experts are the M-grouped MoE GEMMs "
         "(decode: masked; prefill: contiguous m_indices or psum)"),
    Rule("packing", "e2m1x2", "output", ("bf16", "fp8", "swiglu_fp8"), "the MXFP4 kernels store bf16, or e4m3 + 1x128 "
         "scales by the FP8-output rule, SiLU(gate)·up first for the up-projection (issue 43)"),
    Rule("packing", "e2m1x2", "order", ("register_a", "convert_smem"), "the weights are converted to e4m3 before the "
         "wgmma: in registers (wgmma's register A operand, on the M side) or into shared memory"),
    Rule("order", "convert_smem", "packing", ("e2m1x2",), "only packed weights need a conversion stage (e4m3 weights "
         "are TMA-loaded as the tensor core reads them)"),
    Rule("order", "convert_smem", "layout", ("contiguous", "psum"), "the shared-memory conversion serves prefill "
         "tiles (BLOCK_M = the contiguous layout's alignment)"),
    Rule("order", "convert_smem", "output", ("bf16", "fp8"), "SwiGLU needs gate and up (256 weight rows) in one "
         "tile: over the conversion kernel's register budget with per-row scales (docs/mxfp4.md)"),
    Rule("order", "register_a", "packing", ("e2m1x2",), "only packed weights need converting in registers (e4m3 "
         "weights are read by the tensor core from shared memory)"),
    Rule("packing", "e2m1x2", "accumulation", ("mx",), "the MXFP4 fold promotes by 2^E per weight row"),
    Rule("accumulation", "mx", "packing", ("e2m1x2",), "the 2^E fold is MXFP4's"),
    # Operand types (issue 41). E4m3 is promoted on the CUDA cores (its wgmma accumulator keeps ~13 bits); BF16 and
    # TF32 wgmma accumulate in fp32 (numerics.hpp states the model), so their kernels have no promotion and no scales.
    Rule("operand", "bf16", "accumulation", ("none",), "BF16 wgmma accumulates in fp32: no promotion"),
    Rule("operand", "tf32", "accumulation", ("none",), "TF32 wgmma accumulates in fp32: no promotion"),
    Rule("accumulation", "none", "operand", ("bf16", "tf32"), "an e4m3 wgmma accumulator keeps ~13 bits and must "
         "be promoted"),
    Rule("accumulation", "none", "granularity", ("none",), "an unpromoted kernel has no scales to multiply by"),
    Rule("granularity", "none", "accumulation", ("none",), "the promotions multiply by scale factors"),
    Rule("granularity", "none", "scale_dtype", ("none",), "unscaled operands store no scales"),
    Rule("scale_dtype", "none", "granularity", ("none",), "scaled operands store their scales"),
    Rule("operand", "e4m3", "packing", ("e4m3", "e2m1x2"), "e4m3 weights are stored one per byte, or as MXFP4 "
         "codes converted to e4m3 in registers"),
    Rule("operand", "bf16", "packing", ("bf16",), "BF16 operands are stored as bfloat16"),
    Rule("operand", "tf32", "packing", ("fp32",), "TF32 operands are stored as float32"),
    Rule("operand", "bf16", "output", ("bf16", "fp32_acc"), "the reference's BF16 GEMMs write bf16 D or fp32 "
         "D = C + A.B^T"),
    Rule("operand", "tf32", "output", ("fp32_acc",), "the reference's TF32 GEMM (tf32_hc_prenorm_gemm) writes fp32 D"),
    Rule("order", "swap_ab", "operand", ("e4m3",), "swap-AB is the FP8 decode kernel"),
    Rule("operand", "bf16", "layout", ("dense", "contiguous", "masked"), "the reference's BF16 GEMMs are dense "
         "(NT / NN / TN / TT and the einsum heads) and M-grouped contiguous (its psum ends become per-row groups "
         "on the device) or masked"),
    Rule("output", "fp32_acc", "layout", ("dense", "k_grouped"), "fp32 D = C + A.B^T is the dense GEMMs' and the "
         "k-grouped weight gradient's (the reference's M-grouped BF16 GEMMs write bf16 D)"),
    Rule("operand", "tf32", "layout", ("dense",), "the reference's TF32 GEMM (tf32_hc_prenorm_gemm) is dense"),
)


@dataclasses.dataclass(frozen=True)
class KindRow:
    """A legal kind: its name (``config.KINDS``, kernel names, audit kinds), its ``dfg::GemmKind`` enumerator and
    value, its point on the axes, and the operand orders a config of it may take."""

    name: str
    cpp: str
    id: int
    layout: str
    accumulation: str
    granularity: str
    output: str
    operand: str = "e4m3"
    scale_dtype: str = "fp32"
    packing: str = "e4m3"
    orders: tuple[str, ...] = ("ab",)

    def point(self, order: str = "ab") -> dict[str, str]:
        """The row as an axis point (``order`` one of :attr:`orders`)."""
        return {"layout": self.layout, "operand": self.operand, "accumulation": self.accumulation,
                "granularity": self.granularity, "scale_dtype": self.scale_dtype, "packing": self.packing,
                "output": self.output, "order": order}


_E4M3_1D2D = dict(accumulation="1d2d", granularity="1x128/128x128")
_E4M3_1D1D = dict(accumulation="1d1d", granularity="1x128/1x128", output="fp32_acc")
_MXFP4 = dict(accumulation="mx", granularity="1x128/1x32", packing="e2m1x2")
_BF16_TC = dict(operand="bf16", packing="bf16", accumulation="none", granularity="none", scale_dtype="none")

#: The kinds, in ``dfg::GemmKind`` order (the ids are the enum's values; kernel names use the names).
ROWS: tuple[KindRow, ...] = (
    KindRow("dense", "Dense", 0, "dense", output="bf16", orders=("ab", "swap_ab"), **_E4M3_1D2D),
    KindRow("contiguous", "GroupedContiguous", 1, "contiguous", output="bf16", **_E4M3_1D2D),
    KindRow("masked", "GroupedMasked", 2, "masked", output="bf16", **_E4M3_1D2D),
    KindRow("psum", "GroupedContiguousPsum", 3, "psum", output="bf16", **_E4M3_1D2D),
    KindRow("1d1d", "Dense1D1D", 4, "dense", **_E4M3_1D1D),
    KindRow("k_grouped", "KGrouped1D1D", 5, "k_grouped", **_E4M3_1D1D),
    KindRow("dense_fp8out", "DenseFp8Out", 6, "dense", output="fp8", **_E4M3_1D2D),
    KindRow("contiguous_fp8out", "GroupedContiguousFp8Out", 7, "contiguous", output="fp8", **_E4M3_1D2D),
    KindRow("masked_fp8out", "GroupedMaskedFp8Out", 8, "masked", output="fp8", **_E4M3_1D2D),
    KindRow("psum_fp8out", "GroupedContiguousPsumFp8Out", 9, "psum", output="fp8", **_E4M3_1D2D),
    KindRow("contiguous_swiglu", "GroupedContiguousSwiglu", 10, "contiguous", output="swiglu_fp8", **_E4M3_1D2D),
    KindRow("masked_swiglu", "GroupedMaskedSwiglu", 11, "masked", output="swiglu_fp8", **_E4M3_1D2D),
    KindRow("dense_block32", "DenseBlock32", 12, "dense", output="bf16", accumulation="1d2d",
            granularity="1x32/32x32"),
    # BF16 / TF32 operands (issue 41): one kernel each (kernels/bf16_gemm.cuh, kernels/hc_prenorm.cuh), no scales
    KindRow("bf16_dense", "Bf16Dense", 13, "dense", output="bf16", **_BF16_TC),
    KindRow("bf16_dense_fp32", "Bf16DenseFp32", 14, "dense", output="fp32_acc", **_BF16_TC),
    KindRow("bf16_contiguous", "Bf16GroupedContiguous", 15, "contiguous", output="bf16", **_BF16_TC),
    KindRow("bf16_masked", "Bf16GroupedMasked", 16, "masked", output="bf16", **_BF16_TC),
    KindRow("tf32_hc_prenorm", "Tf32HcPrenorm", 17, "dense", output="fp32_acc", operand="tf32", packing="fp32",
            accumulation="none", granularity="none", scale_dtype="none"),
    # MXFP4 experts (issue 42): the register-A decode kernel (kernels/mxfp4_gemm.cuh); the contiguous layouts also
    # the prefill kernel with the shared-memory conversion stage (issue 43, kernels/mxfp4_convert_gemm.cuh)
    KindRow("mxfp4_masked", "Mxfp4GroupedMasked", 18, "masked", output="bf16", accumulation="mx",
            granularity="1x128/1x32", packing="e2m1x2", orders=("register_a",)),
    KindRow("mxfp4_contiguous", "Mxfp4GroupedContiguous", 19, "contiguous", output="bf16", accumulation="mx",
            granularity="1x128/1x32", packing="e2m1x2", orders=("register_a", "convert_smem")),
    KindRow("mxfp4_psum", "Mxfp4GroupedContiguousPsum", 20, "psum", output="bf16", accumulation="mx",
            granularity="1x128/1x32", packing="e2m1x2", orders=("register_a", "convert_smem")),
    # their FP8 outputs (issue 43): e4m3 D + 1x128 scales, and SiLU(gate)·up first on the interleaved w13
    KindRow("mxfp4_masked_fp8out", "Mxfp4GroupedMaskedFp8Out", 21, "masked", output="fp8", **_MXFP4,
            orders=("register_a",)),
    KindRow("mxfp4_contiguous_fp8out", "Mxfp4GroupedContiguousFp8Out", 22, "contiguous", output="fp8", **_MXFP4,
            orders=("register_a", "convert_smem")),
    KindRow("mxfp4_psum_fp8out", "Mxfp4GroupedContiguousPsumFp8Out", 23, "psum", output="fp8", **_MXFP4,
            orders=("register_a", "convert_smem")),
    KindRow("mxfp4_masked_swiglu", "Mxfp4GroupedMaskedSwiglu", 24, "masked", output="swiglu_fp8", **_MXFP4,
            orders=("register_a",)),
    KindRow("mxfp4_contiguous_swiglu", "Mxfp4GroupedContiguousSwiglu", 25, "contiguous", output="swiglu_fp8",
            **_MXFP4, orders=("register_a",)),
)

#: The kernel family each weight packing's rows run on (their kernels, configs and audit lists live apart): the FP8
#: GEMM template (``kernels/fp8_gemm.cuh``, ``config.KINDS``), the BF16 GEMM, the TF32 hc-prenorm GEMM and the MXFP4
#: register-A kernel. Keyed by packing, not operand: MXFP4's tensor-core operand is e4m3, but its kernel is its own.
KERNEL_FAMILY = {"e4m3": "fp8_gemm", "bf16": "bf16_gemm", "fp32": "hc_prenorm", "e2m1x2": "mxfp4_gemm"}

#: The output each accumulation produces without an epilogue of its own, and its base scale granularity: a kind's
#: "layout kind" (the kernel whose scheduler and A / D addressing it shares) is the row of the same point with this
#: output and granularity.
BASE_OUTPUT = {"1d2d": "bf16", "1d1d": "fp32_acc", "mx": "bf16", "none": "bf16"}
BASE_GRANULARITY = {"1d2d": "1x128/128x128", "1d1d": "1x128/1x128", "mx": "1x128/1x32", "none": "none"}


class KindTable:
    """The axes, the rules and the rows, checked against each other on construction; every derived view."""

    def __init__(self, axes: tuple[Axis, ...], rules: tuple[Rule, ...], rows: tuple[KindRow, ...]):
        self.axes, self.rules, self.rows = tuple(axes), tuple(rules), tuple(rows)
        self._axes = {a.name: a for a in self.axes}
        self._rows = {r.name: r for r in self.rows}
        problems = []
        if len(self._rows) != len(self.rows) or len({r.cpp for r in self.rows}) != len(self.rows):
            problems.append("kind names and enumerators must be unique")
        if [r.id for r in self.rows] != list(range(len(self.rows))):
            problems.append("row ids must be 0, 1, ... in table order")
        for rule in self.rules:
            for axis, values in ((rule.axis, (rule.value,)), (rule.other, rule.allowed)):
                for v in values:
                    self.axis(axis).value(v)
        for row in self.rows:
            for order in row.orders:
                message = self.conflict(row.point(order))
                if message:
                    problems.append(f"row {row.name!r} ({order}): {message}")
        if problems:
            raise ValueError("inconsistent kinds table: " + "; ".join(problems))

    # ------------------------------------------------------------------------------------------ lookup
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rows)

    def axis(self, name: str) -> Axis:
        try:
            return self._axes[name]
        except KeyError:
            raise ValueError(f"axis must be one of {tuple(self._axes)}, got {name!r}") from None

    def row(self, name: str) -> KindRow:
        try:
            return self._rows[name]
        except KeyError:
            raise ValueError(f"kind must be one of {self.names}, got {name!r}") from None

    def traits(self, kind: str, axis: str) -> Mapping[str, object]:
        """The traits of ``kind``'s value on ``axis``."""
        row = self.row(kind)
        return self.axis(axis).value(row.point()[axis]).traits

    def names_of(self, family: str) -> tuple[str, ...]:
        """The kinds whose weight packing runs on kernel ``family`` (:data:`KERNEL_FAMILY`), in table order."""
        if family not in KERNEL_FAMILY.values():
            raise ValueError(f"family must be one of {tuple(KERNEL_FAMILY.values())}, got {family!r}")
        return tuple(r.name for r in self.rows if KERNEL_FAMILY[r.packing] == family)

    def kinds_where(self, **values: str | tuple[str, ...]) -> tuple[str, ...]:
        """The kinds whose axis values match (a value or a tuple of allowed values per axis), in table order."""
        wanted = {a: (v,) if isinstance(v, str) else tuple(v) for a, v in values.items()}
        return tuple(r.name for r in self.rows if all(r.point()[a] in vs for a, vs in wanted.items()))

    def layout_kind(self, kind: str) -> str:
        """The kind whose tiles and A / D addressing ``kind`` shares: the same point with its accumulation's base
        output and base granularity (``dfg::layout_of``; B's scales follow the kind's own granularity)."""
        row = self.row(kind)
        base = dict(row.point(), output=BASE_OUTPUT[row.accumulation], granularity=BASE_GRANULARITY[row.accumulation])
        if self.conflict(base):  # no base point (TF32 writes only fp32): the kind is its own layout kind
            return row.name
        for other in self.rows:
            if other.point() == base:
                return other.name
        raise ValueError(f"kind {kind!r} has no base kind with output {BASE_OUTPUT[row.accumulation]!r} and "
                         f"granularity {BASE_GRANULARITY[row.accumulation]!r}")

    # ------------------------------------------------------------------------------------------ legality
    def conflict(self, point: Mapping[str, str]) -> str | None:
        """None for a legal point, else why not: the first rule it breaks, naming the two axis values."""
        for axis in self.axes:
            if axis.name not in point:
                return f"the point names no {axis.name}"
            if point[axis.name] not in axis.names:
                return f"{axis.name} must be one of {axis.names}, got {point[axis.name]!r}"
        for rule in self.rules:
            if point[rule.axis] == rule.value and point[rule.other] not in rule.allowed:
                return (f"{rule.axis}={rule.value} conflicts with {rule.other}={point[rule.other]}: {rule.why} "
                        f"({rule.other} one of {rule.allowed})")
        return None

    def check(self, **point: str) -> None:
        """``ValueError`` naming the two conflicting axis values when ``point`` is not legal."""
        message = self.conflict(point)
        if message:
            raise ValueError(f"illegal kernel kind: {message}")

    def find(self, point: Mapping[str, str]) -> KindRow | None:
        """The row of a legal point (its order among the row's), or None."""
        for row in self.rows:
            if point.get("order", "ab") in row.orders and row.point(point.get("order", "ab")) == dict(point):
                return row
        return None

    def product(self) -> Iterator[dict[str, str]]:
        """Every point of the axes' product."""
        for values in itertools.product(*(a.names for a in self.axes)):
            yield dict(zip((a.name for a in self.axes), values))

    # ------------------------------------------------------------------------------------------ extension
    def extended(self, *, values: Mapping[str, tuple[AxisValue, ...]] = {}, rules: tuple[Rule, ...] = (),
                 rows: tuple[KindRow, ...] = ()) -> KindTable:
        """A new table with more values on some axes, more rules and more rows (each row's id the next one)."""
        axes = tuple(dataclasses.replace(a, values=a.values + tuple(values.get(a.name, ()))) for a in self.axes)
        return KindTable(axes, self.rules + tuple(rules), self.rows + tuple(rows))

    # ------------------------------------------------------------------------------------------ C++
    def render_header(self) -> str:
        """``include/deep_fp8_gemm/kinds.cuh``: the axes as enums, ``GemmKind``, ``kind_axes(kind)`` and
        ``layout_of(kind)`` as constexpr functions — the template's compile-time switches."""
        out = [
            "// Generated from deep_fp8_gemm/kinds.py by `python -m deep_fp8_gemm kinds --header`: do not edit by hand.",
            "// tests/ops/test_kinds.py fails when this file and the Python table differ, and compiles it for sm_90a.",
            "//",
            "// The GEMM kinds as axes: each kind one legal point (the table's rows); the kernel template reads a",
            "// kind's axis values through kind_axes() and its layout kind (the kind whose scheduler and A / D",
            "// addressing it shares) through layout_of().",
            "#pragma once",
            '#include "common.cuh"',
            "",
            "namespace dfg {",
            "",
        ]
        for axis in self.axes:
            out.append(f"// {axis.name}: {axis.doc}")
            out.append(f"enum class {axis.cpp} : int {{")
            for i, v in enumerate(axis.values):
                out.append(f"    {v.cpp} = {i},  // {v.name}: {v.doc}")
            out += ["};", ""]
        out.append("// The kinds (deep_fp8_gemm.config.GemmKind: same names and values).")
        out.append("enum class GemmKind : int {")
        for row in self.rows:
            out.append(f"    {row.cpp} = {row.id},  // {row.name}")
        # A function, not a constexpr variable: a namespace-scope or static-member constexpr object is emitted into
        # every cubin as a symbol (.nv.global.init), so adding one would change every kernel's bytes.
        out += ["};", f"DFG_HOST_DEVICE constexpr int num_gemm_kinds() {{ return {len(self.rows)}; }}", ""]
        fields = [(a.name, a.cpp) for a in self.axes if a.name != "order"]
        out.append("// A kind's point on the axes (operand orders: supports_order).")
        out.append("struct KindAxes {")
        for name, cpp in fields:
            out.append(f"    {cpp} {name};")
        out += ["};", ""]
        out.append("DFG_HOST_DEVICE constexpr KindAxes kind_axes(GemmKind kind) {")
        out.append("    switch (kind) {")
        for row in self.rows:
            point = row.point()
            args = ", ".join(f"{cpp}::{self.axis(name).value(point[name]).cpp}" for name, cpp in fields)
            out.append(f"        case GemmKind::{row.cpp}: return KindAxes{{{args}}};")
        out.append("        default: return KindAxes{};  // unreachable: every enumerator has a case")
        out += ["    }", "}", ""]
        out.append("// The kind whose scheduler and A / D addressing a kind shares (same point, base output and "
                   "granularity).")
        out.append("DFG_HOST_DEVICE constexpr GemmKind layout_of(GemmKind kind) {")
        out.append("    switch (kind) {")
        for row in self.rows:
            out.append(f"        case GemmKind::{row.cpp}: return GemmKind::{self.row(self.layout_kind(row.name)).cpp};")
        out.append("        default: return kind;")
        out += ["    }", "}", ""]
        order = self.axis("order")
        out.append("// Whether a config of the kind may take an operand order.")
        out.append(f"DFG_HOST_DEVICE constexpr bool supports_order(GemmKind kind, {order.cpp} order) {{")
        out.append("    switch (kind) {")
        for row in self.rows:
            cond = " || ".join(f"order == {order.cpp}::{order.value(o).cpp}" for o in row.orders)
            out.append(f"        case GemmKind::{row.cpp}: return {cond};")
        out.append("        default: return false;")
        out += ["    }", "}", "", "}  // namespace dfg", ""]
        return "\n".join(out)


#: The library's table.
TABLE = KindTable(AXES, RULES, ROWS)

