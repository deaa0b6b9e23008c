"""The public k-grouped weight-gradient GEMM (``k_grouped_fp8_gemm_nt_contiguous`` and
``deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt``) against an independent numpy float64 model: several groups with
different K_g including 0, odd m, n not a multiple of the tile, accumulation into a nonzero C held in d (in place)
and in another tensor (d NaN-poisoned), c=None, errors naming the argument, and tracing under torch.compile."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import deep_fp8_gemm as deep_gemm
from deep_fp8_gemm import reference
from tests._gpu import requires_sm90
from tests._operands import quantised_activations


def k_grouped_operands(m, n, ks, seed=0):
    """Flat A / B (group g's [m, K_g] / [n, K_g] back to back), sA [m, sum/128], sB [n, sum/128], C [G, m, n]."""
    a_parts, sa_parts, b_parts, sb_parts = [], [], [], []
    for g, k in enumerate(ks):
        if k == 0:
            continue
        a_g, sa_g = quantised_activations((m, k), seed + 2 * g)
        b_g, sb_g = quantised_activations((n, k), seed + 2 * g + 1)
        a_parts.append(a_g.reshape(-1)), sa_parts.append(sa_g), b_parts.append(b_g.reshape(-1)), sb_parts.append(sb_g)
    fp8 = torch.float8_e4m3fn
    a = torch.cat(a_parts) if a_parts else torch.empty(0, dtype=fp8)
    b = torch.cat(b_parts) if b_parts else torch.empty(0, dtype=fp8)
    sa = torch.cat(sa_parts, 1) if sa_parts else torch.empty(m, 0)
    sb = torch.cat(sb_parts, 1) if sb_parts else torch.empty(n, 0)
    c = torch.randn(len(ks), m, n, generator=torch.Generator().manual_seed(seed + 99)) * 4
    return a, sa.contiguous(), b, sb.contiguous(), c


def model64(a, sa, b, sb, c, ks, m, n):
    """float64 D_g = C_g + (A_g sA_g)(B_g sB_g)^T, written from the layout description with numpy."""
    av = a.float().double().numpy()
    bv = b.float().double().numpy()
    sav, sbv = sa.double().numpy(), sb.double().numpy()
    out = np.zeros((len(ks), m, n)) if c is None else c.double().numpy().copy()
    off = 0
    for g, k in enumerate(ks):
        a_g = av[m * off: m * (off + k)].reshape(m, k) * np.repeat(sav[:, off // 128: (off + k) // 128], 128, axis=1)
        b_g = bv[n * off: n * (off + k)].reshape(n, k) * np.repeat(sbv[:, off // 128: (off + k) // 128], 128, axis=1)
        out[g] += a_g @ b_g.T
        off += k
    return out


KS = [256, 0, 384, 128]  # one empty group, different lengths


def simulate_k_grouped(monkeypatch) -> list:
    """DFG_SIMULATE=1 (3 simulated SMs, fp32-exact wgmma: compared at fp32 tolerances), and the kinds of the
    k-grouped kernel launches made from now on, appended to the returned list (skips without g++)."""
    if shutil.which("g++") is None:
        pytest.skip("the simulator builds kernels with g++")
    from deep_fp8_gemm.kernels import gemm as gemm_module

    launched = []
    real = gemm_module.launch_k_grouped
    monkeypatch.setattr(gemm_module, "launch_k_grouped",
                        lambda cfg, *args: (launched.append(cfg.kind), real(cfg, *args))[1])
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "3")
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    return launched


@pytest.fixture(params=["cpu", "simulator"])
def path(request, monkeypatch):
    """The CPU reference, or (DFG_SIMULATE=1) the k-grouped kernel in the simulator: the fixture checks that it
    really ran (unless every group is empty: then D = C is written on the host, no launch)."""
    launched = simulate_k_grouped(monkeypatch) if request.param == "simulator" else []
    yield request.param, launched
    if request.param == "simulator":
        assert launched == ["k_grouped"] * len(launched), launched


@pytest.mark.parametrize("in_place", [True, False], ids=["c_is_d", "c_separate"])
def test_k_grouped_matches_float64(path, in_place):
    m, n = 77, 120  # odd m, n not a multiple of the tile widths the heuristic picks
    a, sa, b, sb, c = k_grouped_operands(m, n, KS, seed=3)
    expected = model64(a, sa, b, sb, c, KS, m, n)
    ks_tensor = torch.tensor(KS, dtype=torch.int32)
    if in_place:
        d = c.clone()
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, KS, ks_tensor, d)
    else:
        d = torch.full(c.shape, float("nan"))
        c_before = c.clone()
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, KS, ks_tensor, c, recipe=(1, 1, 128))
        assert torch.equal(c, c_before)
    got = d.double().numpy()
    assert np.isfinite(got).all()
    assert torch.equal(d[1], c[1])  # K_1 = 0: D_1 = C_1 exactly
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4 * np.abs(expected).max())
    assert len(path[1]) == (path[0] == "simulator")


def test_k_grouped_without_c_is_the_plain_product(path):
    m, n, ks = 64, 48, [128, 0, 256]
    a, sa, b, sb, _ = k_grouped_operands(m, n, ks, seed=4)
    d = torch.full((3, m, n), float("nan"))
    deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks)  # ks_tensor built when None
    assert torch.equal(d[1], torch.zeros(m, n))
    np.testing.assert_allclose(d.double().numpy(), model64(a, sa, b, sb, None, ks, m, n), rtol=1e-5, atol=1e-4)
    assert len(path[1]) == (path[0] == "simulator")


