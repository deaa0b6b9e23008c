"""The drop-in's casts (``deep_fp8_gemm.compat.casts``, exported as ``deep_gemm.utils.*``) give the reference
design's bits on each device (issue 23, mismatch 6).

DeepGEMM 2.6.1's ``deep_gemm/utils/math.py`` computes ``sf = amax / 448.0`` and ``x * (1.0 / sf)``. Its bits are
re-expressed here in numpy float32, independently of ATen, in the two forms ATen gives them: on a CPU ``amax /
448`` is a true division; on CUDA a Python-float divisor becomes a multiply by ``fl(1/448)``. The CPU path must
equal the CPU form, the fused kernels' ``DEEP_GEMM_CUDA`` variant in the simulator (and on an sm_90 GPU) the CUDA
form. NaN codes and scales are compared as NaN (their sign bit is the platform's: x86 makes ``inf * 0`` a
negative NaN, a GPU a positive one); every other bit must be equal.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from deep_fp8_gemm.compat import casts as dgc
from deep_fp8_gemm import quant
from tests._gpu import requires_sm90

_F32 = np.float32


def _ceil_to_ue8m0(sf: np.ndarray) -> np.ndarray:
    bits = np.abs(sf).view(np.uint32).astype(np.int64)
    exponent = np.clip(((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0), 1, 254)
    return (exponent << 23).astype(np.uint32).view(np.float32)


def _model(groups: np.ndarray, axes: tuple[int, ...], use_ue8m0: bool, device: str):
    """float32 scales and quotients of the reference's casts over ``groups`` (amax over ``axes``)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.max(np.abs(groups), axis=axes, keepdims=True)
        amax = np.where(np.isnan(amax), amax, np.maximum(amax, _F32(1e-4))).astype(np.float32)
        sf = amax / _F32(448.0) if device == "cpu" else amax * (_F32(1.0) / _F32(448.0))
        if use_ue8m0:
            sf = _ceil_to_ue8m0(sf)
        q = groups * (_F32(1.0) / sf)
    return sf, q


