"""Host side of the FP8 GEMM kernel family: config -> source -> tensor maps + parameters -> launch.

One kernel template (``jit/fp8_gemm.cu``, ``include/deep_fp8_gemm/kernels/fp8_gemm.cuh``) serves every kind of
``config.KINDS``. This module is the kernel-host layer under the op families (``deep_fp8_gemm.ops.*``): it
renders a config's translation unit, describes the tensor maps a kind's kernel reads (plain tuples of
:class:`~deep_fp8_gemm.runtime.tensor_map.TensorMapSpec` fields, encoded by the driver on a GPU or packed for
the CPU simulator, so both backends run the same kernel with the same parameters), fills the one parameter
struct (:class:`GemmParams`, by field name) and launches it — :func:`launch`, the only place that branches on
the backend. The ``launch_*`` functions take an explicit config; choosing one is the family's ``plan``.

Inputs arrive validated and normalised by the op families (dtypes, shapes, K-major operands, 16-byte
alignment, scales M-major with a TMA-aligned column stride).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Sequence

import torch

from .. import env
from ..config import BLOCK_K, FP8_OUTPUT_BLOCK_N, FP8_OUTPUT_KINDS, GemmConfig, check_config
from ..utils import PROCESS_SETTINGS
from ..runtime import params as param_structs
from ..runtime.target import Backend
from ..runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from . import group_maps, split_k
from .wgmma_gen import wgmma_fp8_wrapper

TEMPLATE = "fp8_gemm.cu"
TENSOR_MAP_BYTES = 128


# ---------------------------------------------------------------------------------------------- source
@functools.lru_cache(maxsize=1024)
def render_source(cfg: GemmConfig, simulator: bool = False) -> str:
    """The translation unit of ``cfg``'s kernel. The simulator build gets no PTX wrappers (its hal
    implements wgmma generically); everything else is the same text."""
    from ..runtime.render import render

    constants = dict(cfg.template_constants(), KERNEL_NAME=cfg.kernel_name())
    return render(TEMPLATE, constants, extra_code="" if simulator else wgmma_fp8_wrapper(cfg.mma_n))


# ---------------------------------------------------------------------------------------------- parameters
_MapBytes = ctypes.c_ubyte * TENSOR_MAP_BYTES


class _FourthMap(ctypes.Union):
    _fields_ = [("tma_d", _MapBytes), ("tma_sb", _MapBytes)]


class _KindTail(ctypes.Union):
    _fields_ = [("group_maps", ctypes.c_uint64), ("split_counters", ctypes.c_uint64)]


class _DSlot(ctypes.Union):
    _fields_ = [("d_f32", ctypes.c_uint64), ("sd", ctypes.c_uint64)]


class _LdDSlot(ctypes.Union):
    _fields_ = [("ld_d", ctypes.c_uint32), ("ld_sd", ctypes.c_uint32)]


class GemmParams(ctypes.Structure):
    """Byte image of ``dfg::GemmParams`` (576 bytes; ``include/deep_fp8_gemm/gemm_params.cuh`` defines it with the
    same field names and ``static_assert``s every offset below).

    ======================  ======  =================================================================
    field                   offset  holds
    ======================  ======  =================================================================
    tma_a, tma_b, tma_sa    0..383  the A, B and sA tensor maps (k-grouped: tma_a / tma_b unused, the
                                    per-group maps are at ``group_maps``)
    tma_d | tma_sb          384     bf16 and FP8-output kinds: the D map; fp32 kinds (1D1D, k-grouped): sB's map
    sb                      512     bf16 kinds: sB [G][ceil(N/128)][ceil(K/128)] fp32
    grouped_layout          520     contiguous: m_indices; psum: group ends; masked: masked_m; k-grouped:
                                    ks_tensor; dense / 1D1D: 0
    rows                    528     rows of A (dense, 1D1D: m; contiguous / psum: m_sum; masked: m_max;
                                    k-grouped: m of every group)
    reserved                532     0 (pads d_f32 to 8 bytes)
    d_f32 | sd, c_f32       536     fp32 kinds: D and C (may be equal: in-place accumulation); FP8-output
                                    kinds: sd = D's M-major 1x128 scales (c_f32 unused)
    ld_d | ld_sd, ld_c      552     fp32 kinds: their row strides in floats; FP8-output kinds: ld_sd = sD's
                                    column stride (rows rounded up to 4)
    group_maps |            560     k-grouped: the per-group A_g / B_g maps in global memory;
    split_counters                  dense split-K: the arrival counters
    split_partials          568     dense split-K: the fp32 partial tiles
    ======================  ======  =================================================================
    """

    _anonymous_ = ("fourth_map", "d_slot", "ld_d_slot", "kind_tail")
    _fields_ = [
        ("tma_a", _MapBytes), ("tma_b", _MapBytes), ("tma_sa", _MapBytes), ("fourth_map", _FourthMap),
        ("sb", ctypes.c_uint64), ("grouped_layout", ctypes.c_uint64), ("rows", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32), ("d_slot", _DSlot), ("c_f32", ctypes.c_uint64),
        ("ld_d_slot", _LdDSlot), ("ld_c", ctypes.c_uint32), ("kind_tail", _KindTail),
        ("split_partials", ctypes.c_uint64),
    ]


PARAMS_BYTES = ctypes.sizeof(GemmParams)
assert PARAMS_BYTES == 576  # import-time check of our own mirror, not a user check
#: The 1D2D kinds' fields after the tensor maps, in the order the per-call fast path packs them: the whole tail
#: (the gaps written as zeros), sd / ld_sd 0 for the bf16 output.
TAIL_1D2D = ("sb", "grouped_layout", "rows", "sd", "ld_sd", "split_counters", "split_partials")
MAPS_BYTES = 4 * TENSOR_MAP_BYTES  # the four maps at the front: what a per-pointer map cache holds


def pack_params(maps: Sequence[bytes], **fields: int) -> bytes:
    """Raw bytes of ``dfg::GemmParams``: the four 128-byte maps (tma_a, tma_b, tma_sa, tma_d | tma_sb), then the
    named integer fields of :class:`GemmParams` (the others zero)."""
    if len(maps) != 4:
        raise ValueError(f"expected four 128-byte tensor maps, got {len(maps)}")
    return param_structs.pack(GemmParams, tma_a=maps[0], tma_b=maps[1], tma_sa=maps[2], tma_d=maps[3], **fields)


def params_packer(names: tuple[str, ...]) -> param_structs.FieldPacker:
    """A packer of the named :class:`GemmParams` fields (ascending offsets), for the per-call fast path."""
    return param_structs.FieldPacker(GemmParams, names)


# ---------------------------------------------------------------------------------------------- tensor maps
MapArgs = tuple  # (dtype, address, dims, strides, box, swizzle): the fields of a TensorMapSpec, in order


def tensor_map_args_1d2d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, d: torch.Tensor
                         ) -> tuple[MapArgs, MapArgs, MapArgs, MapArgs]:
    """The four rank-3 tensor maps of the bf16-output and FP8-output kinds (dims innermost first), as plain tuples.

    Shapes: A ``[rows, k]`` or ``[G, rows, k]`` (masked) e4m3; sA M-major ``[rows, kb]`` / ``[G, rows, kb]``
    with ``stride(-2) == 1`` (kb = ceil(k/128), or ceil(k/32) for the 1x32 recipe, whose box is the stage's four
    columns), or with ``cfg.sa_major`` "k" / "g" a ``[G, rows, kb]`` whose kb / G dimension is unit-stride
    (:func:`sa_major_of`; its map: :func:`sa_map_args`); B ``[n, k]`` or ``[G, n, k]``; D ``[rows, n]`` /
    ``[G, rows, n]`` bf16, or for the
    FP8-output kinds e4m3 ``[rows, n_out]`` / ``[G, rows, n_out]`` (``n_out`` = n, SwiGLU n / 2).
    A 2-D operand gets a unit batch dimension (its batch stride is then never used). Plain tuples
    because this runs on every new pointer set: they hash and compare faster than spec objects.
    """
    rows, k = a.shape[-2], a.shape[-1]
    n = b.shape[-2]
    kb = sa.shape[-1]
    a_stride, d_stride = a.stride(-2), d.stride(-2)
    if a.dim() == 3:  # masked: [G, rows, *]
        a_batch, a_batch_stride, d_batch_stride, sa_batch_stride = a.shape[0], a.stride(0), d.stride(0) * 2, sa.stride(0) * 4
    else:
        a_batch, a_batch_stride, d_batch_stride = 1, rows * a_stride, rows * d_stride * 2
        sa_batch_stride = sa.stride(-1) * 4 * kb
    if b.dim() == 3:
        b_batch, b_batch_stride = b.shape[0], b.stride(0)
    else:
        b_batch, b_batch_stride = 1, n * b.stride(-2)
    a_rows_per_load = cfg.block_m // 2 if cfg.cluster_n == 2 else cfg.block_m
    b_rows_per_load = cfg.block_n // 2 if cfg.cluster_m == 2 else cfg.block_n
    if cfg.kind in FP8_OUTPUT_KINDS:  # e4m3 D [.., rows, n_out]: one 128-column group per tile, SW128 (epilogue_fp8.cuh)
        n_out = d.shape[-1]
        d_map = (TmaDtype.UINT8, d.data_ptr(), (n_out, rows, a_batch),
                 (d_stride, d.stride(0) if d.dim() == 3 else rows * d_stride), (FP8_OUTPUT_BLOCK_N, cfg.wg_rows, 1),
                 TmaSwizzle.B128)
    elif cfg.swap_ab:  # the transposed tile's [BLOCK_M][BLOCK_N] shared image, one unswizzled box (policy_swap_ab.cuh)
        d_map = (TmaDtype.BFLOAT16, d.data_ptr(), (n, rows, a_batch), (d_stride * 2, d_batch_stride),
                 (cfg.block_n, cfg.block_m, 1), TmaSwizzle.NONE)
    else:
        d_map = (TmaDtype.BFLOAT16, d.data_ptr(), (n, rows, a_batch), (d_stride * 2, d_batch_stride),
                 (16, cfg.wg_rows, 1), TmaSwizzle.B32)
    return (
        (TmaDtype.UINT8, a.data_ptr(), (k, rows, a_batch), (a_stride, a_batch_stride), (BLOCK_K, a_rows_per_load, 1),
         TmaSwizzle.B128),
        (TmaDtype.UINT8, b.data_ptr(), (k, n, b_batch), (b.stride(-2), b_batch_stride), (BLOCK_K, b_rows_per_load, 1),
         TmaSwizzle.B128),
        sa_map_args(cfg, sa) if cfg.sa_major != "m" else
        (TmaDtype.FLOAT32, sa.data_ptr(), (rows, kb, a_batch), (sa.stride(-1) * 4, sa_batch_stride),
         (cfg.block_m, cfg.scale_groups_per_k_block, 1), TmaSwizzle.NONE),
        d_map,
    )


#: Floats of a K- / G-major sA box's row: TMA's 16-byte minimum along the unit-stride dimension (scales.cuh).
SA_BOX_FLOATS = 4


def _stride_bytes(t: torch.Tensor, dim: int) -> int:
    """``t``'s stride along ``dim`` in bytes, a size-1 dimension's as 16 (never stepped: any multiple of 16 serves)."""
    return 16 if t.shape[dim] == 1 else t.stride(dim) * t.element_size()


def sa_major_of(sa: torch.Tensor, address: bool = True) -> str | None:
    """``"k"`` or ``"g"`` where the masked kernel can read the fp32 ``sa [G, rows, kb]`` where it lies with a K- / G-major
    sA map (``GemmConfig.sa_major``, scales.cuh ``ScaleMajor``): its kb (``"k"``) or G (``"g"``) dimension unit-stride,
    the other two strides multiples of 16 bytes and (``address``; a plan decides by the signature alone) a 16-byte
    aligned address; else None (the M-major copy). Every size-1 dimension counts as unit-stride and as 16-byte strided.
    fp8_einsum's two caller layouts, seen as ``sx.permute(1, 0, 2)``: row-major ``sx [b, h, kb]`` is K-major
    (kb % 4 == 0), per_token_cast_to_fp8's ``[b * h, kb]`` viewed back is G-major (h % 4 == 0)."""
    if sa.dim() != 3 or sa.dtype != torch.float32 or sa.numel() == 0 or (address and sa.data_ptr() % 16):
        return None
    unit = [sa.shape[i] == 1 or sa.stride(i) == 1 for i in range(3)]
    aligned = [_stride_bytes(sa, i) % 16 == 0 for i in range(3)]
    if unit[2] and aligned[0] and aligned[1]:
        return "k"
    if unit[0] and aligned[1] and aligned[2]:
        return "g"
    return None


