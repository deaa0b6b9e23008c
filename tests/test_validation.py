"""A table of bad inputs for every public op: the exception type and that the message names the argument."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import utils
from tests._operands import quantised_activations, quantised_weights

FP8 = torch.float8_e4m3fn
M, N, K = 128, 64, 256  # m is a multiple of 128 so the same operands also suit the contiguous layout


def _dense_args() -> dict:
    a, sa = quantised_activations((M, K), seed=0)
    b, sb = quantised_weights((N, K), seed=1)
    return dict(a=a, sa=sa, b=b, sb=sb, out=torch.zeros(M, N, dtype=torch.bfloat16))


def _contiguous_args() -> dict:
    args = _dense_args()
    b, sb = quantised_weights((2, N, K), seed=2)
    return dict(args, b=b, sb=sb, m_indices=torch.zeros(M, dtype=torch.int32))


def _masked_args() -> dict:
    a, sa = quantised_activations((2, 32, K), seed=3)
    b, sb = quantised_weights((2, N, K), seed=4)
    out = torch.zeros(2, 32, N, dtype=torch.bfloat16)
    return dict(a=a, sa=sa, b=b, sb=sb, out=out, masked_m=torch.tensor([3, 32], dtype=torch.int32), expected_m=16)


def _call(kind: str, args: dict) -> None:
    lhs = args.pop("lhs", (args["a"], args["sa"]))
    rhs = args.pop("rhs", (args["b"], args["sb"]))
    if kind == "dense":
        dfg.gemm_fp8_fp8_bf16_nt(lhs, rhs, args["out"])
    elif kind == "contiguous":
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, args["out"], args["m_indices"])
    else:
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, args["out"], args["masked_m"], args["expected_m"])


BUILDERS = {"dense": _dense_args, "contiguous": _contiguous_args, "masked": _masked_args}


def _offset_view(t: torch.Tensor, byte_offset: int) -> torch.Tensor:
    """Same shape / strides as ``t`` (contiguous) at ``byte_offset`` bytes into a larger buffer."""
    buf = torch.zeros(t.numel() * t.element_size() + 64, dtype=torch.uint8)
    return buf[byte_offset : byte_offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)


def _padded_rows(t: torch.Tensor, extra: int) -> torch.Tensor:
    """``t`` as a view into rows of ``t.size(-1) + extra`` elements (leading stride changed)."""
    wide = torch.zeros(t.shape[:-1] + (t.size(-1) + extra,), dtype=t.dtype)
    return wide[..., : t.size(-1)]


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """Same values, last two dims stored column-major."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _overlapping_out(args: dict) -> torch.Tensor:
    out = args["out"]
    return args["a"].view(-1)[: out.numel() * 2].view(out.dtype).view(out.shape)  # out aliases A's bytes


