"""The collectives the distributed layers use, on ``torch.distributed`` (NCCL on GPUs, gloo on CPUs).

Everything crosses the wire as bytes: :func:`all_to_all_rows` views each tensor as ``uint8`` rows, so one code
path serves every dtype on every backend (gloo rejects ``float8_e4m3fn``; fp32 scales and bf16 rows are moved
bit for bit, no conversion). The views cost nothing: the buffers are contiguous.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

__all__ = ["all_gather_dim0", "all_to_all_rows", "group_rank", "group_size", "reduce_scatter_dim0"]


def _require_initialised() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group(...) "
                           "(e.g. under torchrun) before the distributed layers")


def group_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in ``group`` (``None``: the default group, i.e. the world)."""
    _require_initialised()
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None = None) -> int:
    """This process's rank inside ``group`` (``None``: the world)."""
    _require_initialised()
    return dist.get_rank(group)


def _as_byte_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` (contiguous, ``[rows, ...]``) as ``[rows, row_bytes]`` uint8, sharing memory."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous to be sent as bytes, got {name}.stride()={t.stride()}")
    rows, width = t.shape[0], math.prod(t.shape[1:]) * t.element_size()
    # From the row shape, not the data: a rank with no rows must still agree with its peers on the width.
    return t.view(torch.uint8).view(rows, width) if t.numel() else t.new_empty((rows, width), dtype=torch.uint8)


def all_to_all_rows(out: torch.Tensor, inp: torch.Tensor, out_rows: list[int] | None = None,
                    in_rows: list[int] | None = None, group: dist.ProcessGroup | None = None) -> None:
    """``all_to_all_single`` over the rows (dim 0) of ``inp`` into ``out``, moved as raw bytes.

    ``out_rows[s]`` rows arrive from rank ``s`` (in rank order), ``in_rows[d]`` rows go to rank ``d``;
    ``None`` splits dim 0 evenly (no host-side sizes: the CUDA-graph-capturable form on NCCL). ``out`` and
    ``inp`` must be contiguous with the same dtype and the same row shape.
    """
    if out.dtype != inp.dtype or out.shape[1:] != inp.shape[1:]:
        raise ValueError(f"out and inp must share dtype and row shape, got out {out.dtype} {tuple(out.shape)} "
                         f"and inp {inp.dtype} {tuple(inp.shape)}")
    out_bytes, in_bytes = _as_byte_rows(out, "out"), _as_byte_rows(inp, "inp")
    if out_bytes.shape[1] == 0:  # zero-width rows (same on every rank): move 1 dummy byte per row instead
        out_bytes = out_bytes.new_empty((out.shape[0], 1))
        in_bytes = in_bytes.new_empty((inp.shape[0], 1))
    dist.all_to_all_single(out_bytes, in_bytes, out_rows, in_rows, group=group)


def all_gather_dim0(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``[n, ...]`` on every rank -> ``[world * n, ...]``, rank ``r``'s rows at ``[r*n, (r+1)*n)``."""
    x = x.contiguous()
    out = x.new_empty((group_size(group) * x.shape[0], *x.shape[1:]))
    # all_gather_single replaces all_gather_into_tensor (deprecated in torch 2.13); same semantics.
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x, group=group)
    return out


def reduce_scatter_dim0(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``[world * n, ...]`` on every rank -> this rank's ``[n, ...]`` slice of the elementwise sum."""
    world = group_size(group)
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // world, *x.shape[1:]))
    # reduce_scatter_single replaces reduce_scatter_tensor (deprecated in torch 2.13); same semantics.
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(out, x, group=group)
    return out