def sa_map_args(cfg: GemmConfig, sa: torch.Tensor) -> MapArgs:
    """The sA map of a K- or G-major ``sa [G, rows, kb]`` (``cfg.sa_major``, :func:`sa_major_of`): the unit-stride
    dimension innermost with a box of 4 floats (16 bytes), the rows next (BLOCK_M of them), the third dimension a box
    of 1: "k" dims (kb, rows, G), "g" dims (G, rows, kb). The kernel's coordinates follow the same order
    (fp8_gemm.cuh produce)."""
    groups, rows, kb = sa.shape
    if cfg.sa_major == "k":
        dims, strides = (kb, rows, groups), (_stride_bytes(sa, 1), _stride_bytes(sa, 0))
    elif cfg.sa_major == "g":
        dims, strides = (groups, rows, kb), (_stride_bytes(sa, 1), _stride_bytes(sa, 2))
    else:
        raise ValueError(f"sa_map_args serves sa_major 'k' / 'g', got {cfg.sa_major!r}")
    return (TmaDtype.FLOAT32, sa.data_ptr(), dims, strides, (SA_BOX_FLOATS, cfg.block_m, 1), TmaSwizzle.NONE)


def tensor_map_specs_1d2d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, d: torch.Tensor
                          ) -> list[TensorMapSpec]:
    """:func:`tensor_map_args_1d2d` as validated-on-encode :class:`TensorMapSpec` objects."""
    return [TensorMapSpec(*args) for args in tensor_map_args_1d2d(cfg, a, sa, b, d)]


