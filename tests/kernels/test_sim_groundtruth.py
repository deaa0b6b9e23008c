"""The simulator's hardware layouts against CuTe's own definitions (pycute; cute/ headers in nvidia-cutlass).

Ground truth, not the kernels' assumptions:
* wgmma descriptors: A and B are laid out in shared memory with CuTe's K-major atoms
  (``GMMA::Layout_K_{INTER,SW32,SW64,SW128}_Atom``, cute/atom/mma_traits_sm90_gmma.hpp) tiled over the operand,
  and one descriptor per k32 slice is built as ``make_gmma_desc<Major::K>`` does; the simulated wgmma must
  then compute A . B^T exactly.
* accumulator fragments are read back through ``GMMA::CLayout_64xN``.
* stmatrix: ``Copy_Traits<SM90_U32x4_STSM_N>`` (cute/atom/copy_traits_sm90.hpp, via SM75_U32x4_LDSM_N).
TMA swizzles are checked against ``pycute.Swizzle`` in tests/kernels/test_sim_hal.py.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest
import torch
# pycute ships with nvidia-cutlass, which GPU machines may lack: skip this module there instead of breaking
# the collection of the whole run (a module-level ImportError aborts `pytest -m gpu tests`).
pycute = pytest.importorskip("pycute", reason="pycute (nvidia-cutlass) is not installed")
Layout, Swizzle, logical_product = pycute.Layout, pycute.Swizzle, pycute.logical_product

from deep_fp8_gemm.simulator import FLAG_EXACT_MMA
from tests import sim_kernels

# K-major atoms for 8-bit elements: (Swizzle bits B, atom row width in bytes); the *_Atom_Bits layouts
# (8, W*8 bits):(W*8, 1) upcast to bytes.
ATOMS = {"INTER": (0, 16), "SW32": (1, 32), "SW64": (2, 64), "SW128": (3, 128)}
LAYOUT_TYPE = {"INTER": 0, "SW128": 1, "SW64": 2, "SW32": 3}  # GmmaDescriptor::layout_type_
TILE_K = 128


def clayout_64xn(n: int) -> Layout:
    """GMMA::CLayout_64xN: (thread, value) -> m + 64 n."""
    return Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))


@functools.lru_cache(maxsize=None)
def fragment_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of value i of thread t, arrays [128, n/2], from CLayout_64xN."""
    c = clayout_64xn(n)
    idx = np.array([[c(t, i) for i in range(n // 2)] for t in range(128)])
    return idx % 64, idx // 64


def smem_layout(kind: str, rows: int, cols: int) -> Layout:
    """tile_to_shape(Layout_K_<kind>_Atom<fp8>, (rows, cols)): atoms column-major over the tile (M first)."""
    bits, width = ATOMS[kind]
    atom = Layout((8, width), (width, 1))
    return logical_product(atom, Layout((rows // 8, cols // width), (1, rows // 8)))


def offset(layout: Layout, kind: str, r: int, k: int) -> int:
    """Un-swizzled byte offset of element (r, k)."""
    width = ATOMS[kind][1]
    return layout((r % 8, k % width), (r // 8, k // width))


@functools.lru_cache(maxsize=None)
def address_map(kind: str, rows: int) -> np.ndarray:
    """Swizzled byte offset of every element (r, k) of a rows x TILE_K operand: [rows, TILE_K]."""
    layout = smem_layout(kind, rows, TILE_K)
    swizzle = Swizzle(ATOMS[kind][0], 4, 3)
    return np.array([[swizzle(offset(layout, kind, r, k)) for k in range(TILE_K)] for r in range(rows)])


def make_gmma_desc(kind: str, rows: int, base: int, k_slice: int) -> int:
    """make_gmma_desc<Major::K> of the rows x 32 slice `k_slice` of the tile at smem `base`."""
    layout = smem_layout(kind, rows, TILE_K)
    k0 = 32 * k_slice
    start = base + offset(layout, kind, 0, k0)
    sbo = offset(layout, kind, 8, k0) - offset(layout, kind, 0, k0) if rows > 8 else 0
    # INTERLEAVE: LBO = distance between the two 16-byte core matrices along K; swizzled: 1 (uint128 units).
    lbo = offset(layout, kind, 0, k0 + 16) - offset(layout, kind, 0, k0) if kind == "INTER" else 16
    return (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (LAYOUT_TYPE[kind] << 62)


class DescParams(ctypes.Structure):
    _fields_ = [
        ("image", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("desc_a", ctypes.c_uint64 * 8),
        ("desc_b", ctypes.c_uint64 * 8),
        ("image_bytes", ctypes.c_uint32),
        ("num_k", ctypes.c_uint32),
        ("n", ctypes.c_uint32),
    ]


def fp8(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 2).to(torch.float8_e4m3fn)


def run_desc_probe(kind: str, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(simulated D, reference A . B^T) for A [64, 128], B [n, 128] laid out with `kind` atoms."""
    a, b = fp8((64, TILE_K), seed), fp8((n, TILE_K), seed + 1)
    a_bytes = 64 * TILE_K
    image = np.full(a_bytes + n * TILE_K, 0xFF, dtype=np.uint8)
    image[address_map(kind, 64)] = a.view(torch.uint8).numpy()
    image[a_bytes + address_map(kind, n)] = b.view(torch.uint8).numpy()
    image_t = torch.from_numpy(image)
    out = torch.full((128, n // 2), float("nan"))
    p = DescParams(image_t.data_ptr(), out.data_ptr(), image_bytes=image.size, num_k=TILE_K // 32, n=n)
    for j in range(TILE_K // 32):
        p.desc_a[j] = make_gmma_desc(kind, 64, 0, j)
        p.desc_b[j] = make_gmma_desc(kind, n, a_bytes, j)
    # Exact fp32 accumulation: this checks descriptor and fragment layouts against CuTe, not the arithmetic
    # (the tensor-core model has its own tests, tests/kernels/test_sim_tensor_core.py).
    sim_kernels.run("desc_probe", p, grid=1, block=128, cluster=1, smem_bytes=image.size, flags=FLAG_EXACT_MMA)

    rows, cols = fragment_coords(n)
    d = torch.full((64, n), float("nan"))
    d[torch.from_numpy(rows), torch.from_numpy(cols)] = out
    return d, a.double() @ b.double().T


@pytest.mark.parametrize("kind", list(ATOMS))
@pytest.mark.parametrize("n", [8, 256])
def test_descriptor_decoding_matches_cute_atoms(kind, n):
    d, ref = run_desc_probe(kind, n)
    torch.testing.assert_close(d.double(), ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("n", [16, 32, 48, 64, 96, 128, 192])
def test_accumulator_fragments_follow_clayout(n):
    d, ref = run_desc_probe("SW128", n, seed=n)
    torch.testing.assert_close(d.double(), ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("n", [8, 16, 24, 64, 136, 256])
def test_documented_fragment_formula_is_clayout(n):
    # The formula hal/sim.hpp (frag_row / frag_col) and the PTX ISA figure give for thread t, value i.
    rows, cols = fragment_coords(n)
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    assert (rows == 16 * w + lane // 4 + 8 * ((i // 2) % 2)).all()
    assert (cols == 8 * (i // 4) + 2 * (lane % 4) + i % 2).all()


def test_swizzle_atoms_are_address_xors():
    # Layout_K_SW*_Atom's Swizzle<B,4,3> on byte offsets = XOR of address bits [7, 7+B) into [4, 4+B): the
    # rule the simulator applies to TMA and wgmma addresses.
    for bits in (1, 2, 3):
        swizzle = Swizzle(bits, 4, 3)
        mask = ((1 << bits) - 1) << 4
        for addr in range(0, 4096, 16):
            assert swizzle(addr) == addr ^ ((addr >> 3) & mask)


class StmatrixParams(ctypes.Structure):
    _fields_ = [
        ("dump", ctypes.c_void_p),
        ("regs", (ctypes.c_uint32 * 4) * 32),
        ("row_offset", ctypes.c_uint32 * 32),
        ("dump_bytes", ctypes.c_uint32),
    ]


def test_stmatrix_x4_matches_cute_stsm_layout():
    # SM90_U32x4_STSM_N: SrcLayout = LDSM DstLayout (thread, (bit, register)) -> bit of the four 8x8 b16
    # matrices; DstLayout = LDSM SrcLayout (thread, bit) -> bit: thread t' stores 128 bits (one row) at its
    # own row address.
    src = Layout((32, (32, 4)), (32, (1, 1024)))
    dst = Layout((32, 128), (128, 1))
    dst_inverse = {dst(t, v): (t, v) for t in range(32) for v in range(128)}

    rng = np.random.default_rng(0)
    dump_bytes = 2048
    slots = rng.permutation(dump_bytes // 16)[:32] * 16  # 32 distinct, 16-byte aligned rows anywhere
    p = StmatrixParams(dump_bytes=dump_bytes)
    for lane in range(32):
        p.row_offset[lane] = int(slots[lane])
        for q in range(4):
            p.regs[lane][q] = (lane << 16) | (q << 8) | 0x11
    dump = torch.zeros(dump_bytes, dtype=torch.uint8)
    p.dump = dump.data_ptr()
    sim_kernels.run("stmatrix", p, grid=1, block=32, cluster=1, smem_bytes=dump_bytes)

    expected = np.full(dump_bytes, 0xFF, dtype=np.uint8)
    for lane in range(32):
        for q in range(4):
            for half in range(2):  # one b16 element per 16 bits
                bit = src(lane, (16 * half, q))
                t_dst, v_dst = dst_inverse[bit]
                value = (p.regs[lane][q] >> (16 * half)) & 0xFFFF
                addr = int(slots[t_dst]) + v_dst // 8
                expected[addr : addr + 2] = np.frombuffer(np.uint16(value).tobytes(), dtype=np.uint8)
    np.testing.assert_array_equal(dump.numpy(), expected)
