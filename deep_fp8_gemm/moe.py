"""FP8 mixture-of-experts layer on the grouped GEMMs (DeepSeek-V3 style SwiGLU experts).

Math (one token ``x = hidden[t]``, ``H`` hidden size, ``I`` expert intermediate size)::

    out[t] = sum_j topk_weights[t, j] * FFN_e(x),   e = topk_ids[t, j]  (slots with e == -1 are dropped)
    FFN_e(x) = W2_e · (SiLU(W1_e · x) ⊙ (W3_e · x))

with ``W1_e = w13[e, :I]`` (gate), ``W3_e = w13[e, I:]`` (up), ``W2_e = w2[e]``, each an e4m3 matrix with
128x128 block scales, and the activations quantised per token (1x128, :func:`deep_fp8_gemm.per_token_cast_to_fp8`)
before each GEMM. Each GEMM rounds its output to bf16 (the GEMM contract); SiLU·mul runs in fp32 on those bf16
values and is quantised directly (no bf16 round trip); the weighted combine accumulates in fp32 and rounds
once to bf16.

Pipeline of :func:`fp8_moe_forward` (prefill / training shapes):

1. route: ``topk_ids`` -> contiguous layout (each expert's rows together, padded to 128; :mod:`.layout`);
2. quantise ``hidden`` per token **once** ([T, H], before the gather: per-token scales commute with row
   gathers, so this is T rows of work instead of T·top_k) and gather the fp8 rows and their scales;
3. ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` with ``w13`` -> ``[m_sum, 2I]`` bf16;
4. :func:`silu_mul_quant` (one fused kernel on sm_90) -> ``[m_sum, I]`` e4m3 + M-major scales;
5. ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` with ``w2`` -> ``[m_sum, H]`` bf16;
6. weighted un-permute: one gather of the top-k rows per token, fp32 accumulation in slot order —
   deterministic (no atomics).

:func:`fp8_moe_forward_masked` is the decode variant: tokens already dispatched per expert
(``[E, m_max, H]`` + counts on the device), the masked grouped GEMM, no host synchronisation at all.

Everything runs on CPU tensors (the exact reference GEMMs) and on sm_90 CUDA tensors (JIT kernels), and
traces with ``torch.compile(fullgraph=True)`` (routing is plain torch with static shapes when compiling; the
GEMMs and quantisers are ``torch.ops.deep_fp8_gemm`` custom ops). These are forward-only (no autograd); the
differentiable version is :func:`deep_fp8_gemm.autograd.fp8_moe`, which :class:`FP8MoE` runs in training
(``master_dtype``) or when its input requires grad.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import prepared
from .layout import max_m_sum_bound, route_topk
from .ops import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, m_grouped_gemm_fp8_fp8_bf16_nt_masked
from .quant import per_block_cast_to_fp8, per_token_cast_to_fp8, per_token_cast_to_fp8_torch
from .utils import (
    ceil_div,
    empty_m_major,
    get_col_major_tma_aligned_tensor,
    get_m_alignment_for_contiguous_layout,
)

FP8 = torch.float8_e4m3fn
GROUP = 128
_INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

__all__ = ["FP8MoE", "fp8_moe_forward", "fp8_moe_forward_masked", "silu_mul_quant"]


# ---------------------------------------------------------------------------------------------- SiLU·mul + quant
def _silu_mul_quant_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x must be bfloat16, float16 or float32, got x.dtype={x.dtype}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [m, 2I] or [G, m, 2I], got x.shape={tuple(x.shape)}")
    if x.shape[-1] == 0 or x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be 2I with I >= 1 (gate | up), got x.shape={tuple(x.shape)}")


def _silu_mul_quant_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_silu_input(x)
    from .quant import _use_fused_kernel

    if _use_fused_kernel(x):
        from .kernels.quant import silu_mul_quant_cuda

        return silu_mul_quant_cuda(x)
    return _silu_mul_quant_torch(x)


def _silu_mul_quant_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_silu_input(x)
    half = x.shape[-1] // 2
    shape = (*x.shape[:-1], half)
    scale_shape = (*x.shape[:-1], ceil_div(half, GROUP))
    return x.new_empty(shape, dtype=FP8), empty_m_major(scale_shape, x.device)


_lib = torch.library.Library("deep_fp8_gemm", "FRAGMENT")
_lib.define("silu_mul_quant(Tensor x) -> (Tensor, Tensor)")
for _key in ("CPU", "CUDA"):
    _lib.impl("silu_mul_quant", _silu_mul_quant_impl, _key)
torch.library.register_fake("deep_fp8_gemm::silu_mul_quant", _silu_mul_quant_fake, lib=_lib)


_silu_eager = prepared.quantiser("silu", _check_silu_input, _silu_mul_quant_impl)


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
    result = _silu_eager(x)  # eager: checks cached (deep_fp8_gemm.prepared)
    if result is not None:
        return result
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _check_silu_input(x)
    return torch.ops.deep_fp8_gemm.silu_mul_quant.default(x)


# ---------------------------------------------------------------------------------------------- validation
def _tensor(t: object, name: str, dtypes: tuple[torch.dtype, ...], rank: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {name}.dtype={t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got {name}.shape={tuple(t.shape)}")
    return t


def _check_weights(w13, w13_scale, w2, w2_scale) -> tuple[int, int, int]:
    """Validates the expert weights; returns ``(E, H, I)``."""
    _tensor(w13, "w13", (FP8,), 3)
    _tensor(w2, "w2", (FP8,), 3)
    _tensor(w13_scale, "w13_scale", (torch.float32,), 3)
    _tensor(w2_scale, "w2_scale", (torch.float32,), 3)
    num_experts, two_i, hidden = w13.shape
    if num_experts < 1 or two_i == 0 or two_i % 2:
        raise ValueError(f"w13 must be [E, 2I, H] with E >= 1 and I >= 1, got w13.shape={tuple(w13.shape)}")
    inter = two_i // 2
    if hidden % 16 or inter % 16:
        raise ValueError(f"H and I must be multiples of 16 (16-byte fp8 rows for TMA), got H={hidden} I={inter}")
    if tuple(w2.shape) != (num_experts, hidden, inter):
        raise ValueError(f"w2 must be [E, H, I]={(num_experts, hidden, inter)} (from w13.shape={tuple(w13.shape)}), "
                         f"got w2.shape={tuple(w2.shape)}")
    expected = (num_experts, ceil_div(two_i, GROUP), ceil_div(hidden, GROUP))
    if tuple(w13_scale.shape) != expected:
        raise ValueError(f"w13_scale must be [E, ceil(2I/128), ceil(H/128)]={expected}, got {tuple(w13_scale.shape)}")
    expected = (num_experts, ceil_div(hidden, GROUP), ceil_div(inter, GROUP))
    if tuple(w2_scale.shape) != expected:
        raise ValueError(f"w2_scale must be [E, ceil(H/128), ceil(I/128)]={expected}, got {tuple(w2_scale.shape)}")
    return num_experts, hidden, inter


def _same_device(named: tuple[tuple[torch.Tensor, str], ...]) -> None:
    device = named[0][0].device
    for t, name in named[1:]:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device: {named[0][1]} is on {device}, {name} on {t.device}")


# ---------------------------------------------------------------------------------------------- contiguous path
def _check_routed_inputs(hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale) -> tuple[int, int, int, int]:
    """Checks shared by every routed MoE forward (single-process and expert-parallel): dtypes, ranks, shapes
    and one device. Returns ``(num_experts of w13, H, I, T)``; expert-id ranges are the caller's."""
    num_experts, hidden_size, inter = _check_weights(w13, w13_scale, w2, w2_scale)
    _tensor(hidden, "hidden", (torch.bfloat16,), 2)
    _tensor(topk_ids, "topk_ids", _INDEX_DTYPES, 2)
    _tensor(topk_weights, "topk_weights", (torch.float32, torch.bfloat16, torch.float16), 2)
    num_tokens = hidden.shape[0]
    if hidden.shape[1] != hidden_size:
        raise ValueError(f"hidden must be [T, H] with H={hidden_size} (from w13), "
                         f"got hidden.shape={tuple(hidden.shape)}")
    if topk_ids.shape[0] != num_tokens or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [T={num_tokens}, top_k], got "
                         f"topk_ids.shape={tuple(topk_ids.shape)} topk_weights.shape={tuple(topk_weights.shape)}")
    _same_device(((hidden, "hidden"), (topk_ids, "topk_ids"), (topk_weights, "topk_weights"), (w13, "w13"),
                  (w13_scale, "w13_scale"), (w2, "w2"), (w2_scale, "w2_scale")))
    return num_experts, hidden_size, inter, num_tokens


