"""Reference GEMMs (and the public ops' CPU path) against a float64 einsum of the dequantised operands."""

from __future__ import annotations

import pytest
import torch
from tests._hypothesis import given, settings, st  # stand-ins (skips) without hypothesis

import deep_fp8_gemm as dfg
from deep_fp8_gemm import reference
from tests._operands import assert_within_one_bf16_ulp, gemm64, quantised_activations, quantised_weights

SENTINEL = 1234.0  # bf16-exact; rows an op must leave alone keep it


@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (64, 128, 128), (100, 200, 300), (129, 264, 1024)])
def test_dense(m, n, k):
    a, sa = quantised_activations((m, k), seed=m)
    b, sb = quantised_weights((n, k), seed=n)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    assert_within_one_bf16_ulp(out, gemm64(a, sa, b, sb))
    if n % 8 == 0 and k % 16 == 0:  # the public op runs the same math on CPU, bit for bit
        out_op = torch.empty_like(out)
        dfg.gemm_fp8_fp8_bf16_nt((a, sa.t().contiguous().t()), (b, sb), out_op)
        assert torch.equal(out_op, out)


def test_dense_accepts_any_strides():
    a, sa = quantised_activations((48, 256), seed=1)
    b, sb = quantised_weights((32, 256), seed=2)
    out = torch.empty(32, 48, dtype=torch.bfloat16).t()
    reference.gemm_fp8_fp8_bf16_nt((a, dfg.get_col_major_tma_aligned_tensor(sa)), (b, sb), out)
    assert_within_one_bf16_ulp(out, gemm64(a, sa, b, sb))


