"""Argument checks shared by the expert-parallel forwards (prefill and decode).

A check that fails raises on the calling rank only, *before* any collective: the other ranks then block in
their first collective until the process group's timeout (``init_process_group(timeout=...)``) unless the job
launcher (torchrun, the tests' spawner) tears the world down when one rank exits. Every check here reads host
metadata only, except the expert-id range check on CPU tensors (a GPU uses ``torch._assert_async``).
"""

from __future__ import annotations

import dataclasses

import torch

from ..ops.moe import check_routed_inputs


@dataclasses.dataclass(frozen=True)
class EPShape:
    """Sizes of one expert-parallel call: ``E_local`` experts on each of ``world`` ranks."""

    num_tokens: int
    top_k: int
    hidden: int
    inter: int
    num_local_experts: int
    world: int

    @property
    def num_experts(self) -> int:
        return self.num_local_experts * self.world


def check_ep_inputs(hidden, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, world: int) -> EPShape:
    """Validates the arguments of :func:`ep_moe_forward` (same rules as ``moe.fp8_moe_forward`` with the
    weights of ``E_local`` experts and global expert ids in ``[-1, world * E_local)``)."""
    num_local, hidden_size, inter, num_tokens = check_routed_inputs(hidden, topk_ids, topk_weights, w13,
                                                                     w13_scale, w2, w2_scale)
    shape = EPShape(num_tokens, topk_ids.shape[1], hidden_size, inter, num_local, world)
    _check_expert_range(topk_ids, shape.num_experts)
    return shape


def _check_expert_range(topk_ids: torch.Tensor, num_experts: int) -> None:
    flat = topk_ids.reshape(-1).to(torch.int64)
    bad = (flat < -1) | (flat >= num_experts)
    if topk_ids.device.type == "cpu" and not torch.compiler.is_compiling():
        if bool(bad.any()):
            raise ValueError(f"topk_ids entries must be -1 or global expert ids in [0, world * E_local = "
                             f"{num_experts}), got e.g. {flat[bad][:8].tolist()}")
    else:
        torch._assert_async(~bad.any(), "topk_ids entries must be -1 or in [0, world * E_local)")


def check_peer_shapes(peers: list[list[int]], mine: list[int]) -> None:
    """``peers[s]`` = ``[H, top_k, E_local]`` received from rank ``s``; raises ValueError on every rank when the
    ranks disagree (each rank sees all the others' values, so all of them raise: no rank is left waiting).

    A different ``E_local`` also changes the width of the count message that carries these values, so the
    count exchange itself may fail (or, on some backends, wait until the timeout) before this check runs; a
    different ``H`` or ``top_k`` is always caught here."""
    for source, theirs in enumerate(peers):
        if list(theirs) != list(mine):
            raise ValueError(f"expert-parallel ranks disagree on (H, top_k, E_local): this rank has {tuple(mine)}, "
                             f"rank {source} has {tuple(theirs)}; every rank must pass the same top_k and weight "
                             "shapes")
