"""Named benchmark shape tables and the reference design's published H800 numbers.

Sources: ``../shared/ANCHORS.md`` sections 1 (DeepGEMM's published H800 SXM table) and 5 (DeepSeek-V3 shapes).
The H800 numbers were measured on a different GPU (H800 SXM: same 132 SMs and FP8 peak as the H200, but
3.35 TB/s of HBM instead of 4.8), so every comparison with them is labelled "H800 published".

Counting rules (used by every benchmark and by the published table):
- FLOPs = ``2·m·n·k`` over *valid* rows only (grouped: padding rows and masked-out rows are not counted).
- Bytes = A + B + scales + D, each read or written once: A ``m·k`` (e4m3, 1 B), sA ``m·ceil(k/128)·4``,
  B ``n·k`` (per group), sB ``ceil(n/128)·ceil(k/128)·4`` (per group), D ``m·n·2`` (bf16). The published GB/s
  column matches this within ~1% (``tests/runtime/test_bench_cpu.py`` checks it).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

BLOCK = 128  # scale-block edge: 1x128 for activations, 128x128 for weights


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(x: int, a: int) -> int:
    return _cdiv(x, a) * a


def _operand_bytes(rows: int, n: int, k: int, groups: int) -> int:
    """A + sA for ``rows`` valid rows, B + sB for ``groups`` weight matrices, D for ``rows`` rows."""
    kb = _cdiv(k, BLOCK)
    a = rows * k + rows * kb * 4
    b = groups * (n * k + _cdiv(n, BLOCK) * kb * 4)
    d = rows * n * 2
    return a + b + d


@dataclasses.dataclass(frozen=True, order=True)
class DenseShape:
    """``gemm_fp8_fp8_bf16_nt``: A ``[m, k]``, B ``[n, k]``, D ``[m, n]``."""

    m: int
    n: int
    k: int
    family: ClassVar[str] = "dense"

    @property
    def label(self) -> str:
        return f"m={self.m} n={self.n} k={self.k}"

    @property
    def valid_m(self) -> int:
        return self.m

    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def bytes(self) -> int:
        return _operand_bytes(self.m, self.n, self.k, 1)


@dataclasses.dataclass(frozen=True, order=True)
class ContiguousShape:
    """``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous``: ``num_groups`` experts with ``m_per_group`` valid rows
    each; every expert segment holds ``m_per_group + pad_per_group`` rows rounded up to 128, the extra rows
    marked -1 in ``m_indices``. ``pad_per_group`` > 0 measures what padding costs (issue 5: 50% padding
    should cost < 10%)."""

    num_groups: int
    m_per_group: int
    n: int
    k: int
    pad_per_group: int = 0
    family: ClassVar[str] = "contiguous"

    @property
    def segment(self) -> int:
        return _align(self.m_per_group + self.pad_per_group, BLOCK)

    @property
    def m_sum(self) -> int:
        return self.num_groups * self.segment

    @property
    def valid_m(self) -> int:
        return self.num_groups * self.m_per_group

    @property
    def label(self) -> str:
        pad = self.segment - self.m_per_group
        pad_text = f" (+{pad} pad rows each)" if pad else ""
        return f"G={self.num_groups} m={self.m_per_group}{pad_text} n={self.n} k={self.k}"

    def flops(self) -> int:
        return 2 * self.valid_m * self.n * self.k

    def bytes(self) -> int:
        return _operand_bytes(self.valid_m, self.n, self.k, self.num_groups)


@dataclasses.dataclass(frozen=True, order=True)
class MaskedShape:
    """``m_grouped_gemm_fp8_fp8_bf16_nt_masked``: A ``[G, m_max, k]`` with ``masked_m[g] = expected_m`` valid
    rows in every group and ``m_max = expected_m`` (as the reference design benchmarked it), unless
    ``m_max`` is given."""

    num_groups: int
    expected_m: int
    n: int
    k: int
    m_max: int = 0  # 0: same as expected_m
    family: ClassVar[str] = "masked"

    @property
    def rows_per_group(self) -> int:
        return self.m_max or self.expected_m

    @property
    def valid_m(self) -> int:
        return self.num_groups * self.expected_m

    @property
    def label(self) -> str:
        extra = f" m_max={self.m_max}" if self.m_max else ""
        return f"G={self.num_groups} m={self.expected_m}{extra} n={self.n} k={self.k}"

    def flops(self) -> int:
        return 2 * self.valid_m * self.n * self.k

    def bytes(self) -> int:
        return _operand_bytes(self.valid_m, self.n, self.k, self.num_groups)


@dataclasses.dataclass(frozen=True, order=True)
class QuantShape:
    """A fused quantisation kernel on bf16 input (``deep_fp8_gemm.kernels.quant``):

    - ``per_token``: ``[m, k]`` -> e4m3 ``[m, k]`` + 1x128 scales ``[m, ceil(k/128)]`` (M-major);
    - ``per_block``: ``[m, k]`` (a weight ``[n, k]``, ``m`` = n) -> e4m3 + 128x128 scales;
    - ``silu_mul``: ``[m, 2k]`` (gate | up, ``k`` = I) -> ``SiLU(gate)·up`` as e4m3 ``[m, k]`` + 1x128 scales;
    - ``cast_transpose``: ``[m, k]`` -> e4m3 of ``x`` and of ``xᵀ`` + the 1x128 scales of both (issue 15).

    Bytes = input read once (bf16) + e4m3 output + fp32 scales written once (the TMA alignment padding of the
    M-major scales is not counted); FLOPs = 0 (memory-bound by construction)."""

    kind: str
    m: int
    k: int
    family: ClassVar[str] = "quant"
    KINDS: ClassVar[tuple[str, ...]] = ("per_token", "per_block", "silu_mul", "cast_transpose")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"unknown quantisation kind {self.kind!r}; choose one of {self.KINDS}")

    @property
    def in_cols(self) -> int:
        return 2 * self.k if self.kind == "silu_mul" else self.k

    @property
    def label(self) -> str:
        if self.kind == "silu_mul":
            return f"silu_mul m={self.m} I={self.k} (in [{self.m}, {2 * self.k}])"
        return f"{self.kind} {'n' if self.kind == 'per_block' else 'm'}={self.m} k={self.k}"

    @property
    def valid_m(self) -> int:
        return self.m

    def flops(self) -> int:
        return 0

    def scale_count(self) -> int:
        rows = _cdiv(self.m, BLOCK) if self.kind == "per_block" else self.m
        transposed = self.k * _cdiv(self.m, BLOCK) if self.kind == "cast_transpose" else 0
        return rows * _cdiv(self.k, BLOCK) + transposed

    def bytes(self) -> int:
        outputs = 2 if self.kind == "cast_transpose" else 1  # e4m3 of x and of xᵀ
        return self.m * self.in_cols * 2 + outputs * self.m * self.k + self.scale_count() * 4


@dataclasses.dataclass(frozen=True, order=True)
class MoEShape:
    """One forward of a SwiGLU MoE layer (``deep_fp8_gemm.moe.fp8_moe_forward``): ``tokens`` tokens routed
    top-``top_k`` (uniformly at random, no slot dropped) over ``num_experts`` experts with hidden size
    ``hidden`` and expert intermediate size ``inter``.

    FLOPs = ``2 · routed slots · 3·H·I`` (gate+up ``2I x H`` and down ``H x I`` per slot; padding rows not
    counted). Bytes (a floor, not what the layer moves) = the e4m3 weights + block scales of the experts a
    uniform routing hits in expectation (``E·(1 - (1 - top_k/E)^T)``), plus ``hidden`` read and the output
    written once in bf16."""

    tokens: int
    num_experts: int = 256
    top_k: int = 8
    hidden: int = 7168
    inter: int = 2048
    family: ClassVar[str] = "moe"

    @property
    def label(self) -> str:
        return f"T={self.tokens} E={self.num_experts} top-{self.top_k} H={self.hidden} I={self.inter}"

    @property
    def valid_m(self) -> int:
        """Routed (token, expert) slots."""
        return self.tokens * self.top_k

    def flops(self) -> int:
        return 2 * self.valid_m * 3 * self.hidden * self.inter

    def expected_active_experts(self) -> float:
        return self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** self.tokens)

    def expert_bytes(self) -> int:
        """e4m3 ``w13 [2I, H]`` + ``w2 [H, I]`` and their 128x128 block scales, for one expert."""
        h, i = self.hidden, self.inter
        scales = _cdiv(2 * i, BLOCK) * _cdiv(h, BLOCK) + _cdiv(h, BLOCK) * _cdiv(i, BLOCK)
        return 3 * h * i + scales * 4

    def bytes(self) -> int:
        return round(self.expected_active_experts() * self.expert_bytes()) + 2 * self.tokens * self.hidden * 2


@dataclasses.dataclass(frozen=True, order=True)
class KGroupedShape:
    """``k_grouped_fp8_gemm_nt_contiguous`` (MoE weight gradients): ``len(ks)`` groups, D_g ``[m, n]`` fp32 =
    C_g + A_g ``[m, K_g]`` · B_g ``[n, K_g]``ᵀ, K_g = ``ks[g]`` (tokens routed to expert g, multiples of 128).
    Bytes: A and B (e4m3) with their 1x128 scales, C read and D written in fp32."""

    m: int
    n: int
    ks: tuple[int, ...]
    family: ClassVar[str] = "k_grouped"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", tuple(self.ks))  # from JSON: a list

    @property
    def label(self) -> str:
        return f"G={len(self.ks)} m={self.m} n={self.n} K={sum(self.ks)} ({min(self.ks)}..{max(self.ks)}/group)"

    def flops(self) -> int:
        return 2 * self.m * self.n * sum(self.ks)

    def bytes(self) -> int:
        k = sum(self.ks)
        return (self.m + self.n) * k + (self.m + self.n) * (k // BLOCK) * 4 + len(self.ks) * self.m * self.n * 8


Shape = DenseShape | ContiguousShape | MaskedShape | QuantShape | MoEShape | KGroupedShape

# --- DeepSeek-V3 (ANCHORS.md section 5) -----------------------------------------------------------------
DEEPSEEK_V3_NK: tuple[tuple[int, int], ...] = (
    (2112, 7168),   # q_a + kv_a projection (fused)
    (24576, 1536),  # q_b projection
    (32768, 512),   # kv_b projection
    (7168, 16384),  # attention output projection
    (4096, 7168),   # shared-expert gate+up (per TP shard)
    (7168, 2048),   # shared-expert down
    (576, 7168),    # kv_a projection alone (not in the published table)
)
DEEPSEEK_V3_M = (64, 128, 4096)
DECODE_M = (1, 2, 4, 8, 16, 32, 64)
PREFILL_M = (256, 1024, 2048)
# --quick keeps the M values whose configs differ most (tile shape changes around 16/64, then waves).
DECODE_M_QUICK = (1, 16, 32)
PREFILL_M_QUICK = (256, 2048)

GROUPED_NK: tuple[tuple[int, int], ...] = ((4096, 7168), (7168, 2048))

DENSE_TABLES = ("deepseek-v3", "decode", "all")


def dense_shapes(table: str = "deepseek-v3", quick: bool = False) -> list[DenseShape]:
    """``deepseek-v3``: the 7 (N, K) x M in {64, 128, 4096}; ``decode``: M in 1..64 and 256/1024/2048
    (``quick``: a subset of those M); ``all``: both, without duplicates. Sorted by (N, K, M) order of the table."""
    if table not in DENSE_TABLES:
        raise ValueError(f"unknown dense table {table!r}; choose one of {DENSE_TABLES}")
    ms: list[int] = []
    if table in ("deepseek-v3", "all"):
        ms += DEEPSEEK_V3_M
    if table in ("decode", "all"):
        ms += (DECODE_M_QUICK + PREFILL_M_QUICK) if quick else (DECODE_M + PREFILL_M)
    ms = sorted(set(ms))
    return [DenseShape(m, n, k) for n, k in DEEPSEEK_V3_NK for m in ms]


def contiguous_shapes(quick: bool = False) -> list[ContiguousShape]:
    """ANCHORS.md grouped shapes: experts x m-per-expert in {4x8192, 8x4096, 32x256} x (N, K) in GROUPED_NK,
    plus one 50%-padding variant of 8x4096 (N=4096, K=7168) to price padding rows."""
    sizes = ((4, 8192), (8, 4096)) if quick else ((4, 8192), (8, 4096), (32, 256))
    shapes = [ContiguousShape(g, m, n, k) for g, m in sizes for n, k in GROUPED_NK]
    shapes.append(ContiguousShape(8, 4096, 4096, 7168, pad_per_group=4096))
    return shapes


def masked_shapes(quick: bool = False) -> list[MaskedShape]:
    """The published masked rows (1x1024, 2x512, 4x256) plus decode sizes (expected m 1 and 32 over 8 and 32
    groups, m_max 128) x (N, K) in GROUPED_NK."""
    sizes = [(1, 1024, 0), (2, 512, 0), (4, 256, 0)]
    sizes += [(8, 32, 128)] if quick else [(8, 1, 128), (8, 32, 128), (32, 32, 128)]
    return [MaskedShape(g, m, n, k, m_max) for g, m, m_max in sizes for n, k in GROUPED_NK]


# --- fused quantisation kernels and the MoE layer (issue 7) ----------------------------------------------
QUANT_TOKEN_M = (128, 4096, 16384)
QUANT_K = (2048, 7168)
MOE_INTER = 2048  # DeepSeek-V3 routed-expert intermediate size (the SiLU·mul kernel's I)
MOE_TOKENS = (1, 16, 128, 1024, 4096)
MOE_TOKENS_QUICK = (16, 1024)


def quant_shapes(quick: bool = False) -> list[QuantShape]:
    """per_token: m in {128, 4096, 16384} x k in {2048, 7168}; per_block: the DeepSeek-V3 weights
    (DEEPSEEK_V3_NK); silu_mul: m in {128, 4096, 16384}, I = 2048; cast_transpose: m in {128, 4096, 16384}, k = 7168
    (``quick``: m = 4096). ``quick``: the smallest and largest activations at k = 7168 / I = 2048 and two
    weights (a small and the largest)."""
    if quick:
        token_m, token_k, weights = (128, 16384), (7168,), ((2112, 7168), (7168, 16384))
    else:
        token_m, token_k, weights = QUANT_TOKEN_M, QUANT_K, DEEPSEEK_V3_NK
    shapes = [QuantShape("per_token", m, k) for k in token_k for m in token_m]
    shapes += [QuantShape("per_block", n, k) for n, k in weights]
    shapes += [QuantShape("silu_mul", m, MOE_INTER) for m in token_m]
    transposed = ((4096, 7168),) if quick else tuple((m, 7168) for m in token_m)
    shapes += [QuantShape("cast_transpose", m, k) for m, k in transposed]
    return shapes


def moe_shapes(quick: bool = False, tokens: tuple[int, ...] | None = None) -> list[MoEShape]:
    """The issue-7 layer (E=256, top-8, H=7168, I=2048) at T in MOE_TOKENS (``quick``: MOE_TOKENS_QUICK)."""
    if tokens is None:
        tokens = MOE_TOKENS_QUICK if quick else MOE_TOKENS
    return [MoEShape(t) for t in tokens]


SMOKE_SHAPES: tuple[Shape, ...] = (
    # Tiny shapes for CPU smoke runs of the benchmark pipeline (``--shapes smoke --device cpu``).
    DenseShape(4, 128, 256),
    DenseShape(3, 192, 256),
)

# --- The reference design's published H800 SXM numbers (ANCHORS.md section 1) ----------------------------
# TFLOPS = 2mnk/t; GB/s as published (dense only).
H800_PUBLISHED_DENSE: dict[DenseShape, tuple[int, int]] = {
    DenseShape(64, 2112, 7168): (206, 1688),
    DenseShape(64, 24576, 1536): (289, 2455),
    DenseShape(64, 32768, 512): (219, 2143),
    DenseShape(64, 7168, 16384): (336, 2668),
    DenseShape(64, 4096, 7168): (287, 2320),
    DenseShape(64, 7168, 2048): (295, 2470),
    DenseShape(128, 2112, 7168): (352, 1509),
    DenseShape(128, 24576, 1536): (535, 2448),
    DenseShape(128, 32768, 512): (358, 2103),
    DenseShape(128, 7168, 16384): (645, 2604),
    DenseShape(128, 4096, 7168): (533, 2221),
    DenseShape(128, 7168, 2048): (510, 2277),
    DenseShape(4096, 2112, 7168): (1127, 562),
    DenseShape(4096, 24576, 1536): (1212, 962),
    DenseShape(4096, 32768, 512): (775, 1620),
    DenseShape(4096, 7168, 16384): (1520, 384),
    DenseShape(4096, 4096, 7168): (1410, 541),
    DenseShape(4096, 7168, 2048): (1168, 794),
}
H800_PUBLISHED: dict[Shape, float] = {
    **{shape: float(tflops) for shape, (tflops, _) in H800_PUBLISHED_DENSE.items()},
    ContiguousShape(4, 8192, 4096, 7168): 1346.0,
    ContiguousShape(4, 8192, 7168, 2048): 1214.0,
    ContiguousShape(8, 4096, 4096, 7168): 1346.0,
    ContiguousShape(8, 4096, 7168, 2048): 1214.0,
    MaskedShape(1, 1024, 4096, 7168): 1233.0,
    MaskedShape(1, 1024, 7168, 2048): 925.0,
    MaskedShape(2, 512, 4096, 7168): 1040.0,
    MaskedShape(2, 512, 7168, 2048): 916.0,
    MaskedShape(4, 256, 4096, 7168): 932.0,
    MaskedShape(4, 256, 7168, 2048): 815.0,
}
H800_LABEL = "H800 published"


def h800_published(shape: Shape) -> float | None:
    """The reference design's published H800 TFLOPS for ``shape``, or None when it published none."""
    return H800_PUBLISHED.get(shape)


def shape_from_dict(d: dict) -> Shape:
    """Inverse of ``{"family": shape.family, **dataclasses.asdict(shape)}`` (used by the report)."""
    fields = {k: v for k, v in d.items() if k != "family"}
    cls = {"dense": DenseShape, "contiguous": ContiguousShape, "masked": MaskedShape, "quant": QuantShape,
           "moe": MoEShape, "k_grouped": KGroupedShape}[d["family"]]
    return cls(**fields)


def shape_to_dict(shape: Shape) -> dict:
    return {"family": shape.family, **dataclasses.asdict(shape)}