def _contiguous_layout(counts: list[int], alignment: int = 128) -> torch.Tensor:
    """m_indices for experts with ``counts`` rows each, every segment padded with -1 to ``alignment``."""
    parts = []
    for expert, count in enumerate(counts):
        padded = -(-count // alignment) * alignment
        parts.append(torch.full((padded,), -1, dtype=torch.int32))
        parts[-1][:count] = expert
    return torch.cat(parts)


def test_grouped_contiguous_with_empty_experts_and_padding():
    counts = [100, 0, 200, 128, 0]
    m_indices = _contiguous_layout(counts)
    m_sum, n, k = m_indices.numel(), 136, 384
    a, sa = quantised_activations((m_sum, k), seed=3)
    b, sb = quantised_weights((len(counts), n, k), seed=4)
    out = torch.full((m_sum, n), SENTINEL, dtype=torch.bfloat16)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    for expert in range(len(counts)):  # float64 model of each expert's rows, selected independently
        rows = (m_indices == expert).nonzero().flatten()
        assert rows.numel() == counts[expert]
        if rows.numel():
            assert_within_one_bf16_ulp(out[rows], gemm64(a[rows], sa[rows], b[expert], sb[expert]))
    # Padding rows (the tail of each 128-row block, BLOCK_M = the alignment) are computed with their block's
    # expert, as the kernels compute them (issue 23): each segment's tail here shares a block with its rows.
    for expert, count in enumerate(counts):
        start = sum(-(-c // 128) * 128 for c in counts[:expert])
        tail = torch.arange(start + count, start + -(-count // 128) * 128)
        if tail.numel():
            assert_within_one_bf16_ulp(out[tail], gemm64(a[tail], sa[tail], b[expert], sb[expert]))
    out_op = torch.full_like(out, SENTINEL)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out_op, m_indices)
    valid = m_indices >= 0
    assert torch.equal(out_op[valid], out[valid])


def test_grouped_contiguous_unsorted_rows():
    m_indices = torch.tensor([2, 0, -1, 1, 0, 2, -1, 1] * 16, dtype=torch.int32)  # any order is defined
    a, sa = quantised_activations((128, 128), seed=5)
    b, sb = quantised_weights((3, 64, 128), seed=6)
    out = torch.full((128, 64), SENTINEL, dtype=torch.bfloat16)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    for expert in range(3):
        rows = (m_indices == expert).nonzero().flatten()
        assert_within_one_bf16_ulp(out[rows], gemm64(a[rows], sa[rows], b[expert], sb[expert]))
    # The padding rows take the block's expert by the kernels' rule, max(first row's, last row's) = max(2, 1).
    pad = (m_indices < 0).nonzero().flatten()
    assert_within_one_bf16_ulp(out[pad], gemm64(a[pad], sa[pad], b[2], sb[2]))


def test_grouped_masked_with_empty_and_full_groups():
    num_groups, m_max, n, k = 4, 64, 96, 256
    masked_m = torch.tensor([0, 64, 17, 1], dtype=torch.int32)
    a, sa = quantised_activations((num_groups, m_max, k), seed=7)
    b, sb = quantised_weights((num_groups, n, k), seed=8)
    out = torch.full((num_groups, m_max, n), SENTINEL, dtype=torch.bfloat16)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, expected_m=32)
    for g in range(num_groups):
        valid = int(masked_m[g])
        assert_within_one_bf16_ulp(out[g, :valid], gemm64(a[g, :valid], sa[g, :valid], b[g], sb[g]))
        assert (out[g, valid:] == SENTINEL).all(), f"group {g}: rows >= masked_m were written"
    out_op = torch.full_like(out, SENTINEL)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out_op, masked_m, 32)
    for g in range(num_groups):
        assert torch.equal(out_op[g, : int(masked_m[g])], out[g, : int(masked_m[g])])


def test_reference_rejects_out_of_range_indices_and_counts():
    a, sa = quantised_activations((128, 128), seed=9)
    b, sb = quantised_weights((2, 64, 128), seed=10)
    out = torch.empty(128, 64, dtype=torch.bfloat16)
    for bad in (2, -2):
        m_indices = torch.zeros(128, dtype=torch.int32)
        m_indices[5] = bad
        with pytest.raises(ValueError, match="m_indices"):
            reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    a3, sa3 = a.view(2, 64, 128), sa.view(2, 64, 1)
    out3 = out.view(2, 64, 64)
    for bad in (65, -1):
        with pytest.raises(ValueError, match="masked_m"):
            reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked(
                (a3, sa3), (b, sb), out3, torch.tensor([1, bad], dtype=torch.int32), 1
            )


def test_m_zero_is_a_no_op():
    b, sb = quantised_weights((2, 64, 128), seed=11)
    a = torch.empty(0, 128, dtype=torch.float8_e4m3fn)
    sa = torch.empty(0, 1)
    out = torch.empty(0, 64, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b[0], sb[0]), out)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, torch.empty(0, dtype=torch.int32))
    a3 = torch.empty(2, 0, 128, dtype=torch.float8_e4m3fn)
    out3 = torch.empty(2, 0, 64, dtype=torch.bfloat16)
    masked_m = torch.zeros(2, dtype=torch.int32)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, torch.empty(2, 0, 1)), (b, sb), out3, masked_m, 1)


@settings(deadline=None, max_examples=30)
@given(
    m=st.integers(1, 70),
    n8=st.integers(1, 20),
    k16=st.integers(1, 20),
    num_groups=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_property_dense_and_masked_shapes(m, n8, k16, num_groups, seed):
    n, k = 8 * n8, 16 * k16
    a, sa = quantised_activations((num_groups, m, k), seed=seed)
    b, sb = quantised_weights((num_groups, n, k), seed=seed + 1)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a[0], sa[0]), (b[0], sb[0]), out)
    assert_within_one_bf16_ulp(out, gemm64(a[0], sa[0], b[0], sb[0]))
    masked_m = torch.randint(0, m + 1, (num_groups,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    out3 = torch.empty(num_groups, m, n, dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out3, masked_m, m)
    for g in range(num_groups):
        valid = int(masked_m[g])
        assert_within_one_bf16_ulp(out3[g, :valid], gemm64(a[g, :valid], sa[g, :valid], b[g], sb[g]))
