"""The 1x32 / 32x32 recipe (issue 39; kinds table granularity "1x32/32x32", kind ``dense_block32``) on the CPU: the
table's rules, the config rules and heuristic, the public op's checks and exact reference (promotion every 32 K, in
K order, against an independent numpy model and against float64), the quantisers' 1x32 / 32x32 forms and the
``deep_gemm`` drop-in's ``recipe=(1, 32, 32)`` with SGLang's calling conventions. The kernel itself:
tests/kernels/test_sim_block32.py (simulator), tests/gpu/test_gpu_block32.py (sm_90)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import compat
from deep_fp8_gemm.config import BLOCK32_BLOCK_N, GemmConfig, check_config, get_config
from deep_fp8_gemm.kinds import TABLE
from deep_fp8_gemm.quant import per_token_cast_to_fp8_torch
from tests._operands import gemm64, quantised_activations, quantised_weights

SHAPES = [(1, 64, 128), (70, 200, 352), (130, 256, 256), (33, 136, 96)]  # k % 128 != 0, n tails, one 32-group


def operands(m, n, k, seed=0, use_ue8m0=False):
    a, sa = quantised_activations((m, k), seed, gran_k=32, use_ue8m0=use_ue8m0)
    b, sb = quantised_weights((n, k), seed + 1, gran_k=32, use_ue8m0=use_ue8m0)
    return a, sa, b, sb


def promoted_numpy(a, sa, b, sb) -> np.ndarray:
    """The kernel's arithmetic, written independently: per 32-wide K group j the exact partial of the e4m3 products
    (float64: 32 products of < 2^36 multiples of 2^-18 sum exactly), rounded to fp32; the fp32 product sA x sB; the
    promotion acc = fp32(acc + partial x scale) in K order."""
    av, bv = a.float().double().numpy(), b.float().double().numpy()
    m, k = av.shape
    n = bv.shape[0]
    acc = np.zeros((m, n), dtype=np.float32)
    for j in range((k + 31) // 32):
        part = (av[:, 32 * j: 32 * j + 32] @ bv[:, 32 * j: 32 * j + 32].T).astype(np.float32)
        scale = sa[:, j].numpy().astype(np.float32)[:, None] * np.repeat(sb[:, j].numpy(), 32)[:n].astype(np.float32)[None, :]
        acc = (acc.astype(np.float64) + part.astype(np.float64) * scale.astype(np.float64)).astype(np.float32)
    return acc


# ---------------------------------------------------------------------------------------------- the table
def test_the_recipe_is_a_value_on_the_granularity_axis():
    row = TABLE.row("dense_block32")
    assert (row.layout, row.accumulation, row.granularity, row.output, row.orders) == (
        "dense", "1d2d", "1x32/32x32", "bf16", ("ab",))
    assert TABLE.traits("dense_block32", "granularity") == dict(gran_k=32, gran_n=32, op_suffix="_block32")
    assert TABLE.layout_kind("dense_block32") == "dense"  # the dense tiles and A / D addressing
    base = row.point()
    for axis, value, why in (("layout", "contiguous", "dense projections"), ("output", "fp8", "1x32 output scales"),
                             ("order", "swap_ab", "no transposed tile"), ("accumulation", "1d1d", "1D1D")):
        message = TABLE.conflict(dict(base, **{axis: value}))
        assert message is not None and why in message, (axis, message)


def test_the_config_rules():
    def cfg(**kw):
        fields = dict(kind="dense_block32", shape_n=4096, shape_k=7168, num_groups=1, block_m=128, block_n=128,
                      num_stages=4, cluster_m=1, cluster_n=1, band_width=16, grid_size=132)
        fields.update(kw)
        return GemmConfig(**fields)

    check_config(cfg())
    assert cfg().gran_k == 32 and cfg().scale_groups_per_k_block == 4
    assert cfg(kind="dense").scale_groups_per_k_block == 1
    for bad, message in ((dict(block_m=256), "block_m must be one of"), (dict(block_n=48), "block_n must be one of"),
                         (dict(block_n=160), "block_n must be one of"), (dict(block_n=64, split_k=8), "no split-K")):
        with pytest.raises(ValueError, match=message):
            check_config(cfg(**bad))
    # Stages: the record is sA [4][BLOCK_M], the products, two scale warps' 64-byte sB staging, the 16-byte header
    # and three barriers, rounded to 128 bytes (config.block32_record_bytes, policy_block32.cuh).
    record = 128 * 16 + 4 * 64 * 8 * 4 + 2 * 64 + 16 + 24
    assert cfg().smem_bytes == 128 * 128 * 2 + 4 * (2 * 128 * 128 + (record + 127) // 128 * 128)


@pytest.mark.parametrize("m", [1, 16, 64, 128, 512, 4096])
@pytest.mark.parametrize("n,k", [(4096, 7168), (7168, 2048), (1536, 7168), (512, 7168)])
def test_the_heuristic_picks_legal_block32_tiles(m, n, k):
    cfg = get_config(m, n, k, 1, "dense_block32")
    check_config(cfg)
    assert cfg.block_n in BLOCK32_BLOCK_N and cfg.block_m in (64, 128) and cfg.split_k == 1 and not cfg.swap_ab
    assert cfg == get_config(m, n, k, 1, "dense_block32", batch_invariant=False)  # nothing mode-dependent here


# ---------------------------------------------------------------------------------------------- the reference
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_reference_promotes_every_32_k_in_order(m, n, k, use_ue8m0):
    a, sa, b, sb = operands(m, n, k, seed=m + n, use_ue8m0=use_ue8m0)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), out)
    want = torch.from_numpy(promoted_numpy(a, sa, b, sb)).to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    truth = torch.from_numpy(gemm64(a, sa, b, sb, gran=32).value)
    assert float(dfg.calc_diff(out.double(), truth)) < 1e-3
    # the public reference module serves the same function
    ref = torch.empty_like(out)
    dfg.reference.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), ref)
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))


def test_promotion_every_32_is_not_the_128_recipe():
    """The same values read as a 1x128 / 128x128 GEMM (scales constant over each 128 block) round differently from
    the 1x32 path only through the promotion order; with scales that vary inside a 128 block the results differ,
    and each matches its own float64 model."""
    m, n, k = 8, 64, 256
    a, sa, b, sb = operands(m, n, k, seed=5)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), out)
    truth = gemm64(a, sa, b, sb, gran=32).value
    wrong = gemm64(a, sa[:, ::4].contiguous(), b, sb[::4, ::4].contiguous(), gran=128).value
    err_right = np.abs(out.double().numpy() - truth).max()
    err_wrong = np.abs(out.double().numpy() - wrong).max()
    assert err_right < 0.05 * err_wrong


def test_the_row_is_batch_invariant():
    a, sa, b, sb = operands(96, 128, 352, seed=3)
    full = torch.empty(96, 128, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), full)
    for rows in (slice(0, 1), slice(17, 18), slice(40, 96)):
        part = torch.empty(rows.stop - rows.start, 128, dtype=torch.bfloat16)
        dfg.gemm_fp8_fp8_bf16_nt_block32((a[rows], sa[rows]), (b, sb), part)
        assert torch.equal(part.view(torch.int16), full[rows].view(torch.int16))


def test_checks_name_the_1x32_shapes():
    a, sa, b, sb = operands(16, 64, 256)
    out = torch.empty(16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"lhs\[1\] \(sA\).*\[m, ceil\(k/32\)\]"):
        dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa[:, :2]), (b, sb), out)
    with pytest.raises(ValueError, match=r"rhs\[1\] \(sB\).*\[ceil\(n/32\), ceil\(k/32\)\]"):
        dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb[:1]), out)
    # the 128 recipe's scales are not silently accepted by the 32 op, nor the reverse
    a128, sa128 = dfg.per_token_cast_to_fp8(a.float())
    with pytest.raises(ValueError, match="ceil"):
        dfg.gemm_fp8_fp8_bf16_nt_block32((a128, sa128), (b, sb), out)
    with pytest.raises(ValueError, match="ceil"):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    with pytest.raises(ValueError, match="overlap"):
        dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), a.view(torch.bfloat16)[:, :64])


# ---------------------------------------------------------------------------------------------- quantisers
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_1x32(use_ue8m0):
    x = torch.randn(37, 200) * torch.rand(37, 1)
    x_fp8, sx = dfg.per_token_cast_to_fp8(x, use_ue8m0, gran_k=32)
    assert x_fp8.shape == (37, 200) and sx.shape == (37, 7) and sx.stride() == (1, 40)  # M-major, TMA-aligned
    groups = torch.nn.functional.pad(x, (0, 24)).view(37, 7, 32)
    scale = groups.abs().amax(-1).clamp_min(1e-4) / torch.full((37, 7), 448.0)
    if use_ue8m0:
        scale = dfg.quant.ceil_to_ue8m0(scale)
    assert torch.equal(sx, scale)
    want = (groups / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(37, 224)[:, :200]
    assert torch.equal(x_fp8.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(sx, per_token_cast_to_fp8_torch(x, use_ue8m0, 32)[1])


def test_per_block_32x32_and_bad_group_sizes():
    w = torch.randn(70, 100)
    w_fp8, sw = dfg.per_block_cast_to_fp8(w, True, gran_k=32)
    assert w_fp8.shape == (70, 100) and sw.shape == (3, 4) and sw.is_contiguous()
    assert ((sw.view(torch.int32) & 0x7FFFFF) == 0).all()  # powers of two
    deq = w_fp8.float() * sw.repeat_interleave(32, 0)[:70].repeat_interleave(32, 1)[:, :100]
    assert float(dfg.calc_diff(deq, w)) < 1e-3
    for gran_k in (64, 16):
        with pytest.raises(ValueError, match="gran_k must be one of"):
            dfg.per_token_cast_to_fp8(torch.randn(4, 128), gran_k=gran_k)
        with pytest.raises(ValueError, match="gran_k must be one of"):
            dfg.per_block_cast_to_fp8(torch.randn(4, 128), gran_k=gran_k)


def test_the_quantisers_trace_as_ops():
    x = torch.randn(8, 96)
    out = torch.ops.deep_fp8_gemm.per_token_cast_to_fp8_1x32(x, False)
    assert out[1].shape == (8, 3)
    meta = torch.ops.deep_fp8_gemm.per_token_cast_to_fp8_1x32(x.to("meta"), False)
    assert meta[1].shape == (8, 3) and meta[1].stride() == (1, 8)
    assert torch.ops.deep_fp8_gemm.per_block_cast_to_fp8_32x32(x.to("meta"), False)[1].shape == (1, 3)


# ---------------------------------------------------------------------------------------------- the drop-in
def test_drop_in_recipe_1_32_32_as_sglang_calls_it():
    """SGLang's block32 path: ``fp8_gemm_nt((A, sA), (B, sB), D, recipe=(1, 32, 32))`` with sA from its quantiser
    (M-major TMA-aligned) or a UE8M0 checkpoint's row-major power-of-two values, sB ``[N/32, K/32]``."""
    m, n, k = 20, 96, 320
    x, w = torch.randn(m, k), torch.randn(n, k)
    b, sb = compat.per_block_cast_to_fp8(w, True, gran_k=32)
    ref = torch.empty(m, n, dtype=torch.bfloat16)
    for layout in ("m_major", "row_major"):
        a, sa = compat.per_token_cast_to_fp8(x, True, gran_k=32)  # the reference's row-major scales
        assert sa.shape == (m, 10) and sa.is_contiguous()
        if layout == "m_major":
            sa = compat.transform_sf_into_required_layout(sa, m, k, (1, 32, 32), is_sfa=True)
            assert sa.stride() == (1, 20)
        d = torch.empty(m, n, dtype=torch.bfloat16)
        compat.fp8_gemm_nt((a, sa), (b, sb), d, recipe=(1, 32, 32))
        d2 = torch.empty_like(d)
        compat.fp8_gemm_nt((a, sa), (b, sb), d2, recipe_a=(1, 32), recipe_b=(32, 32))
        assert torch.equal(d.view(torch.int16), d2.view(torch.int16))
        if layout == "m_major":
            ref.copy_(d)
        else:
            assert torch.equal(d.view(torch.int16), ref.view(torch.int16))
    assert float(dfg.calc_diff(ref.double(), x.double() @ w.double().t())) < 2e-3
    assert compat.transform_sf_into_required_layout(sb, n, k, (1, 32, 32), is_sfa=False) is sb
    with pytest.raises(ValueError, match=r"recipe \(1, 32, 32\) and a bfloat16 d"):
        compat.fp8_gemm_nt((a, sa), (b, sb), torch.empty(m, n, dtype=torch.bfloat16), c=ref, recipe=(1, 32, 32))
    with pytest.raises(NotImplementedError, match="1x32 / 32x32 recipe"):
        compat.m_grouped_fp8_gemm_nt_masked((a[None], sa[None]), (b[None], sb[None]),
                                            torch.empty(1, m, n, dtype=torch.bfloat16),
                                            torch.tensor([m], dtype=torch.int32), m, recipe=(1, 32, 32))
    with pytest.raises(NotImplementedError, match="SM100"):
        compat.fp8_gemm_nt((a, sa), (b, sb), torch.empty(m, n, dtype=torch.bfloat16), recipe=(1, 128, 32))


def test_drop_in_casts_take_the_references_group_sizes():
    x = torch.randn(6, 100)
    for gran_k in (32, 64):
        x_fp8, sf = compat.per_token_cast_to_fp8(x, False, gran_k=gran_k)
        assert sf.shape == (6, -(-100 // gran_k)) and sf.is_contiguous()
        deq = x_fp8.float() * sf.repeat_interleave(gran_k, 1)[:, :100]
        assert float(dfg.calc_diff(deq, x)) < 1e-3
    with pytest.raises(NotImplementedError, match="packed"):
        compat.per_token_cast_to_fp8(x, True, gran_k=32, use_packed_ue8m0=True)
