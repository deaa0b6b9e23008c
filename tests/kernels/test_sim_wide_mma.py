"""BF16 and TF32 wgmma in the simulator (issue 41): hal::WgmmaBf16 / hal::WgmmaTf32 against float64, the tensor-core
model's stated assumptions (hal/sim/numerics.hpp: exact products, fp32 accumulation, symmetric in A and B, tf32's
low 13 mantissa bits ignored), planted bugs that must fail (a K-loop that does not advance its descriptors, bf16 data
issued as tf32), and the PTX side (wgmma_gen's wrappers) compiled for sm_90a where NVRTC is installed."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
import torch

from deep_fp8_gemm.simulator import FLAG_EXACT_MMA
from tests import sim_kernels
from tests._gpu import requires_sm90
from tests.kernels.test_sim_groundtruth import address_map, fragment_coords, make_gmma_desc

N = 64
SLICES = 4
BF16, TF32, BUG_NO_K_ADVANCE, BUG_TYPE, BF16_MN_MN, BF16_MN_K = 0, 1, 2, 3, 4, 5


class Params(ctypes.Structure):
    _fields_ = [("image", ctypes.c_void_p), ("d", ctypes.c_void_p), ("desc_a", ctypes.c_uint64 * SLICES),
                ("desc_b", ctypes.c_uint64 * SLICES), ("image_bytes", ctypes.c_uint32), ("mode", ctypes.c_uint32)]


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def operands(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A [64, K] and B [N, K] of 128 bytes per row (K 64 bf16 or 32 fp32)."""
    k = 128 // torch.tensor([], dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(64, k, generator=g).to(dtype), torch.randn(N, k, generator=g).to(dtype))


