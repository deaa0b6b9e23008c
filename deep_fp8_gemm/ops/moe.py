"""The MoE expert pipeline over the grouped GEMM families: the steps every MoE forward shares.

:func:`deep_fp8_gemm.moe.fp8_moe_forward` (inference), the training forward of
:func:`deep_fp8_gemm.autograd.fp8_moe` and the expert-parallel layers of :mod:`deep_fp8_gemm.distributed` are
built from these functions, so they compute the same thing with the same ops in the same order (the bit-for-bit
identities the tests check follow from that, not from copies kept in step):

* :func:`check_routed_inputs` / :func:`check_weights` / :func:`check_expert_sizes`: the argument rules;
* :func:`route` — ``topk_ids`` -> the contiguous layout (:func:`deep_fp8_gemm.layout.route_topk`), with the
  sync-free row bound under ``torch.compile``;
* :func:`experts_contiguous` — gather the quantised rows, ``w13`` grouped GEMM, SiLU·mul + quantise, ``w2`` grouped
  GEMM; returns the intermediates the backward saves too;
* :func:`combine` — the weighted un-permute, fp32 in slot order;
* :func:`experts_masked` — the decode variant on the masked grouped GEMM;
* :func:`quantise_experts` — ``[E, n, k]`` weights to 128x128 blocks per expert;
* :func:`swiglu_weights` / :func:`use_fused_swiglu` — the fused up-projection (issue 27).

The up-projection has two paths. Unfused: the ``w13`` GEMM writes ``gate | up`` in bf16 (``[rows, 2I]``) and
``silu_mul_quant`` reads it back (two kernels). Fused: given ``w13_swiglu`` — the interleaved weights of
:func:`swiglu_weights`, derived once when a layer loads its weights — one kernel
(``m_grouped_gemm_fp8_fp8_fp8_nt_{contiguous,masked}_swiglu``) computes ``SiLU(gate) * up`` from its fp32
accumulators and writes ``h`` as e4m3 with 1x128 scales: per routed row ``8I`` bytes (bf16 written and read) and a
launch less. It runs where legal (``I % 128 == 0``) and the cost model predicts it no slower
(:func:`use_fused_swiglu`: at DeepSeek-V3's shapes, every m). The two differ in numerics only by the bf16
rounding of ``gate | up`` the fused path skips (calc_diff <= 2e-3 against the unfused path, closer to float64) and,
at e4m3 rounding ties, by the quantisation (the fused epilogue multiplies by ``fl(1 / scale)``, ``silu_mul_quant``
divides: one step, rarely).
"""

from __future__ import annotations

import torch

from ..config import fused_swiglu_wins
from ..constants import DEFAULT_NUM_SMS, GRAN_K
from ..layout import RoutedLayout, max_m_sum_bound, route_topk
from ..quant import per_block_cast_to_fp8, silu_mul_quant
from ..runtime import target
from ..runtime.target import Backend
from ..utils import ceil_div, get_col_major_tma_aligned_tensor, get_m_alignment_for_contiguous_layout
from .contiguous import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu
from .masked import m_grouped_gemm_fp8_fp8_bf16_nt_masked, m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu
from .outputs import SwigluWeights, empty_out, interleave_swiglu_weights

FP8 = torch.float8_e4m3fn
#: Integer dtypes accepted for ``topk_ids``.
INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: Dtypes accepted for ``topk_weights``.
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---------------------------------------------------------------------------------------------- checks
def check_tensor_of(t: object, name: str, dtypes: tuple[torch.dtype, ...], rank: int) -> torch.Tensor:
    """A tensor of one of ``dtypes`` and rank ``rank``; returns it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {name}.dtype={t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got {name}.shape={tuple(t.shape)}")
    return t


def check_same_device(named: tuple[tuple[torch.Tensor, str], ...]) -> None:
    """Every tensor of ``named`` on the first one's device (messages name both)."""
    device = named[0][0].device
    for t, name in named[1:]:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device: {named[0][1]} is on {device}, {name} on {t.device}")


def check_expert_sizes(hidden: int, inter: int, what: str = "H and I") -> None:
    """``H`` and ``I`` positive multiples of 16: the 16-byte fp8 rows (TMA) of every forward and backward GEMM."""
    if hidden <= 0 or inter <= 0 or hidden % 16 or inter % 16:
        raise ValueError(f"{what} must be positive multiples of 16 (16-byte fp8 rows for TMA), got H={hidden} "
                         f"I={inter}")


