"""Errors that used to mislead (issue 24, item 4), each with the error it gives now.

* double backward through ``fp8_linear`` / ``fp8_moe``: says it is not supported (was an in-place-modification
  error from inside the quantiser);
* tensor-parallel size errors quote the user's argument and the world size (were the per-rank shard):
  ``tests/model/test_distributed_local.py::test_tensor_parallel_size_errors_quote_the_argument_and_world``;
* meta tensors: the shape-only path (checks, no compute; was "out must not overlap lhs[0]");
* ``get_tma_aligned_size(-5, 4)`` raises (returned -4); ``DFG_SIMULATE=yes`` and other unknown switch values
  raise (turned the simulator on);
* a forced split-K config that does not divide the K blocks gets the config rule's ValueError (was NVRTC's
  static_assert);
* the weight-gradient GEMMs' overlap errors name ``d``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import env
from deep_fp8_gemm.autograd import fp8_linear, fp8_linear_frozen, fp8_moe
from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.kernels import gemm
from tests._operands import quantised_activations, quantised_weights

FP8 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------------------------- double backward
def _second_backward_raises(grad: torch.Tensor, op: str) -> None:
    with pytest.raises(RuntimeError, match=rf"{op}: double backward .* is not supported"):
        grad.float().sum().backward()


def test_double_backward_through_fp8_linear_says_unsupported():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 128, generator=g).bfloat16().requires_grad_()
    w = torch.randn(64, 128, generator=g).requires_grad_()
    y = fp8_linear(x, w)
    gx, gw = torch.autograd.grad(y.float().pow(2).sum(), (x, w), create_graph=True)
    _second_backward_raises(gx, "fp8_linear")
    _second_backward_raises(fp8_linear(x, w).new_zeros(0) + gw.sum(), "fp8_linear")
    w_fp8, w_sf = dfg.per_block_cast_to_fp8(w.detach())
    (gx,) = torch.autograd.grad(fp8_linear_frozen(x, w_fp8, w_sf, None).float().sum(), (x,), create_graph=True)
    _second_backward_raises(gx, "fp8_linear")
    # first-order gradients are unchanged
    y = fp8_linear(x, w)
    y.float().sum().backward()
    assert x.grad is not None and w.grad is not None and not x.grad.requires_grad


def test_double_backward_through_fp8_moe_says_unsupported():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(8, 128, generator=g).bfloat16().requires_grad_()
    ids = torch.randint(0, 2, (8, 2), generator=g, dtype=torch.int32)
    weights = torch.rand(8, 2, generator=g).requires_grad_()
    w13 = (torch.randn(2, 256, 128, generator=g) / 12).requires_grad_()
    w2 = (torch.randn(2, 128, 128, generator=g) / 12).requires_grad_()
    out = fp8_moe(hidden, ids, weights, w13, w2)
    gh, gw = torch.autograd.grad(out.float().pow(2).sum(), (hidden, w13), create_graph=True)
    _second_backward_raises(gh, "fp8_moe")
    _second_backward_raises(gw, "fp8_moe")


# ---------------------------------------------------------------------------------------------- meta tensors
def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_meta_tensors_take_the_shape_only_path():
    a, sa = _meta(128, 256, dtype=FP8), _meta(128, 2)
    b, sb = _meta(64, 256, dtype=FP8), _meta(1, 2)
    bg, sbg = _meta(2, 64, 256, dtype=FP8), _meta(2, 1, 2)
    out = _meta(128, 64, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    dfg.fp8_gemm_nt((a, sa), (b, sb), out)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (bg, sbg), out, _meta(128, dtype=torch.int32))
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum((a, sa), (bg, sbg), out, _meta(2, dtype=torch.int32))
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((_meta(2, 32, 256, dtype=FP8), _meta(2, 32, 2)), (bg, sbg),
                                             _meta(2, 32, 64, dtype=torch.bfloat16), _meta(2, dtype=torch.int32), 16)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, _meta(64, 2)), _meta(128, 64))
    d = _meta(128, 64)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, _meta(64, 2)), d, d)
    dfg.k_grouped_fp8_gemm_nt_contiguous((_meta(128 * 256, dtype=FP8), _meta(128, 2)),
                                         (_meta(64 * 256, dtype=FP8), _meta(64, 2)), _meta(2, 128, 64), [128, 128],
                                         _meta(2, dtype=torch.int32))
    dfg.prepare_gemm("dense", (a, sa), (b, sb), out)((a, sa), (b, sb), out)
    y = dfg.nn.FP8Linear(256, 64, device="meta")(_meta(4, 256, dtype=torch.bfloat16))
    assert y.device.type == "meta" and y.shape == (4, 64)
    w13, w13s, w2, w2s = _meta(2, 256, 128, dtype=FP8), _meta(2, 2, 1), _meta(2, 128, 128, dtype=FP8), _meta(2, 1, 1)
    y = dfg.moe.fp8_moe_forward(_meta(4, 128, dtype=torch.bfloat16), _meta(4, 2, dtype=torch.int32), _meta(4, 2),
                                w13, w13s, w2, w2s)
    assert y.device.type == "meta" and y.shape == (4, 128)
    # The shape rules still hold on meta tensors.
    with pytest.raises(ValueError, match=r"lhs\[1\] \(sA\)"):
        dfg.gemm_fp8_fp8_bf16_nt((a, _meta(128, 3)), (b, sb), out)
    with pytest.raises(ValueError, match="n must be a multiple of 8"):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (_meta(60, 256, dtype=FP8), sb), _meta(128, 60, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------- utilities, env
def test_get_tma_aligned_size_rejects_negative_and_non_integer_sizes():
    assert dfg.get_tma_aligned_size(5, 4) == 8 and dfg.get_tma_aligned_size(0, 4) == 0
    with pytest.raises(ValueError, match="x=-5"):
        dfg.get_tma_aligned_size(-5, 4)
    with pytest.raises(TypeError, match="x must be an int"):
        dfg.get_tma_aligned_size(5.0, 4)


SWITCHES = ["DFG_SIMULATE", "DFG_SIM_EXACT_MMA", "DFG_JIT_DEBUG", "DFG_JIT_DISABLE_CACHE", "DFG_JIT_PTXAS_VERBOSE",
            "DFG_CHECK_LAYOUTS"]


@pytest.mark.parametrize("value", ["yes", "true", "on", "2", "off", "no", "enable"])
def test_switches_reject_unknown_values(monkeypatch, value):
    readers = {"DFG_SIMULATE": env.simulate, "DFG_SIM_EXACT_MMA": env.sim_exact_mma, "DFG_JIT_DEBUG": env.jit_debug,
               "DFG_JIT_DISABLE_CACHE": env.jit_disable_cache, "DFG_JIT_PTXAS_VERBOSE": env.jit_ptxas_verbose,
               "DFG_CHECK_LAYOUTS": env.check_layouts}
    for name in SWITCHES:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name} must be 1"):
            readers[name]()
        monkeypatch.delenv(name)
    a, sa = quantised_activations((16, 128), seed=0)
    b, sb = quantised_weights((64, 128), seed=1)
    monkeypatch.setenv("DFG_SIMULATE", value)
    with pytest.raises(ValueError, match="DFG_SIMULATE must be 1"):  # an op call: before anything runs
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), torch.empty(16, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("value,on", [("1", True), (" 1 ", True), ("0", False), ("", False)])
def test_switches_accept_the_documented_values(monkeypatch, value, on):
    monkeypatch.setenv("DFG_SIMULATE", value)
    assert env.simulate() is on


# ---------------------------------------------------------------------------------------------- configs
def test_forced_split_k_config_gets_the_config_rule():
    a, sa = quantised_activations((64, 512), seed=2)
    b, sb = quantised_weights((64, 512), seed=3)
    cfg = dataclasses.replace(get_config(64, 64, 512, 1, "dense", 4), split_k=3, grid_size=3)
    with pytest.raises(ValueError, match="illegal GEMM config: split_k=3 must be a positive divisor of the K block "
                                         "count 4"):
        gemm.launch_1d2d(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb,
                         torch.zeros(64, 64, dtype=torch.bfloat16), None, "sim")
    with pytest.raises(ValueError, match="illegal GEMM config"):
        gemm.cuda_kernel(cfg, 0)


# ---------------------------------------------------------------------------------------------- names
def test_weight_gradient_overlap_errors_name_d():
    a, sa = quantised_activations((128, 256), seed=4)
    b, sb = quantised_activations((64, 256), seed=5)
    buf = torch.zeros(128 * 64 * 4, dtype=torch.uint8)
    a_alias = buf[:a.numel()].view(FP8).view(a.shape)
    a_alias.copy_(a)
    d = buf.view(torch.float32).view(128, 64)
    with pytest.raises(ValueError, match=r"^d must not overlap lhs\[0\] \(A\)"):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a_alias, sa), (b, sb), d)
    with pytest.raises(ValueError, match=r"^d must not overlap lhs\[0\] \(A\)"):
        dfg.fp8_gemm_nt((a_alias, sa), (b, sb), d, c=d, recipe=(1, 1, 128))
    ks = [128, 128]
    d3 = torch.zeros(2 * 128 * 64 * 4, dtype=torch.uint8)
    flat = d3[:128 * 256].view(FP8)
    with pytest.raises(ValueError, match=r"^d must not overlap lhs\[0\] \(A\)"):
        dfg.k_grouped_fp8_gemm_nt_contiguous((flat, torch.ones(128, 2)),
                                             (torch.zeros(64 * 256, dtype=FP8), torch.ones(64, 2)),
                                             d3.view(torch.float32).view(2, 128, 64), ks,
                                             torch.tensor(ks, dtype=torch.int32))
