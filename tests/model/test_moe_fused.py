"""The fused up-projection in the MoE layers (issue 27): what holds after it, on the CPU path (the exact references),
and — under ``DFG_SIMULATE=1``, every kernel in the simulator — one kernel launch less per layer.

Invariants stated in deep_fp8_gemm/moe.py ("Fused up-projection") and checked here:

* the fused forward (``w13_swiglu`` given; FP8MoE's default) matches a float64 model of its own math (activations
  quantised per token, ``gate | up`` not rounded to bf16) as tightly as the unfused path matches its own model;
  fused vs unfused: calc_diff <= 2e-3; against float64 without the intermediate roundings the fused path is no
  worse than the unfused one;
* masked fused == contiguous fused per row (bit for bit), as for the unfused paths;
* the module's state dict keeps the checkpoint layout; the interleaved buffers are derived again on load;
* ``fused_swiglu=False`` (and a call without ``w13_swiglu``) is the unfused path, bit for bit the training forward
  (tests/model/test_autograd.py: ``fp8_moe`` == unfused inference; a grad-requiring input runs the unfused frozen path);
* expert parallelism: tests/model/test_distributed_local.py (world of one: EPMoE == FP8MoE, both fused).
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from deep_fp8_gemm.ops.outputs import SwigluWeights

import deep_fp8_gemm
from deep_fp8_gemm.moe import FP8MoE, fp8_moe_forward, fp8_moe_forward_masked
from deep_fp8_gemm.ops.moe import swiglu_weights

from tests.model.test_moe import _bf16, _dequant_weight_f64, _quant_dequant_rows_f64

E, H, I, TOP_K = 8, 256, 256, 4  # I = 2 x 128: two output groups per expert


@pytest.fixture(scope="module")
def layer() -> FP8MoE:
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16) / math.sqrt(H)
    w2 = torch.randn(E, H, I, dtype=torch.bfloat16) / math.sqrt(I)
    return FP8MoE.from_weights(w13, w2)


def _weights(layer):
    return layer.w13, layer.w13_scale, layer.w2, layer.w2_scale


def _routed(num_tokens, seed, drop=0.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, H, generator=g).to(torch.bfloat16)
    weights, ids = torch.rand(num_tokens, E, generator=g).topk(TOP_K, dim=-1)
    ids[torch.rand(ids.shape, generator=g) < drop] = -1
    return hidden, ids, torch.softmax(weights, dim=-1)


def _model_f64(hidden, ids, weights, layer, fused: bool, quantise: bool = True) -> torch.Tensor:
    """The layer in float64 from the e4m3 weights: activations quantised per token before each GEMM (``quantise``),
    ``gate | up`` rounded to bf16 (unfused) or not (fused), each output rounded to bf16 unless ``quantise`` is off."""
    x = hidden.double().numpy()
    w13, w2 = _dequant_weight_f64(layer.w13, layer.w13_scale), _dequant_weight_f64(layer.w2, layer.w2_scale)
    q = _quant_dequant_rows_f64 if quantise else (lambda v: v)
    r = _bf16 if quantise else (lambda v: v)
    out = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            if e < 0:
                continue
            gate_up = q(x[t:t + 1]) @ w13[e].T
            gate_up = gate_up if fused or not quantise else _bf16(gate_up)
            h = gate_up[:, :I] / (1.0 + np.exp(-gate_up[:, :I])) * gate_up[:, I:]
            out[t] += float(weights[t, j]) * r(q(h) @ w2[e].T)[0]
    return torch.from_numpy(out)


def test_fused_forward_numerics(layer):
    hidden, ids, weights = _routed(48, seed=1, drop=0.1)
    fused = fp8_moe_forward(hidden, ids, weights, *_weights(layer), w13_swiglu=layer.swiglu_pair)
    plain = fp8_moe_forward(hidden, ids, weights, *_weights(layer))
    assert not torch.equal(fused, plain)
    calc = deep_fp8_gemm.calc_diff
    assert calc(fused, _model_f64(hidden, ids, weights, layer, fused=True)) < 2e-5
    assert calc(plain, _model_f64(hidden, ids, weights, layer, fused=False)) < 2e-5
    assert calc(fused, plain) <= 2e-3
    truth = _model_f64(hidden, ids, weights, layer, fused=True, quantise=False)
    assert calc(fused, truth) <= calc(plain, truth)


def test_module_runs_fused_and_keeps_the_checkpoint_layout(layer):
    hidden, ids, weights = _routed(16, seed=2)
    assert layer.swiglu_pair is not None and layer.fused_swiglu
    assert torch.equal(layer(hidden, ids, weights),
                       fp8_moe_forward(hidden, ids, weights, *_weights(layer), w13_swiglu=layer.swiglu_pair))
    w, s = swiglu_weights(layer.w13, layer.w13_scale)
    assert torch.equal(layer.w13_swiglu.view(torch.uint8), w.view(torch.uint8)) and torch.equal(layer.w13_swiglu_scale, s)
    state = layer.state_dict()
    assert set(state) == {"w13", "w13_scale", "w2", "w2_scale"}  # the interleaved copy is not persistent
    # a fresh module loading the state dict derives its interleaved buffers again (a post-load hook)
    other = FP8MoE(E, H, I)
    before = other.w13_swiglu.clone()
    other.load_state_dict(state)
    assert not torch.equal(before.view(torch.uint8), other.w13_swiglu.view(torch.uint8))
    assert torch.equal(other(hidden, ids, weights), layer(hidden, ids, weights))
    # the unfused module: no interleaved copy, the unfused path bit for bit
    unfused = FP8MoE(E, H, I, fused_swiglu=False)
    unfused.load_state_dict(state)
    assert unfused.swiglu_pair is None and "fused_swiglu=False" in repr(unfused)
    assert torch.equal(unfused(hidden, ids, weights), fp8_moe_forward(hidden, ids, weights, *_weights(layer)))
    # the whole module pickles (its load hook is a module-level function) with its derived buffers
    import io

    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    assert torch.equal(restored(hidden, ids, weights), layer(hidden, ids, weights))
    # a training module holds master weights: nothing to interleave
    assert FP8MoE(2, 128, 128, master_dtype=torch.float32).swiglu_pair is None


def test_masked_fused_equals_contiguous_fused(layer):
    g = torch.Generator().manual_seed(3)
    m_max = 12
    hidden = torch.randn(E, m_max, H, generator=g).to(torch.bfloat16)
    counts = torch.tensor([0, 12, 3, 1, 7, 0, 12, 5], dtype=torch.int32)
    hidden[2, 3:] = float("nan")  # rows >= counts[e] are ignored
    out = fp8_moe_forward_masked(hidden, counts, *_weights(layer), w13_swiglu=layer.swiglu_pair)
    plain = fp8_moe_forward_masked(hidden, counts, *_weights(layer))
    for e, c in enumerate(counts.tolist()):
        if c:
            ids = torch.full((c, 1), e)
            dense = fp8_moe_forward(hidden[e, :c].contiguous(), ids, torch.ones(c, 1), *_weights(layer),
                                    w13_swiglu=layer.swiglu_pair)
            assert torch.equal(dense, out[e, :c]), e
            assert deep_fp8_gemm.calc_diff(out[e, :c], plain[e, :c]) <= 2e-3


def test_swiglu_weight_errors(layer):
    hidden, ids, weights = _routed(4, seed=4)
    w13_swiglu = layer.swiglu_pair
    with pytest.raises(TypeError, match="w13_swiglu must be None or what swiglu_weights"):
        fp8_moe_forward(hidden, ids, weights, *_weights(layer), w13_swiglu=w13_swiglu[0])
    with pytest.raises(ValueError, match=r"w13_swiglu\[1\] must match w13_scale"):
        fp8_moe_forward(hidden, ids, weights, *_weights(layer),
                        w13_swiglu=SwigluWeights(w13_swiglu[0], w13_swiglu[1][:, :1]))
    # The checkpoint's own pair has the interleaved pair's shapes but other columns: refused, not computed.
    with pytest.raises(TypeError, match="would compute the wrong columns"):
        fp8_moe_forward(hidden, ids, weights, *_weights(layer), w13_swiglu=(layer.w13, layer.w13_scale))
    assert isinstance(w13_swiglu.to("cpu"), SwigluWeights) and isinstance(w13_swiglu.experts(slice(0, 1)),
                                                                           SwigluWeights)
    small = FP8MoE.from_weights(torch.randn(2, 2 * 64, H), torch.randn(2, H, 64))  # I = 64: no fused path
    assert swiglu_weights(small.w13, small.w13_scale) is None and small.swiglu_pair is None


def test_torch_compile_fullgraph_fused(layer):
    hidden, ids, weights = _routed(16, seed=5, drop=0.2)
    eager = fp8_moe_forward(hidden, ids, weights, *_weights(layer), w13_swiglu=layer.swiglu_pair)
    torch._dynamo.reset()
    compiled = torch.compile(fp8_moe_forward, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(hidden, ids, weights, *_weights(layer), w13_swiglu=layer.swiglu_pair), eager)


# ---------------------------------------------------------------------------------------------- launches
@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
def test_simulated_forward_issues_one_kernel_fewer(monkeypatch):
    """Under DFG_SIMULATE every kernel of a forward (the quantisers too) runs in the simulator, so its launches are
    the GPU path's launches (runtime/target.py backend_of): counted at the simulator's launch. DeepSeek-V3's MoE
    scaled down (E 4, top-2, H 256, I 256): unfused = per-token quant, w13 GEMM, silu_mul_quant, w2 GEMM; fused =
    per-token quant, w13 SwiGLU GEMM, w2 GEMM. The two layers' outputs: calc_diff <= 2e-3."""
    from deep_fp8_gemm import simulator

    monkeypatch.setenv("DFG_SIMULATE", "1")
    launched: list[str] = []
    real = simulator.launch

    def counting(name, *args, **kwargs):
        launched.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(simulator, "launch", counting)
    torch.manual_seed(6)
    experts, hidden_size, inter = 4, 256, 256
    module = FP8MoE.from_weights(torch.randn(experts, 2 * inter, hidden_size) / 16,
                                 torch.randn(experts, hidden_size, inter) / 16)
    hidden = torch.randn(40, hidden_size).to(torch.bfloat16)
    weights, ids = torch.rand(40, experts).topk(2, dim=-1)
    weights = torch.softmax(weights, dim=-1)
    w = _weights(module)

    launched[:] = []  # the weights' quantisation ran in the simulator too
    plain = fp8_moe_forward(hidden, ids, weights, *w)
    unfused_launches, launched[:] = list(launched), []
    fused = fp8_moe_forward(hidden, ids, weights, *w, w13_swiglu=module.swiglu_pair)
    fused_launches = list(launched)
    print("unfused:", unfused_launches, "\nfused:", fused_launches)
    assert len(fused_launches) == len(unfused_launches) - 1 == 3, (unfused_launches, fused_launches)
    assert any("contiguous_swiglu" in name for name in fused_launches)
    assert not any("silu" in name for name in fused_launches)
    assert deep_fp8_gemm.calc_diff(fused, plain) <= 2e-3
    monkeypatch.delenv("DFG_SIMULATE")
    assert deep_fp8_gemm.calc_diff(fused, fp8_moe_forward(hidden, ids, weights, *w, w13_swiglu=module.swiglu_pair)) < 1e-4
