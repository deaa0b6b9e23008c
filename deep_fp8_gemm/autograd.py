"""FP8 training: autograd functions on the library's GEMMs (DeepSeek-V3's recipe).

:func:`fp8_linear` (``y = x·Wᵀ + b``) and :func:`fp8_moe` (the SwiGLU experts of :mod:`deep_fp8_gemm.moe`) take
high-precision master parameters (bfloat16 or float32) and run every GEMM of the forward and the backward in
FP8. For one linear layer, ``x [M, K]``, ``W [N, K]``, ``dy [M, N]``:

============  ===============  =============================================  ====================================
GEMM          operands         quantisation                                   kernel
============  ===============  =============================================  ====================================
forward       ``y = x·Wᵀ``     x 1x128 per token (along K); W 128x128 blocks  ``gemm_fp8_fp8_bf16_nt`` (bf16 out)
input grad    ``dx = dy·W``    dy 1x128 per token (along N); Wᵀ 128x128       ``gemm_fp8_fp8_bf16_nt`` (bf16 out)
                               blocks = the forward's W blocks transposed
                               (``transpose_per_block_fp8``: exact)
weight grad   ``dW = dyᵀ·x``   dyᵀ and xᵀ 1x128 along the token axis          1D1D ``gemm_fp8_fp8_fp32_nt_1d1d``
                               (``per_token_cast_to_fp8_and_transpose``)      (fp32 accumulation, D = C + A·Bᵀ)
============  ===============  =============================================  ====================================

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
``main_grad`` the gradient is computed in float32 and returned in the parameter's dtype. ``main_grad`` also
works under ``torch.compile`` (tested with ``backend="aot_eager"``, including a swapped buffer); the
``grad_added_to_main_grad`` flag is a Python side effect of the backward and is only reliable in eager mode.

Everything runs on CPU tensors (the exact reference GEMMs: float64 products rounded once) and on sm_90 CUDA
tensors (the JIT kernels), and traces with ``torch.compile(fullgraph=True)``: every GEMM and quantiser is a
``torch.ops.deep_fp8_gemm`` custom op, and the one data-dependent step of the MoE backward (the per-expert
token counts that size the k-grouped weight-gradient GEMM) sits inside the custom op
``deep_fp8_gemm::fp8_moe_weight_grad``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import inspect

from ._core.family import register_op
from .cast_transpose import (per_token_cast_to_fp8_and_transpose, transpose_cast_to_fp8_k_grouped,
                             transpose_per_block_fp8)
from .constants import GRAN_K
from .ops.contiguous import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from .ops.dense import gemm_fp8_fp8_bf16_nt
from .ops.k_grouped import k_grouped_gemm_fp8_fp8_fp32_nt
from .ops.moe import (check_expert_shapes, check_tensor_of, check_tokens, check_weights, combine, experts_contiguous,
                      quantise_experts, route)
from .ops.wgrad_1d1d import gemm_fp8_fp8_fp32_nt_1d1d
from .quant import per_block_cast_to_fp8, per_token_cast_to_fp8

FP8 = torch.float8_e4m3fn


def first_order_only(op_name: str):
    """Decorate an autograd Function's ``backward``: run it without building a graph and, when its caller asked
    for one (``create_graph=True``: a gradient to be differentiated again), give its results a node that raises
    ``RuntimeError("<op_name>: double backward ... is not supported ...")`` if they are differentiated — as
    ``torch.autograd.function.once_differentiable`` does, with a message naming the op (its own names
    nothing, and without it the second backward fails inside the FP8 ops with an unrelated error)."""
    message = (f"{op_name}: double backward (differentiating its gradient, e.g. after create_graph=True) is not "
               f"supported: its backward is FP8 GEMMs and quantisers, which have no derivatives").encode()
    delayed_error = getattr(getattr(torch._C, "_functions", None), "DelayedError", None)

    def decorate(backward):
        if delayed_error is None:  # pragma: no cover - every supported torch has it
            return torch.autograd.function.once_differentiable(backward)

        def wrapper(ctx, *grads):
            with torch.no_grad():
                outputs = backward(ctx, *grads)
            if not torch.is_grad_enabled():
                return outputs
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)

            def marked(t):
                if t is None:
                    return None
                t = t.detach()
                t.requires_grad_(True)
                return t

            return delayed_error(message, len(outputs))(*[marked(t) for t in outputs])

        wrapper.__name__, wrapper.__doc__ = backward.__name__, backward.__doc__
        return wrapper

    return decorate
#: Dtypes accepted for master parameters (weights, biases).
PARAM_DTYPES = (torch.bfloat16, torch.float32)
#: The 1D1D GEMM's K (= tokens of a weight gradient) must be a multiple of 16 (16-byte fp8 rows for TMA):
#: token counts are zero-padded to it; zero rows change neither the per-token scales nor the sums.
_TOKEN_PAD = 16

__all__ = ["fp8_linear", "fp8_linear_frozen", "fp8_moe", "fp8_moe_frozen"]


# ---------------------------------------------------------------------------------------------- operand helpers
def _transpose_blocks(w_fp8: torch.Tensor, w_sf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128-block quantised ``W [n, k]`` (or experts ``[E, n, k]``) -> ``Wᵀ`` with transposed block scales:
    exact (blocks transpose onto blocks). 2-D: :func:`deep_fp8_gemm.cast_transpose.transpose_per_block_fp8`;
    3-D: the same byte transpose batched over experts (one copy instead of ``E``)."""
    if w_fp8.dim() == 2:
        return transpose_per_block_fp8(w_fp8, w_sf)
    return w_fp8.transpose(1, 2).contiguous(), w_sf.transpose(1, 2).contiguous()


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
                x_fp8, x_sf, xt_fp8, xt_sf = per_token_cast_to_fp8_and_transpose(_pad_tokens(x2))
                x_fp8, x_sf = x_fp8[:num_tokens], x_sf[:num_tokens]
            else:
                x_fp8, x_sf = per_token_cast_to_fp8(x2)
            gemm_fp8_fp8_bf16_nt((x_fp8, x_sf), (w_fp8, w_sf), out)
            if bias is not None:
                out = (out.float() + bias.float()).to(torch.bfloat16)
        elif bias is not None:
            out = out + bias.to(torch.bfloat16)  # keeps the result connected to bias (empty anyway)
        if not ctx.needs_input_grad[0]:  # W's blocks serve the input gradient only
            w_fp8 = w_sf = None
        ctx.save_for_backward(xt_fp8, xt_sf, w_fp8, w_sf)
        # main_grad is written by the backward: kept as an attribute, not saved (saved tensors must not change)
        ctx.main_grad = main_grad
        ctx.weight = weight if main_grad is not None else None  # for Megatron's grad_added_to_main_grad flag
        ctx.weight_shape = (n, x2.shape[1])
        ctx.weight_dtype = None if weight is None else weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.need_wgrad = need_wgrad
        return out

    @staticmethod
    @first_order_only("fp8_linear")
    def backward(ctx, grad_out):
        xt_fp8, xt_sf, w_fp8, w_sf = ctx.saved_tensors
        main_grad = ctx.main_grad
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
            dy_fp8, dy_sf, dyt_fp8, dyt_sf = per_token_cast_to_fp8_and_transpose(_pad_tokens(dy))
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
    expected = ((w_fp8.shape[0] + GRAN_K - 1) // GRAN_K, (w_fp8.shape[1] + GRAN_K - 1) // GRAN_K)
    if not isinstance(w_sf, torch.Tensor) or w_sf.dtype != torch.float32:
        raise TypeError(f"w_sf must be a float32 tensor, got {getattr(w_sf, 'dtype', type(w_sf).__name__)}")
    if tuple(w_sf.shape) != expected or w_sf.device != w_fp8.device:
        raise ValueError(f"w_sf must be [ceil(N/128), ceil(K/128)]={expected} on {w_fp8.device}, got "
                         f"w_sf.shape={tuple(w_sf.shape)} on {w_sf.device}")
    n, k = w_fp8.shape
    y = _FP8LinearFunction.apply(x.reshape(-1, k), None, bias, None, w_fp8, w_sf)
    return y.view(*x.shape[:-1], n)


# ---------------------------------------------------------------------------------------------- fp8_moe
def _moe_weight_grad_impl(dy: torch.Tensor, x: torch.Tensor, padded_sizes: torch.Tensor, d: torch.Tensor,
                          accumulate: bool) -> None:
    """``d[e] (+)= dy_eᵀ · x_e`` over the rows of expert ``e`` (rows ``offsets[e] .. offsets[e] + padded_sizes[e]``
    of ``dy [m_sum, m]`` and ``x [m_sum, n]``, zero padding rows included: they add nothing). Reads the
    per-expert sizes back to the host (the k-grouped GEMM needs them as Python ints); rows past their sum
    (the sync-free layout's tail) are ignored."""
    _check_moe_weight_grad(dy, x, padded_sizes, d)
    ks = [int(v) for v in padded_sizes.tolist()]
    total = sum(ks)
    if total > dy.shape[0]:
        raise ValueError(f"padded_sizes sum to {total} rows, more than dy's {dy.shape[0]}")
    if total == 0 or d.numel() == 0:
        if not accumulate:
            d.zero_()
        return
    dy, x = dy[:total], x[:total]
    if any(k % GRAN_K for k in ks):
        # A 64-row contiguous alignment: the k-grouped GEMM's K per group is whole 128-element scale groups, so
        # each expert's rows move to a segment padded with zero rows to a multiple of 128 (they add nothing).
        dy, x, ks = _pad_groups_to_k_blocks(dy, x, ks)
        ks_tensor = torch.tensor(ks, dtype=torch.int32, device=d.device)
    else:
        ks_tensor = padded_sizes.to(torch.int32)
    a, sa = transpose_cast_to_fp8_k_grouped(dy, ks)
    b, sb = transpose_cast_to_fp8_k_grouped(x, ks)
    k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), d, ks, ks_tensor, d if accumulate else None)


