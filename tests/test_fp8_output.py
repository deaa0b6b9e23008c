"""The FP8-output and SwiGLU GEMM families (issue 27) on the CPU path: their references against float64, the output
pair's layout and checks (errors name the argument), the custom ops under tracing, the config rules.

The kernels themselves run in tests/test_sim_fp8_output.py (bits equal to these references with exact sums).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff
from deep_fp8_gemm.config import (FP8_OUTPUT_KINDS, GemmConfig, check_config, get_config, output_bytes,
                                  up_projection_seconds)
from deep_fp8_gemm.ops import fp8_output
from deep_fp8_gemm.ops.moe import quantise_experts
from deep_fp8_gemm.quant import per_token_cast_to_fp8_torch
from deep_fp8_gemm.utils import empty_m_major

FP8 = torch.float8_e4m3fn


def _operands(m_shape, n, k, groups=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(*m_shape, k, generator=g).reshape(-1, k))
    a, sa = a.view(*m_shape, k), sa.view(*m_shape, -1)
    w = torch.randn(*((groups,) if groups else ()), n, k, generator=g) / k ** 0.5
    b, sb = quantise_experts(w.view(-1, n, k))
    return a, sa, (b if groups else b[0]), (sb if groups else sb[0])


def _f64(a, sa, b, sb):
    a64 = a.double() * sa.double().repeat_interleave(128, -1)[..., :a.shape[-1]]
    b64 = b.double() * sb.double().repeat_interleave(128, -2)[..., :b.shape[-2], :].repeat_interleave(128, -1)[..., :b.shape[-1]]
    return a64 @ b64.transpose(-1, -2)


def _deq(d, sd):
    return d.float() * sd.repeat_interleave(128, -1)[..., :d.shape[-1]]


def test_dense_reference_is_the_quantiser_on_the_fp32_gemm():
    m, n, k = 70, 320, 384  # a partial last scale group (320 = 2.5 groups)
    a, sa, b, sb = _operands((m,), n, k)
    d, sd = fp8_output.empty_out((), m, n, "cpu")
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), (d, sd))
    y32 = (a.float() * sa.repeat_interleave(128, 1)) @ (b.float() * sb.repeat_interleave(128, 0)
                                                       .repeat_interleave(128, 1)[:n, :k]).t()
    q, s = per_token_cast_to_fp8_torch(y32)
    assert torch.equal(d.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sd, s)
    assert sd.stride() == (1, 72)  # M-major, rows rounded up to 4: what per_token_cast_to_fp8 returns
    # against float64: one e4m3 rounding of the output on top of the bf16 kind's error
    bf16 = torch.empty(m, n, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), bf16)
    truth = _f64(a, sa, b, sb)
    assert calc_diff(_deq(d, sd), truth) < 1e-3
    assert calc_diff(bf16.float(), truth) < calc_diff(_deq(d, sd), truth)  # e4m3 is the coarser rounding
    # use_ue8m0: power-of-two scales
    d2, sd2 = fp8_output.empty_out((), m, n, "cpu")
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), (d2, sd2), use_ue8m0=True)
    assert ((sd2.view(torch.int32) & 0x7FFFFF) == 0).all()
    assert calc_diff(_deq(d2, sd2), truth) < 2e-3


def test_grouped_references():
    n, k, groups = 256, 256, 3
    a, sa, b, sb = _operands((256,), n, k, groups, seed=1)
    m_indices = torch.tensor([0] * 100 + [-1] * 28 + [2] * 128, dtype=torch.int32)
    d, sd = fp8_output.empty_out((), 256, n, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous((a, sa), (b, sb), (d, sd), m_indices)
    for rows, e in ((slice(0, 100), 0), (slice(128, 256), 2)):
        q, s = per_token_cast_to_fp8_torch(_f64(a[rows], sa[rows], b[e], sb[e]).float())
        assert calc_diff(_deq(d[rows], sd[rows]), _deq(q, s)) < 1e-6
    # psum: the same rows as ends
    d2, sd2 = fp8_output.empty_out((), 256, n, "cpu")
    ends = torch.tensor([100, 100, 256], dtype=torch.int32)
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum((a, sa), (b, sb), (d2, sd2), ends)
    for rows in (slice(0, 100), slice(128, 256)):
        assert torch.equal(d2[rows].view(torch.uint8), d[rows].view(torch.uint8)) and torch.equal(sd2[rows], sd[rows])
    # masked: the same per-row values
    am, sam = a.view(2, 128, k), sa.view(2, 128, -1)
    d3, sd3 = fp8_output.empty_out((2,), 128, n, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked((am, sam), (b[[0, 2]], sb[[0, 2]]), (d3, sd3),
                                             torch.tensor([100, 128], dtype=torch.int32), 100)
    assert torch.equal(d3[0, :100].view(torch.uint8), d[:100].view(torch.uint8))
    assert torch.equal(sd3[1], sd[128:])


def test_swiglu_reference_is_silu_mul_quant_of_the_fp32_gemm():
    hidden, inter, groups = 256, 256, 2
    a, sa, w, sw = _operands((128,), 2 * inter, hidden, groups, seed=2)
    wi, swi = dfg.interleave_swiglu_weights(w, sw)
    m_indices = torch.tensor([1] * 128, dtype=torch.int32)
    d, sd = fp8_output.empty_out((), 128, inter, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (wi, swi), (d, sd), m_indices)
    gate_up = (a.float() * sa.repeat_interleave(128, 1)) @ (w[1].float() * sw[1].repeat_interleave(128, 0)
                                                           .repeat_interleave(128, 1)).t()
    q, s = per_token_cast_to_fp8_torch(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
    assert torch.equal(d.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sd, s)
    # masked: the same rows
    d3, sd3 = fp8_output.empty_out((groups,), 64, inter, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu((a.view(2, 64, hidden), sa.view(2, 64, -1)), (wi[[1, 1]], swi[[1, 1]]),
                                                    (d3, sd3), torch.tensor([64, 64], dtype=torch.int32), 64)
    assert torch.equal(d3.reshape(128, inter).view(torch.uint8), d.view(torch.uint8))


def test_output_pair_errors_name_the_argument():
    m, n, k = 64, 256, 256
    a, sa, b, sb = _operands((m,), n, k)
    d, sd = fp8_output.empty_out((), m, n, "cpu")
    call = dfg.gemm_fp8_fp8_fp8_nt
    with pytest.raises(TypeError, match="out must be a"):
        call((a, sa), (b, sb), d)
    with pytest.raises(TypeError, match=r"out\[0\] \(D\) must be torch.float8_e4m3fn"):
        call((a, sa), (b, sb), (d.view(torch.uint8), sd))
    with pytest.raises(ValueError, match=r"out\[1\] \(sD\) must have shape"):
        call((a, sa), (b, sb), (d, sd[:, :1]))
    with pytest.raises(ValueError, match=r"out\[1\] \(sD\) must be M-major"):
        call((a, sa), (b, sb), (d, sd.contiguous()))
    with pytest.raises(ValueError, match=r"out\[0\] \(D\) must not overlap"):
        call((a, sa), (b, sb), (a.view(m, k)[:, :n], sd))
    with pytest.raises(TypeError, match="use_ue8m0"):
        call((a, sa), (b, sb), (d, sd), use_ue8m0=1)
    with pytest.raises(ValueError, match="16-byte rows"):
        dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b[:72], sb[:1]), fp8_output.empty_out((), m, 72, "cpu"))
    w, sw = quantise_experts(torch.randn(2, 320, k))  # 2I = 320: I not a multiple of 128
    with pytest.raises(ValueError, match="I a multiple of 128"):
        dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (w, sw), fp8_output.empty_out((), m, 160, "cpu"),
                                                            torch.zeros(m, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"out\[0\] \(D\) must have shape"):  # SwiGLU: D has I columns, not 2I
        w, sw = quantise_experts(torch.randn(2, 256, k))
        dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (w, sw), fp8_output.empty_out((), m, 256, "cpu"),
                                                            torch.zeros(m, dtype=torch.int32))


def test_custom_ops_trace_as_single_nodes():
    m, n, k = 64, 256, 256
    a, sa, b, sb = _operands((m,), n, k)

    def step(a, sa, b, sb):
        d, sd = empty_like_out(a.shape[0], b.shape[0])
        dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), (d, sd))
        return d.view(torch.uint8), sd

    def empty_like_out(rows, cols):
        return torch.empty(rows, cols, dtype=FP8), empty_m_major((rows, cols // 128), "cpu")

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = compiled(a, sa, b, sb), step(a, sa, b, sb)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for name in ("gemm_fp8_fp8_fp8_nt", "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous", "m_grouped_gemm_fp8_fp8_fp8_nt_masked",
                 "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum", "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu",
                 "m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu"):
        assert hasattr(torch.ops.deep_fp8_gemm, name), name


def test_config_rules_and_model():
    for kind in FP8_OUTPUT_KINDS:
        swiglu = kind.endswith("swiglu")
        cfg = get_config(256, 4096, 7168, 1 if kind == "dense_fp8out" else 8, kind)
        assert cfg.block_n == (256 if swiglu else 128) and cfg.mma_n == 128
        if swiglu:
            assert cfg.waves_m == 1 and cfg.mma_chunks == 2
    base = dict(kind="contiguous_swiglu", shape_n=4096, shape_k=7168, num_groups=8, block_m=128, block_n=256,
                num_stages=4, cluster_m=1, cluster_n=1, band_width=16, grid_size=132)
    check_config(GemmConfig(**base))
    for bad, why in ((dict(block_n=128), "block_n must be 256"), (dict(block_m=256), "block_m <= 128"),
                     (dict(shape_n=4096 + 128), "I a multiple of 128"), (dict(kind="contiguous", ue8m0=True, block_n=128),
                                                                        "ue8m0")):
        with pytest.raises(ValueError, match=why):
            check_config(GemmConfig(**dict(base, **bad)))
    with pytest.raises(ValueError, match="block_n must be 128"):
        check_config(GemmConfig(**dict(base, kind="dense_fp8out", num_groups=1, block_n=160)))
    # bytes: e4m3 D + one fp32 scale per 128 columns; the SwiGLU kinds write n / 2 columns
    assert output_bytes("dense", 10, 256) == 10 * 512
    assert output_bytes("dense_fp8out", 10, 256) == 10 * (256 + 8)
    assert output_bytes("masked_swiglu", 10, 4096) == 10 * (2048 + 64)
    # the model picks the fused up-projection at DeepSeek-V3's shapes, decode (masked, m <= 32) included
    for m in (1, 8, 32, 256):
        assert up_projection_seconds("masked", True, m, 2048, 7168, 8) < \
            up_projection_seconds("masked", False, m, 2048, 7168, 8, silu_rows=8 * 128)
    assert up_projection_seconds("contiguous", True, 4096 * 8, 2048, 7168, 8) < \
        up_projection_seconds("contiguous", False, 4096 * 8, 2048, 7168, 8)


def test_opcheck():
    """Fake kernels against the real ones' metadata and AOT dispatch with dynamic shapes (as tests/test_custom_ops)."""
    ops = torch.ops.deep_fp8_gemm
    a, sa, b, sb = _operands((128,), 256, 256, seed=4)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    d, sd = fp8_output.empty_out((), 128, 256, "cpu")
    utils = ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.gemm_fp8_fp8_fp8_nt.default, (a, sa, b, sb, d, sd, False), test_utils=utils)
    w, sw = quantise_experts(torch.randn(2, 256, 256))
    wi, swi = dfg.interleave_swiglu_weights(w, sw)
    h, sh = fp8_output.empty_out((), 128, 128, "cpu")
    m_indices = torch.cat([torch.zeros(64, dtype=torch.int32), torch.ones(64, dtype=torch.int32)])
    torch.library.opcheck(ops.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu.default,
                          (a, sa, wi, swi, h, sh, m_indices, False), test_utils=utils)
