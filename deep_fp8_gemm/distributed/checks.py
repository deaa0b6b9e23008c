"""Argument checks shared by the expert-parallel forwards (prefill and decode).

A check that fails does not raise at once: the forwards catch it, take part in the call's collectives with an
error status (:mod:`.status`) and raise afterwards, and every peer raises too — no rank is left waiting in a
collective. Every check here reads host metadata only, except the expert-id range check on CPU tensors (a GPU
uses ``torch._assert_async``).
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


def check_peer_shapes(peers: list[list[int]]) -> None:
    """``peers[s]`` = ``[H, top_k, E_local]`` of rank ``s`` (every rank sees all of them, from a fixed-size
    exchange); raises the same ValueError on every rank when the ranks disagree, so no rank is left waiting and
    no message of a size another rank does not expect is ever sent."""
    if any(list(p) != list(peers[0]) for p in peers):
        listing = "; ".join(f"rank {s}: {tuple(p)}" for s, p in enumerate(peers))
        raise ValueError(f"expert-parallel ranks disagree on (H, top_k, E_local) ({listing}); every rank must pass "
                         f"the same top_k and weight shapes")
