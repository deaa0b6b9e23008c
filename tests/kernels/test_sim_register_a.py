"""wgmma with A from registers (hal::WgmmaFp8RegA), its e4m3 A-fragment layout, and the tensor-core model's stated
assumptions (hal/sim/numerics.hpp), in the simulator; the PTX side compiled for sm_90a where NVRTC is installed.

* The layout: dfg::WgmmaFragmentA (mma.cuh, what a kernel writes its fragment with; read back from the probe) and
  the simulator's gather (a_frag_row / a_frag_k, sim/wgmma.hpp: the register-A product must equal the one through
  shared memory) against CuTe's ``GMMA::ALayout_64x32`` ("Register source layout for 8-bit value types",
  cute/atom/mma_traits_sm90_gmma.hpp) evaluated with pycute.
* The model's assumptions: the same product, bit for bit, whether A comes from shared memory or registers (the
  same per-k-group accumulation); the inner product symmetric in its operands (D(A, B) = D(B, A)^T bit for bit).
* The register rules (sim/wgmma_registers.hpp) on the register-A path: an A fragment written or an accumulator read
  while its wgmma is in flight, an A register touched after the wgmma.fence, an accumulator read after the wait
  without the register fence.
"""

from __future__ import annotations

import ctypes
import re
import shutil

import numpy as np
import pytest
import torch

pycute = pytest.importorskip("pycute", reason="pycute (nvidia-cutlass) is not installed")

from deep_fp8_gemm.simulator import FLAG_EXACT_MMA, SimulationError
from tests import sim_kernels
from tests._gpu import requires_sm90
from tests.kernels.test_sim_groundtruth import address_map, fragment_coords, make_gmma_desc

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

N = 64  # the probe's wgmma N (tests/sim_kernels/wgmma_rs.cu)


def alayout_64x32():
    """GMMA::ALayout_64x32: (thread, value) -> m + 64 k over the column-major 64 x 32 A tile."""
    return pycute.Layout(((4, 8, 4), (4, 2, 2)), ((256, 1, 16), (64, 8, 1024)))


class Params(ctypes.Structure):
    _fields_ = [("image", ctypes.c_void_p), ("a", ctypes.c_void_p), ("d_ss", ctypes.c_void_p),
                ("d_rs", ctypes.c_void_p), ("coords", ctypes.c_void_p), ("desc_a", ctypes.c_uint64),
                ("desc_b", ctypes.c_uint64), ("image_bytes", ctypes.c_uint32), ("mode", ctypes.c_uint32)]


def fp8(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 4).to(torch.float8_e4m3fn)


