"""Expert-parallel FP8 MoE forward for decode under CUDA graphs: static buffers, the masked layout, no host sync.

Same sharding, quantise-before-send wire rows (:mod:`.wire`) and result as :func:`.ep_moe_forward`, with every
size fixed in advance by :class:`EPDecodeBuffers` (``max_tokens`` per rank):

1. quantise; each rank writes one row per (token, destination) into its send buffer ``[world, max_tokens]``
   (slot ``d*max_tokens + i`` for the ``i``-th token going to rank ``d``, found by a cumulative sum on the
   device); unused rows keep all-(-1) local ids, so the receiver can tell them apart without counts;
2. dispatch: ``all_to_all_single`` with equal splits (no host-side sizes): ``world * max_tokens`` rows each way;
3. on the expert rank: each valid (row, slot) goes to row ``pos`` of its expert in the masked layout
   ``[E_local, m_max, H]`` (``pos`` by a cumulative count on the device, in (source rank, token, slot) order —
   the global token order), ``masked_m[e]`` = rows of expert ``e`` (device tensor). ``m_max`` defaults to
   ``world * max_tokens``, enough when a token's ``top_k`` experts are distinct (any top-k router); routing
   that repeats an expert within a token needs ``max_rows_per_expert`` up to ``world * max_tokens * top_k``.
   Rows past ``m_max`` are not written (no out-of-bounds access); the overflow is reported to every rank (step
   4); ``ops.moe.experts_masked``: masked grouped GEMM, fused SiLU·mul+quant, masked grouped GEMM with the
   caller's ``expected_m``;
4. return: per destination, one bf16 row per (received row, slot) plus one **status row** (:mod:`.status`: the
   overflow flag and the largest count of the sender's local experts, or the sender's argument error), equal
   splits, ``world * (max_tokens * top_k + 1)`` rows. Every rank reads every sender's status: on CPU / gloo
   each rank raises the same RuntimeError on an overflow (and a peer's argument error), on CUDA each rank fails
   the same ``torch._assert_async`` on the device and the codes stay in ``buffers.status`` — never a wrong result
   on one rank only;
5. combine on the source: ``ops.moe.combine`` over the rows that belong to its slots, fp32 in slot order.

Agreement: :meth:`EPDecodeBuffers.allocate` exchanges the sizes every later collective depends on (one
fixed-size ``all_gather``: ``max_tokens``, ``H``, ``top_k``, ``E_local``, ``m_max``) and raises the same ValueError
on every rank when they differ. A call whose arguments fail their checks on one rank still runs both collectives
there (with no rows and an error status), then raises; its peers raise too (:mod:`.status`).

Exactness: each expert sees the same rows in the same order as the single-process layer, and the masked GEMM
computes a row exactly as the contiguous one does (the SwiGLU-fused ones too), so the result is bit-identical to
``moe.fp8_moe_forward`` over all ranks' tokens when both take the same up-projection path (tested on CPU).

Host synchronisation on NCCL (CUDA tensors): none — every step is a fixed-shape device op or a collective with
equal splits; the expert-id range check and the status check are ``torch._assert_async``. The call is therefore capturable in a CUDA
graph and replays with new tokens / routing (warm it up once first so that the kernels are compiled). On gloo
(CPU tensors) each collective blocks the calling thread: there is no device to run ahead.

Cost of static shapes: every call moves the whole buffers — ``world * max_tokens * (H + 4*ceil(H/128) +
4*top_k)`` bytes out and ``world * (max_tokens * top_k + 1) * 2H`` back per rank (the status rows included),
whatever the real counts — and the masked GEMMs are sized by ``m_max`` rows per expert (only ``masked_m`` rows
are computed).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..ops.moe import check_swiglu_weights, combine, experts_masked
from ..quant import per_token_cast_to_fp8
from ..utils import ceil_div
from .checks import check_ep_inputs
from .comm import all_to_all_rows, group_rank, group_size
from .status import OK, OVERFLOW, agree, code_of, collective_device, decode, encode, raise_peer_errors
from .wire import FP8, row_bytes, unpack_rows

__all__ = ["EPDecodeBuffers", "ep_moe_forward_decode"]


@dataclasses.dataclass(frozen=True)
class EPDecodeBuffers:
    """Static buffers of :func:`ep_moe_forward_decode` (allocate with :meth:`allocate`; reuse across calls and
    CUDA-graph replays; one set per layer that may run concurrently). ``N = world * max_tokens`` rows,
    ``m_max`` rows per local expert (``max_rows_per_expert``, default ``N``), ``g = ceil(H/128)``,
    ``B = row_bytes(H, top_k)``.

    Attributes:
        send: ``[N + 1, B]`` uint8, rows to send (:mod:`.wire`) plus a sink row for unused writes.
        recv: ``[N, B]`` uint8, received rows.
        expert_x: ``[E_local * m_max + 1, H]`` uint8, the e4m3 masked-layout activations (+ sink row).
        expert_scales: ``[E_local * m_max + 1, g]`` float32, their scales (+ sink row).
        ret_send: ``[world * (R + 1), H]`` bfloat16 with ``R = max_tokens * top_k``: per destination rank, its R
            expert outputs per (received row, slot), then one status row.
        ret_recv: ``[world * (R + 1) + 1, H]`` bfloat16, the returned rows and every sender's status row; the
            last row stays zero (dropped slots).
        masked_m: ``[E_local]`` int32, rows per local expert of the last call (device).
        status: ``[world, 2]`` int32 (device), per sender rank of the last call: the status code (0 ok,
            :data:`.status.OVERFLOW`: its local experts received more than ``m_max`` slots, 1-3 its arguments
            were rejected) and the detail (the largest slot count of its local experts). Readable after the step
            on CUDA, where a failure is a device-side assert rather than an exception.
    """

    max_tokens: int
    hidden: int
    top_k: int
    num_local_experts: int
    world: int
    m_max: int
    send: torch.Tensor
    recv: torch.Tensor
    expert_x: torch.Tensor
    expert_scales: torch.Tensor
    ret_send: torch.Tensor
    ret_recv: torch.Tensor
    masked_m: torch.Tensor
    status: torch.Tensor

    @classmethod
    def allocate(cls, max_tokens: int, hidden: int, top_k: int, num_local_experts: int, *,
                 max_rows_per_expert: int | None = None, group: dist.ProcessGroup | None = None,
                 device: torch.device | str = "cpu") -> EPDecodeBuffers:
        """Buffers for up to ``max_tokens`` tokens per rank of ``group`` (``None``: the world) and up to
        ``max_rows_per_expert`` received slots per local expert (default ``world * max_tokens``: see the module
        docstring). Every rank of the group must call it together: the sizes are agreed with one fixed-size
        collective, and a rank whose arguments are wrong, or whose sizes differ from a peer's, makes every rank
        raise the same error (:mod:`.status`)."""
        world = group_size(group)
        error = None
        try:
            buffers = cls._allocate(max_tokens, hidden, top_k, num_local_experts, max_rows_per_expert, world,
                                    device)
        except (TypeError, ValueError, RuntimeError) as exc:  # every rank raises it, after the agreement
            buffers, error = None, exc
        m_max = None if buffers is None else buffers.m_max
        agree("EPDecodeBuffers.allocate", {"max_tokens": max_tokens, "hidden": hidden, "top_k": top_k,
                                           "num_local_experts": num_local_experts, "max_rows_per_expert": m_max},
              group, collective_device(group, device if error is None else None), error)
        return buffers

    @classmethod
    def _allocate(cls, max_tokens, hidden, top_k, num_local_experts, max_rows_per_expert, world, device
                  ) -> EPDecodeBuffers:
        for value, name in ((max_tokens, "max_tokens"), (hidden, "hidden"), (top_k, "top_k"),
                            (num_local_experts, "num_local_experts")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if hidden % 16:
            raise ValueError(f"hidden must be a multiple of 16, got {hidden=}")
        rows, width = world * max_tokens, row_bytes(hidden, top_k)
        m_max = rows if max_rows_per_expert is None else max_rows_per_expert
        if isinstance(m_max, bool) or not isinstance(m_max, int) or m_max < 1:
            raise ValueError(f"max_rows_per_expert must be a positive int or None, got {max_rows_per_expert!r}")
        experts_rows = num_local_experts * m_max + 1
        returned = world * (max_tokens * top_k + 1)  # per destination: its slots' rows, then a status row

        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=device)

        ret_recv = empty((returned + 1, hidden), torch.bfloat16)
        ret_recv[-1].zero_()
        return cls(max_tokens, hidden, top_k, num_local_experts, world, m_max,
                   send=empty((rows + 1, width), torch.uint8), recv=empty((rows, width), torch.uint8),
                   expert_x=empty((experts_rows, hidden), torch.uint8),
                   expert_scales=empty((experts_rows, ceil_div(hidden, 128)), torch.float32),
                   ret_send=empty((returned, hidden), torch.bfloat16), ret_recv=ret_recv,
                   masked_m=torch.zeros(num_local_experts, dtype=torch.int32, device=device),
                   status=torch.zeros((world, 2), dtype=torch.int32, device=device))

    def status_rows(self, returned: torch.Tensor) -> torch.Tensor:
        """The ``[world, H]`` status rows of ``ret_send`` / ``ret_recv[:-1]`` (one per destination / sender)."""
        per_rank = self.max_tokens * self.top_k
        return returned.view(self.world, per_rank + 1, self.hidden)[:, per_rank]


def _check_buffers(buffers: object, shape, device: torch.device, expected_m: object) -> None:
    if not isinstance(buffers, EPDecodeBuffers):
        raise TypeError(f"buffers must be EPDecodeBuffers, got {type(buffers).__name__}")
    have = (buffers.hidden, buffers.top_k, buffers.num_local_experts, buffers.world)
    want = (shape.hidden, shape.top_k, shape.num_local_experts, shape.world)
    if have != want:
        raise ValueError(f"buffers were allocated for (H, top_k, E_local, world)={have}, this call has {want}")
    if shape.num_tokens > buffers.max_tokens:
        raise ValueError(f"hidden has T={shape.num_tokens} tokens, more than buffers.max_tokens={buffers.max_tokens}")
    if buffers.send.device != device:
        raise ValueError(f"buffers are on {buffers.send.device}, the tokens on {device}")
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"expected_m must be a positive int (host hint of rows per expert), got {expected_m=!r}")


def ep_moe_forward_decode(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                          w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, buffers: EPDecodeBuffers,
                          expected_m: int, group: dist.ProcessGroup | None = None,
                          w13_swiglu: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Expert-parallel MoE forward without host synchronisation (module docstring: steps, exactness, costs).

    Args:
        hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, group: as :func:`.ep_moe_forward`, with
            ``T_local <= buffers.max_tokens`` (pad a batch with tokens whose ``topk_ids`` are all -1 to keep
            the shape of a captured graph).
        buffers: :class:`EPDecodeBuffers` for this group, ``H``, ``top_k`` and ``E_local``, on the tokens' device.
        expected_m: host hint of the rows per local expert, for the masked GEMMs' configuration (e.g.
            ``T * top_k * world / (E_local * world)`` for balanced routing); never affects the result.
        w13_swiglu: as :func:`.ep_moe_forward` (the fused up-projection on the masked layout).

    Returns:
        ``[T_local, H]`` bfloat16, a new tensor (bit-identical to :func:`.ep_moe_forward`).

    Raises:
        TypeError / ValueError (every rank): a rank's arguments failed their checks — that rank still runs the
        collectives, then raises its error; the others raise the same type naming it. RuntimeError (every rank,
        CPU / gloo): a rank's local experts received more slots than ``buffers.m_max``. On CUDA both are a
        ``torch._assert_async`` on every rank (``buffers.status`` holds the codes). Only a ``buffers`` that is not
        an :class:`EPDecodeBuffers` of this group's size raises on its rank alone (there is nothing to exchange).
    """
    world, rank = group_size(group), group_rank(group)
    if not isinstance(buffers, EPDecodeBuffers):
        raise TypeError(f"buffers must be EPDecodeBuffers, got {type(buffers).__name__}")
    if buffers.world != world:
        raise ValueError(f"buffers were allocated for a group of {buffers.world} ranks, this group has {world}")
    try:
        shape = check_ep_inputs(hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, world)
        _check_buffers(buffers, shape, hidden.device, expected_m)
        check_swiglu_weights(w13_swiglu, w13, w13_scale)
    except (TypeError, ValueError) as exc:
        _fail_together(buffers, exc, group)  # raises, after the same collectives as a good call
    device = hidden.device
    num_tokens, top_k, hidden_size, num_local = shape.num_tokens, shape.top_k, shape.hidden, shape.num_local_experts
    rows, m_max = world * buffers.max_tokens, buffers.m_max  # rows of the send / receive buffers; per expert
    per_rank = buffers.max_tokens * top_k  # returned rows per destination, before its status row
    ranks = torch.arange(world, dtype=torch.int64, device=device)

    # 1. one row per (token, destination rank); slot d*max_tokens + (index of the token among those for d).
    x_fp8, x_scales = per_token_cast_to_fp8(hidden)
    ids = topk_ids.to(torch.int64)
    dest = torch.where(ids >= 0, ids // num_local, torch.full_like(ids, world))  # [T, top_k], world = dropped
    sends = torch.zeros((num_tokens, world + 1), dtype=torch.bool, device=device).scatter_(1, dest, True)[:, :world]
    pos = torch.cumsum(sends, 0) - 1  # [T, world]
    slot = torch.where(sends, ranks * buffers.max_tokens + pos, torch.full_like(pos, rows)).reshape(-1)  # sink: rows
    on_rank = dest.unsqueeze(1) == ranks.view(1, world, 1)  # [T, world, top_k]
    local_ids = torch.where(on_rank, ids.unsqueeze(1) - (ranks * num_local).view(1, world, 1), -1)
    send_x, send_s, send_ids = unpack_rows(buffers.send, hidden_size, top_k)
    send_ids.fill_(-1)  # rows that no token writes this call must read as "no slot here"
    per_pair = (num_tokens * world, hidden_size)
    send_x.view(torch.uint8).index_copy_(0, slot, x_fp8.view(torch.uint8).unsqueeze(1).expand(
        num_tokens, world, hidden_size).reshape(per_pair))
    groups = x_scales.shape[1]
    send_s.index_copy_(0, slot, x_scales.unsqueeze(1).expand(num_tokens, world, groups).reshape(-1, groups))
    send_ids.index_copy_(0, slot, local_ids.reshape(num_tokens * world, top_k).to(torch.int32))

    # 2. dispatch, equal splits.
    all_to_all_rows(buffers.recv, buffers.send[:rows], group=group)

    # 3. masked layout: slot (n, j) with local expert e goes to row pos of expert e, in (n, j) order.
    recv_x, recv_s, recv_ids = unpack_rows(buffers.recv, hidden_size, top_k)
    flat = recv_ids.reshape(-1).to(torch.int64)  # [rows * top_k]
    hits = flat.unsqueeze(1) == torch.arange(num_local, dtype=torch.int64, device=device)  # [rows*top_k, E_local]
    running = torch.cumsum(hits, 0)
    row_in_expert = (running * hits).sum(1) - 1
    fits = (flat >= 0) & (row_in_expert < m_max)
    target = torch.where(fits, flat * m_max + row_in_expert, torch.full_like(flat, num_local * m_max))
    buffers.masked_m.copy_(running[-1].clamp(max=m_max))
    # expand, not repeat_interleave: the latter may read its output size back from the device.
    source_row = torch.arange(rows, dtype=torch.int64, device=device).unsqueeze(1).expand(rows, top_k).reshape(-1)
    buffers.expert_x.index_copy_(0, target, recv_x.view(torch.uint8).index_select(0, source_row))
    buffers.expert_scales.index_copy_(0, target, recv_s.index_select(0, source_row))
    a = buffers.expert_x[:-1].view(num_local, m_max, hidden_size).view(FP8)
    a_scales = buffers.expert_scales[:-1].view(num_local, m_max, -1)
    out = experts_masked(a, a_scales, buffers.masked_m, w13, w13_scale, w2, w2_scale, expected_m, w13_swiglu)

    # 4. per destination: one row per (received row, slot) — rows of slots that are not here are never read by
    # their source — then the status row: the overflow flag and the largest count of this rank's local experts.
    source = torch.where(fits, target, 0).view(world, per_rank)
    source = torch.cat([source, source.new_zeros((world, 1))], dim=1).reshape(-1)
    torch.index_select(out.view(-1, hidden_size), 0, source, out=buffers.ret_send)
    largest = running[-1].max()
    words = buffers.status_rows(buffers.ret_send).view(torch.int32)
    words.zero_()
    words[:, 0] = torch.where(largest > m_max, OVERFLOW, OK).to(torch.int32)
    words[:, 1] = largest.to(torch.int32)
    all_to_all_rows(buffers.ret_recv[:-1], buffers.ret_send, group=group)
    _check_status(buffers, device, rank)  # after the last collective: no peer is left waiting

    # 5. slot (t, j) on rank d came back at row d*(per_rank + 1) + pos[t, d]*top_k + j; dropped: the zero row.
    if num_tokens == 0 or top_k == 0:
        return hidden.new_zeros((num_tokens, hidden_size))
    pos_of_slot = pos.gather(1, dest.clamp(max=world - 1))
    scatter = torch.where(dest < world, dest * (per_rank + 1) + pos_of_slot * top_k
                          + torch.arange(top_k, device=device), torch.full_like(dest, -1))
    return combine(buffers.ret_recv, scatter, topk_weights)


def _fail_together(buffers: EPDecodeBuffers, error: BaseException, group) -> None:
    """This rank's arguments were rejected: run the call's two collectives anyway with no rows and an error status
    (the buffers alone fix their sizes), so that every peer finishes the call and raises too; then raise."""
    rows = buffers.world * buffers.max_tokens
    unpack_rows(buffers.send, buffers.hidden, buffers.top_k)[2].fill_(-1)
    all_to_all_rows(buffers.recv, buffers.send[:rows], group=group)
    record = encode(code_of(error), 0, str(error), size=2 * buffers.hidden)
    status = torch.frombuffer(bytearray(record), dtype=torch.bfloat16).to(buffers.ret_send.device)
    buffers.status_rows(buffers.ret_send).copy_(status.expand(buffers.world, buffers.hidden))
    all_to_all_rows(buffers.ret_recv[:-1], buffers.ret_send, group=group)
    raise error


def _check_status(buffers: EPDecodeBuffers, device: torch.device, rank: int) -> None:
    """Every sender's status row of the last return exchange into ``buffers.status``; on CPU raise (every rank alike)
    when one reports an overflow or an argument error, on CUDA fail a device-side assert (no host sync)."""
    rows = buffers.status_rows(buffers.ret_recv[:-1])
    words = rows.view(torch.int32)
    buffers.status.copy_(words[:, :2])
    if device.type != "cpu":
        torch._assert_async((words[:, 0] == OK).all(), "ep_moe_forward_decode: a rank of the group overflowed "
                            "buffers.m_max (max_rows_per_expert) or rejected its arguments; buffers.status holds "
                            "(code, detail) per rank")
        return
    records = [decode(row.contiguous().view(torch.uint8).numpy().tobytes()) for row in rows]
    raise_peer_errors(records, None, "ep_moe_forward_decode")
    over = [(source, detail) for source, (code, detail, _) in enumerate(records) if code == OVERFLOW]
    if over:
        source, detail = over[0]
        raise RuntimeError(f"ep_moe_forward_decode: a local expert of rank {source} received {detail} slots, more than "
                           f"buffers.m_max={buffers.m_max} (max_rows_per_expert); every rank of the group raises this "
                           f"(rank {rank} included): allocate larger buffers with "
                           f"EPDecodeBuffers.allocate(..., max_rows_per_expert=...)")
