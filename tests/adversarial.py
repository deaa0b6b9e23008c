"""Adversarial run over the public API: bad and edge inputs, each classified by what the library does with it.

``python -m tests.adversarial [--json PATH|-] [--no-world]`` runs every case (CPU; a gloo world of 2 processes for
the expert-parallel ones) and prints the figures; ``tests/ops/test_adversarial.py`` runs it in child processes (so a
process crash is caught and blamed on its case) and requires 0 silent wrong results, 0 crashes, 0 misleading
errors and 0 refused valid inputs.

A case is ``(id, expected, fn)``. ``expected`` is either ``Err(types, text)`` — a bad input: the call must raise
one of ``types`` with ``text`` in the message (the argument's name, the rule) — or ``OK`` — an edge input that
must work: ``fn`` checks the result itself (against an independent float64 model, a canonical copy or the
documented value) and raises :class:`Wrong` when it is not what the API promises. Outcomes:

=================  ====================================================================================
``clear``          a bad input raised the documented error, naming what is wrong
``handled``        an edge input gave the documented result
``misleading``     raised, but another exception type or a message that does not name the problem
``refused``        an edge input that must work raised
``silent_wrong``   a bad input was accepted, or an edge input gave a wrong result
``crash``          the process died (signal, abort) in the case (detected by the parent, test_adversarial)
=================  ====================================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

import deep_fp8_gemm as dfg
import deep_fp8_gemm.distributed  # noqa: F401 - dfg.distributed
from tests._gemm_cases import BUILDERS, CASES as GEMM_TABLE, call_gemm, offset_view
from tests._operands import gemm64, quantised_activations, quantised_weights

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


class Wrong(AssertionError):
    """An accepted call whose result is not what the API promises."""


class Err(NamedTuple):
    types: tuple
    text: str


OK = "ok"


class Case(NamedTuple):
    id: str
    expected: object  # Err | OK
    fn: Callable[[], None]


CASES: list[Case] = []


def case(case_id: str, expected, fn: Callable[[], None]) -> None:
    CASES.append(Case(case_id, expected, fn))


def err(types, text: str) -> Err:
    return Err(types if isinstance(types, tuple) else (types,), text)


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Wrong(what)


@contextlib.contextmanager
def env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------- models
def _close_bf16(got: torch.Tensor, a, sa, b, sb, what: str) -> None:
    """``got`` (bf16 ``[m, n]``) within one bf16 rounding plus float32 accumulation of the float64 model."""
    if got.numel() == 0:
        expect(tuple(got.shape) == (a.shape[0], b.shape[0]), f"{what}: shape")
        return
    model = gemm64(a, sa, b, sb)
    g = got.double().numpy()
    tol = 2.0 ** -8 * np.abs(model.value) + 2 * model.accumulation_bound + 1e-30
    expect(bool(np.all(np.abs(g - model.value) <= tol)), f"{what}: off the float64 model by "
           f"{np.max(np.abs(g - model.value) - tol):.3g} beyond tolerance")


def _dense(m=64, n=64, k=256, seed=0):
    a, sa = quantised_activations((m, k), seed=seed)
    if n == 0:
        b, sb = torch.empty(0, k, dtype=FP8), torch.empty(0, (k + 127) // 128)
    else:
        b, sb = quantised_weights((n, k), seed=seed + 1)
    return a, sa, b, sb, torch.full((m, n), float("nan"), dtype=BF16)


# ---------------------------------------------------------------------------------------------- GEMM tables
# The bad-input table of tests/ops/test_validation.py (dense, contiguous, masked x common + specific mutations).
for _kind, _cid, _mutate, _exc, _text in GEMM_TABLE:
    case(f"{_kind}/{_cid}", err(_exc, _text),
         lambda kind=_kind, mutate=_mutate: call_gemm(kind, mutate(BUILDERS[kind]())))


# ---------------------------------------------------------------------------------------------- dense edges
def _dense_ok(m, n, k, transform=lambda t: t):
    def run():
        a, sa, b, sb, out = _dense(m, n, k)
        a2, sa2, b2, sb2, out2 = transform((a, sa, b, sb, out))
        dfg.gemm_fp8_fp8_bf16_nt((a2, sa2), (b2, sb2), out2)
        if m:
            _close_bf16(out2, a, sa, b, sb, f"dense {m}x{n}x{k}")
    return run


for _m, _n, _k in ((1, 64, 256), (7, 64, 256), (64, 8, 128), (64, 64, 16), (64, 64, 144), (130, 136, 384),
                   (0, 64, 256), (64, 0, 256)):
    case(f"dense/edge-m{_m}-n{_n}-k{_k}", OK, _dense_ok(_m, _n, _k))


def _strided(parts):
    a, sa, b, sb, out = parts
    big_a = torch.zeros(a.shape[0], a.shape[1] + 32, dtype=FP8)
    big_a[:, :a.shape[1]] = a
    big_out = torch.zeros(out.shape[0], out.shape[1] + 16, dtype=BF16)
    return big_a[:, :a.shape[1]], sa.t().contiguous().t(), b, sb.t().contiguous().t(), big_out[:, :out.shape[1]]


case("dense/edge-row-strides-and-col-major-scales", OK, _dense_ok(64, 64, 256, _strided))
case("dense/edge-M-major-scales", OK,
     _dense_ok(64, 64, 256, lambda p: (p[0], dfg.get_col_major_tma_aligned_tensor(p[1]), *p[2:])))
case("dense/edge-offset-16B-views", OK,
     _dense_ok(64, 64, 256, lambda p: (offset_view(p[0], 16).copy_(p[0]), p[1], p[2], p[3], p[4])))


def _dense_plan_reuse():
    a, sa, b, sb, out = _dense(64, 64, 256)
    for seed in range(3):  # same signature, new pointers and values: the cached plan recomputes
        a2, sa2 = quantised_activations((64, 256), seed=10 + seed)
        out2 = torch.empty_like(out)
        dfg.gemm_fp8_fp8_bf16_nt((a2, sa2), (b, sb), out2)
        _close_bf16(out2, a2, sa2, b, sb, "plan reuse")


case("dense/edge-plan-reuse-new-pointers", OK, _dense_plan_reuse)


def _dense_zero_scales():
    a, sa, b, sb, out = _dense()
    dfg.gemm_fp8_fp8_bf16_nt((a, torch.zeros_like(sa)), (b, sb), out)
    expect(bool((out == 0).all()), "zero scales must give zeros")


case("dense/edge-zero-scales", OK, _dense_zero_scales)


def _dense_meta():
    a, sa = torch.empty(64, 256, dtype=FP8, device="meta"), torch.empty(64, 2, device="meta")
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (torch.empty(64, 256, dtype=FP8, device="meta"), torch.empty(1, 2, device="meta")),
                             torch.empty(64, 64, dtype=BF16, device="meta"))


case("dense/edge-meta-tensors", OK, _dense_meta)
case("dense/bad-k-not-16", err(ValueError, "k=120"), lambda: dfg.gemm_fp8_fp8_bf16_nt(
    _dense(64, 64, 120)[0:2], _dense(64, 64, 120)[2:4], _dense(64, 64, 120)[4]))
case("dense/bad-n-not-8", err(ValueError, "n=60"), lambda: dfg.gemm_fp8_fp8_bf16_nt(
    _dense(64, 60, 128)[0:2], _dense(64, 60, 128)[2:4], _dense(64, 60, 128)[4]))


def _out_overlaps_b():
    a, sa, b, sb, out = _dense(64, 64, 256)
    big = torch.zeros(64 * 256, dtype=FP8)
    big.copy_(b.reshape(-1))
    alias = big.view(BF16)[:64 * 64].view(64, 64)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (big.view(64, 256), sb), alias)


case("dense/bad-out-overlaps-B", err(ValueError, "overlap rhs[0] (B)"), _out_overlaps_b)
case("dense/bad-A-int8", err(TypeError, "lhs[0] (A)"), lambda: dfg.gemm_fp8_fp8_bf16_nt(
    (_dense()[0].view(torch.int8), _dense()[1]), _dense()[2:4], _dense()[4]))
case("dense/bad-scales-tuple", err(TypeError, "lhs[1] (sA)"), lambda: dfg.gemm_fp8_fp8_bf16_nt(
    (_dense()[0], (1.0,)), _dense()[2:4], _dense()[4]))
case("dense/bad-out-none", err(TypeError, "out"), lambda: dfg.gemm_fp8_fp8_bf16_nt(_dense()[0:2], _dense()[2:4], None))
case("dense/bad-lhs-dict", err(TypeError, "lhs"), lambda: dfg.gemm_fp8_fp8_bf16_nt({}, _dense()[2:4], _dense()[4]))
case("dense/bad-out-4d", err(ValueError, "out"), lambda: dfg.gemm_fp8_fp8_bf16_nt(
    _dense()[0:2], _dense()[2:4], _dense()[4].view(1, 1, 64, 64)))
case("dense/bad-A-empty-k", err(ValueError, "k must be positive"), lambda: dfg.gemm_fp8_fp8_bf16_nt(
    (torch.empty(4, 0, dtype=FP8), torch.empty(4, 0)), _dense()[2:4], torch.empty(4, 64, dtype=BF16)))


def _config_forced_split_k():
    import dataclasses

    from deep_fp8_gemm.config import get_config
    from deep_fp8_gemm.kernels import gemm

    a, sa, b, sb, out = _dense(64, 64, 512)
    cfg = dataclasses.replace(get_config(64, 64, 512, 1, "dense", 4), split_k=3, grid_size=3)
    gemm.launch_1d2d(cfg, a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out, None, "sim")


case("dense/bad-forced-split-k", err(ValueError, "split_k=3 must be a positive divisor"), _config_forced_split_k)


# ---------------------------------------------------------------------------------------------- contiguous
def _contiguous(m_indices, seed=0):
    m_sum = m_indices.numel()
    a, sa = quantised_activations((m_sum, 256), seed=seed)
    b, sb = quantised_weights((2, 64, 256), seed=seed + 1)
    return a, sa, b, sb, torch.full((m_sum, 64), float("nan"), dtype=BF16), m_indices


def _rows(*runs):
    return torch.tensor([v for v, c in runs for _ in range(c)], dtype=torch.int32)


def _contiguous_call(m_indices):
    a, sa, b, sb, out, mi = _contiguous(m_indices)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, mi)
    return a, sa, b, sb, out, mi


def _contiguous_ok(m_indices):
    def run():
        a, sa, b, sb, out, mi = _contiguous_call(m_indices)
        for g in range(2):
            rows = (mi == g).nonzero().flatten()
            if rows.numel():
                _close_bf16(out[rows], a[rows], sa[rows], b[g], sb[g], f"expert {g}")
    return run


for _cid, _mi, _text in [
    ("bad-unpadded-experts", _rows((0, 100), (1, 128), (-1, 28)), "holds rows of 2 experts"),
    ("bad-two-experts-one-block", _rows((0, 64), (1, 64), (-1, 128)), "holds rows of 2 experts"),
    ("bad-expert-hidden-between-padding", _rows((-1, 10), (0, 108), (-1, 10), (1, 128)),
     "first and last rows are padding"),
    ("bad-expert-out-of-range", _rows((0, 128), (2, 128)), "values must be in [-1, G)"),
    ("bad-expert-below-minus-one", _rows((0, 128), (-2, 128)), "values must be in [-1, G)"),
]:
    case(f"contiguous/{_cid}", err(ValueError, _text), lambda mi=_mi: _contiguous_call(mi))
for _cid, _mi in [("edge-built-layout", dfg.layout.build_contiguous_layout(torch.tensor([100, 60])).m_indices),
                  ("edge-head-padding", _rows((-1, 28), (0, 100), (1, 128))),
                  ("edge-middle-padding", _rows((0, 10), (-1, 108), (0, 10), (1, 128))),
                  ("edge-all-padding", _rows((-1, 256))), ("edge-one-expert-only", _rows((1, 256))),
                  ("edge-padding-block-between", _rows((0, 128), (-1, 128), (1, 1), (-1, 127)))]:
    case(f"contiguous/{_cid}", OK, _contiguous_ok(_mi))


def _explicit_check_gpu_style():
    dfg.check_contiguous_layout(_rows((0, 64), (1, 64)), 2)


case("contiguous/bad-explicit-check", err(ValueError, "m_indices[0:128]"), _explicit_check_gpu_style)
case("contiguous/bad-explicit-check-num-groups", err(ValueError, "num_groups"),
     lambda: dfg.check_contiguous_layout(_rows((0, 128)), 0))
case("contiguous/bad-custom-op-mixed-block", err(ValueError, "m_indices"),
     lambda: torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
         *_contiguous(_rows((0, 64), (1, 64)))[:5], _rows((0, 64), (1, 64))))


def _contiguous_simulated_layout_refused():
    with env(DFG_SIMULATE="1"):
        _contiguous_call(_rows((0, 100), (1, 28)))


case("contiguous/bad-mixed-block-simulator-path", err(ValueError, "holds rows of 2 experts"),
     _contiguous_simulated_layout_refused)


# ---------------------------------------------------------------------------------------------- masked
def _masked(counts, m_max=32):
    a, sa = quantised_activations((2, m_max, 256), seed=3)
    b, sb = quantised_weights((2, 64, 256), seed=4)
    return a, sa, b, sb, torch.full((2, m_max, 64), float("nan"), dtype=BF16), torch.tensor(counts, dtype=torch.int32)


def _masked_call(counts, expected_m=16, simulate=False):
    a, sa, b, sb, out, mm = _masked(counts)
    with env(DFG_SIMULATE="1" if simulate else "0"):
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, mm, expected_m)
    return a, sa, b, sb, out, mm


def _masked_ok(counts):
    def run():
        a, sa, b, sb, out, mm = _masked_call(counts)
        for g, c in enumerate(counts):
            if c:
                _close_bf16(out[g, :c], a[g, :c], sa[g, :c], b[g], sb[g], f"group {g}")
    return run


case("masked/bad-count-above-m_max", err(ValueError, "masked_m[0] must be in [0, m_max=32], got 33"),
     lambda: _masked_call([33, 1]))
case("masked/bad-count-negative", err(ValueError, "masked_m[1] must be in [0, m_max=32], got -1"),
     lambda: _masked_call([3, -1]))
case("masked/bad-count-above-m_max-simulator-path", err(ValueError, "masked_m[0] must be in [0, m_max=32]"),
     lambda: _masked_call([40, 1], simulate=True))
case("masked/bad-expected_m-negative", err(ValueError, "expected_m"), lambda: _masked_call([3, 1], expected_m=-4))
case("masked/bad-expected_m-none", err(TypeError, "expected_m"), lambda: _masked_call([3, 1], expected_m=None))
case("masked/bad-explicit-check", err(ValueError, "masked_m[0]"),
     lambda: dfg.check_masked_layout(torch.tensor([5, 1], dtype=torch.int32), 4))
for _counts in ([0, 0], [32, 32], [1, 0], [5, 31]):
    case(f"masked/edge-counts-{_counts[0]}-{_counts[1]}", OK, _masked_ok(_counts))


# ---------------------------------------------------------------------------------------------- psum
def _psum_call(ends, m_sum=256, expected_m=None):
    a, sa = quantised_activations((m_sum, 256), seed=5)
    b, sb = quantised_weights((2, 64, 256), seed=6)
    out = torch.full((m_sum, 64), float("nan"), dtype=BF16)
    gl = ends if isinstance(ends, torch.Tensor) else torch.tensor(ends, dtype=torch.int32)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum((a, sa), (b, sb), out, gl, expected_m)
    return a, sa, b, sb, out


def _psum_ok(ends, m_sum=256, expected_m=None):
    def run():
        a, sa, b, sb, out = _psum_call(ends, m_sum, expected_m)
        for g, (start, end) in enumerate(dfg.ops.psum.psum_group_rows(ends)):
            if end > start:
                _close_bf16(out[start:end], a[start:end], sa[start:end], b[g], sb[g], f"group {g}")
    return run


case("psum/bad-decreasing", err(ValueError, "non-decreasing"), lambda: _psum_call([100, 50]))
case("psum/bad-negative", err(ValueError, "non-negative"), lambda: _psum_call([-1, 50]))
case("psum/bad-past-rows", err(ValueError, "exceeds the rows"), lambda: _psum_call([100, 300]))
case("psum/bad-int64", err(TypeError, "grouped_layout"), lambda: _psum_call(torch.tensor([0, 100])))
case("psum/bad-length", err(ValueError, "grouped_layout"), lambda: _psum_call([100]))
case("psum/bad-expected_m-zero", err(ValueError, "expected_m"), lambda: _psum_call([100, 200], expected_m=0))
case("psum/bad-explicit-check", err(ValueError, "non-decreasing"),
     lambda: dfg.check_psum_layout(torch.tensor([9, 3], dtype=torch.int32), 16))
for _ends, _m, _em in (([100, 200], 256, None), ([0, 0], 256, None), ([100, 100], 256, None), ([50, 190], 200, 64),
                       ([128, 256], 256, 128)):
    case(f"psum/edge-ends-{_ends[0]}-{_ends[1]}-m{_m}", OK, _psum_ok(_ends, _m, _em))


# ---------------------------------------------------------------------------------------------- 1d1d
def _wgrad(m=128, n=64, k=256):
    a, sa = quantised_activations((m, k), seed=7)
    b, sb = quantised_activations((n, k), seed=8)
    return a, sa, b, sb


def _wgrad_model(a, sa, b, sb):
    da = a.double() * sa.double().repeat_interleave(128, -1)[:, :a.shape[1]]
    db = b.double() * sb.double().repeat_interleave(128, -1)[:, :b.shape[1]]
    return da @ db.T


def _wgrad_ok(c_kind):
    def run():
        a, sa, b, sb = _wgrad()
        d = torch.full((128, 64), 0.5)
        c = {"none": None, "d": d, "separate": torch.full((128, 64), 2.0)}[c_kind]
        base = {"none": 0.0, "d": 0.5, "separate": 2.0}[c_kind]
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
        want = _wgrad_model(a, sa, b, sb) + base
        expect(bool(torch.allclose(d.double(), want, rtol=1e-5, atol=1e-5)), f"1d1d c={c_kind}")
    return run


for _c in ("none", "d", "separate"):
    case(f"1d1d/edge-c-{_c}", OK, _wgrad_ok(_c))
case("1d1d/bad-d-bf16", err(TypeError, "d must be torch.float32"),
     lambda: dfg.gemm_fp8_fp8_fp32_nt_1d1d(_wgrad()[0:2], _wgrad()[2:4], torch.zeros(128, 64, dtype=BF16)))
case("1d1d/bad-d-shape", err(ValueError, "d"),
     lambda: dfg.gemm_fp8_fp8_fp32_nt_1d1d(_wgrad()[0:2], _wgrad()[2:4], torch.zeros(128, 32)))
case("1d1d/bad-c-shape", err(ValueError, "c must have d's shape"),
     lambda: dfg.gemm_fp8_fp8_fp32_nt_1d1d(_wgrad()[0:2], _wgrad()[2:4], torch.zeros(128, 64),
                                                 torch.zeros(64, 64)))
case("1d1d/bad-sB-block-scales", err(ValueError, "rhs[1] (sB)"),
     lambda: dfg.gemm_fp8_fp8_fp32_nt_1d1d(_wgrad()[0:2], (_wgrad()[2], torch.ones(1, 2)), torch.zeros(128, 64)))


def _wgrad_c_overlaps_d():
    a, sa, b, sb = _wgrad()
    buf = torch.zeros(129 * 64)
    d, c = buf[:128 * 64].view(128, 64), buf[64:64 + 128 * 64].view(128, 64)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)


case("1d1d/bad-c-partly-overlaps-d", err(ValueError, "d must not overlap c"), _wgrad_c_overlaps_d)


def _wgrad_d_overlaps_a():
    a, sa, b, sb = _wgrad()
    buf = torch.zeros(128 * 64 * 4, dtype=torch.uint8)
    alias = buf[:a.numel()].view(FP8).view(a.shape)
    alias.copy_(a)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((alias, sa), (b, sb), buf.view(torch.float32).view(128, 64))


case("1d1d/bad-d-overlaps-A", err(ValueError, "d must not overlap lhs[0] (A)"), _wgrad_d_overlaps_a)


# ---------------------------------------------------------------------------------------------- k-grouped
def _kg_call(ks, ks_tensor="same", c=None, a_extra=0):
    m, n = 64, 64
    total = sum(k for k in ks if isinstance(k, int) and k > 0)
    a = torch.randn(m * total + a_extra).clamp(-4, 4).to(FP8)
    b = torch.randn(n * total).clamp(-4, 4).to(FP8)
    sa, sb = torch.rand(m, max(total // 128, 0)) + 0.5, torch.rand(n, max(total // 128, 0)) + 0.5
    d = torch.zeros(len(ks), m, n)
    kt = torch.tensor([k if isinstance(k, int) else 0 for k in ks], dtype=torch.int32) if ks_tensor == "same" \
        else ks_tensor
    dfg.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, kt, c=c)
    return a, sa, b, sb, d


def _kg_ok(ks):
    def run():
        a, sa, b, sb, d = _kg_call(ks)
        offset = 0
        for g, k in enumerate(ks):
            ag = a[64 * offset: 64 * (offset + k)].view(64, k)
            bg = b[64 * offset: 64 * (offset + k)].view(64, k)
            cols = slice(offset // 128, (offset + k) // 128)
            want = _wgrad_model(ag, sa[:, cols], bg, sb[:, cols]) if k else torch.zeros(64, 64, dtype=torch.float64)
            expect(bool(torch.allclose(d[g].double(), want, rtol=1e-5, atol=1e-4)), f"group {g} (K={k})")
            offset += k
    return run


for _ks in ([128, 256], [0, 128], [0, 0], [384]):
    case(f"k_grouped/edge-ks-{'-'.join(map(str, _ks))}", OK, _kg_ok(_ks))
case("k_grouped/bad-ks-not-128", err(ValueError, "ks[1]=200"), lambda: _kg_call([128, 200]))
case("k_grouped/bad-ks-negative", err(ValueError, "ks[0]"), lambda: _kg_call([-128, 256]))
case("k_grouped/bad-ks-float", err(TypeError, "ks"), lambda: _kg_call([128.0, 128]))
case("k_grouped/bad-ks_tensor-values", err(ValueError, "ks_tensor must hold the values"),
     lambda: _kg_call([128, 128], torch.tensor([256, 0], dtype=torch.int32)))
case("k_grouped/bad-ks_tensor-int64", err(TypeError, "ks_tensor"),
     lambda: _kg_call([128, 128], torch.tensor([128, 128])))
case("k_grouped/bad-A-numel", err(ValueError, "lhs[0] (A) must have m * sum(ks)"), lambda: _kg_call([128], a_extra=16))
case("k_grouped/bad-c-shape", err(ValueError, "c must have d's shape"), lambda: _kg_call([128], c=torch.zeros(64, 64)))


# ---------------------------------------------------------------------------------------------- quantisers
def _token_ok(shape, dtype, transform=lambda t: t):
    def run():
        g = torch.Generator().manual_seed(9)
        x = transform((torch.randn(shape, generator=g) * 3).to(dtype))
        q, s = dfg.per_token_cast_to_fp8(x)
        rq, rs = dfg.quant.per_token_cast_to_fp8_torch(x.contiguous())
        expect(q.shape == x.shape and torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), "codes")
        expect(torch.equal(s, rs), "scales")
    return run


for _shape, _dtype in (((4, 256), BF16), ((4, 256), torch.float16), ((4, 256), torch.float32), ((1, 1), BF16),
                       ((0, 128), BF16), ((3, 130), BF16), ((5, 16), torch.float32)):
    case(f"quant/per_token-edge-{_shape[0]}x{_shape[1]}-{str(_dtype)[6:]}", OK, _token_ok(_shape, _dtype))
case("quant/per_token-edge-transposed-input", OK, _token_ok((256, 8), BF16, lambda t: t.t()))
case("quant/per_token-edge-sliced-input", OK, _token_ok((8, 512), BF16, lambda t: t[:, 100:356]))
for _x, _exc, _cid in ((np.zeros((4, 4)), TypeError, "numpy"), (torch.zeros(4, 128, dtype=torch.int32), TypeError, "int32"),
                       (torch.zeros(4, 128, dtype=torch.float64), TypeError, "float64"),
                       (torch.zeros(4, 128, dtype=FP8), TypeError, "fp8"), (torch.zeros(2, 4, 128), ValueError, "3d"),
                       (torch.zeros(128), ValueError, "1d"), (torch.zeros(4, 0), ValueError, "k0")):
    case(f"quant/per_token-bad-{_cid}", err(_exc, "x"), lambda x=_x: dfg.per_token_cast_to_fp8(x))
    case(f"quant/per_block-bad-{_cid}", err(_exc, "w"), lambda x=_x: dfg.per_block_cast_to_fp8(x))
case("quant/per_token-bad-ue8m0-int", err(TypeError, "use_ue8m0"),
     lambda: dfg.per_token_cast_to_fp8(torch.zeros(4, 128), use_ue8m0=1))
case("quant/per_token-bad-gran_k-64", err(ValueError, "gran_k"),
     lambda: dfg.per_token_cast_to_fp8(torch.zeros(4, 128), gran_k=64))
case("quant/per_token-edge-gran_k-32", OK,
     lambda: expect(dfg.per_token_cast_to_fp8(torch.ones(4, 96), gran_k=32)[1].shape == (4, 3), "[4, 3] scales"))


def _block_ok(shape):
    def run():
        w = torch.randn(shape)
        q, s = dfg.per_block_cast_to_fp8(w)
        rq, rs = dfg.quant.per_block_cast_to_fp8_torch(w)
        expect(torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs), "per_block")
    return run


for _shape in ((128, 128), (130, 260), (1, 16), (0, 128)):
    case(f"quant/per_block-edge-{_shape[0]}x{_shape[1]}", OK, _block_ok(_shape))
case("quant/per_channel-bad-m", err(ValueError, "128"), lambda: dfg.per_channel_cast_to_fp8(torch.zeros(100, 64)))
case("quant/silu_mul_quant-bad-odd-width", err(ValueError, "x"), lambda: dfg.moe.silu_mul_quant(torch.zeros(4, 257)))
case("quant/silu_mul_quant-bad-int", err(TypeError, "x"),
     lambda: dfg.moe.silu_mul_quant(torch.zeros(4, 256, dtype=torch.int32)))


def _silu_ok():
    x = torch.randn(8, 512, dtype=BF16)
    q, s = dfg.moe.silu_mul_quant(x)
    rq, rs = dfg.quant.silu_mul_quant_torch(x)
    expect(torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs), "silu_mul_quant")


case("quant/silu_mul_quant-edge", OK, _silu_ok)
case("cast_transpose/bad-m0", err(ValueError, "x"),
     lambda: dfg.per_token_cast_to_fp8_and_transpose(torch.zeros(0, 128, dtype=BF16)))
case("cast_transpose/bad-ks-sum", err(ValueError, "ks"),
     lambda: dfg.transpose_cast_to_fp8_k_grouped(torch.zeros(256, 64, dtype=BF16), [128, 256]))
case("cast_transpose/bad-ks-unaligned", err(ValueError, "ks"),
     lambda: dfg.transpose_cast_to_fp8_k_grouped(torch.zeros(256, 64, dtype=BF16), [100, 156]))
case("cast_transpose/bad-block-scales-shape", err(ValueError, "w_sf"),
     lambda: dfg.transpose_per_block_fp8(torch.zeros(256, 128, dtype=FP8), torch.ones(1, 1)))


def _transpose_ok():
    w = torch.randn(256, 384)
    q, s = dfg.per_block_cast_to_fp8(w)
    tq, ts = dfg.transpose_per_block_fp8(q, s)
    expect(torch.equal(tq.float(), q.float().t()) and torch.equal(ts, s.t()), "transpose_per_block_fp8")


case("cast_transpose/edge-transpose-blocks", OK, _transpose_ok)


def _ct_ok():
    x = torch.randn(200, 256, dtype=BF16)
    q, s, qt, st = dfg.per_token_cast_to_fp8_and_transpose(x)
    rq, rs = dfg.per_token_cast_to_fp8(x)
    rqt, rst = dfg.per_token_cast_to_fp8(x.t().contiguous())
    expect(torch.equal(q.float(), rq.float()) and torch.equal(s, rs), "x part")
    expect(torch.equal(qt.float(), rqt.float()) and torch.equal(st, rst), "xt part")


case("cast_transpose/edge-m-not-128", OK, _ct_ok)


# ---------------------------------------------------------------------------------------------- prepared
def _prepared(kind="dense"):
    args = BUILDERS[kind]()
    grouped = {"dense": None, "contiguous": args.get("m_indices"), "masked": args.get("masked_m")}[kind]
    p = dfg.prepare_gemm(kind, (args["a"], args["sa"]), (args["b"], args["sb"]), args["out"], grouped,
                         expected_m=args.get("expected_m"))
    return p, args, grouped


def _prepared_bf16_a():
    p, args, _ = _prepared()
    p((args["a"].bfloat16(), args["sa"]), (args["b"], args["sb"]), args["out"])


def _prepared_ok():
    p, args, _ = _prepared()
    a2, sa2 = quantised_activations(tuple(args["a"].shape), seed=33)
    out = torch.empty_like(args["out"])
    p((a2, sa2), (args["b"], args["sb"]), out)
    _close_bf16(out, a2, sa2, args["b"], args["sb"], "prepared")


case("prepared/bad-bf16-A", err(TypeError, "lhs[0] (A)"), _prepared_bf16_a)
case("prepared/bad-fp32-out", err(TypeError, "out"), lambda: (lambda p, a, g: p(
    (a["a"], a["sa"]), (a["b"], a["sb"]), a["out"].float()))(*_prepared()))
case("prepared/bad-int64-m_indices", err(TypeError, "m_indices"), lambda: (lambda p, a, g: p(
    (a["a"], a["sa"]), (a["b"], a["sb"]), a["out"], g.long()))(*_prepared("contiguous")))
case("prepared/bad-not-a-pair", err(TypeError, "lhs"), lambda: (lambda p, a, g: p(
    a["a"], (a["b"], a["sb"]), a["out"]))(*_prepared()))
case("prepared/bad-kind", err(ValueError, "kind"),
     lambda: dfg.prepare_gemm("sparse", None, None, None))
case("prepared/bad-masked-layout", err(ValueError, "masked_m[0] must be in"), lambda: (lambda p, a, g: p(
    (a["a"], a["sa"]), (a["b"], a["sb"]), a["out"], torch.tensor([99, 1], dtype=torch.int32)))(*_prepared("masked")))
case("prepared/edge-new-pointers", OK, _prepared_ok)


# ---------------------------------------------------------------------------------------------- compat (2.x names)
def _compat_args():
    a, sa, b, sb, out = _dense(64, 64, 256)
    return (a, sa), (b, sb), out


case("compat/bad-recipe", err(ValueError, "recipe"), lambda: dfg.fp8_gemm_nt(*_compat_args(), recipe=(1, 2, 3)))
case("compat/bad-c-with-bf16-d", err(ValueError, "c"),
     lambda: dfg.fp8_gemm_nt(*_compat_args(), c=_compat_args()[2]))
case("compat/bad-fp32-d-default-recipe", err(TypeError, "recipe=(1, 1, 128)"),
     lambda: dfg.fp8_gemm_nt(*_compat_args()[:2], torch.zeros(64, 64)))
case("compat/bad-compiled-dims", err(ValueError, "compiled_dims"),
     lambda: dfg.fp8_gemm_nt(*_compat_args(), compiled_dims="xyz"))
case("compat/bad-disable-ue8m0-cast", err(TypeError, "disable_ue8m0_cast"),
     lambda: dfg.fp8_gemm_nt(*_compat_args(), disable_ue8m0_cast="yes"))
case("compat/bad-gran-k-32", err(NotImplementedError, "gran_k"),
     lambda: dfg.fp8_gemm_nt(*_compat_args(), recipe=(1, 128, 32)))
case("compat/bad-block32-scales-for-1-32-32", err(ValueError, "ceil(k/32)"),
     lambda: dfg.fp8_gemm_nt(*_compat_args(), recipe=(1, 32, 32)))
case("compat/bad-psum-decreasing", err(ValueError, "non-decreasing"),
     lambda: dfg.m_grouped_fp8_gemm_nt_contiguous(_contiguous(_rows((0, 256)))[0:2], _contiguous(_rows((0, 256)))[2:4],
                                                 _contiguous(_rows((0, 256)))[4], torch.tensor([200, 100],
                                                                                              dtype=torch.int32),
                                                 use_psum_layout=True))


def _compat_ok():
    lhs, rhs, out = _compat_args()
    dfg.fp8_gemm_nt(lhs, rhs, out)
    _close_bf16(out, *lhs, *rhs, "fp8_gemm_nt")


case("compat/edge-fp8_gemm_nt", OK, _compat_ok)
case("compat/edge-alignment", OK, lambda: expect(dfg.get_mk_alignment_for_contiguous_layout() ==
                                                 dfg.get_m_alignment_for_contiguous_layout(), "alignment"))


# ---------------------------------------------------------------------------------------------- nn / moe layers
H, I, E = 128, 128, 4


def _moe_layer():
    g = torch.Generator().manual_seed(21)
    return dfg.moe.FP8MoE.from_weights(torch.randn(E, 2 * I, H, generator=g) / 12, torch.randn(E, H, I, generator=g) / 12)


def _moe_inputs(t=8, ids=None):
    g = torch.Generator().manual_seed(22)
    hidden = torch.randn(t, H, generator=g).to(BF16)
    topk = torch.randint(0, E, (t, 2), generator=g, dtype=torch.int32) if ids is None else ids
    return hidden, topk, torch.rand(t, 2, generator=g)


case("nn/bad-in-features", err(ValueError, "in_features"), lambda: dfg.nn.FP8Linear(100, 64))
case("nn/bad-out-features", err(ValueError, "out_features"), lambda: dfg.nn.FP8Linear(128, 4))
case("nn/bad-features-float", err(TypeError, "in_features"), lambda: dfg.nn.FP8Linear(128.0, 64))
case("nn/bad-forward-fp32", err(TypeError, "x must be bfloat16"),
     lambda: dfg.nn.FP8Linear(128, 64)(torch.zeros(4, 128)))
case("nn/bad-forward-width", err(ValueError, "in_features=128"),
     lambda: dfg.nn.FP8Linear(128, 64)(torch.zeros(4, 64, dtype=BF16)))
case("nn/bad-forward-device", err(ValueError, "weight is on"),
     lambda: dfg.nn.FP8Linear(128, 64)(torch.zeros(4, 128, dtype=BF16, device="meta")))
case("nn/bad-from-linear", err(TypeError, "nn.Linear"), lambda: dfg.nn.FP8Linear.from_linear(torch.nn.Conv1d(1, 1, 1)))


def _linear_after_cast(cast):
    def run():
        torch.manual_seed(3)
        lin = dfg.nn.FP8Linear.from_linear(torch.nn.Linear(128, 64))
        x = torch.randn(4, 128).to(BF16)
        before = lin(x)
        cast(lin)
        expect(lin.weight_fp8.dtype == FP8 and lin.weight_scale.dtype == torch.float32, "state dtypes")
        expect(torch.equal(lin(x), before), "forward changed")
    return run


for _cid, _cast in (("to-bf16", lambda m: m.to(BF16)), ("half", lambda m: m.half()), ("float", lambda m: m.float()),
                    ("double", lambda m: m.double())):
    case(f"nn/edge-FP8Linear-{_cid}", OK, _linear_after_cast(_cast))


def _state_dict_round_trip():
    torch.manual_seed(4)
    lin = dfg.nn.FP8Linear(128, 64).to(BF16)
    other = dfg.nn.FP8Linear(128, 64)
    other.load_state_dict(lin.state_dict())
    x = torch.randn(3, 128).to(BF16)
    expect(torch.equal(other(x), lin(x)), "state dict round trip")


case("nn/edge-state-dict-round-trip", OK, _state_dict_round_trip)


def _moe_ok(ids=None, t=8):
    def run():
        layer = _moe_layer()
        hidden, topk, w = _moe_inputs(t, ids)
        out = layer(hidden, topk, w)
        expect(out.shape == (t, H) and out.dtype == BF16, "shape")
        # each token: sum_j w * FFN_e(x) against the per-expert dense path (same GEMM family, one expert at a time)
        for row in range(t):
            acc = torch.zeros(H)
            for j in range(topk.shape[1]):
                e = int(topk[row, j])
                if e < 0:
                    continue
                # the layer's up-projection path (fused SwiGLU, FP8MoE's default): the same rounding of h
                single = dfg.moe.fp8_moe_forward(hidden[row:row + 1], torch.tensor([[e]], dtype=torch.int32),
                                                 torch.ones(1, 1), layer.w13, layer.w13_scale, layer.w2, layer.w2_scale,
                                                 w13_swiglu=layer.swiglu_pair)
                acc += w[row, j] * single[0].float()
            expect(bool(torch.allclose(out[row].float(), acc, rtol=2e-2, atol=2e-2)), f"token {row}")
    return run


case("moe/edge-routed", OK, _moe_ok())
case("moe/edge-all-dropped", OK, _moe_ok(torch.full((8, 2), -1, dtype=torch.int32)))
case("moe/edge-no-tokens", OK, _moe_ok(torch.zeros(0, 2, dtype=torch.int32), t=0))
case("moe/edge-same-expert-twice", OK, _moe_ok(torch.ones(8, 2, dtype=torch.int32)))
case("moe/bad-expert-id", err(ValueError, "topk_ids"),
     lambda: _moe_layer()(*_moe_inputs(ids=torch.full((8, 2), E, dtype=torch.int32))))
case("moe/bad-topk-float", err(TypeError, "topk_ids"),
     lambda: _moe_layer()(*_moe_inputs(ids=torch.zeros(8, 2))))
case("moe/bad-weights-shape", err(ValueError, "topk_weights"),
     lambda: _moe_layer()(_moe_inputs()[0], _moe_inputs()[1], torch.ones(8, 3)))
case("moe/bad-hidden-width", err(ValueError, "hidden"),
     lambda: _moe_layer()(torch.zeros(8, 64, dtype=BF16), _moe_inputs()[1], _moe_inputs()[2]))
case("moe/bad-hidden-size-16", err(ValueError, "hidden_size"), lambda: dfg.moe.FP8MoE(2, 100, 128))
case("moe/bad-masked-counts-named", err(ValueError, "counts[0] must be in [0, m_max=4], got 5"),
     lambda: dfg.moe.fp8_moe_forward_masked(torch.zeros(E, 4, H, dtype=BF16), torch.tensor([5, 0, 0, 0], dtype=torch.int32),
                                            _moe_layer().w13, _moe_layer().w13_scale, _moe_layer().w2,
                                            _moe_layer().w2_scale))


def _moe_after_cast():
    layer = _moe_layer()
    hidden, topk, w = _moe_inputs()
    before = layer(hidden, topk, w)
    layer.to(BF16)
    expect(torch.equal(layer(hidden, topk, w), before), "FP8MoE after .to(bf16)")


case("moe/edge-FP8MoE-to-bf16", OK, _moe_after_cast)


# ---------------------------------------------------------------------------------------------- training
def _double_backward_linear():
    x = torch.randn(16, 128).to(BF16).requires_grad_()
    w = torch.randn(64, 128).requires_grad_()
    (g,) = torch.autograd.grad(dfg.autograd.fp8_linear(x, w).float().sum(), (x,), create_graph=True)
    g.float().sum().backward()


def _double_backward_moe():
    hidden = torch.randn(8, H).to(BF16).requires_grad_()
    w13, w2 = (torch.randn(E, 2 * I, H) / 12).requires_grad_(), (torch.randn(E, H, I) / 12).requires_grad_()
    out = dfg.autograd.fp8_moe(hidden, torch.randint(0, E, (8, 2), dtype=torch.int32), torch.rand(8, 2), w13, w2)
    (g,) = torch.autograd.grad(out.float().sum(), (hidden,), create_graph=True)
    g.float().sum().backward()


case("autograd/bad-double-backward-fp8_linear", err(RuntimeError, "fp8_linear: double backward"), _double_backward_linear)
case("autograd/bad-double-backward-fp8_moe", err(RuntimeError, "fp8_moe: double backward"), _double_backward_moe)
case("autograd/bad-weight-fp16", err(TypeError, "weight"),
     lambda: dfg.autograd.fp8_linear(torch.zeros(4, 128, dtype=BF16), torch.zeros(64, 128, dtype=torch.float16)))
case("autograd/bad-n-not-16", err(ValueError, "16"),
     lambda: dfg.autograd.fp8_linear(torch.zeros(4, 128, dtype=BF16), torch.zeros(40, 128)))


def _linear_grad_ok():
    torch.manual_seed(5)
    x = torch.randn(16, 128).to(BF16).requires_grad_()
    w = (torch.randn(64, 128) / 8).requires_grad_()
    dfg.autograd.fp8_linear(x, w).float().sum().backward()
    xr, wr = x.detach().float().requires_grad_(), w.detach().requires_grad_()
    (xr @ wr.t()).sum().backward()
    expect(dfg.calc_diff(x.grad.float(), xr.grad) < 1e-2 and dfg.calc_diff(w.grad, wr.grad) < 1e-2, "gradients")


case("autograd/edge-first-order-gradients", OK, _linear_grad_ok)


# ---------------------------------------------------------------------------------------------- layout helpers
case("layout/bad-negative-counts", err(ValueError, "non-negative"),
     lambda: dfg.layout.build_contiguous_layout(torch.tensor([3, -1])))
case("layout/bad-counts-2d", err(ValueError, "tokens_per_expert"),
     lambda: dfg.layout.build_contiguous_layout(torch.zeros(2, 2, dtype=torch.int64)))
case("layout/bad-counts-float", err(TypeError, "tokens_per_expert"),
     lambda: dfg.layout.build_contiguous_layout(torch.zeros(2)))
case("layout/bad-alignment-zero", err(ValueError, "alignment"),
     lambda: dfg.layout.build_contiguous_layout(torch.tensor([1]), 0))
case("layout/bad-max-m-sum-unaligned", err(ValueError, "max_m_sum"),
     lambda: dfg.layout.build_contiguous_layout(torch.tensor([1]), 128, max_m_sum=100))
case("layout/bad-route-ids", err(ValueError, "topk_ids"),
     lambda: dfg.layout.route_topk(torch.tensor([[0, 7]]), 4))


def _layout_ok():
    lay = dfg.layout.build_contiguous_layout(torch.tensor([2, 0, 5]), 4)
    expect(lay.m_indices.tolist() == [0, 0, -1, -1, 2, 2, 2, 2, 2, -1, -1, -1], "documented example")


case("layout/edge-documented-example", OK, _layout_ok)


# ---------------------------------------------------------------------------------------------- utilities, env
def _num_sms_zero():
    """0 means every SM of the device (132 without one), as the reference's set_num_sms (issue 35)."""
    dfg.utils.reset_num_sms()
    every = dfg.get_num_sms()
    try:
        dfg.set_num_sms(7)
        dfg.set_num_sms(0)
        expect(dfg.get_num_sms() == every, f"every SM ({every})")
    finally:
        dfg.utils.reset_num_sms()


