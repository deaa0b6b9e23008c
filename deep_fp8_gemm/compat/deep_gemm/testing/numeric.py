"""Comparison helpers with the reference's contracts."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor):
    """``1 - 2·Σxy / Σ(x² + y²)`` in float64, as the reference: a 0-dim float64 tensor, or ``0.0`` when both
    tensors are all zero (< 1e-3 is the usual bar of an FP8 GEMM against a bf16 reference)."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return 1 - 2 * (x * y).sum() / denominator


def count_bytes(*tensors) -> int:
    """Bytes of the given tensors (nested tuples / lists allowed, ``None`` skipped)."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """``AssertionError`` naming the first differing byte, element and coordinate unless ``x`` and ``y`` have the
    same shape, dtype and bytes."""
    assert x.shape == y.shape, f"shapes differ{f' ({label})' if label else ''}: {tuple(x.shape)} vs {tuple(y.shape)}"
    assert x.dtype == y.dtype, f"dtypes differ{f' ({label})' if label else ''}: {x.dtype} vs {y.dtype}"
    xb, yb = x.contiguous().view(torch.uint8).flatten(), y.contiguous().view(torch.uint8).flatten()
    if torch.equal(xb, yb):
        return
    mismatch = xb != yb
    first = int(mismatch.nonzero()[0].item())
    element = first // x.element_size()
    coord = tuple(int(v) for v in torch.unravel_index(torch.tensor(element), x.shape))
    raise AssertionError(
        f"bitwise mismatch{f' ({label})' if label else ''}: num_bytes={mismatch.numel()}, "
        f"num_mismatch={int(mismatch.sum())}, first_byte={first}, elem={element}, coord={coord}, "
        f"byte_in_elem={first % x.element_size()}, x_byte={int(xb[first])}, y_byte={int(yb[first])}, "
        f"x_val={x.flatten()[element].item()}, y_val={y.flatten()[element].item()}")


__all__ = ["assert_bitwise_equal", "calc_diff", "count_bytes"]