COMMON = [
    # (id, mutate(args) -> args, exception, text the message must contain)
    ("lhs-not-pair", lambda a: dict(a, lhs=a["a"]), TypeError, "lhs"),
    ("rhs-three", lambda a: dict(a, rhs=(a["b"], a["sb"], a["sb"])), TypeError, "rhs"),
    ("A-numpy", lambda a: dict(a, a=np.zeros(3)), TypeError, "lhs[0]"),
    ("A-bf16", lambda a: dict(a, a=a["a"].bfloat16()), TypeError, "lhs[0]"),
    ("A-e5m2", lambda a: dict(a, a=a["a"].to(torch.float8_e5m2)), TypeError, "lhs[0]"),
    ("A-rank", lambda a: dict(a, a=a["a"].unsqueeze(0)), ValueError, "lhs[0]"),
    ("sA-dtype", lambda a: dict(a, sa=a["sa"].half()), TypeError, "lhs[1]"),
    ("sA-shape", lambda a: dict(a, sa=torch.cat([a["sa"], a["sa"][..., :1]], -1)), ValueError, "lhs[1]"),
    ("B-dtype", lambda a: dict(a, b=a["b"].float()), TypeError, "rhs[0]"),
    ("B-k", lambda a: dict(a, b=a["b"][..., :128]), ValueError, "rhs[0]"),
    ("sB-dtype", lambda a: dict(a, sb=a["sb"].double()), TypeError, "rhs[1]"),
    ("sB-shape", lambda a: dict(a, sb=torch.cat([a["sb"], a["sb"][..., :1, :]], -2)), ValueError, "rhs[1]"),
    ("out-dtype", lambda a: dict(a, out=a["out"].float()), TypeError, "out"),
    ("out-shape", lambda a: dict(a, out=a["out"][..., :8]), ValueError, "out"),
    ("out-list", lambda a: dict(a, out=[0.0]), TypeError, "out"),
    ("A-not-K-major", lambda a: dict(a, a=_column_major(a["a"])), ValueError, "lhs[0]"),
    ("A-stride-unaligned", lambda a: dict(a, a=_padded_rows(a["a"], 8)), ValueError, "lhs[0]"),
    ("B-stride-unaligned", lambda a: dict(a, b=_padded_rows(a["b"], 4)), ValueError, "rhs[0]"),
    ("out-stride-unaligned", lambda a: dict(a, out=_padded_rows(a["out"], 4)), ValueError, "out"),
    ("out-column-major", lambda a: dict(a, out=_column_major(a["out"])), ValueError, "out"),
    ("A-ptr-unaligned", lambda a: dict(a, a=_offset_view(a["a"], 8)), ValueError, "lhs[0]"),
    ("out-ptr-unaligned", lambda a: dict(a, out=_offset_view(a["out"], 8)), ValueError, "out"),
    ("out-overlaps-A", lambda a: dict(a, out=_overlapping_out(a)), ValueError, "overlap"),
    ("device-mismatch", lambda a: dict(a, sb=a["sb"].to("meta")), ValueError, "device"),
]
SPECIFIC = {
    "contiguous": [
        ("B-2d", lambda a: dict(a, b=a["b"][0]), ValueError, "rhs[0]"),
        ("m_indices-int64", lambda a: dict(a, m_indices=a["m_indices"].long()), TypeError, "m_indices"),
        ("m_indices-length", lambda a: dict(a, m_indices=a["m_indices"][:-1]), ValueError, "m_indices"),
        ("m_indices-missing", lambda a: dict(a, m_indices=None), TypeError, "m_indices"),
        (
            "m_sum-unaligned",
            lambda a: dict(a, a=a["a"][:64], sa=a["sa"][:64], out=a["out"][:64], m_indices=a["m_indices"][:64]),
            ValueError,
            "m_sum",
        ),
    ],
    "masked": [
        ("A-2d", lambda a: dict(a, a=a["a"][0], sa=a["sa"][0]), ValueError, "lhs[0]"),
        ("masked_m-int64", lambda a: dict(a, masked_m=a["masked_m"].long()), TypeError, "masked_m"),
        ("masked_m-length", lambda a: dict(a, masked_m=a["masked_m"][:1]), ValueError, "masked_m"),
        ("expected_m-zero", lambda a: dict(a, expected_m=0), ValueError, "expected_m"),
        ("expected_m-float", lambda a: dict(a, expected_m=1.5), TypeError, "expected_m"),
        ("expected_m-bool", lambda a: dict(a, expected_m=True), TypeError, "expected_m"),
        ("expected_m-tensor", lambda a: dict(a, expected_m=torch.tensor(4)), TypeError, "expected_m"),
    ],
}
CASES = [(kind, *case) for kind in BUILDERS for case in COMMON + SPECIFIC.get(kind, [])]


@pytest.mark.parametrize("kind,case_id,mutate,exc,text", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_gemm_inputs(kind, case_id, mutate, exc, text):
    args = mutate(BUILDERS[kind]())
    with pytest.raises(exc) as info:
        _call(kind, args)
    assert text in str(info.value), f"message does not name {text!r}: {info.value}"


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_valid_inputs_pass(kind):
    _call(kind, BUILDERS[kind]())  # the table's baseline really is valid


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
    calls: list = []
    module = types.ModuleType("deep_fp8_gemm.kernels.gemm")
    module.launch = lambda kind, a, sa, b, sb, out, *, grouped_layout, expected_m, backend: calls.append(
        dict(kind=kind, sa=sa, sb=sb, grouped_layout=grouped_layout, expected_m=expected_m, backend=backend)
    )
    monkeypatch.setitem(sys.modules, "deep_fp8_gemm.kernels.gemm", module)
    return calls


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_simulate_dispatches_to_launch_with_normalised_scales(kind, monkeypatch):
    calls = _recording_launcher(monkeypatch)
    monkeypatch.setenv("DFG_SIMULATE", "1")
    args = BUILDERS[kind]()
    args["sa"] = args["sa"].contiguous()  # row-major: the op must hand the launcher an M-major copy
    sentinel = args["out"].clone()
    _call(kind, dict(args))
    assert len(calls) == 1, "launch not called exactly once"
    call = calls[0]
    assert call["kind"] == kind and call["backend"] == "sim"
    assert utils.get_col_major_tma_aligned_tensor(call["sa"]) is call["sa"]
    assert torch.equal(call["sa"], args["sa"]) and call["sb"].is_contiguous()
    expected_layout = {"dense": None, "contiguous": args.get("m_indices"), "masked": args.get("masked_m")}[kind]
    if expected_layout is None:
        assert call["grouped_layout"] is None
    else:
        assert torch.equal(call["grouped_layout"], expected_layout)
    assert call["expected_m"] == (16 if kind == "masked" else None)
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
    args = {k: v.cuda() for k, v in _dense_args().items()}
    with pytest.raises(RuntimeError, match="sm_90"):
        _call("dense", args)


@pytest.mark.gpu
def test_cuda_sm90_matches_reference():
    cpu = _dense_args()
    args = {k: v.cuda() for k, v in cpu.items()}
    _call("dense", args)
    _call("dense", cpu)
    assert dfg.calc_diff(args["out"].cpu(), cpu["out"]) < 1e-3