case("utils/bad-tma-aligned-negative", err(ValueError, "x=-5"), lambda: dfg.get_tma_aligned_size(-5, 4))
case("utils/bad-tma-aligned-element-size", err(ValueError, "element_size"), lambda: dfg.get_tma_aligned_size(5, 3))
case("utils/bad-ceil-div-zero", err(ValueError, "divisor"), lambda: dfg.ceil_div(1, 0))
case("utils/bad-set-num-sms-negative", err(ValueError, "num_sms"), lambda: dfg.set_num_sms(-1))
case("utils/bad-set-num-sms-above-the-device", err(ValueError, "num_sms"), lambda: dfg.set_num_sms(100_000))
case("utils/edge-set-num-sms-zero-is-every-sm", OK, _num_sms_zero)
case("utils/bad-set-num-sms-float", err(TypeError, "num_sms"), lambda: dfg.set_num_sms(1.5))
case("utils/bad-calc-diff-shapes", err(ValueError, "same shape"), lambda: dfg.calc_diff(torch.zeros(2), torch.zeros(3)))
case("utils/bad-col-major-non-tensor", err(TypeError, "s must be"), lambda: dfg.get_col_major_tma_aligned_tensor([1]))
case("utils/bad-alignment-96", err(ValueError, "alignment"), lambda: dfg.set_mk_alignment_for_contiguous_layout(96))
case("utils/edge-calc-diff-zeros", OK, lambda: expect(dfg.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0, "0"))
case("utils/edge-tma-aligned", OK, lambda: expect(dfg.get_tma_aligned_size(5, 4) == 8, "8"))


