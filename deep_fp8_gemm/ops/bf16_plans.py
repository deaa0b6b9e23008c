"""The BF16 names' per-call fast path (issue 45): the plan of one tensor signature and the eager entry that finds it,
the FP8 families' design (``_core.plans``) over the BF16 kernel (``kernels.bf16_gemm``). ``ops.bf16`` builds one entry
per name over the name's own checks and path; this module knows nothing of the names.

Everything an eager call checks and computes before its launch, except the data pointers, is a function of its
*signature*: per tensor ``(shape, stride(), dtype, device)`` plus the process settings key
(``utils.PROCESS_SETTINGS.key``: the :func:`~deep_fp8_gemm.set_num_sms` override, the PDL flag, ...). So a call looks
up a plan (torch's C++ ``TensorGuards`` through :func:`~deep_fp8_gemm._core.plans.guard`, indexed by ``id(b)``; the
signature tuple as fallback): a new signature runs the name's full checks (its errors, its order), a known one only
what depends on the pointers. A call is ``(a, b, d, x, expected_m)``: ``x`` is the dense names' ``c`` (None or a
tensor) or the grouped names' layout (``grouped_layout`` / ``masked_m``); ``expected_m`` the masked name's (a positive
int: the name refuses anything else first), None for the others.
"""

from __future__ import annotations

import torch

from .. import env
from .._core.checks import byte_span, is_meta
from .._core.plans import MAX_MAP_SETS, block_for, guard, index_entry, keep_block, plan_of, signature
from ..runtime import params as param_structs
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS, get_num_sms


def tma_strides_ok(t: torch.Tensor) -> bool:
    """A TMA map can describe ``t``'s strides: K- or MN-major (one unit stride in the last two dims), every other
    stride of a dim with more than one element a positive 16-byte multiple. (The address is the other rule.)"""
    size = t.element_size()
    inner = -1 if t.stride(-1) == 1 else (-2 if t.dim() >= 2 and t.stride(-2) == 1 else None)
    if inner is None:
        return False
    others = [s for i, s in enumerate(t.stride()) if i != t.dim() + inner and t.shape[i] > 1]
    return all(s > 0 and (s * size) % 16 == 0 for s in others)


def major_of(t: torch.Tensor) -> str:
    """``"k"`` when the last (K) dim has unit stride, else ``"mn"`` (MN-major: the row dim has unit stride)."""
    return "k" if t.stride(-1) == 1 else "mn"


