"""Where an op's kernel runs: the backend policy, a tensor's GPU ordinal, that GPU's capability, the current
device and stream.

Every op family asks :func:`backend_of` where its call runs (one answer per family, written down below), and
the launchers ask the functions after it, through this module's attributes (never a ``from`` import) instead
of reading ``torch.cuda`` themselves. That is the one seam through which ``bench/bench_host.py`` sends CPU
tensors down the GPU launch path against a stub ``libcuda.so.1`` (it swaps these functions for the duration of
the measurement), so the host cost it measures is that of the code a GPU call runs. Nothing else replaces them.
"""

from __future__ import annotations

import enum
import functools

import torch

from .. import env
from .._core.checks import capturing
from ..constants import SUPPORTED_CAPABILITY

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # present in CUDA builds of torch


class Backend(enum.Enum):
    """Where a call of an op runs."""

    CUDA = "cuda"            #: the JIT-compiled kernels on an sm_90 GPU
    SIM = "sim"              #: CPU tensors with DFG_SIMULATE: the same kernel source in the CPU simulator
    REFERENCE = "reference"  #: CPU tensors: the family's exact reference (GEMMs, the indexer's MQA logits)
    TORCH = "torch"          #: the plain-torch implementation whose float32 arithmetic defines the bits (quantisers)


#: The families :func:`backend_of` knows, and what each does where (see its docstring).
FAMILIES = ("gemm", "quant", "attention")


def backend_of(device: torch.device, family: str) -> Backend:
    """Where a call of ``family`` on tensors of ``device`` runs.

    * ``"gemm"`` (every GEMM kind): an sm_90 GPU → ``CUDA``; any other GPU → ``RuntimeError`` (there is no
      other implementation worth running there); CPU tensors → ``SIM`` under ``DFG_SIMULATE``, else
      ``REFERENCE``.
    * ``"attention"`` (the DeepSeek-V3.2 indexer's MQA logits, :mod:`deep_fp8_gemm.attention`): as ``"gemm"``.
    * ``"quant"`` (the quantisers, cast-transposes and the MoE SiLU·mul + quantise): an sm_90 GPU → ``CUDA``
      (the fused kernels); any other GPU → ``TORCH`` (the plain-torch implementation gives the same bits, so
      nothing is lost but speed); CPU tensors → ``SIM`` under ``DFG_SIMULATE`` (every kernel of a model step
      then runs in the simulator, so a simulated forward issues exactly the launches a GPU forward issues),
      else ``TORCH``.
    """
    index = gpu_index(device)
    if index is not None:
        cap = capability(index)
        if cap == SUPPORTED_CAPABILITY:
            return Backend.CUDA
        if family == "quant":
            return Backend.TORCH
        if family not in ("gemm", "attention"):
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"deep_fp8_gemm's CUDA kernels need an sm_90 (Hopper) device; {device} ({name}) is "
            f"sm_{cap[0]}{cap[1]}. Use CPU tensors for the reference implementation."
        )
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if env.simulate():
        return Backend.SIM
    return Backend.TORCH if family == "quant" else Backend.REFERENCE


def layout_values_checked(device: torch.device) -> bool:
    """Whether a grouped GEMM on ``device`` checks its layout's *values* (m_indices blocks, psum ends, masked counts)
    before it runs: CPU tensors always (the reference would compute any layout, the kernels not: what the CPU
    accepts the GPU must compute); GPU tensors (:func:`gpu_index`, so that the stub of ``bench.bench_host`` sees
    what a GPU call does) only with ``DFG_CHECK_LAYOUTS=1`` and not while a CUDA graph is being captured (the check
    reads the values back: one synchronisation); meta tensors never (no values); never while torch.compile traces
    (the custom ops' kernels check at run time, where the values exist)."""
    if torch.compiler.is_compiling():
        return False
    if gpu_index(device) is not None:
        return env.check_layouts() and not capturing()
    return device.type == "cpu"


def gpu_index(device: torch.device) -> int | None:
    """The CUDA ordinal the kernels of a tensor on ``device`` run on, or None for a non-CUDA device."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def capability(index: int) -> tuple[int, int]:
    """Compute capability ``(major, minor)`` of CUDA device ``index`` (cached per index)."""
    return torch.cuda.get_device_capability(index)


def current_device() -> int:
    """torch's current CUDA device ordinal (``torch._C._cuda_getDevice`` when torch has it, bound below). A
    quantiser plan allocates its outputs on the current device and checks it is the input's first."""
    return torch.cuda.current_device()


def current_stream(index: int) -> int:
    """The raw ``CUstream`` handle of torch's current stream on device ``index`` (0: the legacy default
    stream). ``torch._C._cuda_getCurrentRawStream`` itself when torch has it (bound below: no Stream object,
    no Python frame per call), else the public ``torch.cuda.current_stream(index).cuda_stream``."""
    return torch.cuda.current_stream(index).cuda_stream


def is_capturing(index: int) -> bool:
    """True when torch's current stream on device ``index`` is capturing a CUDA graph (a launch issued now is
    recorded into the graph, not run: whatever it points to must outlive the graph). False on a torch built
    without CUDA (nothing can be captured there)."""
    if not torch.backends.cuda.is_built():
        return False
    if index == current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(index):
        return torch.cuda.is_current_stream_capturing()


if _raw_stream is not None:
    current_stream = _raw_stream  # noqa: F811 - same contract, one C call (every eager GPU op asks for it)
if getattr(torch._C, "_cuda_getDevice", None) is not None:
    current_device = torch._C._cuda_getDevice  # noqa: F811 - same contract, one C call
