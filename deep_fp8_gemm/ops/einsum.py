"""``einsum`` (BF16) and ``fp8_einsum``: the reference design's fixed Einstein sums on SM90 (DeepGEMM 2.6.1,
``csrc/apis/einsum.hpp``), as batched GEMMs over the kernels that exist.

=====================  ==================  ==================  ===============  =====================================
expression             ``a``               ``b``               ``d``            kernel (the GEMM per batch index)
=====================  ==================  ==================  ===============  =====================================
``bmk,bnk->mn``        ``[s, m, k]``       ``[s, n, k]``       ``[m, n]``       BF16, K walks s then k: D = C + Σ_s
``bhr,hdr->bhd``       ``[b, h, r]``       ``[h, d, r]``       ``[b, h, d]``    BF16 batched over h, K = r
``bhd,hdr->bhr``       ``[b, h, d]``       ``[h, d, r]``       ``[b, h, r]``    BF16 batched over h, K = d (MN-major B)
``bhr,hdr->bhd`` (FP8) ``([b,h,r], sA)``   ``([h,d,r], sB)``   ``[b, h, d]``    the FP8 masked kernel, one group per h
=====================  ==================  ==================  ===============  =====================================

The reference's SM90 rules, refused with ``TypeError`` / ``ValueError`` naming the argument: bfloat16 ``a`` / ``b``;
``bmk,bnk->mn`` with float32 ``d`` accumulates in place (``c`` must be ``d``) and with bfloat16 ``d`` takes no ``c``,
``a`` / ``b`` / ``d`` contiguous, ``m % 64 == 0``, ``n % 64 == 0``, ``k % 64 == 0``; the head expressions take no ``c``,
bfloat16 ``d`` and unit last strides (the other strides are free: the operands are permuted views); ``use_cublaslt``
is accepted (the reference's cuBLASLt switch; this library has one BF16 kernel, so the result is the same math);
``fp8_einsum`` takes ``bhr,hdr->bhd`` only (the others are the reference's SM100 paths), recipe ``(1, 128, 128)``,
bfloat16 ``d``, ``c`` optional (``d = bf16(c + bf16(A·Bᵀ))``, the reference's SM90 accumulate-on-store).
"""

from __future__ import annotations

import torch

from .._core import bf16_math, plans
from .._core.checks import check_no_overlap, check_not_self_overlapping, is_meta
from ..kernels import gemm as gemm_host
from ..kernels import launching
from ..runtime import target
from ..runtime.target import Backend
from . import bf16 as bf16_ops
from .bf16_plans import Bf16Plan, plan_entry
from .einsum_plans import fp8_entry
from .masked import FAMILIES as MASKED_FAMILIES
from .masked import m_grouped_gemm_fp8_fp8_bf16_nt_masked

__all__ = ["einsum", "fp8_einsum", "EINSUM_EXPRESSIONS", "FP8_EINSUM_EXPRESSIONS"]

#: The expressions each name computes on SM90.
EINSUM_EXPRESSIONS = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr")
FP8_EINSUM_EXPRESSIONS = ("bhr,hdr->bhd",)
#: The reference's only SM90 recipe for fp8_einsum (1x128 per-token A scales, 128x128 block B scales).
FP8_EINSUM_RECIPE = (1, 128, 128)


