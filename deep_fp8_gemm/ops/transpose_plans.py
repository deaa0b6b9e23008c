"""The cast-transposes' per-call fast path (issue 45): ``per_token_cast_to_fp8_and_transpose`` and
``transpose_cast_to_fp8_k_grouped`` through a plan per input signature, the design of the quantisers' plans
(``_core.plans.QuantPlan``: module docstring there, "Quantiser outputs").

A call's work that depends only on ``x``'s signature (shape, strides, dtype, device), ``use_ue8m0`` and, for the
k-grouped op, ``ks`` — the op's checks, the launch plan (``kernels.quant.plan_cast_transpose`` /
``plan_k_grouped_transpose``: the outputs' shapes and strides, the constant ``TransposeParams`` fields, the grid),
the loaded kernel, the group prefix on the device — is done once per signature. A call then allocates the
outputs (four new tensors, or two; each with its own storage, the documented shapes and strides, made by torch's
``_empty_strided_{cpu,cuda}``), writes ``x``'s and the outputs' pointers in front of the constants in the plan's
own parameter block and launches.

Not planned (the op's own path, every call): CPU / simulator backends (their ``fallback`` runs, as the op), an
``x`` whose last stride is not 1 (copied per call), an empty problem, a call from another thread than the one that
built the plan, a current device other than ``x``'s (the allocator's), a torch without the fast allocator.
``ks`` must be a ``list`` / ``tuple`` of Python ints equal to the plan's, compared per call with their types (the
op rejects ``bool`` and NumPy ints, which compare equal to ints).
"""

from __future__ import annotations

from threading import get_ident as _get_ident
from typing import Callable

import torch

from .._core.plans import ALLOCATORS, MAX_GUARDS_PER_WEIGHT, guard, plan_of, register_cache
from ..kernels import quant as quant_host
from ..runtime import params as param_structs
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS

_Tensor = torch.Tensor
_PARAMS_BYTES = quant_host.TRANSPOSE_PARAMS_BYTES
_INT_ONLY = frozenset((int,)).issuperset  # ``_INT_ONLY(map(type, ks))``: every entry exactly a Python int
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


class TransposePlan:
    """One checked signature of a cast-transpose op; ``plan.call(x)`` runs a call of that signature.

    ``make_launch_plan(x)``: the op's launch plan for ``x`` (``kernels.quant.plan_cast_transpose`` /
    ``plan_k_grouped_transpose`` with ``ue8m0`` and ``ks`` bound); ``fallback(x)``: the op's implementation (its
    backend policy, copies and launch), what every call runs where the plan is not fast."""

    __slots__ = ("call", "fallback", "launch_plan", "index", "thread", "block", "_launchers", "_pack", "_start")

    def __init__(self, x: torch.Tensor, make_launch_plan: Callable, fallback: Callable):
        self.fallback = self.call = fallback
        if target.backend_of(x.device, "quant") is not Backend.CUDA or x.stride(-1) != 1:
            return
        empty = ALLOCATORS.get(x.device.type)
        lp = self.launch_plan = make_launch_plan(x)
        if lp.empty or empty is None:
            return
        from ..runtime import driver

        self.index = target.gpu_index(x.device)
        self.thread = _get_ident()
        self._launchers: dict[bool, driver.PreparedLaunch] = {}
        # The constants once into the plan's own block; a call writes x's and the outputs' pointers (ascending
        # offsets; a gap in between, as the k-grouped op's output / scales, is written as zeros, their value).
        pointers = ("input", *lp.output_fields)
        offsets = param_structs.field_offsets(quant_host.TransposeParams)
        gaps = [name for name in lp.fields if offsets[pointers[0]][0] < offsets[name][0] < offsets[pointers[-1]][0]]
        assert all(lp.fields[name] == 0 for name in gaps), gaps
        self._pack, self._start = param_structs.FieldPacker(quant_host.TransposeParams, pointers).bound()
        names = tuple(name for name in offsets if name in lp.fields)
        self.block = driver.param_block(_PARAMS_BYTES)
        param_structs.FieldPacker(quant_host.TransposeParams, names).pack_into(
            self.block.view, *(lp.fields[name] for name in names))
        self.call = self._fast_call(empty)

    def _launcher(self, vectorized: bool):
        from ..runtime import driver

        config = self.launch_plan.kernel_config(vectorized)
        launcher = self._launchers[vectorized] = driver.PreparedLaunch(
            quant_host.cuda_kernel(config, self.index), _PARAMS_BYTES, grid=self.launch_plan.grid,
            block=config.num_threads, smem_bytes=config.smem_bytes, pdl=PROCESS_SETTINGS.pdl)
        return launcher

    def _fast_call(self, empty: Callable) -> Callable:
        """``self.call`` of a fast plan: the outputs made, the pointers packed, the launch (locals bound once)."""
        lp, index, thread, fallback = self.launch_plan, self.index, self.thread, self.fallback
        block, pack, start = self.block, self._pack, self._start
        view = block.view
        vectorizable = lp.vectorizable
        launchers = self._launchers
        current_device, current_stream = target.current_device, target.current_stream
        (s0, t0, d0), (s1, t1, d1) = lp.outputs[:2]

        if len(lp.outputs) == 2:
            def call(x: torch.Tensor) -> tuple:
                if current_device() != index or _get_ident() != thread:
                    return fallback(x)
                out, scales = empty(s0, t0, d0), empty(s1, t1, d1)
                px = x.data_ptr()
                vectorized = vectorizable and not px & 15
                launcher = launchers.get(vectorized) or self._launcher(vectorized)
                pack(view, start, px, out.data_ptr(), scales.data_ptr())
                launcher.launch(block, current_stream(index))
                return out, scales

            return call
        (s2, t2, d2), (s3, t3, d3) = lp.outputs[2:]

        def call4(x: torch.Tensor) -> tuple:
            if current_device() != index or _get_ident() != thread:
                return fallback(x)
            out, scales, out_t, scales_t = empty(s0, t0, d0), empty(s1, t1, d1), empty(s2, t2, d2), empty(s3, t3, d3)
            px = x.data_ptr()
            vectorized = vectorizable and not px & 15
            launcher = launchers.get(vectorized) or self._launcher(vectorized)
            pack(view, start, px, out.data_ptr(), scales.data_ptr(), out_t.data_ptr(), scales_t.data_ptr())
            launcher.launch(block, current_stream(index))
            return out, scales, out_t, scales_t

        return call4


