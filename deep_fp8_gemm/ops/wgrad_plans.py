"""The 1D1D weight-gradient GEMM's per-call fast path (issue 45): the plan of one tensor signature of
``gemm_fp8_fp8_fp32_nt_1d1d`` and the eager entry that finds it, the design of ``_core.plans`` and ``ops.bf16_plans``
over the fp32-accumulating kernel (kind ``"1d1d"`` of ``kernels.gemm``). :mod:`.wgrad_1d1d` builds the entry over its
own checks and path; this module knows nothing of the family's rules beyond what the plan caches.

Everything a call checks and computes before its launch, except the data pointers, is a function of its *signature*:
per tensor ``(shape, stride(), dtype, device)`` of ``(a, sa, b, sb, d)`` and ``c`` (None, a tensor, or ``d`` itself)
plus the process settings key (``utils.PROCESS_SETTINGS.key``). A new signature runs the op's full checks (its
errors, its order); a known one only what depends on the pointers. A call is ``(a, sa, b, sb, d, c)``, the public
function's pairs unpacked.
"""

from __future__ import annotations

import torch

from .._core.checks import byte_span, is_meta
from .._core.plans import MAX_MAP_SETS, block_for, guard, index_entry, keep_block, plan_of, signature
from ..kernels import gemm as kernels
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS, get_num_sms, m_major_strides

_MAPS_BYTES, _PARAMS_BYTES = kernels.MAPS_BYTES, kernels.PARAMS_BYTES
_POINTERS = kernels.params_packer(("d_f32", "c_f32"))  # what a block holds besides the maps and the plan's tail


