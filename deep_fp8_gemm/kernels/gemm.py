"""Host side of the FP8 GEMM kernels: config -> source -> tensor maps + parameters -> launch.

One kernel template (``jit/fp8_gemm.cu``) serves the three kinds. This module turns validated tensors
into the kernel's single parameter struct (``dfg::GemmParams``) and launches it on an sm_90 GPU
(``backend="cuda"``) or in the CPU simulator (``backend="sim"``). The tensor maps are described once
as :class:`TensorMapSpec` and encoded by the driver or packed for the simulator, so both backends run
the same kernel with the same parameters.

Inputs arrive validated and normalised by ``deep_fp8_gemm.ops`` (dtypes, shapes, K-major operands,
16-byte alignment, sA M-major with TMA-aligned column stride).
"""

from __future__ import annotations

import functools
import struct
from typing import Iterable, Sequence

import torch

from .. import env
from ..config import BLOCK_K, GemmConfig, get_config
from ..runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from .wgmma_gen import wgmma_fp8_wrapper

TEMPLATE = "fp8_gemm.cu"
PARAMS_BYTES = 576  # sizeof(dfg::GemmParams), static_assert'ed in fp8_gemm.cuh
_PARAMS_TAIL = struct.Struct("<QQII")  # sb, grouped_layout, rows, reserved at offset 512
_PARAMS_FP32_OUT = struct.Struct("<QQII")  # 1D1D kind: d_f32, c_f32, ld_d, ld_c at offset 536
PARAMS_SPLIT_K_OFFSET = 560  # the kind-exclusive tail: k-grouped group_maps, or (dense split-K) the workspace
_PARAMS_GROUP_MAPS = struct.Struct("<Q")  # k-grouped kind: group_maps at offset 560
_PARAMS_SPLIT_K = struct.Struct("<QQ")  # split-K workspace: counters, partials at offset 560 (split_k.cuh)

# DeepSeek-V3 shapes (ANCHORS.md section 5): dense (N, K) and grouped (N, K).
DEEPSEEK_V3_DENSE = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (576, 7168))
DEEPSEEK_V3_GROUPED = ((4096, 7168), (7168, 2048))
DEFAULT_DENSE_MS = (1, 16, 64, 128, 256, 1024, 4096, 8192)
CONTIGUOUS_EXPERTS = ((4, 8192), (8, 4096), (32, 256))  # (experts, rows per expert)
MASKED_GROUPS = (4, 8, 32)
MASKED_EXPECTED_MS = (1, 32, 256, 1024)
# 1D1D (weight gradients of the dense layers above): dW [N, K] = dY^T . X, i.e. m = N (out features), n = K (in
# features), k = tokens; audited for the in-feature counts x 4096 tokens and the out-feature counts as m.
DEEPSEEK_V3_WGRAD = ((7168, 4096), (1536, 4096), (512, 4096), (16384, 4096), (2048, 4096))
WGRAD_MS = (576, 2112, 4096, 7168, 24576)
# k-grouped (MoE expert weight gradients): dW13 [2 x 2048, 7168] and dW2 [7168, 2048] of each local expert, i.e.
# (n, nominal k) shapes with n = 7168 / 2048 and ms = 4096 / 7168 (out features), for 8 and 32 local experts.
DEEPSEEK_V3_K_GROUPED = ((7168, 4096), (2048, 4096))
K_GROUPED_MS = (4096, 7168)
K_GROUPED_GROUPS = (8, 32)


# ---------------------------------------------------------------------------------------------- source
@functools.lru_cache(maxsize=1024)
def render_source(cfg: GemmConfig, simulator: bool = False) -> str:
    """The translation unit of ``cfg``'s kernel. The simulator build gets no PTX wrappers (its hal
    implements wgmma generically); everything else is the same text."""
    from ..runtime.render import render

    constants = dict(cfg.template_constants(), KERNEL_NAME=cfg.kernel_name())
    return render(TEMPLATE, constants, extra_code="" if simulator else wgmma_fp8_wrapper(cfg.block_n))