def check_expert_shapes(w13: torch.Tensor, w2: torch.Tensor) -> tuple[int, int, int]:
    """``w13`` ``[E, 2I, H]`` and ``w2`` ``[E, H, I]`` (any dtypes, already checked) on one device; returns
    ``(E, H, I)``."""
    num_experts, two_i, hidden = w13.shape
    if num_experts < 1 or two_i == 0 or two_i % 2:
        raise ValueError(f"w13 must be [E, 2I, H] with E >= 1 and I >= 1, got w13.shape={tuple(w13.shape)}")
    inter = two_i // 2
    check_expert_sizes(hidden, inter)
    if tuple(w2.shape) != (num_experts, hidden, inter):
        raise ValueError(f"w2 must be [E, H, I]={(num_experts, hidden, inter)} (from w13.shape={tuple(w13.shape)}), "
                         f"got w2.shape={tuple(w2.shape)}")
    if w2.device != w13.device:
        raise ValueError(f"w13 and w2 must be on one device, got {w13.device} and {w2.device}")
    return num_experts, hidden, inter


def check_weights(w13, w13_scale, w2, w2_scale) -> tuple[int, int, int]:
    """The quantised expert weights (e4m3 + 128x128 block scales, one device); returns ``(E, H, I)``."""
    check_tensor_of(w13, "w13", (FP8,), 3)
    check_tensor_of(w2, "w2", (FP8,), 3)
    check_tensor_of(w13_scale, "w13_scale", (torch.float32,), 3)
    check_tensor_of(w2_scale, "w2_scale", (torch.float32,), 3)
    num_experts, hidden, inter = check_expert_shapes(w13, w2)
    expected = (num_experts, ceil_div(2 * inter, GRAN_K), ceil_div(hidden, GRAN_K))
    if tuple(w13_scale.shape) != expected:
        raise ValueError(f"w13_scale must be [E, ceil(2I/128), ceil(H/128)]={expected}, got {tuple(w13_scale.shape)}")
    expected = (num_experts, ceil_div(hidden, GRAN_K), ceil_div(inter, GRAN_K))
    if tuple(w2_scale.shape) != expected:
        raise ValueError(f"w2_scale must be [E, ceil(H/128), ceil(I/128)]={expected}, got {tuple(w2_scale.shape)}")
    check_same_device(((w13, "w13"), (w13_scale, "w13_scale"), (w2, "w2"), (w2_scale, "w2_scale")))
    return num_experts, hidden, inter


def check_tokens(hidden, topk_ids, topk_weights, hidden_size: int, device: torch.device,
                 dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)) -> int:
    """``hidden`` ``[T, H]`` of ``dtypes``, ``topk_ids`` / ``topk_weights`` ``[T, top_k]`` on ``device``; returns T."""
    check_tensor_of(hidden, "hidden", dtypes, 2)
    check_tensor_of(topk_ids, "topk_ids", INDEX_DTYPES, 2)
    check_tensor_of(topk_weights, "topk_weights", WEIGHT_DTYPES, 2)
    num_tokens = hidden.shape[0]
    if hidden.shape[1] != hidden_size:
        raise ValueError(f"hidden must be [T, H] with H={hidden_size} (from w13), got hidden.shape={tuple(hidden.shape)}")
    if topk_ids.shape[0] != num_tokens or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [T={num_tokens}, top_k], got "
                         f"topk_ids.shape={tuple(topk_ids.shape)} topk_weights.shape={tuple(topk_weights.shape)}")
    for t, name in ((hidden, "hidden"), (topk_ids, "topk_ids"), (topk_weights, "topk_weights")):
        if t.device != device:
            raise ValueError(f"all tensors must be on one device: the weights are on {device}, {name} on {t.device}")
    return num_tokens


def check_routed_inputs(hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale,
                        dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)) -> tuple[int, int, int, int]:
    """Checks shared by every routed MoE forward (single-process and expert-parallel): dtypes (``hidden`` one of
    ``dtypes``), ranks, shapes and one device. Returns ``(num_experts of w13, H, I, T)``; expert-id ranges are the
    caller's."""
    num_experts, hidden_size, inter = check_weights(w13, w13_scale, w2, w2_scale)
    num_tokens = check_tokens(hidden, topk_ids, topk_weights, hidden_size, w13.device, dtypes)
    return num_experts, hidden_size, inter, num_tokens


# ---------------------------------------------------------------------------------------------- pipeline
def route(topk_ids: torch.Tensor, num_experts: int, max_m_sum: int | None) -> RoutedLayout:
    """``topk_ids`` -> the contiguous layout padded to the contiguous alignment. ``max_m_sum`` None: the exact
    padded total (one host sync on a GPU) — except under ``torch.compile`` and on meta tensors (no values to
    read), where the sync-free bound :func:`deep_fp8_gemm.layout.max_m_sum_bound` is used."""
    alignment = get_m_alignment_for_contiguous_layout()
    if max_m_sum is None and (torch.compiler.is_compiling() or topk_ids.device.type == "meta"):
        max_m_sum = max_m_sum_bound(topk_ids.numel(), num_experts, alignment)
    return route_topk(topk_ids, num_experts, alignment, max_m_sum=max_m_sum)


