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
        # (an m_sum that is not a multiple of the alignment is legal since issue 40, as in the reference: trailing
        # rows with index -1, transformers' experts path; tests/ops/test_contiguous.py runs it)
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


# ---------------------------------------------------------------------------------------------- every kind
def family_call(kind: str, seed: int = 0, device: str = "cpu"):
    """A valid call of ``kind``'s public op (operands of a small problem, made on the CPU and moved to ``device``, e.g.
    ``"meta"``): ``(call, outputs, names)`` where ``call(outputs)`` runs the op with those output tensors (in place of
    the defaults) and ``names`` are their names in messages. Built from the kind's axis values, so every row of the
    kinds table has one."""
    from deep_fp8_gemm import ops
    from deep_fp8_gemm.kinds import TABLE
    from deep_fp8_gemm.ops.outputs import empty_out

    row, family = TABLE.row(kind), ops.FAMILIES[kind]
    n = 512  # the SwiGLU output's I = 256: two 128-column scale groups
    move = (lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
    if row.layout == "k_grouped":
        ks = [128, 256]
        a, sa = quantised_activations((64, sum(ks)), seed)
        b, sb = quantised_activations((n, sum(ks)), seed + 1)
        lhs, rhs, outs, extra, names = (a.view(-1), sa), (b.view(-1), sb), (torch.zeros(len(ks), 64, n),), (ks,), ("d",)
    elif row.accumulation == "1d1d":
        a, sa = quantised_activations((64, K), seed)
        b, sb = quantised_activations((n, K), seed + 1)
        lhs, rhs, outs, extra, names = (a, sa), (b, sb), (torch.zeros(64, n),), (), ("d",)
    else:
        groups = None if row.layout == "dense" else 2
        lead, rows = ((groups,), 32) if row.layout == "masked" else ((), 128)
        gran_k = TABLE.traits(kind, "granularity")["gran_k"]  # 128, or 32 for the 1x32 / 32x32 recipe
        lhs = quantised_activations((*lead, rows, K), seed, gran_k=gran_k)
        rhs = quantised_weights(((groups,) if groups else ()) + (n, K), seed + 1, gran_k=gran_k)
        extra = {"dense": (), "contiguous": (torch.zeros(rows, dtype=torch.int32),),
                 "psum": (torch.tensor([100, 128], dtype=torch.int32),),
                 "masked": (torch.tensor([3, 32], dtype=torch.int32), 16)}[row.layout]
        policy, names = family.output, family.output.names
        outs = ((torch.zeros(*lead, rows, n, dtype=torch.bfloat16),) if policy.arity == 1 else  # rows a kind leaves: 0
                tuple(t.zero_() for t in empty_out(lead, rows, policy.n_out(n), "cpu")))
    lhs, rhs, extra = tuple(map(move, lhs)), tuple(map(move, rhs)), tuple(map(move, extra))
    pair = len(names) == 2

    def call(outputs) -> None:
        family.public(lhs, rhs, tuple(outputs) if pair else outputs[0], *extra)

    return call, tuple(map(move, outs)), names


def self_overlapping_like(t: torch.Tensor) -> torch.Tensor:
    """A view of ``t``'s shape and dtype whose elements overlap while every stride stays a TMA-legal multiple of 16
    bytes: its second-innermost dimension (or the M-major scales' outer one) steps 16 bytes, inside the rows."""
    strides = list(t.stride())
    inner = max(range(t.dim()), key=lambda d: (t.shape[d] > 1 and strides[d] == 1, -d))  # the unit-stride dim
    outer = max((d for d in range(t.dim()) if d != inner and t.shape[d] > 1), key=lambda d: -strides[d])
    strides[outer] = 16 // t.element_size()
    size = 1 + sum((s - 1) * st for s, st in zip(t.shape, strides))
    return torch.zeros(size, dtype=t.dtype).as_strided(t.shape, strides)


def column_slice_like(t: torch.Tensor) -> torch.Tensor:
    """A legal non-contiguous view of ``t``'s shape: a column slice of a buffer 16 bytes wider per row (what serving
    stacks pass: the first ``n`` columns of a fused output)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 16 // t.element_size(), dtype=t.dtype)
    return wide[..., : t.shape[-1]]