def fp8_moe_forward(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    max_m_sum: int | None = None,
) -> torch.Tensor:
    """FP8 MoE forward over routed tokens (module docstring: math and pipeline).

    Args:
        hidden: ``[T, H]`` bfloat16 (any strides).
        topk_ids: ``[T, top_k]`` integer; expert of each slot in ``[0, E)``, or -1 for a dropped slot.
        topk_weights: ``[T, top_k]`` float32 (bf16 / fp16 accepted and widened); weight of each slot.
        w13: ``[E, 2I, H]`` float8_e4m3fn; rows ``[0, I)`` the gate projection W1, ``[I, 2I)`` the up projection W3.
        w13_scale: ``[E, ceil(2I/128), ceil(H/128)]`` float32 (128x128 block scales, e.g. from
            :func:`deep_fp8_gemm.per_block_cast_to_fp8` per expert).
        w2: ``[E, H, I]`` float8_e4m3fn, the down projection.
        w2_scale: ``[E, ceil(H/128), ceil(I/128)]`` float32.
        max_m_sum: rows of the contiguous layout. ``None``: the exact padded total, which costs one host
            synchronisation on a GPU (reading the per-expert counts) — except under ``torch.compile``, where
            the sync-free bound :func:`deep_fp8_gemm.layout.max_m_sum_bound` is used. Pass that bound (or any
            larger multiple of 128) yourself to avoid the sync in eager mode; padding rows cost the grouped
            GEMMs nothing but the quantisation and SiLU kernels still stream them.

    Returns:
        ``[T, H]`` bfloat16, a new tensor. A token whose slots are all dropped gets zeros; ``T == 0`` gives an
        empty ``[0, H]``. All tensors must be on one device (CPU, or an sm_90 GPU).

    Raises:
        TypeError / ValueError: wrong dtypes, ranks, shapes or devices (the message names the argument),
            H or I not multiples of 16, expert ids out of range (CPU; a device assert on GPU).
    """
    num_experts, hidden_size, inter, num_tokens = _check_routed_inputs(hidden, topk_ids, topk_weights, w13,
                                                                       w13_scale, w2, w2_scale)
    top_k = topk_ids.shape[1]
    out_shape = (num_tokens, hidden_size)
    if num_tokens == 0 or top_k == 0:
        return hidden.new_zeros(out_shape)

    alignment = get_m_alignment_for_contiguous_layout()
    if max_m_sum is None and torch.compiler.is_compiling():
        max_m_sum = max_m_sum_bound(num_tokens * top_k, num_experts, alignment)
    routed = route_topk(topk_ids, num_experts, alignment, max_m_sum=max_m_sum)
    m_sum = routed.layout.m_sum
    if m_sum == 0:  # every slot dropped (known on the host only in the synchronising mode)
        return hidden.new_zeros(out_shape)

    x_fp8, x_scales = per_token_cast_to_fp8(hidden)
    down = _experts_contiguous(x_fp8, x_scales, routed, w13, w13_scale, w2, w2_scale)
    return _combine(down, routed.scatter_index, topk_weights)


