"""``fp8_paged_mqa_logits``' per-call fast path (issue 45): the plan of one tensor signature and the eager entry
that finds it, the design of ``_core.plans`` / ``ops.bf16_plans`` over the indexer's paged kernel
(``kernels.mqa_logits``). ``attention`` builds the entry over its own checks, layout rule and path; this module
knows nothing else of the op.

The indexer runs once per layer per decode step with the same metadata (each layer its own cache), so a call looks
up a plan by its *signature*: per tensor ``(shape, stride(), dtype, device)`` of ``(q, kv_cache, weights,
context_lens, block_table, schedule_meta)``, the logits dtype and the process settings key
(``utils.PROCESS_SETTINGS.key``: ``schedule_meta`` must have ``get_num_sms() + 1`` rows; PDL) — torch's C++
``TensorGuards`` (:func:`~deep_fp8_gemm._core.plans.guard`) first, the signature tuple as fallback. A new signature runs
the op's full checks (its errors, its order). ``max_context_len`` is not part of it: the op checks only that it is an
int >= 0, so any such value takes the plan (the logits' row stride is computed from it per call, by the op's rule);
``clean_logits`` must be ``False`` (the op refuses anything else): every other scalar goes to the op's path, which
raises its usual message.

The dense ``fp8_mqa_logits`` (prefill) has the same design (:class:`DenseMqaPlan`, :func:`dense_entry`): its signature
adds ``clean_logits``, ``max_seqlen_k`` and the logits dtype (they decide the kernel and the logits' layout).
"""

from __future__ import annotations

from typing import Callable

import torch

from .._core.checks import is_meta
from .._core.plans import (ALLOCATORS, MAX_GUARDS_PER_WEIGHT, MAX_MAP_SETS, MAX_PLANS, block_for, guard, keep_block,
                           plan_of, register_cache, signature)
from ..kernels import mqa_logits as kernels
from ..runtime import params as param_structs
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS

_F32, _BF16 = torch.float32, torch.bfloat16
#: Parameter blocks a plan keeps: one per layer (its cache) and logits address, the pointers a decode step repeats.
MAX_BLOCKS = MAX_PLANS
_Tensor = torch.Tensor
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack
# torch's deterministic mode fills a new tensor's memory (NaN); the plan's allocator does not, and the paged kernel
# leaves entries unwritten, so in that mode the op's own path allocates.
_deterministic = torch._C._get_deterministic_algorithms
_fill_uninitialized = torch._C._get_deterministic_fill_uninitialized_memory
#: The per-call fields of ``MqaLogitsParams`` after the four maps, in offset order (ks, ke, seq_len_kv: dense only).
_PAGED_FIELDS = ("logits", "logits_stride", "ks", "ke", "context_lens", "block_table", "schedule", "num_rows",
                 "seq_len_kv", "logits_width", "block_table_stride")


