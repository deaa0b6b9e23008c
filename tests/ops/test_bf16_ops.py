"""The BF16 / TF32 names (issue 41) through ``deep_gemm`` (the facade) on CPU tensors: every name against float64 with
the consumers' call shapes, the reference's SM90 refusals as named errors, the output contracts, batch invariance.
The simulator and GPU runs of the same names: tests/kernels/test_sim_bf16_ops.py, tests/gpu/test_gpu_bf16.py."""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm.compat.deep_gemm as deep_gemm
from deep_fp8_gemm import calc_diff
from deep_fp8_gemm._core.hc_prenorm_math import tf32_operand
from deep_fp8_gemm.compat import per_block_cast_to_fp8, per_token_cast_to_fp8

BF16, F32 = torch.bfloat16, torch.float32


def _bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


# --------------------------------------------------------------------------------------------------- dense
@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
@pytest.mark.parametrize("out", [BF16, F32])
def test_dense_layouts_against_float64(layout, out):
    m, n, k = 67, 40, 136
    a = _bf16(*((m, k) if layout[0] == "n" else (k, m)), seed=1)
    b = _bf16(*((n, k) if layout[1] == "t" else (k, n)), seed=2)
    A = a if layout[0] == "n" else a.T
    B = b if layout[1] == "t" else b.T
    ref = A.double() @ B.double().T
    d = torch.empty(m, n, dtype=out)
    getattr(deep_gemm, f"bf16_gemm_{layout}")(a, b, d)
    assert calc_diff(d, ref) < (1e-4 if out == BF16 else 1e-12)
    c = torch.randn(m, n).to(out)
    d2 = torch.empty(m, n, dtype=out)
    getattr(deep_gemm, f"bf16_gemm_{layout}")(a, b, d2, c)
    assert calc_diff(d2, ref + c.double()) < (1e-4 if out == BF16 else 1e-12)
    getattr(deep_gemm, f"bf16_gemm_{layout}")(a, b, c, c)  # in place: c is d
    assert torch.equal(c, d2)


def test_sglang_batch_invariant_mm_bits_do_not_depend_on_the_batch():
    """SGLang's batch-invariant mode routes mm through bf16_gemm_nn into fp32: row r's bits are the same whatever
    the other rows are (the matmuls run in fixed 48-row blocks)."""
    k, n = 4096, 256
    w = _bf16(k, n, seed=3)
    x = _bf16(300, k, seed=4)
    full = torch.empty(300, n)
    deep_gemm.bf16_gemm_nn(x, w, full)
    for rows in (1, 7, 48, 49, 131):
        part = torch.empty(rows, n)
        deep_gemm.bf16_gemm_nn(x[-rows:], w, part)
        assert torch.equal(part, full[-rows:]), rows


def test_dense_refusals_name_the_argument():
    a, b = _bf16(8, 64), _bf16(16, 64)
    with pytest.raises(TypeError, match="a must be torch.bfloat16"):
        deep_gemm.bf16_gemm_nt(a.float(), b, torch.empty(8, 16))
    with pytest.raises(TypeError, match="d must be torch.bfloat16 or torch.float32"):
        deep_gemm.bf16_gemm_nt(a, b, torch.empty(8, 16, dtype=torch.float16))
    with pytest.raises(TypeError, match="c must have d's dtype"):
        deep_gemm.bf16_gemm_nt(a, b, torch.empty(8, 16), torch.empty(8, 16, dtype=BF16))
    with pytest.raises(ValueError, match="shapes do not agree"):
        deep_gemm.bf16_gemm_nn(a, b, torch.empty(8, 16))
    with pytest.raises(ValueError, match="d must be row-major"):
        deep_gemm.bf16_gemm_nt(a, b, torch.empty(16, 8).T)
    with pytest.raises(ValueError, match="compiled_dims"):
        deep_gemm.bf16_gemm_nt(a, b, torch.empty(8, 16), compiled_dims="xy")
    d = torch.empty(8, 16)
    with pytest.raises(ValueError, match="d overlaps itself"):
        deep_gemm.bf16_gemm_nt(a, b, torch.empty(1, 16).expand(8, 16))
    wide = torch.empty(8, 64, dtype=BF16)
    with pytest.raises(ValueError, match="d must not overlap a"):
        deep_gemm.bf16_gemm_nt(wide, b, wide[:, :16])
    deep_gemm.bf16_gemm_nt(a[:, :0], b[:, :0], d)  # k == 0: zeros
    assert not d.any()


