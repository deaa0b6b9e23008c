"""The dispatch wire format: one ``uint8`` row per (token, destination rank).

Row layout (``H`` hidden size, ``g = ceil(H/128)``, ``top_k`` slots)::

    bytes [0, H)                 the token's e4m3 values (per-token 1x128 quantisation, done before sending)
    bytes [H, H + 4g)            its g float32 scales
    bytes [H + 4g, H + 4g + 4k)  top_k int32 *local* expert ids on the destination rank, -1 for the slots that
                                 go elsewhere or are dropped

Packing the three into one row makes the dispatch one ``all_to_all_single`` (plus one for the counts) instead
of three. ``H % 16 == 0`` (checked by the MoE layer) keeps the scale and id fields 4-byte aligned, so the
unpacked fields are zero-copy views. The routing weights never travel: the combine runs on the token's own rank.
"""

from __future__ import annotations

import torch

from ..utils import ceil_div

FP8 = torch.float8_e4m3fn

__all__ = ["pack_rows", "row_bytes", "unpack_rows"]


def row_bytes(hidden: int, top_k: int) -> int:
    """Bytes of one dispatched row: ``H + 4*ceil(H/128) + 4*top_k``."""
    return hidden + 4 * ceil_div(hidden, 128) + 4 * top_k


def pack_rows(x_fp8: torch.Tensor, scales: torch.Tensor, local_ids: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``x_fp8`` ``[n, H]`` e4m3, ``scales`` ``[n, g]`` float32 (any strides), ``local_ids`` ``[n, top_k]``
    integer -> ``[n, row_bytes]`` uint8 (written into ``out`` when given)."""
    n, hidden = x_fp8.shape
    top_k = local_ids.shape[1]
    if out is None:
        out = torch.empty((n, row_bytes(hidden, top_k)), dtype=torch.uint8, device=x_fp8.device)
    x_view, s_view, id_view = unpack_rows(out, hidden, top_k)
    x_view.view(torch.uint8).copy_(x_fp8.view(torch.uint8))
    s_view.copy_(scales)
    id_view.copy_(local_ids)
    return out


def unpack_rows(rows: torch.Tensor, hidden: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-copy views of ``rows`` ``[n, row_bytes]`` uint8: ``(x_fp8 [n, H] e4m3, scales [n, g] float32,
    local_ids [n, top_k] int32)``, each with row stride ``row_bytes`` (not contiguous)."""
    g = ceil_div(hidden, 128)
    x_fp8 = rows[:, :hidden].view(FP8)
    scales = rows[:, hidden:hidden + 4 * g].view(torch.float32)
    local_ids = rows[:, hidden + 4 * g:hidden + 4 * g + 4 * top_k].view(torch.int32)
    return x_fp8, scales, local_ids