class PagedMqaPlan:
    """One checked signature of ``fp8_paged_mqa_logits``; ``plan.call(q, kv_cache, weights, context_lens, block_table,
    schedule_meta, max_context_len)`` runs a call of that signature (``clean_logits=False``, the plan's dtype).

    Built by the entry (:func:`paged_entry`) on a new signature, after the op's own checks. A plan is *fast* on an
    sm_90 GPU with a non-empty batch (CPU: the reference; meta; empty: the op's path, every call); then a call:

    * ``q``, ``kv_cache`` and ``weights`` at 16-byte aligned addresses (else the op's path: it copies q / weights or
      refuses kv_cache with its message), ``max_context_len > 0``, the current device the tensors' (the allocator's),
      torch's deterministic memory fill off; else the op's path;
    * a fresh logits buffer ``[rows, row_stride]`` (the op's rule, cached per ``max_context_len``), viewed
      ``[:, :max_context_len]`` as the op returns it;
    * the thread's parameter slot (:func:`~deep_fp8_gemm.runtime.driver.param_slot`: the logits pointer is new on every
      call): the maps of (q, weights) cached per pointer pair, those of the cache per cache pointer (one per layer),
      the fields packed by name (``MqaLogitsParams``), the reserved tail zeroed;
    * the launch on the current stream (``PreparedLaunch.launch``: on the null stream the kernel's context must be
      current).

    Nothing else is allocated and nothing cached is memory a launch reads, so a launch captured into a CUDA graph
    points at the caller's tensors and the logits the graph's pool gave it only.
    """

    __slots__ = ("op", "call", "dtype", "batch", "rows", "index", "launcher", "strides", "layout", "qw_maps", "kv_maps",
                 "config", "blocks", "seen", "_empty")

    def __init__(self, check: Callable, op: Callable, layout: Callable, tensors: tuple, max_context_len: int,
                 logits_dtype: torch.dtype):
        q = tensors[0]
        batch, next_n, num_heads, head_dim = check(*tensors, max_context_len, False, logits_dtype)
        self.op, self.dtype = op, logits_dtype
        self.call = self._op_path
        if batch == 0 or is_meta(q) or target.gpu_index(q.device) is None:
            return
        if target.backend_of(q.device, "attention") is not Backend.CUDA:  # RuntimeError off sm_90, as the op
            return
        empty = ALLOCATORS.get(q.device.type)
        if empty is None:
            return
        from ..runtime import driver

        self.index = index = target.gpu_index(q.device)
        self.batch, self.rows, self.layout, self._empty = batch, batch * next_n, layout, empty
        self.config = cfg = kernels.paged_config(num_heads, head_dim, next_n, logits_dtype)
        self.launcher = driver.PreparedLaunch(kernels.cuda_kernel(cfg, index), kernels.PARAMS_BYTES,
                                              grid=tensors[5].shape[0] - 1, block=kernels.NUM_THREADS,
                                              smem_bytes=cfg.smem_bytes, pdl=PROCESS_SETTINGS.pdl)
        self.strides: dict[int, int] = {}  # max_context_len -> the logits' row stride (the op's layout rule)
        self.qw_maps: dict[tuple[int, int], bytes] = {}  # encoded (tma_q, tma_weights) per (q, weights) pointers
        self.kv_maps: dict[int, bytes] = {}  # encoded (tma_kv, tma_kv_scales) per cache pointer (one per layer)
        # Whole parameter blocks per pointer tuple (q, kv_cache, weights, context_lens, block_table, schedule_meta,
        # logits, max_context_len), and the tuples met once (a block is built on the second call with a tuple).
        self.blocks: dict[tuple, object] = {}
        self.seen: dict[tuple, None] = {}
        self.call = self._launch

    def _op_path(self, q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len):
        return self.op(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, False,
                       self.dtype)

    def _launch(self, q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len):
        pq, pkv, pw = q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr()
        index = self.index
        if (pq | pkv | pw) & 15 or max_context_len == 0 or target.current_device() != index or (
                _deterministic() and _fill_uninitialized()):
            return self._op_path(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len)
        stride = self.strides.get(max_context_len)
        if stride is None:
            stride = self._stride(max_context_len)
        logits = self._empty((self.rows, stride), (stride, 1), self.dtype)
        key = (pq, pkv, pw, context_lens.data_ptr(), block_table.data_ptr(), schedule_meta.data_ptr(),
               logits.data_ptr(), max_context_len)
        slot = self.blocks.get(key)
        if slot is None:
            slot = self._block(key, q, kv_cache, weights, block_table, stride)
        if max_context_len != stride:
            logits = logits[:, :max_context_len]
        self.launcher.launch(slot, target.current_stream(index))
        return logits

    def _stride(self, max_context_len: int) -> int:
        if len(self.strides) >= MAX_PLANS:
            self.strides.clear()
        stride = self.strides[max_context_len] = self.layout(self.rows, max_context_len, self.dtype)[1]
        return stride

    def _block(self, key: tuple, q, kv_cache, weights, block_table, stride: int):
        """The parameters of pointer tuple ``key`` (its second call: a block of its own, never written again, which
        any thread may launch from; its first: this thread's slot, packed for this launch only)."""
        pq, pkv, pw, pcl, pbt, psm, plogits, max_context_len = key
        qw = self.qw_maps.get((pq, pw))
        kv = self.kv_maps.get(pkv)
        if qw is None or kv is None:
            qw, kv = self._encode(q, kv_cache, weights, pq, pkv, pw)
        block, keep = block_for(self.seen, key, _PARAMS_BYTES, MAX_BLOCKS)
        view = block.view
        view[:_HALF_MAPS] = qw
        view[_HALF_MAPS:_MAPS_BYTES] = kv
        _pack(view, _FIELDS_START, plogits, stride, 0, 0, pcl, pbt, psm, self.batch, 0, max_context_len,
              block_table.stride(0))
        view[_FIELDS_END:_PARAMS_BYTES] = _RESERVED
        if keep:
            keep_block(self.blocks, key, block, MAX_BLOCKS)
        return block

    def _encode(self, q, kv_cache, weights, pq: int, pkv: int, pw: int) -> tuple[bytes, bytes]:
        maps = kernels.encode_maps(kernels.paged_map_args(self.config, q, kv_cache, weights), Backend.CUDA)
        if len(self.qw_maps) >= MAX_MAP_SETS:
            self.qw_maps.clear()
        if len(self.kv_maps) >= MAX_PLANS:
            self.kv_maps.clear()
        qw = self.qw_maps[(pq, pw)] = maps[0] + maps[1]
        kv = self.kv_maps[pkv] = maps[2] + maps[3]
        return qw, kv


