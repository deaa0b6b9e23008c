"""The reference design's casts bit for bit, the casts part of :mod:`deep_fp8_gemm.compat` (what the ``deep_gemm``
drop-in's ``deep_gemm.utils`` exports).

DeepGEMM 2.6.1's ``per_token_cast_to_fp8`` / ``per_block_cast_to_fp8`` / ``per_channel_cast_to_fp8`` /
``per_custom_dims_cast_to_fp8`` (``deep_gemm/utils/math.py``) compute, per scale group, ``amax = max(max|x|,
1e-4)``, ``sf = amax / 448.0`` and ``x_fp8 = e4m3(x * (1.0 / sf))``: a multiply by a reciprocal where
:mod:`deep_fp8_gemm.quant` divides (``x / sf``). The scales agree, but about 0.05% of e4m3 codes differ by one
step. ATen also makes the reference's own bits device-dependent: ``tensor / 448.0`` (a Python-float divisor)
is a true division on a CPU and a multiply by ``fl(1/448)`` on CUDA (``BinaryDivTrueKernel.cu``), which puts
about half of all scales one ulp apart. So these functions follow the reference on each device:

* CPU tensors, and CUDA tensors on a GPU without the fused kernels: the reference's own sequence of ATen ops
  (so the CPU sequence on a CPU, the CUDA sequence on CUDA, exactly as the reference computes there);
* an sm_90 GPU, and CPU tensors under ``DFG_SIMULATE=1`` (the simulator stands in for the GPU): the fused
  per-token / per-block kernels' ``Numerics.DEEP_GEMM_CUDA`` variant (``kDeepGemmCuda`` in ``quant.cuh``):
  ``sf = amax * fl(1/448)``, ``x * fl(1 / sf)``, i.e. the reference's CUDA sequence. ``per_channel`` and
  ``per_custom_dims`` have no fused kernel and run the ATen sequence everywhere.

The e4m3 cast is torch's ``.to(torch.float8_e4m3fn)`` (round to nearest even; with the pinned torch 2.13 it
saturates: finite overflow and ±inf become ±448, NaN stays NaN), which the fused kernels' ``cvt.rn.satfinite``
matches. :mod:`deep_fp8_gemm.quant` clamps to ±448 before its cast and the reference does not: on finite inputs
the quotient never exceeds 448 by more than a rounding step, so the two give the same code at the boundary
(448), and an infinite quotient (an inf input under ``use_ue8m0``) gives 448 either way with this torch.

Non-finite inputs, as the reference: a NaN makes its group's scale and every code of the group NaN; an inf makes
the scale inf, the group's finite elements code 0 and the inf element NaN (``inf * 0``); with ``use_ue8m0`` a
NaN / inf scale becomes ``2^127`` (the exponent clamp of ``ceil_to_ue8m0``), the finite elements code 0, a NaN
element NaN and an inf element ±448.

Returned layouts are the reference's: scales row-major contiguous (``[m, ceil(k/gran_k)]``, not the M-major layout
of :func:`deep_fp8_gemm.per_token_cast_to_fp8`; the GEMMs accept either). ``deep_fp8_gemm``'s own quantisers
keep their device-independent IEEE division (``tests/ops/test_quant.py::test_torch_path_divides_by_tensors_only``).
"""

from __future__ import annotations

import torch

from .._core.checks import check_bool
from ..constants import AMAX_FLOOR, FP8_E4M3_MAX, GRAN_K
from ..kernels import quant as quant_host
from ..quant import ceil_to_ue8m0 as _ceil_to_ue8m0_f32
from ..quant import check_input, check_sm100_options, kernel_launcher
from ..utils import ceil_div

_NUMERICS = quant_host.Numerics.DEEP_GEMM_CUDA


