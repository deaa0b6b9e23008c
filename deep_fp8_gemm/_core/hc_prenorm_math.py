"""``tf32_hc_prenorm_gemm``'s argument rules and float64 reference (issue 41, step 4's host half; no kernel yet).

``tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)`` as the reference design (DeepGEMM 2.6.1,
``csrc/apis/hyperconnection.hpp``) defines it for DeepSeek-V4's hyper-connection pre-norm: ``a`` ``[m, k]`` bfloat16
and ``b`` ``[n, k]`` float32, both K-major; ``D = A·Bᵀ`` with the tensor core reading ``b`` as tf32, and the row sums of
``A²`` fused. Without ``num_splits``: ``d`` ``[m, n]`` float32 (row-major), ``sqr_sum`` ``[m]`` float32. With
``num_splits = S``: K is split into S ranges and each writes its partial, ``d`` ``[S, m, n]`` and ``sqr_sum`` ``[S, m]``,
which the caller sums over the first dimension. The SM90 kernel's limits: ``n <= 32`` and ``n % 8 == 0``,
``k % 64 == 0``.

The split is the balanced partition of the ``k / 64`` K blocks: split ``s`` takes ``q + (s < r)`` consecutive blocks
(``q, r = divmod(k / 64, S)``), starting after those of the splits before it; a split with no block writes zeros.

The reference computes each partial exactly in float64 with ``b``'s values as the tensor core reads them (its low 13
mantissa bits dropped, ``hal/sim/numerics.hpp``; ``a``'s bf16 values are exact in tf32), rounded once to float32.
Errors: ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong rank, shape, stride, split count or
device, naming the argument and the values.
"""

from __future__ import annotations

import torch

from .bf16_math import matmul_f64

BLOCK_K = 64
MAX_N = 32


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tf32_hc_prenorm_gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def split_ranges(k: int, num_splits: int) -> list[tuple[int, int]]:
    """``[(k_begin, k_end)]`` of each split: the balanced partition of the ``k / 64`` K blocks."""
    q, r = divmod(k // BLOCK_K, num_splits)
    out, begin = [], 0
    for s in range(num_splits):
        blocks = q + (s < r)
        out.append((begin * BLOCK_K, (begin + blocks) * BLOCK_K))
        begin += blocks
    return out


def check_hc_prenorm(a: object, b: object, d: object, sqr_sum: object, num_splits: object = None
                     ) -> tuple[int, int, int, int]:
    """``(m, n, k, splits)`` after the reference's checks (splits 1 without ``num_splits``)."""
    a, b, d, sqr_sum = (_tensor(t, n) for t, n in ((a, "a"), (b, "b"), (d, "d"), (sqr_sum, "sqr_sum")))
    for t, name, dtype in ((a, "a", torch.bfloat16), (b, "b", torch.float32), (d, "d", torch.float32),
                           (sqr_sum, "sqr_sum", torch.float32)):
        if t.dtype != dtype:
            raise TypeError(f"tf32_hc_prenorm_gemm: {name} must be {dtype}, got {t.dtype}")
    for t, name, doc in ((a, "a", "[m, k]"), (b, "b", "[n, k]")):
        if t.dim() != 2:
            raise ValueError(f"tf32_hc_prenorm_gemm: {name} must be 2-D {doc}, got shape {tuple(t.shape)}")
    (m, k), (n, k_b) = a.shape, b.shape
    if num_splits is None:
        splits, d_shape, s_shape = 1, (m, n), (m,)
    else:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise ValueError(f"tf32_hc_prenorm_gemm: num_splits must be None or an int >= 1, got {num_splits!r}")
        splits, d_shape, s_shape = num_splits, (num_splits, m, n), (num_splits, m)
    if k_b != k or tuple(d.shape) != d_shape or tuple(sqr_sum.shape) != s_shape:
        raise ValueError(f"tf32_hc_prenorm_gemm: shapes do not agree: a {tuple(a.shape)} ([m, k]), b {tuple(b.shape)} "
                         f"([n, k]), d {tuple(d.shape)} (expected {d_shape}), sqr_sum {tuple(sqr_sum.shape)} (expected "
                         f"{s_shape}) with num_splits={num_splits}")
    if n < 1 or k < 1:
        raise ValueError(f"tf32_hc_prenorm_gemm: n and k must be positive, got n={n}, k={k}")
    if n > MAX_N or n % 8:
        raise ValueError(f"tf32_hc_prenorm_gemm: n must be a multiple of 8 and at most {MAX_N} on SM90, got n={n}")
    if k % BLOCK_K:
        raise ValueError(f"tf32_hc_prenorm_gemm: k must be a multiple of {BLOCK_K}, got k={k}")
    named = ((a, "a"), (b, "b"), (d, "d"), (sqr_sum, "sqr_sum"))
    if len({t.device for t, _ in named}) != 1:
        raise ValueError("tf32_hc_prenorm_gemm: every tensor must be on one device, got "
                         + ", ".join(f"{name} on {t.device}" for t, name in named))
    for t, name in ((a, "a"), (b, "b"), (d, "d")):
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"tf32_hc_prenorm_gemm: {name} must be {'K' if name != 'd' else 'N'}-major "
                             f"(stride(-1) == 1), got strides {tuple(t.stride())}")
    if not sqr_sum.is_contiguous():
        raise ValueError(f"tf32_hc_prenorm_gemm: sqr_sum must be contiguous, got strides {tuple(sqr_sum.stride())}")
    return m, n, k, splits


def tf32_operand(x: torch.Tensor) -> torch.Tensor:
    """fp32 values as the tensor core reads them as tf32: the low 13 mantissa bits dropped (finite values)."""
    bits = x.contiguous().view(torch.int32)
    kept = (bits & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), kept, x)


def hc_prenorm_reference(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
                         num_splits: int | None = None) -> None:
    """Writes each split's exact float64 partials of ``A·Bᵀ`` (``b`` as tf32) and of ``Σ A²``, rounded once to
    float32, into ``d`` and ``sqr_sum``."""
    m, n, k, splits = check_hc_prenorm(a, b, d, sqr_sum, num_splits)
    if m == 0:
        return
    a64, b64 = a.double(), tf32_operand(b).double()
    parts_d, parts_s = [], []
    for lo, hi in split_ranges(k, splits):
        parts_d.append(matmul_f64(a64[:, lo:hi], b64[:, lo:hi]))
        parts_s.append(matmul_f64(a64[:, lo:hi].square(), a64.new_ones(1, hi - lo))[:, 0])
    if num_splits is None:
        d.copy_(parts_d[0].float())
        sqr_sum.copy_(parts_s[0].float())
    else:
        d.copy_(torch.stack(parts_d).float())
        sqr_sum.copy_(torch.stack(parts_s).float())
