"""Host side of the fused quantisation kernels (``include/deep_fp8_gemm/kernels/quant.cuh``, ``jit/quant.cu``).

Memory-bound kernels, each rendered per (kind, input dtype, vectorised) and compiled once by the JIT:

* :func:`per_token_cast_to_fp8_cuda` — ``[m, k]`` (or ``[G, m, k]``) -> e4m3 + 1x128 scales written straight
  into the TMA-aligned M-major layout the GEMMs read (no transpose kernel afterwards);
* :func:`per_block_cast_to_fp8_cuda` — ``[n, k]`` (or ``[G, n, k]``) -> e4m3 + 128x128 block scales;
* :func:`silu_mul_quant_cuda` — the MoE middle: ``[m, 2I]`` (gate | up) -> ``SiLU(gate) * up`` quantised per
  token to ``[m, I]`` e4m3 + M-major scales, in one pass;
* :func:`per_token_cast_to_fp8_and_transpose_cuda` — ``[m, k]`` -> the 1x128 e4m3 of ``x`` and of ``xᵀ`` with their
  scales from one read of ``x`` (a shared-memory tiled transpose);
* :func:`transpose_cast_to_fp8_k_grouped_cuda` — ``[sum(ks), n]`` -> the k-grouped weight-gradient operand: the
  1x128 e4m3 of each row group transposed, blocks back to back, scales ``[n, sum(ks)/128]``.

Numerics are those of :mod:`deep_fp8_gemm.quant` bit for bit (fp32: ``scale = max(amax, 1e-4) / 448``,
``x / scale`` saturated to ±448 and rounded to nearest even; with ``use_ue8m0=True`` the scale is first rounded
up to a power of two on its bit pattern, ``deep_fp8_gemm.quant.ceil_to_ue8m0``). ``quant.py`` dispatches CUDA sm_90 tensors here.

These functions need a CUDA sm_90 device; they validate their arguments but not the device (the public
quantisers in :mod:`deep_fp8_gemm.quant` do). Everything JIT-related is imported lazily, so importing this
module never needs the CUDA bindings. Kernels are launched on ``torch.cuda.current_stream()`` without any
host synchronisation, so the calls are CUDA-graph capturable once their kernel is compiled and loaded
(call once before capturing).
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools

import torch

from ..constants import GRAN_K
from ..runtime import params as param_structs
from ..utils import PROCESS_SETTINGS

GROUP = GRAN_K  # elements per scale group (a row's 128 K-elements, a 128x128 block's edge)
#: Threads per CTA: 8 warps (one 128-element group = 8 threads of 16 elements); see quant.cuh.
NUM_THREADS = 256
_TEMPLATE = "quant.cu"
_KERNEL_PREFIX = "dfg_quant"
#: SASS a compiled quantisation kernel must contain: the e4m3x2 conversion (``cvt.rn.satfinite.e4m3x2.f32``
#: compiles to ``F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C``) and global loads / stores.
REQUIRED_SASS = ("F2FP", "LDG", "STG", "ACQBULK")  # ACQBULK: griddepcontrol.wait (PDL, deep_fp8_gemm.set_pdl)


class QuantKind(enum.IntEnum):
    """Same values as ``dfg::quant::QuantKind``."""

    PER_TOKEN = 0
    PER_BLOCK = 1
    SILU_MUL_PER_TOKEN = 2
    CAST_TRANSPOSE = 3
    K_GROUPED_TRANSPOSE = 4
    PER_TOKEN_32 = 5  # PER_TOKEN with 1x32 groups (DeepSeek-V4.1's recipe, the block32 GEMM's A)


#: Elements per scale group of a per-token kind (``dfg::quant::group_size_of``).
def group_size_of(kind: QuantKind) -> int:
    return 32 if kind == QuantKind.PER_TOKEN_32 else GROUP


#: Kinds of the shared-memory tiled transpose (``TransposeParams``, 256 threads, one CTA per 128 x 128 tile).
TRANSPOSE_KINDS = (QuantKind.CAST_TRANSPOSE, QuantKind.K_GROUPED_TRANSPOSE)
#: ``dfg::quant::transpose_smem_bytes()``: row partials [4][256] + column partials / xᵀ tile [32][128] + 128
#: column scales, 4 bytes each.
TRANSPOSE_SMEM_BYTES = (4 * NUM_THREADS + 32 * GROUP + GROUP) * 4


class Numerics(enum.Enum):
    """Whose arithmetic a per-token / per-block kernel computes (``dfg::quant`` variant bits).

    ``IEEE``: this library's, ``scale = amax / 448`` and ``x / scale`` (IEEE divisions: the same bits on every
    device). ``DEEP_GEMM_CUDA``: the reference design's casts as ATen runs them on CUDA, ``scale = amax *
    fl(1/448)`` and ``x * fl(1 / scale)`` (``kDeepGemmCuda``): what the ``deep_gemm`` drop-in's casts launch.
    """

    IEEE = "ieee"
    DEEP_GEMM_CUDA = "deep_gemm_cuda"


#: ``dfg::quant::kUe8m0Scales`` / ``kDeepGemmCuda``: the variant bits the entry's USE_UE8M0 argument carries.
_VARIANT_UE8M0, _VARIANT_DEEP_GEMM_CUDA = 1, 2


class InputType(enum.IntEnum):
    """Same values as ``dfg::quant::InputType``."""

    BF16 = 0
    FP16 = 1
    FP32 = 2


_INPUT_TYPES = {torch.bfloat16: InputType.BF16, torch.float16: InputType.FP16, torch.float32: InputType.FP32}


@dataclasses.dataclass(frozen=True)
class QuantKernelConfig:
    """Everything that changes the binary of a quantisation kernel.

    ``vectorized``: 16-byte loads/stores; legal when ``k % 16 == 0`` (SiLU: ``I % 16 == 0``) and the input
    rows start 16-byte aligned (see :func:`_vectorizable`). The scalar variant serves every other shape.
    ``ue8m0``: power-of-two (UE8M0) scales, ``2^ceil(log2(amax / 448))``.
    ``numerics``: :class:`Numerics` (per-token and per-block kinds only for ``DEEP_GEMM_CUDA``).
    """

    kind: QuantKind
    input_type: InputType
    vectorized: bool
    num_threads: int = NUM_THREADS
    ue8m0: bool = False
    numerics: Numerics = Numerics.IEEE

    def __post_init__(self) -> None:
        if self.numerics is not Numerics.IEEE and self.kind not in (QuantKind.PER_TOKEN, QuantKind.PER_TOKEN_32,
                                                                    QuantKind.PER_BLOCK):
            raise ValueError(f"numerics={self.numerics.value!r} exists for the per-token and per-block kinds only, "
                             f"got kind={self.kind.name}")

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of a launch (``dfg::quant::quant_smem_bytes``, or ``transpose_smem_bytes``)."""
        if self.kind in TRANSPOSE_KINDS:
            return TRANSPOSE_SMEM_BYTES
        return (self.num_threads + self.num_threads // 8) * 4

    def constants(self, kernel_name: str) -> dict[str, object]:
        # The entry passes USE_UE8M0 as the bodies' variant bits: a bool for this library's arithmetic (the
        # sources of those kernels are unchanged), the bits as an int for the reference design's.
        variant: bool | int = self.ue8m0
        if self.numerics is Numerics.DEEP_GEMM_CUDA:
            variant = _VARIANT_DEEP_GEMM_CUDA | (_VARIANT_UE8M0 if self.ue8m0 else 0)
        return {
            "QUANT_KIND": int(self.kind),
            "INPUT_TYPE": int(self.input_type),
            "VECTORIZED": self.vectorized,
            "NUM_THREADS": self.num_threads,
            "USE_UE8M0": variant,
            "KERNEL_NAME": kernel_name,
        }

    def as_dict(self) -> dict:
        d = {"kind": self.kind.name.lower(), "input": self.input_type.name.lower(),
             "vectorized": self.vectorized, "num_threads": self.num_threads, "smem_bytes": self.smem_bytes,
             "ue8m0": self.ue8m0}
        if self.numerics is not Numerics.IEEE:  # this library's kernels keep their records as they were
            d["numerics"] = self.numerics.value
        return d


class QuantParams(ctypes.Structure):
    """Byte image of ``dfg::quant::QuantParams`` (72 bytes; the C++ side static_asserts the size)."""

    _fields_ = [
        ("input", ctypes.c_uint64),
        ("output", ctypes.c_uint64),
        ("scales", ctypes.c_uint64),
        ("input_row_stride", ctypes.c_uint64),
        ("output_row_stride", ctypes.c_uint64),
        ("up_offset", ctypes.c_uint64),
        ("scale_batch_stride", ctypes.c_uint64),
        ("num_rows", ctypes.c_uint32),
        ("num_cols", ctypes.c_uint32),
        ("rows_per_batch", ctypes.c_uint32),
        ("scale_row_stride", ctypes.c_uint32),
    ]


assert ctypes.sizeof(QuantParams) == 72  # import-time layout check of our own struct, not a user check
QUANT_PARAMS_BYTES = ctypes.sizeof(QuantParams)
#: The fields that change per call (data pointers), in struct order; the rest of a launch plan's fields are constant.
POINTER_FIELDS = ("input", "output", "scales")


def params_packer(names: tuple[str, ...]) -> param_structs.FieldPacker:
    """A packer of the named :class:`QuantParams` fields (struct order), for the per-call fast path."""
    return param_structs.FieldPacker(QuantParams, names)


class TransposeParams(ctypes.Structure):
    """Byte image of ``dfg::quant::TransposeParams`` (80 bytes; the C++ side static_asserts the size)."""

    _fields_ = [
        ("input", ctypes.c_uint64),
        ("output", ctypes.c_uint64),
        ("scales", ctypes.c_uint64),
        ("output_t", ctypes.c_uint64),
        ("scales_t", ctypes.c_uint64),
        ("group_prefix", ctypes.c_uint64),
        ("input_row_stride", ctypes.c_uint64),
        ("num_rows", ctypes.c_uint32),
        ("num_cols", ctypes.c_uint32),
        ("scale_stride", ctypes.c_uint32),
        ("scale_t_stride", ctypes.c_uint32),
        ("num_groups", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


assert ctypes.sizeof(TransposeParams) == 80
TRANSPOSE_PARAMS_BYTES = ctypes.sizeof(TransposeParams)


# ---------------------------------------------------------------------------------------------- JIT
@functools.lru_cache(maxsize=None)
def render_source(config: QuantKernelConfig) -> tuple[str, str]:
    """``(kernel_name, source)`` of ``config``: the name hashes the source rendered with a placeholder name."""
    from ..runtime.render import kernel_name, render

    anonymous = render(_TEMPLATE, config.constants(_KERNEL_PREFIX))
    name = kernel_name(f"{_KERNEL_PREFIX}_{config.kind.name.lower()}", anonymous)
    return name, render(_TEMPLATE, config.constants(name))


def compile_config(config: QuantKernelConfig):
    """The :class:`deep_fp8_gemm.runtime.compiler.CompiledKernel` of ``config`` (cached by the JIT)."""
    from ..runtime.compiler import compile_kernel

    name, source = render_source(config)
    return compile_kernel(name, source)


_loaded: dict[tuple[QuantKernelConfig, int], object] = {}


def cuda_kernel(config: QuantKernelConfig, index: int):
    """``config``'s kernel compiled (cached on disk) and loaded on GPU ``index``, once per process."""
    loaded = _loaded.get((config, index))
    if loaded is None:
        from ..runtime import driver

        compiled = compile_config(config)
        loaded = driver.load_kernel(compiled.cubin, compiled.name, index, key=compiled.key)
        _loaded[(config, index)] = loaded
    return loaded


def launch_cuda(config: QuantKernelConfig, params, grid: int, device: torch.device) -> None:
    """Launch ``config``'s kernel with ``params`` (a :class:`QuantParams` / :class:`TransposeParams`) on ``device``'s
    GPU, on torch's current stream."""
    from ..runtime import driver, target

    index = target.gpu_index(device)
    kernel = cuda_kernel(config, index)
    driver.launch(kernel, params, grid=grid, block=config.num_threads, smem_bytes=config.smem_bytes,
                  stream=target.current_stream(index), pdl=PROCESS_SETTINGS.pdl)


def launch_sim(config: QuantKernelConfig, params, grid: int, device: torch.device) -> None:
    """Launch ``config``'s kernel with ``params`` in the CPU simulator (CPU tensors): the quantisers' backend under
    ``DFG_SIMULATE`` (``runtime.target.backend_of``); a programmatic dependent launch under the PDL flag, as on the GPU
    (it matters inside ``deep_fp8_gemm.simulator.stream()``)."""
    from ..simulator import launch as sim_launch

    name, source = render_source(config)
    sim_launch(name, source, bytes(params), grid=grid, block=config.num_threads, cluster=1,
               smem_bytes=config.smem_bytes, programmatic=PROCESS_SETTINGS.pdl)


def launcher_for(backend) -> object:
    """The launch function of ``backend`` (``runtime.target.Backend.CUDA`` or ``SIM``)."""
    from ..runtime.target import Backend

    if backend is Backend.SIM:
        return launch_sim
    if backend is Backend.CUDA:
        return launch_cuda
    raise ValueError(f"the fused quantisers launch on Backend.CUDA or Backend.SIM, got {backend}")


def audit_targets() -> list:
    """One :class:`deep_fp8_gemm.runtime.audit.AuditTarget` (kind ``"quant"``) per kernel variant."""
    from ..runtime.audit import AuditTarget

    configs = [QuantKernelConfig(kind, input_type, vectorized)
               for kind in QuantKind for input_type in InputType for vectorized in (True, False)]
    # UE8M0 changes only the scale computation: one vectorised bf16 variant per quantiser that offers it.
    configs += [QuantKernelConfig(kind, InputType.BF16, True, ue8m0=True)
                for kind in (QuantKind.PER_TOKEN, QuantKind.PER_TOKEN_32, QuantKind.PER_BLOCK, *TRANSPOSE_KINDS)]
    # The reference design's arithmetic (the deep_gemm drop-in's casts): one vectorised bf16 variant per kind.
    configs += [QuantKernelConfig(kind, InputType.BF16, True, numerics=Numerics.DEEP_GEMM_CUDA)
                for kind in (QuantKind.PER_TOKEN, QuantKind.PER_BLOCK)]
    targets = []
    for config in configs:
        name, source = render_source(config)
        targets.append(AuditTarget("quant", config.as_dict(), name, source, required_sass=REQUIRED_SASS))
    return targets


# ---------------------------------------------------------------------------------------------- checks
def aligned_m(m: int) -> int:
    """``get_tma_aligned_size(m, 4)``: fp32 scale rows padded to 16 bytes."""
    return (m + 3) // 4 * 4


def check_input(x: object, name: str, ranks: tuple[int, ...]) -> torch.Tensor:
    """A bf16 / fp16 / fp32 tensor of one of ``ranks`` (what the fused kernels read, on any backend)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_TYPES:
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {name}.dtype={x.dtype}")
    if x.dim() not in ranks:
        raise ValueError(f"{name} must have rank in {ranks}, got {name}.shape={tuple(x.shape)}")
    return x


def check_tensor(x: object, name: str, ranks: tuple[int, ...]) -> torch.Tensor:
    """:func:`check_input` on a CUDA tensor (the ``*_cuda`` entry points launch on the GPU)."""
    check_input(x, name, ranks)
    from ..runtime import target

    if target.gpu_index(x.device) is None:
        raise ValueError(f"{name} must be a CUDA tensor for the fused kernels, got {name}.device={x.device}")
    return x


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when the kernels can address it (2-D with a unit last stride, any row stride; 3-D
    contiguous), else a contiguous copy."""
    if x.dim() == 3:
        return x if x.is_contiguous() else x.contiguous()
    return x if x.stride(-1) == 1 else x.contiguous()


def _needs_copy(x: torch.Tensor) -> bool:
    return not (x.is_contiguous() if x.dim() == 3 else x.stride(-1) == 1)


def _row_stride(x: torch.Tensor) -> int:
    """Elements between consecutive rows (over all batches: 3-D tensors are contiguous here)."""
    return x.stride(-2) if x.dim() == 2 and x.shape[0] > 1 else x.shape[-1]


def _vectorizable(x: torch.Tensor, cols: int, extra_offset: int = 0) -> bool:
    """16-byte vector path: every 16-element run starts 16-byte aligned in the input and the output."""
    return _vectorizable_layout(x, cols, extra_offset) and x.data_ptr() % 16 == 0


def _vectorizable_layout(x: torch.Tensor, cols: int, extra_offset: int = 0) -> bool:
    """The shape part of :func:`_vectorizable` (a launch plan's; the address is checked per call)."""
    es = x.element_size()
    return cols % 16 == 0 and (_row_stride(x) * es) % 16 == 0 and (extra_offset * es) % 16 == 0


def _check_size(units: int, rows: int, cols: int, what: str) -> None:
    """The kernels index units (grid) and columns with 32-bit integers."""
    if units >= 2**31 or rows >= 2**32 or cols >= 2**31:
        raise ValueError(f"{what}: too large for one launch ({rows=}, {cols=}, {units=} scale groups or blocks; "
                         "limits 2^32 rows, 2^31 columns and 2^31 groups)")


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------------------------- launch plans
@dataclasses.dataclass(frozen=True)
class QuantLaunchPlan:
    """Everything about a per-token / SiLU·mul / per-block launch that depends on the input's signature (shape,
    strides, dtype) and not on its address: the outputs' shapes and strides, the constant :class:`QuantParams`
    fields by name (struct order), the grid. Made by :func:`plan_quant`; the general path
    (:func:`per_token_cast_to_fp8_cuda`, ...) and the per-call fast path (``_core.plans.QuantPlan``) both launch
    from it."""

    kind: QuantKind
    input_type: InputType
    ue8m0: bool
    out_shape: tuple[int, ...]
    out_strides: tuple[int, ...]
    scale_shape: tuple[int, ...]
    scale_strides: tuple[int, ...]
    fields: dict  # QuantParams field -> value, every field but POINTER_FIELDS
    grid: int
    vectorizable: bool  # the shape allows the 16-byte variant (the address is checked per call)
    copy: bool  # the input is copied to a contiguous one first (its layout is not addressable)
    empty: bool  # no rows / blocks: nothing to launch, the outputs are returned empty
    numerics: Numerics = Numerics.IEEE

    def kernel_config(self, vectorized: bool) -> QuantKernelConfig:
        return QuantKernelConfig(self.kind, self.input_type, vectorized, ue8m0=self.ue8m0, numerics=self.numerics)


#: The fast path's quantiser names -> kernel kinds.
QUANT_KINDS = {"per_token": QuantKind.PER_TOKEN, "silu": QuantKind.SILU_MUL_PER_TOKEN, "per_block": QuantKind.PER_BLOCK,
               "per_token_32": QuantKind.PER_TOKEN_32}


def plan_quant(x: torch.Tensor, kind: QuantKind, ue8m0: bool = False) -> QuantLaunchPlan:
    """The launch plan of ``kind`` (PER_TOKEN, PER_TOKEN_32, SILU_MUL_PER_TOKEN or PER_BLOCK) for inputs of ``x``'s signature;
    checks ``x`` (:func:`check_input`) and its shape, with the quantisers' messages."""
    name = "w" if kind == QuantKind.PER_BLOCK else "x"
    check_input(x, name, (2, 3))
    copy = _needs_copy(x)
    # Only shapes and strides are read below: for an input the call will copy, those of its contiguous copy.
    view = torch.empty(x.shape, dtype=x.dtype, device="meta") if copy else x
    plan = _plan_per_block(view, ue8m0) if kind == QuantKind.PER_BLOCK else _plan_per_token(view, kind, name, ue8m0)
    return dataclasses.replace(plan, copy=copy)


def _plan_per_token(x: torch.Tensor, kind: QuantKind, name: str, ue8m0: bool) -> QuantLaunchPlan:
    in_cols = x.shape[-1]
    if kind == QuantKind.SILU_MUL_PER_TOKEN:
        if in_cols % 2:
            raise ValueError(f"{name} must have an even last dim (gate | up halves), got {name}.shape={tuple(x.shape)}")
        cols, up_offset = in_cols // 2, in_cols // 2
    else:
        cols, up_offset = in_cols, 0
    if cols <= 0:
        raise ValueError(f"{name} must have at least one output column, got {name}.shape={tuple(x.shape)}")
    batch = x.shape[0] if x.dim() == 3 else 1
    m = x.shape[-2]
    group = group_size_of(kind)
    groups = (cols + group - 1) // group
    am = aligned_m(m)
    out_shape = (*x.shape[:-1], cols)
    if x.dim() == 3:
        scale_shape, scale_strides = (batch, m, groups), (am * groups, 1, am)
    else:
        scale_shape, scale_strides = (m, groups), (1, am)
    rows = batch * m
    units = rows * groups
    if rows:
        _check_size(units, rows, cols, name)
    fields = dict(input_row_stride=_row_stride(x), output_row_stride=cols, up_offset=up_offset,
                  scale_batch_stride=am * groups, num_rows=rows, num_cols=cols, rows_per_batch=m, scale_row_stride=am)
    units_per_block = NUM_THREADS // (group // 16)  # 16 elements per thread
    return QuantLaunchPlan(kind, _INPUT_TYPES[x.dtype], ue8m0, out_shape, _contiguous_strides(out_shape), scale_shape,
                           scale_strides, fields, (units + units_per_block - 1) // units_per_block,
                           _vectorizable_layout(x, cols, up_offset), False, rows == 0)


def _plan_per_block(w: torch.Tensor, ue8m0: bool) -> QuantLaunchPlan:
    batch = w.shape[0] if w.dim() == 3 else 1
    n, k = w.shape[-2], w.shape[-1]
    if k <= 0:
        raise ValueError(f"w must have at least one column, got w.shape={tuple(w.shape)}")
    nb, kb = (n + GROUP - 1) // GROUP, (k + GROUP - 1) // GROUP
    scale_shape = (*w.shape[:-2], nb, kb)
    blocks = batch * nb * kb
    if blocks:
        _check_size(blocks, batch * n, k, "w")
    fields = dict(input_row_stride=_row_stride(w), output_row_stride=k, up_offset=0, scale_batch_stride=nb * kb,
                  num_rows=batch * n, num_cols=k, rows_per_batch=n, scale_row_stride=kb)
    return QuantLaunchPlan(QuantKind.PER_BLOCK, _INPUT_TYPES[w.dtype], ue8m0, tuple(w.shape),
                           _contiguous_strides(tuple(w.shape)), scale_shape, _contiguous_strides(scale_shape), fields,
                           blocks, _vectorizable_layout(w, k), False, blocks == 0)


def _run_plan(plan: QuantLaunchPlan, x: torch.Tensor, launch) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate ``plan``'s outputs and launch it on ``x`` (already in an addressable layout) with ``launch``."""
    out = torch.empty_strided(plan.out_shape, plan.out_strides, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty_strided(plan.scale_shape, plan.scale_strides, dtype=torch.float32, device=x.device)
    if plan.empty:
        return out, scales
    params = QuantParams(input=x.data_ptr(), output=out.data_ptr(), scales=scales.data_ptr(), **plan.fields)
    vectorized = plan.vectorizable and x.data_ptr() % 16 == 0
    launch(plan.kernel_config(vectorized), params, plan.grid, x.device)
    return out, scales


# ---------------------------------------------------------------------------------------------- per token
# The run_* functions take the launcher as an argument: the default launches on the GPU (launch_cuda), the
# quantisers' simulator backend passes launch_sim and the tests a CPU emulation of the kernel, so this host code
# (params, layouts, grid) is what every backend runs.
def run_per_token(x: torch.Tensor, kind: QuantKind, name: str, launch=None, ue8m0: bool = False,
                  numerics: Numerics = Numerics.IEEE) -> tuple[torch.Tensor, torch.Tensor]:
    plan = dataclasses.replace(_plan_per_token(_rows_view(x), kind, name, ue8m0), numerics=numerics)
    return _run_plan(plan, _rows_view(x), launch or launch_cuda)


def per_token_cast_to_fp8_cuda(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused 1x128 quantisation of activations on an sm_90 GPU.

    Args:
        x: ``[m, k]`` (or batched ``[G, m, k]``) bfloat16 / float16 / float32 CUDA tensor; any strides (a
            copy is made when the last dim is not contiguous, or for a non-contiguous 3-D tensor). ``k >= 1``;
            a k that is not a multiple of 128 is treated as zero-padded.

    Returns:
        ``(x_fp8, scales)``: ``x_fp8`` ``[m, k]`` float8_e4m3fn, contiguous; ``scales`` ``[m, ceil(k/128)]``
        float32 in the TMA-aligned M-major layout, strides ``(1, aligned_m)`` with
        ``aligned_m = get_tma_aligned_size(m, 4)`` (3-D: ``[G, m, g]``, strides ``(aligned_m * g, 1,
        aligned_m)``) — written directly by the kernel, no transpose. Identical bits to
        :func:`deep_fp8_gemm.quant.per_token_cast_to_fp8_torch` (``use_ue8m0``: power-of-two scales).
    """
    x = check_tensor(x, "x", (2, 3))
    return run_per_token(x, QuantKind.PER_TOKEN, "x", ue8m0=bool(use_ue8m0))


def silu_mul_quant_cuda(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``SiLU(gate) * up`` + 1x128 quantisation (the MoE middle) on an sm_90 GPU.

    Args:
        x: ``[m, 2I]`` (or ``[G, m, 2I]``) bfloat16 / float16 / float32 CUDA tensor: columns ``[0, I)`` are
            the gate projection, ``[I, 2I)`` the up projection (the layout of ``w13``'s output).

    Returns:
        ``(y_fp8, scales)`` as :func:`per_token_cast_to_fp8_cuda` for ``y = silu(gate.float()) * up.float()``
        (``silu(g) = g / (1 + exp(-g))``, fp32), shape ``[m, I]`` / ``[m, ceil(I/128)]`` (M-major).
        ``y`` is never materialised. Equals ``per_token_cast_to_fp8(F.silu(gate.float()) * up.float())`` up to
        the last bit of ``expf`` (the GPU's ``expf`` and torch's CUDA ``exp`` are the same libdevice routine).
    """
    x = check_tensor(x, "x", (2, 3))
    return run_per_token(x, QuantKind.SILU_MUL_PER_TOKEN, "x")


# ---------------------------------------------------------------------------------------------- per block
def per_block_cast_to_fp8_cuda(w: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused 128x128 block quantisation of weights on an sm_90 GPU.

    Args:
        w: ``[n, k]`` (or batched ``[G, n, k]``, e.g. the experts of a MoE layer) bfloat16 / float16 /
            float32 CUDA tensor, any strides (copied when the last dim is not contiguous, or 3-D and not
            contiguous). Partial edge blocks are treated as zero-padded.

    Returns:
        ``(w_fp8, scales)``: ``w_fp8`` with ``w``'s shape, float8_e4m3fn, contiguous; ``scales``
        ``[ceil(n/128), ceil(k/128)]`` (3-D: ``[G, ceil(n/128), ceil(k/128)]``) float32, contiguous. Identical
        bits to :func:`deep_fp8_gemm.quant.per_block_cast_to_fp8_torch` (per expert for 3-D; ``use_ue8m0``:
        power-of-two scales).
    """
    return run_per_block(check_tensor(w, "w", (2, 3)), ue8m0=bool(use_ue8m0))


def run_per_block(w: torch.Tensor, launch=None, ue8m0: bool = False, numerics: Numerics = Numerics.IEEE
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    w = _rows_view(w)
    return _run_plan(dataclasses.replace(_plan_per_block(w, ue8m0), numerics=numerics), w, launch or launch_cuda)


# ---------------------------------------------------------------------------------------------- cast-transpose
def _check_transpose_size(rows: int, cols: int, what: str) -> None:
    """The transpose kernels index rows and columns of x (and tiles) with 32-bit integers."""
    if rows >= 2**31 or cols >= 2**31:
        raise ValueError(f"{what}: too large for one launch ({rows=}, {cols=}; limit 2^31 - 1 each)")


def per_token_cast_to_fp8_and_transpose_cuda(x: torch.Tensor, use_ue8m0: bool = False
                                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused cast-transpose on an sm_90 GPU: the 1x128 quantisation of ``x`` and of ``xᵀ`` from one read of ``x``.

    Args:
        x: ``[m, k]`` bfloat16 / float16 / float32 CUDA tensor, ``m, k >= 1``; any row stride (copied when the
            last dim is not contiguous). The 16-byte vector variant needs ``m % 16 == 0``, ``k % 16 == 0`` and
            16-byte aligned rows; the scalar variant serves every other shape.

    Returns:
        ``(x_fp8, x_sf, xt_fp8, xt_sf)``: ``x_fp8`` ``[m, k]`` and ``xt_fp8`` ``[k, m]`` float8_e4m3fn, contiguous;
        ``x_sf`` ``[m, ceil(k/128)]`` and ``xt_sf`` ``[k, ceil(m/128)]`` float32 in the TMA-aligned M-major layout
        (strides ``(1, aligned_m)`` / ``(1, aligned_k)``). Identical bits to
        :func:`deep_fp8_gemm.quant.per_token_cast_to_fp8_torch` of ``x`` and of ``x.t()``.
    """
    return run_cast_transpose(check_tensor(x, "x", (2,)), ue8m0=bool(use_ue8m0))


@dataclasses.dataclass(frozen=True)
class TransposeLaunchPlan:
    """Everything about a cast-transpose / k-grouped-transpose launch that depends on the input's signature (shape,
    strides, dtype; ``ks`` for the k-grouped one) and not on its address: the outputs' ``(shape, strides, dtype)``
    in return order, the :class:`TransposeParams` fields that a call fills with the outputs' pointers
    (``output_fields``, in return order; ``input`` is always per call), every other field's constant value by
    name, the grid. Made by :func:`plan_cast_transpose` / :func:`plan_k_grouped_transpose`; the general path
    (:func:`run_cast_transpose`, :func:`run_k_grouped_transpose`) and the per-call fast path
    (``ops.transpose_plans``) both launch from it."""

    kind: QuantKind
    input_type: InputType
    ue8m0: bool
    outputs: tuple  # ((shape, strides, dtype), ...) in return order
    output_fields: tuple[str, ...]  # the TransposeParams pointer field of each output, same order
    fields: dict  # TransposeParams field -> value, every field but "input" and output_fields
    grid: int
    vectorizable: bool  # the shape allows the 16-byte variant (the address is checked per call)
    empty: bool  # nothing to launch: the outputs are returned empty
    keep: object = None  # a device tensor the constant fields point at (the group prefix), held by the plan

    def kernel_config(self, vectorized: bool) -> QuantKernelConfig:
        return QuantKernelConfig(self.kind, self.input_type, vectorized, ue8m0=self.ue8m0)

    def params(self, x_ptr: int, output_ptrs) -> TransposeParams:
        return TransposeParams(input=x_ptr, **dict(zip(self.output_fields, output_ptrs)), **self.fields)


def plan_cast_transpose(x: torch.Tensor, ue8m0: bool = False) -> TransposeLaunchPlan:
    """The launch plan of the fused cast-transpose for inputs of ``x``'s signature (``x``: 2-D with a unit last
    stride, :func:`_rows_view`'s form); raises ``ValueError`` for an empty or too-large ``x``."""
    m, k = x.shape
    if m <= 0 or k <= 0:
        raise ValueError(f"x must have at least one row and one column, got x.shape={tuple(x.shape)}")
    _check_transpose_size(m, k, "x")
    mb, kb = (m + GROUP - 1) // GROUP, (k + GROUP - 1) // GROUP
    rows_aligned, cols_aligned = aligned_m(m), aligned_m(k)
    fp8, f32 = torch.float8_e4m3fn, torch.float32
    outputs = (((m, k), (k, 1), fp8), ((m, kb), (1, rows_aligned), f32), ((k, m), (m, 1), fp8),
               ((k, mb), (1, cols_aligned), f32))
    fields = dict(group_prefix=0, input_row_stride=_row_stride(x), num_rows=m, num_cols=k, scale_stride=rows_aligned,
                  scale_t_stride=cols_aligned, num_groups=0, reserved=0)
    # xᵀ rows (m bytes) are stored 16 bytes at a time by the vector variant
    return TransposeLaunchPlan(QuantKind.CAST_TRANSPOSE, _INPUT_TYPES[x.dtype], ue8m0, outputs,
                               ("output", "scales", "output_t", "scales_t"), fields, mb * kb,
                               _vectorizable_layout(x, k) and m % 16 == 0, False)


def run_cast_transpose(x: torch.Tensor, launch=None, ue8m0: bool = False) -> tuple[torch.Tensor, ...]:
    x = _rows_view(x)
    return _run_transpose_plan(plan_cast_transpose(x, ue8m0), x, launch or launch_cuda)


def _run_transpose_plan(plan: TransposeLaunchPlan, x: torch.Tensor, launch) -> tuple[torch.Tensor, ...]:
    """Allocate ``plan``'s outputs and launch it on ``x`` (already in an addressable layout) with ``launch``."""
    outs = tuple(torch.empty_strided(shape, strides, dtype=dtype, device=x.device)
                 for shape, strides, dtype in plan.outputs)
    if not plan.empty:
        vectorized = plan.vectorizable and x.data_ptr() % 16 == 0
        launch(plan.kernel_config(vectorized), plan.params(x.data_ptr(), [t.data_ptr() for t in outs]), plan.grid,
               x.device)
    return outs


def transpose_cast_to_fp8_k_grouped_cuda(x: torch.Tensor, ks: list[int], use_ue8m0: bool = False
                                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-grouped weight-gradient operand on an sm_90 GPU, one launch for all groups.

    Args:
        x: ``[sum(ks), n]`` bfloat16 / float16 / float32 CUDA tensor, any row stride (copied when the last dim
            is not contiguous); group ``g`` is rows ``sum(ks[:g]) ..`` + ``ks[g]``.
        ks: Python ints, each a multiple of 128 and ``>= 0``. Their prefix sums go to the device as an int32
            tensor, cached per ``(ks, device)`` (so a CUDA-graph capture needs a call with the same ``ks``
            before it).

    Returns:
        ``(flat_fp8, sf)``: float8_e4m3fn 1-D ``[sum(ks) * n]`` (group ``g``'s ``[n, ks[g]]`` block at
        ``n * sum(ks[:g])``), float32 ``[n, sum(ks) / 128]`` M-major TMA-aligned (strides ``(1, aligned_n)``).
        Identical bits to :func:`deep_fp8_gemm.quant.per_token_cast_to_fp8_torch` of each ``x_g.t()``.
    """
    x = check_tensor(x, "x", (2,))
    if any(k < 0 or k % GROUP for k in ks) or sum(ks) != x.shape[0] or not ks:
        raise ValueError(f"ks must be non-negative multiples of {GROUP} summing to x.shape[0], got {ks=} and "
                         f"x.shape={tuple(x.shape)}")
    return run_k_grouped_transpose(x, [int(k) for k in ks], ue8m0=bool(use_ue8m0))


_prefix_cache: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}
_PREFIX_CACHE_SIZE = 64


def _group_prefix(ks: list[int], device: torch.device) -> torch.Tensor:
    """int32 ``[G + 1]`` prefix sums of ``ks`` on ``device`` (the kernel's row block -> group map), cached."""
    key = (tuple(ks), device)
    prefix = _prefix_cache.get(key)
    if prefix is None:
        starts = [0]
        for k in ks:
            starts.append(starts[-1] + k)
        prefix = torch.tensor(starts, dtype=torch.int32, device=device)
        if len(_prefix_cache) >= _PREFIX_CACHE_SIZE:
            del _prefix_cache[next(iter(_prefix_cache))]
        _prefix_cache[key] = prefix
    return prefix


def plan_k_grouped_transpose(x: torch.Tensor, ks: list[int], ue8m0: bool = False) -> TransposeLaunchPlan:
    """The launch plan of the k-grouped transpose for inputs of ``x``'s signature and these ``ks`` (checked by the
    caller: Python ints, multiples of 128, summing to ``x.shape[0]``); ``x`` in :func:`_rows_view`'s form. The plan
    holds the group prefix (``keep``) its ``group_prefix`` field points at."""
    total, n = x.shape
    aligned_n = aligned_m(n)
    outputs = (((total * n,), (1,), torch.float8_e4m3fn), ((n, total // GROUP), (1, aligned_n), torch.float32))
    empty = total == 0 or n == 0
    if not empty:
        _check_transpose_size(total, n, "x")
    prefix = None if empty else _group_prefix(ks, x.device)
    fields = dict(output=0, scales=0, group_prefix=0 if prefix is None else prefix.data_ptr(),
                  input_row_stride=_row_stride(x), num_rows=total, num_cols=n, scale_stride=0,
                  scale_t_stride=aligned_n, num_groups=len(ks), reserved=0)
    # Stores of xᵀ are always 16-byte chunks (ks[g] % 128 == 0); the vector variant also needs 16-byte rows of x.
    return TransposeLaunchPlan(QuantKind.K_GROUPED_TRANSPOSE, _INPUT_TYPES[x.dtype], ue8m0, outputs,
                               ("output_t", "scales_t"), fields, (total // GROUP) * ((n + GROUP - 1) // GROUP),
                               _vectorizable_layout(x, n), empty, prefix)


def run_k_grouped_transpose(x: torch.Tensor, ks: list[int], launch=None, ue8m0: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
    x = _rows_view(x)
    return _run_transpose_plan(plan_k_grouped_transpose(x, ks, ue8m0), x, launch or launch_cuda)
    _check_transpose_size(total, n, "x")
    prefix = _group_prefix(ks, x.device)
    # Stores of xᵀ are always 16-byte chunks (ks[g] % 128 == 0); the vector variant also needs 16-byte rows of x.
    config = QuantKernelConfig(QuantKind.K_GROUPED_TRANSPOSE, _INPUT_TYPES[x.dtype], _vectorizable(x, n),
                               ue8m0=ue8m0)
    params = TransposeParams(
        input=x.data_ptr(), output=0, scales=0, output_t=flat.data_ptr(), scales_t=sf.data_ptr(),
        group_prefix=prefix.data_ptr(), input_row_stride=_row_stride(x), num_rows=total, num_cols=n,
        scale_stride=0, scale_t_stride=aligned_n, num_groups=len(ks), reserved=0,
    )
    (launch or launch_cuda)(config, params, (total // GROUP) * ((n + GROUP - 1) // GROUP), x.device)
    return flat, sf