def test_k_grouped_all_groups_empty(path):
    m, n, ks = 8, 16, [0, 0]
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=5)
    d = torch.full((2, m, n), float("nan"))
    deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, torch.zeros(2, dtype=torch.int32), c)
    assert torch.equal(d, c)
    assert path[1] == []  # nothing to multiply: D = C on the host


def test_reference_is_float64_exact_to_fp32_rounding():
    m, n, ks = 9, 16, [128, 0, 256]
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=6)
    d = torch.empty(3, m, n)
    reference.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, None, c)
    assert torch.equal(d, torch.from_numpy(model64(a, sa, b, sb, c, ks, m, n)).float())


def test_reference_group_offsets_are_not_interchangeable():
    """Swapping two groups' K changes the result: the model and the op really use per-group offsets."""
    m, n, ks = 16, 16, [128, 256]
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=7)
    d = torch.empty(2, m, n)
    deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, None, c)
    wrong = model64(a, sa, b, sb, c, ks[::-1], m, n)
    assert not np.allclose(d.double().numpy(), wrong, rtol=1e-3)


def test_k_grouped_errors_name_the_argument():
    m, n, ks = 8, 16, [128, 256]
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=8)
    kst = torch.tensor(ks, dtype=torch.int32)
    d = torch.zeros(2, m, n)
    call = deep_gemm.k_grouped_fp8_gemm_nt_contiguous
    with pytest.raises(ValueError, match=r"ks\[1\]=200: every group's K must be a non-negative multiple of 128"):
        call((a, sa), (b, sb), d, [128, 200], kst, d)
    with pytest.raises(ValueError, match=r"ks\[0\]=-128"):
        call((a, sa), (b, sb), d, [-128, 512], kst, d)
    with pytest.raises(TypeError, match="ks must be a list or tuple of Python ints"):
        call((a, sa), (b, sb), d, kst, kst, d)
    with pytest.raises(TypeError, match=r"d must be torch.float32.*d.dtype=torch.bfloat16"):
        call((a, sa), (b, sb), d.bfloat16(), ks, kst, None)
    with pytest.raises(TypeError, match=r"c must be torch.float32, got c.dtype=torch.bfloat16"):
        call((a, sa), (b, sb), d, ks, kst, c.bfloat16())
    with pytest.raises(ValueError, match=r"c must have d's shape \[G, m, n\]=\(2, 8, 16\), got c.shape=\(2, 8, 24\)"):
        call((a, sa), (b, sb), d, ks, kst, torch.zeros(2, 8, 24))
    with pytest.raises(ValueError, match=r"d must be \[G, m, n\] with G=len\(ks\)=2, got d.shape=\(3, 8, 16\)"):
        call((a, sa), (b, sb), torch.zeros(3, m, n), ks, kst, None)
    with pytest.raises(ValueError, match=r"ks_tensor must have len\(ks\)=2 elements, got ks_tensor.shape=\(3,\)"):
        call((a, sa), (b, sb), d, ks, torch.tensor([128, 256, 0], dtype=torch.int32), d)
    with pytest.raises(TypeError, match=r"ks_tensor must be torch.int32, got ks_tensor.dtype=torch.int64"):
        call((a, sa), (b, sb), d, ks, kst.long(), d)
    with pytest.raises(ValueError, match=r"ks_tensor must hold the values of ks=\[128, 256\], got ks_tensor=\[256, 128\]"):
        call((a, sa), (b, sb), d, ks, kst.flip(0).contiguous(), d)
    with pytest.raises(TypeError, match="ks_tensor must be an int32"):
        call((a, sa), (b, sb), d, ks, None, d)
    with pytest.raises(ValueError, match=r"lhs\[0\] \(A\) must have m \* sum\(ks\) = 8 \* 384 = 3072 elements"):
        call((a[:-16], sa), (b, sb), d, ks, kst, d)
    with pytest.raises(ValueError, match=r"rhs\[0\] \(B\) must have n \* sum\(ks\) = 16 \* 384 = 6144 elements"):
        call((a, sa), (b[:-16], sb), d, ks, kst, d)
    with pytest.raises(ValueError, match=r"lhs\[1\] \(sA\) must have shape \[m, sum\(ks\)/128\]=\(8, 3\)"):
        call((a, sa[:, :2]), (b, sb), d, ks, kst, d)
    with pytest.raises(ValueError, match=r"rhs\[1\] \(sB\) must have shape \[n, sum\(ks\)/128\]"):
        call((a, sa), (b, sb[:4]), d, ks, kst, d)
    with pytest.raises(TypeError, match=r"lhs\[0\] \(A\) must be torch.float8_e4m3fn"):
        call((a.float(), sa), (b, sb), d, ks, kst, d)
    with pytest.raises(ValueError, match=r"recipe=\(1, 128, 128\): the k-grouped GEMM exists only with recipe"):
        call((a, sa), (b, sb), d, ks, kst, d, recipe=(1, 128, 128))
    with pytest.raises(ValueError, match="must not overlap c"):
        big = torch.zeros(3 * m * n)
        deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), big[:2 * m * n].view(2, m, n), ks, kst,
                                             big[m * n:].view(2, m, n))
    with pytest.raises(ValueError, match=r"n must be a multiple of 8"):
        n12 = 12
        a2, sa2, b2, sb2, _ = k_grouped_operands(m, n12, ks, seed=9)
        deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a2, sa2), (b2, sb2), torch.zeros(2, m, n12), ks, kst)
    with pytest.raises(ValueError, match=r"d must be contiguous \[G, m, n\]"):
        wide = torch.zeros(2, m, 2 * n)[..., :n]
        deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), wide, ks, kst)