def _experts_contiguous(x_fp8, x_scales, routed, w13, w13_scale, w2, w2_scale) -> torch.Tensor:
    """Steps 2-5 of :func:`fp8_moe_forward` on already-quantised rows (shared with
    :mod:`deep_fp8_gemm.distributed`, which quantises before dispatch).

    ``x_fp8`` ``[T, H]`` e4m3 and ``x_scales`` ``[T, ceil(H/128)]`` float32 (any strides) are the rows that
    ``routed.gather_index`` indexes; ``routed.layout.m_sum > 0``. Returns ``down`` ``[m_sum + 1, H]`` bfloat16:
    row ``r < m_sum`` = ``FFN_e(x[gather_index[r]])`` for non-padding rows, the last row zeros (see
    :func:`_combine`).
    """
    m_sum, m_indices = routed.layout.m_sum, routed.layout.m_indices
    hidden_size, inter = w13.shape[2], w13.shape[1] // 2
    # Padding rows (gather_index -1) read token 0: any finite row will do, their outputs are never used.
    rows = routed.gather_index.clamp(min=0)
    a = x_fp8.view(torch.uint8).index_select(0, rows).view(FP8)
    # x_scales is M-major [T, g]: select along T of its [g, T] transpose -> [g, m_sum] contiguous, whose
    # transpose is exactly the M-major TMA-aligned layout (m_sum is a multiple of 128).
    a_scales = x_scales.t().index_select(1, rows).t()

    gate_up = torch.empty((m_sum, 2 * inter), dtype=torch.bfloat16, device=x_fp8.device)
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, a_scales), (w13, w13_scale), gate_up, m_indices)
    h_fp8, h_scales = silu_mul_quant(gate_up)
    # One extra zero row after the GEMM's rows: dropped slots read it, so the combine needs no masking.
    down = torch.empty((m_sum + 1, hidden_size), dtype=torch.bfloat16, device=x_fp8.device)
    down[m_sum].zero_()
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((h_fp8, h_scales), (w2, w2_scale), down[:m_sum], m_indices)

    return down