def _tensor(t: object, name: str, fn: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _rank(t: torch.Tensor, name: str, rank: int, doc: str, fn: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{fn}: {name} must be {rank}-D {doc}, got shape {tuple(t.shape)}")


def _same_device(fn: str, named) -> None:
    if len({t.device for t, _ in named}) != 1:
        raise ValueError(f"{fn}: every tensor must be on one device, got "
                         + ", ".join(f"{n} on {t.device}" for t, n in named))


def einsum(expr: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
           use_cublaslt: bool = False) -> None:
    """The BF16 Einstein sum ``expr`` of ``a`` and ``b`` into ``d`` in place (module docstring: the three
    expressions, shapes and rules). Every output is the float64 sum of exact bf16 products rounded once on the CPU
    reference; the kernels accumulate in fp32 in a fixed K order (never split), so a row's bits do not depend on the
    batch. Host time: the head expressions run through the plan of their signature (``ops.bf16_plans``)."""
    if c is None and (use_cublaslt is False or use_cublaslt is True) and type(expr) is str:
        entry = _HEAD_ENTRIES.get(expr)
        if entry is not None:
            entry(a, b, d, None, None)
            return
    _einsum(expr, a, b, d, c, use_cublaslt)


def _einsum(expr, a, b, d, c=None, use_cublaslt=False) -> None:
    """``einsum`` without a plan: the checks, then the reference, the simulator or the kernel."""
    a, b, d, c = _einsum_checks(expr, a, b, d, c, use_cublaslt)
    if expr == "bmk,bnk->mn":
        _bmk_bnk_mn(a, b, d, c, use_cublaslt)
    else:
        _heads(expr, a, b, d, c)


def _einsum_checks(expr, a, b, d, c, use_cublaslt):
    """The checks every expression shares (its errors, its order); returns ``(a, b, d, c)``."""
    fn = "einsum"
    if not isinstance(expr, str):
        raise TypeError(f"{fn}: expr must be a str, got {type(expr).__name__}")
    if expr not in EINSUM_EXPRESSIONS:
        raise ValueError(f"{fn}: expr must be one of {EINSUM_EXPRESSIONS} on SM90, got {expr!r}")
    if not isinstance(use_cublaslt, bool):
        raise TypeError(f"{fn}: use_cublaslt must be a bool, got {type(use_cublaslt).__name__}")
    a, b, d = _tensor(a, "a", fn), _tensor(b, "b", fn), _tensor(d, "d", fn)
    for t, name in ((a, "a"), (b, "b")):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{fn}: {name} must be torch.bfloat16, got {t.dtype}")
    if d.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"{fn}: d must be torch.bfloat16 or torch.float32, got {d.dtype}")
    if c is not None:
        c = _tensor(c, "c", fn)
        if c.dtype != d.dtype:
            raise TypeError(f"{fn}: c must have d's dtype {d.dtype}, got {c.dtype}")
    return a, b, d, c


def _bmk_bnk_mn(a, b, d, c, use_cublaslt) -> None:
    fn = "einsum('bmk,bnk->mn')"
    if use_cublaslt:
        raise ValueError(f"{fn}: use_cublaslt must be False (the reference has no cuBLASLt path for this expression)")
    if d.dtype == torch.float32:
        if c is None or c.data_ptr() != d.data_ptr() or c.shape != d.shape or c.stride() != d.stride():
            raise ValueError(f"{fn}: with float32 d the reference accumulates in place: c must be d itself (same "
                             f"storage, shape and strides), got {'None' if c is None else 'another tensor'}")
    elif c is not None:
        raise ValueError(f"{fn}: with bfloat16 d, c must be None (the reference accumulates only into float32 d)")
    _rank(a, "a", 3, "[s, m, k]", fn)
    _rank(b, "b", 3, "[s, n, k]", fn)
    _rank(d, "d", 2, "[m, n]", fn)
    (s, m, k), (s_b, n, k_b) = a.shape, b.shape
    if s_b != s or k_b != k or tuple(d.shape) != (m, n):
        raise ValueError(f"{fn}: shapes do not agree: a {tuple(a.shape)} ([s, m, k]), b {tuple(b.shape)} ([s, n, k]), "
                         f"d {tuple(d.shape)} ([m, n])")
    # The reference asserts contiguous a, b and fp32 d (bf16 d is written from an fp32 workspace: any strides)
    for t, name in ((a, "a"), (b, "b")) + (((d, "d"),) if d.dtype == torch.float32 else ()):
        if not t.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous (the reference asserts it), got strides "
                             f"{tuple(t.stride())}")
    check_not_self_overlapping(d, "d")
    if m % 64 or n % 64 or k % 64:
        raise ValueError(f"{fn}: m, n and k must be multiples of 64 on SM90 (the reference's kernel), got m={m}, "
                         f"n={n}, k={k}")
    if s * max(m, n) > 2**31 - 1:
        raise ValueError(f"{fn}: s * max(m, n) must fit in int32 (the reference asserts it), got s={s}, m={m}, n={n}")
    _same_device(fn, ((a, "a"), (b, "b"), (d, "d")))
    if not is_meta(d):
        check_no_overlap(d, ((a, "a"), (b, "b")), "d")
    if is_meta(d) or s == 0:
        if s == 0 and d.dtype == torch.bfloat16 and not is_meta(d):
            d.zero_()
        return
    backend = target.backend_of(d.device, "gemm")
    if backend is Backend.REFERENCE:
        # Σ_s A_s·B_sᵀ = [A_0 | A_1 | ...]·[B_0 | B_1 | ...]ᵀ: K walks s then k, as the kernel does
        acc = bf16_math.matmul_f64(a.permute(1, 0, 2).reshape(m, s * k), b.permute(1, 0, 2).reshape(n, s * k))
        if c is not None:
            acc += d.double()
        d.copy_(acc.to(d.dtype))
        return
    kernels = bf16_ops.kernel_module()
    out = d if d.dtype == torch.float32 else torch.zeros(m, n, dtype=torch.float32, device=d.device)
    cfg = kernels.pick_config(kernels.Bf16Form.BATCHED_REDUCE, m, n, k, s, "k", "k", torch.float32, True,
                              launching.num_ctas(backend))
    kernels.launch(cfg, a, b, out, out, backend=backend)
    if out is not d:
        d.copy_(out)  # the reference's own FP32-to-BF16 cast of its workspace


