"""Kernel configuration: the frozen dataclass of everything compiled into one kernel, the kind sets derived from the
kinds table, and every legality rule in one function (:func:`check_config`).

The shared-memory map here is the one in ``include/deep_fp8_gemm/kernels/fp8_gemm.cuh``; the kernel
``static_assert``s that both agree. The cost model is :mod:`.cost`, the heuristic that picks a config :mod:`.heuristic`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math

from .. import kinds
from ..constants import CONTIGUOUS_ALIGNMENTS, DEFAULT_CONTIGUOUS_ALIGNMENT, GRAN_K
from ..utils import ceil_div



#: The kinds table (``kinds.TABLE``): every kind set below is derived from it, none is written out by hand.
_TABLE = kinds.TABLE

#: ``dfg::GemmKind`` (kinds.cuh, generated from the same table): same names and values.
GemmKind = enum.IntEnum("GemmKind", [(row.cpp, row.id) for row in _TABLE.rows])
GemmKind.__doc__ = "``dfg::GemmKind`` (kinds.cuh), same names and values; the config kinds are their Python names."

#: The config kinds (the names used in kernel names, audit kinds and the op families), in GemmKind order.
KINDS = _TABLE.names_of("fp8_gemm")  # the FP8 GEMM template's kinds (BF16 / TF32 rows: their own kernels)
KIND_IDS = {row.name: GemmKind(row.id) for row in _TABLE.rows}


def _output_trait(kind: str, trait: str):
    return _TABLE.traits(kind, "output")[trait]


#: The FP8-output kinds (output.cuh Fp8TmaStore): e4m3 D with 1x128 per-row scales quantised from the fp32
#: accumulators in the epilogue; tiles of one 128-column output group. The SwiGLU kinds are FP8-output kinds too.
FP8_OUTPUT_KINDS = tuple(kind for kind in KINDS if _output_trait(kind, "row_scales"))
#: The SwiGLU up-projection kinds (policy_swiglu.cuh): B = w13 with gate / up interleaved in 128-row blocks, tiles of
#: 256 columns (gate | up of one output group) computed as two m64n128 wgmma chunks, D [m, N / 2] e4m3.
SWIGLU_KINDS = _TABLE.kinds_where(output="swiglu_fp8")
#: How each kind's tiles are enumerated (``dfg::layout_of``): the kind of the same point with its accumulation's base
#: output, whose scheduler, A / D addressing and grouped layout it shares.
LAYOUT_OF = {kind: _TABLE.layout_kind(kind) for kind in KINDS}
#: Columns of one wgmma chunk of the SwiGLU kinds, and their tile width (gate | up).
SWIGLU_MMA_N = 128
SWIGLU_BLOCK_N = 2 * SWIGLU_MMA_N
FP8_OUTPUT_BLOCK_N = 128  # one 1x128 scale group per tile
#: Kinds of the 1D1D family (policy_1d1d.cuh): per-row sB (TMA-loaded per stage), fp32 D = C + A.B^T stored from
#: the fragments (no shared-memory D tile), no clusters.
FP32_ACCUMULATE_KINDS = _TABLE.kinds_where(accumulation="1d1d")
#: The k-grouped kind (policy_k_grouped.cuh): G groups of run-time K_g, so its binary is compiled for shape_k = BLOCK_K
#: whatever the ks; get_config's k is then only the per-group K the cost model assumes.
K_GROUPED = "k_grouped"
#: Kinds whose rows are expert segments padded to the contiguous alignment ("psum": the prefix-sum ends layout),
#: their FP8-output and SwiGLU variants included.
CONTIGUOUS_KINDS = _TABLE.kinds_where(layout=("contiguous", "psum"))
#: Kinds a config may compute with swap-AB (the table's operand-order axis).
SWAP_AB_KINDS = tuple(row.name for row in _TABLE.rows if "swap_ab" in row.orders)
#: The 1x32/32x32 recipe's kinds (policy_block32.cuh): per 128-K stage four k32 wgmmas, each into a fresh partial
#: bank (two alternate) promoted with sA x sB products the producer's scale warps write into the stage; one m64
#: wave per math warpgroup (acc + two banks fill the register budget at BLOCK_N 128), BLOCK_N a multiple of the
#: 32-column scale blocks.
BLOCK32_KINDS = _TABLE.kinds_where(granularity="1x32/32x32")
BLOCK32_BLOCK_M = (64, 128)
BLOCK32_BLOCK_N = (32, 64, 96, 128)
#: sA's global layouts (scales.cuh ``ScaleMajor``, the value of ``GemmConfig.sa_major``): which dimension of sA
#: ``[G, rows, ceil(K/128)]`` is unit-stride. "m": the library's M-major TMA-aligned layout (every kind); "k" / "g":
#: read where fp8_einsum's caller left it (row-major ``sx [b, h, kb]``, or the M-major ``[b * h, kb]`` of
#: per_token_cast_to_fp8 viewed back: ``ops.einsum``), one 16-byte box row per row, four times the sA shared memory.
SA_MAJORS = ("m", "k", "g")
#: The kinds a K- or G-major sA is compiled for: the masked bf16 kind, whose sA map is 3-D (fp8_einsum's heads).
SA_MAJOR_KINDS = ("masked",)

BLOCK_K = GRAN_K  # the kernels' K tile is one scale group: one sA / sB value per row (per block) per K block
SMEM_LIMIT = 232_448  # bytes of shared memory one block may use on sm_90
REGISTER_FILE = 65_536  # 32-bit registers per SM
PRODUCER_REGISTERS = 40
MAX_STAGES = 16
BLOCK_M_CHOICES = (64, 128, 256)
BLOCK_N_CHOICES = tuple(range(16, 161, 16))
CONTIGUOUS_ALIGNMENT = DEFAULT_CONTIGUOUS_ALIGNMENT  # default rows per expert segment in the contiguous layout
MULTICAST_MIN_M = 512  # below this the operand shared by a pair is too small to be worth a cluster
BAND_BLOCKS = 16  # n-blocks per rasterisation band (L2 reuse)



def num_math_warpgroups(block_m: int) -> int:
    """Math warpgroups of a BLOCK_M tile: one for 64 rows, two otherwise."""
    return 1 if block_m == 64 else 2


def waves_m(block_m: int) -> int:
    """m64 slices ("waves") each math warpgroup computes per K block (not SM waves: see :func:`get_config`)."""
    return block_m // num_math_warpgroups(block_m) // 64


def mma_n(kind: str, block_n: int) -> int:
    """Columns of one wgmma (``kMmaN``): the tile's BLOCK_N, or a 128-column chunk of it for the SwiGLU kinds."""
    return SWIGLU_MMA_N if kind in SWIGLU_KINDS else block_n