def tensor_map_args_1d1d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor
                         ) -> tuple[MapArgs, MapArgs, MapArgs, MapArgs]:
    """The 1D1D kernel's maps: A, B, sA as for the 1D2D kinds (2-D operands), and in the fourth slot (tma_sb) sB:
    per-row scales of B, M-major ``[n, kb]`` with ``stride(-2) == 1`` and a TMA-aligned column stride, box
    BLOCK_N x 1 (its D is fp32 and written without a tensor map)."""
    (rows, k), n, kb = a.shape, b.shape[0], sa.shape[-1]
    return (
        (TmaDtype.UINT8, a.data_ptr(), (k, rows, 1), (a.stride(0), rows * a.stride(0)), (BLOCK_K, cfg.block_m, 1),
         TmaSwizzle.B128),
        (TmaDtype.UINT8, b.data_ptr(), (k, n, 1), (b.stride(0), n * b.stride(0)), (BLOCK_K, cfg.block_n, 1),
         TmaSwizzle.B128),
        (TmaDtype.FLOAT32, sa.data_ptr(), (rows, kb, 1), (sa.stride(-1) * 4, sa.stride(-1) * 4 * kb),
         (cfg.block_m, 1, 1), TmaSwizzle.NONE),
        (TmaDtype.FLOAT32, sb.data_ptr(), (n, kb, 1), (sb.stride(-1) * 4, sb.stride(-1) * 4 * kb),
         (cfg.block_n, 1, 1), TmaSwizzle.NONE),
    )


