"""The MXFP4 masked GEMM's per-call fast path (issue 45): ``m_grouped_gemm_fp8_fp4_bf16_nt_masked`` with prepared
weights (:class:`~deep_fp8_gemm.ops.mxfp4_format.PreparedMxfp4`), the design of ``_core.plans`` /
``ops.bf16_plans`` over the register-A kernel (``kernels.mxfp4_gemm``). ``ops.mxfp4`` builds the entry over its own
checks and path; this module knows nothing else of the op. (A checkpoint pair is prepared on every call: the op's
path, never a plan.)

DeepSeek-V4 runs its MXFP4 experts at decode once per layer per step, each layer with its own weights, so a call
looks up a plan by its *signature*: per tensor ``(shape, stride(), dtype, device)`` of ``(x, sa, d, masked_m,
tiles, meta, wave_per32)``, ``expected_m`` (a positive int: anything else takes the op's path, which refuses it) and
the process settings key (``utils.PROCESS_SETTINGS.key``: the SM count, PDL) — torch's C++ ``TensorGuards``
(:func:`~deep_fp8_gemm._core.plans.guard`) indexed by ``id(b)`` first, the signature tuple as fallback. A new
signature runs the op's full checks (its errors, its order); a known one only what depends on the data pointers.
"""

from __future__ import annotations

import ctypes
from threading import get_ident as _get_ident
from typing import Callable

import torch

from .._core.checks import byte_span, is_meta
from .._core.plans import (MAX_MAP_SETS, MAX_WORKSPACES, block_for, guard, index_entry, keep_block, plan_of,
                           register_cache, signature)
from ..kernels import mxfp4_gemm as kernels
from ..runtime import params as param_structs
from ..runtime import target
from ..runtime.target import Backend, layout_values_checked
from ..utils import PROCESS_SETTINGS, get_num_sms
from .mxfp4_format import PreparedMxfp4


