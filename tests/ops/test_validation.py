"""A table of bad inputs for every public op: the exception type and that the message names the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import env, utils
from deep_fp8_gemm.runtime.target import Backend
from tests._gemm_cases import BUILDERS, CASES, FP8, K, N, call_gemm, dense_args
from tests._operands import quantised_activations, quantised_weights


@pytest.mark.parametrize("kind,case_id,mutate,exc,text", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_gemm_inputs(kind, case_id, mutate, exc, text):
    args = mutate(BUILDERS[kind]())
    with pytest.raises(exc) as info:
        call_gemm(kind, args)
    assert text in str(info.value), f"message does not name {text!r}: {info.value}"


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_valid_inputs_pass(kind):
    call_gemm(kind, BUILDERS[kind]())  # the table's baseline really is valid


@pytest.mark.parametrize(
    "n,k,text", [(60, 256, "n=60"), (64, 120, "k=120")], ids=["n-not-multiple-of-8", "k-not-multiple-of-16"]
)
def test_tma_divisibility(n, k, text):
    a, sa = quantised_activations((32, k), seed=5)
    b, sb = quantised_weights((n, k), seed=6)
    with pytest.raises(ValueError, match=text):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), torch.empty(32, n, dtype=torch.bfloat16))


QUANT_CASES = [
    (np.zeros((4, 4)), TypeError),
    (torch.zeros(4, 128, dtype=torch.int32), TypeError),
    (torch.zeros(4, 128, dtype=torch.float64), TypeError),
    (torch.zeros(4, 128, dtype=FP8), TypeError),
    (torch.zeros(2, 4, 128), ValueError),
    (torch.zeros(128), ValueError),
    (torch.zeros(4, 0), ValueError),
]


@pytest.mark.parametrize("x,exc", QUANT_CASES, ids=["numpy", "int32", "float64", "fp8", "3d", "1d", "k0"])
@pytest.mark.parametrize("fn,name", [(dfg.per_token_cast_to_fp8, "x"), (dfg.per_block_cast_to_fp8, "w")])
def test_bad_quant_inputs(fn, name, x, exc):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        fn(x)


def _recording_launcher(monkeypatch) -> list:
    """Replaces the bf16 kinds' kernel launch (``kernels.gemm.launch_1d2d``, what every family's dispatch calls
    with its config) by a recorder."""
    from deep_fp8_gemm.kernels import gemm

    calls: list = []
    monkeypatch.setattr(gemm, "launch_1d2d", lambda cfg, a, sa, b, sb, out, grouped_layout, backend: calls.append(
        dict(kind=cfg.kind, cfg=cfg, a=a, b=b, sa=sa, sb=sb, grouped_layout=grouped_layout, backend=backend)))
    return calls


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_simulate_dispatches_to_launch_with_normalised_scales(kind, monkeypatch):
    calls = _recording_launcher(monkeypatch)
    monkeypatch.setenv("DFG_SIMULATE", "1")
    args = BUILDERS[kind]()
    args["sa"] = args["sa"].contiguous()  # row-major: the op must hand the launcher an M-major copy
    sentinel = args["out"].clone()
    call_gemm(kind, dict(args))
    assert len(calls) == 1, "launch not called exactly once"
    call = calls[0]
    assert call["kind"] == kind and call["backend"] is Backend.SIM
    assert utils.get_col_major_tma_aligned_tensor(call["sa"]) is call["sa"]
    assert torch.equal(call["sa"], args["sa"]) and call["sb"].is_contiguous()
    expected_layout = {"dense": None, "contiguous": args.get("m_indices"), "masked": args.get("masked_m")}[kind]
    if expected_layout is None:
        assert call["grouped_layout"] is None
    else:
        assert torch.equal(call["grouped_layout"], expected_layout)
    # The family's config rule, for expected_m 16 (masked) or the rows of A
    assert call["cfg"] == dfg.ops.FAMILIES[kind].plan(call["a"], call["b"], 16 if kind == "masked" else None,
                                                      env.sim_num_sms())
    assert torch.equal(args["out"], sentinel), "the reference ran although DFG_SIMULATE=1"


def test_m_zero_does_not_launch(monkeypatch):
    calls = _recording_launcher(monkeypatch)
    monkeypatch.setenv("DFG_SIMULATE", "1")
    b, sb = quantised_weights((N, K), seed=7)
    empty = torch.empty(0, K, dtype=FP8)
    dfg.gemm_fp8_fp8_bf16_nt((empty, torch.empty(0, 2)), (b, sb), torch.empty(0, N, dtype=torch.bfloat16))
    assert calls == []


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() == (9, 0),
    reason="needs a CUDA device other than sm_90",
)
def test_cuda_non_sm90_raises():
    args = {k: v.cuda() for k, v in dense_args().items()}
    with pytest.raises(RuntimeError, match="sm_90"):
        call_gemm("dense", args)


@pytest.mark.gpu
def test_cuda_sm90_matches_reference():
    cpu = dense_args()
    args = {k: v.cuda() for k, v in cpu.items()}
    call_gemm("dense", args)
    call_gemm("dense", cpu)
    assert dfg.calc_diff(args["out"].cpu(), cpu["out"]) < 1e-3
