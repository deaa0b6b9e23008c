"""Where an op's kernel runs: a tensor's GPU ordinal, that GPU's capability, the current device and stream.

The ops, the GEMM launcher and the quantisers ask these functions (through this module's attributes,
never a ``from`` import) instead of reading ``torch.cuda`` themselves. That is the one seam through which
``bench/bench_host.py`` sends CPU tensors down the GPU launch path against a stub ``libcuda.so.1`` (it swaps
these functions for the duration of the measurement), so the host cost it measures is that of the code
a GPU call runs. Nothing else replaces them.
"""

from __future__ import annotations

import torch

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # present in CUDA builds of torch


def gpu_index(device: torch.device) -> int | None:
    """The CUDA ordinal the kernels of a tensor on ``device`` run on, or None for a non-CUDA device."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def capability(index: int) -> tuple[int, int]:
    """Compute capability ``(major, minor)`` of CUDA device ``index`` (cached per index)."""
    from ..utils import _cuda_capability_of_index

    return _cuda_capability_of_index(index)


def current_device() -> int:
    """torch's current CUDA device ordinal (``torch._C._cuda_getDevice`` when torch has it, bound below). A
    quantiser plan allocates its outputs on the current device and checks it is the input's first."""
    return torch.cuda.current_device()


def current_stream(index: int) -> int:
    """The raw ``CUstream`` handle of torch's current stream on device ``index`` (0: the legacy default
    stream). ``torch._C._cuda_getCurrentRawStream`` itself when torch has it (bound below: no Stream object,
    no Python frame per call), else the public ``torch.cuda.current_stream(index).cuda_stream``."""
    return torch.cuda.current_stream(index).cuda_stream


if _raw_stream is not None:
    current_stream = _raw_stream  # noqa: F811 - same contract, one C call (every eager GPU op asks for it)
if getattr(torch._C, "_cuda_getDevice", None) is not None:
    current_device = torch._C._cuda_getDevice  # noqa: F811 - same contract, one C call
