"""Small kernels written against ``dfg::hal`` for the simulator tests, and the helpers to run them."""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

from deep_fp8_gemm.runtime.render import render_string
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from deep_fp8_gemm.simulator import launch, pack_tensor_map

DIRECTORY = Path(__file__).resolve().parent
TORCH_TO_TMA = {"uint8": TmaDtype.UINT8, "float8_e4m3fn": TmaDtype.UINT8, "bfloat16": TmaDtype.BFLOAT16,
                "float32": TmaDtype.FLOAT32}


def source(stem: str) -> tuple[str, str]:
    """(kernel name, rendered translation unit) of ``tests/sim_kernels/<stem>.cu``."""
    template = (DIRECTORY / f"{stem}.cu").read_text()
    name = f"sim_{stem}_{hashlib.sha256(template.encode()).hexdigest()[:12]}"
    return name, render_string(template, {"KERNEL_NAME": name}, origin=stem)


def run(stem: str, params: ctypes.Structure, **launch_args) -> None:
    """Builds (cached) and launches a test kernel with the ctypes parameter struct ``params``."""
    name, src = source(stem)
    launch(name, src, bytes(params), **launch_args)


def tensor_map_3d(t, box: tuple[int, int, int], swizzle: TmaSwizzle = TmaSwizzle.NONE) -> bytes:
    """Packed map of a contiguous CPU tensor of rank <= 3 (innermost dimension last, as torch orders them)."""
    shape = (1,) * (3 - t.dim()) + tuple(t.shape)
    es = t.element_size()
    spec = TensorMapSpec(
        dtype=TORCH_TO_TMA[str(t.dtype).removeprefix("torch.")],
        global_address=t.data_ptr(),
        global_dims=(shape[2], shape[1], shape[0]),
        global_strides=(shape[2] * es, shape[2] * shape[1] * es),
        box_dims=box,
        swizzle=swizzle,
    )
    return pack_tensor_map(spec)


def tensor_map_field(blob: bytes):
    """A ctypes TensorMap (128 bytes) holding ``blob``."""
    field = (ctypes.c_uint8 * 128)()
    ctypes.memmove(field, blob, 128)
    return field
