"""UE8M0 (power-of-two) scales: ``per_token_cast_to_fp8(x, use_ue8m0)``, ``per_block_cast_to_fp8(x, use_ue8m0)``,
``per_channel_cast_to_fp8`` and the fused kernels' ``USE_UE8M0`` variants.

The expected scale is computed independently of the library, in float64 with ``math.frexp`` on the fp32
quotient ``amax / 448``: ``2^ceil(log2(q))`` is ``q`` itself when ``q`` is a power of two (frexp mantissa
0.5), else ``2^e`` — exact, no floating-point log2. Data must be ``e4m3(clamp(x / scale, ±448))``.
The fused kernels run in the CPU simulator (hal/sim.hpp) and must match the torch path bit for bit.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

import deep_fp8_gemm as dfg
import deep_fp8_gemm.kernels.quant as kq
from deep_fp8_gemm.quant import ceil_to_ue8m0, per_block_cast_to_fp8_torch, per_token_cast_to_fp8_torch
from tests._gpu import requires_sm90
from tests._operands import gemm64


def _pow2_ceil(q: float) -> float:
    mantissa, exponent = math.frexp(q)  # q = mantissa * 2^exponent, mantissa in [0.5, 1)
    return q if mantissa == 0.5 else math.ldexp(1.0, exponent)


def _expected_scales(amax: torch.Tensor) -> torch.Tensor:
    quotient = amax.float().clamp_min(1e-4) / 448.0  # the fp32 quotient the library rounds up
    flat = [_pow2_ceil(v) for v in quotient.double().flatten().tolist()]
    return torch.tensor(flat, dtype=torch.float64).view(quotient.shape).float()


def _e4m3_of(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def _wide_range(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows spanning 12 decades, an all-zero group (amax floor) and an exact power-of-two amax (448 · 2^3)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-6, 6, m).unsqueeze(1)
    x[0, :128] = 0
    if m > 1:
        x[1, :128] = 1.0
        x[1, 5] = 448.0 * 8  # quotient exactly 8: must stay 8, not round to 16
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_ceil_to_ue8m0_exact():
    values = torch.tensor([1.0, 1.5, 2.0, 2**-20, 2**-20 * 1.0000001, 3.0, 0.75, 1e-4 / 448, 2**126 * 1.5],
                          dtype=torch.float32)
    got = ceil_to_ue8m0(values)
    expected = torch.tensor([_pow2_ceil(v) for v in values.double().tolist()], dtype=torch.float64).float()
    assert torch.equal(got, expected)
    assert (got.view(torch.int32) & 0x7FFFFF).eq(0).all()  # mantissa-free: representable as UE8M0


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32))
@pytest.mark.parametrize("m,k", ((4, 256), (9, 200), (33, 7)))
def test_per_token_ue8m0_scales_and_data(dtype, m, k):
    x = _wide_range(m, k, seed=m + k).clamp(-6e4, 6e4).to(dtype)
    q, s = dfg.per_token_cast_to_fp8(x, True)  # positional, as the reference's tests call it
    kb = (k + 127) // 128
    padded = torch.nn.functional.pad(x.float(), (0, kb * 128 - k)).view(m, kb, 128)
    expected = _expected_scales(padded.abs().amax(-1))
    assert torch.equal(s, expected)
    assert s.stride() == (1, (m + 3) // 4 * 4)  # still ready to be sA without a copy
    scale_per_col = expected.repeat_interleave(128, 1)[:, :k]
    assert torch.equal(_bits(q), _bits(_e4m3_of(x, scale_per_col)))
    q_kw, s_kw = dfg.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert torch.equal(_bits(q_kw), _bits(q)) and torch.equal(s_kw, s)
    _, s_plain = dfg.per_token_cast_to_fp8(x)
    assert torch.equal(s_plain, padded.abs().amax(-1).clamp_min(1e-4) / 448.0)  # default unchanged


@pytest.mark.parametrize("n,k", ((256, 384), (130, 200)))
def test_per_block_ue8m0_scales_and_data(n, k):
    w = _wide_range(n, k, seed=n).to(torch.bfloat16)
    q, s = dfg.per_block_cast_to_fp8(w, True)
    nb, kb = (n + 127) // 128, (k + 127) // 128
    padded = torch.nn.functional.pad(w.float(), (0, kb * 128 - k, 0, nb * 128 - n)).view(nb, 128, kb, 128)
    expected = _expected_scales(padded.abs().amax(dim=(1, 3)))
    assert torch.equal(s, expected) and s.is_contiguous()
    per_element = expected.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    assert torch.equal(_bits(q), _bits(_e4m3_of(w, per_element)))


def test_per_channel_cast_to_fp8():
    x = _wide_range(256, 48, seed=3).t().contiguous().t()[:, :].contiguous()
    for use_ue8m0 in (False, True):
        q, s = dfg.per_channel_cast_to_fp8(x, use_ue8m0)
        amax = x.view(2, 128, 48).abs().amax(dim=1)
        expected = _expected_scales(amax) if use_ue8m0 else amax.clamp_min(1e-4) / 448.0
        assert s.shape == (2, 48) and torch.equal(s, expected)
        assert torch.equal(_bits(q), _bits(_e4m3_of(x, expected.repeat_interleave(128, 0))))
    with pytest.raises(ValueError, match="multiple of 128 rows"):
        dfg.per_channel_cast_to_fp8(torch.zeros(100, 8), False)


def test_sm100_only_cast_options_and_bad_flags():
    x = torch.randn(4, 128)
    with pytest.raises(NotImplementedError, match="use_packed_ue8m0"):
        dfg.per_token_cast_to_fp8(x, True, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match="gran_k=64"):
        dfg.per_block_cast_to_fp8(x, False, 64)
    with pytest.raises(ValueError, match="gran_k=16"):
        dfg.per_token_cast_to_fp8(x, True, gran_k=16)
    with pytest.raises(TypeError, match="use_ue8m0 must be a bool"):
        dfg.per_token_cast_to_fp8(x, 1)


@pytest.mark.parametrize("simulate", (False, True))
def test_gemm_on_ue8m0_scales_matches_float64(simulate, monkeypatch):
    """Power-of-two fp32 scales are ordinary scales to the Hopper kernels: the GEMM is exact to the float64
    model of the dequantised operands (CPU reference and the real kernel in the simulator)."""
    if simulate:
        if shutil.which("g++") is None:
            pytest.skip("the simulator builds kernels with g++")
        monkeypatch.setenv("DFG_SIMULATE", "1")
    g = torch.Generator().manual_seed(11)
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(40, 256, generator=g), use_ue8m0=True)
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(128, 256, generator=g), use_ue8m0=True)
    out = torch.full((40, 128), float("nan"), dtype=torch.bfloat16)
    dfg.fp8_gemm_nt((a, sa), (b, sb), out)
    expected = gemm64(a, sa.contiguous(), b, sb).value
    assert dfg.calc_diff(out, torch.from_numpy(expected)) < 1e-3
    assert not torch.isnan(out).any()
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=2**-7, atol=1e-2)


# ---------------------------------------------------------------------------------------------- fused kernels
def _sim_launch(config, params, grid, device):
    from deep_fp8_gemm.simulator.runner import launch as sim_launch

    name, source = kq.render_source(config)
    sim_launch(name, source, bytes(params), grid=grid, block=config.num_threads, cluster=1,
               smem_bytes=config.smem_bytes)


def test_ue8m0_variants_render_distinct_kernels():
    plain = kq.QuantKernelConfig(kq.QuantKind.PER_TOKEN, kq.InputType.BF16, True)
    ue8m0 = kq.QuantKernelConfig(kq.QuantKind.PER_TOKEN, kq.InputType.BF16, True, ue8m0=True)
    (name_plain, src_plain), (name_ue8m0, src_ue8m0) = kq.render_source(plain), kq.render_source(ue8m0)
    assert name_plain != name_ue8m0
    assert "kNumThreads, false>" in src_plain and "kNumThreads, true>" in src_ue8m0


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
def test_fused_ue8m0_kernels_in_simulator_bit_exact():
    """The rendered USE_UE8M0 translation units, built with hal/sim.hpp, against the torch path."""
    x = _wide_range(40, 384, seed=5).to(torch.bfloat16)
    q, s = kq.run_per_token(x, kq.QuantKind.PER_TOKEN, "x", _sim_launch, ue8m0=True)
    rq, rs = per_token_cast_to_fp8_torch(x, use_ue8m0=True)
    assert torch.equal(_bits(q), _bits(rq)) and torch.equal(s, rs)
    w = _wide_range(300, 200, seed=6).to(torch.bfloat16)  # k % 16 != 0: scalar variant, partial blocks
    q, s = kq.run_per_block(w, _sim_launch, ue8m0=True)
    rq, rs = per_block_cast_to_fp8_torch(w, use_ue8m0=True)
    assert torch.equal(_bits(q), _bits(rq)) and torch.equal(s, rs)
    assert not torch.equal(rs, per_block_cast_to_fp8_torch(w)[1])  # the flag did change the scales


# ---------------------------------------------------------------------------------------------- GPU
@requires_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_gpu_fused_ue8m0_bit_exact(dtype):
    x = _wide_range(257, 7168, seed=1).clamp(-6e4, 6e4).to(dtype)
    q, s = dfg.per_token_cast_to_fp8(x.cuda(), True)
    rq, rs = per_token_cast_to_fp8_torch(x, use_ue8m0=True)
    assert torch.equal(_bits(q.cpu()), _bits(rq)) and torch.equal(s.cpu(), rs)
    w = _wide_range(512, 2048, seed=2).to(dtype)
    q, s = dfg.per_block_cast_to_fp8(w.cuda(), use_ue8m0=True)
    rq, rs = per_block_cast_to_fp8_torch(w, use_ue8m0=True)
    assert torch.equal(_bits(q.cpu()), _bits(rq)) and torch.equal(s.cpu(), rs)


@requires_sm90
@pytest.mark.gpu
def test_gpu_gemm_on_ue8m0_scales():
    g = torch.Generator().manual_seed(3)
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(256, 1024, generator=g).cuda(), True)
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(512, 1024, generator=g).cuda(), True)
    out = torch.full((256, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    dfg.fp8_gemm_nt((a, sa), (b, sb), out, disable_ue8m0_cast=False)
    expected = gemm64(a.cpu(), sa.cpu().contiguous(), b.cpu(), sb.cpu()).value
    assert dfg.calc_diff(out.cpu(), torch.from_numpy(expected)) < 1e-3


def test_quantiser_ops_take_use_ue8m0():
    """The custom ops' schemas carry use_ue8m0 (default False): fake vs real, AOT dispatch, torch.compile."""
    x = torch.randn(40, 300, dtype=torch.bfloat16)
    for op in (torch.ops.deep_fp8_gemm.per_token_cast_to_fp8.default,
               torch.ops.deep_fp8_gemm.per_block_cast_to_fp8.default):
        torch.library.opcheck(op, (x, True), test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))

    def model(x):
        q, s = dfg.per_token_cast_to_fp8(x, use_ue8m0=True)
        return q.float() * s.repeat_interleave(128, 1)[:, : x.size(1)]

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), model(x))
    finally:
        torch._dynamo.reset()
