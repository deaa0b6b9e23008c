"""MoE contiguous-layout builder: per-expert token counts -> padded segments, ``m_indices`` and index maps.

The contiguous grouped GEMM (:func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`) reads A as
``[m_sum, k]`` with every expert's rows together, each expert segment starting at a multiple of
``alignment`` (by default :func:`deep_fp8_gemm.get_m_alignment_for_contiguous_layout`: 128, or 64 when set) and padded up to the
next multiple with rows whose ``m_indices`` entry is -1. An expert with no tokens gets an empty segment
(it costs the GEMM nothing).

Everything here is vectorised torch (no Python loop over tokens or experts) and gives identical results on
CPU and CUDA. The only host synchronisation is reading the padded total ``m_sum`` back from the device;
pass ``max_m_sum`` (a host upper bound) to stay sync-free, e.g. under CUDA-graph capture or
``torch.compile(fullgraph=True)``: the extra tail rows are then padding (-1) too.

Example (``alignment=4`` for brevity): counts ``[2, 0, 5]`` -> padded sizes ``[4, 0, 8]``, offsets
``[0, 4, 4, 12]``, ``m_sum = 12``, ``m_indices = [0, 0, -1, -1, 2, 2, 2, 2, 2, -1, -1, -1]``.
"""

from __future__ import annotations

import dataclasses

import torch

from .utils import get_m_alignment_for_contiguous_layout

_INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

__all__ = [
    "ContiguousLayout",
    "RoutedLayout",
    "build_contiguous_layout",
    "max_m_sum_bound",
    "route_topk",
]


@dataclasses.dataclass(frozen=True)
class ContiguousLayout:
    """The contiguous grouped layout of ``E`` experts (all tensors on the device of the counts).

    Attributes:
        tokens_per_expert: ``[E]`` int64, real rows of each expert.
        padded_sizes: ``[E]`` int64, ``ceil(tokens / alignment) * alignment`` (0 for an expert with no tokens).
        offsets: ``[E + 1]`` int64, segment starts (exclusive prefix sum of ``padded_sizes``); every entry is a
            multiple of ``alignment``; ``offsets[E]`` is the padded total (``<= m_sum``).
        m_sum: total rows of the layout (host int, a multiple of ``alignment``): the padded total, or
            ``max_m_sum`` when the layout was built sync-free (the rows past ``offsets[E]`` are padding).
        m_indices: ``[m_sum]`` int32, expert of each row, -1 for padding rows (the tail of each segment and
            everything past ``offsets[E]``); the argument of the contiguous grouped GEMM.
        alignment: the segment alignment used.
    """

    tokens_per_expert: torch.Tensor
    padded_sizes: torch.Tensor
    offsets: torch.Tensor
    m_sum: int
    m_indices: torch.Tensor
    alignment: int

    @property
    def num_experts(self) -> int:
        return int(self.padded_sizes.shape[0])


@dataclasses.dataclass(frozen=True)
class RoutedLayout:
    """Result of :func:`route_topk`.

    Attributes:
        layout: the :class:`ContiguousLayout` of the routed rows.
        gather_index: ``[m_sum]`` int64, the token (row of ``hidden``) each contiguous row reads; -1 for
            padding rows. Rows of one expert keep token order (the sort is stable).
        scatter_index: ``[T, top_k]`` int64, the contiguous row slot ``(t, j)`` was sent to; -1 for a dropped
            slot (``topk_ids[t, j] == -1``). Un-permute with ``out[t] = sum_j w[t, j] * y[scatter_index[t, j]]``.
    """

    layout: ContiguousLayout
    gather_index: torch.Tensor
    scatter_index: torch.Tensor


def _check_alignment(alignment: object) -> int:
    """``alignment`` itself (any positive int), or the contiguous alignment for None."""
    if alignment is None:
        return get_m_alignment_for_contiguous_layout()
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise TypeError(f"alignment must be an int, got {type(alignment).__name__} ({alignment!r})")
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment=}")
    return alignment


def _check_max_m_sum(max_m_sum: object, alignment: int) -> int | None:
    if max_m_sum is None:
        return None
    if isinstance(max_m_sum, bool) or not isinstance(max_m_sum, int):
        raise TypeError(f"max_m_sum must be an int or None, got {type(max_m_sum).__name__} ({max_m_sum!r})")
    if max_m_sum < 0 or max_m_sum % alignment != 0:
        raise ValueError(f"max_m_sum must be a non-negative multiple of alignment, got {max_m_sum=} {alignment=}")
    return max_m_sum