# ------------------------------------------------------------------------------------------------- grouped
def test_sglang_bf16_moe_runner_masked_and_contiguous():
    g, m_max, n, k = 4, 32, 128, 192
    a, b = _bf16(g, m_max, k, seed=5), _bf16(g, n, k, seed=6)
    d = torch.full((g, m_max, n), 7.0, dtype=BF16)
    masked_m = torch.tensor([0, 32, 5, 17], dtype=torch.int32)
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 16)
    for grp, rows in enumerate(masked_m.tolist()):
        assert (d[grp, rows:] == 7).all()
        if rows:
            assert calc_diff(d[grp, :rows], a[grp, :rows].double() @ b[grp].double().T) < 1e-4
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    layout = torch.tensor([1] * align + [3] * (align - 9) + [-1] * 9 + [0] * 5, dtype=torch.int32)
    x = _bf16(layout.numel(), k, seed=7)
    out = torch.zeros(layout.numel(), n, dtype=BF16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, out, layout)
    for grp, rows in ((1, slice(0, align)), (3, slice(align, 2 * align - 9)), (0, slice(2 * align, None))):
        assert calc_diff(out[rows], x[rows].double() @ b[grp].double().T) < 1e-4
    out_nn = torch.zeros_like(out)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(x, b.transpose(1, 2).contiguous(), out_nn, layout)
    assert torch.equal(out_nn, out)


def test_contiguous_psum_layout():
    g, n, k = 3, 64, 128
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    ends = torch.tensor([10, 10, align + 50], dtype=torch.int32)  # group 1 empty, group 2 starts at align
    b, x = _bf16(g, n, k, seed=8), _bf16(2 * align, k, seed=9)
    out = torch.zeros(2 * align, n, dtype=BF16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, out, ends, use_psum_layout=True)
    assert calc_diff(out[:10], x[:10].double() @ b[0].double().T) < 1e-4
    assert calc_diff(out[align:align + 50], x[align:align + 50].double() @ b[2].double().T) < 1e-4
    with pytest.raises(ValueError, match="expected_m_for_psum_layout is only for use_psum_layout=True"):
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, out, ends, expected_m_for_psum_layout=4)