def _env_case(name, value, fn):
    def run():
        with env(**{name: value}):
            fn()
    return run


_SMALL = lambda: dfg.gemm_fp8_fp8_bf16_nt(*(lambda t: (t[0:2], t[2:4], t[4]))(_dense(16, 64, 128)))  # noqa: E731
case("env/bad-DFG_SIMULATE-yes", err(ValueError, "DFG_SIMULATE must be 1"), _env_case("DFG_SIMULATE", "yes", _SMALL))
case("env/bad-DFG_SIMULATE-true", err(ValueError, "DFG_SIMULATE must be 1"), _env_case("DFG_SIMULATE", "true", _SMALL))
case("env/bad-DFG_SIM_NUM_SMS", err(ValueError, "DFG_SIM_NUM_SMS"),
     _env_case("DFG_SIM_NUM_SMS", "abc", lambda: dfg.env.sim_num_sms()))
case("env/bad-DFG_WATCHDOG_SECONDS", err(ValueError, "DFG_WATCHDOG_SECONDS"),
     _env_case("DFG_WATCHDOG_SECONDS", "-1", lambda: dfg.env.watchdog_ns()))
case("env/bad-DFG_CHECK_LAYOUTS", err(ValueError, "DFG_CHECK_LAYOUTS must be 1"),
     _env_case("DFG_CHECK_LAYOUTS", "2", lambda: dfg.env.check_layouts()))