# Every entry's signature dict and hot lists, for _core.plans.clear() / stats().
_plans: dict[tuple, TransposePlan] = {}
_hot: list[list] = []


def _push(entries: list, entry: tuple) -> None:
    entries.insert(0, entry)
    del entries[MAX_GUARDS_PER_WEIGHT:]


def cast_transpose_entry(check: Callable, impl: Callable) -> Callable:
    """The eager entry of ``per_token_cast_to_fp8_and_transpose``: ``entry(x, ue8m0)`` returns the four outputs,
    or None (nothing done: compiling, a dispatch mode, a tensor subclass). ``check(x)``: the op's check (a new
    signature); ``impl(x, ue8m0)``: its implementation (backend policy included)."""
    hot = ([], [])  # per ue8m0: [(guard.check, plan.call)], newest first

    def entry(x: torch.Tensor, ue8m0: bool):
        if _is_compiling() or _dispatch_depth() or type(x) is not _Tensor:
            return None
        for hit, call in hot[ue8m0]:
            if hit(x):
                return call(x)
        key = ("cast_transpose", ue8m0, x.shape, x.stride(), x.dtype, x.device)
        plan = plan_of(_plans, key, lambda: _cast_transpose_plan(x, check, ue8m0, impl))
        g = guard(x)
        if g is not None:
            _push(hot[ue8m0], (g.check, plan.call))
        return plan.call(x)

    _hot.extend(hot)
    return entry


def k_grouped_entry(check: Callable, impl: Callable) -> Callable:
    """The eager entry of ``transpose_cast_to_fp8_k_grouped``: ``entry(x, ks, ue8m0)`` returns ``(flat, sf)`` or
    None, as :func:`cast_transpose_entry`. ``check(x, ks)``: the op's checks (returns ``ks`` as a list);
    ``impl(x, ks, ue8m0)``: its implementation. A hot entry serves ``ks`` equal to its own, every entry a Python
    int (the op's rule: ``bool`` and NumPy ints compare equal but are refused)."""
    hot = ([], [])  # per ue8m0: [(guard.check, ks tuple, plan.call)], newest first

    def entry(x: torch.Tensor, ks, ue8m0: bool):
        if (_is_compiling() or _dispatch_depth() or type(x) is not _Tensor
                or (type(ks) is not list and type(ks) is not tuple) or not _INT_ONLY(map(type, ks))):
            return None
        ks_key = tuple(ks)
        for hit, planned, call in hot[ue8m0]:
            if planned == ks_key and hit(x):
                return call(x)
        key = ("k_grouped", ue8m0, ks_key, x.shape, x.stride(), x.dtype, x.device)
        plan = plan_of(_plans, key, lambda: _k_grouped_plan(x, check(x, ks), ue8m0, impl))
        g = guard(x)
        if g is not None:
            _push(hot[ue8m0], (g.check, ks_key, plan.call))
        return plan.call(x)

    _hot.extend(hot)
    return entry


def _cast_transpose_plan(x: torch.Tensor, check: Callable, ue8m0: bool, impl: Callable) -> TransposePlan:
    """The cast-transpose's plan for ``x``'s signature, after the op's check."""
    check(x)
    return TransposePlan(x, lambda v: quant_host.plan_cast_transpose(v, ue8m0), lambda v: impl(v, ue8m0))


def _k_grouped_plan(x: torch.Tensor, ks: list[int], ue8m0: bool, impl: Callable) -> TransposePlan:
    """The k-grouped op's plan for ``x``'s signature and the checked ``ks``."""
    return TransposePlan(x, lambda v: quant_host.plan_k_grouped_transpose(v, ks, ue8m0), lambda v: impl(v, ks, ue8m0))


def _clear() -> None:
    _plans.clear()
    for entries in _hot:
        entries.clear()


register_cache("transpose.", _clear, lambda: {"plans": (len(_plans), sum(len(h) for h in _hot))})
