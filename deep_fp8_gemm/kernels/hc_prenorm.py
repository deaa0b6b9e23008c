"""Host side of the tf32_hc_prenorm_gemm kernel (issue 41; ``include/deep_fp8_gemm/kernels/hc_prenorm.cuh``,
``jit/hc_prenorm.cu``): config -> source -> tensor maps + parameters -> launch, for ``Backend.CUDA`` and ``Backend.SIM``.

:func:`launch` takes tensors the op layer (``ops.hc_prenorm``) has validated: ``a`` ``[m, k]`` bfloat16 and ``b``
``[n, k]`` float32, K-major with 16-byte aligned addresses and row strides; ``d`` ``[num_splits, m, n]`` (or ``[m, n]``)
and ``sqr_sum`` ``[num_splits, m]`` (or ``[m]``) float32, contiguous. One CTA per (64-row block, split); BLOCK_N =
align(n, 16) (16 or 32), BLOCK_K 64; stages as many as fit (at most 8).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools

import torch

from ..runtime import params as param_structs
from ..runtime.target import Backend
from ..runtime.tensor_map import TmaDtype, TmaSwizzle
from . import bf16_gemm, launching
from .wgmma_gen import wgmma_tf32_wrapper

TEMPLATE = "hc_prenorm.cu"
KERNEL_PREFIX = "dfg_tf32_hc_prenorm"
TENSOR_MAP_BYTES = 128
BLOCK_M = 64
BLOCK_K = 64
HALF_K = 32  # fp32 elements of one 128-byte swizzled row (B's TMA box width)
SMEM_LIMIT = 232_448
MAX_STAGES = 8
NUM_THREADS = 256
#: SASS every hc-prenorm kernel must contain: TF32 wgmma (HGMMA), TMA loads, the register split, griddepcontrol.wait.
REQUIRED_SASS = ("HGMMA", "UTMALDG", "USETMAXREG", "ACQBULK")
#: Planted bugs (``HcPrenormConfig.planted``; ``dfg::hc_prenorm::Planted``), for the simulator tests only.
PLANTED = {"none": 0, "split_range": 1, "no_swizzle": 2, "rows_past_m": 3, "no_proxy_fence": 4}


@dataclasses.dataclass(frozen=True)
class HcPrenormConfig:
    """Everything that changes the binary (m, k and the split count are run-time parameters): ``block_n`` 16 or 32,
    ``stages``, ``planted`` (tests only)."""

    block_n: int
    stages: int
    planted: str = "none"

    def __post_init__(self) -> None:
        problems = []
        if self.block_n not in (16, 32):
            problems.append(f"block_n must be 16 or 32 ({self.block_n=})")
        if not 2 <= self.stages <= 16:
            problems.append(f"stages in [2, 16] ({self.stages=})")
        if self.planted not in PLANTED:
            problems.append(f"planted must be in {tuple(PLANTED)}")
        if not problems and self.smem_bytes() > SMEM_LIMIT:
            problems.append(f"shared memory {self.smem_bytes()} > {SMEM_LIMIT}")
        if problems:
            raise ValueError(f"invalid HcPrenormConfig ({'; '.join(problems)}): {self}")

    def smem_bytes(self) -> int:
        """``HcPrenormKernel``'s map (the kernel static_asserts the same): A and B stages, the double-buffered
        converted fp32 A tile (2 x 2 boxes of 64 x 128 bytes), two mbarriers per stage."""
        per_stage = BLOCK_M * 128 + 2 * self.block_n * 128 + 16
        return self.stages * per_stage + 2 * 2 * BLOCK_M * 128

    def constants(self, kernel_name: str) -> dict[str, object]:
        return {"BLOCK_N": self.block_n, "STAGES": self.stages, "PLANTED": PLANTED[self.planted],
                "SMEM_BYTES": self.smem_bytes(), "KERNEL_NAME": kernel_name}

    def as_dict(self) -> dict:
        """JSON-safe record for the audit (its K-loop analysis reads ``block_m`` / ``block_n`` /
        ``num_math_warpgroups``; its register check the two counts)."""
        return {"block_m": BLOCK_M, "block_n": self.block_n, "stages": self.stages, "smem_bytes": self.smem_bytes(),
                "num_threads": NUM_THREADS, "num_math_warpgroups": 1, "math_registers": 240,
                "producer_registers": 40}


def pick_config(n: int) -> HcPrenormConfig:
    """BLOCK_N = align(n, 16) and as many stages (at most 8) as 227 KiB holds (the problem is bound by A's bytes: a
    deep ring keeps HBM busy while the math warpgroup converts)."""
    block_n = 16 if n <= 16 else 32
    per_stage = BLOCK_M * 128 + 2 * block_n * 128 + 16
    stages = min(MAX_STAGES, (SMEM_LIMIT - 2 * 2 * BLOCK_M * 128) // per_stage)
    return HcPrenormConfig(block_n, stages)


@functools.lru_cache(maxsize=None)
def render_source(config: HcPrenormConfig, simulator: bool = False) -> tuple[str, str]:
    """``(kernel_name, source)``; the sm_90a and simulator builds (no PTX wrapper) share the name."""
    from ..runtime.render import kernel_name, render

    anonymous = render(TEMPLATE, config.constants(KERNEL_PREFIX))
    name = kernel_name(KERNEL_PREFIX, anonymous)
    extra = "" if simulator else wgmma_tf32_wrapper(config.block_n)
    return name, render(TEMPLATE, config.constants(name), extra_code=extra)


_MapBytes = ctypes.c_ubyte * TENSOR_MAP_BYTES


class HcPrenormParams(ctypes.Structure):
    """Byte image of ``dfg::hc_prenorm::HcPrenormParams`` (320 bytes; the header ``static_assert``s every offset)."""

    _fields_ = [("tma_a", _MapBytes), ("tma_b", _MapBytes), ("d", ctypes.c_uint64), ("sqr_sum", ctypes.c_uint64),
                ("m", ctypes.c_uint32), ("n", ctypes.c_uint32), ("k", ctypes.c_uint32), ("num_splits", ctypes.c_uint32),
                ("reserved", ctypes.c_ubyte * 32)]


assert ctypes.sizeof(HcPrenormParams) == 320 and HcPrenormParams.num_splits.offset == 284


def _b_map_args(b: torch.Tensor, block_n: int) -> tuple:
    """fp32 ``b`` ``[n, k]`` K-major: dims (k, n, 1), box (32, BLOCK_N, 1), 128-byte swizzle (rows past n zero-filled)."""
    n, k = b.shape
    row = b.stride(0) * 4
    if b.data_ptr() % 16 or (n > 1 and row % 16) or b.stride(1) != 1:
        raise ValueError(f"b: TMA needs a 16-byte aligned address and row stride and a unit K stride, got address "
                         f"{b.data_ptr():#x}, strides {tuple(b.stride())}")
    row = row if n > 1 else max(16, -(-k * 4 // 16) * 16)
    return (TmaDtype.FLOAT32, b.data_ptr(), (k, n, 1), (row, max(16, row * n)), (HALF_K, block_n, 1),
            TmaSwizzle.B128)


def map_args(config: HcPrenormConfig, a: torch.Tensor, b: torch.Tensor) -> tuple:
    """The two maps' encode arguments: ``a`` bf16 ``[m, k]`` (the BF16 kernel's K-major A map, BLOCK_M rows) and
    ``b`` (:func:`_b_map_args`); :func:`launch` and the op's per-call plan (``ops.hc_prenorm_plans``) encode these."""
    return bf16_gemm.operand_map_args(a, "a", "k", BLOCK_M), _b_map_args(b, config.block_n)