def max_m_sum_bound(num_slots: int, num_experts: int, alignment: int | None = None) -> int:
    """Host upper bound of the padded total for ``num_slots`` routed rows over ``num_experts`` experts.

    At most ``min(num_experts, num_slots)`` experts are non-empty and each wastes at most ``alignment - 1``
    padding rows, so ``m_sum <= round_up(num_slots + min(E, num_slots) * (alignment - 1), alignment)``.
    Use it as ``max_m_sum`` to build a layout without reading counts back to the host. ``alignment`` None: the
    contiguous alignment (:func:`deep_fp8_gemm.get_m_alignment_for_contiguous_layout`).
    """
    alignment = _check_alignment(alignment)
    if num_slots < 0 or num_experts < 0:
        raise ValueError(f"num_slots and num_experts must be non-negative, got {num_slots=} {num_experts=}")
    bound = num_slots + min(num_experts, num_slots) * (alignment - 1)
    return (bound + alignment - 1) // alignment * alignment


def build_contiguous_layout(
    tokens_per_expert: torch.Tensor, alignment: int | None = None, *, max_m_sum: int | None = None
) -> ContiguousLayout:
    """Builds the contiguous grouped layout from per-expert token counts.

    Args:
        tokens_per_expert: ``[E]`` integer tensor (any integer dtype, any device), ``E >= 1``, entries >= 0.
        alignment: rows each segment is padded to; None (default): the grouped GEMMs' contiguous alignment,
            :func:`deep_fp8_gemm.get_m_alignment_for_contiguous_layout` (128, or 64 when set), read per call.
        max_m_sum: ``None`` (default): ``m_sum`` is the exact padded total, read back to the host — this
            **synchronises** when the counts are on a GPU. An int: use this many rows without reading the
            counts (no sync, CUDA-graph / ``torch.compile`` friendly); it must be a multiple of ``alignment``
            and at least the padded total (checked on the device with ``torch._assert_async``, see
            :func:`max_m_sum_bound`); rows past the padded total are padding (-1).

    Returns:
        :class:`ContiguousLayout` (tensors on the counts' device).

    Raises:
        TypeError: counts not an integer tensor; alignment / max_m_sum not ints.
        ValueError: counts not 1-D or empty, a negative count (checked when the counts are read back), bad
            alignment or max_m_sum.
    """
    if not isinstance(tokens_per_expert, torch.Tensor):
        raise TypeError(f"tokens_per_expert must be a torch.Tensor, got {type(tokens_per_expert).__name__}")
    if tokens_per_expert.dtype not in _INDEX_DTYPES:
        raise TypeError(
            f"tokens_per_expert must be an integer tensor, got tokens_per_expert.dtype={tokens_per_expert.dtype}"
        )
    if tokens_per_expert.dim() != 1 or tokens_per_expert.shape[0] == 0:
        raise ValueError(f"tokens_per_expert must be 1-D [E] with E >= 1, got shape={tuple(tokens_per_expert.shape)}")
    alignment = _check_alignment(alignment)
    max_m_sum = _check_max_m_sum(max_m_sum, alignment)

    counts = tokens_per_expert.to(torch.int64)
    padded = (counts + (alignment - 1)) // alignment * alignment
    offsets = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=counts.device)
    offsets[1:] = torch.cumsum(padded, 0)

    if max_m_sum is None:
        # The one host sync of this module (counts and total read together).
        if bool((counts < 0).any()):
            raise ValueError(f"tokens_per_expert must be non-negative, got {tokens_per_expert.tolist()}")
        m_sum = int(offsets[-1].item())
    else:
        m_sum = max_m_sum
        torch._assert_async(
            (offsets[-1] <= m_sum) & (counts >= 0).all(), "max_m_sum below the padded total, or a negative count"
        )

    m_indices = _m_indices(counts, offsets, m_sum)
    return ContiguousLayout(counts, padded, offsets, m_sum, m_indices, alignment)


