"""Host side of the k-grouped GEMM's map builder (``include/deep_fp8_gemm/kernels/group_maps.cuh``).

The k-grouped kernel reads one A_g and one B_g tensor map per group from global memory; their addresses, K
extents and strides depend on the group sizes. Building them on the host needs the sizes' values and a copy to
the device per call (a host sync, and nothing a CUDA graph could replay with new sizes). Instead a small kernel,
launched on the same stream just before the GEMM, builds them on the device from ``ks_tensor``: the host only
encodes two template maps (operand addresses, boxes and swizzle; cached by the driver's encode cache like every
other map) and allocates the 2G-map buffer from torch's caching allocator (stream-ordered; under graph capture
from the capture's pool, so each captured call owns its buffer for the graph's life).

One binary serves every config (the boxes come with the templates): :func:`kernel_name`.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from ..config import BLOCK_K, GemmConfig
from ..utils import PROCESS_SETTINGS
from ..runtime.target import Backend
from ..runtime.tensor_map import TmaDtype, TmaSwizzle

TEMPLATE = "group_maps.cu"
TENSOR_MAP_BYTES = 128
WARPS = 8  # dfg::group_maps::kWarps: one map per warp
NUM_THREADS = 32 * WARPS
SMEM_BYTES = WARPS * TENSOR_MAP_BYTES + 2 * NUM_THREADS * 8  # staging slots + the scan's two u64 buffers
#: The map buffer's alignment: cuTensorMapEncodeTiled needs 64 bytes; the PTX ISA's tensormap.cp_fenceproxy example
#: aligns its global maps to 128 (the caching allocator's blocks are 512-byte aligned anyway).
MAP_ALIGNMENT = 128


class GroupMapParams(ctypes.Structure):
    """Byte image of ``dfg::group_maps::Params`` (320 bytes; the header ``static_assert``s these offsets)."""

    _fields_ = [
        ("a_template", ctypes.c_ubyte * TENSOR_MAP_BYTES),  # 0
        ("b_template", ctypes.c_ubyte * TENSOR_MAP_BYTES),  # 128
        ("a", ctypes.c_uint64),                              # 256
        ("b", ctypes.c_uint64),                              # 264
        ("ks", ctypes.c_uint64),                             # 272
        ("maps", ctypes.c_uint64),                           # 280
        ("num_groups", ctypes.c_uint32),                     # 288
        ("rows", ctypes.c_uint32),                           # 292
        ("n", ctypes.c_uint32),                              # 296
        ("capacity_k", ctypes.c_uint32),                     # 300
        ("_pad", ctypes.c_ubyte * 16),                       # to 320 (alignas(64) TensorMap)
    ]


assert ctypes.sizeof(GroupMapParams) == 320 and GroupMapParams.capacity_k.offset == 300


def kernel_name() -> str:
    return "dfg_k_grouped_maps"


@functools.lru_cache(maxsize=2)
def render_source(simulator: bool = False) -> str:
    """The builder's translation unit (the same text for both builds: it has no generated wrappers)."""
    from ..runtime.render import render

    del simulator
    return render(TEMPLATE, {"KERNEL_NAME": kernel_name()})


def template_map_args(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor, m: int, n: int) -> tuple:
    """The two template maps (A, B): rank 3, dims (128, m | n, 1), box (128, BLOCK_M | BLOCK_N, 1), SW128; the
    builder replaces the address, K extent and both strides per group."""
    return (
        (TmaDtype.UINT8, a.data_ptr(), (BLOCK_K, m, 1), (BLOCK_K, m * BLOCK_K), (BLOCK_K, cfg.block_m, 1),
         TmaSwizzle.B128),
        (TmaDtype.UINT8, b.data_ptr(), (BLOCK_K, n, 1), (BLOCK_K, n * BLOCK_K), (BLOCK_K, cfg.block_n, 1),
         TmaSwizzle.B128),
    )


