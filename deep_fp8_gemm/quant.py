"""FP8 (e4m3) quantisation with DeepSeek-V3's fine-grained scales.

* :func:`per_token_cast_to_fp8` — activations: one fp32 scale per row per 128 K-elements ("1x128"), or per 32
  (``gran_k=32``: DeepSeek-V4.1's 1x32 recipe, the A operand of ``gemm_fp8_fp8_bf16_nt_block32``).
* :func:`per_block_cast_to_fp8` — weights: one fp32 scale per 128x128 block (``gran_k=32``: per 32x32 block).
* :func:`per_channel_cast_to_fp8` — one fp32 scale per column per 128 (or 32) rows (the reference design's helper).

``use_ue8m0=True`` (all three) rounds every scale up to a power of two, :func:`ceil_to_ue8m0` (the
reference design's UE8M0 recipe; on Hopper the GEMMs read such scales as ordinary fp32 values).

* :func:`silu_mul_quant` — the middle of a SwiGLU expert: ``SiLU(gate) * up`` quantised per token.

They are ``torch.library`` custom ops (``torch.ops.deep_fp8_gemm.*``, registered at the bottom of this module) so
that ``torch.compile(fullgraph=True)`` traces them as single nodes. Where they run is the quantisers' backend
policy (``runtime.target.backend_of(device, "quant")``): the fused kernels of ``deep_fp8_gemm.kernels.quant`` on
an sm_90 GPU, the same kernels in the CPU simulator for CPU tensors under ``DFG_SIMULATE``, and everywhere else
the plain-torch implementation below, whose float32 arithmetic is the definition of the result (the kernels
give identical bits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._core import plans
from ._core.checks import check_bool
from ._core.family import register_op
from .constants import AMAX_FLOOR, FP8_E4M3_MAX, GRAN_K
from .kernels import quant as quant_host
from .runtime import target
from .runtime.target import Backend
from .utils import ceil_div, empty_m_major, get_col_major_tma_aligned_tensor

#: Elements per scale group along K (and along N for weight blocks): :data:`deep_fp8_gemm.constants.GRAN_K`.
GROUP = GRAN_K
#: The scale-group sizes the quantisers offer (``gran_k``): DeepSeek-V3's 128 and the 1x32 / 32x32 recipe's 32.
GRAN_KS = (GRAN_K, 32)

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_input(x: object, name: str) -> None:
    """A 2-D bf16 / fp16 / fp32 tensor with at least one column (the per-token and per-block quantisers)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {name}.dtype={x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got {name}.shape={tuple(x.shape)}")
    if x.size(1) <= 0:
        raise ValueError(f"{name} must have at least one column, got {name}.shape={tuple(x.shape)}")


def ceil_to_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(|scale|))`` of a float32 tensor, exactly, from the bit pattern: the exponent field plus
    one when any mantissa bit is set, clamped to ``[1, 254]`` (a finite normal; NaN / inf become ``2^127``).

    No floating-point ``log2`` / ``pow`` is involved, so the result is exact for every input (``amax / 448``
    scales are >= 1e-4 / 448, always normal). Same arithmetic as ``dfg::quant::ceil_to_ue8m0`` in the fused
    kernels.
    """
    bits = scale.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent.clamp_(1, 254) << 23).view(torch.float32).view(scale.shape)


def _check_x(x: torch.Tensor) -> None:
    check_input(x, "x")


def _check_w(w: torch.Tensor) -> None:
    check_input(w, "w")


def _quantise_groups(groups: torch.Tensor, scale: torch.Tensor, reciprocal: bool = False) -> torch.Tensor:
    """``groups / scale`` (``reciprocal``: ``groups * fl(1 / scale)``) in float32, saturated to ±448, rounded to
    e4m3 (nearest even).

    torch's float8 cast does not saturate (out-of-range values become NaN), hence the clamp. The reciprocal is an
    IEEE float32 division by a tensor of ``scale``'s device and shape (one per group, as the FP8-output epilogue
    takes it), which no device turns into an approximation (see :func:`_amax_to_scale`).
    """
    quotient = groups * (torch.ones_like(scale) / scale) if reciprocal else groups / scale
    return quotient.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def _amax_to_scale(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` as an IEEE float32 division on every device, like the fused kernels.

    The divisor is a tensor of ``amax``'s device and shape: with the Python float ``448.0`` ATen's CUDA
    kernel multiplies by ``1/448`` instead (a CPU-scalar divisor; BinaryDivTrueKernel.cu), which puts
    about half of all scales 1 ulp off. tests/ops/test_quant.py pins this operation.
    """
    return amax / torch.full_like(amax, FP8_E4M3_MAX)


