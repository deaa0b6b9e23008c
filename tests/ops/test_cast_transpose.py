"""Quantisers of the transposed operands (deep_fp8_gemm.cast_transpose) on the CPU path: bit-identical to the
per-token / per-block quantisers of the transposed tensors, layouts, validation, custom ops under torch.compile.
The fused kernels are checked against the same torch path in tests/test_sim_cast_transpose.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import deep_fp8_gemm as dfg
from deep_fp8_gemm.utils import get_tma_aligned_size

OPS = torch.ops.deep_fp8_gemm


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.contiguous().view(torch.int32)


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.equal(_bits(actual), _bits(expected))


def _input(m: int, k: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # Rows and columns of very different magnitude: a scale taken along the wrong axis changes the bits.
    row_mag = torch.exp2(torch.randint(-6, 6, (m, 1), generator=g).float())
    col_mag = torch.exp2(torch.randint(-6, 6, (1, k), generator=g).float())
    return (torch.randn(m, k, generator=g) * row_mag * col_mag).to(dtype)


@pytest.mark.parametrize("m,k", [(1, 1), (37, 300), (128, 256), (130, 129), (256, 128)])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_cast_transpose_equals_two_per_token_casts(m, k, use_ue8m0):
    x = _input(m, k, seed=m * 1000 + k)
    x_fp8, x_sf, xt_fp8, xt_sf = dfg.per_token_cast_to_fp8_and_transpose(x, use_ue8m0=use_ue8m0)
    ref_x, ref_sx = dfg.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    ref_t, ref_st = dfg.per_token_cast_to_fp8(x.t().contiguous(), use_ue8m0=use_ue8m0)
    for actual, expected in ((x_fp8, ref_x), (x_sf, ref_sx), (xt_fp8, ref_t), (xt_sf, ref_st)):
        assert_same_bits(actual, expected)
        assert actual.stride() == expected.stride()
    assert xt_fp8.shape == (k, m) and xt_fp8.is_contiguous()
    assert xt_sf.shape == (k, -(-m // 128)) and xt_sf.stride() == (1, get_tma_aligned_size(k, 4))
    if use_ue8m0:
        mantissa = _bits(xt_sf) & 0x7FFFFF
        assert int(mantissa.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cast_transpose_other_dtypes_and_strides(dtype):
    base = _input(200, 160, dtype=dtype, seed=3)
    x = base[:, 10:150]  # a row stride that is not k
    out = dfg.per_token_cast_to_fp8_and_transpose(x)
    expected = (*dfg.per_token_cast_to_fp8(x.contiguous()), *dfg.per_token_cast_to_fp8(x.t().contiguous()))
    for actual, ref in zip(out, expected):
        assert_same_bits(actual, ref)


def test_cast_transpose_dequantises_to_x():
    x = _input(96, 384, seed=5).float()
    _, _, xt_fp8, xt_sf = dfg.per_token_cast_to_fp8_and_transpose(x)
    deq = (xt_fp8.float().view(384, 1, 96) * xt_sf.unsqueeze(-1)[:, :, :1]).view(384, 96)  # one group (m < 128)
    assert dfg.calc_diff(deq.t(), x) < 1e-3


def _grouped_reference(x: torch.Tensor, ks: list[int], use_ue8m0: bool):
    """The contract written out: per group, per_token_cast_to_fp8 of x_gᵀ, blocks and scale columns appended."""
    blocks, scales, start = [], [], 0
    for k in ks:
        if k > 0:
            q, s = dfg.per_token_cast_to_fp8(x[start:start + k].t().contiguous(), use_ue8m0=use_ue8m0)
            blocks.append(q.reshape(-1))
            scales.append(s)
        start += k
    n = x.shape[1]
    flat = torch.cat(blocks) if blocks else torch.empty(0, dtype=torch.float8_e4m3fn)
    sf = torch.cat(scales, dim=1) if scales else torch.empty(n, 0)
    return flat, sf


@pytest.mark.parametrize("ks,n", [([128], 1), ([256, 0, 128], 77), ([0, 0], 40), ([128, 384, 0, 128], 130),
                                  ([0], 0)])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_k_grouped_equals_per_group_per_token(ks, n, use_ue8m0):
    x = _input(sum(ks), n, seed=len(ks) * 7 + n)
    flat, sf = dfg.transpose_cast_to_fp8_k_grouped(x, ks, use_ue8m0=use_ue8m0)
    ref_flat, ref_sf = _grouped_reference(x, ks, use_ue8m0)
    assert flat.dim() == 1 and flat.numel() == sum(ks) * n
    assert_same_bits(flat, ref_flat)
    assert_same_bits(sf, ref_sf)
    assert sf.shape == (n, sum(ks) // 128) and sf.stride()[0] == 1


def test_k_grouped_dequantises_to_each_group_transposed():
    """Independent of per_token_cast_to_fp8: block g of flat times its scale columns is x_gᵀ within e4m3 noise."""
    ks, n = [256, 0, 128], 72
    x = _input(sum(ks), n, dtype=torch.float32, seed=9)
    flat, sf = dfg.transpose_cast_to_fp8_k_grouped(x, ks)
    start = 0
    for k in ks:
        block = flat[n * start: n * (start + k)].view(n, k).float()
        scales = sf[:, start // 128: (start + k) // 128].repeat_interleave(128, dim=1)
        if k:
            assert dfg.calc_diff(block * scales, x[start:start + k].t()) < 1e-3
        start += k


def test_k_grouped_accepts_tuple_and_non_contiguous():
    base = _input(256, 96, dtype=torch.float32, seed=11)
    x = base.t().contiguous().t()  # column-major view
    flat, sf = dfg.transpose_cast_to_fp8_k_grouped(x, (128, 128))
    ref_flat, ref_sf = _grouped_reference(base, [128, 128], False)
    assert_same_bits(flat, ref_flat)
    assert_same_bits(sf, ref_sf)


@pytest.mark.parametrize("n,k", [(256, 384), (130, 129), (1, 300), (128, 1)])
def test_transpose_per_block_is_the_block_quantisation_of_wt(n, k):
    w = _input(n, k, dtype=torch.float32, seed=n + k)
    wt_fp8, wt_sf = dfg.transpose_per_block_fp8(*dfg.per_block_cast_to_fp8(w))
    ref_fp8, ref_sf = dfg.per_block_cast_to_fp8(w.t().contiguous())
    assert_same_bits(wt_fp8, ref_fp8)
    assert_same_bits(wt_sf, ref_sf)
    assert wt_fp8.is_contiguous() and wt_sf.is_contiguous()


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("x,exc,match", [
    ([[1.0]], TypeError, "x must be a torch.Tensor"),
    (torch.zeros(4, 4, dtype=torch.int32), TypeError, "x.dtype=torch.int32"),
    (torch.zeros(4), ValueError, r"x.shape=\(4,\)"),
    (torch.zeros(0, 4), ValueError, r"at least one row.*x.shape=\(0, 4\)"),
    (torch.zeros(4, 0), ValueError, r"at least one column.*x.shape=\(4, 0\)"),
])
def test_cast_transpose_rejects_bad_x(x, exc, match):
    with pytest.raises(exc, match=match):
        dfg.per_token_cast_to_fp8_and_transpose(x)


def test_cast_transpose_rejects_non_bool_flag():
    with pytest.raises(TypeError, match="use_ue8m0 must be a bool"):
        dfg.per_token_cast_to_fp8_and_transpose(torch.zeros(4, 4), use_ue8m0=1)


@pytest.mark.parametrize("x,ks,exc,match", [
    (torch.zeros(128, 4), torch.tensor([128]), TypeError, "ks must be a list or tuple"),
    (torch.zeros(128, 4), [128.0], TypeError, r"ks\[0\] must be a Python int"),
    (torch.zeros(128, 4), [True], TypeError, r"ks\[0\] must be a Python int"),
    (torch.zeros(192, 4), [64, 128], ValueError, r"ks\[0\]=64.*multiple of 128"),
    (torch.zeros(128, 4), [-128, 256], ValueError, r"ks\[0\]=-128"),
    (torch.zeros(256, 4), [128], ValueError, r"x.shape=\(256, 4\) and sum\(ks\)=128"),
    (torch.zeros(0, 4), [], ValueError, "at least one group"),
    (torch.zeros(128, 4, dtype=torch.float8_e4m3fn), [128], TypeError, "x.dtype=torch.float8_e4m3fn"),
    (torch.zeros(128), [128], ValueError, r"x must be 2-D"),
])
def test_k_grouped_rejects_bad_input(x, ks, exc, match):
    with pytest.raises(exc, match=match):
        dfg.transpose_cast_to_fp8_k_grouped(x, ks)


def test_transpose_per_block_rejects_bad_input():
    w_fp8, w_sf = dfg.per_block_cast_to_fp8(torch.randn(200, 300))
    with pytest.raises(TypeError, match="w_fp8.dtype=torch.float32"):
        dfg.transpose_per_block_fp8(w_fp8.float(), w_sf)
    with pytest.raises(TypeError, match="w_sf.dtype=torch.float64"):
        dfg.transpose_per_block_fp8(w_fp8, w_sf.double())
    with pytest.raises(ValueError, match=r"\[2, 3\].*w_sf.shape=\(3, 2\)"):
        dfg.transpose_per_block_fp8(w_fp8, w_sf.t())
    with pytest.raises(ValueError, match=r"w_fp8.shape=\(60000,\)"):
        dfg.transpose_per_block_fp8(w_fp8.view(-1), w_sf)
    with pytest.raises(TypeError, match="w_sf must be a torch.Tensor"):
        dfg.transpose_per_block_fp8(w_fp8, None)


# ---------------------------------------------------------------------------------------------- custom ops
def test_opcheck_cast_transpose():
    torch.library.opcheck(OPS.per_token_cast_to_fp8_and_transpose.default,
                          (_input(37, 300),), test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


def test_opcheck_k_grouped():
    torch.library.opcheck(OPS.transpose_cast_to_fp8_k_grouped.default,
                          (_input(384, 70), [128, 0, 256]), test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


def test_fake_layouts_match_real():
    x, xg = _input(37, 300), _input(256, 37)
    real = dfg.per_token_cast_to_fp8_and_transpose(x), dfg.transpose_cast_to_fp8_k_grouped(xg, [256, 0])
    with FakeTensorMode() as mode:
        fake = (dfg.per_token_cast_to_fp8_and_transpose(mode.from_tensor(x)),
                dfg.transpose_cast_to_fp8_k_grouped(mode.from_tensor(xg), [256, 0]))
    for real_out, fake_out in zip(real, fake):
        for r, f in zip(real_out, fake_out):
            assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)


def _wgrad_operands(x, dy, ks):
    """Model-style code: both k-grouped operands, then a following op."""
    a, sa = dfg.transpose_cast_to_fp8_k_grouped(dy, ks)
    b, sb = dfg.transpose_cast_to_fp8_k_grouped(x, ks)
    _, _, xt, sxt = dfg.per_token_cast_to_fp8_and_transpose(x)
    return a.float() * 2, sa + 1, b.float(), sb, xt.float(), sxt


def test_compile_fullgraph_traces_the_quantisers():
    torch._dynamo.reset()
    try:
        x, dy = _input(256, 64, seed=1), _input(256, 40, seed=2)
        compiled = torch.compile(_wgrad_operands, fullgraph=True, backend="aot_eager")
        for actual, expected in zip(compiled(x, dy, [128, 128]), _wgrad_operands(x, dy, [128, 128])):
            assert torch.equal(actual, expected)
    finally:
        torch._dynamo.reset()