def _pad_groups_to_k_blocks(dy: torch.Tensor, x: torch.Tensor, ks: list[int]):
    """``dy`` / ``x`` with the rows of group g (``ks[g]`` consecutive rows) moved to a segment of
    ``round_up(ks[g], 128)`` rows, zero-filled after them; returns ``(dy, x, padded ks)``."""
    padded = [(k + GRAN_K - 1) // GRAN_K * GRAN_K for k in ks]
    shifts, src, dst = [], 0, 0
    for k, p in zip(ks, padded):
        shifts.append(dst - src)
        src, dst = src + k, dst + p
    rows = torch.arange(src, device=dy.device)
    dest = rows + torch.repeat_interleave(torch.tensor(shifts, device=dy.device), torch.tensor(ks, device=dy.device))
    out = []
    for t in (dy, x):
        moved = t.new_zeros((dst, t.shape[1]))
        moved.index_copy_(0, dest, t)
        out.append(moved)
    return out[0], out[1], padded


def _check_moe_weight_grad(dy, x, padded_sizes, d) -> None:
    if dy.dim() != 2 or x.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(f"dy and x must be [m_sum, m] and [m_sum, n], got {tuple(dy.shape)} and {tuple(x.shape)}")
    if padded_sizes.dim() != 1 or tuple(d.shape) != (padded_sizes.shape[0], dy.shape[1], x.shape[1]):
        raise ValueError(f"d must be [E, m, n]={(padded_sizes.shape[0], dy.shape[1], x.shape[1])}, got "
                         f"d.shape={tuple(d.shape)}")
    if d.dtype != torch.float32:
        raise TypeError(f"d must be float32, got d.dtype={d.dtype}")


def _moe_weight_grad_fake(dy, x, padded_sizes, d, accumulate) -> None:
    _check_moe_weight_grad(dy, x, padded_sizes, d)


_moe_weight_grad = register_op("fp8_moe_weight_grad", "(Tensor dy, Tensor x, Tensor padded_sizes, Tensor(a!) d, "
                               "bool accumulate) -> ()", _moe_weight_grad_impl, _moe_weight_grad_fake)


def _masked_rows(valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` with the rows where ``valid`` is False set to zero (``where``, so NaN garbage is dropped too)."""
    return torch.where(valid.unsqueeze(1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


#: The inputs of :class:`_FP8MoEFunction`, in order: its backward returns one gradient per name
#: (:func:`_moe_gradients`); ``w13`` / ``w2`` None means the frozen quantised weights are given instead.
_MOE_INPUTS = ("hidden", "topk_weights", "w13", "w2", "w13_main_grad", "w2_main_grad", "topk_ids", "w13_fp8", "w13_sf",
               "w2_fp8", "w2_sf", "max_m_sum")


def _moe_gradients(**grads: torch.Tensor | None) -> tuple:
    """The backward's return tuple: the named gradients in :data:`_MOE_INPUTS` order, None for every other input
    (torch would silently drop a miscounted tail of Nones; naming them cannot miscount)."""
    unknown = set(grads) - set(_MOE_INPUTS)
    if unknown:
        raise AssertionError(f"gradients for unknown inputs {sorted(unknown)}")
    return tuple(grads.get(name) for name in _MOE_INPUTS)


def _topk_weight_grad(down: torch.Tensor, sink: torch.Tensor, dout: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``d w[t, j] = <dout[t], down[row of (t, j)]>`` in fp32 (dropped slots read ``down``'s zero row)."""
    return torch.stack([(down.index_select(0, sink[:, j]).float() * dout).sum(-1)
                        for j in range(sink.shape[1])], dim=1).to(dtype)


def _swiglu_backward(gate_up: torch.Tensor, g_h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The SwiGLU backward in fp32 from the saved bf16 ``gate | up`` (the forward's SiLU·mul ran on the same
    values): ``(d gate_up, h)`` for ``h = SiLU(gate) * up`` and its output gradient ``g_h``, both fp32."""
    inter = gate_up.shape[1] // 2
    gate, up = gate_up[:, :inter].float(), gate_up[:, inter:].float()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    g_hf = g_h.float()
    return torch.cat([g_hf * up * sig * (1 + gate * (1 - sig)), g_hf * silu], dim=1), silu * up


class _FP8MoEFunction(torch.autograd.Function):
    """See :func:`fp8_moe`; inputs :data:`_MOE_INPUTS`."""

    @staticmethod
    def forward(ctx, hidden, topk_weights, w13, w2, w13_main_grad, w2_main_grad, topk_ids,
                w13_fp8, w13_sf, w2_fp8, w2_sf, max_m_sum):
        if w13 is not None:
            w13_fp8, w13_sf = quantise_experts(w13)
            w2_fp8, w2_sf = quantise_experts(w2)
        num_experts, two_i, hidden_size = w13_fp8.shape
        num_tokens, top_k = topk_ids.shape
        ctx.shapes = (num_experts, two_i, hidden_size, num_tokens, top_k)
        ctx.dtypes = (None if w13 is None else w13.dtype, None if w2 is None else w2.dtype, topk_weights.dtype)
        ctx.params = (w13, w2) if w13_main_grad is not None or w2_main_grad is not None else (None, None)
        ctx.main_grads = (w13_main_grad, w2_main_grad)  # written by the backward: not saved tensors
        ctx.empty = True
        out = hidden.new_zeros((num_tokens, hidden_size))
        if num_tokens == 0 or top_k == 0:
            return out
        routed = route(topk_ids, num_experts, max_m_sum)
        if routed.layout.m_sum == 0:  # every slot dropped (known on the host in the synchronising mode only)
            return out
        # moe.fp8_moe_forward's own steps (ops.moe), keeping the GEMM outputs the backward needs.
        x_fp8, x_sf = per_token_cast_to_fp8(hidden)
        gate_up, down = experts_contiguous(x_fp8, x_sf, routed, w13_fp8, w13_sf, w2_fp8, w2_sf)
        out = combine(down, routed.scatter_index, topk_weights)
        ctx.empty = False
        ctx.save_for_backward(hidden, topk_weights, routed.gather_index, routed.scatter_index, routed.layout.m_indices,
                              routed.layout.padded_sizes, gate_up, down, w13_fp8, w13_sf, w2_fp8, w2_sf)
        return out

    @staticmethod
    @first_order_only("fp8_moe")
    def backward(ctx, grad_out):
        num_experts, two_i, hidden_size, num_tokens, top_k = ctx.shapes
        inter = two_i // 2
        _, _, tw_dtype = ctx.dtypes
        need_hidden, need_tw, need_w13, need_w2 = ctx.needs_input_grad[:4]
        w13_main_grad, w2_main_grad = ctx.main_grads
        device = grad_out.device
        grad_w13 = grad_w2 = None
        if ctx.empty:  # no routed rows: all gradients zero, main_grad untouched
            zeros = (lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=device))
            grad_hidden = zeros((num_tokens, hidden_size), torch.bfloat16) if need_hidden else None
            grad_tw = zeros((num_tokens, top_k), tw_dtype) if need_tw else None
            if need_w13 and w13_main_grad is None:
                grad_w13 = zeros((num_experts, two_i, hidden_size), torch.float32)
            if need_w2 and w2_main_grad is None:
                grad_w2 = zeros((num_experts, hidden_size, inter), torch.float32)
            return _moe_gradients(hidden=grad_hidden, topk_weights=grad_tw,
                                  **_moe_weight_grads(ctx, need_w13, need_w2, grad_w13, grad_w2))
        (hidden, topk_weights, gather, scatter, m_indices, padded_sizes, gate_up, down,
         w13_fp8, w13_sf, w2_fp8, w2_sf) = ctx.saved_tensors
        m_sum = gate_up.shape[0]
        dout = grad_out.to(torch.bfloat16).float()  # the layer's output is bf16: its gradient too
        valid = m_indices >= 0
        rows = gather.clamp(min=0)
        sink = torch.where(scatter >= 0, scatter, torch.full_like(scatter, m_sum))  # dropped slots -> zero row
        grad_tw = _topk_weight_grad(down, sink, dout, tw_dtype) if need_tw else None

        # d down[r] = w[slot of r] · dout[token of r]; padding rows 0.
        row_weight = torch.zeros(m_sum + 1, dtype=torch.float32, device=device)
        row_weight.scatter_(0, sink.reshape(-1), topk_weights.float().reshape(-1))
        g_down = _masked_rows(valid, dout.index_select(0, rows) * row_weight[:m_sum].unsqueeze(1))
        g_down = g_down.to(torch.bfloat16)

        # d h = d down · W2_e  (input gradient: per-token g_down x W2ᵀ blocks [E, I, H])
        g_fp8, g_sf = per_token_cast_to_fp8(g_down)
        w2t_fp8, w2t_sf = _transpose_blocks(w2_fp8, w2_sf)
        g_h = torch.empty((m_sum, inter), dtype=torch.bfloat16, device=device)
        m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((g_fp8, g_sf), (w2t_fp8, w2t_sf), g_h, m_indices)

        g_gate_up, h = _swiglu_backward(gate_up, g_h)
        g_gate_up = _masked_rows(valid, g_gate_up).to(torch.bfloat16)

        if need_w2:  # dW2_e = d down_eᵀ · h_e over expert e's tokens (k-grouped 1D1D, fp32)
            h = _masked_rows(valid, h).to(torch.bfloat16)
            grad_w2 = _wgrad_into(g_down, h, padded_sizes, w2_main_grad, (num_experts, hidden_size, inter), device)
        if need_w13:  # dW13_e = d gate_upᵀ · x_e
            x_rows = _masked_rows(valid, hidden.index_select(0, rows))
            grad_w13 = _wgrad_into(g_gate_up, x_rows, padded_sizes, w13_main_grad,
                                   (num_experts, two_i, hidden_size), device)

        grad_hidden = None
        if need_hidden:  # d x rows = d gate_up · W13_e, summed over each token's slots (fp32, slot order)
            gu_fp8, gu_sf = per_token_cast_to_fp8(g_gate_up)
            w13t_fp8, w13t_sf = _transpose_blocks(w13_fp8, w13_sf)
            g_x = torch.empty((m_sum + 1, hidden_size), dtype=torch.bfloat16, device=device)
            g_x[m_sum].zero_()
            m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((gu_fp8, gu_sf), (w13t_fp8, w13t_sf), g_x[:m_sum], m_indices)
            ones = torch.ones((num_tokens, top_k), dtype=torch.float32, device=device)
            grad_hidden = combine(g_x, scatter, ones)
        return _moe_gradients(hidden=grad_hidden, topk_weights=grad_tw,
                              **_moe_weight_grads(ctx, need_w13, need_w2, grad_w13, grad_w2))


assert tuple(inspect.signature(_FP8MoEFunction.forward).parameters)[1:] == _MOE_INPUTS  # names = gradient slots


def _wgrad_into(dy, x, padded_sizes, main_grad, shape, device) -> torch.Tensor | None:
    """The k-grouped weight gradient: into ``main_grad`` in place (returns None) or a new fp32 tensor."""
    if main_grad is not None:
        _moe_weight_grad(dy, x, padded_sizes, main_grad, True)
        return None
    d = torch.empty(shape, dtype=torch.float32, device=device)
    _moe_weight_grad(dy, x, padded_sizes, d, False)
    return d


def _moe_weight_grads(ctx, need_w13, need_w2, grad_w13, grad_w2) -> dict:
    """``{"w13": ..., "w2": ...}``: what autograd receives for the master weights (``main_grad`` honoured)."""
    w13_main_grad, w2_main_grad = ctx.main_grads
    w13_dtype, w2_dtype, _ = ctx.dtypes
    w13, w2 = ctx.params
    return {"w13": _weight_grad_result(w13, w13_dtype, w13_main_grad, grad_w13) if need_w13 else None,
            "w2": _weight_grad_result(w2, w2_dtype, w2_main_grad, grad_w2) if need_w2 else None}


def _check_expert_weights(w13: object, w2: object, dtypes) -> tuple[int, int, int]:
    """Master (or frozen) expert weights ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` of ``dtypes``; returns ``(E, H, I)``."""
    check_tensor_of(w13, "w13", dtypes, 3)
    check_tensor_of(w2, "w2", dtypes, 3)
    return check_expert_shapes(w13, w2)


def fp8_moe(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
            w2: torch.Tensor, *, max_m_sum: int | None = None) -> torch.Tensor:
    """Routed SwiGLU experts with every GEMM of forward and backward in FP8: :func:`deep_fp8_gemm.moe.
    fp8_moe_forward` on master weights, differentiable.

    Args:
        hidden: ``[T, H]`` bfloat16.
        topk_ids: ``[T, top_k]`` integer, entries in ``[0, E)`` or -1 (a dropped slot: contributes nothing,
            gets zero gradient).
        topk_weights: ``[T, top_k]`` float32 / bfloat16 / float16.
        w13: ``[E, 2I, H]`` bfloat16 / float32 master weight (rows ``[0, I)`` gate W1, ``[I, 2I)`` up W3),
            quantised per expert in 128x128 blocks on every call.
        w2: ``[E, H, I]`` same dtype family, the down projection. ``H`` and ``I`` positive multiples of 16.
        max_m_sum: as :func:`deep_fp8_gemm.moe.fp8_moe_forward` (rows of the contiguous layout; None syncs
            once on a GPU in eager mode, the sync-free bound is used under ``torch.compile``).

    Returns:
        ``[T, H]`` bfloat16, bit for bit ``fp8_moe_forward(hidden, topk_ids, topk_weights, *quantised(w13),
        *quantised(w2))``.

    Gradients (all GEMMs FP8, see the module docstring): ``hidden`` (bf16; the input-gradient GEMMs with the
    transposed 128x128 blocks of W2 and W13, the SwiGLU backward in fp32 on the saved bf16 gate/up, the
    slots of a token summed in fp32), ``topk_weights`` (``<dout[t], FFN_e(x_t)>`` in fp32 with the forward's
    bf16 expert outputs; 0 for dropped slots), ``w13`` and ``w2`` (k-grouped 1D1D GEMM over each expert's
    tokens, fp32 accumulation; an expert that received no token gets exactly 0). ``main_grad`` buffers on
    ``w13`` / ``w2`` are honoured as in :func:`fp8_linear`. The backward reads the per-expert token counts
    back to the host once (inside the custom op ``deep_fp8_gemm::fp8_moe_weight_grad``).

    Raises:
        TypeError / ValueError: wrong dtypes, shapes or devices, expert ids out of range (CPU).
    """
    _check_expert_weights(w13, w2, PARAM_DTYPES)
    check_tokens(hidden, topk_ids, topk_weights, w13.shape[2], w13.device)
    main13 = _check_main_grad(w13, "w13") if w13.requires_grad else None
    main2 = _check_main_grad(w2, "w2") if w2.requires_grad else None
    return _FP8MoEFunction.apply(hidden, topk_weights, w13, w2, main13, main2, topk_ids,
                                 None, None, None, None, max_m_sum)


def fp8_moe_frozen(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                   w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                   max_m_sum: int | None = None) -> torch.Tensor:
    """:func:`fp8_moe` with already-quantised frozen experts (the buffers of :class:`deep_fp8_gemm.moe.FP8MoE`,
    same arguments as :func:`deep_fp8_gemm.moe.fp8_moe_forward`): gradients flow to ``hidden`` and
    ``topk_weights`` only."""
    check_weights(w13, w13_scale, w2, w2_scale)
    check_tokens(hidden, topk_ids, topk_weights, w13.shape[2], w13.device)
    return _FP8MoEFunction.apply(hidden, topk_weights, None, None, None, None, topk_ids,
                                 w13, w13_scale, w2, w2_scale, max_m_sum)
