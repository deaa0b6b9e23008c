"""deep_gemm.utils.math: ``ceil_div``, ``align``, ``ceil_to_ue8m0`` and the FP8 casts with the reference's bits on
each device (:mod:`deep_fp8_gemm.deep_gemm_casts`). The FP4 casts and the packed-UE8M0 helpers (SM100 recipes)
are not provided."""

from __future__ import annotations

import torch

from deep_fp8_gemm.deep_gemm_casts import (
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp8,
)
from deep_fp8_gemm.quant import ceil_to_ue8m0 as _ceil_to_ue8m0


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for ints."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y``."""
    return ceil_div(x, y) * y


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(|x|))`` as float32, exactly (exponent field plus one when any mantissa bit is set, clamped to
    ``[1, 254]``): the reference's UE8M0 rounding."""
    return _ceil_to_ue8m0(x.abs().float())


__all__ = [
    "align",
    "ceil_div",
    "ceil_to_ue8m0",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp8",
]