def output_columns(kind: str, n: int) -> int:
    """Columns of D: ``n``, or ``n / 2`` for the SwiGLU kinds (``n = 2I`` gate and up columns)."""
    return n // 2 if kind in SWIGLU_KINDS else n


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmConfig:
    """Everything that is compiled into one kernel, plus its launch geometry.

    ``cluster_n == 2``: the two CTAs of a cluster share their m-block and multicast A;
    ``cluster_m == 2``: they share their n-block and multicast B (dense only).
    """

    kind: str
    shape_n: int
    shape_k: int
    num_groups: int
    block_m: int
    block_n: int
    num_stages: int
    cluster_m: int
    cluster_n: int
    band_width: int  # cluster-tile columns per rasterisation band
    grid_size: int  # CTAs launched (persistent: at most the SM count); not part of the binary
    split_k: int = 1  # dense only: K cut into split_k slices, reduced by the tile's last CTA (split_k.cuh)
    ue8m0: bool = False  # FP8-output kinds: D's scales rounded up to powers of two (quant.ceil_to_ue8m0)
    # Dense only, m <= 32: the tile computed transposed (policy_swap_ab.cuh): block_m (8..32) tokens on the wgmma's
    # N side, block_n (64 or 128) weight rows on its M side, one math warpgroup.
    swap_ab: bool = False
    # The psum kinds (LAYOUT_OF "psum"): the layout's group-start alignment, 64 or 128 rows, a multiple of block_m
    # (scheduler.cuh, psum_block_group; get_config sets the contiguous alignment); 128 for every other kind.
    psum_alignment: int = DEFAULT_CONTIGUOUS_ALIGNMENT
    # sA's global layout (:data:`SA_MAJORS`): "m" for every kernel but fp8_einsum's, which reads a K- or G-major sx
    # in place (:data:`SA_MAJOR_KINDS`; the producer's sA box and the math warps' sA pitch, fp8_gemm.cuh kSaMajor).
    sa_major: str = "m"

    def __hash__(self) -> int:
        # Configs key the per-call kernel caches: hash the fields once, not on every launch.
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash(dataclasses.astuple(self))

    @property
    def block_k(self) -> int:
        return BLOCK_K

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    @property
    def num_math_warpgroups(self) -> int:
        return 1 if self.swap_ab else num_math_warpgroups(self.block_m)

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_math_warpgroups + 1)

    @property
    def mma_rows(self) -> int:
        """Rows of the wgmma tile (its M side, in m64 waves): BLOCK_M, or BLOCK_N (the weights) with swap-AB."""
        return self.block_n if self.swap_ab else self.block_m

    @property
    def mma_cols(self) -> int:
        """Columns of the wgmma tile (its N side): BLOCK_N, or BLOCK_M (the tokens) with swap-AB."""
        return self.block_m if self.swap_ab else self.block_n

    @property
    def waves_m(self) -> int:
        """m64 slices each math warpgroup computes."""
        return self.mma_rows // self.num_math_warpgroups // 64

    @property
    def wg_rows(self) -> int:
        return self.mma_rows // self.num_math_warpgroups

    @property
    def mma_n(self) -> int:
        """Columns of one wgmma (``kMmaN``); the tile's columns but for the SwiGLU kinds' 128-column chunks."""
        return self.block_m if self.swap_ab else mma_n(self.kind, self.block_n)

    @property
    def mma_chunks(self) -> int:
        return self.mma_cols // self.mma_n

    @property
    def gran_k(self) -> int:
        """K elements per scale of A and B (the kind's granularity: 128, or 32)."""
        return int(_TABLE.traits(self.kind, "granularity")["gran_k"])

    @property
    def scale_groups_per_k_block(self) -> int:
        """sA columns one 128-K stage reads (the sA tensor map's box width): 1, or 4 for the 1x32 recipe."""
        return BLOCK_K // self.gran_k

    @property
    def sa_pitch(self) -> int:
        """Floats between two rows' scales in a stage's sA (``kSaPitch``): 1, or 4 for a K- / G-major sA (its box is
        16 bytes per row)."""
        return sa_pitch(self.sa_major)

    @property
    def math_registers(self) -> int:
        return 240 if self.num_math_warpgroups == 1 else 232

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.block_m, self.block_n, self.num_stages, self.kind, self.swap_ab, self.sa_major)

    @property
    def multicast(self) -> str:
        return "A" if self.cluster_n == 2 else "B" if self.cluster_m == 2 else "none"

    def template_constants(self) -> dict[str, int]:
        """The compile-time constants of ``jit/fp8_gemm.cu`` (the kernel binary's identity)."""
        return {
            "KIND": int(KIND_IDS[self.kind]),
            "SHAPE_N": self.shape_n,
            "SHAPE_K": self.shape_k,
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "NUM_STAGES": self.num_stages,
            "NUM_GROUPS": self.num_groups,
            "CLUSTER_M": self.cluster_m,
            "CLUSTER_N": self.cluster_n,
            "NUM_MATH_WARPGROUPS": self.num_math_warpgroups,
            "BAND_WIDTH": self.band_width,
            "SMEM_BYTES": self.smem_bytes,
            "MATH_REGISTERS": self.math_registers,  # the kernel static_asserts its setmaxnreg split against these
            "PRODUCER_REGISTERS": PRODUCER_REGISTERS,
            "SPLIT_K": self.split_k,
            "USE_UE8M0": self.ue8m0,
            "SWAP_AB": self.swap_ab,
            "PSUM_ALIGNMENT": self.psum_alignment,
            "SA_MAJOR": SA_MAJORS.index(self.sa_major),  # scales.cuh ScaleMajor's value
        }

    def kernel_name(self) -> str:
        """Readable, unique per binary: the extern "C" symbol of the rendered kernel."""
        return (
            f"dfg_fp8_gemm_{self.kind}_n{self.shape_n}_k{self.shape_k}_g{self.num_groups}"
            f"_m{self.block_m}n{self.block_n}_s{self.num_stages}_c{self.cluster_m}x{self.cluster_n}_w{self.band_width}"
            + (f"_sk{self.split_k}" if self.split_k > 1 else "") + ("_ue8m0" if self.ue8m0 else "")
            + ("_swapab" if self.swap_ab else "")
            + (f"_a{self.psum_alignment}" if self.psum_alignment != DEFAULT_CONTIGUOUS_ALIGNMENT else "")
            + (f"_sa{self.sa_major}" if self.sa_major != "m" else "")
        )

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(
            num_threads=self.num_threads,
            smem_bytes=self.smem_bytes,
            multicast=self.multicast,
            num_math_warpgroups=self.num_math_warpgroups,
            math_registers=self.math_registers,
            producer_registers=PRODUCER_REGISTERS,
            mma_n=self.mma_n,
            mma_chunks=self.mma_chunks,
            mma_rows=self.mma_rows,
            mma_cols=self.mma_cols,
            scale_groups_per_k_block=self.scale_groups_per_k_block,
            sa_pitch=self.sa_pitch,
        )
        return d


