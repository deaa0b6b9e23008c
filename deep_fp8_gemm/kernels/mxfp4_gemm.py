"""Host side of the MXFP4 masked GEMM kernel (issue 42; ``include/deep_fp8_gemm/kernels/mxfp4_gemm.cuh``,
``jit/mxfp4_gemm.cu``): config -> source -> kernel metadata + tensor maps + parameters -> launch, for
``Backend.CUDA`` and ``Backend.SIM``.

Compiled in: N, K, the expert count G, BLOCK_M (tokens per tile: 8, 16 or 32; the wgmma N), BLOCK_N (weight rows per
tile: 64 or 128, one or two 64-row waves of the wgmma M side) and the stage count; m_max, masked_m and the pointers
are run-time fields of :class:`Mxfp4Params`.

Inputs arrive validated by the op layer (:mod:`deep_fp8_gemm.ops.mxfp4`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools

import torch

from .. import env
from ..runtime import params as param_structs
from ..runtime.target import Backend
from ..runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from ..utils import PROCESS_SETTINGS
from .wgmma_gen import wgmma_fp8_rs_wrapper, wgmma_fp8_wrapper

TEMPLATE = "mxfp4_gemm.cu"
KERNEL_PREFIX = "dfg_mxfp4_grouped"
#: The prefill kernel with the shared-memory conversion stage (issue 43; kernels/mxfp4_convert_gemm.cuh).
CONVERT_TEMPLATE = "mxfp4_convert_gemm.cu"
CONVERT_PREFIX = "dfg_mxfp4_convert"
#: The two kernels: "register_a" (swap-AB, the weights converted in registers: decode and the contiguous layouts at
#: any size) and "convert" (the weights converted into shared memory by the producer warpgroup's spare warps, the
#: normal tile: BLOCK_M = the contiguous layout's alignment tokens x 128 weight rows; prefill).
ORDER_OF_PATH = {"register_a": "register_a", "convert": "convert_smem"}  # each path's value on the kinds' order axis
PATHS = tuple(ORDER_OF_PATH)
CONVERT_BLOCK_N = 128
CONVERT_PRODUCER_REGISTERS = 40  # the producer / conversion warpgroup's setmaxnreg.dec (static_asserted in the kernel)
#: The conversion stage per K block (mxfp4_convert_gemm.cuh): 16 warp-units of 16-byte code loads (2 waves x 2
#: halves x 4 fragment warps) over the producer warpgroup's 3 spare warps.
CONVERT_UNITS, CONVERT_WARPS = 16, 3
#: The layouts (the kinds table's mxfp4 rows) and their dfg::GemmKind enumerators.
LAYOUTS = {"masked": "GroupedMasked", "contiguous": "GroupedContiguous", "psum": "GroupedContiguousPsum"}
#: The outputs (the kinds table's output values) and their dfg::mxfp4::Mxfp4Output enumerators; the weight rows a tile
#: needs for each (whole 128-column scale groups of D: SwiGLU's take 256 rows of the interleaved w13).
OUTPUTS = {"bf16": "Bf16", "fp8": "Fp8", "swiglu_fp8": "SwigluFp8"}
OUTPUT_BLOCK_N = {"bf16": 64, "fp8": 128, "swiglu_fp8": 256}
TENSOR_MAP_BYTES = 128
NUM_THREADS = 256  # one math warpgroup, one producer warpgroup
BLOCK_K = 128
WAVE_TILE_BYTES = 4096  # 64 rows x 128 K of e2m1 codes (ops/mxfp4.py TILE_BYTES)
WAVE_META_BYTES = 272  # ops/mxfp4.py META_BYTES
PAIR_TABLE_BYTES = 15 * 15 * 16  # include/deep_fp8_gemm/mxfp4.cuh kPairTableBytes
BLOCK_MS = (8, 16, 32, 64, 128)
BLOCK_NS = (64, 128, 256)
SMEM_LIMIT = 232_448
MAX_STAGES = 8
#: SASS every MXFP4 kernel must contain: FP8 wgmma (its A from registers), TMA loads, the byte permutes of the
#: conversion, griddepcontrol.wait (PDL).
REQUIRED_SASS = ("QGMMA", "UTMALDG", "PRMT", "ACQBULK")
#: The conversion kernel's: the same, and the proxy fence that hands the converted tile to the wgmma
#: (fence.proxy.async.shared::cta: FENCE.VIEW.ASYNC.S).
CONVERT_REQUIRED_SASS = (*REQUIRED_SASS, "FENCE")


@functools.lru_cache(maxsize=None)  # pure (a refusal raises, and is not cached)
def kind_of(layout: str, output: str, path: str | None = None) -> str:
    """The kinds-table row (deep_fp8_gemm/kinds.py, packing e2m1x2) of an MXFP4 GEMM with ``layout`` ("masked" |
    "contiguous" | "psum") and ``output`` ("bf16" | "fp8" | "swiglu_fp8"), run by ``path``'s kernel when given
    ("register_a" | "convert": the row's order ``register_a`` / ``convert_smem``). The table is the one statement of
    which combinations exist: ``ValueError`` naming the values for any other."""
    from ..kinds import TABLE

    for row in TABLE.rows:
        if row.packing == "e2m1x2" and (row.layout, row.output) == (layout, output):
            if path is None or ORDER_OF_PATH.get(path) in row.orders:
                return row.name
            raise ValueError(f"the MXFP4 kind {row.name} (layout {layout!r}, output {output!r}) runs on "
                             f"{list(row.orders)}, not path {path!r} (order {ORDER_OF_PATH.get(path)!r})")
    raise ValueError(f"no MXFP4 GEMM kind has layout {layout!r} and output {output!r} (the kinds table: "
                     f"`python -m deep_fp8_gemm kinds`)")


@dataclasses.dataclass(frozen=True)
class Mxfp4Config:
    """Everything that changes the binary of an MXFP4 masked kernel."""

    n: int
    k: int
    num_groups: int
    block_m: int
    block_n: int
    num_stages: int
    layout: str = "masked"  # "masked" | "contiguous" (m_indices) | "psum" (group ends)
    group_alignment: int = 128  # psum: the layout's group-start alignment (64 or 128); compiled in
    output: str = "bf16"  # "bf16" | "fp8" | "swiglu_fp8"
    ue8m0: bool = False  # FP8 outputs: power-of-two scales
    path: str = "register_a"  # "register_a" | "convert" (PATHS)

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path=}")
        kind_of(self.layout, self.output, self.path)
        if self.path == "convert":
            self._check_convert()
            return
        if self.output not in OUTPUTS or self.block_n % OUTPUT_BLOCK_N[self.output]:
            raise ValueError(f"output must be one of {tuple(OUTPUTS)} with block_n a multiple of its "
                             f"{OUTPUT_BLOCK_N.get(self.output)} rows, got {self.output=} {self.block_n=}")
        if self.layout not in LAYOUTS or self.group_alignment not in (64, 128):
            raise ValueError(f"layout must be one of {tuple(LAYOUTS)} and group_alignment 64 or 128, got "
                             f"{self.layout=} {self.group_alignment=}")
        if self.block_m not in BLOCK_MS or self.block_n not in BLOCK_NS:
            raise ValueError(f"block_m must be in {BLOCK_MS} and block_n in {BLOCK_NS}, got {self.block_m=} "
                             f"{self.block_n=}")
        if (self.block_n == 256 and self.block_m > 16) or (self.block_m > 32 and self.block_n != 64):
            raise ValueError(f"block_n 256 (four waves) takes block_m <= 16 and block_m 64 / 128 (prefill tiles) "
                             f"block_n 64, for the registers; got {self.block_m=} {self.block_n=}")
        if self.layout != "masked" and self.group_alignment % self.block_m:
            raise ValueError(f"a contiguous layout's tiles lie in one alignment block: block_m must divide "
                             f"group_alignment, got {self.block_m=} {self.group_alignment=}")
        if self.k % BLOCK_K or self.n % self.block_n or self.num_groups < 1:
            raise ValueError(f"K must be a multiple of 128 and N of block_n, G >= 1, got {self.n=} {self.k=} "
                             f"{self.num_groups=} {self.block_n=}")
        if not 1 <= self.num_stages <= MAX_STAGES or self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"num_stages must be in [1, {MAX_STAGES}] and fit {SMEM_LIMIT} bytes, got {self}")

    def _check_convert(self) -> None:
        """The conversion kernel's legality beyond its kinds-table rows (the contiguous layouts, bf16 or fp8:
        :func:`kind_of`); kernels/mxfp4_convert_gemm.cuh static_asserts the same."""
        if self.block_m != self.group_alignment or self.block_n != CONVERT_BLOCK_N:
            raise ValueError(f"the conversion kernel runs block_m = group_alignment (64 or 128) and block_n "
                             f"{CONVERT_BLOCK_N}, got {self.block_m=} {self.group_alignment=} {self.block_n=}")
        if self.ue8m0 and self.output != "fp8":
            raise ValueError(f"ue8m0 scales are the fp8 output's, got {self.output=} {self.ue8m0=}")
        if self.k % BLOCK_K or self.n % self.block_n or self.num_groups < 1:
            raise ValueError(f"K must be a multiple of 128 and N of 128, G >= 1, got {self.n=} {self.k=} "
                             f"{self.num_groups=}")
        if not 2 <= self.num_stages <= MAX_STAGES or self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"num_stages must be in [2, {MAX_STAGES}] and fit {SMEM_LIMIT} bytes, got {self}")

    @property
    def math_registers(self) -> int:
        """The conversion kernel's setmaxnreg.inc count for its math warpgroups (240 with one, 232 with two: the FP8
        kernel's split); the kernel static_asserts its own against it, the audit's deadlock check reads it."""
        return 240 if self.block_m == 64 else 232

    @property
    def kind(self) -> str:
        """The kinds-table row this kernel computes (:func:`kind_of`)."""
        return kind_of(self.layout, self.output, self.path)

    @property
    def num_threads(self) -> int:
        """Threads per CTA: the register-A kernel's two warpgroups, or the conversion kernel's BLOCK_M / 64 math
        warpgroups and its producer / conversion warpgroup."""
        return NUM_THREADS if self.path == "register_a" else 128 * (self.block_m // 64 + 1)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: ``Mxfp4GroupedKernel``'s or ``Mxfp4ConvertKernel``'s map (the kernels
        static_assert the same value)."""
        if self.path == "convert":
            waves = self.block_n // 64
            per_stage = (self.block_m * BLOCK_K + self.block_n * BLOCK_K + waves * WAVE_TILE_BYTES
                         + -(-waves * WAVE_META_BYTES // 128) * 128 + -(-self.block_m * 4 // 128) * 128
                         + 4 * self.block_n * 4)
            red = self.block_m // 64 * 4 * 2 * 32 * 4 if self.output == "fp8" else 0  # the quads' amax partials
            return -(-(self.num_stages * per_stage + PAIR_TABLE_BYTES + red) // 8) * 8 + 24 * self.num_stages
        waves = self.block_n // 64
        per_stage = (waves * WAVE_TILE_BYTES + self.block_m * BLOCK_K + -(-waves * WAVE_META_BYTES // 128) * 128
                     + -(-self.block_m * 4 // 128) * 128)
        red = 0 if self.output == "bf16" else self.block_n // OUTPUT_BLOCK_N[self.output] * 4 * self.block_m * 4
        tables = -(-self.num_stages * per_stage // 16) * 16 + PAIR_TABLE_BYTES + red
        return tables + 16 * self.num_stages

    def constants(self, kernel_name: str) -> dict[str, object]:
        if self.path == "convert":
            return {"SHAPE_N": self.n, "SHAPE_K": self.k, "BLOCK_M": self.block_m, "BLOCK_N": self.block_n,
                    "NUM_STAGES": self.num_stages, "NUM_GROUPS": self.num_groups, "SMEM_BYTES": self.smem_bytes,
                    "LAYOUT": LAYOUTS[self.layout], "OUTPUT": OUTPUTS[self.output],
                    "UE8M0": "true" if self.ue8m0 else "false", "MATH_REGISTERS": self.math_registers,
                    "PRODUCER_REGISTERS": CONVERT_PRODUCER_REGISTERS, "KERNEL_NAME": kernel_name}
        return {"SHAPE_N": self.n, "SHAPE_K": self.k, "BLOCK_M": self.block_m, "BLOCK_N": self.block_n,
                "NUM_STAGES": self.num_stages, "NUM_GROUPS": self.num_groups, "SMEM_BYTES": self.smem_bytes,
                "LAYOUT": LAYOUTS[self.layout], "GROUP_ALIGNMENT": self.group_alignment, "OUTPUT": OUTPUTS[self.output],
                "UE8M0": "true" if self.ue8m0 else "false", "KERNEL_NAME": kernel_name}

    def as_dict(self) -> dict:
        """JSON-safe record for the audit. The K-loop analysis reads the wgmma tile (``mma_rows`` = BLOCK_N weight rows,
        ``mma_cols`` = BLOCK_M tokens) of the folded loop (``kloop_qgmma``: its 4 wgmmas per wave and K block; the
        general loop, which holds both paths, is reported beside it)."""
        if self.path == "convert":  # the normal tile: tokens on the wgmma's M side, the folded loop's 4 wgmmas
            return {"path": "convert", "layout": self.layout, "output": self.output, "n": self.n, "k": self.k,
                    "num_groups": self.num_groups, "block_m": self.block_m, "block_n": self.block_n,
                    "num_stages": self.num_stages, "smem_bytes": self.smem_bytes, "num_threads": self.num_threads,
                    "num_math_warpgroups": self.block_m // 64, "mma_rows": self.block_m, "mma_cols": self.block_n,
                    "kloop_qgmma": 4, "math_registers": self.math_registers,
                    "producer_registers": CONVERT_PRODUCER_REGISTERS, "convert_units_per_warp": -(-CONVERT_UNITS // CONVERT_WARPS)}
        return {"layout": self.layout, "output": self.output, "n": self.n, "k": self.k, "num_groups": self.num_groups, "block_m": self.block_m,
                "block_n": self.block_n, "num_stages": self.num_stages, "smem_bytes": self.smem_bytes,
                "num_threads": NUM_THREADS, "num_math_warpgroups": 1, "mma_rows": self.block_n,
                "mma_cols": self.block_m, "kloop_qgmma": 4 * (self.block_n // 64)}


@functools.lru_cache(maxsize=4096)  # pure: called on every launch
def pick_config(n: int, k: int, num_groups: int, expected_m: int, num_sms: int, layout: str = "masked",
                group_alignment: int = 128, output: str = "bf16", ue8m0: bool = False) -> Mxfp4Config:
    """The tile for a call: BLOCK_M the smallest of 8 / 16 / 32 / 64 / 128 holding ``expected_m`` tokens (128 beyond;
    a contiguous layout's divides its alignment); BLOCK_N the widest of 256 / 128 / 64 dividing N that still gives
    every SM a tile (``G x N / BLOCK_N >= num_sms``; 256 only with BLOCK_M <= 16, 64 with BLOCK_M >= 64): wider tiles
    share the K loop's per-block work among more waves, wider token tiles share each wave's conversion among more
    tokens (kernels/mxfp4_gemm.cuh); as many stages as fit, at most 8."""
    kind_of(layout, output, "register_a")  # a kinds-table row, refused by name before any tile is tried
    need = OUTPUT_BLOCK_N[output]  # FP8 outputs: whole 128-column groups in a tile (SwiGLU: 256 rows)
    tokens = BLOCK_MS if layout == "masked" else tuple(b for b in BLOCK_MS if group_alignment % b == 0)
    if need > 64:  # one-wave prefill tiles cannot hold a group
        tokens = tuple(b for b in tokens if b <= (16 if need == 256 else 32))
    block_m = next((b for b in tokens if expected_m <= b), tokens[-1])
    widths = [b for b in (256, 128) if n % b == 0 and num_groups * n // b >= num_sms and (b < 256 or block_m <= 16)
              and block_m <= 32 and b % need == 0]
    block_n = widths[0] if widths else max(need, 64)
    for stages in range(MAX_STAGES, 0, -1):
        try:
            return Mxfp4Config(n, k, num_groups, block_m, block_n, stages, layout, group_alignment, output, ue8m0)
        except ValueError:
            continue
    raise ValueError(f"no MXFP4 tile fits {n=} {k=}")


@functools.lru_cache(maxsize=4096)
def pick_convert_config(n: int, k: int, num_groups: int, layout: str, group_alignment: int, output: str = "bf16",
                        ue8m0: bool = False) -> Mxfp4Config:
    """The conversion kernel's tile for a contiguous-layout call: BLOCK_M = the alignment (64: one math warpgroup,
    128: two), BLOCK_N 128, as many stages as fit (at most 8); ``output`` "bf16" or "fp8"."""
    kind_of(layout, output, "convert")
    for stages in range(MAX_STAGES, 1, -1):
        try:
            return Mxfp4Config(n, k, num_groups, group_alignment, CONVERT_BLOCK_N, stages, layout, group_alignment,
                               output, ue8m0, path="convert")
        except ValueError:
            continue
    raise ValueError(f"no MXFP4 conversion tile fits {n=} {k=} {layout=} {group_alignment=}")


@functools.lru_cache(maxsize=4096)  # pure, on every contiguous launch (a bounded cache: m_sum varies per step)
def pick_contiguous_path(n: int, k: int, num_groups: int, m_sum: int, num_sms: int, layout: str,
                         group_alignment: int, output: str = "bf16", ue8m0: bool = False) -> Mxfp4Config:
    """The contiguous-layout call's kernel and tile by the cost model (config/cost.py), for ``m_sum / G`` tokens per
    expert: the fastest modelled of the register-A kernel's pick at up to 32 tokens per tile, its pick for the whole
    count (bf16: the prefill tiles, 64 / 128 tokens x 64 rows; the FP8 outputs keep 32 tokens, BLOCK_N 128) and the
    conversion kernel (:func:`pick_convert_config`; bf16 and fp8, not SwiGLU; N a multiple of 128). Register-A tiles without a measured
    issue figure are not candidates (the 32-token pick always has one). Every candidate gives a row the same bits
    (docs/mxfp4.md, "The bit contract"), so the choice is speed only."""
    from ..config.cost import MXFP4_ISSUE_PER_K_BLOCK, mxfp4_convert_estimate_seconds, mxfp4_estimate_seconds

    m = max(1, m_sum // max(num_groups, 1))
    candidates = []
    for tokens in (min(32, m), m):
        cfg = pick_config(n, k, num_groups, tokens, num_sms, layout, group_alignment, output, ue8m0)
        if (cfg.block_m, cfg.block_n) in MXFP4_ISSUE_PER_K_BLOCK:
            candidates.append((mxfp4_estimate_seconds(m, n, k, num_groups, cfg.block_m, cfg.block_n, num_sms), cfg))
    if output != "swiglu_fp8" and n % CONVERT_BLOCK_N == 0:  # the conversion kernel's tiles are 128 rows wide
        convert = pick_convert_config(n, k, num_groups, layout, group_alignment, output, ue8m0)
        candidates.append((mxfp4_convert_estimate_seconds(m, n, k, num_groups, convert.block_m, num_sms), convert))
    return min(candidates, key=lambda c: c[0])[1]


# ---------------------------------------------------------------------------------------------- source
@functools.lru_cache(maxsize=None)
def render_source(config: Mxfp4Config, simulator: bool = False) -> tuple[str, str]:
    """``(kernel_name, source)`` of ``config``; the name hashes the source without the wgmma wrapper, so the sm_90a
    and simulator builds share it."""
    from ..runtime.render import kernel_name, render

    if config.path == "convert":
        anonymous = render(CONVERT_TEMPLATE, config.constants(CONVERT_PREFIX))
        name = kernel_name(CONVERT_PREFIX, anonymous)
        extra = "" if simulator else wgmma_fp8_wrapper(config.block_n) + wgmma_fp8_wrapper(64)
        return name, render(CONVERT_TEMPLATE, config.constants(name), extra_code=extra)
    anonymous = render(TEMPLATE, config.constants(KERNEL_PREFIX))
    name = kernel_name(KERNEL_PREFIX, anonymous)
    extra = "" if simulator else wgmma_fp8_rs_wrapper(config.block_m)
    return name, render(TEMPLATE, config.constants(name), extra_code=extra)


# ---------------------------------------------------------------------------------------------- scales
def scales_layout_in_place(sa: torch.Tensor) -> bool:
    """Whether the kernel's sA map can read ``sa [G, m_max, K/128]`` fp32 where it lies, as far as its strides go:
    the M-major TMA-aligned layout of ``get_mn_major_tma_aligned_tensor`` / DeepEP's low-latency dispatch (unit
    stride along the rows, a K-block stride ``P`` that is a multiple of 4 elements and at least ``m_max``, a group
    stride a multiple of 4). :func:`scales_in_place` adds the address."""
    g, m, kb = sa.shape
    p, q = sa.stride(2), sa.stride(0)
    return (sa.dtype == torch.float32 and (sa.stride(1) == 1 or m <= 1) and p % 4 == 0 and p >= m
            and (q % 4 == 0 or g == 1))


def scales_in_place(sa: torch.Tensor) -> bool:
    """:func:`scales_layout_in_place` at a 16-byte aligned address (TMA's): the kernel reads ``sa`` as it is."""
    return scales_layout_in_place(sa) and sa.data_ptr() % 16 == 0


def column_scales(sa: torch.Tensor) -> torch.Tensor:
    """``sa [G, m_max, K/128]`` fp32 -> the ``[G, K/128, rows]`` view the kernel's sA box reads (unit last stride,
    16-byte row and group strides: :func:`map_args`): ``sa.transpose(1, 2)`` itself when :func:`scales_in_place`,
    else a copy into ``[G, K/128, m_pad]`` (m_pad = m_max rounded up to 4: 16-byte rows; G x K/128 x m_pad floats,
    small at decode). The ops refuse an output overlapping ``sa`` before this (``ops.mxfp4.check_outputs_apart``), so
    reading it in place never races the kernel's stores."""
    if scales_in_place(sa):
        return sa.transpose(1, 2)
    out, rows = column_buffer(*sa.shape, sa.device)
    rows.copy_(sa)
    return out


def column_buffer(g: int, m_max: int, kb: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, rows)``: a zeroed ``[G, K/128, m_pad]`` fp32 buffer of :func:`column_scales`' layout and the view of
    it that ``sa [G, m_max, K/128]`` is copied into (``rows.copy_(sa)``: one torch op; the padding stays zero)."""
    out = torch.zeros(g, kb, -(-m_max // 4) * 4, dtype=torch.float32, device=device)
    return out, out[:, :, :m_max].transpose(1, 2)


# ---------------------------------------------------------------------------------------------- parameters
_MapBytes = ctypes.c_ubyte * TENSOR_MAP_BYTES


class Mxfp4Params(ctypes.Structure):
    """Byte image of ``dfg::mxfp4::Mxfp4Params`` (576 bytes; the header ``static_assert``s every offset)."""

    _fields_ = [("tma_w", _MapBytes), ("tma_a", _MapBytes), ("tma_meta", _MapBytes), ("tma_sa", _MapBytes),
                ("d", ctypes.c_uint64), ("grouped_layout", ctypes.c_uint64), ("wave_per32", ctypes.c_uint64),
                ("sd", ctypes.c_uint64), ("num_rows", ctypes.c_uint32), ("sd_rows", ctypes.c_uint32),
                ("reserved", ctypes.c_ubyte * 24)]


assert ctypes.sizeof(Mxfp4Params) == 576 and Mxfp4Params.num_rows.offset == 544


def map_args(cfg: Mxfp4Config, x: torch.Tensor, tiles: torch.Tensor, meta: torch.Tensor, sa_cols: torch.Tensor):
    """The four rank-3 maps: the prepared tiles ``[G K/128 N/64][16][256]`` u8 (box: the tile's waves), A
    ``[G, m_max, K]`` e4m3 (box 128 x BLOCK_M, 128-byte swizzle), the metadata ``[G K/128 N/64][17][16]`` u8 (box: the
    tile's waves) and sA ``[G, K/128, rows]`` (:func:`column_scales`' view; box BLOCK_M). A wave's tile / metadata is one contiguous record, the
    tile's waves consecutive ones (``[G][K/128][N/64]`` order)."""
    batches, rows, k = x.shape  # masked: [G, m_max, K]; contiguous: [1, M_sum, K]
    kb = k // BLOCK_K
    records = cfg.num_groups * kb * (cfg.n // 64)
    waves = cfg.block_n // 64
    # sA: rows (m_pad of a copy, m_max in place: TMA zero-fills the box past them either way), K-blocks, groups.
    # A group stride is any 16-byte multiple when there is one group (an unsqueezed [1, M_sum, K/128] may have another).
    sa_rows, sa_row_bytes = sa_cols.shape[2], sa_cols.stride(1) * 4
    sa_group_bytes = sa_cols.stride(0) * 4 if sa_cols.shape[0] > 1 else sa_row_bytes * kb
    return (
        (TmaDtype.UINT8, tiles.data_ptr(), (256, 16, records), (256, WAVE_TILE_BYTES), (256, 16, waves),
         TmaSwizzle.NONE),
        (TmaDtype.UINT8, x.data_ptr(), (k, rows, batches), (k, rows * k), (BLOCK_K, cfg.block_m, 1), TmaSwizzle.B128),
        (TmaDtype.UINT8, meta.data_ptr(), (16, 17, records), (16, WAVE_META_BYTES), (16, 17, waves), TmaSwizzle.NONE),
        (TmaDtype.FLOAT32, sa_cols.data_ptr(), (sa_rows, kb, batches), (sa_row_bytes, sa_group_bytes),
         (cfg.block_m, 1, 1), TmaSwizzle.NONE),
    )


def encode_maps(args, backend: Backend) -> list[bytes]:
    if backend is Backend.SIM:
        from ..simulator import pack_tensor_map

        return [pack_tensor_map(TensorMapSpec(*a)) for a in args]
    from ..runtime import driver

    return [driver.tensor_map_cache.lookup(a, a) for a in args]


# ---------------------------------------------------------------------------------------------- launch
_loaded: dict[tuple[Mxfp4Config, int], object] = {}


def cuda_kernel(config: Mxfp4Config, index: int):
    loaded = _loaded.get((config, index))
    if loaded is None:
        from ..runtime import driver
        from ..runtime.compiler import compile_kernel

        name, source = render_source(config)
        compiled = compile_kernel(name, source)
        loaded = driver.load_kernel(compiled.cubin, compiled.name, index, key=compiled.key)
        _loaded[(config, index)] = loaded
    return loaded


def num_ctas(backend: Backend) -> int:
    if backend is Backend.SIM:
        return env.sim_num_sms()
    from ..utils import get_num_sms

    return get_num_sms()


def grid_size(config: Mxfp4Config, batches: int, rows: int, num_ctas: int) -> int:
    """CTAs of a launch: one per tile (``batches x N/BLOCK_N x ceil(rows/BLOCK_M)``), at most ``num_ctas``
    (persistent), at least one."""
    return max(1, min(num_ctas, batches * (config.n // config.block_n) * -(-rows // config.block_m)))


def launch(config: Mxfp4Config, x: torch.Tensor, sa: torch.Tensor, prepared, d: torch.Tensor,
           grouped_layout: torch.Tensor, backend: Backend, sd: torch.Tensor | None = None) -> None:
    """The kernel on validated tensors: ``x`` e4m3 ``[G, m_max, K]`` (masked) or ``[M_sum, K]`` (contiguous) with
    ``sa`` fp32 of the same rows by ``K/128``; ``prepared`` an :class:`deep_fp8_gemm.ops.mxfp4.PreparedMxfp4`;
    ``d`` ``[G, m_max, N_out]`` / ``[M_sum, N_out]`` (contiguous): bf16, or e4m3 for the FP8 outputs with ``sd`` their
    1x128 scales in the M-major TMA-aligned layout; ``grouped_layout`` int32 ``masked_m [G]``,
    ``m_indices [M_sum]`` or psum ends ``[G]`` (``config.layout``). The one place an MXFP4 launch branches on the
    backend."""
    if config.layout != "masked":  # one batch of M_sum rows
        x, sa = x.unsqueeze(0), sa.unsqueeze(0)
    batches, rows, _ = x.shape
    if rows == 0 or batches == 0:
        return
    sa_cols = column_scales(sa)
    maps = encode_maps(map_args(config, x, prepared.tiles, prepared.meta, sa_cols), backend)
    params = param_structs.pack(Mxfp4Params, tma_w=maps[0], tma_a=maps[1], tma_meta=maps[2], tma_sa=maps[3],
                                d=d.data_ptr(), grouped_layout=grouped_layout.data_ptr(),
                                wave_per32=prepared.wave_per32.data_ptr(), num_rows=rows,
                                sd=0 if sd is None else sd.data_ptr(), sd_rows=0 if sd is None else sd.stride(-1))
    grid = grid_size(config, batches, rows, num_ctas(backend))
    if backend is Backend.SIM:
        from ..simulator import launch as sim_launch, ptxas_registers

        name, source = render_source(config)
        registers = ptxas_registers(name, source)
        _, sim_source = render_source(config, simulator=True)
        sim_launch(name, sim_source, params, grid=grid, block=config.num_threads, cluster=1, smem_bytes=config.smem_bytes,
                   registers=registers)
    elif backend is Backend.CUDA:
        from ..runtime import driver, target

        index = target.gpu_index(x.device)
        driver.launch(cuda_kernel(config, index), params, grid=grid, block=config.num_threads, smem_bytes=config.smem_bytes,
                      stream=target.current_stream(index), pdl=PROCESS_SETTINGS.pdl)
    else:
        raise ValueError(f"the MXFP4 kernel launches on Backend.CUDA or Backend.SIM, got {backend}")


# ---------------------------------------------------------------------------------------------- audit
#: Expert shapes (N, K) the audit compiles: Kimi-K3's w13 / w2 (N 6144, K 3584 / N 3584, K 3072) and DeepSeek-V3's
#: (N 4096, K 7168 / N 7168, K 2048), for 32 local experts.
AUDIT_SHAPES = ((6144, 3584), (3584, 3072), (4096, 7168), (7168, 2048))
AUDIT_GROUPS = 32


def audit_configs() -> list[Mxfp4Config]:
    """The decode tiles on every audit shape: BLOCK_M 8 / 16 at BLOCK_N 256 (the picks at decode), BLOCK_M 32 at
    BLOCK_N 128, and BLOCK_N 64 at BLOCK_M 16 (few experts); the contiguous and psum layouts' prefill picks; the FP8
    and SwiGLU·FP8 outputs at decode."""
    configs = []
    for n, k in AUDIT_SHAPES:
        for block_m, block_n in ((8, 256), (16, 256), (32, 128), (16, 64)):
            configs.append(dataclasses.replace(pick_config(n, k, AUDIT_GROUPS, block_m, 132), block_n=block_n))
    # The contiguous layouts (issue 43, vLLM's call) at the prefill picks: m_indices (alignment 128: 128 tokens),
    # psum (alignment 64: 64 tokens).
    n, k = AUDIT_SHAPES[0]
    configs.append(pick_config(n, k, AUDIT_GROUPS, 4096, 132, "contiguous", 128))
    configs.append(pick_config(n, k, AUDIT_GROUPS, 4096, 132, "psum", 64))
    # The FP8-output epilogues at the decode picks (issue 43): the down-projection's input and the fused
    # up-projection (SwiGLU of the interleaved w13).
    configs.append(pick_config(n, k, AUDIT_GROUPS, 8, 132, "masked", 128, "fp8"))
    configs.append(pick_config(n, k, AUDIT_GROUPS, 16, 132, "masked", 128, "swiglu_fp8"))
    # ... and the contiguous layout's SwiGLU (the kinds table's mxfp4_contiguous_swiglu: 32 tokens of a 128 block)
    configs.append(pick_config(n, k, AUDIT_GROUPS, 32, 132, "contiguous", 128, "swiglu_fp8"))
    return configs


def convert_audit_configs() -> list[Mxfp4Config]:
    """The conversion kernel's picks (issue 43, prefill): both contiguous layouts at their alignments (m_indices 128:
    two math warpgroups; psum 64: one) on every audit shape."""
    configs = [pick_convert_config(n, k, AUDIT_GROUPS, layout, alignment)
               for n, k in AUDIT_SHAPES for layout, alignment in (("contiguous", 128), ("psum", 64))]
    # The FP8 output (the down-projection's input at prefill) at both tiles.
    n, k = AUDIT_SHAPES[0]
    configs += [pick_convert_config(n, k, AUDIT_GROUPS, layout, alignment, "fp8")
                for layout, alignment in (("contiguous", 128), ("psum", 64))]
    return configs


def audit_targets() -> list:
    """One :class:`deep_fp8_gemm.runtime.audit.AuditTarget` per config: kind ``"mxfp4"`` for :func:`audit_configs`
    (the register-A kernel), ``"mxfp4_convert"`` for :func:`convert_audit_configs` (its own K-loop ceilings)."""
    from ..runtime.audit import AuditTarget

    targets = []
    for config in audit_configs():
        name, source = render_source(config)
        targets.append(AuditTarget("mxfp4", config.as_dict(), name, source, required_sass=REQUIRED_SASS))
    for config in convert_audit_configs():
        name, source = render_source(config)
        targets.append(AuditTarget("mxfp4_convert", config.as_dict(), name, source,
                                   required_sass=CONVERT_REQUIRED_SASS))
    return targets
