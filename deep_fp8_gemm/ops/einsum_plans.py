"""``fp8_einsum``'s per-call fast path (issue 45): the plan of one tensor signature and the eager entry that finds it,
the design of ``_core.plans`` / ``ops.bf16_plans`` over the FP8 masked GEMM's own plan (``_core.plans.GemmPlan``).
``ops.einsum`` builds the entry over its own checks and path; this module knows nothing else of the op.

``fp8_einsum("bhr,hdr->bhd", (x, sx), (y, sy), d)`` is the masked GEMM with one group per head and every row valid,
on permuted views: A = ``x.permute(1, 0, 2)``, sA = ``sx.permute(1, 0, 2)`` (read where it lies when K- or G-major,
``kernels.gemm.sa_major_of``, by the kernel compiled for that layout; else converted to the M-major TMA-aligned
layout), B = ``y``, sB = ``sy``, D = ``d.permute(1, 0, 2)``, ``masked_m`` = ``[b] * h``. A view starts at its base's
address and spans its bytes, so everything the masked GEMM's plan keys by (data pointers, byte spans) is a function
of the caller's tensors: a call makes no view. What the op makes per call:

* ``masked_m``: a constant, read by the kernel only. Eager, the plan keeps one per stream (filled on that stream, so
  every later launch there is ordered after the fill; :data:`~deep_fp8_gemm._core.plans.MAX_WORKSPACES` streams);
  under CUDA graph capture a new one per call, as the op (a captured launch must not point at memory the plan may
  free later), like split-K's workspace (``GemmPlan._split_k_workspace``).
* sA's conversion: the data differ per call, so it stays per call (``[b, h, kb]`` with the M-major strides, filled
  by one ``copy_`` from ``sx``: the transposed layout ``normalise_scales`` makes, without the permuted view). Skipped,
  as by the op, when ``sx.permute(1, 0, 2)`` already has that layout, and when it is K- or G-major (the consumers'
  row-major ``sx`` with ``ceil(r/128) % 4 == 0``, and per_token_cast_to_fp8's M-major ``[b * h, kb]`` viewed back
  with ``h % 4 == 0``): the plan's GEMM then runs the kernel of ``GemmConfig.sa_major`` "k" / "g", which reads sx
  itself (as the op does).
* copies of a misaligned ``x`` / ``y`` / ``d`` or of a ``y`` / ``x`` / ``d`` whose strides the maps cannot describe,
  and ``c``'s fp32 round trip: not planned (a signature with such strides, and ``c``, always take the op's path; an
  address off 16 bytes takes it for that call).
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import env
from .._core import plans as core_plans
from .._core.checks import byte_span, is_meta
from .._core.plans import ALLOCATORS, MAX_WORKSPACES, GemmPlan, guard, index_entry, plan_of, signature
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS, m_major_strides

_Tensor = torch.Tensor
_F32, _I32 = torch.float32, torch.int32
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


class Fp8EinsumPlan:
    """One checked signature of ``fp8_einsum("bhr,hdr->bhd", (x, sx), (y, sy), d)`` (no ``c``, the SM90 recipe);
    ``plan.call(x, sx, y, sy, d)`` runs a call of that signature.

    Built by the entry (:func:`fp8_entry`) after the op's own checks. A plan is *fast* on an sm_90 GPU with a
    non-empty problem whose views the masked kernel's maps read in place (``x``'s two leading strides 16-byte
    multiples, ``y`` contiguous, ``d``'s leading strides multiples of 8 elements) and ``DFG_CHECK_LAYOUTS`` off; any
    other plan (CPU: the reference or the simulator; meta; empty) calls the op's path. A fast call:

    * ``x``, ``y``, ``d`` at 16-byte aligned addresses, ``d`` overlapping none of the inputs (integer compares against
      the cached spans), the current device the tensors' (the allocator's); else the op's path (its message, or its
      copies);
    * sA converted (per call, see the module docstring) and ``masked_m`` (the stream's, or the capture's own);
    * the masked GEMM's plan (``GemmPlan``, built for the views): its parameter block of these pointers launched
      (``GemmPlan.launch``) when it holds one, else the plan called with the views (its pointer checks, maps, block).
    """

    __slots__ = ("op", "call", "index", "gemm", "spans", "convert", "sa_shape", "sa_strides", "counts", "h", "nb",
                 "device", "_empty", "sa_major")

    def __init__(self, op: Callable, x, sx, y, sy, d):
        self.op = self.call = op
        nb, h = x.shape[0], x.shape[1]
        if nb == 0 or h == 0 or is_meta(d) or target.gpu_index(d.device) is None:
            return
        if target.backend_of(d.device, "gemm") is not Backend.CUDA:  # RuntimeError off sm_90, as the op
            return
        empty = ALLOCATORS.get(d.device.type)
        if (empty is None or any(s % 16 for s in x.stride()[:2]) or not y.is_contiguous()
                or any(s % 8 for s in d.stride()[:2]) or env.check_layouts()):
            return  # copied on every call, or the layout's values checked: the op's path
        self.index, self.h, self.nb, self.device, self._empty = target.gpu_index(d.device), h, nb, d.device, empty
        kb = sx.shape[2]
        strides = m_major_strides((h, nb, kb))
        # sA as the kernel reads it: sx itself when its permuted view is K- or G-major (the kernel of that layout) or
        # M-major already, else a [b, h, kb] tensor whose permuted view is M-major (what normalise_scales makes),
        # filled by copy_ per call. The op takes the same decision per call (ops.einsum._fp8_run).
        self.sa_major = gemm_host.sa_major_of(sx.permute(1, 0, 2), address=False) or "m"
        self.convert = self.sa_major == "m" and sx.permute(1, 0, 2).stride() != strides
        self.sa_shape, self.sa_strides = (nb, h, kb), (strides[1], strides[0], strides[2])
        sa = self._scales(sx)
        counts = torch.full((h,), nb, dtype=_I32, device=d.device)
        self.counts: dict[int, torch.Tensor] = {}  # stream -> masked_m (eager calls)
        masked = core_plans.GEMM_ENTRIES["masked"].spec
        self.gemm = GemmPlan(masked, x.permute(1, 0, 2), sa.permute(1, 0, 2), y, sy, d.permute(1, 0, 2), counts, nb,
                             sa_major=self.sa_major)
        if not self.gemm.fast:  # sy not contiguous: the op copies it on every call
            return
        self.spans = (byte_span(x), byte_span(sx), byte_span(y), byte_span(sy), byte_span(d))
        self.call = self._launch

    def _scales(self, sx):
        if not self.convert:
            return sx
        sa = self._empty(self.sa_shape, self.sa_strides, _F32)
        sa.copy_(sx)
        return sa

    def _masked_m(self, capturing: bool, stream: int):
        """The launch's ``masked_m``: the current stream's (eager), or the capture's own (never cached)."""
        if capturing:
            return torch.full((self.h,), self.nb, dtype=_I32, device=self.device)
        counts = self.counts.get(stream)
        if counts is None:
            if len(self.counts) >= MAX_WORKSPACES:
                self.counts.clear()
            counts = self.counts[stream] = torch.full((self.h,), self.nb, dtype=_I32, device=self.device)
        return counts

    def _launch(self, x, sx, y, sy, d) -> None:
        px, psx, py, psy, pd = x.data_ptr(), sx.data_ptr(), y.data_ptr(), sy.data_ptr(), d.data_ptr()
        span_x, span_sx, span_y, span_sy, span_d = self.spans
        hi = pd + span_d
        if ((px | py | pd) & 15 or (pd < px + span_x and px < hi) or (pd < psx + span_sx and psx < hi)
                or (pd < py + span_y and py < hi) or (pd < psy + span_sy and psy < hi)
                or target.current_device() != self.index):
            self.op(x, sx, y, sy, d)
            return
        if self.convert:
            sa = self._scales(sx)
            psa = sa.data_ptr()
        else:  # sx read where it lies (K-, G- or M-major)
            sa, psa = sx, psx
        if psa & 15:  # sx read in place at an address the map cannot take: the op copies it
            self.op(x, sx, y, sy, d)
            return
        index, gemm = self.index, self.gemm
        stream = target.current_stream(index)
        counts = self._masked_m(target.is_capturing(index), stream)
        block = gemm.blocks.get((px, psa, py, pd, psy, counts.data_ptr(), 0))
        if block is None:  # the GEMM plan's own pointer checks, maps and block, on the views
            gemm(x.permute(1, 0, 2), sa.permute(1, 0, 2), y, sy, d.permute(1, 0, 2), counts)
        elif gemm.workspace is None:  # the masked kind: no split-K workspace, launched on the stream at hand
            gemm.launcher.launch(block, stream)
        else:
            gemm.launch(block)