_PACKER = param_structs.FieldPacker(kernels.MqaLogitsParams, _PAGED_FIELDS)
_pack, _FIELDS_START = _PACKER.bound()  # struct.pack_into and the first field's offset: one C call per launch
_FIELDS_END, _PARAMS_BYTES, _MAPS_BYTES = _FIELDS_START + _PACKER.size, kernels.PARAMS_BYTES, 4 * kernels.TENSOR_MAP_BYTES
_HALF_MAPS = _MAPS_BYTES // 2  # (tma_q, tma_weights) | (tma_kv, tma_kv_scales)
_RESERVED = bytes(_PARAMS_BYTES - _FIELDS_END)


def paged_entry(check: Callable, op: Callable, layout: Callable, other: Callable):
    """The eager entry of ``fp8_paged_mqa_logits``: ``entry(q, kv_cache, weights, context_lens, block_table,
    schedule_meta, max_context_len, clean_logits, logits_dtype)`` returns the logits through the call's plan, or
    ``other(...)`` (the public function's general path, same arguments) for scalars the plan does not take or a
    tensor argument that is no plain tensor (a subclass, a Parameter, not a tensor), and while torch.compile traces or
    a dispatch mode is active; ``op(...)`` is the op's own eager path (what a plan that does not launch itself calls).
    A guard passes only tensors of the exact type it was built with (plain ones), so a hit needs no type check.
    ``check(...)``: the op's checks (same arguments), returning ``(batch, next_n, num_heads, head_dim)``;
    ``layout(rows, max_context_len, logits_dtype) -> (rows, row_stride)``.

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.hot``: ``[(guard check,
    settings key, logits dtype, plan call)]``, newest first, at most ``MAX_GUARDS_PER_WEIGHT`` (no weight to index
    by: every layer's call has the same signature). A guard never passes a tensor given twice (dynamo's duplicate-input
    rule): such a call is served through the signature dict."""
    plans: dict[tuple, PagedMqaPlan] = {}
    hot: list[tuple] = []
    settings = PROCESS_SETTINGS

    def miss(key, tensors, max_context_len, logits_dtype):
        plan = plan_of(plans, signature(tensors, logits_dtype, key),
                       lambda: PagedMqaPlan(check, op, layout, tensors, max_context_len, logits_dtype))
        g = guard(*tensors)
        if g is not None:
            hot.insert(0, (g.check, key, logits_dtype, plan.call))
            del hot[MAX_GUARDS_PER_WEIGHT:]
        return plan.call(*tensors, max_context_len)

    def entry(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits,
              logits_dtype):
        if clean_logits is not False or type(max_context_len) is not int or max_context_len < 0 or (
                logits_dtype is not _F32 and logits_dtype is not _BF16) or _is_compiling() or _dispatch_depth():
            return other(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits, logits_dtype)
        key = settings.key  # interned: `is` compares it
        for hit, k, dtype, call in hot:
            if k is key and dtype is logits_dtype and hit(q, kv_cache, weights, context_lens, block_table,
                                                          schedule_meta):
                return call(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len)
        tensors = (q, kv_cache, weights, context_lens, block_table, schedule_meta)
        for t in tensors:
            if type(t) is not _Tensor:
                return other(*tensors, max_context_len, clean_logits, logits_dtype)
        return miss(key, tensors, max_context_len, logits_dtype)

    def clear_plans() -> None:
        plans.clear()
        hot.clear()

    entry.plans, entry.hot = plans, hot
    # _core.plans.clear() / stats() cover these plans too ("attention.paged_mqa_logits": (plans, hot guards)).
    register_cache("attention.", clear_plans, lambda: {"paged_mqa_logits": (len(plans), len(hot))})
    return entry


# ---------------------------------------------------------------------------------------------- dense (prefill)
# The [:seq_len, :width] of a fresh buffer: inductor's reinterpret_tensor (an alias with these sizes and strides at
# offset 0, the buffer's storage; ~1.4 µs here against ~3.2 µs for buffer[:seq_len, :width], which makes the same
# metadata through the dispatcher but records the buffer as its view base). Private API: slicing where it is missing.
try:
    from torch._C._dynamo.guards import _reinterpret_tensor as _alias