def mn_major_sw128(t: torch.Tensor, image: np.ndarray, base: int) -> list[int]:
    """Writes bf16 ``t`` [rows, 64] MN-major into ``image`` at ``base`` as TMA would (boxes of 64 MN elements x 64 K
    rows of 128 bytes, 128-byte swizzle on the address, box c at base + 8192 c) and returns the descriptors of its four
    k16 slices (make_gmma_desc<Major::MN>, SW128: LBO = the MN-box stride, SBO = 8 K rows = 1024 bytes)."""
    rows = t.shape[0]
    raw = t.contiguous().view(torch.int16).numpy().view(np.uint8).reshape(rows, 64, 2)
    for mn in range(rows):
        for kk in range(64):
            at = base + 8192 * (mn // 64) + 128 * kk + 2 * (mn % 64)
            at ^= ((at >> 7) & 7) << 4
            image[at:at + 2] = raw[mn, kk]
    return [((base + 2048 * s) >> 4) | ((8192 >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62) for s in range(SLICES)]


def probe(a: torch.Tensor, b: torch.Tensor, mode: int, device: str = "cpu") -> tuple[Params, torch.Tensor, torch.Tensor]:
    """(params, image, fragments) of the probe: A and B with the 128-byte swizzle in the image, K-major, or MN-major
    for the modes that say so."""
    image = np.zeros((64 + N) * 128, dtype=np.uint8)
    descs = []
    for t, rows, base, mn in ((a, 64, 0, mode in (BF16_MN_MN, BF16_MN_K)), (b, N, 64 * 128, mode == BF16_MN_MN)):
        if mn:
            descs.append(mn_major_sw128(t, image, base))
        else:
            image[base + address_map("SW128", rows)] = t.contiguous().view(torch.uint8).numpy()
            descs.append([make_gmma_desc("SW128", rows, base, s) for s in range(SLICES)])
    image = torch.from_numpy(image).to(device)
    frag = torch.full((128, N // 2), float("nan"), device=device)
    p = Params(image.data_ptr(), frag.data_ptr(), (ctypes.c_uint64 * SLICES)(*descs[0]),
               (ctypes.c_uint64 * SLICES)(*descs[1]), image.numel(), mode)
    return p, image, frag


def accumulators(frag: torch.Tensor) -> torch.Tensor:
    r, c = (torch.from_numpy(x) for x in fragment_coords(N))
    d = torch.full((64, N), float("nan"))
    d[r, c] = frag.cpu()
    return d


def run(a: torch.Tensor, b: torch.Tensor, mode: int, flags: int = 0) -> torch.Tensor:
    """D [64, N] of the probe in the simulator."""
    p, image, frag = probe(a, b, mode)
    sim_kernels.run("wgmma_wide", p, grid=1, block=128, cluster=1, smem_bytes=image.numel(), flags=flags)
    return accumulators(frag)


def tf32(x: torch.Tensor) -> torch.Tensor:
    """The tensor core's view of fp32 operands (numerics.hpp): the low 13 mantissa bits dropped."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_wgmma_matches_float64(seed):
    a, b = operands(torch.bfloat16, seed)
    d = run(a, b, BF16)
    ref = a.double() @ b.double().T
    assert calc_diff(d, ref) <= 1e-6
    torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-5)
    exact = run(a, b, BF16, flags=FLAG_EXACT_MMA)
    torch.testing.assert_close(exact.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_tf32_wgmma_matches_float64_of_the_truncated_operands(seed):
    a, b = operands(torch.float32, seed)
    d = run(a, b, TF32)
    ref = tf32(a).double() @ tf32(b).double().T
    assert calc_diff(d, ref) <= 1e-6
    torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-5)
    # The low 13 bits are ignored: the truncated operands give the same bits.
    assert torch.equal(d.view(torch.int32), run(tf32(a), tf32(b), TF32).view(torch.int32))
    # bf16 values are exact in tf32 (the hc-prenorm GEMM's A).
    a16 = a.to(torch.bfloat16).float()
    torch.testing.assert_close(run(a16, b, TF32).double(), a16.double() @ tf32(b).double().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [BF16_MN_MN, BF16_MN_K])
def test_mn_major_bf16_operands_give_the_k_major_bits(mode):
    """MN-major A (and B): the same product, bit for bit, as K-major operands (the decoder only changes where the
    values come from); a K-major image decoded as MN-major is wrong (the transpose is not a no-op)."""
    a, b = operands(torch.bfloat16, 7)
    d = run(a, b, mode)
    assert torch.equal(d.view(torch.int32), run(a, b, BF16).view(torch.int32))
    assert calc_diff(d, a.double() @ b.double().T) <= 1e-6


def test_a_k_major_image_issued_as_mn_major_fails():
    """Planted bug: the descriptors of K-major tiles with imm-trans set."""
    a, b = operands(torch.bfloat16, 8)
    p, image, frag = probe(a, b, BF16)
    p.mode = BF16_MN_MN
    sim_kernels.run("wgmma_wide", p, grid=1, block=128, cluster=1, smem_bytes=image.numel())
    assert calc_diff(accumulators(frag), a.double() @ b.double().T) > 1e-2


@pytest.mark.parametrize("mode", [BF16, TF32])
def test_the_model_is_symmetric_in_its_operands(mode):
    """D(A, B) = D(B, A)^T bit for bit (N = 64 = M here), the assumption swap-AB relies on."""
    a, b = operands(torch.bfloat16 if mode == BF16 else torch.float32, 5)
    assert torch.equal(run(a, b, mode).view(torch.int32), run(b, a, mode).T.contiguous().view(torch.int32))


def test_accumulation_is_fp32_not_the_fp8_datapaths_13_bits():
    """A large accumulator and small addends: fp32 keeps 24 bits (the e4m3 model would drop these addends)."""
    a = torch.zeros(64, 64, dtype=torch.bfloat16)
    b = torch.zeros(N, 64, dtype=torch.bfloat16)
    a[:, 0], b[:, 0] = 4096.0, 1.0  # 2^12
    a[:, 16:], b[:, 16:] = 1.0, 2.0 ** -6  # 48 addends of 2^-6: 2^-18 * 2^12 = 2^-6 relative, kept by fp32 only
    d = run(a, b, BF16)
    assert torch.equal(d, torch.full((64, N), 4096.0 + 48 * 2.0 ** -6))


@pytest.mark.parametrize("mode", [BUG_NO_K_ADVANCE, BUG_TYPE])
def test_planted_bugs_fail_the_float64_check(mode):
    """A K loop that does not advance its descriptors, and bf16 data issued as tf32: both far from float64."""
    a, b = operands(torch.bfloat16, 3)
    ref = a.double() @ b.double().T
    assert calc_diff(run(a, b, BF16), ref) <= 1e-6
    assert calc_diff(run(a, b, mode), ref) > 1e-2


def _ptx_probe():
    from deep_fp8_gemm.kernels.wgmma_gen import wgmma_bf16_wrapper, wgmma_tf32_wrapper
    from deep_fp8_gemm.runtime.render import render_string

    name, _ = sim_kernels.source("wgmma_wide")
    template = (sim_kernels.DIRECTORY / "wgmma_wide.cu").read_text()
    return name, render_string(template, {"KERNEL_NAME": name}, wgmma_bf16_wrapper(N) + wgmma_bf16_wrapper(N, 1, 1)
                               + wgmma_bf16_wrapper(N, 1, 0) + wgmma_tf32_wrapper(N))


def test_wrappers_refuse_bad_shapes_and_spell_the_ptx():
    from deep_fp8_gemm.kernels.wgmma_gen import wgmma_bf16_wrapper, wgmma_fp8_wrapper, wgmma_tf32_wrapper

    assert "m64n64k16.f32.bf16.bf16" in wgmma_bf16_wrapper(64) and "p, 1, 1, 0, 1;" in wgmma_bf16_wrapper(64, 0, 1)
    assert "m64n32k8.f32.tf32.tf32" in wgmma_tf32_wrapper(32) and "p, 1, 1;" in wgmma_tf32_wrapper(32)
    for bad in (lambda: wgmma_bf16_wrapper(12), lambda: wgmma_tf32_wrapper(264), lambda: wgmma_bf16_wrapper(8, 2)):
        with pytest.raises(ValueError):
            bad()
    assert "m64n64k32.f32.e4m3.e4m3" in wgmma_fp8_wrapper(64)


def test_ptx_side_compiles_for_sm90a():
    """The probe compiles for sm_90a without spills or ptxas warnings and issues HGMMA for bf16 and tf32."""
    from deep_fp8_gemm.runtime import compiler, sass

    if not compiler.nvrtc_available():
        pytest.skip("NVRTC is not installed")
    kernel = compiler.compile_kernel(*_ptx_probe())
    assert kernel.resources.spill_bytes == 0, kernel.resources
    try:
        text = sass.disassemble(kernel.cubin)
    except (FileNotFoundError, RuntimeError) as e:  # no nvdisasm / cuobjdump wheel
        pytest.skip(f"no SASS disassembler: {e}")
    assert re.search(r"HGMMA\.64x64x16\.F32\.BF16", text), text[:3000]
    assert re.search(r"HGMMA\.64x64x8\.F32\.TF32", text), text[:3000]


@pytest.mark.gpu
@requires_sm90
def test_gpu_confirms_the_model_assumptions():
    """On the hardware (the first GPU run checks what numerics.hpp states for BF16 / TF32): fp32-accurate against
    float64, symmetric in its operands, tf32's low 13 mantissa bits ignored, and the simulator within fp32 rounding
    of the hardware (not claimed bit-exact)."""
    from deep_fp8_gemm.runtime import compiler, driver

    compiled = compiler.compile_kernel(*_ptx_probe())
    device = torch.cuda.current_device()
    kernel = driver.load_kernel(compiled.cubin, compiled.name, device, key=compiled.key)

    def gpu(a, b, mode):
        p, image, frag = probe(a, b, mode, device="cuda")
        driver.launch(kernel, p, grid=1, block=128, smem_bytes=image.numel(),
                      stream=torch.cuda.current_stream(device).cuda_stream)
        torch.cuda.synchronize()
        return accumulators(frag)

    for mode, dtype in ((BF16, torch.bfloat16), (TF32, torch.float32)):
        a, b = operands(dtype, 11)
        d = gpu(a, b, mode)
        view = (lambda t: t) if mode == BF16 else tf32
        ref = view(a).double() @ view(b).double().T
        assert calc_diff(d, ref) <= 1e-6, mode
        assert torch.equal(d.view(torch.int32), gpu(b, a, mode).T.contiguous().view(torch.int32)), "not symmetric"
        torch.testing.assert_close(d.double(), run(a, b, mode).double(), rtol=1e-5, atol=1e-5)
        if mode == TF32:
            assert torch.equal(d.view(torch.int32), gpu(tf32(a), tf32(b), mode).view(torch.int32)), "low bits read"
        else:  # MN-major operands (the image the test builds as TMA would) give the K-major bits
            for mn_mode in (BF16_MN_MN, BF16_MN_K):
                assert torch.equal(d.view(torch.int32), gpu(a, b, mn_mode).view(torch.int32)), mn_mode
