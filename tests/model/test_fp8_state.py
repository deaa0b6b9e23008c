"""FP8 layers inside a model under dtype and device casts, and their state dict (issue 24, item 3).

``model.to(torch.bfloat16)`` after swapping FP8 layers into a model is the common case; it used to cast the e4m3
weights and fp32 scales, and the next forward failed naming ``rhs[0] (B)``. Now the FP8 state keeps its dtypes
(as TransformerEngine's and torchao's modules do), the rest of the model is cast, device moves apply, and the
state dict round-trips bit for bit. (The tensor-parallel layers: tests/model/test_distributed_local.py.)
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from deep_fp8_gemm.moe import FP8MoE
from deep_fp8_gemm.nn import FP8Linear

FP8 = torch.float8_e4m3fn
H, I, E, TOP_K = 128, 128, 4, 2


class Block(nn.Module):
    """A model with FP8 layers swapped in next to ordinary ones: norm -> FP8Linear -> FP8 MoE -> nn.Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(H)
        self.proj = FP8Linear.from_linear(nn.Linear(H, H))
        g = torch.Generator().manual_seed(1)
        self.experts = FP8MoE.from_weights(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5,
                                           torch.randn(E, H, I, generator=g) / I ** 0.5)
        self.head = nn.Linear(H, 16)

    def forward(self, x, ids, weights):
        h = self.proj(self.norm(x).to(torch.bfloat16))
        h = self.experts(h, ids, weights)
        return self.head(h.to(self.head.weight.dtype))


def _inputs():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, H, generator=g)
    ids = torch.randint(0, E, (8, TOP_K), generator=g, dtype=torch.int32)
    return x, ids, torch.rand(8, TOP_K, generator=g)


def _fp8_state(model: Block) -> dict[str, torch.Tensor]:
    names = ("proj.weight_fp8", "proj.weight_scale", "proj.bias", "experts.w13", "experts.w13_scale", "experts.w2",
             "experts.w2_scale")
    state = model.state_dict()
    return {n: state[n] for n in names}


EXPECTED_DTYPES = {"proj.weight_fp8": FP8, "proj.weight_scale": torch.float32, "proj.bias": torch.bfloat16,
                   "experts.w13": FP8, "experts.w13_scale": torch.float32, "experts.w2": FP8,
                   "experts.w2_scale": torch.float32}


@pytest.mark.parametrize("cast", ["to_bfloat16", "half", "float", "double", "bfloat16", "type_half"])
def test_dtype_casts_keep_the_fp8_state(cast):
    model = Block()
    x, ids, weights = _inputs()
    before = {n: t.clone() for n, t in _fp8_state(model).items()}
    {"to_bfloat16": lambda m: m.to(torch.bfloat16), "half": lambda m: m.half(), "float": lambda m: m.float(),
     "double": lambda m: m.double(), "bfloat16": lambda m: m.bfloat16(),
     "type_half": lambda m: m.type(torch.float16)}[cast](model)
    for name, t in _fp8_state(model).items():
        assert t.dtype == EXPECTED_DTYPES[name], (cast, name, t.dtype)
        assert torch.equal(t.view(torch.uint8), before[name].view(torch.uint8)), (cast, name)
    other = {"to_bfloat16": torch.bfloat16, "half": torch.float16, "float": torch.float32, "double": torch.float64,
             "bfloat16": torch.bfloat16, "type_half": torch.float16}[cast]
    assert model.norm.weight.dtype == model.head.weight.dtype == other  # the rest of the model is cast


def test_model_to_bfloat16_runs_and_computes_what_it_did():
    model = Block()
    x, ids, weights = _inputs()
    expected_proj = model.proj(model.norm(x).to(torch.bfloat16))
    model.to(torch.bfloat16)  # the case: the next forward failed naming rhs[0] (B)
    out = model(x.bfloat16(), ids, weights)
    assert out.dtype == torch.bfloat16 and out.shape == (8, 16) and bool(out.isfinite().all())
    # The FP8 layer computes bit for bit what it did before the cast (same state, same bf16 input).
    h = model.norm(x.bfloat16())
    reference = Block()
    assert torch.equal(model.proj(h), reference.proj(h))
    assert expected_proj.dtype == torch.bfloat16
    model.half()
    model.bfloat16()  # back and forth: the FP8 state was never touched
    assert torch.equal(model.proj(h), reference.proj(h))
    assert torch.equal(model.experts(h, ids, weights), reference.experts(h, ids, weights))


def test_device_moves_apply():
    model = Block().to(torch.bfloat16)
    model.to("meta")
    for name, t in _fp8_state(model).items():
        assert t.device.type == "meta" and t.dtype == EXPECTED_DTYPES[name], name
    assert model.head.weight.device.type == "meta" and model.head.weight.dtype == torch.bfloat16
    model = Block()
    model.to(torch.device("cpu"), torch.bfloat16)  # device and dtype together: the move applies, the cast not
    assert all(t.dtype == EXPECTED_DTYPES[n] for n, t in _fp8_state(model).items())


def test_state_dict_round_trip_is_bitwise():
    model = Block().to(torch.bfloat16)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    for name, dtype in EXPECTED_DTYPES.items():
        assert state[name].dtype == dtype, name
    fresh = Block()
    with torch.no_grad():  # a different model first: loading must replace every byte of the FP8 state
        fresh.proj.weight_scale.mul_(2)
        fresh.experts.w13_scale.mul_(3)
    fresh.to(torch.bfloat16)
    fresh.load_state_dict(state)
    for name, t in _fp8_state(fresh).items():
        assert torch.equal(t.view(torch.uint8), state[name].view(torch.uint8)), name
    x, ids, weights = _inputs()
    assert torch.equal(fresh(x.bfloat16(), ids, weights), model(x.bfloat16(), ids, weights))


def test_training_layers_keep_their_master_dtype():
    layer = FP8Linear(128, 64, master_dtype=torch.float32)
    moe = FP8MoE(2, 128, 128, master_dtype=torch.float32)
    layer.to(torch.bfloat16)
    moe.half()
    assert layer.weight.dtype == layer.bias.dtype == torch.float32 and layer.weight.requires_grad
    assert moe.w13.dtype == moe.w2.dtype == torch.float32
    x = torch.randn(4, 128, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and x.grad is not None
