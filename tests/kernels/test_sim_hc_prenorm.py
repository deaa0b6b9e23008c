"""The tf32_hc_prenorm_gemm kernel (issue 41, ``kernels/hc_prenorm.cuh``) in the CPU simulator: the real sm_90a source
against the float64 reference (``_core/hc_prenorm_math``: B as the tensor core reads it, exact sums) for n 8 / 24 / 32,
no split, one split, splits with empty ones, a partial last row block; planted bugs that must fail (the squares of a
wrong K range, an unswizzled converted tile, rows past m written, the converted tile read without
fence.proxy.async)."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm import calc_diff
from deep_fp8_gemm._core import hc_prenorm_math as M
from deep_fp8_gemm.kernels import hc_prenorm as K
from deep_fp8_gemm.runtime.target import Backend
from deep_fp8_gemm.simulator import SimulationError

SENTINEL = 7.0


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    yield monkeypatch


def _case(m, n, k, splits, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, k, generator=g)
    s = 1 if splits is None else splits
    return a, b, torch.full((s, m, n), SENTINEL), torch.full((s, m), SENTINEL)


def _run(m, n, k, splits, seed=0, config=None):
    a, b, d, s = _case(m, n, k, splits, seed)
    K.launch(a, b, d, s, splits, backend=Backend.SIM, config=config)
    d_ref, s_ref = torch.empty_like(d), torch.empty_like(s)
    if splits is None:
        M.hc_prenorm_reference(a, b, d_ref[0], s_ref[0], None)
    else:
        M.hc_prenorm_reference(a, b, d_ref, s_ref, splits)
    return d, s, d_ref, s_ref


@pytest.mark.parametrize("m,n,k,splits", [(70, 24, 256, None), (64, 8, 128, 1), (130, 32, 192, None),
                                          (70, 24, 16 * 64, 16), (33, 24, 5 * 64, 3), (20, 16, 2 * 64, 4)])
def test_sim_matches_the_float64_reference(simulate, m, n, k, splits):
    """D within fp32 accumulation of float64 (calc_diff <= 1e-9: TF32 products are exact, fp32 sums), the sums of
    squares within fp32 rounding (<= 1e-12); splits past the K blocks write zeros; nothing outside d / sqr_sum."""
    d, s, d_ref, s_ref = _run(m, n, k, splits, seed=m + k)
    assert calc_diff(d, d_ref) < 1e-9 and calc_diff(s, s_ref) < 1e-12
    assert torch.allclose(d, d_ref, rtol=1e-5, atol=1e-4) and torch.allclose(s, s_ref, rtol=1e-6)
    if splits and splits > k // 64:
        assert not d[k // 64:].any() and not s[k // 64:].any()


def test_sim_rows_do_not_depend_on_the_batch(simulate):
    """A row's D and sum are the same bits whether the call has 5 rows or 133 (no split depends on m)."""
    a, b, d, s = _case(133, 24, 256, 2, seed=3)
    K.launch(a, b, d, s, 2, backend=Backend.SIM)
    d5, s5 = torch.empty(2, 5, 24), torch.empty(2, 5)
    K.launch(a[64:69].clone(), b, d5, s5, 2, backend=Backend.SIM)
    assert torch.equal(d5, d[:, 64:69]) and torch.equal(s5, s[:, 64:69])


@pytest.mark.parametrize("planted", ["split_range", "no_swizzle"])
def test_planted_wrong_values_fail(simulate, planted):
    config = K.HcPrenormConfig(32, 4, planted)
    d, s, d_ref, s_ref = _run(70, 24, 4 * 64, 2, seed=5, config=config)
    assert calc_diff(d, d_ref) > 1e-3 or calc_diff(s, s_ref) > 1e-3, planted


def test_planted_rows_past_m_fail(simulate):
    """The last row block's rows past m are the next split's first rows in the contiguous [S, m, n] D: writing them
    races with the CTA that owns them (the simulator names the two writers). D and sqr_sum get room past their end,
    so the last split's stray rows land in owned memory instead of corrupting the process's heap."""
    config = K.HcPrenormConfig(32, 4, "rows_past_m")
    m, n, k = 40, 24, 2 * 64
    a, b, _, _ = _case(m, n, k, 2, seed=6)
    d = torch.full((2 * m * n + 64 * n,), SENTINEL)
    s = torch.full((2 * m + 64,), SENTINEL)
    with pytest.raises(SimulationError, match="race"):
        K.launch(a, b, d[:2 * m * n].view(2, m, n), s[:2 * m].view(2, m), 2, backend=Backend.SIM, config=config)


def test_planted_missing_proxy_fence_is_reported(simulate):
    config = K.HcPrenormConfig(32, 4, "no_proxy_fence")
    with pytest.raises(SimulationError, match="proxy"):
        _run(64, 24, 2 * 64, None, seed=7, config=config)