def swiglu_weights(w13: torch.Tensor, w13_scale: torch.Tensor) -> SwigluWeights | None:
    """The fused up-projection's weights (:func:`deep_fp8_gemm.interleave_swiglu_weights`: a copy
    of ``w13`` with gate and up interleaved in 128-row blocks), or None where the fused path is illegal
    (``I % 128 != 0``)."""
    if w13.shape[1] % (2 * GRAN_K):
        return None
    return interleave_swiglu_weights(w13, w13_scale)


def check_swiglu_weights(w13_swiglu: object, w13: torch.Tensor, w13_scale: torch.Tensor) -> None:
    """``w13_swiglu`` is None or what :func:`swiglu_weights` returns for ``(w13, w13_scale)``: a
    :class:`~deep_fp8_gemm.ops.outputs.SwigluWeights` (the interleaved layout is in its type: a plain pair, such as
    the checkpoint's ``(w13, w13_scale)``, has the same shapes but other columns, so it is refused) of the same
    dtypes, shapes and device. Its values are not compared (that would cost a pass over the weights)."""
    if w13_swiglu is None:
        return
    if not isinstance(w13_swiglu, SwigluWeights):
        raise TypeError(f"w13_swiglu must be None or what swiglu_weights(w13, w13_scale) returns (a SwigluWeights: "
                        f"gate / up blocks interleaved), got {type(w13_swiglu).__name__}; a plain pair such as the "
                        "checkpoint's (w13, w13_scale) would compute the wrong columns")
    for got, want, name in zip(w13_swiglu, (w13, w13_scale), ("w13_swiglu[0]", "w13_swiglu[1]")):
        check_tensor_of(got, name, (want.dtype,), want.dim())
        if got.shape != want.shape or got.device != want.device:
            raise ValueError(f"{name} must match {('w13', 'w13_scale')[name[-2] == '1']}: shape {tuple(want.shape)} on "
                             f"{want.device}, got shape {tuple(got.shape)} on {got.device}")


def use_fused_swiglu(w13_swiglu, layout: str, m: int, inter: int, hidden: int, num_groups: int, device: torch.device,
                     silu_rows: int | None = None) -> bool:
    """Whether an up-projection runs fused: ``w13_swiglu`` given and :func:`deep_fp8_gemm.config.fused_swiglu_wins`
    (legal, modelled no slower) for the SM count the GEMMs plan for on ``device`` (132 where the CPU reference runs,
    so that CPU and GPU take the same path)."""
    if w13_swiglu is None:
        return False
    backend = target.backend_of(device, "gemm")
    if backend is Backend.REFERENCE:
        num_sms = DEFAULT_NUM_SMS
    else:
        from ..kernels.gemm import num_sms_for

        num_sms = num_sms_for(backend)
    return _fused_swiglu_wins(layout, int(m), inter, hidden, num_groups, num_sms, silu_rows)


# A pure function of host integers: under torch.compile its answer is a constant of the graph (not traced through the
# heuristic's caches).
_fused_swiglu_wins = torch.compiler.assume_constant_result(fused_swiglu_wins)


