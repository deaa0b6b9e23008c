"""tf32_hc_prenorm_gemm's argument rules and float64 reference (deep_fp8_gemm._core.hc_prenorm_math; issue 41)."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm._core.hc_prenorm_math import check_hc_prenorm, hc_prenorm_reference, split_ranges, tf32_operand


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def _inputs(m=13, n=24, k=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g)


def test_split_ranges_partition_k_in_balanced_64_blocks():
    assert split_ranges(1024, 1) == [(0, 1024)]
    assert split_ranges(320, 3) == [(0, 128), (128, 256), (256, 320)]
    assert split_ranges(128, 4) == [(0, 64), (64, 128), (128, 128), (128, 128)]  # empty splits write zeros


@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_the_splits_sum_to_the_consumers_result(num_splits):
    """V4's call shape in miniature (n = 24, num_splits 16): d.sum(0) = a @ tf32(b).T, sqr_sum.sum(0) = (a²).sum(-1)."""
    m, n, k = 13, 24, 1024
    a, b = _inputs(m, n, k)
    lead = () if num_splits is None else (num_splits,)
    d, s = torch.empty(*lead, m, n), torch.empty(*lead, m)
    hc_prenorm_reference(a, b, d, s, num_splits)
    final_d, final_s = (d, s) if num_splits is None else (d.sum(0), s.sum(0))
    assert calc_diff(final_d, a.double() @ tf32_operand(b).double().T) <= 1e-10
    assert calc_diff(final_d, a.double() @ b.double().T) <= 1e-6  # tf32 vs fp32 b: the consumers' tolerance
    assert calc_diff(final_s, a.double().square().sum(-1)) <= 1e-12
    if num_splits == 16:  # 16 blocks of 64: one per split
        torch.testing.assert_close(d[3].double(), a.double()[:, 192:256] @ tf32_operand(b).double()[:, 192:256].T)


def test_tf32_operand_drops_the_low_13_bits():
    x = torch.tensor([1 + 2.0 ** -10 + 2.0 ** -11, float("inf"), -3.0])
    assert tf32_operand(x).tolist() == [1 + 2.0 ** -10, float("inf"), -3.0]


@pytest.mark.parametrize("change, error, message", [
    (dict(a=lambda a: a.float()), TypeError, r"a must be torch.bfloat16, got torch.float32"),
    (dict(b=lambda b: b.bfloat16()), TypeError, r"b must be torch.float32, got torch.bfloat16"),
    (dict(b=lambda b: b[:20], d=lambda d: d[:, :20].contiguous()), ValueError, r"n must be a multiple of 8 and at most 32 on SM90, got n=20"),
    (dict(b=lambda b: torch.cat([b, b]), d=lambda d: torch.empty(13, 48)), ValueError, r"at most 32 on SM90, got n=48"),
    (dict(a=lambda a: a[:, :1000], b=lambda b: b[:, :1000]), ValueError, r"k must be a multiple of 64, got k=1000"),
    (dict(d=lambda d: d[:, :8]), ValueError, r"shapes do not agree"),
    (dict(num_splits=0), ValueError, r"num_splits must be None or an int >= 1, got 0"),
    (dict(num_splits=2), ValueError, r"d \(13, 24\) \(expected \(2, 13, 24\)\)"),
    (dict(a=lambda a: a.T.contiguous().T), ValueError, r"a must be K-major"),
    (dict(sqr_sum=lambda s: torch.empty(26)[::2]), ValueError, r"sqr_sum must be contiguous"),
    (dict(d=lambda d: [1]), TypeError, r"d must be a torch.Tensor, got list"),
])
def test_bad_arguments_are_named(change, error, message):
    a, b = _inputs()
    args = dict(a=a, b=b, d=torch.empty(13, 24), sqr_sum=torch.empty(13))
    for key in ("a", "b", "d", "sqr_sum"):
        if key in change:
            args[key] = change[key](args[key])
    with pytest.raises(error, match=message):
        check_hc_prenorm(args["a"], args["b"], args["d"], args["sqr_sum"], change.get("num_splits"))
