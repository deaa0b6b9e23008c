"""``tf32_hc_prenorm_gemm``'s per-call fast path (issue 45): the plan of one tensor signature and the eager entry that
finds it, the design of ``_core.plans`` / ``ops.bf16_plans`` over the TF32 kernel (``kernels.hc_prenorm``).
``ops.hc_prenorm`` builds the entry over its own checks and path; this module knows nothing else of the op.

DeepSeek-V4 calls the mHC pre-norm GEMM twice per layer per decode step, each layer with its own ``b`` (``[n, k]``
fp32), so a call looks up a plan by its *signature*: per tensor ``(shape, stride(), dtype, device)`` of ``(a, b, d,
sqr_sum)``, ``num_splits`` (None or an int; anything else takes the op's path, which refuses it) and the process
settings key (``utils.PROCESS_SETTINGS.key``: PDL) — torch's C++ ``TensorGuards``
(:func:`~deep_fp8_gemm._core.plans.guard`) indexed by ``id(b)`` first, the signature tuple as fallback. A new
signature runs the op's full checks (its errors, its order); a known one only what depends on the data pointers.
"""

from __future__ import annotations

import ctypes
from typing import Callable

import torch

from .._core.checks import byte_span, is_meta
from .._core.plans import (MAX_MAP_SETS, block_for, guard, index_entry, keep_block, plan_of, register_cache,
                           signature)
from ..kernels import bf16_gemm
from ..kernels import hc_prenorm as kernels
from ..runtime import params as param_structs
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS
from .bf16_plans import tma_strides_ok