def per_token_model(x: torch.Tensor, use_ue8m0: bool, device: str):
    m, k = x.shape
    kb = -(-k // 128)
    padded = np.zeros((m, kb * 128), np.float32)
    padded[:, :k] = x.float().numpy()
    sf, q = _model(padded.reshape(m, kb, 128), (2,), use_ue8m0, device)
    return torch.from_numpy(q.reshape(m, kb * 128)[:, :k].copy()).to(torch.float8_e4m3fn), torch.from_numpy(sf[..., 0])


def per_block_model(x: torch.Tensor, use_ue8m0: bool, device: str):
    n, k = x.shape
    nb, kb = -(-n // 128), -(-k // 128)
    padded = np.zeros((nb * 128, kb * 128), np.float32)
    padded[:n, :k] = x.float().numpy()
    sf, q = _model(padded.reshape(nb, 128, kb, 128), (1, 3), use_ue8m0, device)
    codes = torch.from_numpy(q.reshape(nb * 128, kb * 128)[:n, :k].copy()).to(torch.float8_e4m3fn)
    return codes, torch.from_numpy(sf.reshape(nb, kb))


def per_channel_model(x: torch.Tensor, use_ue8m0: bool, device: str):
    m, n = x.shape
    sf, q = _model(x.float().numpy().reshape(m // 128, 128, n), (1,), use_ue8m0, device)
    return torch.from_numpy(q.reshape(m, n)).to(torch.float8_e4m3fn), torch.from_numpy(sf.reshape(m // 128, n))


def assert_bits_equal(actual, expected) -> None:
    """Equal bits, NaN as NaN (codes 0x7F / 0xFF, scales any NaN)."""
    (codes, sf), (codes_ref, sf_ref) = actual, expected
    assert codes.shape == codes_ref.shape and sf.shape == sf_ref.shape
    c, cr = codes.contiguous().view(torch.uint8).int(), codes_ref.contiguous().view(torch.uint8).int()
    nan, nan_ref = (c & 0x7F) == 0x7F, (cr & 0x7F) == 0x7F
    assert torch.equal(nan, nan_ref), "NaN codes differ"
    assert torch.equal(c[~nan], cr[~nan]), f"{int((c != cr).sum())} of {c.numel()} codes differ"
    s, sr = sf.contiguous(), sf_ref.contiguous()
    assert torch.equal(s.isnan(), sr.isnan()), "NaN scales differ"
    assert torch.equal(s[~s.isnan()].view(torch.int32), sr[~sr.isnan()].view(torch.int32)), "scales differ"


def _inputs(m: int, k: int, dtype: torch.dtype, seed: int, nonfinite: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).pow(4) * 300
    x[0, : min(k, 128)] = 0  # all-zero group: amax clamps to 1e-4
    if nonfinite and m > 3:
        x[1, 5] = float("nan")
        x[2, min(7, k - 1)] = float("inf")
        x[3, 0] = -float("inf")
    return x.to(dtype)


_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("use_ue8m0", (False, True))
@pytest.mark.parametrize("m,k", ((9, 384), (6, 200), (130, 48)))
def test_cpu_casts_are_the_references_cpu_bits(dtype, use_ue8m0, m, k):
    x = _inputs(m, k, dtype, seed=m + k)
    assert_bits_equal(dgc.per_token_cast_to_fp8(x, use_ue8m0), per_token_model(x, use_ue8m0, "cpu"))
    assert_bits_equal(dgc.per_block_cast_to_fp8(x, use_ue8m0), per_block_model(x, use_ue8m0, "cpu"))
    if m % 128 == 0:
        assert_bits_equal(dgc.per_channel_cast_to_fp8(x, use_ue8m0), per_channel_model(x, use_ue8m0, "cpu"))


def test_layouts_and_arguments_are_the_references():
    x = _inputs(256, 300, torch.bfloat16, seed=1, nonfinite=False)
    codes, sf = dgc.per_token_cast_to_fp8(x, False)
    assert sf.shape == (256, 3) and sf.is_contiguous(), "the reference returns row-major scales"
    codes, sf = dgc.per_block_cast_to_fp8(x, True)
    assert sf.shape == (2, 3) and sf.is_contiguous()
    assert_bits_equal(dgc.per_channel_cast_to_fp8(x, False), per_channel_model(x, False, "cpu"))
    with pytest.raises(TypeError):
        dgc.per_token_cast_to_fp8(x)  # use_ue8m0 is required, as in the reference
    codes, sf = dgc.per_token_cast_to_fp8(x, False, gran_k=32)  # the 1x32 recipe (SGLang's DeepSeek-V4.1 path)
    assert sf.shape == (256, 10) and sf.is_contiguous()
    with pytest.raises(ValueError, match="gran_k must be positive"):
        dgc.per_token_cast_to_fp8(x, False, gran_k=0)
    with pytest.raises(NotImplementedError, match="use_packed_ue8m0"):
        dgc.per_token_cast_to_fp8(x, True, 128, True)
    # per_custom_dims_cast_to_fp8(x, dims=(0,)): one scale per row, the amax over the other dims.
    codes, sf = dgc.per_custom_dims_cast_to_fp8(x, (0,), False)
    assert sf.shape == (256,) and codes.shape == x.shape
    expected_sf = x.abs().float().amax(dim=1).clamp(1e-4) / 448.0
    assert torch.equal(sf, expected_sf)


def test_this_librarys_casts_differ_from_the_reference_and_keep_ieee_division():
    # The mismatch itself: deep_fp8_gemm's quantisers divide (x / sf), the reference multiplies by 1 / sf. On a
    # CPU the scales agree and a small fraction of codes differ by one step (bf16 inputs put quotients on e4m3
    # rounding ties, which the two roundings break differently: ~0.04% here); that stays so (docs/dropin.md, issue 23).
    x = (torch.randn(4096, 512, generator=torch.Generator().manual_seed(2)) * 7).bfloat16()
    ours_codes, ours_sf = quant.per_token_cast_to_fp8_torch(x)
    ref_codes, ref_sf = per_token_model(x, False, "cpu")
    assert torch.equal(ours_sf, ref_sf)
    differ = (ours_codes.view(torch.uint8) != ref_codes.view(torch.uint8)).float().mean().item()
    assert 1e-5 < differ < 5e-3, differ
    step = (ours_codes.view(torch.uint8).int() - ref_codes.view(torch.uint8).int()).abs().max().item()
    assert step == 1


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
def test_simulated_fused_kernels_follow_the_cuda_sequence(monkeypatch):
    """The fused kernels' DEEP_GEMM_CUDA variant (quant.cuh kDeepGemmCuda) in the simulator equals the CPU
    emulation of ATen's CUDA arithmetic (one build per case: three builds)."""
    monkeypatch.setenv("DFG_SIMULATE", "1")
    x = _inputs(9, 384, torch.bfloat16, seed=3)  # vectorised per-token
    expected = per_token_model(x, False, "cuda")
    assert not torch.equal(expected[1], per_token_model(x, False, "cpu")[1]), "the CPU and CUDA forms must differ"
    assert_bits_equal(dgc.per_token_cast_to_fp8(x, False), expected)
    x = _inputs(6, 200, torch.float32, seed=4)  # scalar variant, UE8M0
    assert_bits_equal(dgc.per_token_cast_to_fp8(x, True), per_token_model(x, True, "cuda"))
    w = _inputs(300, 200, torch.bfloat16, seed=5)  # per-block, partial edge blocks
    assert_bits_equal(dgc.per_block_cast_to_fp8(w, False), per_block_model(w, False, "cuda"))
    monkeypatch.delenv("DFG_SIMULATE")
    assert_bits_equal(dgc.per_block_cast_to_fp8(w, False), per_block_model(w, False, "cpu"))


@requires_sm90
@pytest.mark.gpu
def test_gpu_casts_are_the_references_cuda_bits():
    for dtype in _DTYPES:
        for use_ue8m0 in (False, True):
            x = _inputs(130, 300, dtype, seed=6)
            xc = x.cuda()
            got = [t.cpu() for t in dgc.per_token_cast_to_fp8(xc, use_ue8m0)]
            assert_bits_equal(got, per_token_model(x, use_ue8m0, "cuda"))
            assert_bits_equal(got, [t.cpu() for t in dgc.per_token_cast_to_fp8_torch(xc, use_ue8m0)])
            got = [t.cpu() for t in dgc.per_block_cast_to_fp8(xc, use_ue8m0)]
            assert_bits_equal(got, per_block_model(x, use_ue8m0, "cuda"))
            assert_bits_equal(got, [t.cpu() for t in dgc.per_block_cast_to_fp8_torch(xc, use_ue8m0)])
