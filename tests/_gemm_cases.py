"""The GEMM argument cases the validation and fast-path tests share: builders of valid operands per kind, the
bad-input table (each case: id, mutation, exception, text its message must name), and helpers that make a tensor
misaligned, strided or overlapping."""

from __future__ import annotations

import numpy as np
import torch

import deep_fp8_gemm as dfg
from tests._operands import quantised_activations, quantised_weights

FP8 = torch.float8_e4m3fn
M, N, K = 128, 64, 256  # m is a multiple of 128 so the same operands also suit the contiguous layout


def dense_args() -> dict:
    a, sa = quantised_activations((M, K), seed=0)
    b, sb = quantised_weights((N, K), seed=1)
    return dict(a=a, sa=sa, b=b, sb=sb, out=torch.zeros(M, N, dtype=torch.bfloat16))


def contiguous_args() -> dict:
    args = dense_args()
    b, sb = quantised_weights((2, N, K), seed=2)
    return dict(args, b=b, sb=sb, m_indices=torch.zeros(M, dtype=torch.int32))


def masked_args() -> dict:
    a, sa = quantised_activations((2, 32, K), seed=3)
    b, sb = quantised_weights((2, N, K), seed=4)
    out = torch.zeros(2, 32, N, dtype=torch.bfloat16)
    return dict(a=a, sa=sa, b=b, sb=sb, out=out, masked_m=torch.tensor([3, 32], dtype=torch.int32), expected_m=16)


def call_gemm(kind: str, args: dict) -> None:
    lhs = args.pop("lhs", (args["a"], args["sa"]))
    rhs = args.pop("rhs", (args["b"], args["sb"]))
    if kind == "dense":
        dfg.gemm_fp8_fp8_bf16_nt(lhs, rhs, args["out"])
    elif kind == "contiguous":
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, args["out"], args["m_indices"])
    else:
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, args["out"], args["masked_m"], args["expected_m"])


BUILDERS = {"dense": dense_args, "contiguous": contiguous_args, "masked": masked_args}


def offset_view(t: torch.Tensor, byte_offset: int) -> torch.Tensor:
    """Same shape / strides as ``t`` (contiguous) at ``byte_offset`` bytes into a larger buffer."""
    buf = torch.zeros(t.numel() * t.element_size() + 64, dtype=torch.uint8)
    return buf[byte_offset : byte_offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)


def padded_rows(t: torch.Tensor, extra: int) -> torch.Tensor:
    """``t`` as a view into rows of ``t.size(-1) + extra`` elements (leading stride changed)."""
    wide = torch.zeros(t.shape[:-1] + (t.size(-1) + extra,), dtype=t.dtype)
    return wide[..., : t.size(-1)]


def column_major(t: torch.Tensor) -> torch.Tensor:
    """Same values, last two dims stored column-major."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def overlapping_out(args: dict) -> torch.Tensor:
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
    ("A-not-K-major", lambda a: dict(a, a=column_major(a["a"])), ValueError, "lhs[0]"),
    ("A-stride-unaligned", lambda a: dict(a, a=padded_rows(a["a"], 8)), ValueError, "lhs[0]"),
    ("B-stride-unaligned", lambda a: dict(a, b=padded_rows(a["b"], 4)), ValueError, "rhs[0]"),
    ("out-stride-unaligned", lambda a: dict(a, out=padded_rows(a["out"], 4)), ValueError, "out"),
    ("out-column-major", lambda a: dict(a, out=column_major(a["out"])), ValueError, "out"),
    ("A-ptr-unaligned", lambda a: dict(a, a=offset_view(a["a"], 8)), ValueError, "lhs[0]"),
    ("out-ptr-unaligned", lambda a: dict(a, out=offset_view(a["out"], 8)), ValueError, "out"),
    ("out-overlaps-A", lambda a: dict(a, out=overlapping_out(a)), ValueError, "overlap"),
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