class Wgrad1d1dPlan:
    """One checked signature of ``gemm_fp8_fp8_fp32_nt_1d1d``; ``plan.call(a, sa, b, sb, d, c)`` runs a call of it.

    Built by the entry (:func:`plan_entry`) on a new signature, after the op's checks. A plan is *fast* when the call
    launches the kernel on an sm_90 GPU with every operand read in place: a non-empty problem, sA and sB already in
    the M-major TMA-aligned layout (``utils.m_major_strides``; else the op converts them on every call) and, when
    ``c`` is another tensor, a ``c`` the op takes as given (not one it turns into ``d`` because it aliases it: that
    plan runs the op's path). Then a call:

    * its six data pointers (a, sa, b, sb, d, c; ``c`` None counts as ``d``) name a parameter block that passed the
      pointer checks: launch from it (a block is never written once built, so any thread may launch from it);
    * else the pointer checks with integer compares against the cached byte spans: 16-byte aligned A, B, d (the
      op's rule) and sA, sB (else the op copies them), ``d`` overlapping none of A, sA, B, sB, and ``c`` either at
      ``d``'s address with ``d``'s strides (in place: what the op makes of it) or 16-byte aligned and not overlapping
      ``d``. On any possible miss the op's own path runs (it raises the usual message, or copies and launches).
      Passed: the four maps (A, B, sA, sB) cached per pointer tuple, the constant fields (rows, row strides) and
      ``d`` / ``c`` packed by name into ``GemmParams``; from the second call with the same pointers a block of their
      own (at most :data:`~deep_fp8_gemm._core.plans.MAX_MAP_SETS` per plan), before that the thread's slot.
    * ``c`` None: ``d`` is zeroed on the current stream before the launch, as by the op (the kernel reads C = d).

    Any other plan (CPU: the reference or the simulator; meta; empty; scales to convert) calls the op's own path:
    nothing cached reaches a CPU result. The fast path allocates nothing and the kernel has no workspace: a launch
    captured into a CUDA graph points at the caller's tensors only.
    """

    __slots__ = ("op", "call", "spans", "c_given", "in_place", "index", "cfg", "launcher", "tail", "heads", "blocks",
                 "seen")

    def __init__(self, op, configure, a, sa, b, sb, d, c, empty: bool, c_as_given: bool):
        """``op(a, sa, b, sb, d, c)``: the op's own path; ``configure(m, n, k, num_sms)``: its config rule;
        ``empty``: the checked problem's; ``c_as_given``: the op took ``c`` as given (False: it aliases ``d`` and the
        op made it ``d``)."""
        self.op = self.call = op
        if empty or not c_as_given or is_meta(d) or target.gpu_index(d.device) is None:
            return
        target.backend_of(d.device, "gemm")  # a GPU: sm_90 (CUDA) or the op's RuntimeError
        if sa.stride() != m_major_strides(tuple(sa.shape)) or sb.stride() != m_major_strides(tuple(sb.shape)):
            return  # converted on every call: the op's path
        from ..runtime import driver

        self.index = index = target.gpu_index(d.device)
        self.c_given = c is not None
        # Byte spans of a, sa, b, sb, d, c (0 for no c); in place: c at d's address is d (the op's accumulates_in_place).
        self.spans = (byte_span(a), byte_span(sa), byte_span(b), byte_span(sb), byte_span(d),
                      0 if c is None else byte_span(c))
        self.in_place = c is not None and c.stride() == d.stride()
        m, k = a.shape
        self.cfg = cfg = configure(m, b.shape[0], k, get_num_sms())
        self.launcher = driver.PreparedLaunch(kernels.cuda_kernel(cfg, index), _PARAMS_BYTES,
                                              grid=cfg.grid_size, block=cfg.num_threads, cluster=cfg.cluster_size,
                                              smem_bytes=cfg.smem_bytes, pdl=PROCESS_SETTINGS.pdl)
        # The tail after the maps, d and c at 0: the rows and both row strides, the other fields zero.
        self.tail = kernels.pack_params([bytes(128)] * 4, rows=m, ld_d=d.stride(-2),
                                        ld_c=d.stride(-2) if c is None else c.stride(-2))[_MAPS_BYTES:]
        self.heads: dict[tuple[int, int, int, int], bytes] = {}  # encoded maps per (pa, psa, pb, psb)
        self.blocks: dict[tuple[int, ...], object] = {}  # whole blocks per (pa, psa, pb, psb, pd, pc)
        self.seen: dict[tuple[int, ...], None] = {}  # pointer tuples met once
        self.call = self._launch

    def _launch(self, a, sa, b, sb, d, c) -> None:
        pd = d.data_ptr()
        block = self.blocks.get((a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), pd,
                                 pd if c is None else c.data_ptr()))
        if block is None:
            block = self._checked_block(a, sa, b, sb, d, c)
            if block is None:  # the op's own path ran (or raised)
                return
        if c is None:  # D = 0 + A·Bᵀ: the kernel reads C = d (the op's accumulator())
            d.zero_()
        self.launcher.launch(block, target.current_stream(self.index))

    def _checked_block(self, a, sa, b, sb, d, c):
        """Pointers without a block: their checks, then the block (built if new); None when the op's path ran."""
        pa, psa, pb, psb, pd = a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), d.data_ptr()
        pc = pd if c is None else c.data_ptr()
        span_a, span_sa, span_b, span_sb, span_d, span_c = self.spans
        hi = pd + span_d
        if ((pa | psa | pb | psb | pd) & 15 or (pd < pa + span_a and pa < hi) or (pd < psa + span_sa and psa < hi)
                or (pd < pb + span_b and pb < hi) or (pd < psb + span_sb and psb < hi)
                or (self.c_given and (not self.in_place if pc == pd else
                                      pc & 15 or (pd < pc + span_c and pc < hi)))):
            self.op(a, sa, b, sb, d, c)
            return None
        key = (pa, psa, pb, psb, pd, pc)
        head = self.heads.get(key[:4])
        if head is None:
            maps = kernels.encode_maps(kernels.tensor_map_args_1d1d(self.cfg, a, sa, b, sb), Backend.CUDA)
            if len(self.heads) >= MAX_MAP_SETS:
                self.heads.clear()
            head = self.heads[key[:4]] = b"".join(maps)
        block, keep = block_for(self.seen, key, _PARAMS_BYTES)
        view = block.view
        view[:_MAPS_BYTES] = head
        view[_MAPS_BYTES:_PARAMS_BYTES] = self.tail
        _POINTERS.pack_into(view, pd, pc)
        if keep:
            keep_block(self.blocks, key, block)
        return block