def sa_pitch(sa_major: str) -> int:
    """Floats per row of a stage's sA for sA's global layout ``sa_major`` (scales.cuh ``scale_row_pitch``)."""
    return 1 if sa_major == "m" else 4


def smem_bytes(block_m: int, block_n: int, num_stages: int, kind: str = "dense", swap_ab: bool = False,
               sa_major: str = "m") -> int:
    """Dynamic shared memory of the kernel (same map as Fp8GemmKernel in fp8_gemm.cuh; swap-AB: the transposed
    bf16 D tile [BLOCK_M][BLOCK_N] of policy_swap_ab.cuh, the same stages; a K- / G-major sA: its stage four times
    larger, ``sa_pitch``)."""
    fp32_out = kind in FP32_ACCUMULATE_KINDS
    if kind in FP8_OUTPUT_KINDS:  # e4m3 D tile [BLOCK_M][128] + the amax partials [math warps][2 waves][32] u32
        d_tile = round_up(block_m * FP8_OUTPUT_BLOCK_N + 4 * num_math_warpgroups(block_m) * 2 * waves_m(block_m)
                           * 32 * 4, 1024)
    else:
        d_tile = 0 if fp32_out else round_up(block_m * block_n * 2, 1024)  # bf16 D tile, 16-column swizzled chunks
    a_stage = block_m * BLOCK_K
    b_stage = block_n * BLOCK_K
    if kind in BLOCK32_KINDS:  # records of sA [4][BLOCK_M], the scale products, the full / empty / scales barriers
        return d_tile + num_stages * (a_stage + b_stage + block32_record_bytes(block_m, block_n))
    sa_stage = round_up(block_m * 4 * sa_pitch(sa_major), 128)
    # 1D2D: the K block's sB values of the tile's two scale blocks; 1D1D: the K block's BLOCK_N row scales of B.
    sb_stage = round_up(block_n * 4, 128) if fp32_out else 16
    if fp32_out:  # stage records of sA and sB, then the full and empty barrier arrays
        return d_tile + num_stages * (a_stage + b_stage + round_up(sa_stage + sb_stage, 128) + 2 * 8)
    # stage records of sA, sB, the stage's full and empty barriers
    return d_tile + num_stages * (a_stage + b_stage + round_up(sa_stage + sb_stage + 2 * 8, 128))


