"""Expert-parallel FP8 MoE forward, prefill / training shapes (contiguous layout).

Sharding: rank ``r`` of the group owns global experts ``[r*E_local, (r+1)*E_local)``; ``topk_ids`` hold global
ids (-1 = dropped slot). Every rank calls :func:`ep_moe_forward` with its own tokens (any count, 0 included).

Steps (rank = "source" for its own tokens, "expert rank" for the tokens it receives):

1. quantise the local tokens per token, 1x128 (once; the same bytes go to every destination);
2. plan: a token goes once to each rank that owns at least one of its experts (a token with two experts on
   one rank is sent once), in ``(destination rank, token)`` order;
3. exchange a fixed-size header per rank pair with one ``all_to_all_single``: ``H``, ``top_k``, ``E_local``,
   tokens and slots for the destination, and a status record (:mod:`.status`); read back to the host once (the
   split sizes of the next collectives). Fixed-size, so that nothing a rank passes can change its size: a rank
   whose arguments failed their checks sends an error status (and raises after the exchange), a peer with
   another ``H``, ``top_k`` or ``E_local`` makes the shapes disagree — either way every rank raises the same
   error here, before any payload moves;
4. dispatch: one ``all_to_all_single`` of packed uint8 rows (:mod:`.wire`: fp8 payload, scales, local ids);
5. on the expert rank: ``layout.route_topk`` over the received rows' local ids (reading the exact padded total
   back: the second host synchronisation), then ``ops.moe.experts_contiguous``: grouped GEMM, fused
   SiLU·mul+quant, grouped GEMM — the single-GPU layer's code (with ``w13_swiglu``: the SwiGLU-fused
   up-projection, as there);
6. return: one bf16 row per routed slot, in ``(source token, slot)`` order (``all_to_all_single``);
7. combine on the source: ``ops.moe.combine``, fp32 in slot order ``j = 0, 1, ...``, one rounding to bf16.

Equality with the single-process layer: the expert rank sees each expert's rows in global token order
``(source rank, token, slot)`` — exactly the rows, order and padding that ``fp8_moe_forward`` over all ranks'
tokens concatenated builds for that expert — and the return path carries the unweighted bf16 expert outputs
that the single-process combine reads, combined with the same arithmetic in the same order. So the result is
**bit-identical** to ``moe.fp8_moe_forward(cat(all ranks' tokens), ..., all experts)[this rank's rows]`` (given
``w13_swiglu`` on both sides or on neither: the fused and the unfused up-projection differ by a bf16 rounding)
(tested on CPU with 2 and 3 gloo ranks; on a GPU it holds as long as a GEMM row's result does not depend on the
other experts' rows, which the kernels' per-tile math gives — not yet measured). Returning per-slot rows costs ``top_k`` rows per token instead of one
reduced row per (token, rank) — DeepEP's combine sums on the expert rank, which changes the summation order.

Bytes per token (``g = ceil(H/128)``): dispatch ``H + 4g + 4·top_k`` per (token, destination rank) — half
of a bf16 dispatch — plus ``40 + 256`` per rank pair for the header (sizes, counts, status); return ``2H`` per
routed slot.

Host synchronisation: two — reading the header (``all_to_all_single`` with uneven splits needs host sizes;
DeepEP's normal mode syncs for the same reason) and the padded row count of the received experts' layout (the
per-expert counts used to ride in the header, whose width then depended on ``E_local``: a peer with another
``E_local`` made gloo abort the process). On gloo every collective also blocks the calling thread.
"""

from __future__ import annotations

import struct

import torch
import torch.distributed as dist

from ..layout import route_topk
from ..ops.moe import check_swiglu_weights, combine, experts_contiguous
from ..quant import per_token_cast_to_fp8
from ..utils import get_m_alignment_for_contiguous_layout
from .checks import check_ep_inputs, check_peer_shapes
from .comm import all_to_all_rows, group_size
from .status import OK, STATUS_BYTES, code_of, collective_device, decode, encode, raise_peer_errors
from .wire import pack_rows, row_bytes, unpack_rows

__all__ = ["ep_moe_forward"]