def k_grouped_scale_map_args(cfg: GemmConfig, sa: torch.Tensor, sb: torch.Tensor, m: int, n: int
                             ) -> tuple[MapArgs, MapArgs]:
    """sA ``[m, sum(ks)/128]`` (the tma_sa slot) and sB ``[n, sum(ks)/128]`` (the tma_sb slot, as in the 1D1D
    kind), both M-major TMA-aligned, boxes BLOCK_M x 1 / BLOCK_N x 1: one map each for every group."""
    kb = sa.shape[-1]
    return (
        (TmaDtype.FLOAT32, sa.data_ptr(), (m, kb, 1), (sa.stride(-1) * 4, sa.stride(-1) * 4 * kb), (cfg.block_m, 1, 1),
         TmaSwizzle.NONE),
        (TmaDtype.FLOAT32, sb.data_ptr(), (n, kb, 1), (sb.stride(-1) * 4, sb.stride(-1) * 4 * kb), (cfg.block_n, 1, 1),
         TmaSwizzle.NONE),
    )


def encode_maps(args: Sequence[MapArgs | None], backend: Backend) -> list[bytes]:
    """The 128-byte images of ``args`` for ``backend``: encoded by the driver (``cuTensorMapEncodeTiled``, cached by
    the argument tuples: weights always hit, activations whenever the caching allocator hands back the same
    address) or packed for the simulator; ``None`` (an unused slot) is 128 zero bytes."""
    unused = bytes(TENSOR_MAP_BYTES)
    if backend is Backend.SIM:
        from ..simulator import pack_tensor_map

        return [unused if x is None else pack_tensor_map(TensorMapSpec(*x)) for x in args]
    from ..runtime import driver

    return [unused if x is None else driver.tensor_map_cache.lookup(x, x) for x in args]