def per_token_cast_to_fp8_torch(x: torch.Tensor, use_ue8m0: bool = False, group: int = GROUP, *,
                                reciprocal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch :func:`per_token_cast_to_fp8` (any device; ``group`` 128 or 32 elements per scale); the scales
    come back row-major ``[m, kb]``.

    ``reciprocal=True`` is the FP8-output GEMM epilogue's rule (``epilogue_fp8.cuh``; the reference design's
    ``x * (1.0 / sf)``): the same scales, and ``x_fp8 = e4m3(clamp(x * fl(1 / scale), ±448))`` with ``fl(1 / scale)``
    one IEEE float32 reciprocal per group. It differs from the division by one e4m3 step where ``x / scale`` lies
    within a float32 rounding of an e4m3 rounding tie: about 5e-7 of the codes of float32 normal data, ~0.05% where
    the values carry few mantissa bits (bf16-valued data), never with ``use_ue8m0`` (power-of-two scales make the two
    exact).
    """
    m, k = x.shape
    kb = ceil_div(k, group)
    padded = F.pad(x.float(), (0, kb * group - k))  # zero padding never raises an amax
    groups = padded.view(m, kb, group)
    scale = _amax_to_scale(groups.abs().amax(dim=-1).clamp_min_(AMAX_FLOOR))  # [m, kb]
    if use_ue8m0:
        scale = ceil_to_ue8m0(scale)
    x_fp8 = _quantise_groups(groups, scale.unsqueeze(-1), reciprocal).view(m, kb * group)[:, :k].contiguous()
    return x_fp8, scale


def per_block_cast_to_fp8_torch(w: torch.Tensor, use_ue8m0: bool = False, group: int = GROUP
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch :func:`per_block_cast_to_fp8` (any device; ``group`` x ``group`` blocks, 128 or 32)."""
    n, k = w.shape
    nb, kb = ceil_div(n, group), ceil_div(k, group)
    padded = F.pad(w.float(), (0, kb * group - k, 0, nb * group - n))
    blocks = padded.view(nb, group, kb, group)
    scale = _amax_to_scale(blocks.abs().amax(dim=(1, 3)).clamp_min_(AMAX_FLOOR))  # [nb, kb]
    if use_ue8m0:
        scale = ceil_to_ue8m0(scale)
    w_fp8 = _quantise_groups(blocks, scale.view(nb, 1, kb, 1)).view(nb * group, kb * group)[:n, :k].contiguous()
    return w_fp8, scale


def kernel_launcher(t: torch.Tensor):
    """The launch function of the fused quantisation kernels for ``t``'s device (``kernels.quant.launch_cuda`` or
    ``launch_sim``), or None where the plain-torch implementation runs (the quantisers' backend policy)."""
    backend = target.backend_of(t.device, "quant")
    return None if backend is Backend.TORCH else quant_host.launcher_for(backend)