def _combine(down: torch.Tensor, scatter_index: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * down[scatter_index[t, j]]`` in fp32, slot order j = 0, 1, ... (deterministic,
    no atomics), rounded once to bf16.

    ``down`` is ``[m_sum + 1, H]`` whose last row is zeros; dropped slots (-1) read that row, so a non-finite
    padding row of the GEMM output can never leak in.

    NOTES (estimate, not measured): at T = 4096, top-8, H = 7168 the gather moves ~0.9 GB and the top_k
    multiply-adds ~2.3 GB (bf16 rows in, fp32 accumulator read + written), ~0.8 ms at 4 TB/s, next to ~2.4 ms
    of grouped GEMMs at 1.2 PFLOPS. A fused combine kernel (read the rows once, write bf16 once: ~0.5 GB)
    would remove most of it.
    """
    num_tokens, top_k = scatter_index.shape
    m_sum = down.shape[0] - 1
    rows = torch.where(scatter_index >= 0, scatter_index, torch.full_like(scatter_index, m_sum))
    gathered = down.index_select(0, rows.reshape(-1)).view(num_tokens, top_k, down.shape[1])
    weights = topk_weights.float()
    acc = gathered[:, 0].float() * weights[:, :1]
    for j in range(1, top_k):  # top_k is small and static; no loop over tokens
        acc.addcmul_(gathered[:, j], weights[:, j : j + 1])
    return acc.to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------- masked path
def fp8_moe_forward_masked(
    hidden_per_expert: torch.Tensor,
    counts: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    expected_m: int | None = None,
) -> torch.Tensor:
    """Expert FFNs over tokens already dispatched per expert (decode; CUDA-graph capturable).

    Args:
        hidden_per_expert: ``[E, m_max, H]`` bfloat16; rows ``< counts[e]`` of expert ``e`` are its tokens,
            the other rows are ignored (any content, even non-finite).
        counts: ``[E]`` int32 on the same device, valid rows per expert in ``[0, m_max]``. Never read on the
            host: nothing here synchronises, so a CUDA graph captured once replays with new counts (run the
            call once before capturing so that its kernels are compiled and loaded).
        w13, w13_scale, w2, w2_scale: as :func:`fp8_moe_forward`.
        expected_m: host hint of the typical count for the GEMM heuristic (default ``m_max``).

    Returns:
        ``[E, m_max, H]`` bfloat16 with ``out[e, r] = FFN_e(hidden_per_expert[e, r])`` for ``r < counts[e]``;
        rows ``>= counts[e]`` are unspecified. Routing weights are not applied (the combine step that
        un-dispatches tokens applies them).
    """
    num_experts, hidden_size, inter = _check_weights(w13, w13_scale, w2, w2_scale)
    _tensor(hidden_per_expert, "hidden_per_expert", (torch.bfloat16,), 3)
    _tensor(counts, "counts", (torch.int32,), 1)
    if hidden_per_expert.shape[0] != num_experts or hidden_per_expert.shape[2] != hidden_size:
        raise ValueError(f"hidden_per_expert must be [E={num_experts}, m_max, H={hidden_size}], got "
                         f"hidden_per_expert.shape={tuple(hidden_per_expert.shape)}")
    if counts.shape[0] != num_experts:
        raise ValueError(f"counts must be [E={num_experts}], got counts.shape={tuple(counts.shape)}")
    _same_device(((hidden_per_expert, "hidden_per_expert"), (counts, "counts"), (w13, "w13"),
                  (w13_scale, "w13_scale"), (w2, "w2"), (w2_scale, "w2_scale")))
    m_max = hidden_per_expert.shape[1]
    if expected_m is None:
        expected_m = max(m_max, 1)
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"expected_m must be a positive int, got {expected_m=!r}")
    if m_max == 0:
        return hidden_per_expert.new_empty((num_experts, m_max, hidden_size))

    # Per-token scales do not care which expert a row belongs to: quantise all E * m_max rows as one matrix,
    # then view the scales as [E, m_max, g] (put in the per-expert M-major layout by _experts_masked).
    x_fp8, x_scales = per_token_cast_to_fp8(hidden_per_expert.reshape(num_experts * m_max, hidden_size))
    a = x_fp8.view(num_experts, m_max, hidden_size)
    return _experts_masked(a, x_scales.view(num_experts, m_max, -1), counts, w13, w13_scale, w2, w2_scale, expected_m)


def _experts_masked(a, a_scales, counts, w13, w13_scale, w2, w2_scale, expected_m: int) -> torch.Tensor:
    """The two masked grouped GEMMs and SiLU·mul+quant of :func:`fp8_moe_forward_masked` on already-quantised
    rows (shared with :mod:`deep_fp8_gemm.distributed`'s decode path).

    ``a`` ``[E, m_max, H]`` e4m3 (contiguous), ``a_scales`` ``[E, m_max, ceil(H/128)]`` float32 (any strides;
    copied to the M-major layout unless already in it), ``counts`` ``[E]`` int32 on the device (never read on
    the host), ``m_max > 0``. Returns ``[E, m_max, H]`` bfloat16, rows ``>= counts[e]`` unspecified.
    """
    num_experts, m_max, hidden_size = a.shape
    inter = w13.shape[1] // 2
    a_scales = get_col_major_tma_aligned_tensor(a_scales)
    out = torch.empty((num_experts, m_max, hidden_size), dtype=torch.bfloat16, device=a.device)
    gate_up = torch.empty((num_experts, m_max, 2 * inter), dtype=torch.bfloat16, device=a.device)
    m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, a_scales), (w13, w13_scale), gate_up, counts, expected_m)
    h_fp8, h_scales = silu_mul_quant(gate_up)
    m_grouped_gemm_fp8_fp8_bf16_nt_masked((h_fp8, h_scales), (w2, w2_scale), out, counts, expected_m)
    return out


# ---------------------------------------------------------------------------------------------- module
def _check_master_dtype(master_dtype: object) -> None:
    if master_dtype is not None and master_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"master_dtype must be None, torch.float32 or torch.bfloat16, got {master_dtype!r}")


def _quantise_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[E, n, k]`` -> (e4m3 ``[E, n, k]``, ``[E, ceil(n/128), ceil(k/128)]``), 128x128 blocks per expert.

    With ``n % 128 == 0`` no block straddles two experts, so one quantiser call on ``[E·n, k]`` gives the same
    bits as a call per expert (the training path quantises its master weights on every forward)."""
    num_experts, n, k = w.shape
    if n % 128 == 0:
        w_fp8, w_sf = per_block_cast_to_fp8(w.reshape(num_experts * n, k))
        return w_fp8.view(num_experts, n, k), w_sf.view(num_experts, n // 128, -1)
    pairs = [per_block_cast_to_fp8(w[e]) for e in range(num_experts)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


class FP8MoE(nn.Module):
    """SwiGLU experts with FP8 (e4m3, 128x128 block-scaled) weights; forward = :func:`fp8_moe_forward`.

    Buffers (move with ``.to(device)``, saved in the state dict):
        w13 ``[E, 2I, H]`` float8_e4m3fn (rows ``[0, I)`` gate W1, ``[I, 2I)`` up W3),
        w13_scale ``[E, ceil(2I/128), ceil(H/128)]`` float32,
        w2 ``[E, H, I]`` float8_e4m3fn, w2_scale ``[E, ceil(H/128), ceil(I/128)]`` float32.

    The constructor initialises the experts like ``nn.Linear`` (uniform in ``±1/sqrt(fan_in)``) and quantises
    them; use :meth:`from_weights` to load trained weights. The router is not part of this module: pass
    ``topk_ids`` / ``topk_weights`` to :meth:`forward`.

    Training: ``master_dtype=torch.float32`` (or ``torch.bfloat16``) keeps master parameters ``w13`` ``[E, 2I,
    H]`` and ``w2`` ``[E, H, I]`` of that dtype instead of the e4m3 buffers, and the forward is
    :func:`deep_fp8_gemm.autograd.fp8_moe` (FP8 forward and backward, fp32 weight gradients, ``main_grad``
    honoured). An inference module whose ``hidden`` or ``topk_weights`` requires grad runs
    :func:`deep_fp8_gemm.autograd.fp8_moe_frozen` (same output; gradients to those two only).
    """

    master_dtype: torch.dtype | None = None  # None: the inference module (e4m3 buffers)

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 device: torch.device | str | None = None, master_dtype: torch.dtype | None = None):
        super().__init__()
        _check_master_dtype(master_dtype)
        for value, name in ((num_experts, "num_experts"), (hidden_size, "hidden_size"),
                            (intermediate_size, "intermediate_size")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if hidden_size % 16 or intermediate_size % 16:
            raise ValueError(f"hidden_size and intermediate_size must be multiples of 16, got "
                             f"{hidden_size=} {intermediate_size=}")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        dtype = torch.bfloat16 if master_dtype is None else master_dtype
        w13 = torch.empty((num_experts, 2 * intermediate_size, hidden_size), dtype=dtype, device=device)
        w2 = torch.empty((num_experts, hidden_size, intermediate_size), dtype=dtype, device=device)
        w13.uniform_(-1 / math.sqrt(hidden_size), 1 / math.sqrt(hidden_size))
        w2.uniform_(-1 / math.sqrt(intermediate_size), 1 / math.sqrt(intermediate_size))
        self._set_weights(w13, w2, master_dtype)

    def _set_weights(self, w13: torch.Tensor, w2: torch.Tensor, master_dtype: torch.dtype | None = None) -> None:
        self.master_dtype = master_dtype
        if master_dtype is not None:
            self.w13 = nn.Parameter(w13.detach().to(master_dtype).clone())
            self.w2 = nn.Parameter(w2.detach().to(master_dtype).clone())
            return
        w13_fp8, w13_scale = _quantise_experts(w13)
        w2_fp8, w2_scale = _quantise_experts(w2)
        self.register_buffer("w13", w13_fp8)
        self.register_buffer("w13_scale", w13_scale)
        self.register_buffer("w2", w2_fp8)
        self.register_buffer("w2_scale", w2_scale)

    @classmethod
    def from_weights(cls, w13: torch.Tensor, w2: torch.Tensor, *,
                     master_dtype: torch.dtype | None = None) -> FP8MoE:
        """Quantises trained expert weights once (128x128 blocks per expert); with ``master_dtype`` keeps copies
        of them in that dtype as master parameters instead (a training module).

        Args:
            w13: ``[E, 2I, H]`` bfloat16 / float16 / float32: ``torch.cat([W1, W3], dim=1)`` of the gate and up
                projections (``nn.Linear`` layout, ``[out, in]``).
            w2: ``[E, H, I]`` same dtypes, the down projection.
        The module's buffers live on the weights' device.
        """
        for t, name in ((w13, "w13"), (w2, "w2")):
            _tensor(t, name, (torch.bfloat16, torch.float16, torch.float32), 3)
        num_experts, two_i, hidden = w13.shape
        if two_i == 0 or two_i % 2 or tuple(w2.shape) != (num_experts, hidden, two_i // 2):
            raise ValueError(f"w13 must be [E, 2I, H] and w2 [E, H, I], got w13.shape={tuple(w13.shape)} "
                             f"w2.shape={tuple(w2.shape)}")
        _check_master_dtype(master_dtype)
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.num_experts, module.hidden_size, module.intermediate_size = num_experts, hidden, two_i // 2
        if hidden % 16 or (two_i // 2) % 16:
            raise ValueError(f"H and I must be multiples of 16, got H={hidden} I={two_i // 2}")
        module._set_weights(w13, w2, master_dtype)
        return module

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]`` bf16, ``topk_ids [T, top_k]`` int (-1 = dropped), ``topk_weights [T, top_k]``
        fp32 -> ``[T, H]`` bf16 (see :func:`fp8_moe_forward`; training: :func:`deep_fp8_gemm.autograd.fp8_moe`)."""
        if self.master_dtype is not None or (torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (hidden, topk_weights))):
            from .autograd import fp8_moe, fp8_moe_frozen  # autograd imports this module

            if self.master_dtype is not None:
                return fp8_moe(hidden, topk_ids, topk_weights, self.w13, self.w2)
            return fp8_moe_frozen(hidden, topk_ids, topk_weights, self.w13, self.w13_scale, self.w2, self.w2_scale)
        return fp8_moe_forward(hidden, topk_ids, topk_weights, self.w13, self.w13_scale, self.w2, self.w2_scale)

    def extra_repr(self) -> str:
        master = "" if self.master_dtype is None else f", master_dtype={self.master_dtype}"
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}{master}")