case("env/bad-DFG_SIM_SEED", err(ValueError, "DFG_SIM_SEED"), _env_case("DFG_SIM_SEED", "x", lambda: dfg.env.sim_seed()))
case("env/edge-DFG_SIMULATE-0", OK, _env_case("DFG_SIMULATE", "0", _SMALL))
case("env/bad-DFG_SIM_RACES-off", err(ValueError, "DFG_SIM_RACES must be 1"),
     _env_case("DFG_SIM_RACES", "off", lambda: dfg.env.sim_races()))
case("env/edge-DFG_SIM_RACES-0", OK, _env_case("DFG_SIM_RACES", "0", lambda: expect(dfg.env.sim_races() == "off", "off")))


# ---------------------------------------------------------------------------------------------- distributed, CLI
case("distributed/bad-not-initialised", err(RuntimeError, "init_process_group"),
     lambda: dfg.distributed.ep_moe_forward(*_moe_inputs(), _moe_layer().w13, _moe_layer().w13_scale,
                                            _moe_layer().w2, _moe_layer().w2_scale))
case("distributed/bad-buffers-not-initialised", err(RuntimeError, "init_process_group"),
     lambda: dfg.distributed.EPDecodeBuffers.allocate(4, H, 2, 2))


def _cli(*argv, code: int, text: str):
    def run():
        from deep_fp8_gemm import cli

        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = cli.main(list(argv))
            except SystemExit as exc:  # argparse's own usage errors
                status = exc.code
            except Exception as exc:  # a traceback is not a usage error: counted as misleading
                raise RuntimeError(f"the CLI ended in a traceback: {type(exc).__name__}: {exc}") from exc
        if status != code:
            raise Wrong(f"exit status {status}, expected {code}")
        if text not in stderr.getvalue():
            raise ValueError(f"stderr does not say {text!r}: {stderr.getvalue()[-300:]}")
        raise ValueError(f"{text} (exit {code})")  # a clear usage error: counted as the documented ValueError
    return run