def test_k_grouped_is_a_custom_op_that_torch_compile_traces():
    """fullgraph compile of an in-place main-grad update and of a separate C, on the CPU path."""
    m, n, ks = 16, 24, [128, 0, 256]
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=10)
    kst = torch.tensor(ks, dtype=torch.int32)

    def accumulate(a, sa, b, sb, kst, main_grad):
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), main_grad, ks, kst, main_grad)
        return main_grad

    def separate(a, sa, b, sb, kst, c):
        d = torch.empty_like(c)
        deep_gemm.k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, kst, c)
        return d

    expected = torch.from_numpy(model64(a, sa, b, sb, c, ks, m, n)).float()
    got = torch.compile(accumulate, fullgraph=True, backend="aot_eager")(a, sa, b, sb, kst, c.clone())
    assert torch.equal(got, expected)
    got = torch.compile(separate, fullgraph=True, backend="aot_eager")(a, sa, b, sb, kst, c)
    assert torch.equal(got, expected)
    op = torch.ops.deep_fp8_gemm.k_grouped_gemm_fp8_fp8_fp32_nt.default
    with pytest.raises(ValueError, match="accumulate=True takes c=None"):
        op(a, sa, b, sb, c.clone(), ks, kst, c, True)


# ---------------------------------------------------------------------------------------------- GPU
#: (m, n, ks) of the GPU test: DeepSeek-V3 expert shapes (dW13 [4096, 7168], dW2 [7168, 2048]) with uneven routing
#: (empty experts included), and odd m with n not a multiple of the tile. Checked on the CPU by
#: tests/gpu/test_gpu_cases.py (family "k_grouped").
K_GROUPED_GPU_CASES = [
    (4096, 7168, [512, 0, 1024, 128, 2048, 0, 384, 896]),
    (7168, 2048, [1280, 256, 0, 640]),
    (1000, 200, [0, 384, 128]),
]
GPU_CASE_TABLES = (K_GROUPED_GPU_CASES,)


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("case", K_GROUPED_GPU_CASES)
def test_gpu_k_grouped(case):
    """One launch for all groups on the sm_90 kernel, C separate (d NaN-poisoned) then in place, vs float64."""
    m, n, ks = case
    a, sa, b, sb, c = k_grouped_operands(m, n, ks, seed=17)
    expected = model64(a, sa, b, sb, c, ks, m, n)
    a, sa, b, sb, c = (t.cuda() for t in (a, sa, b, sb, c))
    kst = torch.tensor(ks, dtype=torch.int32, device="cuda")
    d = torch.full(c.shape, float("nan"), device="cuda")
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, kst, c)
    got = d.cpu().double().numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, kst, d)  # d = 2C + 2AB^T - C
    np.testing.assert_allclose(d.cpu().double().numpy(), 2 * expected - c.cpu().double().numpy(), rtol=1e-4,
                               atol=2e-4 * np.abs(expected).max())