def experts_contiguous(x_fp8, x_scales, routed: RoutedLayout, w13, w13_scale, w2, w2_scale, w13_swiglu=None
                       ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Gather, ``w13`` GEMM, SiLU·mul + quantise, ``w2`` GEMM over already-quantised rows.

    ``x_fp8`` ``[T, H]`` e4m3 and ``x_scales`` ``[T, ceil(H/128)]`` float32 (any strides) are the rows that
    ``routed.gather_index`` indexes; ``routed.layout.m_sum > 0``. ``w13_swiglu``: the interleaved ``(w13, w13_scale)``
    of :func:`swiglu_weights`; when given, the first GEMM and SiLU·mul + quantise are one fused kernel wherever
    :func:`use_fused_swiglu` says. Returns ``(gate_up, down)``: ``gate_up`` ``[m_sum, 2I]`` bf16, the ``w13``
    GEMM's output (what the backward's SwiGLU needs; None on the fused path, which never writes it), and ``down``
    ``[m_sum + 1, H]`` bf16: row ``r < m_sum`` = ``FFN_e(x[gather_index[r]])`` for non-padding rows, the last row
    zeros (see :func:`combine`).
    """
    m_sum, m_indices = routed.layout.m_sum, routed.layout.m_indices
    hidden_size, inter = w13.shape[2], w13.shape[1] // 2
    # Padding rows (gather_index -1) read token 0: any finite row will do, their outputs are never used.
    rows = routed.gather_index.clamp(min=0)
    a = x_fp8.view(torch.uint8).index_select(0, rows).view(FP8)
    # x_scales is M-major [T, g]: select along T of its [g, T] transpose -> [g, m_sum] contiguous, whose
    # transpose is exactly the M-major TMA-aligned layout (m_sum is a multiple of the alignment, itself of 4).
    a_scales = x_scales.t().index_select(1, rows).t()

    if use_fused_swiglu(w13_swiglu, "contiguous", m_sum, inter, hidden_size, w13.shape[0], x_fp8.device):
        gate_up = None
        h_fp8, h_scales = empty_out((), m_sum, inter, x_fp8.device)
        m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, a_scales), w13_swiglu, (h_fp8, h_scales), m_indices)
    else:
        gate_up = torch.empty((m_sum, 2 * inter), dtype=torch.bfloat16, device=x_fp8.device)
        m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, a_scales), (w13, w13_scale), gate_up, m_indices)
        h_fp8, h_scales = silu_mul_quant(gate_up)
    # One extra zero row after the GEMM's rows: dropped slots read it, so the combine needs no masking.
    down = torch.empty((m_sum + 1, hidden_size), dtype=torch.bfloat16, device=x_fp8.device)
    down[m_sum].zero_()
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((h_fp8, h_scales), (w2, w2_scale), down[:m_sum], m_indices)
    return gate_up, down


def combine(down: torch.Tensor, scatter_index: torch.Tensor, topk_weights: torch.Tensor,
            dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * down[scatter_index[t, j]]`` in fp32, slot order j = 0, 1, ... (deterministic,
    no atomics), rounded once to ``dtype`` (bf16; fp16 for an fp16 layer).

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
        acc.addcmul_(gathered[:, j], weights[:, j: j + 1])
    return acc.to(dtype)


def experts_masked(a, a_scales, counts, w13, w13_scale, w2, w2_scale, expected_m: int, w13_swiglu=None
                   ) -> torch.Tensor:
    """The two masked grouped GEMMs and SiLU·mul + quantise on already-quantised rows (the decode path).

    ``a`` ``[E, m_max, H]`` e4m3 (contiguous), ``a_scales`` ``[E, m_max, ceil(H/128)]`` float32 (any strides;
    copied to the M-major layout unless already in it), ``counts`` ``[E]`` int32 on the device (never read on
    the host), ``m_max > 0``; ``w13_swiglu`` as :func:`experts_contiguous` (fused: the masked SwiGLU kernel).
    Returns ``[E, m_max, H]`` bfloat16, rows ``>= counts[e]`` unspecified.
    """
    num_experts, m_max, hidden_size = a.shape
    inter = w13.shape[1] // 2
    a_scales = get_col_major_tma_aligned_tensor(a_scales)
    out = torch.empty((num_experts, m_max, hidden_size), dtype=torch.bfloat16, device=a.device)
    if use_fused_swiglu(w13_swiglu, "masked", expected_m, inter, hidden_size, num_experts, a.device,
                        silu_rows=num_experts * m_max):
        h_fp8, h_scales = empty_out((num_experts,), m_max, inter, a.device)
        m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu((a, a_scales), w13_swiglu, (h_fp8, h_scales), counts, expected_m)
    else:
        gate_up = torch.empty((num_experts, m_max, 2 * inter), dtype=torch.bfloat16, device=a.device)
        m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, a_scales), (w13, w13_scale), gate_up, counts, expected_m)
        h_fp8, h_scales = silu_mul_quant(gate_up)
    m_grouped_gemm_fp8_fp8_bf16_nt_masked((h_fp8, h_scales), (w2, w2_scale), out, counts, expected_m)
    return out


def quantise_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[E, n, k]`` -> (e4m3 ``[E, n, k]``, ``[E, ceil(n/128), ceil(k/128)]``), 128x128 blocks per expert.

    With ``n % 128 == 0`` no block straddles two experts, so one quantiser call on ``[E·n, k]`` gives the same
    bits as a call per expert (the training path quantises its master weights on every forward)."""
    num_experts, n, k = w.shape
    if n % GRAN_K == 0:
        w_fp8, w_sf = per_block_cast_to_fp8(w.reshape(num_experts * n, k))
        return w_fp8.view(num_experts, n, k), w_sf.view(num_experts, n // GRAN_K, -1)
    pairs = [per_block_cast_to_fp8(w[e]) for e in range(num_experts)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
