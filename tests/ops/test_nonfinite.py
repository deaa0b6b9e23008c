"""What each op does with NaN / inf inputs (issue 24, item 6; docs/api.md "Errors and non-finite values").

The quantisers follow the reference design's casts (``deep_gemm/utils/math.py``): a NaN makes its scale group's
scale and every code NaN; an inf makes the scale inf, the finite elements code 0 and the inf element NaN
(``inf / inf``); with UE8M0 scales a NaN / inf scale becomes ``2^127`` (the exponent clamp), finite elements code
0, a NaN element NaN and an inf element ±448. The GEMMs then propagate: a poisoned A group makes its output row
non-finite, a poisoned 128x128 B block the output's 128 columns of that block (every row), a poisoned per-row B
scale (1D1D) its one column; everything else stays finite. With UE8M0 the flushed groups contribute 0, so only
a NaN element's own row / column is NaN, and an inf element gives products of about 448·2^127·|b| (mostly ±inf). Shown on the CPU path and, for the fused quantiser and
the dense kernel, in the simulator.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import quant
from deep_fp8_gemm.compat import casts as deep_gemm_casts

NAN, INF = float("nan"), float("inf")


def _codes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).int()


def _is_nan_code(t: torch.Tensor) -> torch.Tensor:
    return (_codes(t) & 0x7F) == 0x7F


def _check_group(codes: torch.Tensor, scale: torch.Tensor, values: torch.Tensor, use_ue8m0: bool) -> None:
    """The cast rule for one scale group: ``codes`` / ``values`` flat over the group, ``scale`` 0-dim."""
    has_nan, has_inf = values.isnan().any(), values.isinf().any()
    if use_ue8m0 and (has_nan or has_inf):
        assert scale.item() == 2.0 ** 127
        assert _is_nan_code(codes[values.isnan()]).all()
        inf_codes = _codes(codes[values.isinf()])
        assert ((inf_codes & 0x7F) == 0x7E).all(), "an inf element saturates to ±448"
        assert (_codes(codes[values.isfinite()]) & 0x7F == 0).all(), "finite elements flush to 0"
    elif has_nan:
        assert scale.isnan() and _is_nan_code(codes).all()
    elif has_inf:
        assert scale.isinf()
        assert _is_nan_code(codes[values.isinf()]).all()
        assert (_codes(codes[values.isfinite()]) & 0x7F == 0).all()
    else:
        assert scale.isfinite() and not _is_nan_code(codes).any()


def _poisoned(shape, seed, spots):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    for index, value in spots:
        x[index] = value
    return x


_SPOTS = (((1, 5), NAN), ((2, 130), INF), ((3, 0), -INF))


@pytest.mark.parametrize("module", (quant, deep_gemm_casts), ids=("deep_fp8_gemm", "deep_gemm_casts"))
@pytest.mark.parametrize("use_ue8m0", (False, True))
def test_per_token_per_block_per_channel(module, use_ue8m0):
    x = _poisoned((256, 300), 1, _SPOTS).bfloat16()
    codes, sf = module.per_token_cast_to_fp8(x, use_ue8m0)
    for r in range(4):
        for g in range(3):
            cols = slice(128 * g, 128 * g + 128)
            _check_group(codes[r, cols], sf[r, g], x[r, cols].float(), use_ue8m0)
    codes, sf = module.per_block_cast_to_fp8(x, use_ue8m0)
    for g in range(3):
        cols = slice(128 * g, 128 * g + 128)
        _check_group(codes[:128, cols].reshape(-1), sf[0, g], x[:128, cols].float().reshape(-1), use_ue8m0)
    assert sf[1].isfinite().all() and not _is_nan_code(codes[128:]).any()
    codes, sf = module.per_channel_cast_to_fp8(x, use_ue8m0)
    for c in (0, 5, 130, 7):
        _check_group(codes[:128, c], sf[0, c], x[:128, c].float(), use_ue8m0)


def test_silu_mul_quant():
    # SiLU(-inf) = -inf * sigmoid(-inf) = NaN and SiLU(inf) * 0 = NaN: y is per-token quantised like any input.
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(2))
    x[0, 3], x[1, 10], x[2, 256 + 20] = -INF, NAN, INF
    codes, sf = quant.silu_mul_quant(x)
    y = torch.nn.functional.silu(x[:, :256]) * x[:, 256:]
    for r in range(4):
        for g in range(2):
            cols = slice(128 * g, 128 * g + 128)
            _check_group(codes[r, cols], sf[r, g], y[r, cols], False)


def test_cast_transposes():
    x = _poisoned((256, 256), 3, (((1, 5), NAN), ((200, 130), INF))).bfloat16()
    x_fp8, x_sf, xt_fp8, xt_sf = dfg.per_token_cast_to_fp8_and_transpose(x)
    ref = quant.per_token_cast_to_fp8_torch(x)
    ref_t = quant.per_token_cast_to_fp8_torch(x.t().contiguous())
    for got, want in ((x_fp8, ref[0]), (xt_fp8, ref_t[0])):
        assert torch.equal(_is_nan_code(got), _is_nan_code(want))
    _check_group(xt_fp8[5, :128], xt_sf[5, 0], x[:128, 5].float(), False)  # x's NaN poisons column 5's group
    flat, sf = dfg.transpose_cast_to_fp8_k_grouped(x, [128, 128])
    _check_group(flat[5 * 128:6 * 128], sf[5, 0], x[:128, 5].float(), False)
    w_fp8, w_sf = dfg.per_block_cast_to_fp8(x)
    wt_fp8, wt_sf = dfg.transpose_per_block_fp8(w_fp8, w_sf)
    assert torch.equal(_is_nan_code(wt_fp8), _is_nan_code(w_fp8).t()) and torch.equal(wt_sf.isnan(), w_sf.isnan().t())


def _gemm_operands(m, n, k, a_spots, b_spots, use_ue8m0=False, groups=None):
    a, sa = dfg.per_token_cast_to_fp8(_poisoned((m, k), 4, a_spots), use_ue8m0)
    if groups is None:
        b, sb = dfg.per_block_cast_to_fp8(_poisoned((n, k), 5, b_spots), use_ue8m0)
    else:
        pairs = [dfg.per_block_cast_to_fp8(_poisoned((n, k), 5 + g, b_spots if g == 1 else ()), use_ue8m0)
                 for g in range(groups)]
        b, sb = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    return (a, sa), (b, sb)


def _assert_pattern(out: torch.Tensor, bad_rows, bad_cols) -> None:
    bad = torch.zeros(out.shape, dtype=torch.bool)
    bad[list(bad_rows), :] = True
    bad[:, list(bad_cols)] = True
    assert (~out[bad].float().isfinite()).all(), "poisoned rows / columns must be non-finite"
    assert out[~bad].float().isfinite().all(), "everything else stays finite"


@pytest.mark.parametrize("use_ue8m0", (False, True))
def test_dense_gemm(use_ue8m0):
    # A: a NaN in row 1, an inf in row 2; B: a NaN in row 130 (128-row block 1, columns 128..255 of the output).
    lhs, rhs = _gemm_operands(64, 384, 256, (((1, 5), NAN), ((2, 200), INF)), (((130, 7), NAN),), use_ue8m0)
    out = torch.empty(64, 384, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    if not use_ue8m0:
        _assert_pattern(out, (1, 2), range(128, 256))
        return
    # UE8M0: the 2^127 scale flushes the poisoned groups' finite elements to 0, so only the NaN elements' own
    # row / column stay NaN (B's NaN: column 130 only), and row 2's inf (code 448 under 2^127) gives huge
    # products, mostly overflowing to ±inf, finite where B's element is small.
    row2 = out[2].float()
    assert (~row2.isfinite()).any() and ((~row2.isfinite()) | (row2.abs() > 1e30) | (row2 == 0)).all()
    keep = [r for r in range(64) if r != 2]
    _assert_pattern(out[keep], (1,), (130,))


def test_grouped_gemms():
    # contiguous / psum / masked: a NaN in expert 1's weight poisons only expert 1's rows, output block 0.
    lhs, rhs = _gemm_operands(256, 256, 128, (((3, 1), NAN),), (((4, 2), NAN),), groups=3)
    m_indices = torch.tensor([0] * 128 + [1] * 100 + [-1] * 28, dtype=torch.int32)
    out = torch.zeros(256, 256, dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, m_indices)
    rows = out[:228]
    bad = torch.zeros(rows.shape, dtype=torch.bool)
    bad[3] = True
    bad[128:228, :128] = True
    assert (~rows[bad].float().isfinite()).all() and rows[~bad].float().isfinite().all()
    out_psum = torch.zeros_like(out)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum(lhs, rhs, out_psum, torch.tensor([128, 228, 228],
                                                                                          dtype=torch.int32))
    assert torch.equal(out_psum[:228].isnan(), out[:228].isnan())
    a, sa = lhs
    a3, sa3 = a[:192].view(3, 64, 128), sa.contiguous()[:192].view(3, 64, 1)
    masked_out = torch.zeros(3, 64, 256, dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, sa3), rhs, masked_out, torch.tensor([64, 64, 0], dtype=torch.int32),
                                              64)
    assert (~masked_out[0, 3].float().isfinite()).all() and (~masked_out[1, :, :128].float().isfinite()).all()
    assert masked_out[1, :, 128:].float().isfinite().all() and masked_out[0, :3].float().isfinite().all()


def test_weight_gradient_gemms():
    # 1D1D: per-row B scales, so a NaN in B row 7 poisons output column 7 only; a NaN in A row 2 its row.
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(256, 64, generator=g), torch.randn(256, 32, generator=g)
    x[10, 2], y[20, 7] = NAN, NAN
    a, sa = dfg.per_token_cast_to_fp8(x.t().contiguous())
    b, sb = dfg.per_token_cast_to_fp8(y.t().contiguous())
    d = torch.zeros(64, 32)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, d)
    _assert_pattern(d, (2,), (7,))
    fa, fsa = dfg.transpose_cast_to_fp8_k_grouped(x, [128, 128])
    fb, fsb = dfg.transpose_cast_to_fp8_k_grouped(y, [128, 128])
    dk = torch.zeros(2, 64, 32)
    dfg.k_grouped_fp8_gemm_nt_contiguous((fa, fsa), (fb, fsb), dk, [128, 128], torch.tensor([128, 128],
                                                                                             dtype=torch.int32), dk)
    _assert_pattern(dk[0], (2,), (7,))
    assert dk[1].isfinite().all(), "the other group stays finite"


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
def test_simulated_kernels_on_nonfinite_data(monkeypatch):
    """The fused per-token quantiser and the dense kernel in the simulator behave as the CPU path."""
    x = _poisoned((64, 256), 7, (((1, 5), NAN), ((2, 200), INF))).bfloat16()
    cpu = dfg.per_token_cast_to_fp8(x)
    lhs, rhs = _gemm_operands(64, 256, 256, (((1, 5), NAN), ((2, 200), INF)), (((130, 7), NAN),))
    out_cpu = torch.empty(64, 256, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt(lhs, rhs, out_cpu)
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "2")
    sim = dfg.per_token_cast_to_fp8(x)
    assert torch.equal(_is_nan_code(sim[0]), _is_nan_code(cpu[0]))
    assert torch.equal(sim[1].isnan(), cpu[1].isnan()) and torch.equal(sim[1].isinf(), cpu[1].isinf())
    out = torch.empty(64, 256, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    _assert_pattern(out, (1, 2), range(128, 256))
    assert torch.equal(out.isnan(), out_cpu.isnan())
