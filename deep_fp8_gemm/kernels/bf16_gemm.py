"""Host side of the BF16 GEMM kernels (issue 41; ``include/deep_fp8_gemm/kernels/bf16_gemm.cuh``, ``jit/bf16_gemm.cu``):
config -> source -> tensor maps + parameters -> launch, for ``Backend.CUDA`` and ``Backend.SIM``.

One kernel template, five forms (:class:`Bf16Form`); every operand arrives already validated by the op layer and
already viewed in the kernel's orientation, so :func:`launch` is the one entry the public ops call:

===================== ======================== ======================== ====================== =====================
form                  ``a``                    ``b``                    ``d`` (row-major)      extra
===================== ======================== ======================== ====================== =====================
DENSE                 ``[m, k]``               ``[n, k]``               ``[m, n]``
M_GROUPED_CONTIGUOUS  ``[m, k]`` K-major       ``[G, n, k]`` K / MN     ``[m, n]`` bf16        ``grouped_layout``
                                                                                                int32 ``[m]``
M_GROUPED_MASKED      ``[G, m, k]`` K-major    ``[G, n, k]`` K-major    ``[G, m, n]`` bf16     ``masked_m`` int32
                                                                                                ``[G]``
BATCHED               ``[h, m, k]``            ``[h, n, k]``            ``[h, m, n]``
BATCHED_REDUCE        ``[s, m, k]``            ``[s, n, k]``            ``[m, n]`` fp32        ``D = C + Σ_s``
===================== ======================== ======================== ====================== =====================

Majors: an operand is K-major when ``stride(-1) == 1`` and MN-major when ``stride(-2) == 1`` (``config.major_a`` /
``major_b`` say which the kernel was built for); d (and c) have ``stride(-1) == 1``. Tensor-map rules (TMA,
``cuTensorMapEncodeTiled``), checked by :func:`launch` with a ``ValueError`` naming the argument: the data pointer of
``a`` and ``b`` 16-byte aligned, and every stride of ``a`` / ``b`` other than the unit one a multiple of 16 bytes (8
bf16 elements) when its dimension has more than one element. ``c`` may be ``d`` itself (read before written by the
same thread). Out-of-range K is zero-filled by TMA, so any ``k >= 1`` works; ``k == 0`` writes ``C`` (or zeros).

Accumulation: fp32 in registers over the whole K in a fixed order (K blocks of 64 ascending; BATCHED_REDUCE: s, then
k), never split, so a row's bits do not depend on m (batch invariance).
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools

import torch

from ..runtime import params as param_structs
from ..runtime.target import Backend
from ..runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from . import launching
from .wgmma_gen import wgmma_bf16_wrapper

TEMPLATE = "bf16_gemm.cu"
KERNEL_PREFIX = "dfg_bf16_gemm"
TENSOR_MAP_BYTES = 128
BLOCK_K = 64  # bf16 elements of one 128-byte swizzled row
SWIZZLE_BYTES = 128
MN_BOX = 64  # MN elements of one MN-major TMA box (128 bytes)
SMEM_LIMIT = 232_448  # 227 KiB
MAX_STAGES = 8
PRODUCER_REGISTERS = 40
#: SASS every BF16 GEMM kernel must contain: BF16 wgmma, TMA loads, the register split, griddepcontrol.wait (PDL).
REQUIRED_SASS = ("HGMMA", "UTMALDG", "USETMAXREG", "ACQBULK")
MAJORS = ("k", "mn")
OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: Planted bugs (``Bf16GemmConfig.planted``; ``dfg::bf16::Planted``), for the simulator tests only.
PLANTED = {"none": 0, "trans_b": 1, "full_parity": 2, "ignore_c": 3, "masked_rows": 4}


class Bf16Form(enum.IntEnum):
    """Same values as ``dfg::bf16::Form``."""

    DENSE = 0
    M_GROUPED_CONTIGUOUS = 1
    M_GROUPED_MASKED = 2
    BATCHED = 3
    BATCHED_REDUCE = 4


@dataclasses.dataclass(frozen=True)
class Bf16GemmConfig:
    """Everything that changes the binary of a BF16 GEMM kernel (shapes and strides are run-time parameters).

    ``block_m``: 64 x ``num_math_warpgroups`` x waves (a math warpgroup owns 64 or 128 rows); ``block_n`` a multiple of
    8 in [8, 256] (64 with MN-major B); ``block_k`` 64 (one 128-byte row, ``swizzle`` bytes); ``major_a`` /
    ``major_b`` ``"k"`` or ``"mn"``; ``out_dtype`` ``"bf16"`` or ``"fp32"``; ``accumulate``: D = C + A·Bᵀ with C read
    from ``c``. ``planted``: a key of :data:`PLANTED` (tests only).
    """

    form: Bf16Form
    block_m: int
    block_n: int
    stages: int
    num_math_warpgroups: int
    major_a: str = "k"
    major_b: str = "k"
    out_dtype: str = "bf16"
    accumulate: bool = False
    block_k: int = BLOCK_K
    swizzle_a: int = SWIZZLE_BYTES
    swizzle_b: int = SWIZZLE_BYTES
    planted: str = "none"

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(f"invalid Bf16GemmConfig ({'; '.join(problems)}): {self}")

    def problems(self) -> list[str]:
        """Every legality rule of the config in one place (the kernel ``static_assert``s the same)."""
        out = []
        wg_rows = self.block_m // max(self.num_math_warpgroups, 1)
        if self.num_math_warpgroups not in (1, 2) or wg_rows * self.num_math_warpgroups != self.block_m \
                or wg_rows not in (64, 128):
            out.append(f"block_m = 64 or 128 rows per math warpgroup, 1 or 2 warpgroups ({self.block_m=}, "
                       f"{self.num_math_warpgroups=})")
        if self.block_n % 8 or not 8 <= self.block_n <= 256:
            out.append(f"block_n must be a multiple of 8 in [8, 256] ({self.block_n=})")
        if wg_rows // 64 * self.block_n // 2 > 128:
            out.append(f"at most 128 accumulators per math thread ({wg_rows=}, {self.block_n=})")
        if self.major_a not in MAJORS or self.major_b not in MAJORS:
            out.append(f"majors must be in {MAJORS} ({self.major_a=}, {self.major_b=})")
        if self.major_b == "mn" and self.block_n % MN_BOX:
            out.append(f"MN-major B needs block_n % 64 == 0 ({self.block_n=})")
        if self.form is Bf16Form.M_GROUPED_CONTIGUOUS and (self.major_a != "k" or self.out_dtype != "bf16"):
            out.append("the contiguous form has a K-major A and bf16 D (B K- or MN-major)")
        if self.form is Bf16Form.M_GROUPED_MASKED and ((self.major_a, self.major_b) != ("k", "k")
                                                       or self.out_dtype != "bf16"):
            out.append("the masked form is K-major with bf16 D")
        if self.form is Bf16Form.BATCHED_REDUCE and self.out_dtype != "fp32":
            out.append("the reduce form accumulates into fp32 D")
        if self.out_dtype not in OUT_DTYPES:
            out.append(f"out_dtype must be in {tuple(OUT_DTYPES)} ({self.out_dtype=})")
        if self.block_k != BLOCK_K or self.swizzle_a != SWIZZLE_BYTES or self.swizzle_b != SWIZZLE_BYTES:
            out.append(f"block_k 64 with the 128-byte swizzle on both operands ({self.block_k=})")
        if not 2 <= self.stages <= 32:
            out.append(f"stages in [2, 32] ({self.stages=})")
        if self.planted not in PLANTED:
            out.append(f"planted must be in {tuple(PLANTED)}")
        if not out and self.smem_bytes() > SMEM_LIMIT:
            out.append(f"shared memory {self.smem_bytes()} > {SMEM_LIMIT}")
        return out

    def smem_bytes(self) -> int:
        """Dynamic shared memory: ``Bf16GemmKernel``'s map (the kernel static_asserts the same value)."""
        return self.stages * ((self.block_m + self.block_n) * self.block_k * 2 + 16)

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_math_warpgroups + 1)

    @property
    def math_registers(self) -> int:
        return 240 if self.num_math_warpgroups == 1 else 232

    def constants(self, kernel_name: str) -> dict[str, object]:
        return {
            "FORM": int(self.form), "BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "STAGES": self.stages,
            "NUM_MATH_WARPGROUPS": self.num_math_warpgroups, "MN_MAJOR_A": self.major_a == "mn",
            "MN_MAJOR_B": self.major_b == "mn", "FP32_OUT": self.out_dtype == "fp32", "ACCUMULATE": self.accumulate,
            "PLANTED": PLANTED[self.planted], "SMEM_BYTES": self.smem_bytes(), "KERNEL_NAME": kernel_name,
        }

    def as_dict(self) -> dict:
        """JSON-safe record for the audit (``block_m`` / ``block_n`` / ``num_math_warpgroups``: its K-loop analysis;
        ``math_registers`` / ``producer_registers``: its register-split check)."""
        return {"form": self.form.name.lower(), "block_m": self.block_m, "block_n": self.block_n,
                "stages": self.stages, "major_a": self.major_a, "major_b": self.major_b, "out": self.out_dtype,
                "accumulate": self.accumulate, "smem_bytes": self.smem_bytes(), "num_threads": self.num_threads,
                "num_math_warpgroups": self.num_math_warpgroups, "math_registers": self.math_registers,
                "producer_registers": PRODUCER_REGISTERS}


