"""fp8_moe_forward / fp8_moe_forward_masked / FP8MoE against an independent float64 model of the same math.

The model (``_moe_model_f64``) shares nothing with the library but the e4m3 weights it is given: it quantises
activations with its own float64 e4m3 rounding (numpy: exponent from log2, round-half-even, saturation at 448),
computes each expert token by token, rounds each GEMM output to bf16 (the GEMMs' output contract) and sums the
weighted expert outputs in float64.

Tolerance: the issue asks for calc_diff < 1e-3; the layer agrees with the model to ~1.4e-6 (what is left is
bf16 output rounding and rare e4m3 rounding flips between fp32 and float64 scale arithmetic), so the tests use
2e-5 — tight enough that skipping one quantisation step (~3e-4) or any wrong scale would fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import deep_fp8_gemm
from deep_fp8_gemm.layout import max_m_sum_bound
from deep_fp8_gemm.moe import FP8MoE, fp8_moe_forward, fp8_moe_forward_masked, silu_mul_quant
from tests._gpu import requires_sm90

E, H, I, T, TOP_K = 8, 256, 128, 32, 4


# ---------------------------------------------------------------------------------------------- float64 model
def _e4m3_f64(v: np.ndarray) -> np.ndarray:
    """Round float64 values to e4m3 (nearest even; normals 2^-6..448 with 3 mantissa bits, subnormal step
    2^-9), saturating at ±448."""
    a = np.minimum(np.abs(v), 448.0)
    exponent = np.floor(np.log2(np.maximum(a, 2.0**-6)))
    quantum = 2.0 ** (exponent - 3)
    return np.sign(v) * np.minimum(np.round(a / quantum) * quantum, 448.0)


def _quant_dequant_rows_f64(x: np.ndarray) -> np.ndarray:
    """Per row and 128 columns: amax clamped at 1e-4, scale amax/448, e4m3(x/scale)·scale."""
    out = np.empty_like(x)
    for start in range(0, x.shape[-1], 128):
        block = x[..., start : start + 128]
        scale = np.maximum(np.abs(block).max(axis=-1, keepdims=True), 1e-4) / 448.0
        out[..., start : start + 128] = _e4m3_f64(block / scale) * scale
    return out


def _bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).double().numpy()


def _dequant_weight_f64(w: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    """[E, n, k] e4m3 with [E, ceil(n/128), ceil(k/128)] block scales -> float64."""
    values = w.float().double().numpy()
    scales = s.double().numpy().repeat(128, axis=1).repeat(128, axis=2)[:, : w.shape[1], : w.shape[2]]
    return values * scales


def _expert_f64(x: np.ndarray, w13: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """FFN of one expert on rows x (float64, activations quantised per token before each GEMM)."""
    inter = w13.shape[0] // 2
    gate_up = _bf16(_quant_dequant_rows_f64(x) @ w13.T)
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    h = gate / (1.0 + np.exp(-gate)) * up
    return _bf16(_quant_dequant_rows_f64(h) @ w2.T)


def _moe_model_f64(hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale) -> np.ndarray:
    x = hidden.double().numpy()
    w13_f, w2_f = _dequant_weight_f64(w13, w13_scale), _dequant_weight_f64(w2, w2_scale)
    out = np.zeros(x.shape)
    ids, weights = topk_ids.tolist(), topk_weights.double().numpy()
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t]):
            if e >= 0:
                out[t] += weights[t, j] * _expert_f64(x[t : t + 1], w13_f[e], w2_f[e])[0]
    return out


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def layer() -> FP8MoE:
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16) / math.sqrt(H)
    w2 = torch.randn(E, H, I, dtype=torch.bfloat16) / math.sqrt(I)
    return FP8MoE.from_weights(w13, w2)


def _inputs(num_tokens: int, seed: int, drop: float = 0.0, empty_experts: tuple[int, ...] = ()):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, H, generator=g).to(torch.bfloat16)
    scores = torch.rand(num_tokens, E, generator=g)
    for e in empty_experts:
        scores[:, e] = -1.0
    weights, ids = scores.topk(TOP_K, dim=-1)
    weights = torch.softmax(weights, dim=-1)
    ids[torch.rand(ids.shape, generator=g) < drop] = -1
    return hidden, ids, weights.float()


def _weights(layer: FP8MoE):
    return layer.w13, layer.w13_scale, layer.w2, layer.w2_scale


def _check(layer, hidden, ids, weights, tol=2e-5):
    out = fp8_moe_forward(hidden, ids, weights, *_weights(layer))
    model = _moe_model_f64(hidden, ids, weights, *_weights(layer))
    assert out.shape == hidden.shape and out.dtype == torch.bfloat16
    diff = deep_fp8_gemm.calc_diff(out, torch.from_numpy(model))
    assert diff < tol, diff
    return out, model


# ---------------------------------------------------------------------------------------------- tests
def test_e4m3_model_agrees_with_torch_cast():
    # Sanity of the independent model on every finite e4m3 value and midpoints between them.
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = codes[torch.isfinite(codes)].double().unique()
    mids = (values[1:] + values[:-1]) / 2
    probe = torch.cat([values, mids, torch.tensor([500.0, -1e6, 1e-5])])
    expected = probe.clamp(-448, 448).float().to(torch.float8_e4m3fn).double()
    assert np.array_equal(_e4m3_f64(probe.numpy()), expected.numpy())


def test_matches_float64_model(layer):
    _check(layer, *_inputs(T, seed=1))


def test_dropped_slots_and_experts_without_tokens(layer):
    hidden, ids, weights = _inputs(T, seed=2, drop=0.3, empty_experts=(0, 5))
    ids[3] = -1  # a token with every slot dropped gets zeros
    out, _ = _check(layer, hidden, ids, weights)
    assert (out[3] == 0).all()


def test_single_token_and_no_tokens(layer):
    _check(layer, *_inputs(1, seed=3))
    hidden, ids, weights = _inputs(0, seed=4)
    out = fp8_moe_forward(hidden, ids, weights, *_weights(layer))
    assert out.shape == (0, H)
    hidden, ids, weights = _inputs(4, seed=5)
    assert (fp8_moe_forward(hidden, torch.full_like(ids, -1), weights, *_weights(layer)) == 0).all()


def test_sync_free_layout_gives_identical_output(layer):
    hidden, ids, weights = _inputs(T, seed=6, drop=0.2)
    exact = fp8_moe_forward(hidden, ids, weights, *_weights(layer))
    bound = max_m_sum_bound(ids.numel(), E)
    assert torch.equal(fp8_moe_forward(hidden, ids, weights, *_weights(layer), max_m_sum=bound), exact)


def test_module_forward_and_fresh_init(layer):
    hidden, ids, weights = _inputs(8, seed=7)
    # I = 128: the module derived the fused up-projection's weights and runs it (tests/model/test_moe_fused.py)
    assert layer.swiglu_pair is not None
    assert torch.equal(layer(hidden, ids, weights),
                       fp8_moe_forward(hidden, ids, weights, *_weights(layer), w13_swiglu=layer.swiglu_pair))
    fresh = FP8MoE(4, 128, 64)  # I = 64: the fused path is illegal, the module runs the unfused one
    assert fresh.swiglu_pair is None
    assert fresh.w13.shape == (4, 128, 128) and fresh.w13_scale.shape == (4, 1, 1)
    assert fresh.w2.shape == (4, 128, 64) and fresh.w2_scale.shape == (4, 1, 1)
    y = fresh(torch.randn(5, 128, dtype=torch.bfloat16), torch.randint(0, 4, (5, 2)), torch.rand(5, 2))
    assert y.shape == (5, 128) and torch.isfinite(y.float()).all()
    assert set(fresh.state_dict()) == {"w13", "w13_scale", "w2", "w2_scale"}


def test_masked_variant_matches_model(layer):
    g = torch.Generator().manual_seed(8)
    m_max = 12
    hidden = torch.randn(E, m_max, H, generator=g).to(torch.bfloat16)
    counts = torch.tensor([0, 12, 3, 1, 7, 0, 12, 5], dtype=torch.int32)
    hidden[2, 3:] = float("nan")  # rows >= counts[e] are ignored, whatever they hold
    out = fp8_moe_forward_masked(hidden, counts, *_weights(layer))
    assert out.shape == (E, m_max, H)
    w13_f, w2_f = _dequant_weight_f64(layer.w13, layer.w13_scale), _dequant_weight_f64(layer.w2, layer.w2_scale)
    for e, c in enumerate(counts.tolist()):
        if c:
            model = _expert_f64(hidden[e, :c].double().numpy(), w13_f[e], w2_f[e])
            assert deep_fp8_gemm.calc_diff(out[e, :c], torch.from_numpy(model)) < 2e-5
    # the contiguous path computes the same per-token FFN: one expert per token, weight 1
    ids = torch.full((3, 1), 2)
    dense = fp8_moe_forward(hidden[2, :3].contiguous(), ids, torch.ones(3, 1), *_weights(layer))
    assert torch.equal(dense, out[2, :3])


def test_silu_mul_quant_torch_path():
    x = torch.randn(5, 512, dtype=torch.bfloat16)
    q, s = silu_mul_quant(x)
    ref_q, ref_s = deep_fp8_gemm.per_token_cast_to_fp8(F.silu(x[:, :256].float()) * x[:, 256:].float())
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
    assert s.stride() == (1, 8)
    q3, s3 = silu_mul_quant(x.view(1, 5, 512).expand(2, 5, 512))
    assert s3.shape == (2, 5, 2) and s3.stride() == (16, 1, 8) and torch.equal(s3[1], ref_s)
    with pytest.raises(ValueError, match="2I"):
        silu_mul_quant(torch.randn(2, 3, dtype=torch.bfloat16))


def test_argument_errors(layer):
    hidden, ids, weights = _inputs(4, seed=9)
    w = _weights(layer)
    with pytest.raises(TypeError, match="hidden.dtype"):
        fp8_moe_forward(hidden.float(), ids, weights, *w)
    with pytest.raises(ValueError, match="hidden must be"):
        fp8_moe_forward(hidden[:, :128], ids, weights, *w)
    with pytest.raises(ValueError, match="topk_weights.shape"):
        fp8_moe_forward(hidden, ids, weights[:, :2], *w)
    with pytest.raises(ValueError, match=r"-1 or in \[0, 8\)"):
        fp8_moe_forward(hidden, ids + 8, weights, *w)
    with pytest.raises(TypeError, match="w13.dtype"):
        fp8_moe_forward(hidden, ids, weights, w[0].float(), *w[1:])
    with pytest.raises(ValueError, match="w2_scale"):
        fp8_moe_forward(hidden, ids, weights, *w[:3], w[3][:, :1])
    with pytest.raises(ValueError, match="counts"):
        fp8_moe_forward_masked(hidden.view(1, 4, H).expand(E, 4, H), torch.zeros(3, dtype=torch.int32), *w)


def test_torch_compile_fullgraph(layer):
    hidden, ids, weights = _inputs(16, seed=10, drop=0.2)
    eager = fp8_moe_forward(hidden, ids, weights, *_weights(layer))
    torch._dynamo.reset()
    compiled = torch.compile(fp8_moe_forward, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(hidden, ids, weights, *_weights(layer)), eager)
    masked = torch.compile(fp8_moe_forward_masked, fullgraph=True, backend="aot_eager")
    h = hidden.view(E, 2, H)
    counts = torch.tensor([2, 1, 0, 2, 2, 1, 2, 0], dtype=torch.int32)
    out = masked(h, counts, *_weights(layer))
    ref = fp8_moe_forward_masked(h, counts, *_weights(layer))
    for e, c in enumerate(counts.tolist()):
        assert torch.equal(out[e, :c], ref[e, :c])


@requires_sm90
@pytest.mark.gpu
def test_gpu_matches_cpu(layer):
    hidden, ids, weights = _inputs(256, seed=11, drop=0.1, empty_experts=(3,))
    cpu = fp8_moe_forward(hidden, ids, weights, *_weights(layer))
    w = [t.cuda() for t in _weights(layer)]
    gpu = fp8_moe_forward(hidden.cuda(), ids.cuda(), weights.cuda(), *w).cpu()
    assert deep_fp8_gemm.calc_diff(gpu, cpu) < 1e-4
    bound = max_m_sum_bound(ids.numel(), E)
    free = fp8_moe_forward(hidden.cuda(), ids.cuda(), weights.cuda(), *w, max_m_sum=bound).cpu()
    assert deep_fp8_gemm.calc_diff(free, cpu) < 1e-4


@requires_sm90
@pytest.mark.gpu
def test_gpu_masked_cuda_graph(layer):
    w = [t.cuda() for t in _weights(layer)]
    hidden = torch.randn(E, 16, H, dtype=torch.bfloat16, device="cuda")
    counts = torch.tensor([16, 0, 3, 1, 16, 5, 0, 9], dtype=torch.int32, device="cuda")
    fp8_moe_forward_masked(hidden, counts, *w)  # compile and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_moe_forward_masked(hidden, counts, *w)
    counts.copy_(torch.tensor([1, 16, 0, 7, 2, 16, 4, 0], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    expected = fp8_moe_forward_masked(hidden.cpu(), counts.cpu(), *_weights(layer))
    for e, c in enumerate(counts.tolist()):
        if c:
            assert deep_fp8_gemm.calc_diff(out[e, :c].cpu(), expected[e, :c]) < 1e-4
