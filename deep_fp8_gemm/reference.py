"""Reference semantics of every public GEMM op: same names, same signatures, plain torch.

These define what the kernels compute and are what the ops run on CPU tensors (unless ``DFG_SIMULATE=1``).
For every output element::

    out[r, c] = bf16( Σ_k  (A[r, k] · sA[r, k // 128]) · (B[c, k] · sB[c // 128, k // 128]) )

i.e. both operands are dequantised to float32 (one rounding per product of value and scale), the products
are summed with float32 accumulation (summation order unspecified), and the sum is rounded once to bfloat16
(nearest even). Against a float64 evaluation the result is within one bf16 ulp.

They check types, dtypes, ranks, exact shapes and devices like the ops do, but accept any strides, any
``n`` / ``k`` / ``m_sum``, and they *do* read ``m_indices`` / ``masked_m`` on the host (the ops never do):
out-of-range indices or counts raise ``ValueError`` here. Importable on its own: it needs only torch.
"""

from __future__ import annotations

import torch

from .validation import check_contiguous, check_dense, check_masked, unpack_pair


def dequantize_per_token(x_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``x_fp8 · scales`` for ``x_fp8`` ``[..., m, k]`` e4m3 and ``scales`` ``[..., m, ceil(k/128)]``
    (one scale per row per 128 K-elements)."""
    k = x_fp8.size(-1)
    return x_fp8.float() * scales.float().repeat_interleave(128, dim=-1)[..., :k]


def dequantize_per_block(w_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``w_fp8 · scales`` for ``w_fp8`` ``[..., n, k]`` e4m3 and ``scales``
    ``[..., ceil(n/128), ceil(k/128)]`` (one scale per 128x128 block)."""
    n, k = w_fp8.shape[-2:]
    expanded = scales.float().repeat_interleave(128, dim=-2)[..., :n, :].repeat_interleave(128, dim=-1)[..., :k]
    return w_fp8.float() * expanded


def _matmul_nt_bf16(a_deq: torch.Tensor, b_fp8: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """bf16(a_deq @ dequant(B).T) with float32 accumulation; a_deq ``[r, k]`` fp32, B ``[n, k]``."""
    return (a_deq @ dequantize_per_block(b_fp8, sb).t()).to(torch.bfloat16)


def _dense(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, out: torch.Tensor) -> None:
    """:func:`gemm_fp8_fp8_bf16_nt` on validated tensors."""
    out.copy_(_matmul_nt_bf16(dequantize_per_token(a, sa), b, sb))


def _contiguous(a, sa, b, sb, out, m_indices) -> None:
    """:func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` on validated tensors: one matmul per expert."""
    num_groups = b.size(0)
    experts = m_indices.to(device=a.device, dtype=torch.long)
    if experts.numel() == 0:
        return
    lo, hi = int(experts.min()), int(experts.max())
    if lo < -1 or hi >= num_groups:
        raise ValueError(f"m_indices values must be in [-1, G), got min={lo} max={hi} with G={num_groups}")
    order = torch.argsort(experts, stable=True)  # padding rows (-1) first, then expert 0, 1, ...
    counts = torch.bincount(experts + 1, minlength=num_groups + 1).tolist()
    a_deq = dequantize_per_token(a, sa)
    start = counts[0]
    for g in range(num_groups):
        count = counts[g + 1]
        if count:
            rows = order[start : start + count]
            out[rows] = _matmul_nt_bf16(a_deq[rows], b[g], sb[g])
            start += count


def psum_group_rows(ends: list[int], alignment: int = 128) -> list[tuple[int, int]]:
    """``[(start, end)]`` of each group of the prefix-sum ("psum") contiguous layout: group g owns rows
    ``[start_g, end_g)`` with ``start_0 = 0``, ``start_g = round_up(ends[g-1], alignment)`` and
    ``end_g = max(ends[g], start_g)`` (an end at or before its start is an empty group)."""
    rows, previous = [], 0
    for g, end in enumerate(ends):
        start = 0 if g == 0 else (previous + alignment - 1) // alignment * alignment
        rows.append((start, max(end, start)))
        previous = end
    return rows


def check_psum_values(ends: list[int], m_sum: int, name: str = "grouped_layout") -> None:
    """Values of a psum layout: ``0 <= ends[0] <= ends[1] <= ... <= ends[G-1] <= m_sum`` (ValueError)."""
    previous = 0
    for g, end in enumerate(ends):
        if end < previous:
            what = "non-negative" if g == 0 else f"non-decreasing ({name}[{g - 1}]={previous})"
            raise ValueError(f"{name} (psum layout: end row of each group) must be {what}, got {name}[{g}]={end}")
        previous = end
    if ends and ends[-1] > m_sum:
        raise ValueError(f"{name}[{len(ends) - 1}]={ends[-1]} exceeds the rows of lhs[0] (A), m_sum={m_sum}")


def _contiguous_psum(a, sa, b, sb, out, ends) -> None:
    """:func:`deep_fp8_gemm.psum.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum` on validated tensors: one
    matmul per group's rows (see :func:`psum_group_rows`); padding rows are left untouched."""
    values = ends.tolist()
    check_psum_values(values, a.size(0))
    for g, (start, end) in enumerate(psum_group_rows(values)):
        if end > start:
            out[start:end] = _matmul_nt_bf16(dequantize_per_token(a[start:end], sa[start:end]), b[g], sb[g])


def _masked(a, sa, b, sb, out, masked_m) -> None:
    """:func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked` on validated tensors: one matmul per group."""
    m_max = a.size(1)
    counts = masked_m.tolist()
    for g, count in enumerate(counts):
        if not 0 <= count <= m_max:
            raise ValueError(f"masked_m[{g}] must be in [0, m_max={m_max}], got {count}")
        if count:
            out[g, :count] = _matmul_nt_bf16(dequantize_per_token(a[g, :count], sa[g, :count]), b[g], sb[g])


def gemm_fp8_fp8_bf16_nt(
    lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
) -> None:
    """Reference of :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt`: ``out = A·Bᵀ`` of the dequantised operands.

    Args:
        lhs: ``(A [m, k] float8_e4m3fn, sA [m, ceil(k/128)] float32)``.
        rhs: ``(B [n, k] float8_e4m3fn, sB [ceil(n/128), ceil(k/128)] float32)``.
        out: ``[m, n]`` bfloat16, written in place.
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check_dense(a, sa, b, sb, out, layout=False, pointers=False)
    _dense(a, sa, b, sb, out)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
    lhs: tuple[torch.Tensor, torch.Tensor],
    rhs: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    m_indices: torch.Tensor,
) -> None:
    """Reference of the contiguous grouped GEMM: ``out[r] = A[r]·B[m_indices[r]]ᵀ`` (dequantised).

    Args:
        lhs: ``(A [m_sum, k] float8_e4m3fn, sA [m_sum, ceil(k/128)] float32)``.
        rhs: ``(B [G, n, k] float8_e4m3fn, sB [G, ceil(n/128), ceil(k/128)] float32)``.
        out: ``[m_sum, n]`` bfloat16, written in place.
        m_indices: ``[m_sum]`` int32, values in ``[-1, G)``; rows with -1 are padding: their output is
            unspecified by the op (this reference leaves them untouched).
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check_contiguous(a, sa, b, sb, out, m_indices, layout=False, pointers=False)
    _contiguous(a, sa, b, sb, out, m_indices)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(
    lhs: tuple[torch.Tensor, torch.Tensor],
    rhs: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
) -> None:
    """Reference of the masked grouped GEMM: ``out[g, :masked_m[g]] = A[g, :masked_m[g]]·B[g]ᵀ`` (dequantised).

    Args:
        lhs: ``(A [G, m_max, k] float8_e4m3fn, sA [G, m_max, ceil(k/128)] float32)``.
        rhs: ``(B [G, n, k] float8_e4m3fn, sB [G, ceil(n/128), ceil(k/128)] float32)``.
        out: ``[G, m_max, n]`` bfloat16; rows ``>= masked_m[g]`` are unspecified by the op (this reference
            leaves them untouched).
        masked_m: ``[G]`` int32, values in ``[0, m_max]``.
        expected_m: positive int, a performance hint only (unused here).
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check_masked(a, sa, b, sb, out, masked_m, expected_m, layout=False, pointers=False)
    _masked(a, sa, b, sb, out, masked_m)


def gemm_fp8_fp8_fp32_nt_1d1d(lhs, rhs, d: torch.Tensor, c: torch.Tensor | None) -> None:
    """Reference of the 1D1D kernel (:func:`deep_fp8_gemm.wgrad.gemm_fp8_fp8_fp32_nt_1d1d`): ``d = c + A·Bᵀ``
    in float32 for A ``[m, k]`` / B ``[n, k]`` e4m3 with 1x128 scales sA ``[m, ceil(k/128)]`` / sB
    ``[n, ceil(k/128)]`` (both dequantised per row), ``d`` / ``c`` ``[m, n]`` float32; ``c`` may be ``d``
    (accumulate in place) or None (``d = A·Bᵀ``). Operands dequantised and multiplied in float64, summed in
    float64, added to ``c`` in float64, rounded once to float32 (the kernel's fp32 accumulation differs from it
    by fp32 rounding only)."""
    from .wgrad import check_1d1d

    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check_1d1d(a, sa, b, sb, d, c, layout=False)
    k = a.size(-1)
    a64 = a.double() * sa.double().repeat_interleave(128, dim=-1)[:, :k]
    b64 = b.double() * sb.double().repeat_interleave(128, dim=-1)[:, :k]
    prod = a64 @ b64.T
    if c is not None:
        prod += c.double()
    d.copy_(prod)


def k_grouped_gemm_fp8_fp8_fp32_nt(lhs, rhs, d: torch.Tensor, ks, ks_tensor: torch.Tensor | None = None,
                                   c: torch.Tensor | None = None) -> None:
    """Reference of the k-grouped weight-gradient GEMM (:func:`deep_fp8_gemm.wgrad.k_grouped_gemm_fp8_fp8_fp32_nt`):
    for each group g, ``d[g] = c[g] + A_g·B_gᵀ`` with A_g ``[m, K_g]`` at element ``m·sum(ks[:g])`` of the flat
    e4m3 ``a`` (row stride K_g), B_g ``[n, K_g]`` likewise in ``b``, their 1x128 scales the columns
    ``sum(ks[:g])/128 ..`` of sA ``[m, sum(ks)/128]`` / sB ``[n, sum(ks)/128]``; ``K_g = 0`` gives ``d[g] = c[g]``
    (0 when ``c`` is None); ``c`` may be ``d``. Dequantised, multiplied, summed and added to C in float64, rounded
    once to float32."""
    from .wgrad import check_k_grouped

    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    ks, m, n = check_k_grouped(a, sa, b, sb, d, ks, ks_tensor, c, layout=False)
    k_off = 0
    for g, k in enumerate(ks):
        acc = torch.zeros(m, n, dtype=torch.float64, device=d.device) if c is None else c[g].double()
        if k:
            blocks = slice(k_off // 128, (k_off + k) // 128)
            a64 = a[m * k_off: m * (k_off + k)].view(m, k).double() * sa[:, blocks].double().repeat_interleave(128, 1)
            b64 = b[n * k_off: n * (k_off + k)].view(n, k).double() * sb[:, blocks].double().repeat_interleave(128, 1)
            acc = acc + a64 @ b64.T
        d[g].copy_(acc)
        k_off += k
