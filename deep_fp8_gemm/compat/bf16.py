"""The reference design's BF16 / TF32 names (DeepGEMM 2.6.1: ``csrc/apis/gemm.hpp``, ``einsum.hpp``,
``hyperconnection.hpp`` ``register_apis``), with their arguments, defaults and positional order, on this library's
kernels (:mod:`deep_fp8_gemm.ops.bf16`, :mod:`~deep_fp8_gemm.ops.einsum`, :mod:`~deep_fp8_gemm.ops.hc_prenorm`):

* ``bf16_gemm_{nt,nn}(a, b, d, c=None, compiled_dims="nk")``, ``bf16_gemm_{tn,tt}(..., compiled_dims="mn")``;
* ``m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False,
  ensure_zero_padding=True, expected_m_for_psum_layout=None)`` and ``m_grouped_bf16_gemm_nn_contiguous`` (the same
  without ``expected_m_for_psum_layout``); ``m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m,
  compiled_dims="nk")``;
* ``einsum(expr, a, b, d, c=None, use_cublaslt=False)``, ``fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128))``;
* ``tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)``.

``compiled_dims`` is validated (distinct letters of ``"mnk"``) and otherwise a hint: this library compiles N and K
in. ``ensure_zero_padding`` is validated; on SM90 the reference's BF16 contiguous kernel does not read it (padding
rows follow the contiguous layout's rule, ``ops.contiguous``).
"""

from __future__ import annotations

import torch

from ..ops import bf16 as _bf16
from ..ops.einsum import einsum, fp8_einsum
from ..ops.hc_prenorm import tf32_hc_prenorm_gemm
from .arguments import check_compiled_dims

__all__ = ["bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt", "m_grouped_bf16_gemm_nt_contiguous",
           "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked", "einsum", "fp8_einsum",
           "tf32_hc_prenorm_gemm"]


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk") -> None:
    """:func:`deep_fp8_gemm.ops.bf16.bf16_gemm_nt` (``d = c + a · bᵀ``, a ``[m, k]``, b ``[n, k]``)."""
    check_compiled_dims(compiled_dims)
    _bf16.bf16_gemm_nt(a, b, d, c)


def bf16_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk") -> None:
    """:func:`deep_fp8_gemm.ops.bf16.bf16_gemm_nn` (``d = c + a · b``, a ``[m, k]``, b ``[k, n]``)."""
    check_compiled_dims(compiled_dims)
    _bf16.bf16_gemm_nn(a, b, d, c)


def bf16_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "mn") -> None:
    """:func:`deep_fp8_gemm.ops.bf16.bf16_gemm_tn` (``d = c + aᵀ · b``, a ``[k, m]``, b ``[k, n]``)."""
    check_compiled_dims(compiled_dims)
    _bf16.bf16_gemm_tn(a, b, d, c)


def bf16_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "mn") -> None:
    """:func:`deep_fp8_gemm.ops.bf16.bf16_gemm_tt` (``d = c + aᵀ · bᵀ``, a ``[k, m]``, b ``[n, k]``)."""
    check_compiled_dims(compiled_dims)
    _bf16.bf16_gemm_tt(a, b, d, c)


def _check_flag(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                      compiled_dims: str = "nk", use_psum_layout: bool = False,
                                      ensure_zero_padding: bool = True,
                                      expected_m_for_psum_layout: int | None = None) -> None:
    """:func:`deep_fp8_gemm.ops.bf16.m_grouped_bf16_gemm_nt_contiguous` (a ``[m_sum, k]``, b ``[G, n, k]``)."""
    check_compiled_dims(compiled_dims)
    _check_flag(ensure_zero_padding, "ensure_zero_padding")
    _bf16.m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, use_psum_layout, expected_m_for_psum_layout)


def m_grouped_bf16_gemm_nn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                      compiled_dims: str = "nk", use_psum_layout: bool = False,
                                      ensure_zero_padding: bool = True) -> None:
    """:func:`deep_fp8_gemm.ops.bf16.m_grouped_bf16_gemm_nn_contiguous` (a ``[m_sum, k]``, b ``[G, k, n]``)."""
    check_compiled_dims(compiled_dims)
    _check_flag(ensure_zero_padding, "ensure_zero_padding")
    _bf16.m_grouped_bf16_gemm_nn_contiguous(a, b, d, grouped_layout, use_psum_layout)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, compiled_dims: str = "nk") -> None:
    """:func:`deep_fp8_gemm.ops.bf16.m_grouped_bf16_gemm_nt_masked` (a ``[G, m_max, k]``, b ``[G, n, k]``)."""
    check_compiled_dims(compiled_dims)
    _bf16.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)
