"""The BF16 GEMMs' argument rules and their float64 reference (issue 41, step 3's host half; no kernel yet).

``bf16_gemm_{nt,nn,tn,tt}(a, b, d, c=None)`` as the reference design (DeepGEMM 2.6.1, ``csrc/apis/gemm.hpp``) defines
them: ``D = C + A·Bᵀ`` in the NT form, written into ``d`` in place, with the other three layouts being NT on
transposed views of the operands as given:

======  ===============  ===============
layout  ``a`` as given   ``b`` as given
======  ===============  ===============
nt      ``[m, k]``       ``[n, k]``
nn      ``[m, k]``       ``[k, n]``
tn      ``[k, m]``       ``[k, n]``
tt      ``[k, m]``       ``[n, k]``
======  ===============  ===============

``a`` and ``b`` bfloat16, ``d`` ``[m, n]`` bfloat16 or float32 and row-major (N-major); ``c`` optional, the same
dtype and shape as ``d`` and row-major (it may be ``d`` itself). The reference computes every output as the exact
float64 sum ``c + Σ_k A[r,k]·B[c,k]`` (bf16 products are exact in float64 and K ≤ 2^20 keeps the sum within a few
float64 ulps), rounded once to ``d``'s dtype: batch-invariant by construction. Errors: ``TypeError`` for a wrong
Python type or dtype, ``ValueError`` for a wrong layout name, rank, shape, device or stride, each naming the argument
and the values.
"""

from __future__ import annotations

import torch

#: layout -> (a given transposed, b given as [k, n]): A = a.T when the first is set, B = b.T when the second is.
LAYOUTS = {"nt": (False, False), "nn": (False, True), "tn": (True, True), "tt": (True, False)}
_SHAPE_DOC = {"nt": ("[m, k]", "[n, k]"), "nn": ("[m, k]", "[k, n]"), "tn": ("[k, m]", "[k, n]"),
              "tt": ("[k, m]", "[n, k]")}
OUT_DTYPES = (torch.bfloat16, torch.float32)


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def bf16_gemm_operands(layout: str, a: object, b: object, d: object, c: object = None
                       ) -> tuple[torch.Tensor, torch.Tensor, int, int, int]:
    """``(A [m, k], B [n, k], m, n, k)`` as views of ``a`` / ``b`` for ``bf16_gemm_<layout>``, after every check that
    does not depend on the kernel (types, dtypes, ranks, shapes, devices, ``d`` / ``c`` row-major)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
    a, b, d = _tensor(a, "a"), _tensor(b, "b"), _tensor(d, "d")
    doc_a, doc_b = _SHAPE_DOC[layout]
    for t, name, doc in ((a, "a", doc_a), (b, "b", doc_b)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"bf16_gemm_{layout}: {name} must be torch.bfloat16, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"bf16_gemm_{layout}: {name} must be 2-D {doc}, got shape {tuple(t.shape)}")
    if d.dtype not in OUT_DTYPES:
        raise TypeError(f"bf16_gemm_{layout}: d must be torch.bfloat16 or torch.float32, got {d.dtype}")
    if d.dim() != 2:
        raise ValueError(f"bf16_gemm_{layout}: d must be 2-D [m, n], got shape {tuple(d.shape)}")
    trans_a, trans_b = LAYOUTS[layout]
    A, B = (a.T if trans_a else a), (b.T if trans_b else b)
    (m, k), (n, k_b) = A.shape, B.shape
    if k_b != k or tuple(d.shape) != (m, n):
        raise ValueError(f"bf16_gemm_{layout}: shapes do not agree: a {tuple(a.shape)} ({doc_a}), b {tuple(b.shape)} "
                         f"({doc_b}), d {tuple(d.shape)} ([m, n]): m={m}, k={k} from a, k={k_b}, n={n} from b")
    named = [(a, "a"), (b, "b"), (d, "d")]
    if c is not None:
        c = _tensor(c, "c")
        if c.dtype != d.dtype:
            raise TypeError(f"bf16_gemm_{layout}: c must have d's dtype {d.dtype}, got {c.dtype}")
        if tuple(c.shape) != tuple(d.shape):
            raise ValueError(f"bf16_gemm_{layout}: c must have d's shape {tuple(d.shape)}, got {tuple(c.shape)}")
        named.append((c, "c"))
    devices = {t.device for t, _ in named}
    if len(devices) != 1:
        raise ValueError("bf16_gemm_" + layout + ": every tensor must be on one device, got "
                         + ", ".join(f"{n} on {t.device}" for t, n in named))
    for t, name in named[2:]:
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"bf16_gemm_{layout}: {name} must be row-major (N-major, stride(-1) == 1), got strides "
                             f"{tuple(t.stride())}")
    return A, B, m, n, k


#: Rows per matmul call of :func:`matmul_f64`: a multiple of every register-tile height a CPU BLAS uses for float64
#: (4, 6, 8, 12, 16, 24), so no row ever lands in an edge tile.
ROW_BLOCK = 48


def matmul_f64(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A · Bᵀ`` in float64 (``A [r, k]``, ``B [n, k]``, any float dtypes), batch-invariant: the rows go through
    matmuls of one fixed shape ``[ROW_BLOCK, k] x [k, n]`` (the last block zero-padded), so each row is computed by
    the same BLAS call, tile and K order whatever ``r`` and the other rows are. (bf16 and tf32 products are exact in
    float64; their sums are not always, so a BLAS that blocks K differently for another M could move a last bit.)"""
    r, k = A.shape
    b64 = B.double().T
    out = torch.empty(r, B.shape[0], dtype=torch.float64, device=A.device)
    for lo in range(0, r, ROW_BLOCK):
        hi = min(lo + ROW_BLOCK, r)
        block = A[lo:hi].double()
        if hi - lo < ROW_BLOCK:
            block = torch.cat([block, block.new_zeros(ROW_BLOCK - (hi - lo), k)])
        out[lo:hi] = (block @ b64)[:hi - lo]
    return out


def bf16_gemm_reference(layout: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                        c: torch.Tensor | None = None) -> torch.Tensor:
    """``d = c + A·Bᵀ`` (``c=None``: ``A·Bᵀ``) for ``bf16_gemm_<layout>``: exact float64 sums rounded once to ``d``'s
    dtype, written into ``d`` (``c`` may be ``d``); returns ``d``."""
    A, B, m, n, k = bf16_gemm_operands(layout, a, b, d, c)
    if m == 0 or n == 0:
        return d
    acc = matmul_f64(A, B)
    if c is not None:
        acc = acc + c.double()
    d.copy_(acc.to(d.dtype))
    return d