case("cli/bad-audit-shape-k", err(ValueError, "k % 16 == 0"),
     _cli("audit", "--kind", "dense", "--shapes", "512,1000", code=2, text="k % 16 == 0"))
case("cli/bad-audit-quant-shapes", err(ValueError, "do not apply to --kind quant"),
     _cli("audit", "--kind", "quant", "--m", "64", code=2, text="do not apply to --kind quant"))
case("cli/bad-num-sms", err(ValueError, "--num-sms must be positive"),
     _cli("precompile", "--num-sms", "0", code=2, text="--num-sms must be positive"))
case("cli/bad-shape-text", err(ValueError, "shape must be N,K"),
     _cli("audit", "--shapes", "7168", code=2, text="shape must be N,K"))
case("cli/bad-kind", err(ValueError, "invalid choice"), _cli("audit", "--kind", "sparse", code=2, text="invalid choice"))


# ---------------------------------------------------------------------------------------------- gloo worlds
WORLD_CASES = ("ep/bad-e-local-2-vs-3", "ep/bad-one-rank-argument", "ep/bad-decode-overflow", "ep/bad-top-k-differs",
               "ep/bad-buffers-disagree", "ep/bad-layer-sizes-disagree")


def world_worker(rank: int, world: int, only: str | None = None) -> dict:
    """Each world case (or ``only`` that one) on every rank: ``(exception type, message)`` or ``None`` (returned
    normally)."""
    from deep_fp8_gemm.distributed import EPDecodeBuffers, EPMoE, ep_moe_forward
    from deep_fp8_gemm.moe import FP8MoE

    g = torch.Generator().manual_seed(1)
    w13, w2 = torch.randn(2 * world, 2 * I, H, generator=g) / 12, torch.randn(2 * world, H, I, generator=g) / 12
    layer = EPMoE.from_experts(w13, w2)
    e = layer.experts
    hidden = torch.randn(4, H, generator=g).to(BF16)
    ids = torch.randint(0, 2 * world, (4, 2), generator=g, dtype=torch.int32)
    weights = torch.rand(4, 2, generator=g)
    results = {}

    def run(cid, fn):
        if only is not None and cid != only:
            return
        try:
            fn()
            results[cid] = None
        except Exception as exc:  # noqa: BLE001 - classified by the parent
            results[cid] = (type(exc).__name__, str(exc))

    wrong = FP8MoE.from_weights(w13[:3], w2[:3])
    run("ep/bad-e-local-2-vs-3", lambda: ep_moe_forward(hidden, ids, weights, *((wrong.w13, wrong.w13_scale, wrong.w2,
                                                        wrong.w2_scale) if rank == 0 else (e.w13, e.w13_scale, e.w2,
                                                                                          e.w2_scale))))
    run("ep/bad-one-rank-argument", lambda: layer(hidden.float() if rank == 1 else hidden, ids, weights))
    small = layer.decode_buffers(4, 2)
    run("ep/bad-decode-overflow", lambda: layer.forward_decode(hidden, torch.zeros(4, 2, dtype=torch.int32), weights,
                                                               small, expected_m=4))
    run("ep/bad-top-k-differs", lambda: layer(hidden, ids[:, :1 + (rank == 0)], weights[:, :1 + (rank == 0)]))
    run("ep/bad-buffers-disagree", lambda: EPDecodeBuffers.allocate(4 + rank, H, 2, 2))
    run("ep/bad-layer-sizes-disagree", lambda: EPMoE(2 * world * (1 + rank), H, I))
    return results


