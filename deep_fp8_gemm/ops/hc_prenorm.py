"""``tf32_hc_prenorm_gemm``: DeepSeek-V4's hyper-connection pre-norm GEMM (the reference design's SM90 name,
arguments and refusals, DeepGEMM 2.6.1 ``csrc/apis/hyperconnection.hpp``), on the TF32 kernel
(``kernels/hc_prenorm.cuh``).

``a`` ``[m, k]`` bfloat16 and ``b`` ``[n, k]`` float32, both K-major; ``D = A·Bᵀ`` with the tensor core reading ``b``
as tf32 (``a``'s bf16 values are exact in tf32) and the row sums of ``A²`` fused. Without ``num_splits``: ``d``
``[m, n]`` and ``sqr_sum`` ``[m]`` float32. With ``num_splits = S``: ``d`` ``[S, m, n]``, ``sqr_sum`` ``[S, m]``, split
``s`` holding the partials over its share of K (the balanced partition of the ``k / 64`` K blocks:
:func:`.._core.hc_prenorm_math.split_ranges`; a split with no block writes zeros), which the caller sums over the
first dimension (as vLLM / SGLang do for V4's mHC, n = 24, num_splits 16). SM90 limits: ``n % 8 == 0``, ``n <= 32``,
``k % 64 == 0``. CPU tensors: the exact float64 partials rounded once (``hc_prenorm_math``), or the kernel in the
simulator under ``DFG_SIMULATE=1``.
"""

from __future__ import annotations

import torch

from .._core import hc_prenorm_math
from .._core.checks import check_no_overlap, check_not_self_overlapping, is_meta
from ..runtime import target
from ..runtime.target import Backend
from .bf16 import tma_view
from .hc_prenorm_plans import hc_prenorm_entry

__all__ = ["tf32_hc_prenorm_gemm"]


def tf32_hc_prenorm_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
                         num_splits: int | None = None) -> None:
    """``d = A·Bᵀ`` (TF32) and ``sqr_sum = Σ_k A²`` per row, per split of K when ``num_splits`` is given (module
    docstring). ``TypeError`` / ``ValueError`` name the argument and the values. Eager calls go through a per-call
    plan of their tensor signature (``ops.hc_prenorm_plans``): same checks, same errors, same launch."""
    _entry(a, b, d, sqr_sum, num_splits)


def _checks(a, b, d, sqr_sum, num_splits) -> tuple[int, int, int, int]:
    """Every check of the op in its order (the pointer-dependent overlaps last): ``(m, n, k, splits)``."""
    m, n, k, splits = hc_prenorm_math.check_hc_prenorm(a, b, d, sqr_sum, num_splits)
    check_not_self_overlapping(d, "d")
    if not is_meta(d):  # shape-only: no storage to compare
        check_no_overlap(d, ((a, "a"), (b, "b"), (sqr_sum, "sqr_sum")), "d")
        check_no_overlap(sqr_sum, ((a, "a"), (b, "b")), "sqr_sum")
    return m, n, k, splits


def _hc_prenorm(a, b, d, sqr_sum, num_splits) -> None:
    """The op without a plan: the checks, then the reference, the simulator or the kernel."""
    m = _checks(a, b, d, sqr_sum, num_splits)[0]
    if m == 0 or is_meta(d):
        return
    backend = target.backend_of(d.device, "gemm")
    if backend is Backend.REFERENCE:
        hc_prenorm_math.hc_prenorm_reference(a, b, d, sqr_sum, num_splits)
        return
    from ..kernels import hc_prenorm as kernels  # the JIT layer loads on first kernel use

    # The kernel stores D and the sums with plain accesses at contiguous offsets; a strided d goes through a buffer.
    out = d if d.is_contiguous() else torch.empty(d.shape, dtype=d.dtype, device=d.device)
    kernels.launch(tma_view(a), tma_view(b), out, sqr_sum, num_splits, backend=backend)
    if out is not d:
        d.copy_(out)


_entry = hc_prenorm_entry(_checks, _hc_prenorm)
