"""FP8 training: autograd functions on the library's GEMMs (DeepSeek-V3's recipe).

:func:`fp8_linear` (``y = x·Wᵀ + b``) and :func:`fp8_moe` (the SwiGLU experts of :mod:`deep_fp8_gemm.moe`) take
high-precision master parameters (bfloat16 or float32) and run every GEMM of the forward and the backward in
FP8. For one linear layer, ``x [M, K]``, ``W [N, K]``, ``dy [M, N]``:

=============  ===============  =============================================  ==========================================
GEMM           operands         quantisation                                   kernel
=============  ===============  =============================================  ==========================================
forward        ``y = x·Wᵀ``     x 1x128 per token (along K); W 128x128 blocks  ``gemm_fp8_fp8_bf16_nt`` (bf16 out)
input grad     ``dx = dy·W``    dy 1x128 per token (along N); Wᵀ 128x128       ``gemm_fp8_fp8_bf16_nt`` (bf16 out)
                                blocks = the forward's W blocks transposed
                                (``transpose_per_block_fp8``: exact)
weight grad    ``dW = dyᵀ·x``   dyᵀ and xᵀ 1x128 along the token axis          1D1D ``gemm_fp8_fp8_fp32_nt_1d1d``
                                (``per_token_cast_to_fp8_and_transpose``)      (fp32 accumulation, ``D = C + A·Bᵀ``)
=============  ===============  =============================================  ==========================================

The MoE layer does the same per expert: forward and input gradients on the M-grouped contiguous GEMM, weight
gradients on the k-grouped 1D1D GEMM (``k_grouped_fp8_gemm_nt_contiguous``: one launch for all experts, the
tokens of expert ``e`` are its K axis) with operands from ``transpose_cast_to_fp8_k_grouped``.

Weight gradients (``main_grad``, Megatron-LM's gradient-accumulation fusion): if a weight parameter has an
attribute ``main_grad`` (a float32 tensor of the parameter's shape on its device, row-major contiguous), the
weight-gradient GEMM accumulates into it **in place** (``c = d = main_grad``: ``main_grad += dW`` inside the
GEMM's fp32 accumulator, no extra pass) and autograd gets no gradient for that weight (``None``, so ``.grad``
stays untouched) — Megatron's ``LinearWithGradAccumulationAndAsyncCommunication`` convention. Like Megatron, a
parameter that also has the attribute ``grad_added_to_main_grad`` gets that attribute set to ``True`` and a
dummy gradient instead of ``None`` (here all zeros of the parameter's dtype; Megatron returns an uninitialised
tensor unless ``zero_out_wgrad``), so that DDP hooks on the gradient accumulator still fire. Without
``main_grad`` the gradient is computed in float32 and returned in the parameter's dtype. The ``main_grad``
path is for eager mode (it mutates a parameter attribute during backward); under ``torch.compile`` use
parameters without ``main_grad``.

Everything runs on CPU tensors (the exact reference GEMMs: float64 products rounded once) and on sm_90 CUDA
tensors (the JIT kernels), and traces with ``torch.compile(fullgraph=True)``: every GEMM and quantiser is a
``torch.ops.deep_fp8_gemm`` custom op, and the one data-dependent step of the MoE backward (the per-expert
token counts that size the k-grouped weight-gradient GEMM) sits inside the custom op
``deep_fp8_gemm::fp8_moe_weight_grad``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import moe as _moe
from .layout import max_m_sum_bound, route_topk
from .ops import gemm_fp8_fp8_bf16_nt, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from .quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from .wgrad import gemm_fp8_fp8_fp32_nt_1d1d

FP8 = torch.float8_e4m3fn
GROUP = 128
#: Dtypes accepted for master parameters (weights, biases).
PARAM_DTYPES = (torch.bfloat16, torch.float32)
#: The 1D1D GEMM's K (= tokens of a weight gradient) must be a multiple of 16 (16-byte fp8 rows for TMA):
#: token counts are zero-padded to it; zero rows change neither the per-token scales nor the sums.
_TOKEN_PAD = 16

__all__ = ["fp8_linear", "fp8_moe"]


# ---------------------------------------------------------------------------------------------- operand helpers
def _cast_and_transpose(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(x_fp8, x_sf, xt_fp8, xt_sf)`` of bf16 ``x [m, k]``: 1x128 per-token quantisation of ``x`` and of
    ``xᵀ`` (the contract's ``per_token_cast_to_fp8_and_transpose``)."""
    # FALLBACK until branch issue15q (cast_transpose.per_token_cast_to_fp8_and_transpose) is merged: two
    # public quantiser calls on x and on a transposed copy, bit-identical to the contract.
    x_fp8, x_sf = per_token_cast_to_fp8(x)
    xt_fp8, xt_sf = per_token_cast_to_fp8(x.t().contiguous())
    return x_fp8, x_sf, xt_fp8, xt_sf


