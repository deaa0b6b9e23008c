"""Workspace of the split-K GEMM kernels (``include/deep_fp8_gemm/split_k.cuh``).

A split-K launch needs two buffers (sizes from :func:`deep_fp8_gemm.config.split_k_workspace`):

* counters: ``int32 [tiles * math warpgroups]``, **zero before every launch**. Every launch leaves them zero
  again (the last split of a tile resets its counter), so a workspace is zeroed once, when it is allocated.
* partials: ``float32 [tiles * split_k * block_m * block_n]``, scratch (never read before written in a launch).

Where a launch's workspace comes from depends on whether the launch is being captured into a CUDA graph:

* **eager** (not capturing): one pair cached per ``(device, stream)``. Launches on one stream are ordered, so
  they can share it; two streams get two pairs, since kernels on different streams may run at the same time.
  The pair only grows (a larger need replaces it with a larger one, zeroed again); a replaced pair is freed to
  the caching allocator in stream order, after the launches already queued on that stream — safe for eager
  launches, and the reason a captured launch must not use this cache.
* **captured** (the launch's stream is capturing a graph): a fresh pair for every captured launch, allocated
  (counters zeroed, which the graph records) from the capture's private memory pool. Its addresses are baked into
  the graph's kernel node; the pool keeps the memory for the graph's life, so later eager growth never frees it,
  and a second graph gets its own pair, so two graphs replayed on two streams at once do not share one. Replaying
  one graph on two streams at once is not supported (its one pair would be shared), as for any graph.
"""

from __future__ import annotations

import threading

import torch

from ..config import GemmConfig, split_k_workspace

_lock = threading.Lock()
_buffers: dict[tuple, list] = {}  # (device, stream) -> [counters int32, partials float32]


def pointers(cfg: GemmConfig, m: int, device: torch.device, stream: int = 0, capturing: bool = False
             ) -> tuple[int, int]:
    """``(counters, partials)`` addresses for a launch of ``cfg`` over ``m`` rows on ``device`` / ``stream`` (a raw
    stream handle; 0 for the CPU simulator), or ``(0, 0)`` when ``cfg`` does not split K. ``capturing``: the
    launch is being captured into a CUDA graph (module docstring)."""
    if cfg.split_k == 1:
        return 0, 0
    counters, partials = buffers(cfg, m, device, stream, capturing)
    return counters.data_ptr(), partials.data_ptr()


def buffers(cfg: GemmConfig, m: int, device: torch.device, stream: int = 0, capturing: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(counters, partials)`` tensors of a launch, at least as large as ``cfg`` and ``m`` need: the cached
    pair of ``(device, stream)``, or with ``capturing`` a fresh pair of the capture's own (module docstring)."""
    counter_words, partial_floats = split_k_workspace(cfg, m)
    if capturing:
        return (torch.zeros(counter_words, dtype=torch.int32, device=device),
                torch.empty(partial_floats, dtype=torch.float32, device=device))
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