def _first_true(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` True entries of 1-D ``mask``, ascending, without a host sync (``count`` is known
    on the host): a stable sort puts the True entries first in their order."""
    return torch.sort((~mask).to(torch.uint8), stable=True).indices[:count]


def ep_moe_forward(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                   w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                   group: dist.ProcessGroup | None = None,
                   w13_swiglu: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Expert-parallel :func:`deep_fp8_gemm.moe.fp8_moe_forward` (module docstring: steps, exactness, bytes).

    Args:
        hidden: ``[T_local, H]`` bfloat16, this rank's tokens (``T_local`` may differ per rank, 0 included).
        topk_ids: ``[T_local, top_k]`` integer, **global** expert ids in ``[0, world * E_local)`` or -1 (dropped).
            ``top_k`` must be the same on every rank.
        topk_weights: ``[T_local, top_k]`` float32 (bf16 / fp16 widened).
        w13, w13_scale, w2, w2_scale: this rank's ``E_local`` experts, as in ``fp8_moe_forward``
            (``w13`` ``[E_local, 2I, H]`` e4m3 ...), holding global experts ``[rank*E_local, (rank+1)*E_local)``;
            same ``E_local``, ``H``, ``I`` on every rank.
        group: the process group of the expert-parallel ranks (``None``: the world). Tensors on CPU need a
            gloo group, on CUDA an NCCL one.
        w13_swiglu: ``ops.moe.swiglu_weights`` of this rank's ``(w13, w13_scale)``: the fused up-projection, as
            ``fp8_moe_forward``'s (:class:`~deep_fp8_gemm.distributed.EPMoE` passes its experts' pair).

    Returns:
        ``[T_local, H]`` bfloat16, a new tensor; tokens whose slots are all dropped get zeros.

    Raises:
        RuntimeError: ``torch.distributed`` not initialised (on this rank only). TypeError / ValueError: as
            ``fp8_moe_forward``, raised on **every** rank after the header exchange: this rank's own error, the same
            type naming the failing rank on the others (:mod:`.status`); ValueError on every rank when the ranks
            disagree on ``H``, ``top_k`` or ``E_local``.
    """
    world = group_size(group)
    try:
        shape = check_ep_inputs(hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, world)
        check_swiglu_weights(w13_swiglu, w13, w13_scale)
        error = None
    except (TypeError, ValueError) as exc:  # raised after the header exchange, on every rank (module docstring)
        shape, error = None, exc
    if error is not None:
        header = torch.zeros((world, _HEADER_FIELDS), dtype=torch.int64, device=collective_device(group))
        _exchange_header(header, error, group)  # raises
    num_tokens, top_k, hidden_size, num_local = shape.num_tokens, shape.top_k, shape.hidden, shape.num_local_experts
    device = hidden.device

    # 1-2. quantise once; plan one row per (destination rank, token) in that order.
    x_fp8, x_scales = per_token_cast_to_fp8(hidden)
    ids = topk_ids.to(torch.int64)
    dest = torch.where(ids >= 0, ids // num_local, torch.full_like(ids, world))  # world = dropped
    sends = torch.zeros((num_tokens, world + 1), dtype=torch.bool, device=device)
    sends.scatter_(1, dest, True)
    sends = sends[:, :world]
    slots_to = torch.zeros(world + 1, dtype=torch.int64, device=device)
    slots_to.scatter_add_(0, dest.reshape(-1), torch.ones(dest.numel(), dtype=torch.int64, device=device))

    # 3. the fixed-size header: (H, top_k, E_local | tokens, slots for the destination) + status, per rank pair.
    sizes = torch.tensor([hidden_size, top_k, num_local], dtype=torch.int64, device=device).expand(world, 3)
    header = torch.cat([sizes, sends.sum(0, dtype=torch.int64).unsqueeze(1), slots_to[:world].unsqueeze(1)], dim=1)
    sent, received = _exchange_header(header, None, group)
    send_tokens = [row[3] for row in sent]
    send_slots = [row[4] for row in sent]
    recv_tokens = [row[3] for row in received]
    recv_slots = [row[4] for row in received]

    # 4. dispatch packed rows; the local id of a slot is its expert minus the destination's first expert.
    pairs = _first_true(sends.t().reshape(-1), sum(send_tokens))  # flat (d, t), ascending
    pair_dest, pair_token = pairs // max(num_tokens, 1), pairs % max(num_tokens, 1)
    pair_ids = ids.index_select(0, pair_token)
    local_ids = torch.where(dest.index_select(0, pair_token) == pair_dest.unsqueeze(1),
                            pair_ids - (pair_dest * num_local).unsqueeze(1), torch.full_like(pair_ids, -1))
    send_rows = pack_rows(x_fp8.view(torch.uint8).index_select(0, pair_token).view(x_fp8.dtype),
                          x_scales.index_select(0, pair_token), local_ids)
    recv_rows = send_rows.new_empty((sum(recv_tokens), row_bytes(hidden_size, top_k)))
    all_to_all_rows(recv_rows, send_rows, recv_tokens, send_tokens, group=group)

    # 5-6. the experts over the received rows; return one bf16 row per routed slot, (row, slot) order.
    back = _expert_rows(recv_rows, sum(recv_slots), shape, w13, w13_scale, w2, w2_scale, w13_swiglu)
    # One extra zero row at the end: the combine reads it for dropped slots.
    returned = torch.zeros((sum(send_slots) + 1, hidden_size), dtype=torch.bfloat16, device=device)
    all_to_all_rows(returned[:-1], back, send_slots, recv_slots, group=group)

    # 7. slot (t, j) came back at its rank among the routed slots sorted by (destination, t, j).
    flat_dest = dest.reshape(-1)
    order = torch.sort(flat_dest, stable=True).indices[:sum(send_slots)]
    scatter = torch.full((num_tokens * top_k,), -1, dtype=torch.int64, device=device)
    scatter[order] = torch.arange(order.shape[0], dtype=torch.int64, device=device)
    if num_tokens == 0 or top_k == 0:
        return hidden.new_zeros((num_tokens, hidden_size))
    return combine(returned, scatter.view(num_tokens, top_k), topk_weights)


_HEADER_FIELDS = 5  # H, top_k, E_local, tokens, slots
_STATUS_WORDS = STATUS_BYTES // 8


def _exchange_header(header: torch.Tensor, error: BaseException | None, group) -> tuple[list, list]:
    """All-to-all of ``header`` ``[world, 5]`` int64 plus this rank's status record (fixed size); returns the host
    rows sent and received (the one synchronisation of the exchange). Raises on every rank when any rank failed
    its checks (``error`` here) or the ranks' (H, top_k, E_local) differ."""
    code = OK if error is None else code_of(error)
    status = torch.frombuffer(bytearray(encode(code, 0, "" if error is None else str(error))), dtype=torch.int64)
    status = status.to(header.device).expand(header.shape[0], _STATUS_WORDS)
    send = torch.cat([header, status], dim=1).contiguous()
    recv = torch.empty_like(send)
    all_to_all_rows(recv, send, group=group)
    sent, received = torch.stack([send, recv]).tolist()  # the first host synchronisation
    raise_peer_errors([decode(struct.pack(f"<{_STATUS_WORDS}q", *row[_HEADER_FIELDS:])) for row in received], error,
                      "ep_moe_forward")
    check_peer_shapes([row[:3] for row in received])
    return sent, received


def _expert_rows(recv_rows, num_slots, shape, w13, w13_scale, w2, w2_scale, w13_swiglu) -> torch.Tensor:
    """Runs this rank's experts on the received rows: ``[num_slots, H]`` bf16, one row per routed slot in
    (received row, slot) order."""
    hidden_size, top_k = shape.hidden, shape.top_k
    out = torch.empty((num_slots, hidden_size), dtype=torch.bfloat16, device=recv_rows.device)
    if num_slots == 0:
        return out
    x_fp8, x_scales, local_ids = unpack_rows(recv_rows, hidden_size, top_k)
    alignment = get_m_alignment_for_contiguous_layout()
    # The exact padded total, read back (the second synchronisation; the ids were checked by their sources).
    routed = route_topk(local_ids, shape.num_local_experts, alignment)
    _, down = experts_contiguous(x_fp8, x_scales, routed, w13, w13_scale, w2, w2_scale, w13_swiglu)
    flat = routed.scatter_index.reshape(-1)
    rows = flat.index_select(0, _first_true(flat >= 0, num_slots))
    torch.index_select(down, 0, rows, out=out)
    return out
