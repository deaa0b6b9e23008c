"""The BF16 / TF32 names (issue 41) through ``deep_gemm`` under ``DFG_SIMULATE=1``: the real sm_90a kernels in the CPU
simulator, with the consumers' call conventions at shapes the simulator runs in seconds (V4's o_proj heads with the
reference test's strided ``y``, the mHC pre-norm with n = 24 and num_splits = 16, SGLang's MoE runner and
batch-invariant mm), each against float64 (calc_diff <= 1e-4; 1e-3 for ``fp8_einsum``) and against the CPU path.
The kernels' own simulator tests (every form, majors, planted bugs): test_sim_bf16_gemm.py, test_sim_hc_prenorm.py.
"""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm.compat.deep_gemm as deep_gemm
from deep_fp8_gemm import calc_diff
from deep_fp8_gemm.compat import per_block_cast_to_fp8, per_token_cast_to_fp8

BF16 = torch.bfloat16
SIM_SMS = 4


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", str(SIM_SMS))
    yield monkeypatch


def _g(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("layout,out", [("nt", BF16), ("nn", torch.float32), ("tn", torch.float32), ("tt", BF16)])
def test_sim_dense_layouts(simulate, layout, out):
    m, n, k = 80, 72, 192
    g = _g(1)
    a = torch.randn(*((m, k) if layout[0] == "n" else (k, m)), generator=g).to(BF16)
    b = torch.randn(*((n, k) if layout[1] == "t" else (k, n)), generator=g).to(BF16)
    c = torch.randn(m, n, generator=g).to(out)
    d = c.clone()
    getattr(deep_gemm, f"bf16_gemm_{layout}")(a, b, d, d)  # accumulate in place
    A = a if layout[0] == "n" else a.T
    B = b if layout[1] == "t" else b.T
    assert calc_diff(d, c.double() + A.double() @ B.double().T) < 1e-4


def test_sim_batch_invariant_mm(simulate):
    """SGLang's batch-invariant mode: bf16_gemm_nn into fp32, a row's bits independent of the batch."""
    g = _g(2)
    x, w = torch.randn(130, 128, generator=g).to(BF16), torch.randn(128, 64, generator=g).to(BF16)
    full, part = torch.empty(130, 64), torch.empty(3, 64)
    deep_gemm.bf16_gemm_nn(x, w, full)
    deep_gemm.bf16_gemm_nn(x[64:67], w, part)
    assert torch.equal(part, full[64:67])
    assert calc_diff(full, x.double() @ w.double()) < 1e-4


def test_sim_moe_runner_masked_and_contiguous(simulate):
    g = _g(3)
    groups, m_max, n, k = 3, 24, 64, 128
    a, b = torch.randn(groups, m_max, k, generator=g).to(BF16), torch.randn(groups, n, k, generator=g).to(BF16)
    d = torch.full((groups, m_max, n), 3.0, dtype=BF16)
    masked_m = torch.tensor([0, 24, 9], dtype=torch.int32)
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 12)
    assert (d[0] == 3).all() and (d[2, 9:] == 3).all()
    assert calc_diff(d[1], a[1].double() @ b[1].double().T) < 1e-4
    assert calc_diff(d[2, :9], a[2, :9].double() @ b[2].double().T) < 1e-4
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    layout = torch.tensor([2] * (align - 5) + [-1] * 5 + [0] * 3, dtype=torch.int32)
    x = torch.randn(layout.numel(), k, generator=g).to(BF16)
    out, ref = torch.zeros(layout.numel(), n, dtype=BF16), torch.zeros(layout.numel(), n, dtype=BF16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, out, layout)
    simulate.delenv("DFG_SIMULATE")
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, ref, layout)
    assert calc_diff(out, ref) < 1e-6 and torch.equal(out[align:] != 0, ref[align:] != 0)


def test_sim_einsum_heads_as_the_reference_tests_them(simulate):
    g = _g(4)
    bsz, h, r, dd = 6, 3, 128, 64
    x = torch.randn(bsz, h, r, generator=g).to(BF16)
    y = torch.randn(h, dd, r + 128, generator=g).to(BF16)[:, :, :r]  # the reference test's strided y
    z = torch.empty(bsz, h, dd, dtype=BF16)
    deep_gemm.einsum("bhr,hdr->bhd", x, y, z)
    assert calc_diff(z, torch.einsum("bhr,hdr->bhd", x.double(), y.double())) < 1e-4
    x2 = torch.randn(bsz, h, dd, generator=g).to(BF16)
    z2 = torch.empty(bsz, h, r, dtype=BF16)
    deep_gemm.einsum("bhd,hdr->bhr", x2, y, z2)
    assert calc_diff(z2, torch.einsum("bhd,hdr->bhr", x2.double(), y.double())) < 1e-4
    s, m, n, k = 3, 64, 64, 64
    a3, b3 = torch.randn(s, m, k, generator=g).to(BF16), torch.randn(s, n, k, generator=g).to(BF16)
    d3 = torch.randn(m, n, generator=g)
    ref = d3.double() + torch.einsum("bmk,bnk->mn", a3.double(), b3.double())
    deep_gemm.einsum("bmk,bnk->mn", a3, b3, d3, c=d3)
    assert calc_diff(d3, ref) < 1e-5


