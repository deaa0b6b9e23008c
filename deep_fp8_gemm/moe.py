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
   steps 3-4 are one kernel, ``m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu``, when the interleaved weights
   ``w13_swiglu`` are given (:class:`FP8MoE` derives them when it loads its weights; see "Fused up-projection");
5. ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` with ``w2`` -> ``[m_sum, H]`` bf16;
6. weighted un-permute: one gather of the top-k rows per token, fp32 accumulation in slot order —
   deterministic (no atomics).

:func:`fp8_moe_forward_masked` is the decode variant: tokens already dispatched per expert
(``[E, m_max, H]`` + counts on the device), the masked grouped GEMM, no host synchronisation at all.

The steps are the functions of :mod:`deep_fp8_gemm.ops.moe`, which the training forward
(:func:`deep_fp8_gemm.autograd.fp8_moe`) and the expert-parallel layers call too.

Fused up-projection (issue 27). With ``w13_swiglu`` (``ops.moe.swiglu_weights(w13, w13_scale)``: the gate and up
128-row blocks interleaved, a copy made once) the ``w13`` GEMM computes ``SiLU(gate) * up`` from its fp32
accumulators and writes ``h`` as e4m3 with 1x128 scales itself: one kernel and ``8I`` bytes per routed row less than
steps 3-4 (which round ``gate | up`` to bf16 first). It is used where legal (``I % 128 == 0``) and the cost model
predicts it no slower (``ops.moe.use_fused_swiglu``; at DeepSeek-V3's shapes always, decode included). What holds:

* :class:`FP8MoE` (inference, ``fused_swiglu=True``, the default), :func:`fp8_moe_forward` /
  :func:`fp8_moe_forward_masked` given ``w13_swiglu``, and the expert-parallel layers built on them run fused;
  fused and unfused differ by the bf16 rounding of ``gate | up`` (calc_diff <= 2e-3 between them, the fused
  one no farther from float64) and at e4m3 rounding ties by the quantisation (the fused epilogue multiplies by
  ``fl(1 / scale)``, ``silu_mul_quant`` divides; issue 45);
* the training forward (:func:`deep_fp8_gemm.autograd.fp8_moe`, and :func:`~deep_fp8_gemm.autograd.fp8_moe_frozen`
  that an inference :class:`FP8MoE` runs when its inputs require grad) stays unfused — its backward needs the bf16
  ``gate | up`` — and equals the unfused inference forward bit for bit; it no longer equals a fused inference
  forward bit for bit;
* expert parallelism: ``ep_moe_forward`` / ``ep_moe_forward_decode`` equal the single-process forward bit for bit
  when both take the same path (both fused, or both unfused), as before.

Everything runs on CPU tensors (the exact reference GEMMs) and on sm_90 CUDA tensors (JIT kernels), and
traces with ``torch.compile(fullgraph=True)`` (routing is plain torch with static shapes when compiling; the
GEMMs and quantisers are ``torch.ops.deep_fp8_gemm`` custom ops). These are forward-only (no autograd); the
differentiable version is :func:`deep_fp8_gemm.autograd.fp8_moe`, which :class:`FP8MoE` runs in training
(``master_dtype``) or when its input requires grad.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .autograd import fp8_moe, fp8_moe_frozen
from .nn import FP8StateModule
from .ops.moe import (check_expert_sizes, check_routed_inputs, check_same_device, check_tensor_of, check_weights,
                      combine, check_swiglu_weights, experts_contiguous, experts_masked, quantise_experts, route,
                      swiglu_weights)
from .quant import per_token_cast_to_fp8, silu_mul_quant
from .ops.masked import check_masked_values
from .ops.mxfp4 import (PreparedMxfp4, check_mxfp4_experts, experts_contiguous_mxfp4, experts_masked_mxfp4,
                         prepare_mxfp4_weights)
from .ops.outputs import SwigluWeights
from ._core.checks import check_expected_m
from .runtime.target import layout_values_checked

__all__ = ["FP8MoE", "fp8_moe_forward", "fp8_moe_forward_masked", "mxfp4_moe_forward", "silu_mul_quant"]

#: The token dtypes the inference forward takes: quantised per token as they are, the output in the same dtype (the
#: layer's FP8 weights stay FP8 under ``.half()``, ``FP8StateModule``).
_TOKEN_DTYPES = (torch.bfloat16, torch.float16)


def fp8_moe_forward(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *, max_m_sum: int | None = None,
                    w13_swiglu: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """FP8 MoE forward over routed tokens (module docstring: math and pipeline).

    Args:
        hidden: ``[T, H]`` bfloat16 or float16 (any strides; the output has its dtype, fp16 values beyond 65504
            becoming ±inf as an fp16 layer's would).
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
        w13_swiglu: ``ops.moe.swiglu_weights(w13, w13_scale)`` (the same weights, gate / up interleaved): the
            up-projection then runs fused where legal and modelled faster (module docstring, "Fused
            up-projection"). None: the unfused path.

    Returns:
        ``[T, H]`` of hidden's dtype, a new tensor. A token whose slots are all dropped gets zeros; ``T == 0`` gives an
        empty ``[0, H]``. All tensors must be on one device (CPU, or an sm_90 GPU).

    Raises:
        TypeError / ValueError: wrong dtypes, ranks, shapes or devices (the message names the argument),
            H or I not multiples of 16, expert ids out of range (CPU; a device assert on GPU).
    """
    num_experts, hidden_size, inter, num_tokens = check_routed_inputs(hidden, topk_ids, topk_weights, w13,
                                                                      w13_scale, w2, w2_scale, _TOKEN_DTYPES)
    check_swiglu_weights(w13_swiglu, w13, w13_scale)
    top_k = topk_ids.shape[1]
    out_shape = (num_tokens, hidden_size)
    if num_tokens == 0 or top_k == 0:
        return hidden.new_zeros(out_shape)
    routed = route(topk_ids, num_experts, max_m_sum)
    if routed.layout.m_sum == 0:  # every slot dropped (known on the host only in the synchronising mode)
        return hidden.new_zeros(out_shape)
    x_fp8, x_scales = per_token_cast_to_fp8(hidden)
    _, down = experts_contiguous(x_fp8, x_scales, routed, w13, w13_scale, w2, w2_scale, w13_swiglu)
    return combine(down, routed.scatter_index, topk_weights, hidden.dtype)


# ---------------------------------------------------------------------------------------------- masked path
def fp8_moe_forward_masked(hidden_per_expert: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor,
                           w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                           expected_m: int | None = None,
                           w13_swiglu: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Expert FFNs over tokens already dispatched per expert (decode; CUDA-graph capturable).

    Args:
        hidden_per_expert: ``[E, m_max, H]`` bfloat16; rows ``< counts[e]`` of expert ``e`` are its tokens,
            the other rows are ignored (any content, even non-finite).
        counts: ``[E]`` int32 on the same device, valid rows per expert in ``[0, m_max]`` (checked on CPU
            tensors: ``ValueError`` naming ``counts``). Never read on the host for CUDA tensors (unless
            ``DFG_CHECK_LAYOUTS=1``): nothing here synchronises, so a CUDA graph captured once replays with new
            counts (run the call once before capturing so that its kernels are compiled and loaded).
        w13, w13_scale, w2, w2_scale: as :func:`fp8_moe_forward`; or MXFP4 experts: ``w13`` / ``w2``
            :class:`~deep_fp8_gemm.ops.mxfp4.PreparedMxfp4` (``[E, 2I, H]`` / ``[E, H, I]``) with both scales None
            (the MXFP4 decode kernel, issue 42; ``w13_swiglu`` must then be None).
        expected_m: host hint of the typical count for the GEMM heuristic (default ``m_max``).
        w13_swiglu: as :func:`fp8_moe_forward` (fused: the masked SwiGLU kernel).

    Returns:
        ``[E, m_max, H]`` bfloat16 with ``out[e, r] = FFN_e(hidden_per_expert[e, r])`` for ``r < counts[e]``;
        rows ``>= counts[e]`` are unspecified. Routing weights are not applied (the combine step that
        un-dispatches tokens applies them).
    """
    mxfp4 = isinstance(w13, PreparedMxfp4) or isinstance(w2, PreparedMxfp4)
    if mxfp4:
        if w13_scale is not None or w2_scale is not None or w13_swiglu is not None:
            raise ValueError("MXFP4 experts (PreparedMxfp4 w13 / w2) carry their scales: w13_scale, w2_scale and "
                             "w13_swiglu must be None")
        num_experts, hidden_size, inter = check_mxfp4_experts(w13, w2)
    else:
        num_experts, hidden_size, inter = check_weights(w13, w13_scale, w2, w2_scale)
        check_swiglu_weights(w13_swiglu, w13, w13_scale)
    check_tensor_of(hidden_per_expert, "hidden_per_expert", (torch.bfloat16,), 3)
    check_tensor_of(counts, "counts", (torch.int32,), 1)
    if hidden_per_expert.shape[0] != num_experts or hidden_per_expert.shape[2] != hidden_size:
        raise ValueError(f"hidden_per_expert must be [E={num_experts}, m_max, H={hidden_size}], got "
                         f"hidden_per_expert.shape={tuple(hidden_per_expert.shape)}")
    if counts.shape[0] != num_experts:
        raise ValueError(f"counts must be [E={num_experts}], got counts.shape={tuple(counts.shape)}")
    check_same_device(((hidden_per_expert, "hidden_per_expert"), (counts, "counts")) + (
        ((w13.tiles, "w13"), (w2.tiles, "w2")) if mxfp4 else
        ((w13, "w13"), (w13_scale, "w13_scale"), (w2, "w2"), (w2_scale, "w2_scale"))))
    m_max = hidden_per_expert.shape[1]
    if expected_m is None:
        expected_m = max(m_max, 1)
    check_expected_m(expected_m)
    if layout_values_checked(counts.device):  # CPU (and DFG_CHECK_LAYOUTS=1): named as the caller knows them
        check_masked_values(counts, m_max, name="counts")
    if m_max == 0:
        return hidden_per_expert.new_empty((num_experts, m_max, hidden_size))

    # Per-token scales do not care which expert a row belongs to: quantise all E * m_max rows as one matrix,
    # then view the scales as [E, m_max, g] (put in the per-expert M-major layout by _experts_masked).
    x_fp8, x_scales = per_token_cast_to_fp8(hidden_per_expert.reshape(num_experts * m_max, hidden_size))
    a = x_fp8.view(num_experts, m_max, hidden_size)
    if mxfp4:
        return experts_masked_mxfp4(a, x_scales.view(num_experts, m_max, -1).contiguous(), counts, w13, w2, expected_m)
    return experts_masked(a, x_scales.view(num_experts, m_max, -1), counts, w13, w13_scale, w2, w2_scale, expected_m,
                          w13_swiglu)


#: Rows per expert up to which :func:`mxfp4_moe_forward` dispatches to the masked (decode) layout: the masked
#: kernels' widest token tile (kernels/mxfp4_gemm.py BLOCK_MS); beyond, the contiguous layout keeps the dispatch
#: buffer at the routed rows instead of E x m_max.
MXFP4_DECODE_MAX_ROWS = 32


def mxfp4_moe_forward(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: PreparedMxfp4,
                      w2: PreparedMxfp4) -> torch.Tensor:
    """The MoE forward of routed tokens with MXFP4 experts (issues 42, 43). Same math and arguments as
    :func:`fp8_moe_forward` but the weights: ``w13`` ``[E, 2I, H]`` and ``w2`` ``[E, H, I]``
    :class:`~deep_fp8_gemm.ops.mxfp4.PreparedMxfp4`.

    Pipeline: quantise ``hidden`` per token once; the per-expert counts (one host read, as :func:`fp8_moe_forward`'s
    exact layout); then
    * decode (at most :data:`MXFP4_DECODE_MAX_ROWS` rows for every expert): each routed slot to row ``p`` of its expert
      (``p`` its rank among the expert's slots in (token, slot) order) of a ``[E, m_max, H]`` masked layout and the
      masked kernels (:func:`~deep_fp8_gemm.ops.mxfp4.experts_masked_mxfp4`);
    * prefill: the contiguous layout (:func:`~deep_fp8_gemm.ops.moe.route`) and the contiguous kernels
      (:func:`~deep_fp8_gemm.ops.mxfp4.experts_contiguous_mxfp4`);
    then the weighted combine in fp32 in slot order, rounded once. A token's bits do not depend on the batch, nor on
    the path its batch took: both paths run the same register-A kernel arithmetic per row (K never split, the same
    chain and promotions; tests/kernels/test_sim_mxfp4.py checks the GEMM's bits across the two in the simulator), the
    same ``silu_mul_quant`` per row and the same combine. Returns ``[T, H]`` of hidden's dtype."""
    num_experts, hidden_size, _ = check_mxfp4_experts(w13, w2)
    check_tensor_of(hidden, "hidden", _TOKEN_DTYPES, 2)
    check_tensor_of(topk_ids, "topk_ids", (torch.int32, torch.int64), 2)
    check_tensor_of(topk_weights, "topk_weights", (torch.float32, torch.bfloat16, torch.float16), 2)
    num_tokens, top_k = topk_ids.shape
    if hidden.shape != (num_tokens, hidden_size) or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"hidden must be [T, H={hidden_size}] and topk_weights like topk_ids [T, top_k], got "
                         f"hidden {tuple(hidden.shape)}, topk_ids {tuple(topk_ids.shape)}, topk_weights "
                         f"{tuple(topk_weights.shape)}")
    check_same_device(((hidden, "hidden"), (topk_ids, "topk_ids"), (topk_weights, "topk_weights"),
                       (w13.tiles, "w13"), (w2.tiles, "w2")))
    ids = topk_ids.reshape(-1).to(torch.int64)
    if bool(((ids < -1) | (ids >= num_experts)).any()):
        raise ValueError(f"topk_ids must hold expert ids in [0, {num_experts}) or -1 (dropped)")
    if num_tokens == 0 or top_k == 0 or bool((ids < 0).all()):
        return hidden.new_zeros((num_tokens, hidden_size))
    valid = ids >= 0
    expert = torch.where(valid, ids, torch.full_like(ids, num_experts))
    counts = torch.bincount(expert, minlength=num_experts + 1)[:num_experts]
    order = torch.argsort(expert, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.empty_like(ids)
    pos[order] = torch.arange(ids.numel(), device=ids.device) - torch.cat((starts, starts.new_zeros(1)))[expert[order]]
    m_max = int(counts.max())
    x_fp8, x_scales = per_token_cast_to_fp8(hidden)
    if m_max > MXFP4_DECODE_MAX_ROWS:  # prefill: the contiguous layout
        routed = route(topk_ids, num_experts, None)
        rows = routed.gather_index.clamp(min=0)
        a = x_fp8.view(torch.uint8).index_select(0, rows).view(x_fp8.dtype)
        sa = x_scales.index_select(0, rows).contiguous()
        down = experts_contiguous_mxfp4(a, sa, routed.layout.m_indices, w13, w2)
        return combine(down, routed.scatter_index, topk_weights, hidden.dtype)
    token = torch.arange(num_tokens, device=ids.device).repeat_interleave(top_k)
    a = torch.zeros((num_experts, m_max, hidden_size), dtype=torch.uint8, device=hidden.device)
    sa = torch.ones((num_experts, m_max, x_scales.shape[1]), dtype=torch.float32, device=hidden.device)
    a[ids[valid], pos[valid]] = x_fp8.view(torch.uint8)[token[valid]]  # bytes: index_put has no e4m3 kernel
    a = a.view(x_fp8.dtype)
    sa[ids[valid], pos[valid]] = x_scales[token[valid]]
    down = experts_masked_mxfp4(a, sa, counts.to(torch.int32), w13, w2, max(m_max, 1))
    gathered = torch.zeros((num_tokens * top_k, hidden_size), dtype=torch.bfloat16, device=hidden.device)
    gathered[valid] = down[ids[valid], pos[valid]]
    gathered = gathered.view(num_tokens, top_k, hidden_size)
    weights = topk_weights.float()
    acc = gathered[:, 0].float() * weights[:, :1]
    for j in range(1, top_k):  # slot order, as ops.moe.combine
        acc.addcmul_(gathered[:, j], weights[:, j: j + 1])
    return acc.to(hidden.dtype)


# ---------------------------------------------------------------------------------------------- module
def _check_master_dtype(master_dtype: object) -> None:
    if master_dtype is not None and master_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"master_dtype must be None, torch.float32 or torch.bfloat16, got {master_dtype!r}")


def _refresh_after_load(module: FP8MoE, _incompatible_keys) -> None:
    """load_state_dict post-hook of :class:`FP8MoE` (a module-level function, so the module still pickles)."""
    module.refresh_swiglu_weights()


class FP8MoE(FP8StateModule):
    """SwiGLU experts with FP8 (e4m3, 128x128 block-scaled) weights; forward = :func:`fp8_moe_forward`.

    Buffers (move with ``.to(device)``, saved in the state dict):
        w13 ``[E, 2I, H]`` float8_e4m3fn (rows ``[0, I)`` gate W1, ``[I, 2I)`` up W3),
        w13_scale ``[E, ceil(2I/128), ceil(H/128)]`` float32,
        w2 ``[E, H, I]`` float8_e4m3fn, w2_scale ``[E, ceil(H/128), ceil(I/128)]`` float32.
    Non-persistent buffers (not in the state dict, which keeps the checkpoint layout above; move with the module):
        w13_swiglu, w13_swiglu_scale: ``ops.moe.swiglu_weights(w13, w13_scale)``, the fused up-projection's layout
        (gate / up 128-row blocks interleaved), derived when the weights are set and again after every
        ``load_state_dict``; None with ``fused_swiglu=False``, for a training module, or when ``I % 128 != 0``.
        They double the memory of ``w13`` (call :meth:`refresh_swiglu_weights` after changing ``w13`` in place).

    The constructor initialises the experts like ``nn.Linear`` (uniform in ``±1/sqrt(fan_in)``) and quantises
    them; use :meth:`from_weights` to load trained weights. The router is not part of this module: pass
    ``topk_ids`` / ``topk_weights`` to :meth:`forward`.

    Training: ``master_dtype=torch.float32`` (or ``torch.bfloat16``) keeps master parameters ``w13`` ``[E, 2I,
    H]`` and ``w2`` ``[E, H, I]`` of that dtype instead of the e4m3 buffers, and the forward is
    :func:`deep_fp8_gemm.autograd.fp8_moe` (FP8 forward and backward, fp32 weight gradients, ``main_grad``
    honoured). An inference module whose ``hidden`` or ``topk_weights`` requires grad runs
    :func:`deep_fp8_gemm.autograd.fp8_moe_frozen` (same output; gradients to those two only).

    Dtype casts of the module keep every tensor's dtype, device moves apply
    (:class:`deep_fp8_gemm.nn.FP8StateModule`); the state dict round-trips bit for bit.
    """

    master_dtype: torch.dtype | None = None  # None: the inference module (e4m3 buffers)
    #: "e4m3" (the buffers above) or "mxfp4" (:meth:`from_mxfp4`: the experts' stored MXFP4 form instead)
    experts_format: str = "e4m3"

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 device: torch.device | str | None = None, master_dtype: torch.dtype | None = None,
                 fused_swiglu: bool = True):
        super().__init__()
        _check_master_dtype(master_dtype)
        if not isinstance(fused_swiglu, bool):
            raise TypeError(f"fused_swiglu must be a bool, got {type(fused_swiglu).__name__}")
        self.fused_swiglu = fused_swiglu
        self.register_buffer("w13_swiglu", None, persistent=False)
        self.register_buffer("w13_swiglu_scale", None, persistent=False)
        self.register_load_state_dict_post_hook(_refresh_after_load)
        for value, name in ((num_experts, "num_experts"), (hidden_size, "hidden_size"),
                            (intermediate_size, "intermediate_size")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        check_expert_sizes(hidden_size, intermediate_size, "hidden_size and intermediate_size")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.master_dtype = master_dtype
        if device is not None and torch.device(device).type == "meta":
            return  # from_weights: the weights come next, nothing to initialise
        dtype = torch.bfloat16 if master_dtype is None else master_dtype
        w13 = torch.empty((num_experts, 2 * intermediate_size, hidden_size), dtype=dtype, device=device)
        w2 = torch.empty((num_experts, hidden_size, intermediate_size), dtype=dtype, device=device)
        w13.uniform_(-1 / math.sqrt(hidden_size), 1 / math.sqrt(hidden_size))
        w2.uniform_(-1 / math.sqrt(intermediate_size), 1 / math.sqrt(intermediate_size))
        self._set_weights(w13, w2)

    def _set_weights(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        """The master parameters (a training module) or the quantised buffers (inference) of trained weights."""
        if self.master_dtype is not None:
            self.w13 = nn.Parameter(w13.detach().to(self.master_dtype).clone())
            self.w2 = nn.Parameter(w2.detach().to(self.master_dtype).clone())
            return
        w13_fp8, w13_scale = quantise_experts(w13)
        w2_fp8, w2_scale = quantise_experts(w2)
        self.register_buffer("w13", w13_fp8)
        self.register_buffer("w13_scale", w13_scale)
        self.register_buffer("w2", w2_fp8)
        self.register_buffer("w2_scale", w2_scale)
        self.refresh_swiglu_weights()

    def refresh_swiglu_weights(self) -> None:
        """(Re)derive the non-persistent ``w13_swiglu`` / ``w13_swiglu_scale`` from ``w13`` / ``w13_scale`` (see the
        class docstring); a no-op for a training module or with ``fused_swiglu=False``."""
        if self.master_dtype is not None or not self.fused_swiglu or getattr(self, "w13", None) is None:
            return
        pair = swiglu_weights(self.w13, self.w13_scale)
        self.w13_swiglu, self.w13_swiglu_scale = (None, None) if pair is None else pair

    @property
    def swiglu_pair(self) -> SwigluWeights | None:
        """``SwigluWeights(w13_swiglu, w13_swiglu_scale)`` for :func:`fp8_moe_forward`'s ``w13_swiglu``, or None
        (unfused)."""
        return None if self.w13_swiglu is None else SwigluWeights(self.w13_swiglu, self.w13_swiglu_scale)

    @classmethod
    def from_weights(cls, w13: torch.Tensor, w2: torch.Tensor, *,
                     master_dtype: torch.dtype | None = None, fused_swiglu: bool = True) -> FP8MoE:
        """Quantises trained expert weights once (128x128 blocks per expert); with ``master_dtype`` keeps copies
        of them in that dtype as master parameters instead (a training module).

        Args:
            w13: ``[E, 2I, H]`` bfloat16 / float16 / float32: ``torch.cat([W1, W3], dim=1)`` of the gate and up
                projections (``nn.Linear`` layout, ``[out, in]``).
            w2: ``[E, H, I]`` same dtypes, the down projection.
        The module's buffers live on the weights' device.
        """
        for t, name in ((w13, "w13"), (w2, "w2")):
            check_tensor_of(t, name, (torch.bfloat16, torch.float16, torch.float32), 3)
        num_experts, two_i, hidden = w13.shape
        if two_i == 0 or two_i % 2 or tuple(w2.shape) != (num_experts, hidden, two_i // 2):
            raise ValueError(f"w13 must be [E, 2I, H] and w2 [E, H, I], got w13.shape={tuple(w13.shape)} "
                             f"w2.shape={tuple(w2.shape)}")
        check_expert_sizes(hidden, two_i // 2)
        module = cls(num_experts, hidden, two_i // 2, device="meta", master_dtype=master_dtype,
                     fused_swiglu=fused_swiglu)
        module._set_weights(w13, w2)
        return module

    @classmethod
    def from_mxfp4(cls, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                   in_place: bool = False) -> FP8MoE:
        """An inference layer of MXFP4 experts (DeepSeek-V4 / Kimi-K3 checkpoints; issue 42): ``w13`` ``[E, 2I, H/2]``
        and ``w2`` ``[E, H, I/2]`` int8 / uint8 (two e2m1 codes per byte, low nibble first) with ``w13_scale``
        ``[E, 2I, H/32]`` / ``w2_scale`` ``[E, H, I/32]`` float32 UE8M0 scales (``per_token_cast_to_fp4(w,
        use_ue8m0=True, gran_k=32)``). Prepared once (:func:`~deep_fp8_gemm.ops.mxfp4.prepare_mxfp4_weights`; with
        ``in_place=True`` into the checkpoint tensors' own storage) and held as buffers ``w13_mxfp4_tiles``,
        ``w13_mxfp4_meta``, ``w13_mxfp4_wave_per32`` (and ``w2_...``): the state dict saves the stored form. The
        forward is :func:`mxfp4_moe_forward` (the MXFP4 masked decode kernel on an sm_90 GPU or under
        ``DFG_SIMULATE=1``, the float64 reference of its path on CPU); inference only."""
        p13 = prepare_mxfp4_weights(w13, w13_scale, in_place=in_place)
        p2 = prepare_mxfp4_weights(w2, w2_scale, in_place=in_place)
        num_experts, hidden, inter = check_mxfp4_experts(p13, p2)
        module = cls(num_experts, hidden, inter, device="meta", fused_swiglu=False)
        module.experts_format = "mxfp4"
        for name in ("w13", "w13_scale", "w2", "w2_scale"):
            module.register_buffer(name, None)
        for name, p in (("w13", p13), ("w2", p2)):
            module.register_buffer(f"{name}_mxfp4_tiles", p.tiles)
            module.register_buffer(f"{name}_mxfp4_meta", p.meta)
            module.register_buffer(f"{name}_mxfp4_wave_per32", p.wave_per32)
        return module

    @property
    def mxfp4_experts(self) -> tuple[PreparedMxfp4, PreparedMxfp4]:
        """``(w13, w2)`` as :class:`~deep_fp8_gemm.ops.mxfp4.PreparedMxfp4` views of a :meth:`from_mxfp4` layer's
        buffers (on their current device)."""
        if self.experts_format != "mxfp4":
            raise ValueError(f"mxfp4_experts: this layer's experts are {self.experts_format}, not mxfp4")
        return tuple(PreparedMxfp4(getattr(self, f"{n}_mxfp4_tiles"), getattr(self, f"{n}_mxfp4_meta"),
                                   getattr(self, f"{n}_mxfp4_wave_per32")) for n in ("w13", "w2"))

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]`` bf16, ``topk_ids [T, top_k]`` int (-1 = dropped), ``topk_weights [T, top_k]``
        fp32 -> ``[T, H]`` bf16 (see :func:`fp8_moe_forward`; training: :func:`deep_fp8_gemm.autograd.fp8_moe`;
        MXFP4 experts: :func:`mxfp4_moe_forward`)."""
        if self.experts_format == "mxfp4":
            if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                               for t in (hidden, topk_weights)):
                raise NotImplementedError("FP8MoE with MXFP4 experts is inference-only (no backward): run it under "
                                          "torch.no_grad() or with inputs that do not require grad")
            return mxfp4_moe_forward(hidden, topk_ids, topk_weights, *self.mxfp4_experts)
        if self.master_dtype is not None:
            return fp8_moe(hidden, topk_ids, topk_weights, self.w13, self.w2)
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (hidden, topk_weights)):
            return fp8_moe_frozen(hidden, topk_ids, topk_weights, self.w13, self.w13_scale, self.w2, self.w2_scale)
        return fp8_moe_forward(hidden, topk_ids, topk_weights, self.w13, self.w13_scale, self.w2, self.w2_scale,
                               w13_swiglu=self.swiglu_pair)

    def extra_repr(self) -> str:
        master = "" if self.master_dtype is None else f", master_dtype={self.master_dtype}"
        master += "" if self.fused_swiglu or self.experts_format != "e4m3" else ", fused_swiglu=False"
        master += ", experts_format=mxfp4" if self.experts_format == "mxfp4" else ""
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}{master}")
