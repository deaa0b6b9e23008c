"""The ops are torch.library custom ops: schema, fake kernels, and torch.compile(fullgraph=True) on CPU."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import deep_fp8_gemm as dfg
from tests._operands import quantised_activations, quantised_weights

OPS = torch.ops.deep_fp8_gemm


def _masked_operands():
    a, sa = quantised_activations((2, 32, 256), seed=0)
    b, sb = quantised_weights((2, 64, 256), seed=1)
    out = torch.zeros(2, 32, 64, dtype=torch.bfloat16)
    return a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, torch.tensor([5, 32], dtype=torch.int32), 16


def _opcheck_cases():
    a, sa = quantised_activations((256, 256), seed=2)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    b, sb = quantised_weights((2, 64, 256), seed=3)
    out = torch.zeros(256, 64, dtype=torch.bfloat16)
    # Two experts, each on its own 128-row segment (the second padded): a layout the kernels compute.
    m_indices = torch.tensor([0] * 128 + [1] * 100 + [-1] * 28, dtype=torch.int32)
    return [
        (OPS.gemm_fp8_fp8_bf16_nt.default, (a[:128], sa[:128], b[0], sb[0], out[:128])),
        (OPS.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous.default, (a, sa, b, sb, out, m_indices)),
        (OPS.m_grouped_gemm_fp8_fp8_bf16_nt_masked.default, _masked_operands()),
        (OPS.per_token_cast_to_fp8.default, (torch.randn(40, 300, dtype=torch.bfloat16),)),
        (OPS.per_block_cast_to_fp8.default, (torch.randn(200, 130),)),
    ]


@pytest.mark.parametrize("op,args", _opcheck_cases(), ids=lambda v: getattr(v, "__name__", ""))
def test_opcheck(op, args):
    # fake kernel vs real kernel metadata, and AOT dispatch with dynamic shapes. (opcheck's test_schema
    # multiplies the inputs, which torch cannot do for float8, so mutation is checked on the schema below.)
    torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


GEMM_OPS = ["gemm_fp8_fp8_bf16_nt", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_masked"]


@pytest.mark.parametrize("name", GEMM_OPS)
def test_gemm_schema_mutates_only_out(name):
    schema = getattr(OPS, name).default._schema
    written = [arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write]
    assert written == ["out"] and len(schema.returns) == 0


def test_fake_quantiser_layouts_match_real():
    x = torch.randn(37, 300)
    real = dfg.per_token_cast_to_fp8(x), dfg.per_block_cast_to_fp8(x)
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        fake = dfg.per_token_cast_to_fp8(fx), dfg.per_block_cast_to_fp8(fx)
    for real_pair, fake_pair in zip(real, fake):
        for r, f in zip(real_pair, fake_pair):
            assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)


def _linear_fp8(x, w_fp8, w_scales):
    """Model-style code: quantise activations, FP8 GEMM, a following bf16 op."""
    x_fp8, x_scales = dfg.per_token_cast_to_fp8(x)
    out = torch.empty(x.size(0), w_fp8.size(0), dtype=torch.bfloat16, device=x.device)
    dfg.gemm_fp8_fp8_bf16_nt((x_fp8, x_scales), (w_fp8, w_scales), out)
    return torch.relu(out) * 2


def _masked_model(a, sa, b, sb, masked_m):
    out = torch.zeros(a.size(0), a.size(1), b.size(1), dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, 16)
    return out + 1


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compile_fullgraph_dense_and_quant():
    x = torch.randn(48, 256, dtype=torch.bfloat16)
    w_fp8, w_scales = dfg.per_block_cast_to_fp8(torch.randn(64, 256))
    compiled = torch.compile(_linear_fp8, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, w_fp8, w_scales), _linear_fp8(x, w_fp8, w_scales))


def test_compile_fullgraph_grouped():
    a, sa, b, sb, _, masked_m, _ = _masked_operands()
    compiled = torch.compile(_masked_model, fullgraph=True, backend="aot_eager")
    expected = _masked_model(a, sa, b, sb, masked_m)
    assert torch.equal(compiled(a, sa, b, sb, masked_m), expected)


def test_compile_reports_bad_shapes_at_trace_time():
    x = torch.randn(48, 256, dtype=torch.bfloat16)
    w_fp8, w_scales = dfg.per_block_cast_to_fp8(torch.randn(64, 128))  # k mismatch
    compiled = torch.compile(_linear_fp8, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"rhs\[0\]"):
        compiled(x, w_fp8, w_scales)