# ---------------------------------------------------------------------------------------------- launch
def launch(cfg: GemmConfig, maps: Sequence[bytes], backend: Backend | str, device: torch.device, **fields: int
           ) -> None:
    """Pack ``dfg::GemmParams`` (the four maps, then ``fields`` by name) and launch ``cfg``'s kernel: the one place a
    GEMM launch branches on the backend.

    ``Backend.CUDA``: the kernel loaded on ``device``'s GPU, on torch's current stream, ``cfg.grid_size`` CTAs.
    ``Backend.SIM``: the simulator build of the same source, with the register count of its sm_90a build (the
    simulator accounts setmaxnreg against that pool, for every kind), a programmatic dependent launch under the PDL
    flag as on the GPU (it matters inside ``deep_fp8_gemm.simulator.stream()``)."""
    backend = Backend(backend)
    checked_config(cfg)
    params = pack_params(maps, **fields)
    if backend is Backend.SIM:
        from ..simulator import launch as sim_launch, ptxas_registers

        registers = ptxas_registers(cfg.kernel_name(), render_source(cfg))
        sim_launch(cfg.kernel_name(), render_source(cfg, simulator=True), params, grid=cfg.grid_size,
                   block=cfg.num_threads, cluster=cfg.cluster_size, smem_bytes=cfg.smem_bytes, registers=registers,
                   programmatic=PROCESS_SETTINGS.pdl)
    elif backend is Backend.CUDA:
        from ..runtime import driver, target

        index = target.gpu_index(device)
        driver.launch(cuda_kernel(cfg, index), params, grid=cfg.grid_size, block=cfg.num_threads,
                      cluster=cfg.cluster_size, smem_bytes=cfg.smem_bytes, stream=target.current_stream(index),
                      pdl=PROCESS_SETTINGS.pdl)
    else:
        raise ValueError(f"a GEMM kernel launches on Backend.CUDA or Backend.SIM, got {backend}")


def split_k_pointers(cfg: GemmConfig, rows: int, device: torch.device, backend: Backend) -> tuple[int, int]:
    """The split-K workspace addresses of an explicit-config launch (``(0, 0)`` without split-K): on CUDA torch's
    current stream's cached pair, or a graph capture's own (:mod:`.split_k`)."""
    if cfg.split_k == 1:
        return 0, 0
    stream, capturing = 0, False
    if backend is Backend.CUDA:
        from ..runtime import target

        index = target.gpu_index(device)
        stream, capturing = target.current_stream(index), target.is_capturing(index)
    return split_k.pointers(cfg, rows, device, stream, capturing)