def _scale(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    """``amax / 448.0`` with a Python-float divisor (ATen's device-dependent arithmetic, as the reference),
    then ``_ceil_to_ue8m0_f32(|sf|)`` for UE8M0 scales."""
    sf = amax / FP8_E4M3_MAX
    return _ceil_to_ue8m0_f32(sf.abs()) if use_ue8m0 else sf


def _check_gran_k(gran_k: object) -> int:
    """The reference's casts take any group size (its torch code): a positive int."""
    if isinstance(gran_k, bool) or not isinstance(gran_k, int):
        raise TypeError(f"gran_k must be an int, got {type(gran_k).__name__} ({gran_k!r})")
    if gran_k <= 0:
        raise ValueError(f"gran_k must be positive, got gran_k={gran_k}")
    return gran_k


def per_token_cast_to_fp8_torch(x: torch.Tensor, use_ue8m0: bool, gran_k: int = GRAN_K
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ATen sequence of :func:`per_token_cast_to_fp8` on ``x``'s device."""
    m, k = x.shape
    padded_k = ceil_div(k, gran_k) * gran_k
    padded = x.new_zeros((m, padded_k))
    padded[:, :k] = x
    view = padded.view(m, padded_k // gran_k, gran_k)
    sf = _scale(view.abs().float().amax(dim=2).clamp(AMAX_FLOOR), use_ue8m0)
    x_fp8 = (view * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, padded_k)[:, :k].contiguous()
    return x_fp8, sf


def per_block_cast_to_fp8_torch(x: torch.Tensor, use_ue8m0: bool, gran_k: int = GRAN_K
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ATen sequence of :func:`per_block_cast_to_fp8` on ``x``'s device."""
    m, n = x.shape
    padded = x.new_zeros((ceil_div(m, gran_k) * gran_k, ceil_div(n, gran_k) * gran_k))
    padded[:m, :n] = x
    view = padded.view(-1, gran_k, padded.size(1) // gran_k, gran_k)
    sf = _scale(view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(AMAX_FLOOR), use_ue8m0)
    x_fp8 = (view * (1.0 / sf)).to(torch.float8_e4m3fn)
    return x_fp8.view_as(padded)[:m, :n].contiguous(), sf.view(view.size(0), view.size(2))


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``per_token_cast_to_fp8``: one scale per row per ``gran_k`` K-elements, its bits on each
    device.

    Args:
        x: ``[m, k]`` bfloat16 / float16 / float32, any strides, ``k >= 1``.
        use_ue8m0: required, as in the reference (positional or keyword): power-of-two scales.
        gran_k: any positive group size, as the reference's torch code (128 and 32, the 1x32 recipe SGLang runs
            for DeepSeek-V4.1, have fused kernels; others run the ATen sequence on every device).
        use_packed_ue8m0: False (True, the SM100 int32 packing: ``NotImplementedError``).

    Returns:
        ``(x_fp8 [m, k] float8_e4m3fn contiguous, sf [m, ceil(k/gran_k)] float32 contiguous)``; see the module
        docstring for the arithmetic per device and for non-finite inputs.
    """
    check_input(x, "x")
    gran_k = _check_gran_k(gran_k)
    if check_bool(use_packed_ue8m0, "use_packed_ue8m0"):
        check_sm100_options(GRAN_K, True)  # NotImplementedError: the SM100 packing
    use_ue8m0 = check_bool(use_ue8m0, "use_ue8m0")
    launch = kernel_launcher(x) if gran_k in (GRAN_K, 32) else None
    if launch is None:
        return per_token_cast_to_fp8_torch(x, use_ue8m0, gran_k)
    kind = quant_host.QuantKind.PER_TOKEN if gran_k == GRAN_K else quant_host.QuantKind.PER_TOKEN_32
    x_fp8, sf = quant_host.run_per_token(x, kind, "x", launch, ue8m0=use_ue8m0, numerics=_NUMERICS)
    return x_fp8, sf.contiguous()


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``per_block_cast_to_fp8``: one scale per ``gran_k`` x ``gran_k`` block, its bits on each
    device.

    ``x`` ``[n, k]`` (partial edge blocks zero-padded) -> ``(x_fp8 [n, k] contiguous, sf [ceil(n/gran_k),
    ceil(k/gran_k)] contiguous)``; ``use_ue8m0`` required; any positive ``gran_k`` (128: the fused kernel on
    sm_90; others the ATen sequence on every device).
    """
    check_input(x, "x")
    gran_k = _check_gran_k(gran_k)
    use_ue8m0 = check_bool(use_ue8m0, "use_ue8m0")
    launch = kernel_launcher(x) if gran_k == GRAN_K else None
    if launch is None:
        return per_block_cast_to_fp8_torch(x, use_ue8m0, gran_k)
    return quant_host.run_per_block(x, launch, ue8m0=use_ue8m0, numerics=_NUMERICS)


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``per_channel_cast_to_fp8``: one scale per column per ``gran_k`` rows (ATen on every device).

    ``x`` ``[m, n]``, ``m % gran_k == 0`` -> ``(x_fp8 [m, n] contiguous, sf [m / gran_k, n] contiguous)``.
    """
    check_input(x, "x")
    gran_k = _check_gran_k(gran_k)
    use_ue8m0 = check_bool(use_ue8m0, "use_ue8m0")
    m, n = x.shape
    if m % gran_k:
        raise ValueError(f"x must have a multiple of {gran_k} rows for per-channel scales, got x.shape={tuple(x.shape)}")
    view = x.reshape(-1, gran_k, n)
    sf = _scale(view.abs().float().amax(dim=1).view(-1, n).clamp(AMAX_FLOOR), use_ue8m0)
    return (view * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(m, n), sf


def per_custom_dims_cast_to_fp8(x: torch.Tensor, dims: tuple[int, ...], use_ue8m0: bool
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``per_custom_dims_cast_to_fp8``: one scale per index of the kept ``dims`` (the amax runs
    over every other dim), ATen on every device. Returns ``(x_fp8 of x's shape, sf.squeeze())``."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x must be a bfloat16, float16 or float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"dims must be a tuple of ints, got {dims!r}")
    use_ue8m0 = check_bool(use_ue8m0, "use_ue8m0")
    kept = set(dims)  # as the reference: a negative dim matches no dim
    excluded = tuple(i for i in range(x.dim()) if i not in kept)
    sf = _scale(x.abs().float().amax(dim=excluded, keepdim=True).clamp(AMAX_FLOOR), use_ue8m0)
    return (x * (1.0 / sf)).to(torch.float8_e4m3fn), sf.squeeze()


def align(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y`` (the reference's ``deep_gemm.utils.align``)."""
    return ceil_div(x, y) * y


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(|x|))`` as float32, exactly (exponent field plus one when any mantissa bit is set, clamped to
    ``[1, 254]``): the reference's UE8M0 rounding (``deep_gemm.utils.ceil_to_ue8m0``)."""
    return _ceil_to_ue8m0_f32(x.abs().float())


#: e2m1 rounding boundaries (midpoints of 0, 0.5, 1, 1.5, 2, 3, 4, 6): a magnitude above the i-th takes code i + 1,
#: so a tie rounds toward zero (the reference's comparisons are strict), not to even.
_E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 32,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 per token: one scale per row per ``gran_k`` K-elements (``amax / 6``, UE8M0-rounded with
    ``use_ue8m0``), values ``x * (1 / sf)`` rounded to e2m1 with ties toward zero, -0 written as +0, NaN as 0.

    Args:
        x: ``[m, k]`` bfloat16 / float16 / float32, ``k`` even.
        use_ue8m0: power-of-two scales (MXFP4 checkpoints: True).
        gran_k: positive group size (32 for MXFP4); K is zero-padded to a multiple of it for the scales.
        use_packed_ue8m0: False (True, the SM100 int32 packing: ``NotImplementedError``).

    Returns:
        ``(codes [m, k/2] int8 contiguous, two e2m1 codes per byte with K index 2j in the low nibble,
        sf [m, ceil(k/gran_k)] float32)``.
    """
    check_input(x, "x")
    gran_k = _check_gran_k(gran_k)
    use_ue8m0 = check_bool(use_ue8m0, "use_ue8m0")
    if check_bool(use_packed_ue8m0, "use_packed_ue8m0"):
        check_sm100_options(GRAN_K, True)  # NotImplementedError: the SM100 packing
    m, k = x.shape
    if k % 2 != 0:
        raise ValueError(f"x must have an even number of columns (two e2m1 codes per byte), got {k=}")
    padded_k = ceil_div(k, gran_k) * gran_k
    padded = x.new_zeros((m, padded_k))
    padded[:, :k] = x
    view = padded.view(m, padded_k // gran_k, gran_k)
    sf = view.abs().float().amax(dim=2).clamp_min(AMAX_FLOOR) / 6.0
    if use_ue8m0:
        sf = _ceil_to_ue8m0_f32(sf)
    scaled = view * (1.0 / sf.unsqueeze(2))
    mag = scaled.abs()
    code = torch.zeros(scaled.shape, dtype=torch.uint8, device=x.device)
    for boundary in _E2M1_BOUNDARIES:
        code += (mag > boundary).to(torch.uint8)
    code |= ((scaled < 0) & (code != 0)).to(torch.uint8) << 3
    pairs = code.view(m, padded_k // 2, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.int8)
    return packed[:, :k // 2].contiguous(), sf


__all__ = [
    "align",
    "ceil_div",
    "ceil_to_ue8m0",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
]