def probe_inputs(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(shared-memory image: A [64 x 128] then B [N x 128], K-major, 128-byte swizzle, the first 32 K-columns A and
    B; A [64, 32] as bytes, row-major; desc_a; desc_b) for A [64, 32] and B [N, 32] e4m3."""
    image = np.full((64 + N) * 128, 0xFF, dtype=np.uint8)
    for t, rows, base in ((a, 64, 0), (b, N, 64 * 128)):
        tile = torch.zeros(rows, 128, dtype=torch.uint8)
        tile[:, :32] = t.view(torch.uint8)
        image[base + address_map("SW128", rows)] = tile.numpy()
    return (torch.from_numpy(image), a.view(torch.uint8).contiguous(), make_gmma_desc("SW128", 64, 0, 0),
            make_gmma_desc("SW128", N, 64 * 128, 0))


def accumulators(frag: torch.Tensor) -> torch.Tensor:
    """[128, N / 2] fragments -> D [64, N] (CLayout_64xN)."""
    r, c = (torch.from_numpy(x) for x in fragment_coords(N))
    d = torch.full((64, N), float("nan"), device=frag.device)
    d[r.to(frag.device), c.to(frag.device)] = frag
    return d


def run_probe(a: torch.Tensor, b: torch.Tensor, mode: int = 0, flags: int = 0):
    """(D through shared-memory A, D through register A, the probe's WgmmaFragmentA coordinates) for A [64, 32] and
    B [N, 32] e4m3, in the simulator; D as [64, N] read back through CLayout_64xN."""
    image, a_rows, desc_a, desc_b = probe_inputs(a, b)
    d_ss, d_rs = torch.full((128, N // 2), float("nan")), torch.full((128, N // 2), float("nan"))
    coords = torch.zeros(128, 16, dtype=torch.int32)
    p = Params(image.data_ptr(), a_rows.data_ptr(), d_ss.data_ptr(), d_rs.data_ptr(), coords.data_ptr(), desc_a,
               desc_b, image.numel(), mode)
    sim_kernels.run("wgmma_rs", p, grid=1, block=128, cluster=1, smem_bytes=image.numel(), flags=flags)
    return accumulators(d_ss), accumulators(d_rs), coords


def test_fragment_layout_is_cutes_alayout_64x32():
    """WgmmaFragmentA as the probe computed it (row * 32 + k of byte b of register j, value 4 j + b) is CuTe's
    ALayout_64x32 (thread, value) -> (m, k); and the documented formula is that layout too."""
    _, _, coords = run_probe(fp8((64, 32), 0), fp8((N, 32), 1))
    layout = alayout_64x32()
    cute = np.array([[layout(t, v) for v in range(16)] for t in range(128)])
    cute_rows, cute_k = cute % 64, cute // 64
    assert (coords.numpy() == cute_rows * 32 + cute_k).all()
    t, v = np.arange(128)[:, None], np.arange(16)[None, :]
    w, lane, j, b = t // 32, t % 32, v // 4, v % 4
    assert (cute_rows == 16 * w + lane // 4 + 8 * (j % 2)).all()
    assert (cute_k == 4 * (lane % 4) + b + 16 * (j // 2)).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_register_a_equals_shared_a_bit_for_bit(seed):
    """The stated assumption: the tensor-core model accumulates the same way whatever A's source (the simulator's
    gather of the register fragments is then CuTe's layout, or the two products would differ)."""
    a, b = fp8((64, 32), 10 + seed), fp8((N, 32), 20 + seed)
    d_ss, d_rs, _ = run_probe(a, b)
    assert torch.equal(d_ss.view(torch.int32), d_rs.view(torch.int32))
    exact_ss, exact_rs, _ = run_probe(a, b, flags=FLAG_EXACT_MMA)
    torch.testing.assert_close(exact_rs.double(), a.double() @ b.double().T, rtol=1e-6, atol=1e-4)
    assert torch.equal(exact_ss, exact_rs)


def test_inner_product_is_symmetric_in_its_operands():
    """The stated assumption the batch-invariance work relies on: D(A, B) = D(B, A)^T bit for bit under the
    tensor-core model (numerics.hpp: products of two e4m3 are exact and commute; the alignment and truncation see
    only the set of products). Operands with a wide exponent range so that the truncation matters."""
    g = torch.Generator().manual_seed(7)
    wide = lambda shape: (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g)))
    a, b = wide((64, 32)).to(torch.float8_e4m3fn), wide((N, 32)).to(torch.float8_e4m3fn)
    d_ab, _, _ = run_probe(a, b)
    d_ba, _, _ = run_probe(b, a)
    assert torch.equal(d_ab.view(torch.int32), d_ba.T.contiguous().view(torch.int32))
    assert not torch.equal(d_ab.double(), a.double() @ b.double().T), "operands too tame: the model rounds nothing"


SITE = r"\S+\.(?:cu|cpp):\d+"  # the probe's lines (the rendered copy in the cache)
# mode: the pattern the report must match
PLANTED = {
    1: rf"wgmma registers: a plain (?:read|write) of a\[0\] of the register A fragment a\[0\.\.3\] of a "
       rf"wgmma\.mma_async m64n64k32 issued at {SITE} \(group 1\) before the wgmma\.wait_group that retires it",
    2: rf"wgmma registers: a plain read of d\[0\] of the accumulator fragment d\[0\.\.31\] of a wgmma\.mma_async "
       rf"m64n64k32 issued at {SITE} \(group 1\) before the wgmma\.wait_group",
    3: rf"wgmma registers: this wgmma\.mma_async m64n64k32 uses a\[1\] \(the register A fragment a\[0\.\.3\]\), "
       rf"which this thread wrote at {SITE} after its last wgmma\.fence \(at {SITE}\)",
    4: rf"wgmma registers: a plain read of d\[0\] of the accumulator fragment d\[0\.\.31\] of a wgmma\.mma_async "
       rf"m64n64k32, after the wgmma\.wait_group at {SITE} that retired it, with no register fence",
}


@pytest.mark.parametrize("mode", sorted(PLANTED))
def test_register_rules_on_the_register_a_path(mode):
    with pytest.raises(SimulationError) as e:
        run_probe(fp8((64, 32), 0), fp8((N, 32), 1), mode=mode)
    report = str(e.value)
    assert re.search(PLANTED[mode], report), report[:2000]
    assert re.search(rf"cta 0 thread \d+ \(warp \d lane \d+\) at {SITE}", report), report[:2000]