def launch_1d2d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                d: torch.Tensor, grouped_layout: torch.Tensor | None, backend: Backend | str) -> None:
    """The kernel of an explicit ``cfg`` of a bf16-output kind (dense, contiguous, masked, psum) on validated
    tensors (tests and benchmarks force configs through this). Split-K configs get their workspace from
    :mod:`.split_k` (on CUDA: torch's current stream's, or a graph capture's own)."""
    backend = Backend(backend)
    rows = a.shape[-2]
    counters, partials = split_k_pointers(cfg, rows, a.device, backend)
    maps = encode_maps(tensor_map_args_1d2d(cfg, a, sa, b, d), backend)
    launch(cfg, maps, backend, a.device, sb=sb.data_ptr(),
           grouped_layout=0 if grouped_layout is None else grouped_layout.data_ptr(), rows=rows,
           split_counters=counters, split_partials=partials)


def launch_fp8_output(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                      d: torch.Tensor, sd: torch.Tensor, grouped_layout: torch.Tensor | None,
                      backend: Backend | str) -> None:
    """The kernel of an explicit ``cfg`` of an FP8-output kind (``config.FP8_OUTPUT_KINDS``: dense / contiguous /
    masked / psum ``_fp8out``, the SwiGLU kinds) on validated tensors: A, sA, B, sB as :func:`launch_1d2d`; ``d``
    e4m3 ``[rows, n_out]`` (masked ``[G, rows, n_out]``) row-major, ``sd`` its scales ``[rows, ceil(n_out/128)]``
    (``[G, rows, ...]``) in the M-major TMA-aligned layout (``utils.m_major_strides``), written by the kernel.
    Split-K configs (dense_fp8out) get their workspace from :mod:`.split_k`."""
    if cfg.kind not in FP8_OUTPUT_KINDS:
        raise ValueError(f"launch_fp8_output needs an FP8-output config, got kind={cfg.kind!r}")
    backend = Backend(backend)
    rows = a.shape[-2]
    counters, partials = split_k_pointers(cfg, rows, a.device, backend)
    maps = encode_maps(tensor_map_args_1d2d(cfg, a, sa, b, d), backend)
    launch(cfg, maps, backend, a.device, sb=sb.data_ptr(),
           grouped_layout=0 if grouped_layout is None else grouped_layout.data_ptr(), rows=rows, sd=sd.data_ptr(),
           ld_sd=sd.stride(-1), split_counters=counters, split_partials=partials)


def check_fp32_vector_access(d: torch.Tensor, c: torch.Tensor) -> None:
    """The fp32 epilogue's 8-byte accesses (policy_1d1d.cuh, ``store_fp32_accumulate``: one ``LDG.E.64`` of C and
    one ``STG.E.64`` of D per fragment pair) need ``d`` and ``c`` 8-byte aligned with even row strides; a
    misaligned vector access faults the launch. The ops' checks refuse such views earlier (16-byte rule); this
    guards the explicit-config launchers too, with the same ``ValueError``."""
    for t, name in ((d, "d"), (c, "c")):
        if t.data_ptr() % 8 or t.stride(-2) % 2:
            raise ValueError(f"{name} must be 8-byte aligned with an even row stride (the fp32 epilogue's 8-byte "
                             f"accesses), got {name}.data_ptr()={t.data_ptr():#x}, {name}.stride()={t.stride()}")


def launch_1d1d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                d: torch.Tensor, c: torch.Tensor, backend: Backend | str) -> None:
    """``d = c + (a, sa) . (b, sb)^T`` in fp32 with the 1D1D kernel of an explicit ``cfg`` (``cfg.kind ==
    "1d1d"``) on validated tensors (``c`` may be ``d``; both row-major, 8-byte aligned with even row strides)."""
    if cfg.kind != "1d1d":
        raise ValueError(f"launch_1d1d needs a 1d1d config, got kind={cfg.kind!r}")
    backend = Backend(backend)
    check_fp32_vector_access(d, c)
    maps = encode_maps(tensor_map_args_1d1d(cfg, a, sa, b, sb), backend)
    launch(cfg, maps, backend, a.device, rows=a.shape[0], d_f32=d.data_ptr(), c_f32=c.data_ptr(),
           ld_d=d.stride(-2), ld_c=c.stride(-2))