def map_buffer(num_groups: int, device: torch.device, backend: Backend) -> torch.Tensor:
    """A uint8 buffer for the 2G maps, :data:`MAP_ALIGNMENT`-aligned: a slice of a slightly larger allocation (the
    caching allocator's blocks are 512-byte aligned already, a CPU tensor's need not be)."""
    size = 2 * num_groups * TENSOR_MAP_BYTES
    alloc = torch.zeros if backend is Backend.SIM else torch.empty
    storage = alloc(size + MAP_ALIGNMENT, dtype=torch.uint8, device=device)
    start = -storage.data_ptr() % MAP_ALIGNMENT
    return storage[start:start + size]


def build(num_groups: int, templates: tuple[bytes, bytes], a: torch.Tensor, b: torch.Tensor, m: int, n: int,
          ks_tensor: torch.Tensor, capacity_k: int, backend: Backend) -> torch.Tensor:
    """Launch the builder for ``num_groups`` groups on validated operands: ``templates`` the encoded
    :func:`template_map_args` (A, B), the flat ``a`` / ``b`` hold ``m * capacity_k`` / ``n * capacity_k`` bytes,
    ``ks_tensor`` int32 ``[G]`` on their device. Returns the map buffer (A_g at map 2g, B_g at 2g + 1), written
    by the builder on the current stream (or, in the simulator, before this returns); the caller keeps it alive
    until the GEMM that reads it has been enqueued (the caching allocator then frees it in stream order)."""
    maps = map_buffer(num_groups, a.device, backend)
    a_template, b_template = templates
    params = GroupMapParams(a=a.data_ptr(), b=b.data_ptr(), ks=ks_tensor.data_ptr(), maps=maps.data_ptr(),
                            num_groups=num_groups, rows=m, n=n, capacity_k=capacity_k)
    ctypes.memmove(params.a_template, a_template, TENSOR_MAP_BYTES)
    ctypes.memmove(params.b_template, b_template, TENSOR_MAP_BYTES)
    grid = -(-2 * num_groups // WARPS)
    if backend is Backend.SIM:
        from ..simulator import launch as sim_launch

        sim_launch(kernel_name(), render_source(simulator=True), bytes(params), grid=grid, block=NUM_THREADS,
                   cluster=1, smem_bytes=SMEM_BYTES, programmatic=PROCESS_SETTINGS.pdl)
    elif backend is Backend.CUDA:
        from ..runtime import driver, target

        index = target.gpu_index(a.device)
        driver.launch(cuda_kernel(index), params, grid=grid, block=NUM_THREADS, smem_bytes=SMEM_BYTES,
                      stream=target.current_stream(index), pdl=PROCESS_SETTINGS.pdl)
    else:
        raise ValueError(f"the map builder launches on Backend.CUDA or Backend.SIM, got {backend}")
    return maps


@functools.lru_cache(maxsize=16)
def cuda_kernel(device: int):
    """The builder compiled (JIT cache) and loaded on GPU ``device``."""
    from ..runtime import driver
    from ..runtime.compiler import compile_kernel

    compiled = compile_kernel(kernel_name(), render_source())
    return driver.load_kernel(compiled.cubin, compiled.name, device, key=compiled.key)


def audit_target():
    """The builder as a :class:`deep_fp8_gemm.runtime.audit.AuditTarget` (kind ``"k_grouped"``): spill-free, with
    the tensormap-edit SASS present."""
    from ..runtime.audit import AuditTarget

    return AuditTarget(kind="k_grouped", config={"kernel": "group_maps", "num_threads": NUM_THREADS,
                                                  "smem_bytes": SMEM_BYTES},
                       name=kernel_name(), source=render_source(), required_sass=REQUIRED_SASS)


#: Opcodes the builder's SASS must contain: ptxas (NVRTC 13.5) lowers tensormap.replace on a shared-memory map to
#: plain shared stores and tensormap.cp_fenceproxy to one 4-byte strong GPU-scope exchange per lane (ATOMG.E.EXCH
#: .STRONG.GPU: the 128-byte copy and the release); ELECT is the lane that replaces the fields.
REQUIRED_SASS: tuple[str, ...] = ("ATOMG", "ELECT", "ACQBULK")
