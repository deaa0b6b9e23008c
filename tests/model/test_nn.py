"""FP8Linear against nn.Linear and against the composition of the public ops it is made of."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import deep_fp8_gemm
from deep_fp8_gemm.nn import FP8Linear
from tests._gpu import requires_sm90

# Tolerance vs the bf16 nn.Linear: both operands are rounded to e4m3 (3 mantissa bits: relative rounding error
# up to 2^-4, RMS ~2^-4/sqrt(3)/sqrt(2) ~ 2.5% per element with 1x128 / 128x128 scales), errors that average
# out over the K-sum to a relative output error of a few % RMS, i.e. calc_diff = MSE / (2·signal) ~ 3e-4 ... 1e-3
# (measured 6.5e-4 at K=256; the reference design's tests see ~7e-4 and accept < 1e-3). 2e-3 leaves room for
# unlucky seeds while still catching any systematic error (a wrong scale or transposed block gives > 1e-1).
LINEAR_TOL = 2e-3


def _linear(in_features: int, out_features: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias, dtype=torch.bfloat16)


@pytest.mark.parametrize("bias", (True, False))
@pytest.mark.parametrize("shape", ((7, 256), (2, 5, 256), (1, 1, 1, 256)))
def test_matches_nn_linear(bias, shape):
    linear = _linear(256, 384, bias)
    fp8 = FP8Linear.from_linear(linear)
    x = torch.randn(shape, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = linear(x)
    y = fp8(x)
    assert y.shape == (*shape[:-1], 384) and y.dtype == torch.bfloat16
    assert deep_fp8_gemm.calc_diff(y, expected) < LINEAR_TOL


def test_equals_the_public_op_composition():
    linear = _linear(384, 136, bias=True, seed=3)
    fp8 = FP8Linear.from_linear(linear)
    x = torch.randn(9, 384, dtype=torch.bfloat16)
    w_fp8, w_scale = deep_fp8_gemm.per_block_cast_to_fp8(linear.weight.detach())
    assert torch.equal(fp8.weight_fp8.view(torch.uint8), w_fp8.view(torch.uint8))
    assert torch.equal(fp8.weight_scale, w_scale) and fp8.weight_scale.shape == (2, 3)
    out = torch.empty(9, 136, dtype=torch.bfloat16)
    deep_fp8_gemm.gemm_fp8_fp8_bf16_nt(deep_fp8_gemm.per_token_cast_to_fp8(x), (w_fp8, w_scale), out)
    expected = (out.float() + linear.bias.detach().float()).to(torch.bfloat16)
    assert torch.equal(fp8(x), expected)


def test_buffers_state_dict_and_fresh_layer():
    layer = FP8Linear(128, 64, bias=False)
    assert layer.weight_fp8.dtype == torch.float8_e4m3fn and layer.weight_fp8.shape == (64, 128)
    assert layer.weight_scale.shape == (1, 1) and layer.bias is None
    assert set(layer.state_dict()) == {"weight_fp8", "weight_scale"}
    y = layer(torch.randn(3, 128, dtype=torch.bfloat16))
    assert y.shape == (3, 64) and torch.isfinite(y.float()).all()
    assert layer(torch.empty(0, 128, dtype=torch.bfloat16)).shape == (0, 64)
    assert "in_features=128" in repr(layer)


def test_errors():
    with pytest.raises(ValueError, match="in_features=100"):
        FP8Linear(100, 64)
    with pytest.raises(ValueError, match="out_features=60"):
        FP8Linear(128, 60)
    with pytest.raises(TypeError, match="in_features must be an int"):
        FP8Linear(128.0, 64)
    with pytest.raises(TypeError, match="torch.nn.Linear"):
        FP8Linear.from_linear(nn.Conv1d(1, 1, 1))
    with pytest.raises(ValueError, match="in_features=40"):
        FP8Linear.from_linear(nn.Linear(40, 64))
    layer = FP8Linear(128, 64)
    with pytest.raises(TypeError, match="x.dtype=torch.float32"):
        layer(torch.randn(2, 128))
    with pytest.raises(ValueError, match="in_features=128"):
        layer(torch.randn(2, 64, dtype=torch.bfloat16))


def test_torch_compile_fullgraph():
    fp8 = FP8Linear.from_linear(_linear(256, 128, bias=True))
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(fp8, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), fp8(x))


@requires_sm90
@pytest.mark.gpu
def test_gpu_matches_cpu():
    linear = _linear(7168, 2112, bias=True)
    fp8 = FP8Linear.from_linear(linear)
    x = torch.randn(64, 7168, dtype=torch.bfloat16)
    cpu = fp8(x)
    gpu = fp8.cuda()(x.cuda()).cpu()
    assert deep_fp8_gemm.calc_diff(gpu, cpu) < 1e-5
