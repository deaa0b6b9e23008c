"""Quantisers for the transposed operands of FP8 training (DeepSeek-V3 recipe).

The weight gradient ``dW = dYᵀ·X`` reduces over tokens, so its operands are the activations and output
gradients quantised along the *token* axis (1x128 groups of the transposed tensor); the input gradient
``dX = dY·W`` needs the 128x128-block quantised ``Wᵀ``.

* :func:`per_token_cast_to_fp8_and_transpose` — ``x`` ``[m, k]`` -> the 1x128 e4m3 of ``x`` and of ``xᵀ`` with
  their scales, in one read of ``x`` on the GPU (fused cast-transpose kernel);
* :func:`transpose_cast_to_fp8_k_grouped` — ``x`` ``[sum(ks), n]`` whose rows are grouped (MoE experts) -> the
  k-grouped weight-gradient operand: per group ``g`` the 1x128 e4m3 of ``x_gᵀ`` ``[n, K_g]``, blocks back to back
  in one flat buffer, plus the scales of all groups side by side ``[n, sum(ks)/128]`` (the ``a``/``sa`` or
  ``b``/``sb`` layout of ``k_grouped_fp8_gemm_nt_contiguous``);
* :func:`transpose_per_block_fp8` — the 128x128-block quantised ``W`` ``[n, k]`` turned into ``Wᵀ`` ``[k, n]``:
  exact, because blocks transpose onto blocks (same amax, same scale, same quotients).

The first two are ``torch.library`` custom ops (``torch.ops.deep_fp8_gemm.*``, registered at the bottom) with
fake kernels, so ``torch.compile(fullgraph=True)`` traces them. They follow the quantisers' backend policy
(``runtime.target.backend_of(device, "quant")``): on an sm_90 device (and in the simulator under
``DFG_SIMULATE``) they run the fused kernels of :mod:`deep_fp8_gemm.kernels.quant`; everywhere else the plain torch of
:func:`deep_fp8_gemm.quant.per_token_cast_to_fp8_torch`, which defines the bits: the results are bit-identical
to ``per_token_cast_to_fp8`` of the transposed tensors (tests/ops/test_cast_transpose.py checks both paths).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._core.checks import check_bool
from ._core.family import register_op
from .kernels import quant as quant_host
from .ops import transpose_plans
from .quant import GROUP, check_input, kernel_launcher, per_token_cast_to_fp8_torch
from .utils import ceil_div, empty_m_major, get_col_major_tma_aligned_tensor

__all__ = ["per_token_cast_to_fp8_and_transpose", "transpose_cast_to_fp8_k_grouped", "transpose_per_block_fp8"]


# ---------------------------------------------------------------------------------------------- checks
def _check_cast_transpose_input(x: object) -> None:
    check_input(x, "x")
    if x.size(0) <= 0:
        # xᵀ [k, m] needs at least one column, as per_token_cast_to_fp8 does for its input.
        raise ValueError(f"x must have at least one row (xᵀ is quantised too), got x.shape={tuple(x.shape)}")


def _check_ks(ks: object, x: torch.Tensor) -> list[int]:
    """``ks`` as a list of Python ints: each ``>= 0`` and a multiple of 128, summing to ``x.shape[0]``."""
    if isinstance(ks, torch.Tensor) or not isinstance(ks, Sequence) or isinstance(ks, (str, bytes)):
        raise TypeError(f"ks must be a list or tuple of Python ints, got {type(ks).__name__}")
    if len(ks) == 0:
        raise ValueError("ks must name at least one group, got ks=[]")
    for g, k in enumerate(ks):
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"ks[{g}] must be a Python int, got {type(k).__name__} ({k!r})")
        if k < 0 or k % GROUP != 0:
            raise ValueError(f"ks[{g}]={k}: every group's row count must be a non-negative multiple of {GROUP}")
    total = sum(ks)
    if total != x.shape[0]:
        raise ValueError(f"x must have sum(ks) rows, got x.shape={tuple(x.shape)} and sum(ks)={total} ({ks=})")
    return list(ks)


def _check_grouped_input(x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x must be bfloat16, float16 or float32, got x.dtype={x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [sum(ks), n], got x.shape={tuple(x.shape)}")


# ---------------------------------------------------------------------------------------------- cast + transpose
def cast_transpose_torch(x: torch.Tensor, use_ue8m0: bool) -> tuple[torch.Tensor, ...]:
    """Plain-torch cast-transpose: ``per_token_cast_to_fp8_torch`` of ``x`` and of ``xᵀ`` (scales row-major)."""
    x_fp8, x_sf = per_token_cast_to_fp8_torch(x.contiguous(), use_ue8m0)
    xt_fp8, xt_sf = per_token_cast_to_fp8_torch(x.t().contiguous(), use_ue8m0)
    return x_fp8, x_sf, xt_fp8, xt_sf


def _cast_transpose_impl(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, ...]:
    _check_cast_transpose_input(x)
    launch = kernel_launcher(x)
    if launch is not None:
        return quant_host.run_cast_transpose(x, launch, ue8m0=use_ue8m0)
    x_fp8, x_sf, xt_fp8, xt_sf = cast_transpose_torch(x, use_ue8m0)
    return x_fp8, get_col_major_tma_aligned_tensor(x_sf), xt_fp8, get_col_major_tma_aligned_tensor(xt_sf)


def _check_k_grouped(x: object, ks: object) -> list[int]:
    _check_grouped_input(x)
    return _check_ks(ks, x)


_cast_transpose_eager = transpose_plans.cast_transpose_entry(_check_cast_transpose_input, _cast_transpose_impl)


def _cast_transpose_fake(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, ...]:
    _check_cast_transpose_input(x)
    m, k = x.shape
    return (
        x.new_empty((m, k), dtype=torch.float8_e4m3fn),
        empty_m_major((m, ceil_div(k, GROUP)), x.device),
        x.new_empty((k, m), dtype=torch.float8_e4m3fn),
        empty_m_major((k, ceil_div(m, GROUP)), x.device),
    )


def per_token_cast_to_fp8_and_transpose(
    x: torch.Tensor, use_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise ``x`` and ``xᵀ`` per token (1x128 groups) in one pass.

    Args:
        x: ``[m, k]`` bfloat16 / float16 / float32, CPU or CUDA, any strides (a contiguous ``x`` is read once
            on the GPU; another layout is first copied); ``m >= 1``, ``k >= 1``.
        use_ue8m0: power-of-two scales (:func:`deep_fp8_gemm.quant.ceil_to_ue8m0`).

    Returns:
        ``(x_fp8, x_sf, xt_fp8, xt_sf)``, bit for bit ``per_token_cast_to_fp8(x, use_ue8m0)`` followed by
        ``per_token_cast_to_fp8(x.t().contiguous(), use_ue8m0)``:
        ``x_fp8`` ``[m, k]`` float8_e4m3fn contiguous; ``x_sf`` ``[m, ceil(k/128)]`` float32 M-major TMA-aligned
        (strides ``(1, get_tma_aligned_size(m, 4))``); ``xt_fp8`` ``[k, m]`` float8_e4m3fn contiguous
        (row-major); ``xt_sf`` ``[k, ceil(m/128)]`` float32, strides ``(1, get_tma_aligned_size(k, 4))``.
        ``(xt_fp8, xt_sf)`` groups 128 consecutive *rows* of ``x`` (tokens): the operand of a weight gradient.
    """
    if type(use_ue8m0) is bool:
        result = _cast_transpose_eager(x, use_ue8m0)  # eager: cached checks (ops.transpose_plans)
        if result is not None:
            return result
    _check_cast_transpose_input(x)
    return torch.ops.deep_fp8_gemm.per_token_cast_to_fp8_and_transpose.default(
        x, check_bool(use_ue8m0, "use_ue8m0"))