def _m_indices(counts: torch.Tensor, offsets: torch.Tensor, m_sum: int) -> torch.Tensor:
    """``[m_sum]`` int32: expert of each row, -1 for padding (see :class:`ContiguousLayout`)."""
    num_experts = counts.shape[0]
    rows = torch.arange(m_sum, dtype=torch.int64, device=counts.device)
    # Row r lies in segment e iff offsets[e] <= r < offsets[e + 1], i.e. e = #(segment ends <= r); empty
    # segments have end == start and are counted past, so they never own a row.
    expert = torch.searchsorted(offsets[1:].contiguous(), rows, right=True)
    in_range = expert < num_experts
    expert = expert.clamp(max=num_experts - 1)
    local = rows - offsets[expert]
    is_token = in_range & (local < counts[expert])
    return torch.where(is_token, expert, torch.full_like(expert, -1)).to(torch.int32)


def route_topk(
    topk_ids: torch.Tensor, num_experts: int, alignment: int | None = None, *, max_m_sum: int | None = None
) -> RoutedLayout:
    """Routes top-k expert choices into the contiguous grouped layout.

    Args:
        topk_ids: ``[T, top_k]`` integer tensor (any device); entry ``(t, j)`` is the expert of token ``t``'s
            ``j``-th choice, in ``[0, num_experts)``, or -1 for a dropped slot (expert parallelism: the expert
            lives elsewhere). Out-of-range ids raise ``ValueError`` on CPU in eager mode, and trip
            ``torch._assert_async`` (no host sync) on GPU and under ``torch.compile``.
        num_experts: ``E >= 1``.
        alignment: segment alignment; None (default): the contiguous alignment, as in
            :func:`build_contiguous_layout`.
        max_m_sum: as in :func:`build_contiguous_layout` (``None`` syncs once to read the padded total; pass
            ``max_m_sum_bound(T * top_k, E, alignment)`` to stay sync-free).

    Returns:
        :class:`RoutedLayout`: the layout (rows of expert ``e`` are the slots routed to ``e`` in ``(t, j)``
        row-major order), ``gather_index [m_sum]`` and ``scatter_index [T, top_k]``.

    Raises:
        TypeError / ValueError: bad argument types, shapes or values (messages name the argument).
    """
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype not in _INDEX_DTYPES:
        raise TypeError(f"topk_ids must be an integer tensor, got topk_ids.dtype={topk_ids.dtype}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D [T, top_k], got shape={tuple(topk_ids.shape)}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        raise TypeError(f"num_experts must be an int, got {type(num_experts).__name__} ({num_experts!r})")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts=}")
    alignment = _check_alignment(alignment)
    max_m_sum = _check_max_m_sum(max_m_sum, alignment)

    num_tokens, top_k = topk_ids.shape
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    out_of_range = (flat < -1) | (flat >= num_experts)
    if device.type == "cpu" and not torch.compiler.is_compiling():
        if bool(out_of_range.any()):
            bad = flat[out_of_range][:8].tolist()
            raise ValueError(f"topk_ids entries must be -1 or in [0, {num_experts}), got e.g. {bad}")
    else:
        torch._assert_async(~out_of_range.any(), "topk_ids entries must be -1 or in [0, num_experts)")

    valid = flat >= 0
    key = torch.where(valid, flat, torch.full_like(flat, num_experts))  # dropped slots sort last
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    layout = build_contiguous_layout(counts, alignment, max_m_sum=max_m_sum)

    # Stable sort keeps (t, j) order inside each expert; a slot's rank in its expert is its sorted position
    # minus the number of slots routed to lower experts.
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    starts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    starts[1:] = torch.cumsum(counts, 0)
    positions = torch.arange(flat.shape[0], dtype=torch.int64, device=device)
    expert_of_sorted = sorted_key.clamp(max=num_experts - 1)
    dest_sorted = layout.offsets[expert_of_sorted] + (positions - starts[expert_of_sorted])
    dest_sorted = torch.where(sorted_key < num_experts, dest_sorted, torch.full_like(dest_sorted, -1))

    scatter = torch.empty_like(dest_sorted)
    scatter[order] = dest_sorted
    m_sum = layout.m_sum
    # Dropped slots write to an extra sink row m_sum that is cut off, so no data-dependent masking is needed.
    gather = torch.full((m_sum + 1,), -1, dtype=torch.int64, device=device)
    sink = torch.where(scatter >= 0, scatter, torch.full_like(scatter, m_sum))
    gather.scatter_(0, sink, positions // max(top_k, 1))
    return RoutedLayout(layout, gather[:m_sum], scatter.view(num_tokens, top_k))