class HcPrenormPlan:
    """One checked signature of ``tf32_hc_prenorm_gemm``; ``plan.call(a, b, d, sqr_sum, num_splits)`` runs a call of
    that signature.

    Built by the entry (:func:`hc_prenorm_entry`) after the op's own checks (``check``: its errors, its order). A plan
    is *fast* on an sm_90 GPU with ``m > 0``, a contiguous ``d`` and ``a`` / ``b`` strides a TMA map can read (else
    the op copies on every call: its path); then a call:

    * its four data pointers name a parameter block that passed the pointer checks: launch from it (a block is never
      written once built, so any thread may launch from it);
    * else the pointer checks, integer compares against the cached byte spans: ``a`` and ``b`` 16-byte aligned (else
      ``tma_view`` copies), ``d`` overlapping none of ``a``, ``b``, ``sqr_sum`` and ``sqr_sum`` neither of ``a``,
      ``b``; on any possible miss the op's own path runs (it raises its message, or copies and launches). Passed: the
      maps of ``(a, b)`` cached per pointer pair, the constant fields packed once (``HcPrenormParams`` by name), the
      two output pointers; from the second call with the same pointers a block of their own (at most
      :data:`~deep_fp8_gemm._core.plans.MAX_MAP_SETS` per plan), before that the thread's slot (all 320 bytes
      written);
    * the launch on the current stream through :meth:`PreparedLaunch.launch
      <deep_fp8_gemm.runtime.driver.PreparedLaunch.launch>` (on the null stream the kernel's context must be current).

    Any other plan (CPU: the reference or the simulator; meta; ``m == 0``; an operand copied on every call) calls the
    op's own path: nothing cached reaches a CPU result. The kernel has no workspace and the fast path allocates
    nothing, so a launch captured into a CUDA graph points at the caller's tensors only.
    """

    __slots__ = ("op", "call", "spans", "index", "config", "launcher", "tail", "heads", "blocks", "seen")

    def __init__(self, check: Callable, op: Callable, a, b, d, sqr_sum, num_splits):
        m, n, k, splits = check(a, b, d, sqr_sum, num_splits)
        self.op = self.call = op
        if m == 0 or is_meta(d) or target.gpu_index(d.device) is None:
            return
        if target.backend_of(d.device, "gemm") is not Backend.CUDA:  # RuntimeError off sm_90, as the op
            return
        if not (d.is_contiguous() and tma_strides_ok(a) and tma_strides_ok(b)):
            return  # the op copies an operand or d on every call
        from ..runtime import driver

        self.index = index = target.gpu_index(d.device)
        self.spans = (byte_span(a), byte_span(b), byte_span(d), byte_span(sqr_sum))
        self.config = cfg = kernels.pick_config(n)
        self.launcher = driver.PreparedLaunch(kernels.cuda_kernel(cfg, index), _PARAMS_BYTES,
                                              grid=-(-m // kernels.BLOCK_M) * splits, block=kernels.NUM_THREADS,
                                              smem_bytes=cfg.smem_bytes(), pdl=PROCESS_SETTINGS.pdl)
        # Everything after the maps (the two pointers zero: packed per call), from the one struct definition.
        self.tail = param_structs.pack(kernels.HcPrenormParams, m=m, n=n, k=k, num_splits=splits)[_MAPS_BYTES:]
        self.heads: dict[tuple[int, int], bytes] = {}  # encoded (tma_a, tma_b) per (pa, pb)
        self.blocks: dict[tuple[int, int, int, int], object] = {}  # whole blocks per (pa, pb, pd, ps)
        self.seen: dict[tuple[int, int, int, int], None] = {}  # pointer tuples met once
        self.call = self._launch

    def _launch(self, a, b, d, sqr_sum, num_splits) -> None:
        key = (a.data_ptr(), b.data_ptr(), d.data_ptr(), sqr_sum.data_ptr())
        block = self.blocks.get(key)
        if block is None:
            block = self._checked_block(a, b, d, sqr_sum, num_splits, key)
            if block is None:  # the op's own path ran (or raised)
                return
        self.launcher.launch(block, target.current_stream(self.index))

    def _checked_block(self, a, b, d, sqr_sum, num_splits, key: tuple):
        """Pointers without a block: their checks, then the block (built if new); None when the op's path ran."""
        pa, pb, pd, ps = key
        span_a, span_b, span_d, span_s = self.spans
        hi_d, hi_s = pd + span_d, ps + span_s
        if ((pa | pb) & 15 or (pd < pa + span_a and pa < hi_d) or (pd < pb + span_b and pb < hi_d)
                or (pd < hi_s and ps < hi_d) or (ps < pa + span_a and pa < hi_s) or (ps < pb + span_b and pb < hi_s)):
            self.op(a, b, d, sqr_sum, num_splits)
            return None
        head = self.heads.get(key[:2])
        if head is None:
            maps = bf16_gemm.encode_maps(kernels.map_args(self.config, a, b), Backend.CUDA)
            if len(self.heads) >= MAX_MAP_SETS:
                self.heads.clear()
            head = self.heads[key[:2]] = maps[0] + maps[1]
        block, keep = block_for(self.seen, key, _PARAMS_BYTES)
        view = block.view
        view[:_MAPS_BYTES] = head
        view[_MAPS_BYTES:_PARAMS_BYTES] = self.tail
        _pack(view, _POINTERS_START, pd, ps)
        if keep:
            keep_block(self.blocks, key, block)
        return block


_PARAMS_BYTES, _MAPS_BYTES = ctypes.sizeof(kernels.HcPrenormParams), 2 * kernels.TENSOR_MAP_BYTES  # (tma_a, tma_b)
# struct.pack_into and the offset of d (sqr_sum follows): one C call writes a block's two pointers.
_pack, _POINTERS_START = param_structs.FieldPacker(kernels.HcPrenormParams, ("d", "sqr_sum")).bound()
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor types a plan serves (subclasses: the op's own path)
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


def hc_prenorm_entry(check: Callable, op: Callable):
    """The eager entry of ``tf32_hc_prenorm_gemm``: ``entry(a, b, d, sqr_sum, num_splits)`` runs the call through its
    plan, or through ``op`` (the op's own path, same arguments) while torch.compile traces, a dispatch mode is active,
    a tensor argument is no plain tensor (or Parameter) or ``num_splits`` is neither None nor an int (the op refuses
    it). ``check(a, b, d, sqr_sum, num_splits) -> (m, n, k, splits)``: the op's full checks (new signatures).

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.index``: ``id(b)`` ->
    ``[(guard check, settings key, num_splits, plan call)]``, newest first, at most ``MAX_GUARDS_PER_WEIGHT``
    (``id(b)`` only narrows the search: the guard checks every tensor, ``b`` included). A guard never passes a tensor
    given twice (dynamo's duplicate-input rule): such a call is served through the signature dict."""
    plans: dict[tuple, HcPrenormPlan] = {}
    index: dict[int, list] = {}
    settings = PROCESS_SETTINGS

    def miss(key, a, b, d, sqr_sum, num_splits) -> None:
        tensors = (a, b, d, sqr_sum)
        plan = plan_of(plans, signature(tensors, num_splits, key),
                       lambda: HcPrenormPlan(check, op, a, b, d, sqr_sum, num_splits))
        g = guard(*tensors)
        if g is not None:
            index_entry(index, b, (g.check, key, num_splits, plan.call))
        plan.call(a, b, d, sqr_sum, num_splits)

    def entry(a, b, d, sqr_sum, num_splits) -> None:
        if _is_compiling() or _dispatch_depth() or type(a) not in _PLAIN or type(b) not in _PLAIN or \
                type(d) not in _PLAIN or type(sqr_sum) not in _PLAIN or \
                (num_splits is not None and type(num_splits) is not int):
            return op(a, b, d, sqr_sum, num_splits)
        key = settings.key  # interned: `is` compares it
        entries = index.get(id(b))
        if entries is not None:
            for hit, k, splits, call in entries:
                if k is key and splits == num_splits and hit(a, b, d, sqr_sum):
                    return call(a, b, d, sqr_sum, num_splits)
        miss(key, a, b, d, sqr_sum, num_splits)

    def clear_plans() -> None:
        plans.clear()
        index.clear()

    entry.plans, entry.index = plans, index
    # _core.plans.clear() / stats() cover these plans too ("hc_prenorm.tf32": (plans, weights indexed)).
    register_cache("hc_prenorm.", clear_plans, lambda: {"tf32": (len(plans), len(index))})
    return entry
