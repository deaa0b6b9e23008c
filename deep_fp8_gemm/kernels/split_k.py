"""Workspace of the split-K GEMM kernels (``include/deep_fp8_gemm/split_k.cuh``), cached per device and stream.

A split-K launch needs two buffers (sizes from :func:`deep_fp8_gemm.config.split_k_workspace`):

* counters: ``int32 [tiles * math warpgroups]``, **zero before every launch**. Allocated zeroed once; every
  launch leaves them zero again (the last split of a tile resets its counter), so nothing is cleared per call
  and a CUDA graph that captured a launch can be replayed any number of times.
* partials: ``float32 [tiles * split_k * block_m * block_n]``, scratch (never read before written in a launch).

One pair per ``(device, stream)``: launches on one stream are ordered, so they can share it; two streams get
two pairs, since kernels on different streams may run at the same time. The buffers only grow (a larger need
replaces them with larger ones, the counters zeroed again); a replaced buffer is freed by the caching allocator
in stream order, after the launches already queued on that stream that use it.
"""

from __future__ import annotations

import threading

import torch

from ..config import GemmConfig, split_k_workspace

_lock = threading.Lock()
_buffers: dict[tuple, list] = {}  # (device, stream) -> [counters int32, partials float32]


def pointers(cfg: GemmConfig, m: int, device: torch.device, stream: int = 0) -> tuple[int, int]:
    """``(counters, partials)`` addresses for a launch of ``cfg`` over ``m`` rows on ``device`` / ``stream`` (a raw
    stream handle; 0 for the CPU simulator), or ``(0, 0)`` when ``cfg`` does not split K."""
    return tuple(t.data_ptr() for t in buffers(cfg, m, device, stream)) if cfg.split_k > 1 else (0, 0)


def buffers(cfg: GemmConfig, m: int, device: torch.device, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(counters, partials)`` tensors, at least as large as ``cfg`` and ``m`` need (see module doc)."""
    counter_words, partial_floats = split_k_workspace(cfg, m)
    key = (device, stream)
    with _lock:
        entry = _buffers.get(key)
        if entry is None:
            entry = _buffers[key] = [torch.zeros(0, dtype=torch.int32, device=device),
                                     torch.empty(0, dtype=torch.float32, device=device)]
        if entry[0].numel() < counter_words:
            entry[0] = torch.zeros(_grow(counter_words), dtype=torch.int32, device=device)
        if entry[1].numel() < partial_floats:
            entry[1] = torch.empty(_grow(partial_floats), dtype=torch.float32, device=device)
        return entry[0], entry[1]


def _grow(n: int) -> int:
    """Sizes round up to a power of two (>= 4096 elements), so a growing workload reallocates a few times only."""
    return max(4096, 1 << (n - 1).bit_length())


def clear() -> None:
    """Drops every cached workspace (tests; frees the memory once no launch uses it)."""
    with _lock:
        _buffers.clear()