# ---------------------------------------------------------------------------------------------- k-grouped
def k_grouped_torch(x: torch.Tensor, ks: list[int], use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch :func:`transpose_cast_to_fp8_k_grouped` (scales row-major)."""
    total, n = x.shape
    if total == 0 or n == 0:
        return x.new_empty((total * n,), dtype=torch.float8_e4m3fn), x.new_empty((n, total // GROUP),
                                                                               dtype=torch.float32)
    # Every K_g is a multiple of 128, so the 1x128 groups of x_gᵀ are exactly those of xᵀ: one quantisation
    # of xᵀ [n, sum(ks)] gives every group's values and the scales in their final column order.
    xt_fp8, sf = per_token_cast_to_fp8_torch(x.t().contiguous(), use_ue8m0)
    blocks = [xt_fp8[:, start:start + k].reshape(-1).view(torch.uint8) for start, k in zip(_starts(ks), ks) if k > 0]
    return torch.cat(blocks).view(torch.float8_e4m3fn), sf  # bytes: cat needs no float8 kernel on any device


def _starts(ks: list[int]) -> list[int]:
    starts, total = [], 0
    for k in ks:
        starts.append(total)
        total += k
    return starts


def _k_grouped_impl(x: torch.Tensor, ks: list[int], use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _check_grouped_input(x)
    ks = _check_ks(ks, x)
    launch = kernel_launcher(x)
    if launch is not None:
        return quant_host.run_k_grouped_transpose(x, ks, launch, ue8m0=use_ue8m0)
    flat, sf = k_grouped_torch(x, ks, use_ue8m0)
    return flat, get_col_major_tma_aligned_tensor(sf)


_k_grouped_eager = transpose_plans.k_grouped_entry(_check_k_grouped, _k_grouped_impl)


def _k_grouped_fake(x: torch.Tensor, ks: list[int], use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _check_grouped_input(x)
    ks = _check_ks(ks, x)
    total, n = x.shape
    return x.new_empty((total * n,), dtype=torch.float8_e4m3fn), empty_m_major((n, sum(ks) // GROUP), x.device)


def transpose_cast_to_fp8_k_grouped(
    x: torch.Tensor, ks: Sequence[int], use_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise the row groups of ``x`` transposed: the k-grouped weight-gradient operand.

    Args:
        x: ``[sum(ks), n]`` bfloat16 / float16 / float32, CPU or CUDA, any strides (copied when not
            contiguous); group ``g`` is rows ``sum(ks[:g]) .. sum(ks[:g]) + ks[g]`` (e.g. the tokens routed to
            expert ``g`` in the contiguous MoE layout). ``n >= 0``.
        ks: list / tuple of Python ints, ``G >= 1`` entries, each a multiple of 128 and ``>= 0`` (0: an empty
            group, no output).
        use_ue8m0: power-of-two scales (:func:`deep_fp8_gemm.quant.ceil_to_ue8m0`).

    Returns:
        ``(flat_fp8, sf)``: ``flat_fp8`` float8_e4m3fn 1-D, numel ``sum(ks) * n``; group ``g``'s block
        ``[n, K_g]`` (row-major, stride ``K_g``) starts at element ``n * sum(ks[:g])`` and is
        ``per_token_cast_to_fp8(x_g.t().contiguous())[0]``. ``sf`` float32 ``[n, sum(ks)/128]`` in the M-major
        TMA-aligned layout (strides ``(1, get_tma_aligned_size(n, 4))``); column ``j`` holds the scales of
        rows ``128j .. 128j+127`` of ``x`` (group ``g``'s columns start at ``sum(ks[:g]) / 128``). This is the
        ``(a, sa)`` / ``(b, sb)`` layout of ``k_grouped_fp8_gemm_nt_contiguous``.
    """
    if type(use_ue8m0) is bool:
        result = _k_grouped_eager(x, ks, use_ue8m0)  # eager: cached checks (ops.transpose_plans)
        if result is not None:
            return result
    _check_grouped_input(x)
    ks = _check_ks(ks, x)
    return torch.ops.deep_fp8_gemm.transpose_cast_to_fp8_k_grouped.default(
        x, ks, check_bool(use_ue8m0, "use_ue8m0"))


# ---------------------------------------------------------------------------------------------- weights
def transpose_per_block_fp8(w_fp8: torch.Tensor, w_sf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Wᵀ`` of a 128x128-block quantised weight, exactly.

    Args:
        w_fp8: ``[n, k]`` float8_e4m3fn, any strides, as :func:`deep_fp8_gemm.per_block_cast_to_fp8` returns.
        w_sf: ``[ceil(n/128), ceil(k/128)]`` float32 block scales on ``w_fp8``'s device, any strides.

    Returns:
        ``(wt_fp8, wt_sf)``: ``wt_fp8`` ``[k, n]`` float8_e4m3fn contiguous; ``wt_sf``
        ``[ceil(k/128), ceil(n/128)]`` float32 contiguous. A block's amax does not depend on the orientation,
        so this equals ``per_block_cast_to_fp8(w.t().contiguous())`` bit for bit with no re-quantisation error
        (one byte copy of ``W``). Plain torch on every device (a transposing copy; no custom op needed).
    """
    if not isinstance(w_fp8, torch.Tensor):
        raise TypeError(f"w_fp8 must be a torch.Tensor, got {type(w_fp8).__name__}")
    if not isinstance(w_sf, torch.Tensor):
        raise TypeError(f"w_sf must be a torch.Tensor, got {type(w_sf).__name__}")
    if w_fp8.dtype != torch.float8_e4m3fn:
        raise TypeError(f"w_fp8 must be float8_e4m3fn, got w_fp8.dtype={w_fp8.dtype}")
    if w_sf.dtype != torch.float32:
        raise TypeError(f"w_sf must be float32, got w_sf.dtype={w_sf.dtype}")
    if w_fp8.dim() != 2:
        raise ValueError(f"w_fp8 must be 2-D [n, k], got w_fp8.shape={tuple(w_fp8.shape)}")
    n, k = w_fp8.shape
    expected = (ceil_div(n, GROUP), ceil_div(k, GROUP))
    if tuple(w_sf.shape) != expected:
        raise ValueError(f"w_sf must have shape [ceil(n/128), ceil(k/128)] = {list(expected)}, got "
                         f"w_sf.shape={tuple(w_sf.shape)} for w_fp8.shape={tuple(w_fp8.shape)}")
    if w_sf.device != w_fp8.device:
        raise ValueError(f"w_sf must be on w_fp8's device, got w_sf.device={w_sf.device}, "
                         f"w_fp8.device={w_fp8.device}")
    return w_fp8.t().contiguous(), w_sf.t().contiguous()


register_op("per_token_cast_to_fp8_and_transpose",
            "(Tensor x, bool use_ue8m0=False) -> (Tensor, Tensor, Tensor, Tensor)", _cast_transpose_impl,
            _cast_transpose_fake)
register_op("transpose_cast_to_fp8_k_grouped", "(Tensor x, int[] ks, bool use_ue8m0=False) -> (Tensor, Tensor)",
            _k_grouped_impl, _k_grouped_fake)