def launch_k_grouped(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                     d: torch.Tensor, c: torch.Tensor, ks_tensor: torch.Tensor, capacity_k: int,
                     backend: Backend | str) -> None:
    """``d[g] = c[g] + A_g . B_g^T`` for every group with the k-grouped kernel of an explicit ``cfg`` (``cfg.kind ==
    "k_grouped"``, ``cfg.num_groups`` groups) on validated tensors (flat e4m3 ``a`` / ``b`` of ``m * capacity_k`` /
    ``n * capacity_k`` elements, sA / sB ``[m|n, capacity_k/128]`` M-major TMA-aligned, ``d`` / ``c`` contiguous
    ``[G, m, n]`` fp32, ``c`` may be ``d``; ``capacity_k > 0``). Two launches on the current stream, no host
    read of ``ks_tensor``: the map builder (:mod:`.group_maps`) writes the per-group A_g / B_g maps from
    ``ks_tensor`` into a fresh device buffer, then the GEMM fences and uses them, so a captured CUDA graph
    replays correctly with new ``ks_tensor`` values (their sum at most ``capacity_k``, else the builder traps)."""
    if cfg.kind != "k_grouped" or ks_tensor.numel() != cfg.num_groups:
        raise ValueError(f"launch_k_grouped needs a k_grouped config of ks_tensor.numel()={ks_tensor.numel()} "
                         f"groups, got kind={cfg.kind!r} num_groups={cfg.num_groups}")
    backend = Backend(backend)
    check_fp32_vector_access(d, c)
    m, n = d.shape[1], d.shape[2]
    templates = tuple(encode_maps(group_maps.template_map_args(cfg, a, b, m, n), backend))
    maps_buffer = group_maps.build(cfg.num_groups, templates, a, b, m, n, ks_tensor, capacity_k, backend)
    unused = bytes(TENSOR_MAP_BYTES)  # the tma_a / tma_b slots: the per-group maps replace them
    maps = [unused, unused] + encode_maps(k_grouped_scale_map_args(cfg, sa, sb, m, n), backend)
    launch(cfg, maps, backend, d.device, grouped_layout=ks_tensor.data_ptr(), rows=m, d_f32=d.data_ptr(),
           c_f32=c.data_ptr(), ld_d=d.stride(-2), ld_c=c.stride(-2), group_maps=maps_buffer.data_ptr())


# ---------------------------------------------------------------------------------------------- kernels
@functools.lru_cache(maxsize=1024)
def checked_config(cfg: GemmConfig) -> GemmConfig:
    """``cfg`` after :func:`~deep_fp8_gemm.config.check_config` (once per config): every launch and load goes
    through it, so a forced config (tests, benchmarks: ``dataclasses.replace(cfg, split_k=S)``) that breaks a rule
    gets the rule's ``ValueError`` instead of the kernel's ``static_assert`` from NVRTC."""
    check_config(cfg)
    return cfg


@functools.lru_cache(maxsize=1024)
def cuda_kernel(cfg: GemmConfig, device: int):
    """Compiled (cached on disk) and loaded once per (config, device); configs that differ only in
    grid size share the binary through the compiler's and the driver's caches."""
    from ..runtime import driver
    from ..runtime.compiler import compile_kernel

    checked_config(cfg)

    compiled = compile_kernel(cfg.kernel_name(), render_source(cfg))
    return driver.load_kernel(compiled.cubin, compiled.name, device, key=compiled.key)


def num_sms_for(backend: Backend | str) -> int:
    """SMs (persistent CTAs at most) the heuristic plans for: the current device's for CUDA (or the
    :func:`~deep_fp8_gemm.set_num_sms` override), ``DFG_SIM_NUM_SMS`` for the simulator."""
    backend = Backend(backend)
    if backend is Backend.SIM:
        return env.sim_num_sms()
    if backend is Backend.CUDA:
        from ..utils import get_num_sms

        return get_num_sms()
    raise ValueError(f"a GEMM kernel launches on Backend.CUDA or Backend.SIM, got {backend}")