def _transpose_blocks(w_fp8: torch.Tensor, w_sf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128-block quantised ``W [.., n, k]`` -> ``Wᵀ [.., k, n]`` with its scales ``[.., ceil(k/128),
    ceil(n/128)]``: blocks transpose onto blocks, so this is exact (no requantisation). 2-D or 3-D (experts)."""
    # FALLBACK until branch issue15q (cast_transpose.transpose_per_block_fp8) is merged.
    wt = w_fp8.view(torch.uint8).transpose(-1, -2).contiguous().view(FP8)
    return wt, w_sf.transpose(-1, -2).contiguous()


def _pad_tokens(x: torch.Tensor) -> torch.Tensor:
    """``x [m, k]`` with zero rows appended up to a multiple of ``_TOKEN_PAD`` (a no-op when it is one)."""
    pad = -x.shape[0] % _TOKEN_PAD
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def _check_main_grad(param: torch.Tensor, name: str) -> torch.Tensor | None:
    main_grad = getattr(param, "main_grad", None)
    if main_grad is None:
        return None
    if not isinstance(main_grad, torch.Tensor) or main_grad.dtype != torch.float32:
        raise TypeError(f"{name}.main_grad must be a float32 tensor, got "
                        f"{getattr(main_grad, 'dtype', type(main_grad).__name__)}")
    if main_grad.shape != param.shape or main_grad.device != param.device or not main_grad.is_contiguous():
        raise ValueError(f"{name}.main_grad must be contiguous with {name}'s shape {tuple(param.shape)} on "
                         f"{param.device}, got shape={tuple(main_grad.shape)} device={main_grad.device} "
                         f"stride={main_grad.stride()}")
    return main_grad


def _weight_grad_result(param: torch.Tensor | None, dtype: torch.dtype, main_grad: torch.Tensor | None,
                        grad: torch.Tensor | None) -> torch.Tensor | None:
    """What autograd receives for a weight of ``dtype`` (see the module docstring, ``main_grad``); ``param``
    is the parameter itself when ``main_grad`` is used (for Megatron's ``grad_added_to_main_grad``)."""
    if main_grad is None:
        return None if grad is None else grad.to(dtype)
    if param is not None and hasattr(param, "grad_added_to_main_grad"):
        param.grad_added_to_main_grad = True
        return torch.zeros_like(param)
    return None


# ---------------------------------------------------------------------------------------------- fp8_linear
def _check_weight(weight: object, name: str, dtypes: tuple[torch.dtype, ...], what: str) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in dtypes:
        raise TypeError(f"{name} must be {what}, got {name}.dtype={weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"{name} must be 2-D [N, K], got {name}.shape={tuple(weight.shape)}")
    n, k = weight.shape
    if n == 0 or k == 0 or n % 16 or k % 16:
        raise ValueError(f"{name} [N, K] needs N and K positive multiples of 16 (K of the forward GEMM, N of the "
                         f"input-gradient GEMM: 16-byte fp8 rows), got {name}.shape={tuple(weight.shape)}")
    return weight


def _check_linear(x: object, weight: torch.Tensor, name: str, bias: object) -> None:
    """``x`` and ``bias`` against the (already checked) weight ``[N, K]`` called ``name``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be bfloat16, got x.dtype={x.dtype}")
    n, k = weight.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x must be [..., K={k}] ({name}.shape={tuple(weight.shape)}), got x.shape={tuple(x.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype not in PARAM_DTYPES:
            raise TypeError(f"bias must be bfloat16 or float32, got bias.dtype={bias.dtype}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must be [N={n}], got bias.shape={tuple(bias.shape)}")
    for t, t_name in ((weight, name), (bias, "bias")):
        if t is not None and t.device != x.device:
            raise ValueError(f"all tensors must be on one device: x is on {x.device}, {t_name} on {t.device}")


class _FP8LinearFunction(torch.autograd.Function):
    """``(x2 [M, K] bf16, weight [N, K] | None, bias [N] | None, main_grad | None, w_fp8, w_sf)`` -> bf16
    ``[M, N]``. ``weight`` None: the frozen, already-quantised ``(w_fp8, w_sf)`` (no weight gradient)."""

    @staticmethod
    def forward(ctx, x2, weight, bias, main_grad, w_fp8, w_sf):
        if weight is not None:
            w_fp8, w_sf = per_block_cast_to_fp8(weight)
        num_tokens, n = x2.shape[0], w_fp8.shape[0]
        need_wgrad = weight is not None and ctx.needs_input_grad[1]
        out = torch.empty((num_tokens, n), dtype=torch.bfloat16, device=x2.device)
        xt_fp8 = xt_sf = None
        if num_tokens > 0:
            if need_wgrad:  # xᵀ along tokens for the weight gradient, quantised from the same read of x
                x_fp8, x_sf, xt_fp8, xt_sf = _cast_and_transpose(_pad_tokens(x2))
                x_fp8, x_sf = x_fp8[:num_tokens], x_sf[:num_tokens]
            else:
                x_fp8, x_sf = per_token_cast_to_fp8(x2)
            gemm_fp8_fp8_bf16_nt((x_fp8, x_sf), (w_fp8, w_sf), out)
            if bias is not None:
                out = (out.float() + bias.float()).to(torch.bfloat16)
        elif bias is not None:
            out = out + bias.to(torch.bfloat16)  # keeps the result connected to bias (empty anyway)
        ctx.save_for_backward(xt_fp8, xt_sf, w_fp8, w_sf, main_grad)
        ctx.weight = weight if main_grad is not None else None  # for Megatron's grad_added_to_main_grad flag
        ctx.weight_shape = (n, x2.shape[1])
        ctx.weight_dtype = None if weight is None else weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.need_wgrad = need_wgrad
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xt_fp8, xt_sf, w_fp8, w_sf, main_grad = ctx.saved_tensors
        num_tokens = grad_out.shape[0]
        n, k = ctx.weight_shape
        need_dx, need_db = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        dy = grad_out.to(torch.bfloat16).contiguous()
        grad_x = grad_w = grad_b = None
        if need_db:
            grad_b = dy.float().sum(0).to(ctx.bias_dtype)
        if num_tokens == 0:  # no tokens: zero gradients (main_grad unchanged), no GEMM (K = 0 is not a GEMM)
            if need_dx:
                grad_x = dy.new_zeros((0, k))
            if ctx.need_wgrad and main_grad is None:
                grad_w = torch.zeros((n, k), dtype=torch.float32, device=dy.device)
            grad_w = _weight_grad_result(ctx.weight, ctx.weight_dtype, main_grad, grad_w) if ctx.need_wgrad else None
            return grad_x, grad_w, grad_b, None, None, None
        if ctx.need_wgrad:
            dy_fp8, dy_sf, dyt_fp8, dyt_sf = _cast_and_transpose(_pad_tokens(dy))
            dy_fp8, dy_sf = dy_fp8[:num_tokens], dy_sf[:num_tokens]
            # dW [N, K] = dyᵀ [N, M] · (xᵀ [K, M])ᵀ, fp32 accumulation (in place into main_grad when present)
            if main_grad is not None:
                gemm_fp8_fp8_fp32_nt_1d1d((dyt_fp8, dyt_sf), (xt_fp8, xt_sf), main_grad, main_grad)
            else:
                grad_w = torch.empty((n, k), dtype=torch.float32, device=dy.device)
                gemm_fp8_fp8_fp32_nt_1d1d((dyt_fp8, dyt_sf), (xt_fp8, xt_sf), grad_w, None)
        elif need_dx:
            dy_fp8, dy_sf = per_token_cast_to_fp8(dy)
        if need_dx:
            wt_fp8, wt_sf = _transpose_blocks(w_fp8, w_sf)  # Wᵀ [K, N]
            grad_x = torch.empty((num_tokens, k), dtype=torch.bfloat16, device=dy.device)
            gemm_fp8_fp8_bf16_nt((dy_fp8, dy_sf), (wt_fp8, wt_sf), grad_x)
        grad_w = _weight_grad_result(ctx.weight, ctx.weight_dtype, main_grad, grad_w) if ctx.need_wgrad else None
        return grad_x, grad_w, grad_b, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x · Wᵀ + b`` with every GEMM of forward and backward in FP8 (see the module docstring).

    Args:
        x: ``[..., K]`` bfloat16, any leading dims and strides; may require grad.
        weight: ``[N, K]`` bfloat16 or float32 master weight (``N``, ``K`` positive multiples of 16). Quantised
            to e4m3 with 128x128 block scales on every call (it changes every optimiser step). An optional
            ``weight.main_grad`` float32 buffer receives the weight gradient in place (module docstring).
        bias: ``[N]`` bfloat16 / float32 or None.

    Returns:
        ``[..., N]`` bfloat16: ``bf16(bf16(dequant(x_fp8) · dequant(W_fp8)ᵀ) + b)`` — bit for bit what
        :class:`deep_fp8_gemm.nn.FP8Linear` computes for the same weight (the bias added in fp32).

    Gradients: ``x.grad`` bfloat16 ``= bf16(dequant(q(dy)) · dequant(W_fp8))`` (FP8 GEMM with Wᵀ's blocks);
    ``weight.grad`` = ``dequant(qᵀ(dy))ᵀ · dequant(qᵀ(x))`` accumulated in fp32 (1D1D GEMM), returned in the
    weight's dtype; ``bias.grad`` = ``Σ_tokens dy`` in fp32. ``dy`` is rounded to bfloat16 first.

    Raises:
        TypeError / ValueError: wrong dtypes, shapes or devices (the message names the argument).
    """
    _check_weight(weight, "weight", PARAM_DTYPES, "bfloat16 or float32 (the master weight)")
    _check_linear(x, weight, "weight", bias)
    main_grad = _check_main_grad(weight, "weight") if weight.requires_grad else None
    n, k = weight.shape
    leading = x.shape[:-1]
    y = _FP8LinearFunction.apply(x.reshape(-1, k), weight, bias, main_grad, None, None)
    return y.view(*leading, n)


def fp8_linear_frozen(x: torch.Tensor, w_fp8: torch.Tensor, w_sf: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`fp8_linear` with an already-quantised, frozen weight (``w_fp8 [N, K]`` e4m3 and ``w_sf
    [ceil(N/128), ceil(K/128)]`` fp32, e.g. :class:`deep_fp8_gemm.nn.FP8Linear`'s buffers): gradients flow to
    ``x`` (FP8 input-gradient GEMM) and ``bias``, none to the weight. ``K % 16 == 0`` and ``N % 16 == 0``."""
    _check_weight(w_fp8, "w_fp8", (FP8,), "float8_e4m3fn")
    _check_linear(x, w_fp8, "w_fp8", bias)
    expected = ((w_fp8.shape[0] + GROUP - 1) // GROUP, (w_fp8.shape[1] + GROUP - 1) // GROUP)
    if not isinstance(w_sf, torch.Tensor) or w_sf.dtype != torch.float32:
        raise TypeError(f"w_sf must be a float32 tensor, got {getattr(w_sf, 'dtype', type(w_sf).__name__)}")
    if tuple(w_sf.shape) != expected or w_sf.device != w_fp8.device:
        raise ValueError(f"w_sf must be [ceil(N/128), ceil(K/128)]={expected} on {w_fp8.device}, got "
                         f"w_sf.shape={tuple(w_sf.shape)} on {w_sf.device}")
    n, k = w_fp8.shape
    y = _FP8LinearFunction.apply(x.reshape(-1, k), None, bias, None, w_fp8, w_sf)
    return y.view(*x.shape[:-1], n)