def run_world_cases() -> list[dict]:
    """The world cases in one gloo world of 2: each is ``clear`` when every rank raised (none returned, none hung)."""
    from tests._dist import WorldError, WorldTimeout, run_world

    try:
        per_rank = run_world(2, world_worker, timeout=180)
    except (WorldError, WorldTimeout):  # one case took the world down: run each in a world of its own to tell
        per_rank = [{}, {}]
        for cid in WORLD_CASES:
            try:
                for mine, theirs in zip(per_rank, run_world(2, world_worker, cid, timeout=120)):
                    mine.update(theirs)
            except (WorldError, WorldTimeout) as exc:
                for mine in per_rank:
                    mine[cid] = ("crash", str(exc)[-400:])
    records = []
    for cid in WORLD_CASES:
        got = [r[cid] for r in per_rank]
        if any(x is not None and x[0] == "crash" for x in got):
            records.append(dict(id=cid, outcome="crash", detail=got[0][1]))
            continue
        lost = [i for i, x in enumerate(got) if x is not None and any(
            word in x[1] for word in ("Connection closed", "Connection reset", "timed out", "Timed out"))]
        if any(x is None for x in got):
            outcome, detail = "silent_wrong", f"returned on ranks {[i for i, x in enumerate(got) if x is None]}"
        elif lost:  # the rank waited in a collective its peer never joined (its error is its peer's exit)
            outcome, detail = "misleading", f"ranks {lost} lost their peer in a collective: {got[lost[0]][1][:200]}"
        else:
            outcome, detail = "clear", "; ".join(f"rank {i}: {t}: {m[:160]}" for i, (t, m) in enumerate(got))
        records.append(dict(id=cid, outcome=outcome, detail=detail))
    return records