def _heads(expr, a, b, d, c) -> None:
    problem = _heads_checks(expr, a, b, d, c)
    if problem is not None:
        _heads_run(expr, a, b, d, *problem)


def _heads_checks(expr, a, b, d, c) -> tuple[int, int, int, int] | None:
    """A head expression's own checks (its errors, its order); ``(b, h, n, k)``, or None when nothing is written
    (meta, an empty output)."""
    fn = f"einsum({expr!r})"
    if c is not None:
        raise ValueError(f"{fn}: c must be None (the reference takes no C for the head expressions)")
    if d.dtype != torch.bfloat16:
        raise TypeError(f"{fn}: d must be torch.bfloat16 (the reference's head expressions), got {d.dtype}")
    out_dim = "d" if expr == "bhr,hdr->bhd" else "r"
    a_doc = "[b, h, r]" if out_dim == "d" else "[b, h, d]"
    _rank(a, "a", 3, a_doc, fn)
    _rank(b, "b", 3, "[h, d, r]", fn)
    _rank(d, "d", 3, f"[b, h, {out_dim}]", fn)
    (nb, h, ka), (h_b, dd, r) = a.shape, b.shape
    k, n = (r, dd) if out_dim == "d" else (dd, r)
    if h_b != h or ka != k or tuple(d.shape) != (nb, h, n):
        raise ValueError(f"{fn}: shapes do not agree: a {tuple(a.shape)} ({a_doc}), b {tuple(b.shape)} ([h, d, r]), "
                         f"d {tuple(d.shape)} (expected {(nb, h, n)})")
    for t, name in ((a, "a"), (b, "b"), (d, "d")):
        if t.numel() and t.stride(2) != 1:
            raise ValueError(f"{fn}: {name} must have a unit last stride (the reference asserts {name}.stride(2) == 1), "
                             f"got strides {tuple(t.stride())}")
    _same_device(fn, ((a, "a"), (b, "b"), (d, "d")))
    check_not_self_overlapping(d, "d")
    if is_meta(d):
        return None
    check_no_overlap(d, ((a, "a"), (b, "b")), "d")
    if nb == 0 or h == 0 or n == 0:
        return None
    return nb, h, n, k


def _head_views(expr, a, b, d):
    """Per head: A_h [b, k] (a row stride of h*k), B_h [n, k] (K-major for bhr,hdr->bhd; MN-major for
    bhd,hdr->bhr), D_h [b, n]: ``(A, B, D)``, views of a, b, d starting at their addresses (the plan's maps read
    the first two, ``_head_entry``)."""
    return a.permute(1, 0, 2), (b if expr == "bhr,hdr->bhd" else b.transpose(1, 2)), d.permute(1, 0, 2)


