"""The math the exact references are built from (plain torch, any device): batch-invariant by construction.

The 1D2D kinds (:func:`gemm_nt_promoted`) follow the kernels' structure in a fixed order of their own, for every
output element ``(r, c)``::

    p_j = Σ_{k in K group j} A[r, k] · B[c, k]             in float64: exact (see below), rounded once to fp32
    acc = fp32(acc + p_j · fp32(sA[r, j] · sB[c // 128, j]))   for j = 0, 1, ... in order, from acc = 0

(K groups of 128, or of 32 with 32-row sB blocks for the 1x32/32x32 recipe, whose kernel promotes every 32 K.)

The e4m3 products are multiples of 2^-18 below 2^18, so the 128 of a K block sum exactly in float64 in any order:
the partial does not depend on how a BLAS blocks the matmul, hence not on M, on the other rows or on the
device. The promotion is elementwise, in K-block order (the product of two fp32 is exact in float64, the sum
rounded once to float64, then to fp32). So output row r depends only on row r of A and its scales and on B (a
group's B), never on the batch: the CPU path is batch-invariant by construction, though not bit-equal to the tensor
cores, whose K-block partial keeps ~13-14 bits (ANCHORS.md section 8). Within one bf16 ulp of float64. The output
policies finish from ``acc``: rounded to bf16, or quantised per row and 128 columns (``ops.outputs``).

The fp32-accumulating kinds (1D1D, k-grouped; :func:`gemm_nt_row_scaled_f64`) keep float64 to the end: the same
exact block partials, promoted in float64 with the per-row scales, C added, rounded once to float32, so the
kernels' fp32 accumulation differs from them by fp32 rounding only; elementwise in a fixed order, so invariant too.
"""

from __future__ import annotations

import torch

from ..constants import GRAN_K, GRAN_MN_BLOCK
from ..utils import ceil_div
from .checks import BLOCK128, Granularity


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


def block_partials(a_fp8: torch.Tensor, b_fp8: torch.Tensor, gran_k: int = GRAN_K):
    """``(j, P_j)`` for every K group j of ``gran_k`` elements: ``P_j [r, n] = A[:, group j] · B[:, group j]ᵀ`` of the
    e4m3 values in float64, exact whatever the summation order (module docstring). A ``[r, k]``, B ``[n, k]`` e4m3."""
    a64, b64 = a_fp8.to(torch.float64), b_fp8.to(torch.float64)
    for j in range(ceil_div(a_fp8.shape[-1], gran_k)):
        block = slice(j * gran_k, (j + 1) * gran_k)
        yield j, a64[:, block] @ b64[:, block].t()


def gemm_nt_promoted(a_fp8: torch.Tensor, sa: torch.Tensor, b_fp8: torch.Tensor, sb: torch.Tensor,
                     gran: Granularity = BLOCK128) -> torch.Tensor:
    """The 1D2D kinds' float32 result ``[r, n]`` (module docstring: exact partials of each K group rounded to fp32,
    promoted in K order): A ``[r, k]`` e4m3 with 1 x ``gran.k`` scales ``sa [r, ceil(k/gran.k)]``, B ``[n, k]`` e4m3
    with ``gran.n`` x ``gran.k`` block scales ``sb [ceil(n/gran.n), ceil(k/gran.k)]`` (DeepSeek-V3's 1x128 / 128x128,
    or the 1x32 / 32x32 recipe, promoted every 32 K as its kernel does: policy_block32.cuh)."""
    n = b_fp8.shape[0]
    sb_cols = sb.float().repeat_interleave(gran.n, 0)[:n]  # [n, kb]: each column's block scale
    acc = torch.zeros(a_fp8.shape[0], n, dtype=torch.float64, device=a_fp8.device)
    for j, partial in block_partials(a_fp8, b_fp8, gran.k):
        scale = sa[:, j: j + 1].float() * sb_cols[:, j][None, :]  # fp32 sA * sB, as the kernels form it
        acc = (acc + partial.float().double() * scale.double()).float().double()
    return acc.float()


def gemm_nt_row_scaled_f64(a_fp8: torch.Tensor, sa: torch.Tensor, b_fp8: torch.Tensor, sb: torch.Tensor
                           ) -> torch.Tensor:
    """The fp32-accumulating kinds' float64 ``A·Bᵀ`` ``[r, n]`` with 1x128 per-row scales on both operands (module
    docstring): exact block partials promoted with ``sA[r, j] · sB[c, j]`` in float64, in K-block order."""
    acc = torch.zeros(a_fp8.shape[0], b_fp8.shape[0], dtype=torch.float64, device=a_fp8.device)
    for j, partial in block_partials(a_fp8, b_fp8):
        acc += partial * (sa[:, j: j + 1].double() * sb[:, j].double()[None, :])
    return acc