def _num_tiles(form: Bf16Form, m: int, n: int, num_groups: int, block_m: int, block_n: int) -> int:
    """Output tiles of a problem (masked: every group taken as full, the bound the grid is sized by)."""
    batches = num_groups if form in (Bf16Form.M_GROUPED_MASKED, Bf16Form.BATCHED) else 1
    return batches * -(-m // block_m) * -(-n // block_n)


def grid_size(config: Bf16GemmConfig, m: int, n: int, num_batches: int, num_ctas: int) -> int:
    """CTAs of a launch: one per output tile, at most ``num_ctas`` (the persistent kernel loops over the rest)."""
    return max(1, min(num_ctas, _num_tiles(config.form, m, n, num_batches, config.block_m, config.block_n)))


@functools.lru_cache(maxsize=4096)
def pick_config(form: Bf16Form, m: int, n: int, k: int, num_groups: int, major_a: str, major_b: str,
                out_dtype: torch.dtype, accumulate: bool, num_sms: int) -> Bf16GemmConfig:
    """The config for one problem: ``m`` rows per batch (masked: the per-group capacity; contiguous: all rows),
    ``num_groups`` the batch / group / s count (1 for DENSE). A pure function of its arguments, cached.

    Heuristic: BLOCK_M 64 (one math warpgroup) when m <= 64, else 128 (two); BLOCK_N from 32 / 64 / 128 / 256 (64 up
    with MN-major B) minimising ``waves x (BLOCK_N + 32)``, the modelled time of the last wave (a tile's K loop costs
    its BLOCK_N columns plus a fixed share for loading A), ties to the wider tile; as many stages (at most 8) as 227
    KiB holds. ``k`` does not change the choice (K is never split)."""
    block_m, warpgroups = (64, 1) if m <= 64 else (128, 2)
    candidates = [bn for bn in (32, 64, 128, 256) if major_b == "k" or bn % MN_BOX == 0]
    num_sms = max(num_sms, 1)

    def cost(bn: int) -> tuple[int, int]:
        waves = -(-_num_tiles(form, max(m, 1), max(n, 1), max(num_groups, 1), block_m, bn) // num_sms)
        return waves * (bn + 32), -bn

    block_n = min(candidates, key=cost)
    out = "fp32" if out_dtype == torch.float32 else "bf16"
    per_stage = (block_m + block_n) * BLOCK_K * 2 + 16
    stages = min(MAX_STAGES, SMEM_LIMIT // per_stage)
    return Bf16GemmConfig(form, block_m, block_n, stages, warpgroups, major_a, major_b, out, accumulate)


# ---------------------------------------------------------------------------------------------- source
@functools.lru_cache(maxsize=None)
def render_source(config: Bf16GemmConfig, simulator: bool = False) -> tuple[str, str]:
    """``(kernel_name, source)`` of ``config``. The name hashes the constants rendered with a placeholder name and
    no wgmma wrapper, so the sm_90a and simulator builds (which gets no PTX wrapper) share it."""
    from ..runtime.render import kernel_name, render

    anonymous = render(TEMPLATE, config.constants(KERNEL_PREFIX))
    name = kernel_name(f"{KERNEL_PREFIX}_{config.form.name.lower()}", anonymous)
    trans_b = int(config.major_b == "mn" and config.planted != "trans_b")
    extra = "" if simulator else wgmma_bf16_wrapper(config.block_n, int(config.major_a == "mn"), trans_b)
    return name, render(TEMPLATE, config.constants(name), extra_code=extra)


# ---------------------------------------------------------------------------------------------- parameters
_MapBytes = ctypes.c_ubyte * TENSOR_MAP_BYTES


class Bf16GemmParams(ctypes.Structure):
    """Byte image of ``dfg::bf16::Bf16GemmParams`` (384 bytes; the header ``static_assert``s every offset)."""

    _fields_ = [
        ("tma_a", _MapBytes), ("tma_b", _MapBytes), ("d", ctypes.c_uint64), ("c", ctypes.c_uint64),
        ("grouped_layout", ctypes.c_uint64), ("d_row_stride", ctypes.c_uint64), ("d_batch_stride", ctypes.c_uint64),
        ("c_row_stride", ctypes.c_uint64), ("c_batch_stride", ctypes.c_uint64), ("m", ctypes.c_uint32),
        ("n", ctypes.c_uint32), ("k", ctypes.c_uint32), ("num_batches", ctypes.c_uint32),
        ("reserved", ctypes.c_ubyte * 56),
    ]


assert ctypes.sizeof(Bf16GemmParams) == 384 and Bf16GemmParams.num_batches.offset == 324
PARAMS_BYTES = ctypes.sizeof(Bf16GemmParams)
MAPS_BYTES = 2 * TENSOR_MAP_BYTES  # tma_a, tma_b: the struct's head
assert Bf16GemmParams.d.offset == MAPS_BYTES


def params_packer(names: tuple[str, ...]) -> param_structs.FieldPacker:
    """A :class:`~deep_fp8_gemm.runtime.params.FieldPacker` over the named integer fields of ``Bf16GemmParams``."""
    return param_structs.FieldPacker(Bf16GemmParams, names)


def scalar_fields(d: torch.Tensor, c: torch.Tensor | None, m: int, n: int, k: int, num_batches: int) -> dict[str, int]:
    """The fields of ``Bf16GemmParams`` that are no data pointer: D's (and C's) strides and the problem's sizes."""
    return dict(d_row_stride=d.stride(-2), d_batch_stride=d.stride(0) if d.dim() == 3 else 0,
                c_row_stride=0 if c is None else c.stride(-2),
                c_batch_stride=c.stride(0) if c is not None and c.dim() == 3 else 0, m=m, n=n, k=k,
                num_batches=num_batches)

MapArgs = tuple  # (dtype, address, dims, strides, box, swizzle): a TensorMapSpec's fields


def _stride16(nbytes: int) -> int:
    """A valid TMA stride for a unit dimension (never stepped over): ``nbytes`` rounded up to 16, at least 16."""
    return max(16, -(-nbytes // 16) * 16)


def operand_map_args(t: torch.Tensor, name: str, major: str, box_rows: int) -> MapArgs:
    """The rank-3 map of operand ``t`` (``[rows, k]`` or ``[batches, rows, k]`` bf16): K-major dims (k, rows,
    batches), box (64, ``box_rows``, 1); MN-major dims (rows, k, batches), box (64, 64, 1); 128-byte swizzle. Raises
    ``ValueError`` naming ``name`` when ``t`` is not ``major`` or breaks TMA's 16-byte rules."""
    t3 = t if t.dim() == 3 else t.unsqueeze(0)
    batches, rows, k = t3.shape
    inner, outer = (-1, -2) if major == "k" else (-2, -1)
    if t3.shape[inner] > 1 and t3.stride(inner) != 1:
        which = "stride(-1)" if major == "k" else "stride(-2)"
        raise ValueError(f"{name} must be {major.upper()}-major ({which} == 1), got shape {tuple(t.shape)} strides "
                         f"{tuple(t.stride())}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: TMA needs a 16-byte aligned data pointer, got {t.data_ptr():#x}")
    strides = []
    for dim, label in ((outer, "row" if major == "k" else "k"), (0, "batch")):
        size, stride = t3.shape[dim], t3.stride(dim) * 2
        if size == 1:
            stride = _stride16(t3.numel() * 2)
        elif stride % 16 or stride <= 0 or stride >= 1 << 40:
            raise ValueError(f"{name}: TMA needs its {label} stride a positive multiple of 16 bytes (8 bf16) below "
                             f"2^40, got {stride} bytes (shape {tuple(t.shape)}, strides {tuple(t.stride())})")
        strides.append(stride)
    if major == "k":
        dims, box = (k, rows, batches), (BLOCK_K, box_rows, 1)
    else:
        dims, box = (rows, k, batches), (MN_BOX, BLOCK_K, 1)
    return TmaDtype.BFLOAT16, t.data_ptr(), dims, tuple(strides), box, TmaSwizzle.B128


def operand_maps(config: Bf16GemmConfig, a: torch.Tensor, b: torch.Tensor) -> tuple[MapArgs, MapArgs]:
    """The map arguments of ``a`` and ``b`` for ``config`` (boxes of ``block_m`` / ``block_n`` rows)."""
    return (operand_map_args(a, "a", config.major_a, config.block_m),
            operand_map_args(b, "b", config.major_b, config.block_n))


def encode_maps(args, backend: Backend) -> list[bytes]:
    """The 128-byte images of ``args``: encoded by the driver (cached) or packed for the simulator."""
    if backend is Backend.SIM:
        from ..simulator import pack_tensor_map

        return [pack_tensor_map(TensorMapSpec(*x)) for x in args]
    from ..runtime import driver

    return [driver.tensor_map_cache.lookup(x, x) for x in args]


# ---------------------------------------------------------------------------------------------- launch
def cuda_kernel(config: Bf16GemmConfig, index: int):
    """``config``'s kernel compiled (cached on disk) and loaded on GPU ``index``, once per process."""
    return launching.cuda_function(*render_source(config), index)


def _expect_dim(t: torch.Tensor, name: str, rank: int, form: Bf16Form) -> None:
    if t.dim() != rank:
        raise ValueError(f"{form.name}: {name} must be {rank}-D, got shape {tuple(t.shape)}")


def _problem(config: Bf16GemmConfig, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
             grouped_layout: torch.Tensor | None, masked_m: torch.Tensor | None) -> tuple[int, int, int, int]:
    """``(m, n, k, num_batches)`` of the form's shapes (the module table), checked against each other."""
    form = config.form
    ranks = {Bf16Form.DENSE: (2, 2, 2), Bf16Form.M_GROUPED_CONTIGUOUS: (2, 3, 2), Bf16Form.M_GROUPED_MASKED: (3, 3, 3),
             Bf16Form.BATCHED: (3, 3, 3), Bf16Form.BATCHED_REDUCE: (3, 3, 2)}[form]
    for t, name, rank in zip((a, b, d), "abd", ranks):
        _expect_dim(t, name, rank, form)
    m, k = a.shape[-2:]
    n, k_b = b.shape[-2:]
    batches = b.shape[0] if b.dim() == 3 else 1
    a_batches = a.shape[0] if a.dim() == 3 else batches
    d_rows = d.shape[-2:]
    d_batches = d.shape[0] if d.dim() == 3 else batches
    if k_b != k or tuple(d_rows) != (m, n) or a_batches != batches or d_batches != batches:
        raise ValueError(f"{form.name}: shapes disagree: a {tuple(a.shape)}, b {tuple(b.shape)}, d {tuple(d.shape)}")
    if form is Bf16Form.M_GROUPED_CONTIGUOUS:
        if grouped_layout is None or grouped_layout.dtype != torch.int32 or tuple(grouped_layout.shape) != (m,):
            got = None if grouped_layout is None else (grouped_layout.dtype, tuple(grouped_layout.shape))
            raise ValueError(f"M_GROUPED_CONTIGUOUS: grouped_layout must be int32 [{m}], got {got}")
    if form is Bf16Form.M_GROUPED_MASKED:
        if masked_m is None or masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (batches,):
            raise ValueError(f"M_GROUPED_MASKED: masked_m must be int32 [{batches}], got "
                             f"{None if masked_m is None else (masked_m.dtype, tuple(masked_m.shape))}")
    return m, n, k, batches


def launch(config: Bf16GemmConfig, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
           *, grouped_layout: torch.Tensor | None = None, masked_m: torch.Tensor | None = None,
           backend: Backend) -> None:
    """``d = c + A·Bᵀ`` (or ``A·Bᵀ``) by ``config``'s kernel, per the module table's form; the one place a BF16
    GEMM launch branches on the backend (``Backend.CUDA``: torch's current stream, PDL per ``set_pdl``; ``Backend.SIM``:
    the simulator build of the same source, CPU tensors whose addresses the kernel reads, with the register count
    of its sm_90a build). ``c``: D's dtype and shape with ``stride(-1) == 1`` (may be ``d``), required exactly when
    ``config.accumulate``. Empty problems launch nothing; ``k == 0`` writes ``c`` (or zeros) to ``d``.

    Raises:
        ValueError: a tensor does not match the config (major, dtype, rank, shape) or breaks a TMA rule; the message
            names the argument.
    """
    m, n, k, batches = _problem(config, a, b, d, grouped_layout, masked_m)
    if d.dtype != OUT_DTYPES[config.out_dtype]:
        raise ValueError(f"d must be {OUT_DTYPES[config.out_dtype]} for this config, got {d.dtype}")
    for t, name in ((a, "a"), (b, "b")):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name} must be torch.bfloat16, got {t.dtype}")
    if (c is not None) != config.accumulate:
        raise ValueError(f"c must be given exactly when config.accumulate ({config.accumulate=}, c given: "
                         f"{c is not None})")
    for t, name in ((d, "d"), (c, "c")):
        if t is not None and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be row-major (stride(-1) == 1), got strides {tuple(t.stride())}")
    if c is not None and (c.dtype != d.dtype or c.shape != d.shape):
        raise ValueError(f"c must have d's dtype and shape {d.dtype} {tuple(d.shape)}, got {c.dtype} {tuple(c.shape)}")
    if m == 0 or n == 0 or (config.form is Bf16Form.BATCHED and batches == 0):
        return
    if k == 0 or (config.form is Bf16Form.BATCHED_REDUCE and batches == 0):
        if c is None:
            d.zero_()
        elif c.data_ptr() != d.data_ptr():
            d.copy_(c)
        return
    maps = encode_maps(operand_maps(config, a, b), backend)
    layout = grouped_layout if config.form is Bf16Form.M_GROUPED_CONTIGUOUS else masked_m
    params = param_structs.pack(
        Bf16GemmParams, tma_a=maps[0], tma_b=maps[1], d=d.data_ptr(), c=0 if c is None else c.data_ptr(),
        grouped_layout=0 if layout is None else layout.data_ptr(), **scalar_fields(d, c, m, n, k, batches))
    grid = grid_size(config, m, n, batches, launching.num_ctas(backend))
    launching.launch_rendered(functools.partial(render_source, config), params, grid=grid, block=config.num_threads,
                              smem_bytes=config.smem_bytes(), backend=backend, device=d.device,
                              what="a BF16 GEMM kernel")


# ---------------------------------------------------------------------------------------------- audit
def audit_configs() -> list[Bf16GemmConfig]:
    """The variants the audit compiles: the dense form in all four majors with bf16 D and with fp32 D += C, at the
    two-warpgroup 128x128 and one-warpgroup 64x64 tiles; contiguous (K- and MN-major B) and masked (128x128, bf16);
    batched with MN-major
    B (einsum bhd,hdr->bhr) and K-major B (bhr,hdr->bhd); the reduce form (fp32 D += C)."""
    configs = []
    for major_a in MAJORS:
        for major_b in MAJORS:
            for out, acc in (("bf16", False), ("fp32", True)):
                configs.append(Bf16GemmConfig(Bf16Form.DENSE, 128, 128, 6, 2, major_a, major_b, out, acc))
            configs.append(Bf16GemmConfig(Bf16Form.DENSE, 64, 64, 8, 1, major_a, major_b, "bf16", False))
    for form in (Bf16Form.M_GROUPED_CONTIGUOUS, Bf16Form.M_GROUPED_MASKED):
        configs.append(Bf16GemmConfig(form, 128, 128, 6, 2))
    configs.append(Bf16GemmConfig(Bf16Form.M_GROUPED_CONTIGUOUS, 128, 128, 6, 2, "k", "mn"))  # the nn name
    for major_b in MAJORS:
        configs.append(Bf16GemmConfig(Bf16Form.BATCHED, 64, 128, 8, 1, "k", major_b, "bf16", False))
    configs.append(Bf16GemmConfig(Bf16Form.BATCHED_REDUCE, 128, 128, 6, 2, "k", "k", "fp32", True))
    return configs


def audit_targets() -> list:
    """One :class:`deep_fp8_gemm.runtime.audit.AuditTarget` (kind ``"bf16"``) per variant of :func:`audit_configs`."""
    from ..runtime.audit import AuditTarget

    targets = []
    for config in audit_configs():
        name, source = render_source(config)
        targets.append(AuditTarget("bf16", config.as_dict(), name, source, required_sass=REQUIRED_SASS))
    return targets