class Bf16Plan:
    """One checked signature of a BF16 name; ``plan.call(a, b, d, x, expected_m)`` runs a call of that signature.

    Built by the name's entry (:func:`plan_entry`) on a new signature, after the name's own checks (its errors,
    its order). A plan is *fast* when the call launches the kernel on an sm_90 GPU with A and B read in place
    (non-empty problem, strides a TMA map can describe; grouped: ``DFG_CHECK_LAYOUTS`` off when the plan is made,
    as for ``_core.plans``); then a call:

    * its four data pointers (a, b, d, x; an absent ``c``'s 0) name a parameter block that passed the pointer checks:
      launch from it (a block is never written once built, so any thread may launch from it);
    * else the pointer checks with integer compares against the cached byte spans: 16-byte aligned A and B (else
      ``tma_view`` would copy), ``d`` overlapping neither, ``c`` (dense) either at ``d``'s address with ``d``'s
      strides (in place) or not overlapping it. On any possible miss the name's own path runs (it raises the usual
      message, or copies the misaligned operand and launches). Passed: the maps of (A, B) cached per pointer pair,
      the constant tail packed once per plan (``Bf16GemmParams`` by name), ``d`` and ``c`` / the layout packed by
      name; from the second call with the same pointers a block of their own (at most
      :data:`~deep_fp8_gemm._core.plans.MAX_MAP_SETS` per plan), before that the thread's slot.

    Any other plan (CPU: the reference or the simulator, with the layout values checked; meta; empty or ``k == 0``;
    an operand that must be copied on every call; the layout-check debug mode on a GPU) calls the name's own path:
    nothing cached reaches a CPU result. The fast path allocates nothing and the kernel has no workspace (K is never
    split): a launch captured into a CUDA graph points at the caller's tensors only.
    """

    __slots__ = ("op", "call", "views", "x_is_c", "spans", "in_place", "index", "cfg", "launcher", "tail", "pointers",
                 "heads", "blocks", "seen")

    def __init__(self, op, views, form_name: str, A, B, d, x, x_is_c: bool, m: int, n: int, k: int, batches: int):
        """``op(a, b, d, x, expected_m)``: the name's own path; ``views(a, b) -> (A, B)``: the kernel's views (``A``,
        ``B`` those of the checked call); ``form_name``: a ``Bf16Form`` member's name; the problem's sizes."""
        self.op = self.call = op
        if m == 0 or n == 0 or k == 0 or is_meta(d) or target.gpu_index(d.device) is None:
            return
        target.backend_of(d.device, "gemm")  # a GPU: sm_90 (CUDA) or the name's RuntimeError
        if not (tma_strides_ok(A) and tma_strides_ok(B)) or (not x_is_c and env.check_layouts()):
            return  # copied on every call, or the layout's values checked: the name's path
        from ..kernels import bf16_gemm as kernels  # the JIT layer loads on first kernel use
        from ..runtime import driver

        self.views, self.x_is_c = views, x_is_c
        self.index = index = target.gpu_index(d.device)
        c = x if x_is_c else None
        # Byte spans of a, b, d, c (the views A, B start where a, b do); 0 for no c.
        self.spans = (byte_span(A), byte_span(B), byte_span(d), 0 if c is None else byte_span(c))
        self.in_place = c is not None and c.stride() == d.stride()  # c may then be d itself
        num_sms = get_num_sms()
        self.cfg = cfg = kernels.pick_config(kernels.Bf16Form[form_name], m, n, k, batches, major_of(A), major_of(B),
                                             d.dtype, c is not None, num_sms)
        self.launcher = driver.PreparedLaunch(kernels.cuda_kernel(cfg, index), kernels.PARAMS_BYTES,
                                              grid=kernels.grid_size(cfg, m, n, batches, num_sms),
                                              block=cfg.num_threads, smem_bytes=cfg.smem_bytes(),
                                              pdl=PROCESS_SETTINGS.pdl)
        # Everything after the maps but the three pointers, packed once from the one struct definition.
        self.tail = param_structs.pack(kernels.Bf16GemmParams, **kernels.scalar_fields(d, c, m, n, k, batches)
                                       )[kernels.MAPS_BYTES:]
        self.pointers = kernels.params_packer(("d", "c", "grouped_layout"))
        self.heads: dict[tuple[int, int], bytes] = {}  # encoded (tma_a, tma_b) per (pa, pb)
        self.blocks: dict[tuple[int, int, int, int], object] = {}  # whole blocks per (pa, pb, pd, px)
        self.seen: dict[tuple[int, int, int, int], None] = {}  # pointer tuples met once
        self.call = self._launch

    def _launch(self, a, b, d, x, expected_m) -> None:
        pa, pb, pd = a.data_ptr(), b.data_ptr(), d.data_ptr()
        px = 0 if x is None else x.data_ptr()
        block = self.blocks.get((pa, pb, pd, px))
        if block is None:
            block = self._checked_block(a, b, d, x, expected_m, pa, pb, pd, px)
            if block is None:  # the name's own path ran (or raised)
                return
        self.launcher.launch(block, target.current_stream(self.index))

    def _checked_block(self, a, b, d, x, expected_m, pa: int, pb: int, pd: int, px: int):
        """Pointers without a block: their checks, then the block (built if new); None when the name's path ran."""
        span_a, span_b, span_d, span_c = self.spans
        hi = pd + span_d
        if ((pa | pb) & 15 or (pd < pa + span_a and pa < hi) or (pd < pb + span_b and pb < hi)
                or (span_c and (not self.in_place if px == pd else pd < px + span_c and px < hi))):
            self.op(a, b, d, x, expected_m)
            return None
        from ..kernels import bf16_gemm as kernels

        key = (pa, pb, pd, px)
        head = self.heads.get(key[:2])
        if head is None:
            maps = kernels.encode_maps(kernels.operand_maps(self.cfg, *self.views(a, b)), Backend.CUDA)
            if len(self.heads) >= MAX_MAP_SETS:
                self.heads.clear()
            head = self.heads[key[:2]] = b"".join(maps)
        block, keep = block_for(self.seen, key, kernels.PARAMS_BYTES)
        view = block.view
        view[:kernels.MAPS_BYTES] = head
        view[kernels.MAPS_BYTES:kernels.PARAMS_BYTES] = self.tail
        if self.x_is_c:
            self.pointers.pack_into(view, pd, px, 0)
        else:
            self.pointers.pack_into(view, pd, 0, px)
        if keep:
            keep_block(self.blocks, key, block)
        return block


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor types a plan serves (subclasses: the name's own path)
# As in _core.plans: dynamo folds this to True while it traces; a dispatch mode (FakeTensorMode, ...) is active.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


def plan_entry(make, op):
    """The eager entry of a BF16 name: ``entry(a, b, d, x, expected_m)`` runs the call through its plan, or through
    ``op`` (the name's own path, same arguments) while torch.compile traces, a dispatch mode is active, or a tensor
    argument is no plain tensor (or Parameter). ``make(a, b, d, x) -> Bf16Plan`` checks a new signature.

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.indexes``, one per ``x``
    absent / given / ``d`` itself: ``id(b)`` -> ``[(guard check, settings key, plan call)]``, newest first, at most
    ``MAX_GUARDS_PER_WEIGHT`` (a guard is torch's C++ tensor-metadata check, :func:`~deep_fp8_gemm._core.plans.guard`;
    ``id(b)`` only narrows the search: the guard checks every tensor, ``b`` included). A guard never passes a tensor
    given twice (dynamo's duplicate-input rule), so ``c=d`` (in place) is guarded on ``(a, b, d)``: ``c`` is ``d``,
    metadata included."""
    plans: dict[tuple, Bf16Plan] = {}
    indexes: tuple[dict, dict, dict] = ({}, {}, {})
    settings = PROCESS_SETTINGS

    def miss(key, a, b, d, x, expected_m) -> None:
        tensors = (a, b, d) if x is None else (a, b, d, x)
        plan = plan_of(plans, signature(tensors, key), lambda: make(a, b, d, x))
        which = 0 if x is None else (2 if x is d else 1)
        g = guard(*tensors[:3 if which != 1 else 4])
        if g is not None:
            index_entry(indexes[which], b, (g.check, key, plan.call))
        plan.call(a, b, d, x, expected_m)

    def entry(a, b, d, x, expected_m) -> None:
        if _is_compiling() or _dispatch_depth() or type(a) not in _PLAIN or type(b) not in _PLAIN or \
                type(d) not in _PLAIN:
            return op(a, b, d, x, expected_m)
        key = settings.key  # interned: `is` compares it
        if x is None or x is d:
            entries = indexes[0 if x is None else 2].get(id(b))
            if entries is not None:
                for check, k, call in entries:
                    if k is key and check(a, b, d):
                        return call(a, b, d, x, expected_m)
        elif type(x) not in _PLAIN:
            return op(a, b, d, x, expected_m)
        else:
            entries = indexes[1].get(id(b))
            if entries is not None:
                for check, k, call in entries:
                    if k is key and check(a, b, d, x):
                        return call(a, b, d, x, expected_m)
        miss(key, a, b, d, x, expected_m)

    entry.plans, entry.indexes = plans, indexes
    return entry