def cuda_kernel(config: HcPrenormConfig, index: int):
    """``config``'s kernel compiled (cached on disk) and loaded on GPU ``index``, once per process."""
    return launching.cuda_function(*render_source(config), index)


def launch(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor, num_splits: int | None, *,
           backend: Backend, config: HcPrenormConfig | None = None) -> None:
    """``d`` / ``sqr_sum`` per split (module docstring) by the kernel on ``backend`` (``Backend.CUDA``: torch's current
    stream, PDL per ``set_pdl``; ``Backend.SIM``: the simulator build of the same source on CPU tensors).
    ``config``: :func:`pick_config` of n unless given (tests plant bugs through it)."""
    m, k = a.shape
    n = b.shape[0]
    splits = 1 if num_splits is None else num_splits
    if a.dtype != torch.bfloat16 or b.dtype != torch.float32 or d.dtype != torch.float32 or \
            sqr_sum.dtype != torch.float32:
        raise ValueError(f"dtypes must be a bf16, b / d / sqr_sum fp32, got {a.dtype}, {b.dtype}, {d.dtype}, "
                         f"{sqr_sum.dtype}")
    if k % BLOCK_K or not d.is_contiguous() or not sqr_sum.is_contiguous() or d.numel() != splits * m * n \
            or sqr_sum.numel() != splits * m:
        raise ValueError(f"k % 64 == 0 and contiguous d [{splits}, {m}, {n}], sqr_sum [{splits}, {m}] required, got "
                         f"k={k}, d {tuple(d.shape)} {tuple(d.stride())}, sqr_sum {tuple(sqr_sum.shape)}")
    if m == 0:
        return
    config = pick_config(n) if config is None else config
    if n > config.block_n:
        raise ValueError(f"n={n} exceeds the config's block_n={config.block_n}")
    maps = bf16_gemm.encode_maps(map_args(config, a, b), backend)
    params = param_structs.pack(HcPrenormParams, tma_a=maps[0], tma_b=maps[1], d=d.data_ptr(),
                                sqr_sum=sqr_sum.data_ptr(), m=m, n=n, k=k, num_splits=splits)
    grid = -(-m // BLOCK_M) * splits
    launching.launch_rendered(functools.partial(render_source, config), params, grid=grid, block=NUM_THREADS,
                              smem_bytes=config.smem_bytes(), backend=backend, device=d.device,
                              what="the hc-prenorm kernel")


def audit_configs() -> list[HcPrenormConfig]:
    """The two tiles the SM90 limits allow (n <= 16: BLOCK_N 16; n <= 32: 32, V4's n = 24), at their picked stages."""
    return [pick_config(16), pick_config(24)]


def audit_targets() -> list:
    """One :class:`deep_fp8_gemm.runtime.audit.AuditTarget` (kind ``"tf32"``) per variant of :func:`audit_configs`."""
    from ..runtime.audit import AuditTarget

    targets = []
    for config in audit_configs():
        name, source = render_source(config)
        targets.append(AuditTarget("tf32", config.as_dict(), name, source, required_sass=REQUIRED_SASS))
    return targets