class Mxfp4MaskedPlan:
    """One checked signature of the masked MXFP4 GEMM with prepared weights; ``plan.call(a, p, d, masked_m,
    expected_m)`` (``a`` = ``(x, sa)``) runs a call of that signature.

    Built by the entry (:func:`masked_entry`) after the op's own checks (``check``: its errors, its order). A plan is
    *fast* on an sm_90 GPU with a non-empty problem, contiguous ``x`` and ``d`` (else the op refuses them), every
    tensor on the GPU of ``x`` (else the op moves ``masked_m``) and ``DFG_CHECK_LAYOUTS`` off when the plan is made
    (else the op reads ``masked_m``'s values); then a call, unless a CUDA graph is being captured (the op's path: its
    scale columns are the capture's own memory):

    * the pointers of ``x``, ``tiles`` and ``meta`` 16-byte aligned (TMA) and ``d``'s bytes apart from every
      input's (integer compares against the signature's byte spans: ``sa`` per call, the rest when a pointer tuple's
      block is made); else the op's path, which raises its message;
    * ``sa`` read where it lies when it has the kernel's M-major TMA-aligned layout already (DeepEP's dispatch,
      ``get_col_major_tma_aligned_tensor``: :func:`kernels.mxfp4_gemm.scales_layout_in_place`; ``_launch_in_place``,
      also under capture), unless its address is off 16 bytes (the op's path: it copies);
      else copied into the kernel's column layout (``kernels.mxfp4_gemm.column_buffer``: one torch op, on every
      call) in a buffer the plan keeps per (stream, thread) — launches on one stream read it in stream order, and
      two threads never share one (at most :data:`~deep_fp8_gemm._core.plans.MAX_WORKSPACES`, then dropped: the
      caching allocator reuses a freed buffer only in its stream's order);
    * the parameter block of its pointers (``x``, ``d``, ``masked_m``, the three prepared tensors, the buffer): the
      four maps cached per (x, tiles, meta, buffer), the rest packed by name (``Mxfp4Params``); from the second call
      with the same pointers a block of their own (never written again: any thread may launch from it), before that
      the thread's slot (all 576 bytes written);
    * the launch on the current stream through :meth:`PreparedLaunch.launch
      <deep_fp8_gemm.runtime.driver.PreparedLaunch.launch>` (on the null stream the kernel's context must be current).

    Any other plan (CPU: the reference or the simulator, the counts checked; meta; empty) calls the op's own path:
    nothing cached reaches a CPU result.
    """

    __slots__ = ("op", "call", "index", "config", "launcher", "tail", "shape", "buffers", "heads", "blocks", "seen",
                 "in_place", "spans")

    def __init__(self, check: Callable, op: Callable, x, sa, p: PreparedMxfp4, d, masked_m, expected_m: int):
        check((x, sa), p, d, masked_m, expected_m)
        self.op = self.call = op
        g, n, k = p.shape
        m_max = x.shape[1]
        tensors = (x, sa, d, masked_m, p.tiles, p.meta, p.wave_per32)
        if g == 0 or m_max == 0 or is_meta(x) or target.gpu_index(x.device) is None:
            return
        if any(t.device != x.device for t in tensors) or not (x.is_contiguous() and d.is_contiguous()):
            return  # the op moves masked_m, or refuses x / d with its message
        if target.backend_of(x.device, "gemm") is not Backend.CUDA:  # RuntimeError off sm_90, as the op
            return
        if layout_values_checked(masked_m.device):  # DFG_CHECK_LAYOUTS=1: the op reads the counts
            return
        from ..runtime import driver

        self.index = index = target.gpu_index(x.device)
        num_sms = get_num_sms()
        self.config = cfg = kernels.pick_config(n, k, g, expected_m, num_sms)
        self.launcher = driver.PreparedLaunch(kernels.cuda_kernel(cfg, index), _PARAMS_BYTES,
                                              grid=kernels.grid_size(cfg, g, m_max, num_sms),
                                              block=cfg.num_threads, smem_bytes=cfg.smem_bytes,
                                              pdl=PROCESS_SETTINGS.pdl)
        # Everything after the maps (the three pointers zero: packed per block; no sD), from the one definition.
        self.tail = param_structs.pack(kernels.Mxfp4Params, num_rows=m_max)[_MAPS_BYTES:]
        self.shape = (g, m_max, k // kernels.BLOCK_K, x.device)
        self.buffers: dict[tuple[int, int], tuple] = {}  # (stream, thread) -> (columns, sa's view of them, pointer)
        self.heads: dict[tuple[int, int, int, int], bytes] = {}  # four maps per (x, tiles, meta, columns)
        self.blocks: dict[tuple, object] = {}  # whole blocks per (x, d, masked_m, tiles, meta, wave, columns)
        self.seen: dict[tuple, None] = {}  # pointer tuples met once
        # sa in the kernel's layout already (DeepEP's): its own pointer in the map, no buffer, no copy
        self.in_place = kernels.scales_layout_in_place(sa)
        # Byte spans of x, sa, masked_m, the three prepared tensors and d (a function of the signature): a d whose
        # bytes meet any input's takes the op's path, which refuses it (ops.mxfp4.check_outputs_apart).
        self.spans = tuple(byte_span(t) for t in (x, sa, masked_m, p.tiles, p.meta, p.wave_per32, d))
        self.call = self._launch_in_place if self.in_place else self._launch

    def _launch(self, a, p, d, masked_m, expected_m) -> None:
        index = self.index
        if target.is_capturing(index):  # the op's column scales: memory the capture owns, not the plan's buffer
            self.op(a, p, d, masked_m, expected_m)
            return
        x, sa = a
        stream = target.current_stream(index)
        columns = self.buffers.get((stream, _get_ident()))
        if columns is None:
            columns = self._columns(stream)
        tiles, meta = p.tiles, p.meta
        key = (x.data_ptr(), d.data_ptr(), masked_m.data_ptr(), tiles.data_ptr(), meta.data_ptr(),
               p.wave_per32.data_ptr(), columns[2])
        psa, pd = sa.data_ptr(), key[1]
        if pd < psa + self.spans[1] and psa < pd + self.spans[6]:  # sa is not in the key: checked per call
            self.op(a, p, d, masked_m, expected_m)
            return
        block = self.blocks.get(key)
        if block is None:
            if (key[0] | key[3] | key[4]) & 15 or self._overlapping(key, psa):  # the op's path raises its message
                self.op(a, p, d, masked_m, expected_m)
                return
            block = self._block(key, x, tiles, meta, columns[0])
        columns[1].copy_(sa)
        self.launcher.launch(block, stream)

    def _launch_in_place(self, a, p, d, masked_m, expected_m) -> None:
        """A call whose ``sa`` the kernel reads where it lies (:func:`kernels.mxfp4_gemm.scales_layout_in_place`):
        ``sa``'s pointer takes the buffer's place in the key and the map; nothing is copied, so a capture is served
        too."""
        x, sa = a
        tiles, meta = p.tiles, p.meta
        key = (x.data_ptr(), d.data_ptr(), masked_m.data_ptr(), tiles.data_ptr(), meta.data_ptr(),
               p.wave_per32.data_ptr(), sa.data_ptr())
        block = self.blocks.get(key)
        if block is None:
            psa = key[6]
            if (key[0] | key[3] | key[4] | psa) & 15 or self._overlapping(key, psa):  # the op's path: its message,
                self.op(a, p, d, masked_m, expected_m)  # or sa copied (misaligned)
                return
            block = self._block(key, x, tiles, meta, sa.transpose(1, 2))
        self.launcher.launch(block, target.current_stream(self.index))

    def _overlapping(self, key: tuple, psa: int) -> bool:
        """Whether d's bytes meet those of x, sa, masked_m or the prepared tensors at this key's pointers (the spans
        are the signature's; a block exists only for a key that passed)."""
        px, pd, pml, pt, pm, pw = key[:6]
        hi = pd + self.spans[6]
        return any(span and pd < ptr + span and ptr < hi
                   for ptr, span in zip((px, psa, pml, pt, pm, pw), self.spans[:6]))

    def _columns(self, stream: int) -> tuple:
        """This (stream, thread)'s column buffer, made on first use (never under capture: see _launch)."""
        if len(self.buffers) >= MAX_WORKSPACES:
            self.buffers.clear()
        out, rows = kernels.column_buffer(*self.shape)
        columns = self.buffers[(stream, _get_ident())] = (out, rows, out.data_ptr())
        return columns

    def _block(self, key: tuple, x, tiles, meta, columns):
        """The parameters of pointer tuple ``key`` (its second call: a block of its own, never written again; its
        first: this thread's slot, packed for this launch only)."""
        px, pd, pml, pt, pm, pw, pc = key
        head = self.heads.get((px, pt, pm, pc))
        if head is None:
            maps = kernels.encode_maps(kernels.map_args(self.config, x, tiles, meta, columns), Backend.CUDA)
            if len(self.heads) >= MAX_MAP_SETS:
                self.heads.clear()
            head = self.heads[(px, pt, pm, pc)] = b"".join(maps)
        block, keep = block_for(self.seen, key, _PARAMS_BYTES)
        view = block.view
        view[:_MAPS_BYTES] = head
        view[_MAPS_BYTES:_PARAMS_BYTES] = self.tail
        _pack(view, _POINTERS_START, pd, pml, pw)
        if keep:
            keep_block(self.blocks, key, block)
        return block


_PARAMS_BYTES, _MAPS_BYTES = ctypes.sizeof(kernels.Mxfp4Params), 4 * kernels.TENSOR_MAP_BYTES
# struct.pack_into and the offset of d (grouped_layout and wave_per32 follow): one C call per block.
_pack, _POINTERS_START = param_structs.FieldPacker(kernels.Mxfp4Params, ("d", "grouped_layout", "wave_per32")).bound()
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor types a plan serves (subclasses: the op's own path)
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


def masked_entry(check: Callable, op: Callable):
    """The eager entry of the masked MXFP4 GEMM with prepared weights: ``entry(a, p, d, masked_m, expected_m)`` (``p``
    a :class:`PreparedMxfp4`) runs the call through its plan, or through ``op`` (the op's own path, same arguments)
    while torch.compile traces, a dispatch mode is active, ``a`` is no pair, a tensor argument is no plain tensor (or
    Parameter) or ``expected_m`` no positive int (the op refuses it). ``check(a, p, d, masked_m, expected_m)``: the
    op's full checks (new signatures).

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.index``: ``id(p)`` ->
    ``[(guard check, settings key, expected_m, plan call)]``, newest first, at most ``MAX_GUARDS_PER_WEIGHT``
    (``id(p)`` only narrows the search: the guard checks every tensor, the prepared ones included). A guard never
    passes a tensor given twice (dynamo's duplicate-input rule): such a call is served through the signature dict."""
    plans: dict[tuple, Mxfp4MaskedPlan] = {}
    index: dict[int, list] = {}
    settings = PROCESS_SETTINGS

    def miss(key, a, tensors, p, expected_m) -> None:
        plan = plan_of(plans, signature(tensors, expected_m, key),
                       lambda: Mxfp4MaskedPlan(check, op, tensors[0], tensors[1], p, tensors[2], tensors[3], expected_m))
        g = guard(*tensors)
        if g is not None:
            index_entry(index, p, (g.check, key, expected_m, plan.call))
        plan.call(a, p, tensors[2], tensors[3], expected_m)

    def entry(a, p, d, masked_m, expected_m) -> None:
        if _is_compiling() or _dispatch_depth() or type(a) is not tuple or len(a) != 2 or \
                type(expected_m) is not int or expected_m <= 0:
            return op(a, p, d, masked_m, expected_m)
        x, sa = a
        tiles, meta, wave = p.tiles, p.meta, p.wave_per32
        key = settings.key  # interned: `is` compares it
        entries = index.get(id(p))
        if entries is not None:
            for hit, k, em, call in entries:
                if k is key and em == expected_m and hit(x, sa, d, masked_m, tiles, meta, wave):
                    return call(a, p, d, masked_m, expected_m)
        tensors = (x, sa, d, masked_m, tiles, meta, wave)
        for t in tensors:
            if type(t) not in _PLAIN:
                return op(a, p, d, masked_m, expected_m)
        miss(key, a, tensors, p, expected_m)

    def clear_plans() -> None:
        plans.clear()
        index.clear()

    entry.plans, entry.index = plans, index
    # _core.plans.clear() / stats() cover these plans too ("mxfp4.masked": (plans, weights indexed)).
    register_cache("mxfp4.", clear_plans, lambda: {"masked": (len(plans), len(index))})
    return entry