def _heads_run(expr, a, b, d, nb, h, n, k) -> None:
    if k == 0:
        d.zero_()
        return
    A, B, D = _head_views(expr, a, b, d)
    backend = target.backend_of(d.device, "gemm")
    if backend is Backend.REFERENCE:
        for head in range(h):
            D[head] = bf16_math.matmul_f64(A[head], B[head]).to(d.dtype)
        return
    kernels = bf16_ops.kernel_module()
    A, B = bf16_ops.tma_view(A), bf16_ops.tma_view(B)
    cfg = kernels.pick_config(kernels.Bf16Form.BATCHED, nb, n, k, h, "k", bf16_ops.major_of(B), torch.bfloat16,
                              False, launching.num_ctas(backend))
    kernels.launch(cfg, A, B, D, None, backend=backend)  # D: d's permuted view, row-major per head


def fp8_einsum(expr: str, a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
               d: torch.Tensor, c: torch.Tensor | None = None,
               recipe: tuple[int, int, int] = FP8_EINSUM_RECIPE) -> None:
    """The FP8 Einstein sum ``bhr,hdr->bhd`` (DeepSeek-V4's ``o_proj`` / ``wo_a``): ``a = (x [b, h, r] e4m3,
    sx [b, h, ceil(r/128)] fp32)`` (per token and head, e.g. ``per_token_cast_to_fp8(x.view(-1, r))`` viewed back),
    ``b = (y [h, d, r] e4m3, sy [h, ceil(d/128), ceil(r/128)] fp32)`` (per head 128x128 blocks), ``d`` ``[b, h, d]``
    bfloat16: ``d[:, i] = bf16(dequant(x[:, i]) · dequant(y[i])ᵀ)`` for every head ``i`` as the FP8 masked kernel
    computes it (one group per head, every row valid; the 1D2D promotion). ``c`` (``d``'s shape, bfloat16):
    ``d = bf16(c + that)``. ``sx`` is read where it lies when the kernel's sA map can: row-major (strides
    ``(h * kb, kb, 1)``, ``kb = ceil(r/128)`` a multiple of 4) or per_token_cast_to_fp8's M-major ``[b * h, kb]``
    viewed back (strides ``(h, 1, align(b * h, 4))``, ``h`` a multiple of 4), 16-byte aligned (any strides with a
    unit-stride kb or h dimension and the other two 16-byte multiples: ``kernels.gemm.sa_major_of``); any other ``sx``
    is copied per call into the M-major layout. ``x``, ``y`` and ``d`` are copied where their strides or addresses are
    off 16 bytes. Host time: a call without ``c`` runs through the plan of its signature (``ops.einsum_plans``)."""
    _FP8_ENTRY(expr, a, b, d, c, recipe)


def _fp8_einsum(expr, a, b, d, c=None, recipe=FP8_EINSUM_RECIPE) -> None:
    """``fp8_einsum`` without a plan: the checks, then the masked GEMM on the per-head views."""
    fn = "fp8_einsum"
    if not isinstance(expr, str):
        raise TypeError(f"{fn}: expr must be a str, got {type(expr).__name__}")
    if expr not in FP8_EINSUM_EXPRESSIONS:
        raise ValueError(f"{fn}: expr must be one of {FP8_EINSUM_EXPRESSIONS} on SM90 (the reference's other "
                         f"expressions are SM100 paths), got {expr!r}")
    if not isinstance(recipe, (tuple, list)) or tuple(recipe) != FP8_EINSUM_RECIPE:
        raise ValueError(f"{fn}: recipe must be {FP8_EINSUM_RECIPE} on SM90 (1x128 per-token A scales, 128x128 "
                         f"block B scales), got {recipe!r}")
    for pair, name in ((a, "a"), (b, "b")):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{fn}: {name} must be a (values, scales) pair, got {type(pair).__name__}")
    (x, sx), (y, sy) = a, b
    if _fp8_checks(x, sx, y, sy, d, c):
        _fp8_run(x, sx, y, sy, d, c)