def _ptx_probe():
    """(kernel name, source) of the probe for NVRTC: the generated wrappers (wgmma_gen: WgmmaFp8<64>, WgmmaFp8RegA<64>)
    in its extra-code slot, and without the planted paths: with a run-time mode ptxas sees the in-flight accesses of
    modes 1 and 2 on some path and serialises the wgmmas (C7511), which is the undefined behaviour showing as a
    slowdown."""
    from deep_fp8_gemm.kernels.wgmma_gen import wgmma_fp8_rs_wrapper, wgmma_fp8_wrapper
    from deep_fp8_gemm.runtime.render import render_string

    name, _ = sim_kernels.source("wgmma_rs")
    template = (sim_kernels.DIRECTORY / "wgmma_rs.cu").read_text()
    assert template.count("const u32 mode = p.mode;") == 1
    template = template.replace("const u32 mode = p.mode;", "constexpr u32 mode = 0;")
    return name, render_string(template, {"KERNEL_NAME": name}, wgmma_fp8_wrapper(N) + wgmma_fp8_rs_wrapper(N))


def test_ptx_side_compiles_for_sm90a():
    """The probe compiles for sm_90a spill-free, without ptxas warnings, and issues both products as QGMMA (where
    NVRTC is installed)."""
    from deep_fp8_gemm.runtime import compiler, sass

    if not compiler.nvrtc_available():
        pytest.skip("NVRTC is not installed")
    kernel = compiler.compile_kernel(*_ptx_probe())
    assert kernel.resources.spill_bytes == 0 and not kernel.resources.warnings, kernel.resources
    try:
        text = sass.disassemble(kernel.cubin)
    except (FileNotFoundError, RuntimeError) as e:  # no nvdisasm / cuobjdump wheel
        pytest.skip(f"no SASS disassembler: {e}")
    assert len(re.findall(r"QGMMA\.64x64x32\.F32\.E4M3\.E4M3", text)) >= 2, text[:3000]


@pytest.mark.gpu
@requires_sm90
def test_gpu_confirms_the_model_assumptions_and_the_fragment_layout():
    """On the hardware (the first GPU run confirms what numerics.hpp states): register A and shared-memory A give the
    same bits, the product is symmetric in its operands, and the register fragment written with WgmmaFragmentA is
    the hardware's (small integer operands: every sum is exact, so D must equal A . B^T)."""
    from deep_fp8_gemm.runtime import compiler, driver

    compiled = compiler.compile_kernel(*_ptx_probe())
    device = torch.cuda.current_device()
    kernel = driver.load_kernel(compiled.cubin, compiled.name, device, key=compiled.key)

    def gpu(a, b):
        image, a_rows, desc_a, desc_b = (x.cuda() if isinstance(x, torch.Tensor) else x for x in probe_inputs(a, b))
        d_ss, d_rs = (torch.full((128, N // 2), float("nan"), device="cuda") for _ in range(2))
        coords = torch.zeros(128, 16, dtype=torch.int32, device="cuda")
        p = Params(image.data_ptr(), a_rows.data_ptr(), d_ss.data_ptr(), d_rs.data_ptr(), coords.data_ptr(), desc_a,
                   desc_b, image.numel(), 0)
        driver.launch(kernel, p, grid=1, block=128, smem_bytes=image.numel(),
                      stream=torch.cuda.current_stream(device).cuda_stream)
        torch.cuda.synchronize()
        return accumulators(d_ss).cpu(), accumulators(d_rs).cpu()

    g = torch.Generator().manual_seed(7)
    wide = lambda shape: (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g)))
    a, b = wide((64, 32)).to(torch.float8_e4m3fn), wide((N, 32)).to(torch.float8_e4m3fn)
    d_ss, d_rs = gpu(a, b)
    assert torch.equal(d_ss.view(torch.int32), d_rs.view(torch.int32)), "register A and shared A differ"
    d_ba, _ = gpu(b, a)
    assert torch.equal(d_ss.view(torch.int32), d_ba.T.contiguous().view(torch.int32)), "not symmetric"
    small = lambda shape: torch.randint(-4, 5, shape, generator=g).float().to(torch.float8_e4m3fn)
    a, b = small((64, 32)), small((N, 32))
    _, d_rs = gpu(a, b)
    assert torch.equal(d_rs, (a.float() @ b.float().T)), "the register A fragment layout is not the hardware's"