_Tensor = torch.Tensor
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


def plan_entry(make, op):
    """The eager entry of ``gemm_fp8_fp8_fp32_nt_1d1d``: ``entry(a, sa, b, sb, d, c)`` runs the call through its
    plan, or through ``op`` (the op's own path, same arguments) while torch.compile traces, a dispatch mode is
    active, or a tensor argument is no plain tensor (the op's ``eager`` rule: those run its custom op).
    ``make(a, sa, b, sb, d, c) -> Wgrad1d1dPlan`` checks a new signature.

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.indexes``, one per ``c``
    absent / given / ``d`` itself: ``id(b)`` -> ``[(guard check, settings key, plan call)]``, newest first, at most
    ``MAX_GUARDS_PER_WEIGHT`` (``ops.bf16_plans.plan_entry``'s index with the scale tensors in the guard). A guard
    never passes a tensor given twice (dynamo's duplicate-input rule), so ``c=d`` is guarded on
    ``(a, sa, b, sb, d)``. ``entry.hit(a, sa, b, sb, d, c) -> bool``: the index lookup alone (no plan built, no check
    run on a miss), for wrappers whose own argument rules are functions of the signature (``compat``'s
    ``fp8_gemm_nt(..., recipe=(1, 1, 128))``, see ``_core.plans.cached_call``)."""
    plans: dict[tuple, Wgrad1d1dPlan] = {}
    indexes: tuple[dict, dict, dict] = ({}, {}, {})
    settings = PROCESS_SETTINGS

    def miss(key, a, sa, b, sb, d, c) -> None:
        tensors = (a, sa, b, sb, d) if c is None else (a, sa, b, sb, d, c)
        plan = plan_of(plans, signature(tensors, key), lambda: make(a, sa, b, sb, d, c))
        which = 0 if c is None else (2 if c is d else 1)
        g = guard(*tensors[:5 if which != 1 else 6])
        if g is not None:
            index_entry(indexes[which], b, (g.check, key, plan.call))
        plan.call(a, sa, b, sb, d, c)

    def lookup(a, sa, b, sb, d, c):
        """The plan call of a known signature, or None (plain tensors ``a, sa, b, sb, d``)."""
        key = settings.key  # interned: `is` compares it
        if c is None or c is d:
            entries = indexes[0 if c is None else 2].get(id(b))
            if entries is not None:
                for check, k, call in entries:
                    if k is key and check(a, sa, b, sb, d):
                        return call
        elif type(c) is _Tensor:
            entries = indexes[1].get(id(b))
            if entries is not None:
                for check, k, call in entries:
                    if k is key and check(a, sa, b, sb, d, c):
                        return call
        return None

    def entry(a, sa, b, sb, d, c) -> None:
        if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                type(b) is not _Tensor or type(sb) is not _Tensor or type(d) is not _Tensor or \
                (c is not None and type(c) is not _Tensor):
            return op(a, sa, b, sb, d, c)
        call = lookup(a, sa, b, sb, d, c)
        if call is None:
            miss(settings.key, a, sa, b, sb, d, c)
        else:
            call(a, sa, b, sb, d, c)

    def hit(a, sa, b, sb, d, c) -> bool:
        if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                type(b) is not _Tensor or type(sb) is not _Tensor or type(d) is not _Tensor:
            return False
        call = lookup(a, sa, b, sb, d, c)
        if call is None:
            return False
        call(a, sa, b, sb, d, c)
        return True

    entry.plans, entry.indexes, entry.hit = plans, indexes, hit
    return entry