def _per_token_impl(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(x, "x")
    launch = kernel_launcher(x)
    if launch is not None:
        return quant_host.run_per_token(x, quant_host.QuantKind.PER_TOKEN, "x", launch, ue8m0=use_ue8m0)
    x_fp8, scales = per_token_cast_to_fp8_torch(x, use_ue8m0)
    return x_fp8, get_col_major_tma_aligned_tensor(scales)


def _per_token_32_impl(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(x, "x")
    launch = kernel_launcher(x)
    if launch is not None:
        return quant_host.run_per_token(x, quant_host.QuantKind.PER_TOKEN_32, "x", launch, ue8m0=use_ue8m0)
    x_fp8, scales = per_token_cast_to_fp8_torch(x, use_ue8m0, 32)
    return x_fp8, get_col_major_tma_aligned_tensor(scales)


def _per_block_32_impl(w: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """32x32 weight blocks: plain torch on every device (a checkpoint conversion, off the hot path; no fused
    kernel)."""
    check_input(w, "w")
    w_fp8, scales = per_block_cast_to_fp8_torch(w, use_ue8m0, 32)
    return w_fp8, scales.contiguous()


def _per_block_impl(w: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(w, "w")
    launch = kernel_launcher(w)
    if launch is not None:
        return quant_host.run_per_block(w, launch, ue8m0=use_ue8m0)
    w_fp8, scales = per_block_cast_to_fp8_torch(w, use_ue8m0)
    return w_fp8, scales.contiguous()


_per_token_eager = plans.quantiser("per_token", _check_x, _per_token_impl)
_per_block_eager = plans.quantiser("per_block", _check_w, _per_block_impl)
_per_token_32_eager = plans.quantiser("per_token_32", _check_x, _per_token_32_impl)


def _per_token_fake(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(x, "x")
    m, k = x.shape
    return x.new_empty((m, k), dtype=torch.float8_e4m3fn), empty_m_major((m, ceil_div(k, GROUP)), x.device)


def _per_block_fake(w: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(w, "w")
    n, k = w.shape
    return w.new_empty((n, k), dtype=torch.float8_e4m3fn), w.new_empty(
        (ceil_div(n, GROUP), ceil_div(k, GROUP)), dtype=torch.float32
    )


def _per_token_32_fake(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(x, "x")
    m, k = x.shape
    return x.new_empty((m, k), dtype=torch.float8_e4m3fn), empty_m_major((m, ceil_div(k, 32)), x.device)


def _per_block_32_fake(w: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_input(w, "w")
    n, k = w.shape
    return w.new_empty((n, k), dtype=torch.float8_e4m3fn), w.new_empty((ceil_div(n, 32), ceil_div(k, 32)),
                                                                       dtype=torch.float32)


def per_token_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise activations to e4m3 with one scale per row per 128 (or 32) K-elements.

    Args:
        x: ``[m, k]`` bfloat16 / float16 / float32, any strides, CPU or CUDA; ``k >= 1``, ``m >= 0``.
        use_ue8m0: round every scale up to a power of two (:func:`ceil_to_ue8m0`), as the reference
            design's ``per_token_cast_to_fp8(x, use_ue8m0)`` (positional or keyword).
        gran_k: K-elements per scale, 128 or 32 (the 1x32 recipe: ``sA`` of :func:`gemm_fp8_fp8_bf16_nt_block32`;
            a fused kernel of its own on sm_90); anything else ``ValueError``.
        use_packed_ue8m0: the reference's SM100-only int32-packed scales: ``NotImplementedError`` if True.

    Returns:
        ``(x_fp8, scales)``: ``x_fp8`` ``[m, k]`` float8_e4m3fn, contiguous; ``scales`` ``[m, ceil(k/gran_k)]``
        float32 in the M-major TMA-aligned layout of :func:`get_col_major_tma_aligned_tensor`
        (strides ``(1, get_tma_aligned_size(m, 4))``), i.e. ready to be ``sA`` of a GEMM without a copy.

    For each row ``r`` and group ``j`` (columns ``[gj, gj+g)``, ``g = gran_k``; a partial last group is treated as
    zero-padded): ``amax = max(max|x[r, group]|, 1e-4)``, ``scales[r, j] = amax / 448`` and
    ``x_fp8[r, c] = e4m3(clamp(x[r, c] / scales[r, j], -448, 448))`` (round to nearest even), all in float32
    (with ``use_ue8m0`` the scale is ``ceil_to_ue8m0(amax / 448)``). Dequantisation is ``x_fp8.float() *
    scales`` per group. Non-finite inputs, as the reference design's casts: a NaN makes its group's scale and
    codes NaN; an inf makes the scale inf, the group's finite elements 0 and the inf element NaN; with
    ``use_ue8m0`` the scale becomes ``2^127``, finite elements 0, NaN stays NaN, inf saturates to ±448
    (docs/api.md, "Errors and non-finite values"; ``tests/ops/test_nonfinite.py``).
    """
    if type(use_ue8m0) is bool and type(gran_k) is int and gran_k in GRAN_KS and use_packed_ue8m0 is False:
        # eager: cached checks (deep_fp8_gemm._core.plans)
        result = (_per_token_eager if gran_k == GROUP else _per_token_32_eager)(x, use_ue8m0)
        if result is not None:
            return result
    check_input(x, "x")
    check_sm100_options(gran_k, use_packed_ue8m0)
    op = torch.ops.deep_fp8_gemm.per_token_cast_to_fp8 if gran_k == GROUP else torch.ops.deep_fp8_gemm.per_token_cast_to_fp8_1x32
    return op.default(x, check_bool(use_ue8m0, "use_ue8m0"))


def per_block_cast_to_fp8(
    w: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise weights to e4m3 with one scale per 128x128 (or 32x32) block.

    Args:
        w: ``[n, k]`` bfloat16 / float16 / float32, any strides, CPU or CUDA; ``k >= 1``, ``n >= 0``.
        use_ue8m0: power-of-two scales (:func:`ceil_to_ue8m0`), positional or keyword as in the reference.
        gran_k: block edge, 128 or 32 (the 32x32 recipe's ``sB``; plain torch on every device, a checkpoint
            conversion); anything else ``ValueError``.

    Returns:
        ``(w_fp8, scales)``: ``w_fp8`` ``[n, k]`` float8_e4m3fn, contiguous; ``scales``
        ``[ceil(n/gran_k), ceil(k/gran_k)]`` float32, contiguous.

    Same arithmetic as :func:`per_token_cast_to_fp8` with the amax taken over each block (partial edge blocks
    treated as zero-padded).
    """
    if type(use_ue8m0) is bool and type(gran_k) is int and gran_k == GROUP:
        result = _per_block_eager(w, use_ue8m0)  # eager: cached checks (deep_fp8_gemm._core.plans)
        if result is not None:
            return result
    check_input(w, "w")
    check_sm100_options(gran_k, False)
    op = torch.ops.deep_fp8_gemm.per_block_cast_to_fp8 if gran_k == GROUP else torch.ops.deep_fp8_gemm.per_block_cast_to_fp8_32x32
    return op.default(w, check_bool(use_ue8m0, "use_ue8m0"))


def check_sm100_options(gran_k: object, use_packed_ue8m0: object) -> None:
    """``gran_k`` must be 128 or 32 (:data:`GRAN_KS`) and ``use_packed_ue8m0`` False (the reference design's
    SM100-only packed scales: ``NotImplementedError``)."""
    if isinstance(gran_k, bool) or not isinstance(gran_k, int):
        raise TypeError(f"gran_k must be an int, got {type(gran_k).__name__} ({gran_k!r})")
    if gran_k not in GRAN_KS:
        raise ValueError(f"gran_k must be one of {GRAN_KS} (DeepSeek-V3's 1x128 / 128x128 recipe or the 1x32 / 32x32 "
                         f"one), got gran_k={gran_k}")
    if check_bool(use_packed_ue8m0, "use_packed_ue8m0"):
        raise NotImplementedError(
            "use_packed_ue8m0=True: int32-packed UE8M0 scales are read only by the reference design's SM100 "
            "kernels; on Hopper use use_ue8m0=True (power-of-two fp32 scales)"
        )


def per_channel_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise with one scale per column per 128 rows (the reference design's ``per_channel_cast_to_fp8``).

    Args:
        x: ``[m, n]`` bfloat16 / float16 / float32, any strides, any device, ``m % gran_k == 0``.
        use_ue8m0: power-of-two scales (:func:`ceil_to_ue8m0`).
        gran_k: rows per scale, 128 or 32.

    Returns:
        ``(x_fp8, scales)``: ``x_fp8`` ``[m, n]`` float8_e4m3fn, contiguous; ``scales`` ``[m / gran_k, n]``
        float32, contiguous; ``scales[i, c] = max(max|x[gi:gi+g, c]|, 1e-4) / 448`` (``g = gran_k``) and
        ``x_fp8[r, c] = e4m3(clamp(x[r, c] / scales[r // g, c], -448, 448))`` in float32. Plain torch on
        every device (no fused kernel: it prepares operands of the weight-gradient recipe, off the hot path).
    """
    check_input(x, "x")
    check_sm100_options(gran_k, False)
    use_ue8m0 = check_bool(use_ue8m0, "use_ue8m0")
    m, n = x.shape
    if m % gran_k != 0:
        raise ValueError(f"x must have a multiple of {gran_k} rows for per-channel scales, got x.shape={tuple(x.shape)}")
    groups = x.float().reshape(m // gran_k, gran_k, n)
    scale = _amax_to_scale(groups.abs().amax(dim=1).clamp_min_(AMAX_FLOOR))  # [m / gran_k, n]
    if use_ue8m0:
        scale = ceil_to_ue8m0(scale)
    x_fp8 = _quantise_groups(groups, scale.unsqueeze(1)).reshape(m, n).contiguous()
    return x_fp8, scale.contiguous()


# ---------------------------------------------------------------------------------------------- SiLU·mul + quant
def silu_mul_quant_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch :func:`silu_mul_quant`: the definition of the result (fp32 arithmetic)."""
    half = x.shape[-1] // 2
    y = F.silu(x[..., :half].float()) * x[..., half:].float()
    if x.dim() == 2:
        y_fp8, scales = per_token_cast_to_fp8_torch(y)
        return y_fp8, get_col_major_tma_aligned_tensor(scales)
    batch, m = x.shape[0], x.shape[1]
    y_fp8, scales = per_token_cast_to_fp8_torch(y.reshape(batch * m, half))
    return y_fp8.view(batch, m, half), get_col_major_tma_aligned_tensor(scales.view(batch, m, -1))


def _check_silu_input(x: torch.Tensor) -> None:
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got x.dtype={x.dtype}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [m, 2I] or [G, m, 2I], got x.shape={tuple(x.shape)}")
    if x.shape[-1] == 0 or x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be 2I with I >= 1 (gate | up), got x.shape={tuple(x.shape)}")


def _silu_mul_quant_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_silu_input(x)
    launch = kernel_launcher(x)
    if launch is not None:
        return quant_host.run_per_token(x, quant_host.QuantKind.SILU_MUL_PER_TOKEN, "x", launch)
    return silu_mul_quant_torch(x)


def _silu_mul_quant_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_silu_input(x)
    half = x.shape[-1] // 2
    shape = (*x.shape[:-1], half)
    scale_shape = (*x.shape[:-1], ceil_div(half, GROUP))
    return x.new_empty(shape, dtype=torch.float8_e4m3fn), empty_m_major(scale_shape, x.device)


_silu_eager = plans.quantiser("silu", _check_silu_input, _silu_mul_quant_impl)


def silu_mul_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``SiLU(gate) * up`` quantised per token: the middle of a SwiGLU expert.

    Args:
        x: ``[m, 2I]`` (or ``[G, m, 2I]``) bfloat16 / float16 / float32, CPU or CUDA; columns ``[0, I)`` gate,
            ``[I, 2I)`` up (the output of the ``w13`` GEMM).

    Returns:
        ``(y_fp8, scales)``: ``y_fp8`` ``[m, I]`` (``[G, m, I]``) float8_e4m3fn, contiguous; ``scales``
        ``[m, ceil(I/128)]`` (``[G, m, ceil(I/128)]``) float32 in the M-major TMA-aligned layout, ready to be
        ``sA`` of the next GEMM. Values: ``per_token_cast_to_fp8(F.silu(gate.float()) * up.float())``, in fp32.
        On sm_90 one fused kernel (``y`` is never written to memory); elsewhere plain torch.
    """
    result = _silu_eager(x)  # eager: checks cached (deep_fp8_gemm._core.plans)
    if result is not None:
        return result
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _check_silu_input(x)
    return torch.ops.deep_fp8_gemm.silu_mul_quant.default(x)


register_op("per_token_cast_to_fp8", "(Tensor x, bool use_ue8m0=False) -> (Tensor, Tensor)", _per_token_impl,
            _per_token_fake)
register_op("per_block_cast_to_fp8", "(Tensor w, bool use_ue8m0=False) -> (Tensor, Tensor)", _per_block_impl,
            _per_block_fake)
register_op("silu_mul_quant", "(Tensor x) -> (Tensor, Tensor)", _silu_mul_quant_impl, _silu_mul_quant_fake)
register_op("per_token_cast_to_fp8_1x32", "(Tensor x, bool use_ue8m0=False) -> (Tensor, Tensor)", _per_token_32_impl,
            _per_token_32_fake)
register_op("per_block_cast_to_fp8_32x32", "(Tensor w, bool use_ue8m0=False) -> (Tensor, Tensor)",
            _per_block_32_impl, _per_block_32_fake)
