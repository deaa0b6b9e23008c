"""``EPMoE``: one rank's share of an expert-parallel FP8 MoE layer."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..moe import FP8MoE
from ..ops.moe import check_tensor_of
from .comm import group_rank, group_size
from .ep_decode import EPDecodeBuffers, ep_moe_forward_decode
from .ep_moe import ep_moe_forward
from .status import agree, collective_device

__all__ = ["EPMoE"]


def _check_positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    return value


class EPMoE(nn.Module):
    """SwiGLU experts sharded over the ranks of ``group``: this module holds global experts
    ``[rank*E_local, (rank+1)*E_local)`` (``E_local = num_experts / world``) as FP8 weights.

    Submodule ``experts``: an :class:`deep_fp8_gemm.moe.FP8MoE` with the ``E_local`` local experts (its buffers
    ``w13 [E_local, 2I, H]`` e4m3, ``w13_scale``, ``w2``, ``w2_scale`` — the state dict of one rank — and the
    non-persistent fused up-projection layout ``w13_swiglu``, which :meth:`forward` and :meth:`forward_decode` use).
    :meth:`forward` is :func:`deep_fp8_gemm.distributed.ep_moe_forward`: every rank of ``group`` must call it
    together, each with its own tokens. The constructor initialises the local experts randomly (like
    ``FP8MoE``); :meth:`from_experts` loads trained weights. Inference only (no autograd).

    Every rank of ``group`` constructs it together: the sizes (``num_experts``, ``H``, ``I``) are agreed with one
    fixed-size collective (:func:`.status.agree`), so ranks that disagree, or a rank whose arguments are wrong,
    make every rank raise the same error here rather than a crash or a hang in the first forward.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 group: dist.ProcessGroup | None = None, device: torch.device | str | None = None):
        super().__init__()
        group_size(group)  # torch.distributed initialised (else RuntimeError here: there is no one to agree with)
        error = None
        try:
            self._setup(num_experts, group)
            self.experts = FP8MoE(self.num_local_experts, hidden_size, intermediate_size, device=device)
        except (TypeError, ValueError, RuntimeError) as exc:  # raised by every rank, after the agreement
            error = exc
        self._agree(group, device, error, num_experts, hidden_size, intermediate_size)

    @staticmethod
    def _agree(group, device, error, num_experts, hidden_size, intermediate_size) -> None:
        agree("EPMoE", {"num_experts": num_experts, "hidden_size": hidden_size, "intermediate_size": intermediate_size},
              group, collective_device(group, device if error is None else None), error)

    def _setup(self, num_experts: int, group: dist.ProcessGroup | None) -> None:
        _check_positive(num_experts, "num_experts")
        world, rank = group_size(group), group_rank(group)
        if num_experts % world:
            raise ValueError(f"num_experts must be a multiple of the group size, got {num_experts=} world={world}")
        self.group = group
        self.num_experts, self.num_local_experts = num_experts, num_experts // world
        self.expert_offset = rank * self.num_local_experts

    @classmethod
    def from_experts(cls, w13: torch.Tensor, w2: torch.Tensor, *, group: dist.ProcessGroup | None = None,
                     local: bool = False) -> EPMoE:
        """Quantises this rank's experts (128x128 blocks per expert, as ``FP8MoE.from_weights``).

        Args:
            w13: ``[E, 2I, H]`` bfloat16 / float16 / float32, ``cat([W1, W3], dim=1)`` of every expert
                (``local=False``: all ``E`` global experts, of which this rank keeps its slice) or ``[E_local,
                2I, H]`` of this rank's experts only (``local=True``: ``E = E_local * world``).
            w2: ``[E, H, I]`` (or ``[E_local, H, I]``), the down projections.
            group: the expert-parallel process group (``None``: the world).
        The module's buffers live on the weights' device; the slice is copied, not viewed. Every rank calls it
        together (the sizes are agreed, as by the constructor).
        """
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        world = group_size(group)
        error, sizes = None, (0, 0, 0)
        try:
            check_tensor_of(w13, "w13", (torch.bfloat16, torch.float16, torch.float32), 3)
            check_tensor_of(w2, "w2", (torch.bfloat16, torch.float16, torch.float32), 3)
            if w13.shape[0] != w2.shape[0]:
                raise ValueError(f"w13 and w2 must hold the same experts, got w13.shape={tuple(w13.shape)} "
                                 f"w2.shape={tuple(w2.shape)}")
            sizes = (w13.shape[0] * (world if local else 1), w13.shape[2], w2.shape[2])
            module._setup(sizes[0], group)
            if not local:
                lo, hi = module.expert_offset, module.expert_offset + module.num_local_experts
                w13, w2 = w13[lo:hi], w2[lo:hi]
            module.experts = FP8MoE.from_weights(w13, w2)
        except (TypeError, ValueError, RuntimeError) as exc:  # raised by every rank, after the agreement
            error = exc
        cls._agree(group, getattr(w13, "device", None) if error is None else None, error, *sizes)
        return module

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """``hidden [T_local, H]`` bf16, ``topk_ids [T_local, top_k]`` global expert ids (-1 = dropped),
        ``topk_weights [T_local, top_k]`` -> ``[T_local, H]`` bf16 (:func:`ep_moe_forward`)."""
        e = self.experts
        return ep_moe_forward(hidden, topk_ids, topk_weights, e.w13, e.w13_scale, e.w2, e.w2_scale, self.group,
                              e.swiglu_pair)

    def decode_buffers(self, max_tokens: int, top_k: int, max_rows_per_expert: int | None = None) -> EPDecodeBuffers:
        """Static buffers for :meth:`forward_decode` with up to ``max_tokens`` tokens per rank, on the weights'
        device (``EPDecodeBuffers.allocate``)."""
        return EPDecodeBuffers.allocate(max_tokens, self.experts.hidden_size, top_k, self.num_local_experts,
                                        max_rows_per_expert=max_rows_per_expert, group=self.group,
                                        device=self.experts.w13.device)

    def forward_decode(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       buffers: EPDecodeBuffers, expected_m: int) -> torch.Tensor:
        """:meth:`forward` without host synchronisation (CUDA-graph capturable on NCCL): see
        :func:`deep_fp8_gemm.distributed.ep_moe_forward_decode`. Same result, bit for bit."""
        e = self.experts
        return ep_moe_forward_decode(hidden, topk_ids, topk_weights, e.w13, e.w13_scale, e.w2, e.w2_scale,
                                     buffers, expected_m, self.group, e.swiglu_pair)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, local experts [{self.expert_offset}, "
                f"{self.expert_offset + self.num_local_experts})")