def test_sim_fp8_einsum_as_v4_o_proj_calls_it(simulate):
    bsz, h, r, dd = 5, 2, 256, 128
    x = torch.randn(bsz, h, r, generator=_g(5))
    y = torch.randn(h, dd, r, generator=_g(6))
    xf, sx = per_token_cast_to_fp8(x.view(-1, r), use_ue8m0=True)
    yf = torch.empty(h, dd, r, dtype=torch.float8_e4m3fn)
    sy = torch.empty(h, dd // 128, r // 128)
    for i in range(h):
        yf[i], sy[i] = per_block_cast_to_fp8(y[i], use_ue8m0=True)
    z = torch.empty(bsz, h, dd, dtype=BF16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (xf.view(bsz, h, r), sx.view(bsz, h, -1)), (yf, sy), z)
    assert calc_diff(z, torch.einsum("bhr,hdr->bhd", x.double(), y.double())) < 1e-3


@pytest.mark.parametrize("num_splits", [None, 16])
def test_sim_hc_prenorm_as_v4_mhc_calls_it(simulate, num_splits):
    m, n, k = 70, 24, 16 * 64
    a = torch.randn(m, k, generator=_g(7)).to(BF16)
    b = torch.randn(n, k, generator=_g(8))
    shape_d, shape_s = ((m, n), (m,)) if num_splits is None else ((num_splits, m, n), (num_splits, m))
    d, s = torch.empty(shape_d), torch.empty(shape_s)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d, s, num_splits)
    d_sum, s_sum = (d, s) if num_splits is None else (d.sum(0), s.sum(0))
    assert calc_diff(d_sum, a.double() @ b.double().T) < 1e-4
    assert calc_diff(s_sum, a.double().square().sum(-1)) < 1e-4
    simulate.delenv("DFG_SIMULATE")
    d_ref, s_ref = torch.empty(shape_d), torch.empty(shape_s)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d_ref, s_ref, num_splits)
    assert calc_diff(d, d_ref) < 1e-9 and calc_diff(s, s_ref) < 1e-12


def test_sim_review_findings(simulate):
    """The kernel path computes what the CPU path accepts (issue 41 review): the nn contiguous name (MN-major B),
    K-major rows that are not 16-byte multiples (k = 36, k = 1; einsum heads with r = 36), a strided bf16 d for the
    reduce expression; and refuses a non-contiguous grouped_layout (the reference asserts it) instead of reading it
    as contiguous."""
    g = _g(9)
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    layout = torch.tensor([0] * align + [1] * (align - 3) + [-1] * 3, dtype=torch.int32)
    x = torch.randn(layout.numel(), 64, generator=g).to(BF16)
    w_nk = torch.randn(2, 64, 64, generator=g).to(BF16)
    out_nt, out_nn = torch.zeros(layout.numel(), 64, dtype=BF16), torch.zeros(layout.numel(), 64, dtype=BF16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, w_nk, out_nt, layout)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(x, w_nk.transpose(1, 2).contiguous(), out_nn, layout)
    assert torch.equal(out_nn, out_nt)
    assert calc_diff(out_nt[align:2 * align - 3], x[align:2 * align - 3].double() @ w_nk[1].double().T) < 1e-4
    strided = torch.stack([layout, layout], 1).reshape(-1)[::2]
    with pytest.raises(ValueError, match="grouped_layout must be contiguous"):
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, w_nk, out_nt, strided)
    for k in (36, 1):
        a, b = torch.randn(32, k, generator=g).to(BF16), torch.randn(40, k, generator=g).to(BF16)
        d = torch.empty(32, 40)
        deep_gemm.bf16_gemm_nt(a, b, d)
        assert calc_diff(d, a.double() @ b.double().T) < 1e-6, k
    xh, yh = torch.randn(3, 2, 36, generator=g).to(BF16), torch.randn(2, 16, 36, generator=g).to(BF16)
    zh = torch.empty(3, 2, 16, dtype=BF16)
    deep_gemm.einsum("bhr,hdr->bhd", xh, yh, zh)
    assert calc_diff(zh, torch.einsum("bhr,hdr->bhd", xh.double(), yh.double())) < 1e-4
    a3, b3 = torch.randn(2, 64, 64, generator=g).to(BF16), torch.randn(2, 64, 64, generator=g).to(BF16)
    wide = torch.zeros(64, 80, dtype=BF16)
    deep_gemm.einsum("bmk,bnk->mn", a3, b3, wide[:, :64])
    assert calc_diff(wide[:, :64], torch.einsum("bmk,bnk->mn", a3.double(), b3.double())) < 1e-4
    assert not wide[:, 64:].any()
