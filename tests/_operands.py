"""Builders of valid GEMM operands (CPU) and a float64 model of the dequantised GEMM, for the tests.

The float64 model is written independently of :mod:`deep_fp8_gemm.reference`: numpy, explicit ``np.repeat``
of the scales, one ``einsum``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

import deep_fp8_gemm as dfg


def quantised_activations(shape: tuple[int, ...], seed: int, gran_k: int = 128, use_ue8m0: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[..., m, k]`` e4m3 with sA ``[..., m, ceil(k/gran_k)]`` fp32 (random values, row-major scales)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32) * torch.rand(shape[:-1] + (1,), generator=g).add(0.1)
    k = shape[-1]
    a, sa = dfg.per_token_cast_to_fp8(x.reshape(-1, k), use_ue8m0, gran_k=gran_k)
    return a.view(shape), sa.contiguous().view(shape[:-1] + (sa.size(-1),))


def quantised_weights(shape: tuple[int, ...], seed: int, gran_k: int = 128, use_ue8m0: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """B ``[..., n, k]`` e4m3 with sB ``[..., ceil(n/gran_k), ceil(k/gran_k)]`` fp32."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g, dtype=torch.float32)
    flat = w.reshape(-1, shape[-2], shape[-1])
    pairs = [dfg.per_block_cast_to_fp8(flat[i], use_ue8m0, gran_k=gran_k) for i in range(flat.size(0))]
    b = torch.stack([p[0] for p in pairs]).view(shape)
    sb = torch.stack([p[1] for p in pairs])
    return b, sb.view(shape[:-2] + sb.shape[-2:])


def dequant64(x: torch.Tensor, s: torch.Tensor, rows_per_scale: int, cols_per_scale: int = 128) -> np.ndarray:
    """float64 ``x · s`` with one scale per ``rows_per_scale`` rows and per ``cols_per_scale`` columns (last two
    dims)."""
    xv = x.float().double().numpy()
    sv = s.double().numpy()
    rows, cols = xv.shape[-2:]
    sv = np.repeat(np.repeat(sv, rows_per_scale, axis=-2)[..., :rows, :], cols_per_scale, axis=-1)[..., :cols]
    return xv * sv


class Gemm64(NamedTuple):
    """float64 GEMM result and ``accumulation_bound``, the worst-case float32 error of dequantising and
    summing its ``k`` products: ``(k + 2) · 2**-24 · Σ|products|`` per element."""

    value: np.ndarray
    accumulation_bound: np.ndarray


def gemm64(a, sa, b, sb, gran: int = 128) -> Gemm64:
    """float64 ``dequant(A) · dequant(B)ᵀ`` for A ``[m, k]`` and B ``[n, k]`` (``gran``: 128 for 1x128 / 128x128
    scales, 32 for 1x32 / 32x32)."""
    da, db = dequant64(a, sa, 1, gran), dequant64(b, sb, gran, gran)
    bound = (da.shape[-1] + 2) * 2.0**-24 * np.einsum("mk,nk->mn", np.abs(da), np.abs(db))
    return Gemm64(np.einsum("mk,nk->mn", da, db), bound)


def assert_within_one_bf16_ulp(out: torch.Tensor, expected: Gemm64) -> None:
    """``out`` (bf16) is within one bf16 ulp of ``expected`` (float64), elementwise, plus the float32
    accumulation allowance (which matters only where the sum cancels to far below its terms)."""
    got = out.double().numpy()
    magnitude = np.maximum(np.abs(expected.value), 2.0**-126)
    ulp = 2.0 ** (np.floor(np.log2(magnitude)) - 7)  # bf16: 8 significant bits
    err = np.abs(got - expected.value)
    bad = err > ulp + expected.accumulation_bound
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.size} elements off by more than one bf16 ulp; "
        f"worst {float((err / ulp).max()):.2f} ulp"
    )


def gemm_operands(m_shape: tuple[int, ...], n: int, k: int, groups: int | None = None, seed: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 1D2D GEMMs' operands: A ``[*m_shape, k]`` with 1x128 scales (:func:`quantised_activations`), B ``[n, k]``
    (``groups``: ``[G, n, k]``) with 128x128 block scales (:func:`quantised_weights`)."""
    a, sa = quantised_activations((*m_shape, k), seed)
    b, sb = quantised_weights(((groups,) if groups else ()) + (n, k), seed + 1)
    return a, sa, b, sb


def wgrad_operands(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The 1D1D (weight-gradient) GEMM's operands: A ``[m, k]`` and B ``[n, k]`` with 1x128 per-row scales, and a C
    ``[m, n]`` fp32 to accumulate into."""
    a, sa = quantised_activations((m, k), seed)
    b, sb = quantised_activations((n, k), seed + 1)
    c = torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 2)) * 4
    return a, sa, b, sb, c


def gemm64_batched(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """float64 ``dequant(A) · dequant(B)ᵀ`` (torch) for A ``[..., m, k]`` with 1x128 scales and B ``[..., n, k]`` with
    128x128 block scales, batched over the leading dims."""
    k = a.shape[-1]
    a64 = a.double() * sa.double().repeat_interleave(128, -1)[..., :k]
    b64 = b.double() * sb.double().repeat_interleave(128, -2)[..., :b.shape[-2], :].repeat_interleave(128, -1)[..., :k]
    return a64 @ b64.transpose(-1, -2)
