"""Host side of the MQA-logits kernels, the DeepSeek-V3.2 / V4 indexer (``include/deep_fp8_gemm/kernels/mqa_logits.cuh``,
``jit/mqa_logits.cu``): config -> source -> tensor maps + parameters -> launch, for ``Backend.CUDA`` and
``Backend.SIM``.

Two forms of one kernel template (:class:`Form`): the dense one (``fp8_mqa_logits``: per-query KV windows over a
contiguous KV, optionally ``max_seqlen_k``-compressed and with the -inf written) and the paged one
(``fp8_paged_mqa_logits``: a paged KV cache through a block table, on the schedule of
``get_paged_mqa_logits_metadata``). What is compiled in: the form, heads, head_dim, queries per Q tile (dense 128 /
heads, paged next_n), the logits dtype, clean / compressed, the stage counts; everything else (lengths, windows,
context lengths, pointers) is a run-time field of :class:`MqaLogitsParams`, so a handful of binaries serve every call.

Inputs arrive validated by the op layer (:mod:`deep_fp8_gemm.attention`): dtypes, shapes, the reference's SM90
limits, 16-byte aligned addresses and strides where a tensor map reads them.
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
from .wgmma_gen import wgmma_fp8_wrapper

TEMPLATE = "mqa_logits.cu"
KERNEL_PREFIX = "dfg_mqa_logits"
TENSOR_MAP_BYTES = 128
#: ``dfg::mqa``: four math warpgroups of 64 KV rows each (a 256-row KV stage) and a producer warpgroup.
NUM_MATH_WARPGROUPS = 4
NUM_THREADS = 128 * (NUM_MATH_WARPGROUPS + 1)
TILE_ROWS = 64 * NUM_MATH_WARPGROUPS
BLOCK_KV = 64  # tokens per paged cache block (the SM90 kernels' only block size)
#: The setmaxnreg split (``MqaLogitsKernel::kProducerRegisters`` / ``kMathRegisters``; the audit checks it fits the
#: launch allocation).
PRODUCER_REGISTERS = 32
MATH_REGISTERS = 112
DENSE_Q_TOKENS = 128  # dense: queries x heads of one Q tile (the wgmma N)
Q_STAGES = {"dense": 2, "paged": 3}
KV_STAGES = 4
SMEM_LIMIT = 232_448
#: SASS every MQA-logits kernel must contain: FP8 wgmma, TMA loads, the register split, griddepcontrol.wait (PDL), the
#: quad exchange of the head reduction.
REQUIRED_SASS = ("QGMMA", "UTMALDG", "USETMAXREG", "ACQBULK", "SHFL")
#: The dense clean variant also writes -inf in 16-byte stores.
CLEAN_REQUIRED_SASS = REQUIRED_SASS + ("STG.E.128",)
HEADS = (32, 64)
HEAD_DIMS = (32, 64, 128)
LOGITS_DTYPES = (torch.float32, torch.bfloat16)


class Form(enum.IntEnum):
    """Same values as ``dfg::mqa::Form``."""

    DENSE = 0
    PAGED = 1


@dataclasses.dataclass(frozen=True)
class MqaLogitsConfig:
    """Everything that changes the binary of an MQA-logits kernel.

    ``queries``: queries per Q tile, dense ``128 // num_heads``, paged ``next_n`` (1 or 2); the wgmma N is
    ``queries * num_heads``. ``clean`` (dense): the kernel also writes -inf outside each query's window;
    ``compressed`` (dense): logits column ``j - ks`` (``max_seqlen_k``).
    """

    form: Form
    num_heads: int
    head_dim: int
    queries: int
    bf16_logits: bool = False
    clean: bool = False
    compressed: bool = False

    def __post_init__(self) -> None:
        if self.num_heads not in HEADS or self.head_dim not in HEAD_DIMS:
            raise ValueError(f"num_heads must be in {HEADS} and head_dim in {HEAD_DIMS}, got {self.num_heads=} "
                             f"{self.head_dim=}")
        if self.form is Form.DENSE:
            if self.queries * self.num_heads != DENSE_Q_TOKENS or (self.clean and self.compressed):
                raise ValueError(f"dense: queries = 128 / num_heads and not both clean and compressed, got {self}")
        elif self.queries not in (1, 2) or self.clean or self.compressed:
            raise ValueError(f"paged: queries = next_n in (1, 2), neither clean nor compressed, got {self}")

    @property
    def n(self) -> int:
        """The wgmma N: Q-tile rows."""
        return self.queries * self.num_heads

    @property
    def q_stages(self) -> int:
        return Q_STAGES["paged" if self.form is Form.PAGED else "dense"]

    @property
    def kv_stages(self) -> int:
        return KV_STAGES

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: ``MqaLogitsKernel``'s map (the kernel static_asserts the same value)."""
        q = self.n * self.head_dim
        kv = TILE_ROWS * self.head_dim
        weights = -(-self.n * 4 // 128) * 128
        scales = TILE_ROWS * 4
        barriers = 8 * 2 * (self.q_stages + self.kv_stages)
        return self.q_stages * (q + weights) + self.kv_stages * (kv + scales) + barriers

    def constants(self, kernel_name: str) -> dict[str, object]:
        return {
            "FORM": int(self.form), "NUM_HEADS": self.num_heads, "HEAD_DIM": self.head_dim, "QUERIES": self.queries,
            "BF16_LOGITS": self.bf16_logits, "CLEAN": self.clean, "COMPRESSED": self.compressed,
            "Q_STAGES": self.q_stages, "KV_STAGES": self.kv_stages, "SMEM_BYTES": self.smem_bytes,
            "KERNEL_NAME": kernel_name,
        }

    def as_dict(self) -> dict:
        """JSON-safe record for the audit (``math_registers`` / ``producer_registers`` / ``num_math_warpgroups``: the
        audit's register-split check)."""
        return {"form": self.form.name.lower(), "num_heads": self.num_heads, "head_dim": self.head_dim,
                "queries": self.queries, "logits": "bf16" if self.bf16_logits else "fp32", "clean": self.clean,
                "compressed": self.compressed, "q_stages": self.q_stages, "kv_stages": self.kv_stages,
                "smem_bytes": self.smem_bytes, "num_threads": NUM_THREADS, "num_math_warpgroups": NUM_MATH_WARPGROUPS,
                "math_registers": MATH_REGISTERS, "producer_registers": PRODUCER_REGISTERS}


def dense_config(num_heads: int, head_dim: int, logits_dtype: torch.dtype, clean: bool, compressed: bool
                 ) -> MqaLogitsConfig:
    return MqaLogitsConfig(Form.DENSE, num_heads, head_dim, DENSE_Q_TOKENS // num_heads,
                           logits_dtype == torch.bfloat16, clean, compressed)


def paged_config(num_heads: int, head_dim: int, next_n: int, logits_dtype: torch.dtype) -> MqaLogitsConfig:
    return MqaLogitsConfig(Form.PAGED, num_heads, head_dim, next_n, logits_dtype == torch.bfloat16)


# ---------------------------------------------------------------------------------------------- source
@functools.lru_cache(maxsize=None)
def render_source(config: MqaLogitsConfig, simulator: bool = False) -> tuple[str, str]:
    """``(kernel_name, source)`` of ``config``. The name hashes the constants rendered with a placeholder name and
    no wgmma wrapper, so the sm_90a and simulator builds (which gets no PTX wrapper) share it."""
    from ..runtime.render import kernel_name, render

    anonymous = render(TEMPLATE, config.constants(KERNEL_PREFIX))
    name = kernel_name(f"{KERNEL_PREFIX}_{config.form.name.lower()}", anonymous)
    extra = "" if simulator else wgmma_fp8_wrapper(config.n)
    return name, render(TEMPLATE, config.constants(name), extra_code=extra)


# ---------------------------------------------------------------------------------------------- parameters
_MapBytes = ctypes.c_ubyte * TENSOR_MAP_BYTES


class MqaLogitsParams(ctypes.Structure):
    """Byte image of ``dfg::mqa::MqaLogitsParams`` (640 bytes; the header ``static_assert``s every offset)."""

    _fields_ = [
        ("tma_q", _MapBytes), ("tma_weights", _MapBytes), ("tma_kv", _MapBytes), ("tma_kv_scales", _MapBytes),
        ("logits", ctypes.c_uint64), ("logits_stride", ctypes.c_uint64), ("ks", ctypes.c_uint64),
        ("ke", ctypes.c_uint64), ("context_lens", ctypes.c_uint64), ("block_table", ctypes.c_uint64),
        ("schedule", ctypes.c_uint64), ("num_rows", ctypes.c_uint32), ("seq_len_kv", ctypes.c_uint32),
        ("logits_width", ctypes.c_uint32), ("block_table_stride", ctypes.c_uint32),
        ("reserved", ctypes.c_ubyte * 56),
    ]


assert ctypes.sizeof(MqaLogitsParams) == 640 and MqaLogitsParams.block_table_stride.offset == 580
PARAMS_BYTES = ctypes.sizeof(MqaLogitsParams)

MapArgs = tuple  # (dtype, address, dims, strides, box, swizzle): a TensorMapSpec's fields


def _swizzle(head_dim: int) -> TmaSwizzle:
    return {32: TmaSwizzle.B32, 64: TmaSwizzle.B64, 128: TmaSwizzle.B128}[head_dim]


def _stride16(nbytes: int) -> int:
    """A valid TMA stride for a unit dimension (never stepped over): ``nbytes`` rounded up to 16, at least 16."""
    return max(16, -(-nbytes // 16) * 16)


def dense_map_args(cfg: MqaLogitsConfig, q: torch.Tensor, kv: torch.Tensor, kv_scales: torch.Tensor,
                   weights: torch.Tensor) -> tuple[MapArgs, MapArgs, MapArgs, MapArgs]:
    """The dense kernel's four rank-3 maps: q ``[seq_len, H, D]`` contiguous as ``seq_len * H`` rows of D bytes (box
    128 rows), weights ``[seq_len, H]`` fp32 with a 16-byte row stride (box ``128 / H`` rows), kv ``[seq_len_kv, D]``
    contiguous (box 256 rows), kv scales ``[seq_len_kv]`` fp32 (box 256)."""
    seq_len, h, d = q.shape
    seq_len_kv = kv.shape[0]
    swizzle = _swizzle(d)
    return (
        (TmaDtype.UINT8, q.data_ptr(), (d, seq_len * h, 1), (d, _stride16(seq_len * h * d)), (d, cfg.n, 1), swizzle),
        (TmaDtype.FLOAT32, weights.data_ptr(), (h, seq_len, 1),
         (weights.stride(0) * 4, _stride16(seq_len * weights.stride(0) * 4)),
         (h, cfg.queries, 1), TmaSwizzle.NONE),
        (TmaDtype.UINT8, kv.data_ptr(), (d, seq_len_kv, 1), (d, _stride16(seq_len_kv * d)), (d, TILE_ROWS, 1), swizzle),
        (TmaDtype.FLOAT32, kv_scales.data_ptr(), (seq_len_kv, 1, 1), (_stride16(seq_len_kv * 4), _stride16(seq_len_kv * 4)),
         (TILE_ROWS, 1, 1), TmaSwizzle.NONE),
    )


def paged_map_args(cfg: MqaLogitsConfig, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor
                   ) -> tuple[MapArgs, MapArgs, MapArgs, MapArgs]:
    """The paged kernel's maps: q ``[B, next_n, H, D]`` contiguous as rows of D bytes (box next_n x H rows), weights
    ``[B * next_n, H]`` contiguous (box next_n rows), and the cache ``[num_blocks, 64, 1, D + 4]`` uint8 with a
    16-byte multiple block stride: each block's 64 x D e4m3 values (box one block) and, 64 x D bytes in, its 64 fp32
    scales (box 64)."""
    b, next_n, h, d = q.shape
    num_blocks = kv_cache.shape[0]
    block_stride = kv_cache.stride(0)
    rows = b * next_n * h
    return (
        (TmaDtype.UINT8, q.data_ptr(), (d, rows, 1), (d, _stride16(rows * d)), (d, cfg.n, 1), _swizzle(d)),
        (TmaDtype.FLOAT32, weights.data_ptr(), (h, b * next_n, 1), (h * 4, _stride16(b * next_n * h * 4)),
         (h, next_n, 1), TmaSwizzle.NONE),
        (TmaDtype.UINT8, kv_cache.data_ptr(), (d, BLOCK_KV, num_blocks), (d, block_stride), (d, BLOCK_KV, 1),
         _swizzle(d)),
        (TmaDtype.FLOAT32, kv_cache.data_ptr() + BLOCK_KV * d, (BLOCK_KV, num_blocks, 1),
         (block_stride, _stride16(num_blocks * block_stride)), (BLOCK_KV, 1, 1), TmaSwizzle.NONE),
    )


def encode_maps(args, backend: Backend) -> list[bytes]:
    """The 128-byte images of ``args``: encoded by the driver (cached) or packed for the simulator."""
    if backend is Backend.SIM:
        from ..simulator import pack_tensor_map

        return [pack_tensor_map(TensorMapSpec(*x)) for x in args]
    from ..runtime import driver

    return [driver.tensor_map_cache.lookup(x, x) for x in args]


def pack_params(maps, **fields: int) -> bytes:
    """Raw bytes of ``dfg::mqa::MqaLogitsParams``: the four maps (q, weights, kv, kv_scales), then named fields."""
    return param_structs.pack(MqaLogitsParams, tma_q=maps[0], tma_weights=maps[1], tma_kv=maps[2],
                              tma_kv_scales=maps[3], **fields)


# ---------------------------------------------------------------------------------------------- launch
def cuda_kernel(config: MqaLogitsConfig, index: int):
    """``config``'s kernel compiled (cached on disk) and loaded on GPU ``index``, once per process."""
    return launching.cuda_function(*render_source(config), index)


def launch(config: MqaLogitsConfig, maps, grid: int, backend: Backend, device: torch.device, **fields: int) -> None:
    """Pack the parameters and launch ``config``'s kernel on ``grid`` CTAs: the one place an MQA-logits launch branches
    on the backend (``Backend.CUDA``: torch's current stream, PDL per ``set_pdl``; ``Backend.SIM``: the simulator
    build of the same source with the register count of its sm_90a build)."""
    launching.launch_rendered(functools.partial(render_source, config), pack_params(maps, **fields), grid=grid,
                              block=NUM_THREADS, smem_bytes=config.smem_bytes, backend=backend, device=device,
                              what="an MQA-logits kernel")


def launch_dense(config: MqaLogitsConfig, q: torch.Tensor, kv: torch.Tensor, kv_scales: torch.Tensor,
                 weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, logits: torch.Tensor, width: int,
                 backend: Backend) -> None:
    """The dense kernel on validated tensors (``q`` ``[seq_len, H, D]``, ``kv`` / ``kv_scales``, ``weights``, int32
    ``ks`` / ``ke``) into ``logits`` (row stride ``logits.stride(0)``, ``width`` columns), on at most the backend's SM
    count of persistent CTAs. Empty problems launch nothing."""
    seq_len, seq_len_kv = q.shape[0], kv.shape[0]
    if seq_len == 0 or seq_len_kv == 0:
        return
    grid = min(launching.num_ctas(backend), -(-seq_len // config.queries))
    maps = encode_maps(dense_map_args(config, q, kv, kv_scales, weights), backend)
    launch(config, maps, grid, backend, q.device, logits=logits.data_ptr(), logits_stride=logits.stride(0),
           ks=ks.data_ptr(), ke=ke.data_ptr(), num_rows=seq_len, seq_len_kv=seq_len_kv, logits_width=width)


def launch_paged(config: MqaLogitsConfig, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor,
                 logits: torch.Tensor, width: int, backend: Backend) -> None:
    """The paged kernel on validated tensors, one CTA per schedule row but the last (``schedule_meta`` ``[num_ctas +
    1, 2]``)."""
    if q.shape[0] == 0:
        return
    maps = encode_maps(paged_map_args(config, q, kv_cache, weights), backend)
    launch(config, maps, schedule_meta.shape[0] - 1, backend, q.device, logits=logits.data_ptr(),
           logits_stride=logits.stride(0), context_lens=context_lens.data_ptr(), block_table=block_table.data_ptr(),
           schedule=schedule_meta.data_ptr(), num_rows=q.shape[0], logits_width=width,
           block_table_stride=block_table.stride(0))


# ---------------------------------------------------------------------------------------------- audit
def audit_configs() -> list[MqaLogitsConfig]:
    """The variants the audit compiles: DeepSeek-V3.2's indexer (H 64, D 128) and H 32 in every mode and logits dtype,
    and head_dim 32 / 64 once per form."""
    configs = []
    for heads in HEADS:
        for dtype in LOGITS_DTYPES:
            for clean, compressed in ((True, False), (False, False), (False, True)):
                configs.append(dense_config(heads, 128, dtype, clean, compressed))
            for next_n in (1, 2):
                configs.append(paged_config(heads, 128, next_n, dtype))
    for head_dim in (32, 64):
        configs.append(dense_config(64, head_dim, torch.float32, True, False))
        configs.append(paged_config(64, head_dim, 1, torch.float32))
    return configs


def audit_targets() -> list:
    """One :class:`deep_fp8_gemm.runtime.audit.AuditTarget` (kind ``"attention"``) per variant of
    :func:`audit_configs`."""
    from ..runtime.audit import AuditTarget

    targets = []
    for config in audit_configs():
        name, source = render_source(config)
        targets.append(AuditTarget("attention", config.as_dict(), name, source,
                                   required_sass=CLEAN_REQUIRED_SASS if config.clean else REQUIRED_SASS))
    return targets