def test_grouped_refusals():
    a, b = _bf16(2, 8, 96), _bf16(2, 16, 96)
    d = torch.empty(2, 8, 16, dtype=BF16)
    with pytest.raises(ValueError, match="k must be a multiple of 64"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, torch.tensor([1, 2], dtype=torch.int32), 4)
    a, b = _bf16(2, 8, 128), _bf16(2, 16, 128)
    with pytest.raises(TypeError, match="d must be torch.bfloat16"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d.float(), torch.tensor([1, 2], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="b must be K-major"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b.transpose(1, 2).contiguous().transpose(1, 2), d,
                                                torch.tensor([1, 2], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="masked_m"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, torch.tensor([1, 9], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="expected_m"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, torch.tensor([1, 2], dtype=torch.int32), 0)
    x, out = _bf16(16, 128), torch.empty(16, 16, dtype=BF16)
    with pytest.raises(ValueError, match="grouped_layout"):
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, out, torch.tensor([0] * 15 + [5], dtype=torch.int32))
    with pytest.raises(ValueError, match="a must be K-major"):
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(_bf16(128, 16).T, b, out, torch.zeros(16, dtype=torch.int32))


# -------------------------------------------------------------------------------------------------- einsum
def test_einsum_expressions_as_the_reference_tests_them():
    s, m, n, k = 5, 64, 128, 64
    a, b = _bf16(s, m, k, seed=10), _bf16(s, n, k, seed=11)
    d = torch.randn(m, n)
    ref = d.double() + torch.einsum("bmk,bnk->mn", a.double(), b.double())
    deep_gemm.einsum("bmk,bnk->mn", a, b, d, c=d)
    assert calc_diff(d, ref) < 1e-12
    d16 = torch.empty(m, n, dtype=BF16)
    deep_gemm.einsum("bmk,bnk->mn", a, b, d16)
    assert calc_diff(d16, ref - ref + torch.einsum("bmk,bnk->mn", a.double(), b.double())) < 1e-4
    # V4's o_proj heads (the reference's test slices y from a wider buffer)
    bsz, h, r, dd = 9, 8, 512, 128
    x = _bf16(bsz, h, r, seed=12)
    y = _bf16(h, dd, r + 128, seed=13)[:, :, :r]
    z = torch.empty(bsz, h, dd, dtype=BF16)
    deep_gemm.einsum("bhr,hdr->bhd", x, y, z)
    assert calc_diff(z, torch.einsum("bhr,hdr->bhd", x.double(), y.double())) < 1e-4
    x2 = _bf16(bsz, h, dd, seed=14)
    z2 = torch.empty(bsz, h, r, dtype=BF16)
    deep_gemm.einsum("bhd,hdr->bhr", x2, y, z2)
    assert calc_diff(z2, torch.einsum("bhd,hdr->bhr", x2.double(), y.double())) < 1e-4


def test_einsum_refusals():
    a, b = _bf16(2, 64, 64), _bf16(2, 64, 64)
    d = torch.zeros(64, 64)
    with pytest.raises(ValueError, match="expr must be one of"):
        deep_gemm.einsum("ij,jk->ik", a, b, d)
    with pytest.raises(ValueError, match="c must be d itself"):
        deep_gemm.einsum("bmk,bnk->mn", a, b, d)
    with pytest.raises(ValueError, match="use_cublaslt must be False"):
        deep_gemm.einsum("bmk,bnk->mn", a, b, d, d, use_cublaslt=True)
    with pytest.raises(ValueError, match="multiples of 64"):
        deep_gemm.einsum("bmk,bnk->mn", _bf16(2, 32, 64), _bf16(2, 64, 64), torch.zeros(32, 64, dtype=BF16))
    with pytest.raises(ValueError, match="c must be None"):
        deep_gemm.einsum("bhr,hdr->bhd", _bf16(3, 2, 64), _bf16(2, 16, 64), torch.empty(3, 2, 16, dtype=BF16),
                         torch.empty(3, 2, 16, dtype=BF16))
    with pytest.raises(TypeError, match="d must be torch.bfloat16"):
        deep_gemm.einsum("bhr,hdr->bhd", _bf16(3, 2, 64), _bf16(2, 16, 64), torch.empty(3, 2, 16))


def _fp8_heads(bsz, h, r, dd, seed):
    x = torch.randn(bsz, h, r, generator=torch.Generator().manual_seed(seed))
    y = torch.randn(h, dd, r, generator=torch.Generator().manual_seed(seed + 1))
    xf, sx = per_token_cast_to_fp8(x.view(-1, r), use_ue8m0=True)
    yf = torch.empty(h, dd, r, dtype=torch.float8_e4m3fn)
    sy = torch.empty(h, (dd + 127) // 128, (r + 127) // 128)
    for i in range(h):
        yf[i], sy[i] = per_block_cast_to_fp8(y[i], use_ue8m0=True)
    return x, y, (xf.view(bsz, h, r), sx.view(bsz, h, -1)), (yf, sy)


def test_fp8_einsum_as_v4_o_proj_calls_it():
    x, y, a, b = _fp8_heads(17, 8, 512, 256, seed=20)
    z = torch.empty(17, 8, 256, dtype=BF16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", a, b, z)
    assert calc_diff(z, torch.einsum("bhr,hdr->bhd", x.double(), y.double())) < 1e-3
    c = torch.randn(17, 8, 256).to(BF16)
    z2 = c.clone()
    deep_gemm.fp8_einsum("bhr,hdr->bhd", a, b, z2, z2)
    assert torch.equal(z2, (c.float() + z.float()).to(BF16))
    with pytest.raises(ValueError, match="recipe must be"):
        deep_gemm.fp8_einsum("bhr,hdr->bhd", a, b, z, recipe=(1, 1, 128))
    with pytest.raises(ValueError, match="SM100 paths"):
        deep_gemm.fp8_einsum("bhd,hdr->bhr", a, b, z)
    # batch invariance: a token's bits do not depend on the other tokens
    z_one = torch.empty(1, 8, 256, dtype=BF16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (a[0][5:6], a[1][5:6]), b, z_one)
    assert torch.equal(z_one[0], z[5])


# -------------------------------------------------------------------------------------------- hc prenorm
@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_hc_prenorm_as_v4_mhc_calls_it(num_splits):
    m, n, k = 70, 24, 4 * 256  # n = 24 (mHC's 2·hc + hc²), k = hc_mult · hidden (shrunk)
    a = _bf16(m, k, seed=30)
    b = torch.randn(n, k, generator=torch.Generator().manual_seed(31))
    shape_d, shape_s = ((m, n), (m,)) if num_splits is None else ((num_splits, m, n), (num_splits, m))
    d, s = torch.empty(shape_d), torch.empty(shape_s)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d, s, num_splits)
    d_sum, s_sum = (d, s) if num_splits is None else (d.sum(0), s.sum(0))
    assert calc_diff(d_sum, a.double() @ b.double().T) < 1e-4
    assert calc_diff(s_sum, a.double().square().sum(-1)) < 1e-4
    if num_splits == 16:  # 16 K blocks: one per split, each split its own range (b as the tensor core reads it)
        lo, hi = 3 * 64, 4 * 64
        b_tf32 = tf32_operand(b)[:, lo:hi].double()
        assert torch.allclose(d[3], (a[:, lo:hi].double() @ b_tf32.T).float(), rtol=1e-6, atol=1e-5)


def test_hc_prenorm_refusals():
    a, b = _bf16(4, 128), torch.randn(24, 128)
    with pytest.raises(ValueError, match="n must be a multiple of 8 and at most 32"):
        deep_gemm.tf32_hc_prenorm_gemm(a, torch.randn(40, 128), torch.empty(4, 40), torch.empty(4))
    with pytest.raises(ValueError, match="k must be a multiple of 64"):
        deep_gemm.tf32_hc_prenorm_gemm(_bf16(4, 96), torch.randn(24, 96), torch.empty(4, 24), torch.empty(4))
    with pytest.raises(TypeError, match="b must be torch.float32"):
        deep_gemm.tf32_hc_prenorm_gemm(a, b.to(BF16), torch.empty(4, 24), torch.empty(4))
    with pytest.raises(ValueError, match="shapes do not agree"):
        deep_gemm.tf32_hc_prenorm_gemm(a, b, torch.empty(4, 24), torch.empty(4), 2)
    with pytest.raises(ValueError, match="num_splits"):
        deep_gemm.tf32_hc_prenorm_gemm(a, b, torch.empty(0, 4, 24), torch.empty(0, 4), 0)
    buf = torch.empty(4 * 24 + 4)
    with pytest.raises(ValueError, match="must not overlap"):
        deep_gemm.tf32_hc_prenorm_gemm(a, b, buf[:96].view(4, 24), buf[90:94])


def test_review_refusals():
    """Issue 41 review: a c aliasing d with other strides in fp8_einsum, a self-overlapping hc-prenorm d, a c on
    another device, and fp8_einsum's errors naming the user's arguments, not the masked kernel's."""
    x, y, a, b = _fp8_heads(3, 2, 128, 128, seed=40)
    buf = torch.randn(3 * 2 * 136).to(BF16)
    d = buf[:3 * 2 * 128].view(3, 2, 128)
    c = buf.view(3, 2, 136)[..., :128]
    with pytest.raises(ValueError, match="c starts where d does but has other strides"):
        deep_gemm.fp8_einsum("bhr,hdr->bhd", a, b, d, c=c)
    with pytest.raises(ValueError, match="one device"):
        deep_gemm.fp8_einsum("bhr,hdr->bhd", a, b, torch.empty(3, 2, 128, dtype=BF16),
                             c=torch.empty(3, 2, 128, dtype=BF16, device="meta"))
    with pytest.raises(ValueError, match=r"a\[1\] must have shape"):
        deep_gemm.fp8_einsum("bhr,hdr->bhd", (a[0], a[1][:, :1]), b, torch.empty(3, 2, 128, dtype=BF16))
    with pytest.raises(ValueError, match="d overlaps itself"):
        deep_gemm.tf32_hc_prenorm_gemm(_bf16(13, 64), torch.randn(24, 64), torch.empty(1, 24).expand(13, 24),
                                       torch.empty(13))
    with pytest.raises(ValueError, match="masked_m must be contiguous"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(_bf16(2, 8, 64), _bf16(2, 16, 64), torch.empty(2, 8, 16, dtype=BF16),
                                                torch.tensor([1, 0, 2, 0], dtype=torch.int32)[::2], 4)
