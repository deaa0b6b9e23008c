"""The math the exact references are built from (plain torch, any device).

What the bf16-output kinds compute, for every output element::

    out[r, c] = bf16( Σ_k  (A[r, k] · sA[r, k // 128]) · (B[c, k] · sB[c // 128, k // 128]) )

both operands dequantised to float32 (one rounding per product of value and scale), the products summed with
float32 accumulation (summation order unspecified), the sum rounded once to bfloat16 (nearest even); against a
float64 evaluation that is within one bf16 ulp. The FP8-output kinds quantise the same float32 sums (not rounded to
bf16) with the per-token quantiser's rules (``ops.fp8_output``). The fp32-accumulating kinds (1D1D, k-grouped) are evaluated in
float64 (dequantise, multiply, sum, add C) and rounded once to float32, so the kernels' fp32 accumulation
differs from them by fp32 rounding only.
"""

from __future__ import annotations

import torch

from ..constants import GRAN_K, GRAN_MN_BLOCK


def dequantize_per_token(x_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``x_fp8 · scales`` for ``x_fp8`` ``[..., m, k]`` e4m3 and ``scales`` ``[..., m, ceil(k/128)]``
    (one scale per row per 128 K-elements)."""
    k = x_fp8.size(-1)
    return x_fp8.float() * scales.float().repeat_interleave(GRAN_K, dim=-1)[..., :k]


def dequantize_per_block(w_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``w_fp8 · scales`` for ``w_fp8`` ``[..., n, k]`` e4m3 and ``scales``
    ``[..., ceil(n/128), ceil(k/128)]`` (one scale per 128x128 block)."""
    n, k = w_fp8.shape[-2:]
    expanded = scales.float().repeat_interleave(GRAN_MN_BLOCK, dim=-2)[..., :n, :]
    return w_fp8.float() * expanded.repeat_interleave(GRAN_K, dim=-1)[..., :k]


def dequantize_per_row_f64(x_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 ``x_fp8 · scales`` for ``x_fp8`` ``[m, k]`` e4m3 and 1x128 per-row ``scales`` ``[m, ceil(k/128)]``
    (both operands of the fp32-accumulating kinds)."""
    k = x_fp8.size(-1)
    return x_fp8.double() * scales.double().repeat_interleave(GRAN_K, dim=-1)[:, :k]


def matmul_nt_f32(a_deq: torch.Tensor, b_fp8: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """``a_deq @ dequant(B)ᵀ`` in float32 (float32 accumulation, not rounded further): what the FP8-output kinds
    quantise; ``a_deq`` ``[r, k]`` float32, B ``[n, k]`` e4m3 with 128x128 block scales ``sb``."""
    return a_deq @ dequantize_per_block(b_fp8, sb).t()


def matmul_nt_bf16(a_deq: torch.Tensor, b_fp8: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """``bf16(a_deq @ dequant(B)ᵀ)`` with float32 accumulation; ``a_deq`` ``[r, k]`` float32, B ``[n, k]`` e4m3 with
    128x128 block scales ``sb``."""
    return matmul_nt_f32(a_deq, b_fp8, sb).to(torch.bfloat16)