def fp8_entry(check: Callable, op: Callable, other: Callable, recipe: tuple):
    """The eager entry of ``fp8_einsum``: ``entry(expr, a, b, d, c, recipe)`` (the public arguments) runs the call
    through its plan, or ``other(...)`` (the op's full path, same arguments) while torch.compile traces, a dispatch
    mode is active, for an expression / recipe / ``c`` the plan does not take, or arguments that are not pairs of
    plain tensors. ``check(x, sx, y, sy, d)``: the op's checks of such a call (its errors, its order); ``op(x, sx, y,
    sy, d)``: the op's path for it (checks included).

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.index``: ``id(y)`` ->
    ``[(guard check, settings key, plan call)]``, newest first, at most ``MAX_GUARDS_PER_WEIGHT``. A guard never
    passes a tensor given twice (dynamo's duplicate-input rule): such a call is served through the signature dict."""
    plans: dict[tuple, Fp8EinsumPlan] = {}
    index: dict[int, list] = {}
    settings = PROCESS_SETTINGS

    def miss(key, x, sx, y, sy, d) -> None:
        tensors = (x, sx, y, sy, d)

        def make() -> Fp8EinsumPlan:
            check(x, sx, y, sy, d)
            return Fp8EinsumPlan(op, x, sx, y, sy, d)

        plan = plan_of(plans, signature(tensors, key), make)
        g = guard(*tensors)
        if g is not None:
            index_entry(index, y, (g.check, key, plan.call))
        plan.call(x, sx, y, sy, d)

    def entry(expr, a, b, d, c, rec) -> None:
        if c is not None or (rec is not recipe and (type(rec) is not tuple or rec != recipe)) or \
                type(expr) is not str or expr != "bhr,hdr->bhd" or \
                type(a) is not tuple or type(b) is not tuple or len(a) != 2 or len(b) != 2 or \
                _is_compiling() or _dispatch_depth():
            return other(expr, a, b, d, c, rec)
        x, sx = a
        y, sy = b
        key = settings.key  # interned: `is` compares it
        entries = index.get(id(y))
        if entries is not None:
            for hit, k, call in entries:
                if k is key and hit(x, sx, y, sy, d):
                    return call(x, sx, y, sy, d)
        if type(x) is not _Tensor or type(sx) is not _Tensor or type(y) is not _Tensor or \
                type(sy) is not _Tensor or type(d) is not _Tensor:
            return other(expr, a, b, d, c, rec)
        miss(key, x, sx, y, sy, d)

    def clear_plans() -> None:
        plans.clear()
        index.clear()

    entry.plans, entry.index, entry.clear_plans = plans, index, clear_plans
    entry.stats = lambda: (len(plans), sum(len(e) for e in index.values()))  # (plans, guards indexed)
    return entry
