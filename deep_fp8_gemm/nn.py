"""``FP8Linear``: a drop-in inference replacement for ``nn.Linear`` with an e4m3 weight.

The weight is quantised once (128x128 blocks, :func:`deep_fp8_gemm.per_block_cast_to_fp8`); each forward
quantises the activations per token (1x128, :func:`deep_fp8_gemm.per_token_cast_to_fp8`) and runs
:func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt` (fp32 accumulation, bf16 output), then adds the bias in fp32 and
rounds once more to bf16. CPU tensors use the exact reference GEMM; sm_90 CUDA tensors the JIT kernel. Traces
with ``torch.compile(fullgraph=True)`` (the quantiser and the GEMM are custom ops).

Training (``master_dtype=torch.float32`` or ``torch.bfloat16``): the layer holds high-precision master
parameters ``weight`` / ``bias`` (like ``nn.Linear``, same state-dict keys) instead of the e4m3 buffers and
runs :func:`deep_fp8_gemm.autograd.fp8_linear`: the weight is quantised on every call, forward, input gradient
and weight gradient are FP8 GEMMs, the weight gradient accumulates in fp32 (into ``weight.main_grad`` when the
parameter has one, Megatron-style). The inference layer (``master_dtype=None``, the default) computes exactly
what it did before; when its input requires grad (a frozen FP8 base layer) the input gradient is an FP8 GEMM
too (:func:`deep_fp8_gemm.autograd.fp8_linear_frozen`; needs ``out_features % 16 == 0``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .autograd import PARAM_DTYPES, fp8_linear, fp8_linear_frozen
from .ops import gemm_fp8_fp8_bf16_nt
from .quant import per_block_cast_to_fp8, per_token_cast_to_fp8

__all__ = ["FP8Linear", "FP8StateModule"]


class FP8StateModule(nn.Module):
    """A module whose own tensors keep their dtypes under dtype casts: ``module.to(torch.bfloat16)``,
    ``.half()``, ``.float()``, ``.double()``, ``.type(...)`` leave its e4m3 weights e4m3, its scales float32 and
    its other parameters and buffers (bf16 bias, master weights) in the dtype the constructor gave them, while
    device moves (``.to(device)``, ``.cuda()``, ``.cpu()``, the device part of ``.to(device, dtype)``) and every
    other conversion apply as usual. As TransformerEngine's and torchao's FP8 modules do: ``model.to(dtype)``
    after swapping FP8 layers into a model is the common case, and casting the FP8 state would break the next
    forward (an e4m3 weight cast to bf16 is no longer an FP8 GEMM operand; fp32 scales cast to fp16 lose bits).
    Child modules follow their own rules (an ``nn.Linear`` child is cast)."""

    def _apply(self, fn, recurse=True):
        own = {id(t) for t in (*self._parameters.values(), *self._buffers.values()) if t is not None}

        def keep_dtype(t):
            applied = fn(t)
            if id(t) in own and isinstance(applied, torch.Tensor) and applied.dtype != t.dtype:
                return t.to(device=applied.device)  # the dtype cast is dropped, the device move kept
            return applied

        return super()._apply(keep_dtype, recurse)


def _check_features(in_features: object, out_features: object) -> None:
    for value, name in ((in_features, "in_features"), (out_features, "out_features")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
        if value < 1:
            raise ValueError(f"{name} must be positive, got {name}={value}")
    if in_features % 16:
        raise ValueError(f"in_features must be a multiple of 16 (16-byte fp8 rows for TMA), got {in_features=}")
    if out_features % 8:
        raise ValueError(f"out_features must be a multiple of 8 (16-byte bf16 output rows), got {out_features=}")


def _check_master_dtype(master_dtype: object, out_features: int) -> None:
    if master_dtype is None:
        return
    if master_dtype not in PARAM_DTYPES:
        raise TypeError(f"master_dtype must be None, torch.float32 or torch.bfloat16, got {master_dtype!r}")
    if out_features % 16:
        raise ValueError(f"out_features must be a multiple of 16 for training (K of the input-gradient GEMM), "
                         f"got {out_features=}")


class FP8Linear(FP8StateModule):
    """``y = x · Wᵀ + b`` with ``W`` stored as e4m3 + 128x128 block scales.

    Args:
        in_features: ``K``, a multiple of 16.
        out_features: ``N``, a multiple of 8.
        bias: whether to hold an additive bias (``[N]`` bfloat16 parameter, ``requires_grad=False``).
        device: where the buffers live.
        master_dtype: None (inference, the buffers below) or ``torch.float32`` / ``torch.bfloat16``: a training
            layer with master parameters ``weight [N, K]`` and ``bias [N]`` of that dtype (``requires_grad=True``),
            forward = :func:`deep_fp8_gemm.autograd.fp8_linear` (``N`` a multiple of 16).

    Buffers / parameters (inference layer):
        weight_fp8: ``[N, K]`` float8_e4m3fn, contiguous (K-major).
        weight_scale: ``[ceil(N/128), ceil(K/128)]`` float32, contiguous.
        bias: ``[N]`` bfloat16 or None.

    A freshly constructed layer is initialised like ``nn.Linear`` (uniform in ``±1/sqrt(K)``) and quantised;
    :meth:`from_linear` converts a trained ``nn.Linear``. Dtype casts of the module (``model.to(torch.bfloat16)``,
    ``.half()``, ...) keep every tensor's dtype, device moves apply (:class:`FP8StateModule`); the state dict
    holds the e4m3 weight and fp32 scales as they are and loads back bit for bit.
    """

    master_dtype: torch.dtype | None = None  # None: the inference layer (e4m3 buffers)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 device: torch.device | str | None = None, master_dtype: torch.dtype | None = None):
        super().__init__()
        _check_features(in_features, out_features)
        _check_master_dtype(master_dtype, out_features)
        self.in_features, self.out_features = in_features, out_features
        self.master_dtype = master_dtype
        dtype = torch.bfloat16 if master_dtype is None else master_dtype
        bound = 1.0 / math.sqrt(in_features)
        weight = torch.empty((out_features, in_features), dtype=dtype, device=device).uniform_(-bound, bound)
        if master_dtype is None:
            self._set_weight(weight)
        else:
            self.weight = nn.Parameter(weight)
        if bias:
            b = torch.empty(out_features, dtype=dtype, device=device).uniform_(-bound, bound)
            self.bias = nn.Parameter(b, requires_grad=master_dtype is not None)
        else:
            self.register_parameter("bias", None)

    def _set_weight(self, weight: torch.Tensor) -> None:
        weight_fp8, weight_scale = per_block_cast_to_fp8(weight)
        self.register_buffer("weight_fp8", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, master_dtype: torch.dtype | None = None) -> FP8Linear:
        """Quantises ``linear.weight`` once (128x128 blocks); the bias is copied as bfloat16.

        With ``master_dtype`` (``torch.float32`` / ``torch.bfloat16``): a training layer whose master ``weight``
        and ``bias`` are copies of ``linear``'s in that dtype (nothing quantised ahead of time).
        The result lives on ``linear.weight``'s device. Raises ``TypeError`` for a non-``nn.Linear`` and
        ``ValueError`` for feature counts the kernels cannot take (``in % 16``, ``out % 8``; ``out % 16`` for
        training).
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        _check_features(linear.in_features, linear.out_features)
        _check_master_dtype(master_dtype, linear.out_features)
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.master_dtype = master_dtype
        if master_dtype is not None:
            with torch.no_grad():
                module.weight = nn.Parameter(linear.weight.detach().to(master_dtype).clone())
                bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(master_dtype).clone())
            module.register_parameter("bias", bias)
            return module
        with torch.no_grad():
            module._set_weight(linear.weight.detach())
            if linear.bias is not None:
                module.bias = nn.Parameter(linear.bias.detach().to(torch.bfloat16).clone(), requires_grad=False)
            else:
                module.register_parameter("bias", None)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., K]`` bfloat16 or float16 (any leading dims, any strides) -> ``[..., N]`` of x's dtype, a new
        tensor.

        ``y = dtype(bf16(dequant(per_token(x)) · dequant(W)ᵀ) + b)``: x quantised per token as it is (an fp16 input
        is not rounded to bf16 first), the GEMM output rounded to bf16, the bias added in fp32, one rounding to x's
        dtype (an fp16 output: values beyond 65504 become ±inf, as ``nn.Linear`` in fp16 would give; the layer's
        e4m3 weights stay e4m3 after ``.half()``, :class:`FP8StateModule`). A training layer (``master_dtype``) runs :func:`deep_fp8_gemm.autograd.fp8_linear`
        on its master weight (the same values for the same weight); an inference layer whose input (or bias)
        requires grad runs :func:`deep_fp8_gemm.autograd.fp8_linear_frozen` (the same values, with an FP8 input
        gradient).
        """
        if self.master_dtype is not None:
            return fp8_linear(x, self.weight, self.bias)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"x must be bfloat16 or float16, got x.dtype={x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must be [..., in_features={self.in_features}], got x.shape={tuple(x.shape)}")
        if x.device != self.weight_fp8.device:
            raise ValueError(f"x is on {x.device} but the layer's weight is on {self.weight_fp8.device}")
        if torch.is_grad_enabled() and (x.requires_grad or (self.bias is not None and self.bias.requires_grad)):
            if x.dtype != torch.bfloat16:
                raise TypeError(f"x must be bfloat16 when it requires grad (the FP8 input gradient is bf16), got "
                                f"x.dtype={x.dtype}")
            return fp8_linear_frozen(x, self.weight_fp8, self.weight_scale, self.bias)
        leading = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        out = torch.empty((x2.shape[0], self.out_features), dtype=torch.bfloat16, device=x.device)
        if x2.shape[0] > 0:
            x_fp8, x_scales = per_token_cast_to_fp8(x2)
            gemm_fp8_fp8_bf16_nt((x_fp8, x_scales), (self.weight_fp8, self.weight_scale), out)
            if self.bias is not None:
                out = (out.float() + self.bias.float()).to(x.dtype)
        return out.to(x.dtype).view(*leading, self.out_features)

    def extra_repr(self) -> str:
        master = "" if self.master_dtype is None else f", master_dtype={self.master_dtype}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{master}"
