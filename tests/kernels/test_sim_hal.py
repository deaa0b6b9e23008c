"""Functional tests of the simulator's hardware layer with small kernels (tests/sim_kernels/) on the CPU.

TMA boxes (out-of-bounds fill, each swizzle, store clipping, multicast) are compared with a NumPy model whose
swizzle is pycute's ``Swizzle<B,4,3>``; conversions with torch; a miniature warp-specialized GEMM (TMA
producer, two math warpgroups, mbarrier ring) with torch's A . B^T read back through CuTe's CLayout_64xN.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
# pycute ships with nvidia-cutlass, which GPU machines may lack: skip this module there instead of breaking
# the collection of the whole run (a module-level ImportError aborts `pytest -m gpu tests`).
Swizzle = pytest.importorskip("pycute", reason="pycute (nvidia-cutlass) is not installed").Swizzle

from deep_fp8_gemm.runtime.tensor_map import TmaSwizzle
from deep_fp8_gemm.simulator import FLAG_EXACT_MMA, pack_tensor_map
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec, TmaDtype
from tests import sim_kernels
from tests.sim_kernels import tensor_map_3d, tensor_map_field
from tests.kernels.test_sim_groundtruth import fragment_coords


# ---------------------------------------------------------------- model of a TMA box
def box_values(src: torch.Tensor, box: tuple[int, int, int], coord: tuple[int, int, int]) -> torch.Tensor:
    """The box at `coord` (innermost first) of `src` [d2, d1, d0], zeros where out of bounds: [b2, b1, b0]."""
    b0, b1, b2 = box
    out = torch.zeros((b2, b1, b0), dtype=src.dtype)
    d2, d1, d0 = src.shape
    z = torch.arange(b2) + coord[2]
    y = torch.arange(b1) + coord[1]
    x = torch.arange(b0) + coord[0]
    zi, yi, xi = ((v >= 0) & (v < d) for v, d in ((z, d2), (y, d1), (x, d0)))
    out[zi.nonzero()[:, 0][:, None, None], yi.nonzero()[:, 0][None, :, None], xi.nonzero()[:, 0][None, None, :]] = src[
        z[zi][:, None, None], y[yi][None, :, None], x[xi][None, None, :]
    ]
    return out


def smem_image(values: torch.Tensor, swizzle: TmaSwizzle, dst_offset: int) -> np.ndarray:
    """Shared memory after a TMA load of `values` at `dst_offset`: rows packed, 16-byte chunks swizzled."""
    linear = values.contiguous().view(torch.uint8).numpy().reshape(-1)
    span = swizzle.span_bytes
    footprint = -(-linear.size // span) * span if span else linear.size
    image = np.full(footprint, 0xFF, dtype=np.uint8)
    f = Swizzle(int(swizzle), 4, 3)
    for chunk in range(0, linear.size, 16):
        phys = f(dst_offset + chunk) - dst_offset
        image[phys : phys + 16] = linear[chunk : chunk + 16]
    return image


class TmaParams(ctypes.Structure):
    _fields_ = [
        ("load_map", ctypes.c_uint8 * 128),
        ("store_map", ctypes.c_uint8 * 128),
        ("smem_dump", ctypes.c_void_p),
        ("load_coord", ctypes.c_int32 * 3),
        ("store_coord", ctypes.c_int32 * 3),
        ("dst_offset", ctypes.c_uint32),
        ("box_bytes", ctypes.c_uint32),
        ("dump_bytes", ctypes.c_uint32),
        ("multicast_mask", ctypes.c_uint32),
        ("store", ctypes.c_uint32),
    ]


def random_tensor(shape, dtype, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 255, shape, dtype=torch.uint8, generator=g)  # 0xFF never appears: not poison
    return torch.randn(shape, generator=g).to(dtype)


# (dtype, global shape [d2, d1, d0], box (b0, b1, b2), swizzle, load coord, store coord)
TMA_CASES = [
    (torch.uint8, (3, 70, 160), (128, 16, 2), TmaSwizzle.B128, (-16, 60, 1), (40, -3, 2)),
    (torch.uint8, (2, 40, 128), (128, 8, 1), TmaSwizzle.B128, (0, 0, 0), (0, 36, 0)),
    (torch.bfloat16, (2, 33, 48), (32, 8, 2), TmaSwizzle.B64, (24, -2, 0), (-8, 30, 1)),
    (torch.bfloat16, (1, 20, 64), (64, 16, 1), TmaSwizzle.B128, (0, 10, 0), (0, 0, 0)),
    (torch.float32, (2, 9, 12), (8, 4, 3), TmaSwizzle.B32, (8, 7, -1), (4, 6, 0)),
    (torch.uint8, (1, 10, 48), (48, 4, 1), TmaSwizzle.NONE, (16, 8, 0), (32, 9, 0)),
]


@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[3].name}-{c[1]}")
def test_tma_load_oob_fill_swizzle_and_store_clipping(case):
    dtype, shape, box, swizzle, coord, store_coord = case
    src = random_tensor(shape, dtype)
    dst = torch.full(shape, 7, dtype=dtype)
    dst_offset = 2048
    values = box_values(src, box, coord)
    expected = smem_image(values, swizzle, dst_offset)

    dump = torch.zeros(expected.size, dtype=torch.uint8)
    p = TmaParams(
        tensor_map_field(tensor_map_3d(src, box, swizzle)),
        tensor_map_field(tensor_map_3d(dst, box, swizzle)),
        dump.data_ptr(),
        (ctypes.c_int32 * 3)(*coord),
        (ctypes.c_int32 * 3)(*store_coord),
        dst_offset,
        values.numel() * values.element_size(),
        expected.size,
        0,
        1,
    )
    sim_kernels.run("tma_copy", p, grid=1, block=128, cluster=1, smem_bytes=dst_offset + expected.size)
    np.testing.assert_array_equal(dump.numpy(), expected)

    # The store writes the box back at store_coord, in-bounds elements only.
    window = torch.full(shape, 7, dtype=dtype)
    b0, b1, b2 = box
    for z in range(b2):
        for y in range(b1):
            gz, gy = z + store_coord[2], y + store_coord[1]
            if not (0 <= gz < shape[0] and 0 <= gy < shape[1]):
                continue
            x_lo, x_hi = max(0, -store_coord[0]), min(b0, shape[2] - store_coord[0])
            if x_lo < x_hi:
                window[gz, gy, x_lo + store_coord[0] : x_hi + store_coord[0]] = values[z, y, x_lo:x_hi]
    assert torch.equal(dst.view(torch.uint8) if dtype == torch.uint8 else dst, window)


@pytest.mark.parametrize("grid", [2, 4])
def test_tma_multicast_writes_and_signals_every_cta_of_the_cluster(grid):
    src = random_tensor((1, 64, 128), torch.uint8, seed=3)
    box, coord, dst_offset = (128, 32, 1), (0, 16, 0), 1024
    expected = smem_image(box_values(src, box, coord), TmaSwizzle.B128, dst_offset)
    dump = torch.zeros((grid, expected.size), dtype=torch.uint8)
    blob = tensor_map_field(tensor_map_3d(src, box, TmaSwizzle.B128))
    p = TmaParams(blob, blob, dump.data_ptr(), (ctypes.c_int32 * 3)(*coord), (ctypes.c_int32 * 3)(),
                  dst_offset, 128 * 32, expected.size, 0b11, 0)
    sim_kernels.run("tma_copy", p, grid=grid, block=128, cluster=2, smem_bytes=dst_offset + expected.size)
    for cta in range(grid):
        np.testing.assert_array_equal(dump[cta].numpy(), expected, err_msg=f"cta {cta}")


def test_pack_tensor_map_layout_and_validation():
    t = torch.zeros((4, 32, 64), dtype=torch.bfloat16)
    blob = tensor_map_3d(t, (64, 8, 1), TmaSwizzle.B128)
    assert len(blob) == 128
    fields = np.frombuffer(blob[:24], dtype=np.uint32)
    assert list(fields) == [0x54474644, 3, int(TmaDtype.BFLOAT16), 3, 3, 0]
    assert np.frombuffer(blob[24:32], dtype=np.uint64)[0] == t.data_ptr()
    assert list(np.frombuffer(blob[32:72], dtype=np.uint64)) == [64, 32, 4, 0, 0]
    assert list(np.frombuffer(blob[72:104], dtype=np.uint64)) == [128, 128 * 32, 0, 0]
    assert list(np.frombuffer(blob[104:128], dtype=np.uint16)) == [64, 8, 1] + [0] * 9
    with pytest.raises(ValueError, match="swizzle span"):
        pack_tensor_map(TensorMapSpec(TmaDtype.BFLOAT16, t.data_ptr(), (64, 32, 4), (128, 4096), (128, 8, 1),
                                      TmaSwizzle.B128))


class ProbeParams(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("inp", "out_idx", "out_bf16", "out_e4m3", "out_sync")]


def test_indices_conversions_and_synchronisation():
    grid, block = 4, 128
    n = grid * block
    special = torch.tensor([0.0, -0.0, 448.0, 449.0, 464.0, 465.0, 1e6, -1e6, float("inf"), -float("inf"),
                            float("nan"), 2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-7 * 1.0625, 17.0, 18.0, 19.0,
                            1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.0e-39, 65504.0])
    g = torch.Generator().manual_seed(5)
    inp = torch.randn(2 * n, generator=g) * torch.logspace(-4, 3, 2 * n)
    inp[: special.numel()] = special
    out_idx = torch.zeros((grid, block, 6), dtype=torch.int32)
    out_bf16 = torch.zeros(n, dtype=torch.int32)
    out_e4m3 = torch.zeros(n, dtype=torch.int16)
    out_sync = torch.zeros((grid, 4), dtype=torch.int32)
    p = ProbeParams(inp.data_ptr(), out_idx.data_ptr(), out_bf16.data_ptr(), out_e4m3.data_ptr(), out_sync.data_ptr())
    sim_kernels.run("hal_probe", p, grid=grid, block=block, cluster=2, smem_bytes=1024)

    t = torch.arange(block)
    for b in range(grid):
        expected = torch.stack([t, t // 32, t % 32, torch.full_like(t, b), torch.full_like(t, grid),
                                torch.full_like(t, b % 2)], dim=1)
        assert torch.equal(out_idx[b].long(), expected)
    assert out_sync.tolist() == [[1000 + b, 1, 2, 3] for b in range(grid)]

    # cvt.rn.satfinite.e4m3x2: RNE, finite values saturate to +-448, NaN stays NaN.
    ref_e4m3 = inp.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).view(n, 2).long()
    got = out_e4m3.view(torch.uint8).view(n, 2).long()  # little endian: lo byte first
    assert torch.equal(got, ref_e4m3)
    # cvt.rn.bf16x2: RNE; NaN compared as NaN.
    ref_bf16 = inp.to(torch.bfloat16).view(n, 2)
    got_bf16 = out_bf16.view(torch.bfloat16).view(n, 2)
    assert torch.equal(got_bf16.isnan(), ref_bf16.isnan())
    finite = ~ref_bf16.isnan()
    assert torch.equal(got_bf16[finite].view(torch.int16), ref_bf16[finite].view(torch.int16))


# ---------------------------------------------------------------- the miniature GEMM
class GemmParams(ctypes.Structure):
    _fields_ = [
        ("map_a", ctypes.c_uint8 * 128),
        ("map_b", ctypes.c_uint8 * 128),
        ("out", ctypes.c_void_p),
        ("n_blocks", ctypes.c_uint32),
        ("k_blocks", ctypes.c_uint32),
        ("block_n", ctypes.c_uint32),
        ("operand", ctypes.c_uint32),
    ]


MINI_OPERANDS = {torch.float8_e4m3fn: 0, torch.bfloat16: 1, torch.float32: 2}  # float32: read as tf32


def run_mini_gemm(m: int, n: int, k: int, block_n: int, seed: int = 0, dtype: torch.dtype = torch.float8_e4m3fn
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn((m, k), generator=g) * 2).to(dtype)
    b = (torch.randn((n, k), generator=g) * 2).to(dtype)
    if dtype == torch.float32:  # the values a tf32 operand holds (numerics.hpp: the low 13 bits are ignored)
        a, b = ((t.view(torch.int32) & ~0x1FFF).view(torch.float32) for t in (a, b))
    box_k = 128  # a K block is 128 bytes of K per row (the maps address the operands as bytes)
    m_blocks, n_blocks, k_blocks = -(-m // 128), -(-n // block_n), k * a.element_size() // box_k
    grid = m_blocks * n_blocks
    out = torch.full((grid, 2, 128, block_n // 2), float("nan"))
    p = GemmParams(
        tensor_map_field(tensor_map_3d(a.view(torch.uint8), (box_k, 128, 1), TmaSwizzle.B128)),
        tensor_map_field(tensor_map_3d(b.view(torch.uint8), (box_k, block_n, 1), TmaSwizzle.B128)),
        out.data_ptr(), n_blocks, k_blocks, block_n, MINI_OPERANDS[dtype],
    )
    smem = 1024 + 2 * 128 * 128 + 2 * block_n * 128
    # FP8: exact fp32 accumulation: this checks layouts against torch; the tensor-core model (13-bit accumulator)
    # has its own tests (tests/kernels/test_sim_tensor_core.py). BF16 / TF32 run the fp32 tensor-core model.
    flags = FLAG_EXACT_MMA if dtype == torch.float8_e4m3fn else 0
    sim_kernels.run("mini_gemm", p, grid=grid, block=384, cluster=1, smem_bytes=smem, flags=flags)

    rows, cols = (torch.from_numpy(x) for x in fragment_coords(block_n))
    d = torch.full((m_blocks * 128, n_blocks * block_n), float("nan"))
    for blk in range(grid):
        mb, nb = divmod(blk, n_blocks)
        for wg in range(2):
            d[mb * 128 + 64 * wg + rows, nb * block_n + cols] = out[blk, wg]
    return d[:m, :n], a.double() @ b.double().T


@pytest.mark.parametrize(
    "m, n, k, block_n",
    [(128, 8, 128, 8), (100, 24, 384, 24), (128, 256, 256, 256), (256, 256, 512, 128)],
)
def test_mini_gemm_matches_torch(m, n, k, block_n):
    d, ref = run_mini_gemm(m, n, k, block_n)
    torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m, n, k, block_n", [(100, 24, 256, 24), (128, 64, 512, 64)])
def test_mini_gemm_bf16_and_tf32_through_tma_match_float64(dtype, m, n, k, block_n):
    """BF16 / TF32 operands through TMA (128-byte swizzle, a 128-byte K block per stage), WgmmaBf16 / WgmmaTf32 over
    its four 32-byte slices and the fp32 tensor-core model: within fp32 accumulation of float64 (issue 41)."""
    d, ref = run_mini_gemm(m, n, k, block_n, dtype=dtype)
    x, y = d.double(), ref
    assert float(1 - 2 * (x * y).sum() / (x * x + y * y).sum()) <= 1e-6
    torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-3)