def _fp8_checks(x, sx, y, sy, d, c) -> bool:
    """``fp8_einsum``'s checks of the tensors (its errors, its order); False when there is nothing to compute."""
    fn = "fp8_einsum"
    d = _tensor(d, "d", fn)
    if d.dtype != torch.bfloat16:
        raise TypeError(f"{fn}: d must be torch.bfloat16 (the reference's SM90 FP8 batched GEMM), got {d.dtype}")
    for t, name, rank, doc in ((x, "a[0]", 3, "[b, h, r]"), (sx, "a[1]", 3, "[b, h, ceil(r/128)]"),
                               (y, "b[0]", 3, "[h, d, r]"), (sy, "b[1]", 3, "[h, ceil(d/128), ceil(r/128)]"),
                               (d, "d", 3, "[b, h, d]")):
        _rank(_tensor(t, name, fn), name, rank, doc, fn)
    nb, h, r = x.shape
    dd = y.shape[1]
    if y.shape[0] != h or y.shape[2] != r or tuple(d.shape) != (nb, h, dd):
        raise ValueError(f"{fn}: shapes do not agree: a[0] {tuple(x.shape)} ([b, h, r]), b[0] {tuple(y.shape)} "
                         f"([h, d, r]), d {tuple(d.shape)} ([b, h, d])")
    for t, name in ((x, "a[0]"), (y, "b[0]")):
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{fn}: {name} must be torch.float8_e4m3fn, got {t.dtype}")
    for t, name, shape, doc in ((sx, "a[1]", (nb, h, -(-r // 128)), "[b, h, ceil(r/128)]"),
                                (sy, "b[1]", (h, -(-dd // 128), -(-r // 128)), "[h, ceil(d/128), ceil(r/128)]")):
        if t.dtype != torch.float32:
            raise TypeError(f"{fn}: {name} must be torch.float32 scales {doc}, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{fn}: {name} must have shape {doc} = {shape}, got {tuple(t.shape)}")
    if r % 16 or dd % 8:
        raise ValueError(f"{fn}: r must be a multiple of 16 and d a multiple of 8 (the FP8 kernel's TMA 16-byte rows), "
                         f"got r={r}, d={dd}")
    for t, name in ((x, "a[0]"), (y, "b[0]"), (d, "d")):
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{fn}: {name} must have a unit last stride (the reference asserts it), got strides "
                             f"{tuple(t.stride())}")
    named = [(x, "a[0]"), (sx, "a[1]"), (y, "b[0]"), (sy, "b[1]"), (d, "d")]
    if c is not None:
        c = _tensor(c, "c", fn)
        if c.dtype != d.dtype or c.shape != d.shape:
            raise ValueError(f"{fn}: c must be bfloat16 of d's shape {tuple(d.shape)}, got {c.dtype} "
                             f"{tuple(c.shape)}")
        named.append((c, "c"))
    _same_device(fn, named)
    check_not_self_overlapping(d, "d")
    if c is not None and c.data_ptr() == d.data_ptr() and c.stride() != d.stride():
        raise ValueError(f"{fn}: c starts where d does but has other strides: c.stride()={c.stride()}, "
                         f"d.stride()={d.stride()}; pass c=d to accumulate in place")
    if is_meta(d) or nb == 0 or h == 0:
        return False
    check_no_overlap(d, tuple(named[:4]), "d")
    return True


def _fp8_run(x, sx, y, sy, d, c) -> None:
    nb, h, _ = x.shape
    dd = y.shape[1]
    # One masked group per head, every row valid: A_h = x[:, h] ([b, r], row stride h*r), D_h = d[:, h]. Operands
    # and output the FP8 kernel's maps cannot address go through contiguous copies.
    masked_m = torch.full((h,), nb, dtype=torch.int32, device=d.device)
    xa = x.permute(1, 0, 2)
    if x.data_ptr() % 16 or any((s_ % 16) for s_ in x.stride()[:2]):
        xa = xa.contiguous()
    ya = y if y.data_ptr() % 16 == 0 and y.is_contiguous() else y.contiguous()
    direct = d.data_ptr() % 16 == 0 and all(s_ % 8 == 0 for s_ in d.stride()[:2])
    out = d.permute(1, 0, 2) if direct else torch.empty(h, nb, dd, dtype=torch.bfloat16, device=d.device)
    base = None if c is None else c.float()  # read before d is written (c may be d)
    sa = sx.permute(1, 0, 2)
    major = gemm_host.sa_major_of(sa)
    backend = target.backend_of(d.device, "gemm")
    if major is not None and backend is not Backend.REFERENCE:
        # sx read where it lies (a K- or G-major sA map, kernels.gemm.sa_major_of): the masked family's config for
        # that layout, launched on the checked views; every other sx goes through the M-major copy of the op.
        cfg = MASKED_FAMILIES["masked"].plan(xa, ya, nb, gemm_host.num_sms_for(backend), sa_major=major)
        gemm_host.launch_1d2d(cfg, xa, sa, ya, sy.contiguous(), out, masked_m, backend)
    else:
        m_grouped_gemm_fp8_fp8_bf16_nt_masked((xa, sa), (ya, sy.contiguous()), out, masked_m, nb)
    if not direct:
        d.copy_(out.permute(1, 0, 2))
    if base is not None:
        d.copy_((base + d.float()).to(torch.bfloat16))


def _fp8_plan_op(x, sx, y, sy, d) -> None:
    """The op's path of a planned call (``c`` None): checks included."""
    if _fp8_checks(x, sx, y, sy, d, None):
        _fp8_run(x, sx, y, sy, d, None)


_FP8_ENTRY = fp8_entry(lambda x, sx, y, sy, d: _fp8_checks(x, sx, y, sy, d, None), _fp8_plan_op, _fp8_einsum,
                       FP8_EINSUM_RECIPE)


def _head_entry(expr: str):
    """The BF16 head expression ``expr``'s entry (``ops.bf16_plans.plan_entry``, ``x`` = c, always None here): the
    batched kernel over the per-head views, which need no temporary (the kernel reads and writes them in place)."""
    def views(a, b):
        return a.permute(1, 0, 2), (b if expr == "bhr,hdr->bhd" else b.transpose(1, 2))

    def op(a, b, d, c, expected_m) -> None:
        _einsum(expr, a, b, d, c)

    def make(a, b, d, c) -> Bf16Plan:
        a, b, d, c = _einsum_checks(expr, a, b, d, c, False)
        problem = _heads_checks(expr, a, b, d, c)
        if problem is None:
            return Bf16Plan(op, views, "BATCHED", a, b, d, None, True, 0, 0, 0, 0)
        nb, h, n, k = problem
        A, B, D = _head_views(expr, a, b, d)
        return Bf16Plan(op, views, "BATCHED", A, B, D, None, True, nb, n, k, h)

    return plan_entry(make, op)


#: The head expressions' entries (``bmk,bnk->mn`` has none: its bf16 output goes through an fp32 workspace).
_HEAD_ENTRIES = {expr: _head_entry(expr) for expr in EINSUM_EXPRESSIONS[1:]}


def clear_plans() -> None:
    """Forget every einsum / fp8_einsum plan (tests; a loaded kernel stays loaded)."""
    _FP8_ENTRY.clear_plans()
    for entry in _HEAD_ENTRIES.values():
        entry.plans.clear()
        for index in entry.indexes:
            index.clear()


def plan_stats() -> dict[str, tuple[int, int]]:
    """``{name: (plans, guards indexed)}``: ``fp8_einsum`` and ``einsum <expr>`` per head expression."""
    out = {"fp8_einsum": _FP8_ENTRY.stats()}
    for expr, entry in _HEAD_ENTRIES.items():
        out[f"einsum {expr}"] = (len(entry.plans), sum(len(e) for i in entry.indexes for e in i.values()))
    return out


plans.register_cache("einsum.", clear_plans, plan_stats)  # _core.plans.clear() / stats() cover these plans too