except ImportError:  # pragma: no cover - present in the supported torch (2.13)
    def _alias(buffer: torch.Tensor, sizes: tuple[int, int], strides: tuple[int, int], offset: int) -> torch.Tensor:
        return buffer[:sizes[0], :sizes[1]]


class DenseMqaPlan:
    """One checked signature of ``fp8_mqa_logits`` (tensors, ``clean_logits``, ``max_seqlen_k``, logits dtype);
    ``plan.call(q, kv, kv_scales, weights, ks, ke)`` runs a call of that signature.

    Built by :func:`dense_entry` after the op's own checks. A plan is *fast* on an sm_90 GPU with a non-empty problem
    (both ``seq_len`` and ``seq_len_kv``) and weights whose row stride the map takes (CPU: the reference; meta; empty:
    the op's path, every call); then a call, as :class:`PagedMqaPlan`'s:

    * ``q``, ``kv``, ``kv_scales``, ``weights`` at 16-byte aligned addresses (else the op's path: it copies them), the
      current device the tensors' (the allocator's), torch's deterministic memory fill off; else the op's path;
    * a fresh logits buffer ``[rows, row_stride]`` (the op's layout, cached in the plan) viewed ``[:seq_len, :width]``;
    * the parameters: a block of their own per pointer tuple from its second call (the logits address included, which
      the allocator repeats), else the thread's slot; the four maps cached per (q, weights, kv, kv_scales) pointers;
    * the launch on the current stream.

    Nothing else is allocated and nothing cached is memory a launch reads (the logits are the caller's)."""

    __slots__ = ("op", "call", "scalars", "dtype", "index", "launcher", "config", "buffer", "width", "view", "fields",
                 "maps", "blocks", "seen", "_empty")

    def __init__(self, check: Callable, op: Callable, layout: Callable, tensors: tuple, clean_logits: bool,
                 max_seqlen_k: int, logits_dtype: torch.dtype):
        q, weights = tensors[0], tensors[3]
        seq_len, seq_len_kv, num_heads, head_dim = check(*tensors, clean_logits, max_seqlen_k, logits_dtype)
        self.op, self.call = op, self._op_path
        self.scalars = (clean_logits, max_seqlen_k, logits_dtype)
        if seq_len == 0 or seq_len_kv == 0 or is_meta(q) or target.gpu_index(q.device) is None:
            return
        if target.backend_of(q.device, "attention") is not Backend.CUDA:  # RuntimeError off sm_90, as the op
            return
        empty = ALLOCATORS.get(q.device.type)
        if empty is None or (weights.stride(0) * 4) % 16 or weights.stride(0) < weights.shape[1]:
            return  # the op copies the weights on every call
        from ..runtime import driver
        from ..utils import get_num_sms

        self.index = index = target.gpu_index(q.device)
        self.dtype, self._empty = logits_dtype, empty
        self.buffer, self.width = layout(seq_len, seq_len_kv, num_heads, max_seqlen_k, logits_dtype)
        rows, stride = self.buffer
        # What the op returns of the buffer: the whole buffer, or its [:seq_len, :width] at offset 0.
        self.view = None if (rows, stride) == (seq_len, self.width) else ((seq_len, self.width), (stride, 1))
        self.config = cfg = kernels.dense_config(num_heads, head_dim, logits_dtype, clean_logits, max_seqlen_k > 0)
        self.launcher = driver.PreparedLaunch(kernels.cuda_kernel(cfg, index), kernels.PARAMS_BYTES,
                                              grid=min(get_num_sms(), -(-seq_len // cfg.queries)),
                                              block=kernels.NUM_THREADS, smem_bytes=cfg.smem_bytes,
                                              pdl=PROCESS_SETTINGS.pdl)
        self.fields = (stride, seq_len, seq_len_kv, self.width)  # logits_stride, num_rows, seq_len_kv, logits_width
        self.maps: dict[tuple[int, int, int, int], bytes] = {}  # the four maps per (q, weights, kv, kv_scales)
        self.blocks: dict[tuple, object] = {}  # whole blocks per (q, kv, kv_scales, weights, ks, ke, logits)
        self.seen: dict[tuple, None] = {}
        self.call = self._launch

    def _op_path(self, q, kv, kv_scales, weights, ks, ke):
        return self.op(q, kv, kv_scales, weights, ks, ke, *self.scalars)

    def _launch(self, q, kv, kv_scales, weights, ks, ke):
        pq, pkv, pks, pw = q.data_ptr(), kv.data_ptr(), kv_scales.data_ptr(), weights.data_ptr()
        index = self.index
        if (pq | pkv | pks | pw) & 15 or target.current_device() != index or (
                _deterministic() and _fill_uninitialized()):
            return self.op(q, kv, kv_scales, weights, ks, ke, *self.scalars)
        buffer = self._empty(self.buffer, (self.buffer[1], 1), self.dtype)
        key = (pq, pkv, pks, pw, ks.data_ptr(), ke.data_ptr(), buffer.data_ptr())
        slot = self.blocks.get(key)
        if slot is None:
            slot = self._block(key, q, kv, kv_scales, weights)
        view = self.view
        logits = buffer if view is None else _alias(buffer, view[0], view[1], 0)
        self.launcher.launch(slot, target.current_stream(index))
        return logits

    def _block(self, key: tuple, q, kv, kv_scales, weights):
        """The parameters of pointer tuple ``key`` (its second call: a block of its own, never written again; its
        first: this thread's slot, packed for this launch only)."""
        pq, pkv, pks, pw, pks_start, pke, plogits = key
        maps = self.maps.get((pq, pw, pkv, pks))
        if maps is None:
            if len(self.maps) >= MAX_MAP_SETS:
                self.maps.clear()
            maps = self.maps[(pq, pw, pkv, pks)] = b"".join(kernels.encode_maps(
                kernels.dense_map_args(self.config, q, kv, kv_scales, weights), Backend.CUDA))
        block, keep = block_for(self.seen, key, _PARAMS_BYTES, MAX_BLOCKS)
        view = block.view
        view[:_MAPS_BYTES] = maps
        stride, rows, seq_len_kv, width = self.fields
        _pack(view, _FIELDS_START, plogits, stride, pks_start, pke, 0, 0, 0, rows, seq_len_kv, width, 0)
        view[_FIELDS_END:_PARAMS_BYTES] = _RESERVED
        if keep:
            keep_block(self.blocks, key, block, MAX_BLOCKS)
        return block


def dense_entry(check: Callable, op: Callable, layout: Callable, other: Callable):
    """The eager entry of ``fp8_mqa_logits``: ``entry(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k,
    logits_dtype)`` (the pair ``kv`` unpacked) returns the logits through the call's plan, or ``other(...)`` (the
    public function's general path, same arguments) while torch.compile traces, a dispatch mode is active, for scalars
    the plan does not take or a tensor argument that is no plain tensor; ``op(...)``: the op's own eager path;
    ``check(...)``: the op's checks, returning ``(seq_len, seq_len_kv, num_heads, head_dim)``; ``layout(seq_len,
    seq_len_kv, num_heads, max_seqlen_k, logits_dtype) -> ((rows, row_stride), width)``.

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.hot``: ``[(guard check,
    settings key, scalars, plan call)]``, newest first, at most ``MAX_GUARDS_PER_WEIGHT``, as
    :func:`paged_entry`'s."""
    plans: dict[tuple, DenseMqaPlan] = {}
    hot: list[tuple] = []
    settings = PROCESS_SETTINGS

    def miss(key, tensors, scalars):
        plan = plan_of(plans, signature(tensors, *scalars, key), lambda: DenseMqaPlan(check, op, layout, tensors, *scalars))
        g = guard(*tensors)
        if g is not None:
            hot.insert(0, (g.check, key, scalars, plan.call))
            del hot[MAX_GUARDS_PER_WEIGHT:]
        return plan.call(*tensors)

    def entry(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k, logits_dtype):
        if (clean_logits is not True and clean_logits is not False) or type(max_seqlen_k) is not int or \
                max_seqlen_k < 0 or (logits_dtype is not _F32 and logits_dtype is not _BF16) or \
                _is_compiling() or _dispatch_depth():
            return other(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k, logits_dtype)
        key = settings.key  # interned: `is` compares it
        for hit, k, (clean, max_k, dtype), call in hot:
            if k is key and clean is clean_logits and max_k == max_seqlen_k and dtype is logits_dtype and \
                    hit(q, kv, kv_scales, weights, ks, ke):
                return call(q, kv, kv_scales, weights, ks, ke)
        tensors = (q, kv, kv_scales, weights, ks, ke)
        for t in tensors:
            if type(t) is not _Tensor:
                return other(*tensors, clean_logits, max_seqlen_k, logits_dtype)
        return miss(key, tensors, (clean_logits, max_seqlen_k, logits_dtype))

    def clear_plans() -> None:
        plans.clear()
        hot.clear()

    entry.plans, entry.hot = plans, hot
    # _core.plans.clear() / stats() cover these plans too ("attention.dense.mqa_logits": (plans, hot guards)).
    register_cache("attention.dense.", clear_plans, lambda: {"mqa_logits": (len(plans), len(hot))})
    return entry