# ---------------------------------------------------------------------------------------------- runner
def run_case(c: Case) -> dict:
    start = time.perf_counter()
    try:
        c.fn()
    except Wrong as exc:
        outcome, detail = "silent_wrong", str(exc)
    except Exception as exc:  # noqa: BLE001 - every exception is classified
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(c.expected, Err) and isinstance(exc, c.expected.types) and c.expected.text in str(exc):
            outcome = "clear"
        elif isinstance(c.expected, Err):
            outcome = "misleading"
        else:
            outcome = "refused"
        detail = message[:400]
    else:
        outcome, detail = ("handled", "") if c.expected == OK else ("silent_wrong", "accepted a bad input")
    return dict(id=c.id, outcome=outcome, detail=detail, seconds=round(time.perf_counter() - start, 3))


def summary(records: list[dict]) -> dict:
    counts = {k: 0 for k in ("clear", "handled", "misleading", "refused", "silent_wrong", "crash")}
    for r in records:
        counts[r["outcome"]] += 1
    return dict(cases=len(records), **counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the records ('-': stdout)")
    parser.add_argument("--start", type=int, default=0, help="first case index (test_adversarial resumes a crash)")
    parser.add_argument("--progress", metavar="PATH", help="append each record as a JSON line to PATH")
    parser.add_argument("--no-world", action="store_true", help="skip the gloo-world cases")
    args = parser.parse_args(argv)
    records = []
    for c in CASES[args.start:]:
        if args.progress:  # the case about to run: a crash leaves this line without its record
            with open(args.progress, "a") as f:
                f.write(json.dumps({"running": c.id}) + "\n")
        record = run_case(c)
        records.append(record)
        if args.progress:
            with open(args.progress, "a") as f:
                f.write(json.dumps(record) + "\n")
    if not args.no_world and args.start == 0:
        world = run_world_cases()
        records += world
        if args.progress:
            with open(args.progress, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in world)
    figures = summary(records)
    if args.json == "-":
        json.dump(dict(summary=figures, records=records), sys.stdout, indent=1)
    else:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(summary=figures, records=records), f, indent=1)
        for r in records:
            if r["outcome"] not in ("clear", "handled"):
                print(f"{r['outcome']:>13}  {r['id']}: {r['detail']}")
        print(" ".join(f"{k}={v}" for k, v in figures.items()))
    bad = figures["misleading"] + figures["refused"] + figures["silent_wrong"] + figures["crash"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
