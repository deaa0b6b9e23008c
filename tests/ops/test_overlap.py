"""Outputs that overlap themselves (issue 36, item 1): refused by every GEMM family, on every output, naming it, on
the CPU path and under DFG_SIMULATE=1; a legal non-contiguous output (a column slice of a wider buffer) is accepted
and computes what a contiguous one does; an output overlapping another argument is refused, ``c is d`` stays legal."""

from __future__ import annotations

import re

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import ops
from deep_fp8_gemm.config import KINDS
from tests._gemm_cases import column_slice_like, family_call, self_overlapping_like
from tests._operands import quantised_activations


@pytest.mark.parametrize("simulate", [False, True], ids=["cpu", "simulator"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_output_that_overlaps_itself_is_refused(kind, simulate, monkeypatch):
    if simulate:
        monkeypatch.setenv("DFG_SIMULATE", "1")
    launched = []
    monkeypatch.setattr(ops.FAMILIES[kind], "dispatch", lambda *a, **k: launched.append(a))
    call, outs, names = family_call(kind)
    for i, name in enumerate(names):
        bad = self_overlapping_like(outs[i])
        assert bad.shape == outs[i].shape
        rule = "must be contiguous" if kind == "k_grouped" else "overlaps itself"
        with pytest.raises(ValueError, match=re.escape(name) + f".*{rule}|{rule}.*{re.escape(name)}"):
            call(outs[:i] + (bad,) + outs[i + 1:])
    assert launched == []


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "k_grouped"])
def test_a_column_slice_of_a_wider_buffer_is_a_legal_output(kind):
    """The first output as a column slice (16 more bytes per row): accepted, and the same bits as a contiguous one;
    the columns past the slice untouched."""
    call, outs, names = family_call(kind)
    call(outs)
    sliced = column_slice_like(outs[0])
    call((sliced,) + outs[1:])
    assert torch.equal(sliced.view(torch.uint8) if sliced.dtype.itemsize == 1 else sliced,
                       outs[0].view(torch.uint8) if outs[0].dtype.itemsize == 1 else outs[0])
    assert not sliced._base[..., sliced.shape[-1]:].view(torch.uint8).any()


def test_the_issue_case_and_the_simulator_strided_output(monkeypatch):
    """The reported view (a 1088-element buffer as a 64 x 64 bf16 out with row stride 16) is refused naming ``out``;
    the dense kernel in the simulator writes a legal column slice exactly as the reference does."""
    a, sa = quantised_activations((64, 256), 1)
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(64, 256))
    out = torch.zeros(1088, dtype=torch.bfloat16).as_strided((64, 64), (16, 1))
    with pytest.raises(ValueError, match=r"^out overlaps itself"):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    expected = torch.empty(64, 64, dtype=torch.bfloat16)
    dfg.reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), expected)
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "2")
    wide = torch.full((64, 96), 7.0, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), wide[:, :64])
    assert dfg.calc_diff(wide[:, :64], expected) < 1e-5 and bool((wide[:, 64:] == 7).all())


def test_outputs_overlapping_other_arguments():
    """``c is d`` (same storage offset, sizes and strides: the in-place accumulate) is legal; a ``c`` that overlaps
    ``d`` otherwise, or an output over an input, is refused naming both."""
    a, sa = quantised_activations((64, 256), 2)
    b, sb = quantised_activations((64, 256), 3)
    d = torch.zeros(64, 64)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, d)
    buf = torch.zeros(64, 80)
    with pytest.raises(ValueError, match="d must not overlap c"):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), buf[:, :64], buf[:, 8:72])
    b2, sb2 = dfg.per_block_cast_to_fp8(torch.randn(64, 256))
    alias = a.view(-1)[: 64 * 64 * 2].view(torch.bfloat16).view(64, 64)  # out over A's bytes
    with pytest.raises(ValueError, match=r"out must not overlap lhs\[0\] \(A\)"):
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b2, sb2), alias)