# ---------------------------------------------------------------------------------------------- tensor maps
MapArgs = tuple  # (dtype, address, dims, strides, box, swizzle): the fields of a TensorMapSpec, in order


def tensor_map_args(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, d: torch.Tensor
                    ) -> tuple[MapArgs, MapArgs, MapArgs, MapArgs]:
    """The four rank-3 tensor maps of ``dfg::GemmParams`` (dims innermost first), as plain tuples.

    Shapes: A ``[rows, k]`` or ``[G, rows, k]`` (masked) e4m3; sA M-major ``[rows, kb]`` / ``[G, rows, kb]``
    with ``stride(-2) == 1``; B ``[n, k]`` or ``[G, n, k]``; D ``[rows, n]`` / ``[G, rows, n]`` bf16.
    A 2-D operand gets a unit batch dimension (its batch stride is then never used). Plain tuples
    because this runs on every call: they hash and compare faster than spec objects.
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
    return (
        (TmaDtype.UINT8, a.data_ptr(), (k, rows, a_batch), (a_stride, a_batch_stride), (BLOCK_K, a_rows_per_load, 1),
         TmaSwizzle.B128),
        (TmaDtype.UINT8, b.data_ptr(), (k, n, b_batch), (b.stride(-2), b_batch_stride), (BLOCK_K, b_rows_per_load, 1),
         TmaSwizzle.B128),
        (TmaDtype.FLOAT32, sa.data_ptr(), (rows, kb, a_batch), (sa.stride(-1) * 4, sa_batch_stride),
         (cfg.block_m, 1, 1), TmaSwizzle.NONE),
        (TmaDtype.BFLOAT16, d.data_ptr(), (n, rows, a_batch), (d_stride * 2, d_batch_stride), (16, cfg.wg_rows, 1),
         TmaSwizzle.B32),
    )


def tensor_map_specs(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, d: torch.Tensor
                     ) -> list[TensorMapSpec]:
    """:func:`tensor_map_args` as validated-on-encode :class:`TensorMapSpec` objects."""
    return [TensorMapSpec(*args) for args in tensor_map_args(cfg, a, sa, b, d)]


def pack_params(maps: Iterable[bytes], sb: torch.Tensor | None, grouped_layout: torch.Tensor | None, rows: int,
                d_f32: torch.Tensor | None = None, c_f32: torch.Tensor | None = None, group_maps: int = 0,
                split_k_workspace: tuple[int, int] = (0, 0)) -> bytes:
    """Raw bytes of ``dfg::GemmParams``: four 128-byte tensor maps, then sb, grouped_layout, rows and (1D1D
    kinds) the fp32 D and C pointers and row strides, and at offset 560 either (k-grouped kind) the address of the
    per-group maps or (dense split-K) the workspace's counter and partial addresses
    (``deep_fp8_gemm.split_k.pointers``): a union in the struct, the two never go together."""
    head = b"".join(maps)
    if len(head) != 512:
        raise ValueError(f"expected four 128-byte tensor maps, got {len(head)} bytes")
    tail = _PARAMS_TAIL.pack(0 if sb is None else sb.data_ptr(),
                             0 if grouped_layout is None else grouped_layout.data_ptr(), rows, 0)
    if d_f32 is not None:
        tail += _PARAMS_FP32_OUT.pack(d_f32.data_ptr(), c_f32.data_ptr(), d_f32.stride(-2), c_f32.stride(-2))
    if group_maps and any(split_k_workspace):
        raise ValueError("group_maps (k-grouped kind) and split_k_workspace (dense) share offset 560: pass one")
    if group_maps or any(split_k_workspace):
        tail += bytes(PARAMS_SPLIT_K_OFFSET - 512 - len(tail))
        tail += _PARAMS_GROUP_MAPS.pack(group_maps) if group_maps else _PARAMS_SPLIT_K.pack(*split_k_workspace)
    return head + tail + bytes(PARAMS_BYTES - 512 - len(tail))


# ---------------------------------------------------------------------------------------------- 1D1D family
def tensor_map_args_1d1d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor
                         ) -> tuple[MapArgs, MapArgs, MapArgs, MapArgs]:
    """The 1D1D kernel's maps: A, B, sA as for the 1D2D kinds (2-D operands), and in the fourth slot sB: per-row
    scales of B, M-major ``[n, kb]`` with ``stride(-2) == 1`` and a TMA-aligned column stride, box BLOCK_N x 1
    (its D is fp32 and written without a tensor map)."""
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


def run_1d1d(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
             c: torch.Tensor, backend: str) -> None:
    """``d = c + (a, sa) . (b, sb)^T`` in fp32 with the 1D1D kernel of ``cfg`` (``cfg.kind == "1d1d"``). Inputs
    validated by ``deep_fp8_gemm.ops.gemm_1d1d`` (``c`` may be ``d``; both row-major with even row strides)."""
    if cfg.kind != "1d1d":
        raise ValueError(f"run_1d1d needs a 1d1d config, got kind={cfg.kind!r}")
    rows = a.shape[0]
    args = tensor_map_args_1d1d(cfg, a, sa, b, sb)
    if backend == "sim":
        from ..simulator import launch as sim_launch, pack_tensor_map

        params = pack_params([pack_tensor_map(TensorMapSpec(*x)) for x in args], None, None, rows, d, c)
        sim_launch(cfg.kernel_name(), render_source(cfg, simulator=True), params, grid=cfg.grid_size,
                   block=cfg.num_threads, cluster=cfg.cluster_size, smem_bytes=cfg.smem_bytes)
    elif backend == "cuda":
        from ..runtime import driver, target

        device = target.gpu_index(a.device)
        kernel = _cuda_kernel(cfg, device)
        params = pack_params([driver.tensor_map_cache.lookup(x, x) for x in args], None, None, rows, d, c)
        driver.launch(kernel, params, grid=cfg.grid_size, block=cfg.num_threads, cluster=cfg.cluster_size,
                      smem_bytes=cfg.smem_bytes, stream=target.current_stream(device))
    else:
        raise ValueError(f"backend must be 'cuda' or 'sim', got {backend!r}")


# ---------------------------------------------------------------------------------------------- k-grouped kind
#: Per-group K the k-grouped config is chosen for: the config (and so the binary) depends on m, n and G only, not on
#: the ks of a call (routing changes them every step; a new binary per step would compile mid-training).
K_GROUPED_NOMINAL_K = 4096
_TENSOR_MAP_BYTES = 128


def k_grouped_config(m: int, n: int, num_groups: int, num_sms: int) -> GemmConfig:
    return get_config(m, n, K_GROUPED_NOMINAL_K, num_groups, "k_grouped", num_sms)


def k_grouped_map_args(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor, m: int, n: int, ks: Sequence[int]
                       ) -> list[MapArgs | None]:
    """The 2G per-group maps (A_g at 2g, B_g at 2g + 1; None for an empty group): A_g ``[m, K_g]`` at byte
    ``m * sum(ks[:g])`` of the flat ``a``, row stride K_g bytes, box 128 x BLOCK_M, SW128; B_g likewise."""
    out: list[MapArgs | None] = []
    k_off = 0
    for k in ks:
        if k == 0:
            out += [None, None]
            continue
        out.append((TmaDtype.UINT8, a.data_ptr() + m * k_off, (k, m, 1), (k, m * k), (BLOCK_K, cfg.block_m, 1),
                    TmaSwizzle.B128))
        out.append((TmaDtype.UINT8, b.data_ptr() + n * k_off, (k, n, 1), (k, n * k), (BLOCK_K, cfg.block_n, 1),
                    TmaSwizzle.B128))
        k_off += k
    return out


def k_grouped_scale_map_args(cfg: GemmConfig, sa: torch.Tensor, sb: torch.Tensor, m: int, n: int
                             ) -> tuple[MapArgs, MapArgs]:
    """sA ``[m, sum(ks)/128]`` (the tma_sa slot) and sB ``[n, sum(ks)/128]`` (the tma_d slot, as in the 1D1D kind),
    both M-major TMA-aligned, boxes BLOCK_M x 1 / BLOCK_N x 1: one map each for every group."""
    kb = sa.shape[-1]
    return (
        (TmaDtype.FLOAT32, sa.data_ptr(), (m, kb, 1), (sa.stride(-1) * 4, sa.stride(-1) * 4 * kb), (cfg.block_m, 1, 1),
         TmaSwizzle.NONE),
        (TmaDtype.FLOAT32, sb.data_ptr(), (n, kb, 1), (sb.stride(-1) * 4, sb.stride(-1) * 4 * kb), (cfg.block_n, 1, 1),
         TmaSwizzle.NONE),
    )


def run_k_grouped(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                  d: torch.Tensor, c: torch.Tensor, ks: Sequence[int], ks_tensor: torch.Tensor, backend: str) -> None:
    """``d[g] = c[g] + A_g . B_g^T`` for every group with the k-grouped kernel of ``cfg`` (``cfg.kind ==
    "k_grouped"``, ``cfg.num_groups == len(ks)``). Inputs validated by ``deep_fp8_gemm.wgrad`` (flat e4m3 ``a`` /
    ``b``, sA / sB ``[m|n, sum(ks)/128]`` M-major TMA-aligned, ``d`` / ``c`` contiguous ``[G, m, n]`` fp32, ``c``
    may be ``d``; ``sum(ks) > 0``). The per-group maps go to a 64-byte-aligned array in the operands' memory
    (a CPU buffer for the simulator, a device copy for the GPU) that the kernel fences before use."""
    if cfg.kind != "k_grouped" or cfg.num_groups != len(ks):
        raise ValueError(f"run_k_grouped needs a k_grouped config of {len(ks)} groups, got kind={cfg.kind!r} "
                         f"num_groups={cfg.num_groups}")
    m, n = d.shape[1], d.shape[2]
    scale_maps = k_grouped_scale_map_args(cfg, sa, sb, m, n)
    group_args = k_grouped_map_args(cfg, a, b, m, n, ks)
    unused = bytes(_TENSOR_MAP_BYTES)  # the tma_a / tma_b slots: per-group maps replace them
    if backend == "sim":
        from ..simulator import launch as sim_launch, pack_tensor_map

        blob = b"".join(unused if x is None else pack_tensor_map(TensorMapSpec(*x)) for x in group_args)
        storage = torch.zeros(len(blob) + 64, dtype=torch.uint8)
        start = -storage.data_ptr() % 64
        group_maps = storage[start:start + len(blob)]
        group_maps.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        maps = [unused, unused] + [pack_tensor_map(TensorMapSpec(*x)) for x in scale_maps]
        params = pack_params(maps, None, ks_tensor, m, d, c, group_maps.data_ptr())
        sim_launch(cfg.kernel_name(), render_source(cfg, simulator=True), params, grid=cfg.grid_size,
                   block=cfg.num_threads, cluster=cfg.cluster_size, smem_bytes=cfg.smem_bytes)
    elif backend == "cuda":
        from ..runtime import driver, target

        device = target.gpu_index(d.device)
        kernel = _cuda_kernel(cfg, device)
        blob = b"".join(unused if x is None else driver.tensor_map_cache.lookup(x, x) for x in group_args)
        # A stream-ordered copy into a fresh caching-allocator block (>= 512-byte aligned); the block is reused only
        # by later work on this stream, after the kernel.
        group_maps = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(d.device)
        maps = [unused, unused] + [driver.tensor_map_cache.lookup(x, x) for x in scale_maps]
        params = pack_params(maps, None, ks_tensor, m, d, c, group_maps.data_ptr())
        driver.launch(kernel, params, grid=cfg.grid_size, block=cfg.num_threads, cluster=cfg.cluster_size,
                      smem_bytes=cfg.smem_bytes, stream=target.current_stream(device))
    else:
        raise ValueError(f"backend must be 'cuda' or 'sim', got {backend!r}")


# ---------------------------------------------------------------------------------------------- launch
def problem_config(kind: str, a: torch.Tensor, b: torch.Tensor, expected_m: int | None, num_sms: int) -> GemmConfig:
    n, k = b.shape[-2], b.shape[-1]
    if kind == "dense":
        return get_config(a.shape[0], n, k, 1, "dense", num_sms)
    if kind == "contiguous":
        return get_config(a.shape[0], n, k, b.shape[0], "contiguous", num_sms)
    if kind == "psum":  # expected_m: rows per group hint (the buffer may be far larger than its rows in use)
        m_sum = a.shape[0] if expected_m is None else min(a.shape[0], int(expected_m) * b.shape[0])
        return get_config(max(m_sum, 1), n, k, b.shape[0], "psum", num_sms)
    return get_config(int(expected_m), n, k, b.shape[0], "masked", num_sms)


def launch(kind: str, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
           grouped_layout: torch.Tensor | None = None, expected_m: int | None = None, backend: str = "cuda") -> None:
    """Run the GEMM kernel of ``kind`` ("dense" | "contiguous" | "masked" | "psum") on validated tensors.

    ``backend="cuda"``: sm_90 GPU, on ``torch.cuda.current_stream()``, with ``get_num_sms()`` CTAs at
    most. ``backend="sim"``: CPU tensors, through the CPU simulator with ``DFG_SIM_NUM_SMS`` CTAs.
    """
    run(problem_config(kind, a, b, expected_m, num_sms_for(backend)), a, sa, b, sb, d, grouped_layout, backend)


def num_sms_for(backend: str) -> int:
    """SMs (persistent CTAs at most) the heuristic plans for: the current device's for ``"cuda"``,
    ``DFG_SIM_NUM_SMS`` for ``"sim"``."""
    if backend == "sim":
        return env.sim_num_sms()
    if backend == "cuda":
        from ..utils import get_num_sms

        return get_num_sms()
    raise ValueError(f"backend must be 'cuda' or 'sim', got {backend!r}")


def run(cfg: GemmConfig, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
        grouped_layout: torch.Tensor | None, backend: str) -> None:
    """Run the kernel of an explicit ``cfg`` (tests and benchmarks force configs through this)."""
    rows = a.shape[-2]
    if backend == "sim":
        _launch_sim(cfg, a, sa, b, sb, d, grouped_layout, rows)
    else:
        _launch_cuda(cfg, a, sa, b, sb, d, grouped_layout, rows)


def _launch_sim(cfg, a, sa, b, sb, d, grouped_layout, rows) -> None:
    from ..simulator import launch as sim_launch, pack_tensor_map, ptxas_registers

    from .. import split_k

    maps = [pack_tensor_map(s) for s in tensor_map_specs(cfg, a, sa, b, d)]
    params = pack_params(maps, sb, grouped_layout, rows, split_k_workspace=split_k.pointers(cfg, rows, a.device))
    # The launch register count of the sm_90a build of the same kernel: the simulator accounts setmaxnreg
    # against that pool.
    registers = ptxas_registers(cfg.kernel_name(), render_source(cfg))
    sim_launch(cfg.kernel_name(), render_source(cfg, simulator=True), params, grid=cfg.grid_size,
               block=cfg.num_threads, cluster=cfg.cluster_size, smem_bytes=cfg.smem_bytes, registers=registers)


@functools.lru_cache(maxsize=1024)
def _cuda_kernel(cfg: GemmConfig, device: int):
    """Compiled (cached on disk) and loaded once per (config, device); configs that differ only in
    grid size share the binary through the compiler's and the driver's caches."""
    from ..runtime import driver
    from ..runtime.compiler import compile_kernel

    compiled = compile_kernel(cfg.kernel_name(), render_source(cfg))
    return driver.load_kernel(compiled.cubin, compiled.name, device, key=compiled.key)


def _launch_cuda(cfg, a, sa, b, sb, d, grouped_layout, rows) -> None:
    from ..runtime import driver, target

    device = target.gpu_index(a.device)
    kernel = _cuda_kernel(cfg, device)
    # Keyed by the argument tuples: weights always hit, activations whenever the caching allocator hands
    # back the same address; no spec objects are built on a hit.
    maps = [driver.tensor_map_cache.lookup(args, args) for args in tensor_map_args(cfg, a, sa, b, d)]
    stream = target.current_stream(device)
    workspace = (0, 0)
    if cfg.split_k > 1:
        from .. import split_k

        workspace = split_k.pointers(cfg, rows, a.device, stream)
    params = pack_params(maps, sb, grouped_layout, rows, split_k_workspace=workspace)
    driver.launch(kernel, params, grid=cfg.grid_size, block=cfg.num_threads, cluster=cfg.cluster_size,
                  smem_bytes=cfg.smem_bytes, stream=stream)


# ---------------------------------------------------------------------------------------------- audit
def audit_targets(kind: str, shapes: Sequence[tuple[int, int]] | None = None, ms: Sequence[int] | None = None,
                  num_sms: int = 132, num_groups: int | None = None) -> list:
    """Every distinct kernel the heuristic picks for ``kind`` over shapes x M (deduplicated by binary).

    dense: ``ms`` are row counts (default 1..8192); contiguous: ``ms`` are rows per expert (default
    the DeepSeek-V3 pairs of experts x rows); masked: ``ms`` are expected rows per group.
    """
    from ..runtime.audit import AuditTarget

    if kind not in ("dense", "contiguous", "masked", "psum", "1d1d", "k_grouped"):
        raise ValueError(f"kind must be dense, contiguous, masked, psum, 1d1d or k_grouped, got {kind!r}")
    default_shapes = {"dense": DEEPSEEK_V3_DENSE, "1d1d": DEEPSEEK_V3_WGRAD,
                      "k_grouped": DEEPSEEK_V3_K_GROUPED}.get(kind, DEEPSEEK_V3_GROUPED)
    shapes = tuple(shapes) if shapes else default_shapes
    configs: list[GemmConfig] = []
    for n, k in shapes:
        if kind in ("dense", "1d1d"):
            for m in ms or (DEFAULT_DENSE_MS if kind == "dense" else WGRAD_MS):
                configs.append(get_config(m, n, k, 1, kind, num_sms))
        elif kind == "k_grouped":  # k: the nominal per-group K of the cost model (the binary has none)
            for g in ([num_groups] if num_groups else K_GROUPED_GROUPS):
                for m in ms or K_GROUPED_MS:
                    configs.append(get_config(m, n, k, g, kind, num_sms))
        elif kind in ("contiguous", "psum"):
            pairs = [(num_groups, m) for m in ms] if (ms and num_groups) else \
                [(g, m) for g, m in CONTIGUOUS_EXPERTS] if not ms else [(g, m) for g, _ in CONTIGUOUS_EXPERTS for m in ms]
            for g, m in pairs:
                configs.append(get_config(g * m, n, k, g, kind, num_sms))
        else:
            for g in ([num_groups] if num_groups else MASKED_GROUPS):
                for m in ms or MASKED_EXPECTED_MS:
                    configs.append(get_config(m, n, k, g, "masked", num_sms))
    targets, seen = [], set()
    for cfg in configs:
        name = cfg.kernel_name()
        if name in seen:
            continue
        seen.add(name)
        targets.append(AuditTarget(kind=kind, config=cfg.as_dict(), name=name, source=render_source(cfg)))
    return targets
