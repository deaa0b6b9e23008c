"""The public 1D1D GEMM (``fp8_gemm_nt(..., recipe=(1, 1, 128))`` and ``deep_gemm.gemm_fp8_fp8_fp32_nt_1d1d``):
CPU reference and the real kernel in the simulator (``DFG_SIMULATE=1``) against an independent float64 model,
accumulation into a nonzero C held in d (in place) and in another tensor (d NaN-poisoned), errors naming the
argument, and the GPU path (skipped without an sm_90 device)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import deep_fp8_gemm as deep_gemm
from deep_fp8_gemm import reference
from tests._gpu import requires_sm90
from tests._operands import wgrad_operands


def model64(a, sa, b, sb, c):
    k = a.shape[-1]
    ad = a.float().double().numpy() * np.repeat(sa.double().numpy(), 128, axis=1)[:, :k]
    bd = b.float().double().numpy() * np.repeat(sb.double().numpy(), 128, axis=1)[:, :k]
    return (0 if c is None else c.double().numpy()) + ad @ bd.T


operands = wgrad_operands


@pytest.fixture(params=["cpu", "simulator"])
def path(request, monkeypatch):
    launched = []
    if request.param == "simulator":
        if shutil.which("g++") is None:
            pytest.skip("the simulator builds kernels with g++")
        from deep_fp8_gemm.kernels import gemm as gemm_module

        real = gemm_module.launch_1d1d
        monkeypatch.setattr(gemm_module, "launch_1d1d", lambda cfg, *args: (launched.append(cfg.kind), real(cfg, *args))[1])
        monkeypatch.setenv("DFG_SIMULATE", "1")
        monkeypatch.setenv("DFG_SIM_NUM_SMS", "3")
        # fp32-exact wgmma accumulation: these compare with float64 at fp32 tolerances (the tensor-core model
        # is covered by tests/kernels/test_sim_1d1d.py::test_1d1d_under_the_tensor_core_model).
        monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    yield request.param
    if request.param == "simulator":
        assert launched == ["1d1d"] * len(launched) and launched, "DFG_SIMULATE=1 but the 1D1D kernel did not run"


@pytest.mark.parametrize("in_place", [True, False], ids=["c_is_d", "c_separate"])
def test_fp8_gemm_nt_1d1d(path, in_place):
    m, n, k = 77, 120, 384  # odd m, n not a multiple of any tile width the heuristic picks here but 8 / 40
    a, sa, b, sb, c = operands(m, n, k, seed=3)
    expected = model64(a, sa, b, sb, c)
    if in_place:
        d = c.clone()
        deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128))
    else:
        d = torch.full((m, n), float("nan"))
        c_before = c.clone()
        deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d, c=c, recipe_a=(1, 128), recipe_b=(1, 128))
        assert torch.equal(c, c_before)
    got = d.double().numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4 * np.abs(expected).max())


def test_1d1d_without_c_is_the_plain_product(path):
    m, n, k = 64, 48, 256
    a, sa, b, sb, _ = operands(m, n, k, seed=4)
    d = torch.full((m, n), float("nan"))
    deep_gemm.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d)
    np.testing.assert_allclose(d.double().numpy(), model64(a, sa, b, sb, None), rtol=1e-5, atol=1e-4)


def test_reference_is_float64_exact_to_fp32_rounding():
    a, sa, b, sb, c = operands(9, 16, 256, seed=5)
    d = torch.empty(9, 16)
    reference.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
    assert torch.equal(d, torch.from_numpy(model64(a, sa, b, sb, c)).float())


def test_1d1d_errors_name_the_argument():
    a, sa, b, sb, c = operands(8, 16, 256, seed=6)
    d = torch.zeros(8, 16)
    call = deep_gemm.fp8_gemm_nt
    with pytest.raises(ValueError, match="c is required"):
        call((a, sa), (b, sb), d, recipe=(1, 1, 128))
    with pytest.raises(TypeError, match=r"d must be torch.float32.*d.dtype=torch.bfloat16"):
        call((a, sa), (b, sb), d.bfloat16(), c=c, recipe=(1, 1, 128))
    with pytest.raises(TypeError, match=r"c must be torch.float32, got c.dtype=torch.bfloat16"):
        call((a, sa), (b, sb), d, c=c.bfloat16(), recipe=(1, 1, 128))
    with pytest.raises(ValueError, match=r"c must have d's shape .*\(8, 16\), got c.shape=\(8, 24\)"):
        call((a, sa), (b, sb), d, c=torch.zeros(8, 24), recipe=(1, 1, 128))
    with pytest.raises(ValueError, match=r"rhs\[1\] \(sB\) must have shape \[n, ceil\(k/128\)\]"):
        call((a, sa), (b, sb[:1]), d, c=d, recipe=(1, 1, 128))
    with pytest.raises(ValueError, match=r"d must have shape \[m, n\]"):
        call((a, sa), (b, sb), torch.zeros(8, 8), c=torch.zeros(8, 8), recipe=(1, 1, 128))
    with pytest.raises(ValueError, match="must not overlap c"):
        big = torch.zeros(8, 32)
        deep_gemm.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), big[:, :16], big[:, 8:24])
    with pytest.raises(ValueError, match=r"d's leading strides must be positive multiples of 16 bytes"):
        wide = torch.zeros(8, 20).as_strided((8, 16), (17, 1))
        deep_gemm.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), wide, wide)
    with pytest.raises(NotImplementedError, match="1D1D"):  # no M-grouped 1D1D kernel
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), torch.zeros(8, 16, dtype=torch.bfloat16),
                                                   torch.zeros(8, dtype=torch.int32), recipe=(1, 1, 128))


@requires_sm90
@pytest.mark.parametrize("in_place", [True, False])
def test_gpu_1d1d(in_place):
    m, n, k = 1000, 2112, 4096
    a, sa, b, sb, c = operands(m, n, k, seed=7)
    expected = model64(a, sa, b, sb, c)
    a, sa, b, sb, c = (t.cuda() for t in (a, sa, b, sb, c))
    d = c.clone() if in_place else torch.full((m, n), float("nan"), device="cuda")
    deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d, c=d if in_place else c, recipe=(1, 1, 128))
    got = d.cpu().double().numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_1d1d_is_a_custom_op_that_torch_compile_traces():
    """fullgraph compile of a main-grad update (c = d) and of d = c + A·Bᵀ with c separate, on the CPU path."""
    a, sa, b, sb, c = operands(16, 24, 256, seed=8)

    def accumulate(a, sa, b, sb, main_grad):
        deep_gemm.fp8_gemm_nt((a, sa), (b, sb), main_grad, c=main_grad, recipe=(1, 1, 128))
        return main_grad

    def separate(a, sa, b, sb, c):
        d = torch.empty_like(c)
        deep_gemm.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
        return d

    expected = torch.from_numpy(model64(a, sa, b, sb, c)).float()
    got = torch.compile(accumulate, fullgraph=True, backend="aot_eager")(a, sa, b, sb, c.clone())
    assert torch.equal(got, expected)
    got = torch.compile(separate, fullgraph=True, backend="aot_eager")(a, sa, b, sb, c)
    assert torch.equal(got, expected)
    op = torch.ops.deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d.default
    with pytest.raises(ValueError, match="accumulate=True takes c=None"):
        op(a, sa, b, sb, c.clone(), c, True)
    with pytest.raises(Exception, match=r"d must have shape \[m, n\]"):  # the fake kernel checks shapes at trace time
        torch.compile(separate, fullgraph=True, backend="aot_eager")(a, sa, b, sb, torch.zeros(16, 16))
