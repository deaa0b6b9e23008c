"""FP8MoE with MXFP4 experts (issue 42, the decode path): ``FP8MoE.from_mxfp4`` / ``mxfp4_moe_forward`` /
``fp8_moe_forward_masked`` with PreparedMxfp4 weights against the independent float64 model of tests/model/test_moe.py
given the dequantised MXFP4 weights (the checkpoint's values exactly), on CPU (the float64 reference of the recorded
path) and under ``DFG_SIMULATE=1`` (the MXFP4 kernel); a token's bits across batch sizes; the refusals."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import deep_fp8_gemm
from deep_fp8_gemm.compat.casts import per_token_cast_to_fp4
from deep_fp8_gemm.moe import FP8MoE, fp8_moe_forward_masked, mxfp4_moe_forward
from deep_fp8_gemm.ops import mxfp4
from tests.model.test_moe import _expert_f64, _inputs

E, H, I, TOP_K = 8, 256, 128, 4


def _checkpoint(seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E * 2 * I, H, generator=g) / 16
    w2 = torch.randn(E * H, I, generator=g) / 11
    c13, s13 = per_token_cast_to_fp4(w13, True, 32)
    c2, s2 = per_token_cast_to_fp4(w2, True, 32)
    return (c13.view(E, 2 * I, H // 2), s13.view(E, 2 * I, H // 32), c2.view(E, H, I // 2), s2.view(E, H, I // 32))


def _model(layer, hidden, ids, weights):
    p13, p2 = layer.mxfp4_experts
    w13, w2 = mxfp4.dequantize_prepared(p13).numpy(), mxfp4.dequantize_prepared(p2).numpy()
    x = hidden.double().numpy()
    out = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            if e >= 0:
                out[t] += float(weights[t, j]) * _expert_f64(x[t: t + 1], w13[e], w2[e])[0]
    return torch.from_numpy(out)


@pytest.fixture(scope="module")
def layer():
    return FP8MoE.from_mxfp4(*_checkpoint())


def test_forward_against_float64_on_cpu(layer, monkeypatch):
    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    hidden, ids, weights = _inputs(12, seed=1, drop=0.2)
    out = layer(hidden, ids, weights)
    assert out.shape == hidden.shape and out.dtype == torch.bfloat16
    assert deep_fp8_gemm.calc_diff(out, _model(layer, hidden, ids, weights)) < 2e-5


def test_prefill_takes_the_contiguous_layout(layer, monkeypatch):
    """More than 32 rows for an expert: the contiguous kernels (issue 43); against the float64 model, and every
    token's bits equal to its own decode-path forward (batch invariance across the two paths)."""
    import deep_fp8_gemm.moe as moe
    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    calls = []
    real = moe.experts_contiguous_mxfp4
    monkeypatch.setattr(moe, "experts_contiguous_mxfp4", lambda *a: calls.append(1) or real(*a))
    hidden, ids, weights = _inputs(80, seed=7, drop=0.1)
    out = layer(hidden, ids, weights)
    assert calls and deep_fp8_gemm.calc_diff(out, _model(layer, hidden, ids, weights)) < 2e-5
    for t in (0, 41, 79):
        assert torch.equal(layer(hidden[t: t + 1], ids[t: t + 1], weights[t: t + 1])[0], out[t])


def test_a_tokens_bits_do_not_depend_on_the_batch(layer, monkeypatch):
    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    hidden, ids, weights = _inputs(12, seed=2)
    full = layer(hidden, ids, weights)
    for t in (0, 5, 11):
        assert torch.equal(layer(hidden[t: t + 1], ids[t: t + 1], weights[t: t + 1])[0], full[t])


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
def test_forward_under_the_simulator(layer, monkeypatch):
    """The MXFP4 kernel (both projections) under DFG_SIMULATE=1 against the same float64 model, and bitwise equal to
    the CPU reference's bf16 outputs where the sums are exact."""
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    hidden, ids, weights = _inputs(6, seed=3, drop=0.1)
    out = layer(hidden, ids, weights)
    assert deep_fp8_gemm.calc_diff(out, _model(layer, hidden, ids, weights)) < 1e-4


def test_masked_forward_takes_prepared_experts(layer, monkeypatch):
    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    p13, p2 = layer.mxfp4_experts
    g = torch.Generator().manual_seed(4)
    x = torch.randn(E, 3, H, generator=g).to(torch.bfloat16)
    counts = torch.tensor([3, 0, 1, 2, 3, 1, 0, 2], dtype=torch.int32)
    out = fp8_moe_forward_masked(x, counts, p13, None, p2, None, expected_m=2)
    w13, w2 = mxfp4.dequantize_prepared(p13).numpy(), mxfp4.dequantize_prepared(p2).numpy()
    for e, c in enumerate(counts.tolist()):
        if c:
            want = torch.from_numpy(_expert_f64(x[e, :c].double().numpy(), w13[e], w2[e]))
            assert deep_fp8_gemm.calc_diff(out[e, :c], want) < 2e-5


def test_refusals(layer):
    p13, p2 = layer.mxfp4_experts
    hidden, ids, weights = _inputs(4, seed=5)
    with pytest.raises(TypeError, match="w2 must be a PreparedMxfp4"):
        mxfp4_moe_forward(hidden, ids, weights, p13, torch.zeros(1))
    with pytest.raises(ValueError, match=r"w13 must be \[E, 2I, H\] and w2 \[E, H, I\]"):
        mxfp4_moe_forward(hidden, ids, weights, p13, p13)
    with pytest.raises(ValueError, match="must be None"):
        fp8_moe_forward_masked(torch.zeros(E, 1, H, dtype=torch.bfloat16), torch.zeros(E, dtype=torch.int32), p13,
                               torch.ones(1), p2, None)
    bad = ids.clone()
    bad[0, 0] = E
    with pytest.raises(ValueError, match=r"topk_ids must hold expert ids in \[0, 8\)"):
        layer(hidden, bad, weights)
    with pytest.raises(NotImplementedError, match="inference-only"):
        layer(hidden.clone().requires_grad_(), ids, weights)
    with pytest.raises(ValueError, match="not mxfp4"):
        FP8MoE(E, H, I).mxfp4_experts


def test_state_dict_round_trip(layer):
    clone = FP8MoE.from_mxfp4(*_checkpoint(seed=9))
    clone.load_state_dict(layer.state_dict())
    hidden, ids, weights = _inputs(3, seed=6)
    assert torch.equal(clone(hidden, ids, weights), layer(hidden, ids, weights))
    assert "experts_format=mxfp4" in repr(layer)