def block32_product_floats(block_n: int) -> int:
    """Floats of one row pair's sA x sB products per k32 in a stage (policy_block32.cuh Block32Products): the two
    rows' ``block_n / 32`` column-block products, padded to whole 16-byte loads (8 bytes for one column block)."""
    groups = block_n // 32
    return 2 if groups == 1 else round_up(2 * groups, 4)


def block32_record_bytes(block_m: int, block_n: int) -> int:
    """A 1x32-recipe stage's record: sA ``[4][BLOCK_M]`` fp32 (TMA), the products ``[4][BLOCK_M / 2][floats]``, each
    scale warp's (``BLOCK_M / 64``) 64-byte sB staging, the producer's 16-byte header, three barriers (full, empty,
    scales), rounded to 128 bytes (policy_block32.cuh)."""
    return round_up(block_m * 16 + 4 * (block_m // 2) * block32_product_floats(block_n) * 4 + (block_m // 64) * 64
                    + 16 + 3 * 8, 128)


def _block32_problems(cfg: GemmConfig) -> list[str]:
    """The 1x32/32x32 recipe's rules (policy_block32.cuh)."""
    if cfg.kind not in BLOCK32_KINDS:
        return []
    problems = []
    if cfg.block_m not in BLOCK32_BLOCK_M:
        problems.append(f"{cfg.kind}: one m64 wave per math warpgroup (the accumulator and two partial banks fill the "
                        f"register budget): block_m must be one of {BLOCK32_BLOCK_M}, got {cfg.block_m}")
    if cfg.block_n not in BLOCK32_BLOCK_N:
        problems.append(f"{cfg.kind}: block_n must be one of {BLOCK32_BLOCK_N} (whole 32-column scale blocks, at most "
                        f"128 for the registers), got {cfg.block_n}")
    if cfg.split_k != 1 or cfg.swap_ab:
        problems.append(f"{cfg.kind}: no split-K or swap-AB, got split_k={cfg.split_k} swap_ab={cfg.swap_ab}")
    return problems


def check_config(cfg: GemmConfig, smem_limit: int = SMEM_LIMIT) -> None:
    """Every legality rule, in one place. Raises ``ValueError`` listing each violated rule."""
    problems = problem_rules(cfg.kind, cfg.shape_n, cfg.shape_k, cfg.num_groups)
    if cfg.swap_ab:
        problems += _swap_ab_problems(cfg)
    elif cfg.block_m not in BLOCK_M_CHOICES:
        problems.append(f"block_m must be one of {BLOCK_M_CHOICES}, got {cfg.block_m}")
    if cfg.block_n % 16 or not 16 <= cfg.block_n <= 256:
        problems.append(f"block_n must be a multiple of 16 in [16, 256] (wgmma N, 16-column epilogue chunks), got {cfg.block_n}")
    if cfg.block_n > 128 + math.gcd(cfg.block_n, 128):
        problems.append(f"block_n={cfg.block_n} columns could touch three 128-column sB blocks")
    math_regs_needed = math_registers_needed(cfg.kind, cfg.block_m, cfg.block_n, cfg.swap_ab)
    if math_regs_needed > cfg.math_registers:
        problems.append(
            f"accumulators need ~{math_regs_needed} registers per math thread, budget {cfg.math_registers} "
            f"(block_m={cfg.block_m} block_n={cfg.block_n})"
        )
    if PRODUCER_REGISTERS * 128 + cfg.math_registers * 128 * cfg.num_math_warpgroups > REGISTER_FILE:
        problems.append("setmaxnreg split exceeds the 64K-register file")
    if cfg.smem_bytes > smem_limit:
        problems.append(f"shared memory {cfg.smem_bytes} B exceeds the limit {smem_limit} B")
    if not 2 <= cfg.num_stages <= MAX_STAGES:
        problems.append(f"num_stages must be in [2, {MAX_STAGES}], got {cfg.num_stages}")
    problems += _fp8_output_problems(cfg)
    problems += _block32_problems(cfg)
    if cfg.sa_major not in SA_MAJORS:
        problems.append(f"sa_major must be one of {SA_MAJORS}, got {cfg.sa_major!r}")
    elif cfg.sa_major != "m" and (cfg.kind not in SA_MAJOR_KINDS or cfg.swap_ab):
        problems.append(f"sa_major={cfg.sa_major!r} (sA read K- or G-major) is compiled for the kinds "
                        f"{SA_MAJOR_KINDS} only, got kind={cfg.kind!r} swap_ab={cfg.swap_ab}")
    if cfg.kind in FP32_ACCUMULATE_KINDS and cfg.cluster_size != 1:
        problems.append(f"the 1D1D kernel does not multicast (its sB slice is per CTA): cluster 1x1, got "
                        f"{cfg.cluster_m}x{cfg.cluster_n}")
    if cfg.kind == K_GROUPED and cfg.shape_k != BLOCK_K:
        problems.append(f"the k-grouped kernel reads K per group at run time: shape_k must be {BLOCK_K}, got "
                        f"{cfg.shape_k}")
    if not _block_m_fits_layout(cfg.kind, cfg.block_m, max(CONTIGUOUS_ALIGNMENTS)):
        problems.append(f"contiguous layout pads experts to at most {max(CONTIGUOUS_ALIGNMENTS)} rows: block_m <= "
                        f"{max(CONTIGUOUS_ALIGNMENTS)}, got {cfg.block_m}")
    if LAYOUT_OF.get(cfg.kind) == "psum":
        if cfg.psum_alignment not in CONTIGUOUS_ALIGNMENTS or cfg.psum_alignment % cfg.block_m:
            problems.append(f"psum_alignment (group starts) must be one of {CONTIGUOUS_ALIGNMENTS} and a multiple of "
                            f"block_m={cfg.block_m}, got {cfg.psum_alignment}")
    elif cfg.psum_alignment != DEFAULT_CONTIGUOUS_ALIGNMENT:
        problems.append(f"psum_alignment applies to the psum kinds only (keep {DEFAULT_CONTIGUOUS_ALIGNMENT}), got "
                        f"{cfg.psum_alignment} for kind={cfg.kind!r}")
    if (cfg.cluster_m, cfg.cluster_n) not in ((1, 1), (1, 2), (2, 1)):
        problems.append(f"cluster must be 1x1, 1x2 or 2x1, got {cfg.cluster_m}x{cfg.cluster_n}")
    num_n_blocks = ceil_div(cfg.shape_n, cfg.block_n) if cfg.shape_n > 0 else 0
    if cfg.cluster_n == 2 and num_n_blocks % 2:
        problems.append(f"multicast on A pairs n-blocks: need an even n-block count, got {num_n_blocks}")
    if cfg.cluster_m == 2 and LAYOUT_OF.get(cfg.kind) != "dense":
        problems.append("grouped kinds multicast only on A (a pair must not straddle two experts)")
    if cfg.grid_size < cfg.cluster_size or cfg.grid_size % cfg.cluster_size:
        problems.append(f"grid_size={cfg.grid_size} must be a positive multiple of the cluster size {cfg.cluster_size}")
    if cfg.band_width < 1:
        problems.append(f"band_width must be >= 1, got {cfg.band_width}")
    problems += _split_k_problems(cfg)
    if problems:
        raise ValueError("illegal GEMM config: " + "; ".join(problems))


def math_registers_needed(kind: str, block_m: int, block_n: int, swap_ab: bool = False) -> int:
    """Modelled registers per math thread: kWavesM accumulators of BLOCK_N/2 floats, the scratch accumulator of one
    wgmma (MMA_N/2 floats: BLOCK_N, or the SwiGLU kinds' 128-column chunk), plus the measured overhead of the
    family (:data:`MATH_REGISTER_OVERHEAD`: addresses, scales, scheduler state; the 1D1D kinds hold the K block's
    per-column B scales of the thread's columns too, BLOCK_N / 4 more). Swap-AB: BLOCK_N / 64 waves of BLOCK_M / 2
    floats, and the scratch of one m64nBLOCK_M wgmma. ``tests/kernels/test_register_model.py`` compiles the tiles on both
    sides of the 232-register budget and checks that this model's verdict is ptxas's."""
    if swap_ab:
        return (block_n // 64 + 1) * block_m // 2 + MATH_REGISTER_OVERHEAD
    if kind in BLOCK32_KINDS:  # the accumulator and two partial banks of one m64 wave
        return 3 * block_n // 2 + MATH_REGISTER_OVERHEAD
    accumulators = waves_m(block_m) * block_n // 2 + mma_n(kind, block_n) // 2
    if kind in FP32_ACCUMULATE_KINDS:
        return accumulators + FP32_ACCUMULATE_REGISTER_OVERHEAD + block_n // 4
    return accumulators + MATH_REGISTER_OVERHEAD


#: Registers per math thread beyond the accumulators, calibrated against ptxas (NVRTC 13.5, sm_90a, the 232-register
#: budget of two math warpgroups; tests/kernels/test_register_model.py): 256 x 128 compiles spill-free (2 x 64 + 64 = 192
#: accumulator registers, so the overhead is <= 40) in the dense, masked and FP8-output kinds and the SwiGLU kinds'
#: 1 x 256 + 128 tile, while 256 x 144 spills (216: > 16) — 24 B (dense), 120 B (masked). 40 keeps every tile ptxas
#: fits and rejects every tile it spills. (It was 56, from a masked 256 x 128 kernel of an earlier round that spilled
#: 40 B; the same tile compiles spill-free now.)
MATH_REGISTER_OVERHEAD = 40
#: The 1D1D kinds (weight gradients): not yet recalibrated with the per-column scales in registers (issue 28).
FP32_ACCUMULATE_REGISTER_OVERHEAD = 56

#: Swap-AB (policy_swap_ab.cuh): the token tiles (the wgmma's N, multiples of 8) and weight tiles (m64 waves of one
#: math warpgroup) it is compiled for, and the rows up to which the heuristic weighs it.
SWAP_AB_BLOCK_M = (8, 16, 24, 32)
SWAP_AB_BLOCK_N = (64, 128)
SWAP_AB_MAX_M = 32
#: A swap-AB config must model at least ~10% faster than the best plain one (the model is uncalibrated).
SWAP_AB_MARGIN = 0.10


def _swap_ab_problems(cfg: GemmConfig) -> list[str]:
    """The swap-AB rules (policy_swap_ab.cuh): the dense bf16 kind, token tiles of 8..32, weight tiles of one or two
    m64 waves (so a wave never straddles two sB blocks), no clusters."""
    problems = []
    if cfg.kind not in SWAP_AB_KINDS:
        problems.append(f"swap_ab is a kernel of the kinds {SWAP_AB_KINDS} (the kinds table's operand orders), got "
                        f"kind={cfg.kind!r}")
    if cfg.block_m not in SWAP_AB_BLOCK_M:
        problems.append(f"swap_ab: block_m (the tile's tokens, the wgmma's N) must be one of {SWAP_AB_BLOCK_M}, got "
                        f"{cfg.block_m}")
    if cfg.block_n not in SWAP_AB_BLOCK_N:
        problems.append(f"swap_ab: block_n (the tile's weight rows, m64 waves) must be one of {SWAP_AB_BLOCK_N}, got "
                        f"{cfg.block_n}")
    if cfg.cluster_size != 1:
        problems.append(f"swap_ab: no clusters, got {cfg.cluster_m}x{cfg.cluster_n}")
    return problems


def _fp8_output_problems(cfg: GemmConfig) -> list[str]:
    """The FP8-output and SwiGLU kinds' rules (output.cuh Fp8TmaStore, policy_swiglu.cuh)."""
    problems = []
    if cfg.ue8m0 and cfg.kind not in FP8_OUTPUT_KINDS:
        problems.append(f"ue8m0 (power-of-two output scales) needs an FP8-output kind, got kind={cfg.kind!r}")
    if cfg.kind not in FP8_OUTPUT_KINDS:
        return problems
    want = SWIGLU_BLOCK_N if cfg.kind in SWIGLU_KINDS else FP8_OUTPUT_BLOCK_N
    if cfg.block_n != want:
        problems.append(f"{cfg.kind}: a tile is one 128-column output group, block_n must be {want}, got "
                        f"{cfg.block_n}")
    if cfg.kind in SWIGLU_KINDS:
        if cfg.shape_n % SWIGLU_BLOCK_N:
            problems.append(f"{cfg.kind}: n = 2I (gate and up) with I a multiple of 128, got n={cfg.shape_n}")
        if cfg.waves_m != 1:
            problems.append(f"{cfg.kind}: one m64 wave per math warpgroup (block_m 64 or 128; the 256-column "
                            f"accumulator fills the register budget), got block_m={cfg.block_m}")
    if output_columns(cfg.kind, cfg.shape_n) % 16:
        problems.append(f"{cfg.kind}: D's e4m3 rows must be 16-byte multiples, got {output_columns(cfg.kind, cfg.shape_n)}"
                        " columns")
    return problems


def problem_rules(kind: str, n: int, k: int, num_groups: int) -> list[str]:
    """The rules on the problem itself (kind, TMA row strides, group count): shared by :func:`check_config` and
    :func:`get_config`'s argument check."""
    problems = []
    if kind not in KINDS:
        problems.append(f"kind must be one of {KINDS}, got {kind!r}")
    if n % 8 or k % 16 or n <= 0 or k <= 0:
        problems.append(f"TMA needs 16-byte row strides: n % 8 == 0 and k % 16 == 0, got n={n} k={k}")
    if LAYOUT_OF.get(kind) in ("dense", "1d1d") and num_groups != 1:
        problems.append(f"{kind} GEMM takes num_groups=1, got num_groups={num_groups}")
    if num_groups < 1:
        problems.append(f"num_groups must be >= 1, got num_groups={num_groups}")
    if kind in SWIGLU_KINDS and n % SWIGLU_BLOCK_N:
        problems.append(f"{kind}: n = 2I (gate and up) with I a multiple of 128, got n={n}")
    if kind in FP8_OUTPUT_KINDS and n > 0 and output_columns(kind, n) % 16:
        problems.append(f"{kind}: D's e4m3 rows must be 16-byte multiples (n_out % 16 == 0), got n_out="
                        f"{output_columns(kind, n)}")
    return problems


def _block_m_fits_layout(kind: str, block_m: int, alignment: int) -> bool:
    """A contiguous kind's M tile must not straddle two experts: BLOCK_M <= the layout's alignment."""
    return kind not in CONTIGUOUS_KINDS or block_m <= alignment


def contiguous_block_m(alignment: int) -> int:
    """BLOCK_M of the contiguous kinds under a layout ``alignment``: the alignment itself, as in the reference
    design's SM90 heuristic (its only block_m candidate for the M-grouped contiguous GEMMs). So the blocks of the
    kernels are the layout's segments' blocks: a block holds rows of one expert and, when the expert's rows end
    inside it, its tail of padding rows, which the kernels compute with the block's expert (the CPU reference
    does the same, ``ops.contiguous.reference_row_parts``)."""
    if alignment not in CONTIGUOUS_ALIGNMENTS:
        raise ValueError(f"contiguous_alignment must be one of {CONTIGUOUS_ALIGNMENTS}, got {alignment!r}")
    return alignment


def _split_k_problems(cfg: GemmConfig) -> list[str]:
    """Split-K rules (split_k.cuh): a divisor of the K block count (every split runs the same unrolled K
    loop), dense kind, no clusters."""
    if cfg.split_k == 1:
        return []
    k_blocks = ceil_div(cfg.shape_k, BLOCK_K) if cfg.shape_k > 0 else 0
    if not isinstance(cfg.split_k, int) or cfg.split_k < 1 or not k_blocks or k_blocks % cfg.split_k:
        return [f"split_k={cfg.split_k} must be a positive divisor of the K block count {k_blocks}"]
    if LAYOUT_OF[cfg.kind] != "dense" or cfg.cluster_size != 1:
        return [f"split_k > 1 needs a dense kind and a 1x1 cluster, got kind={cfg.kind!r} "
                f"cluster {cfg.cluster_m}x{cfg.cluster_n}"]
    if cfg.waves_m != 1 and not cfg.swap_ab:  # audit: the reduce of two m64 waves (256x112) spilled; swap-AB's
        # fragments are small (BLOCK_M / 2 floats a wave)
        return [f"split_k > 1 needs one m64 wave per math warpgroup (block_m 64 or 128), got block_m={cfg.block_m}"]
    return []


def split_k_workspace(cfg: GemmConfig, m: int) -> tuple[int, int]:
    """``(counter_words, partial_floats)`` a split-K launch of ``cfg`` for ``m`` rows needs (split_k.cuh): one
    u32 counter per (tile, math warpgroup) and split_k fp32 partial tiles per tile; (0, 0) without split-K."""
    if cfg.split_k == 1:
        return 0, 0
    tiles = ceil_div(max(m, 1), cfg.block_m) * ceil_div(cfg.shape_n, cfg.block_n)
    return tiles * cfg.num_math_warpgroups, tiles * cfg.split_k * cfg.block_m * cfg.block_n


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@functools.lru_cache(maxsize=4096)  # pure; the heuristic asks it for every candidate tile of every problem
def max_stages(block_m: int, block_n: int, smem_limit: int, kind: str = "dense", sa_major: str = "m") -> int:
    stages = MAX_STAGES
    while stages >= 2 and smem_bytes(block_m, block_n, stages, kind, False, sa_major) > smem_limit:
        stages -= 1
    return stages
