"""The eager ops' per-call host path: checks cached per tensor signature, launches prepared once.

A decode GEMM runs for 3-25 µs on the GPU, so the Python in front of its launch must cost about one launch.
Everything the ops check and compute before a launch, except the data pointers, is a function of the
arguments' *signature*: per tensor ``(shape, stride(), dtype, device)``, plus ``expected_m`` and the process
settings (``utils.PROCESS_SETTINGS.key``: the :func:`~deep_fp8_gemm.set_num_sms` override, the contiguous
alignment, the PDL flag). So an eager call
looks up a **plan** for its signature: first among the plans last used with the same weight (``id(B)``;
``id(x)``-free for the quantisers), each guarded by torch's C++ tensor-metadata check (``TensorGuards``, dynamo's
own: sizes, strides, dtype, device, plus dispatch keys and requires_grad, which can only cause a miss), else in
a dict keyed by the Python signature tuple (~4x dearer to build and compare):

* new signature: the family's full checks run (the op's own ``check``: same errors, same messages, same
  order), and the plan records their outcome: the problem is empty or not, the GPU ordinal
  (``runtime.target``), whether sA already has the M-major TMA-aligned layout and sB / the grouped layout are
  contiguous (else the op's conversions run on every call), the byte span of every tensor (for the overlap
  check), and for a GPU: the family's config (its ``plan``), the loaded kernel and a
  :class:`~deep_fp8_gemm.runtime.driver.PreparedLaunch`.
* known signature: only what depends on the data pointers runs: 16-byte alignment of A, B and out, out
  overlapping no input (integer compares against the cached spans; on a hit of either the family's full
  pointer check runs and raises its usual message), sA's alignment, the tensor maps, the parameter bytes, the
  launch. The grouped layouts' values (m_indices, psum ends, masked counts) are not metadata: on a CPU they are
  checked on every call (as by the op: the family's ``values_check``), on a GPU never read unless
  ``DFG_CHECK_LAYOUTS=1`` was set when the plan was made (then on every call but under graph capture: a sync).

A changed shape, stride, dtype or device is a different signature, so it misses and is checked in full; a
changed pointer is checked on every call.

Parameters are packed by field name (``kernels.gemm.GemmParams`` / ``kernels.quant.QuantParams`` through
``runtime.params.FieldPacker``), the same layouts the general path fills, never a second hand-written copy.

Tensor maps: a ``CUtensorMap`` is opaque (the driver API documents no field offsets, so its global address
cannot be patched on the host), so a GEMM plan caches the four encoded maps under their four data pointers, and,
from the second call with the same six pointers (those and sB's and the grouped layout's), its whole parameter block
— maps and tail — under those (:data:`MAX_MAP_SETS` tuples per plan each, then cleared), on top of the driver's LRU
keyed by the full encode arguments (weights always hit there). The allocator hands a decode loop the same addresses,
so a steady state never encodes nor packs: a call looks its block up and launches from it (a block is never written
once built, so any thread may launch from it; split-K copies it into the thread's slot and adds its stream's
workspace); a pointer tuple met once (say, a grouped layout allocated anew at each step) packs the thread's slot
from the cached maps instead, as every call did before.

Quantiser outputs: every call returns two new tensors, each with its own storage of exactly its size (offset 0,
the documented shapes and strides). The common call (:meth:`QuantPlan._fast_call`, one Python frame) makes them
with torch's ``_empty_strided_{cpu,cuda}(sizes, strides, dtype)`` (inductor's allocator: no argument parser, no
dispatcher; ~0.65 µs a tensor instead of ~1.3 µs), on the current device, which it checks is the input's; the
general path uses ``new_empty_strided`` of a 0-element prototype of the output's dtype and device kept by the
plan. Carving both from one buffer was measured and costs more (two view ops, ~1.8 µs each here), and would let a
``resize_`` of one tensor grow over the other. The plan's constant kernel parameters are packed once into its
own parameter block; a call from the thread that built the plan writes only the three pointers there, any
other thread packs all of them into its own slot. On the null stream the kernel's context must be current: the
driver is asked on every call (``cuCtxGetCurrent``; the ``CUcontext`` objects compare by handle) — no cache can
see another library's ``cuCtxSetCurrent`` / push, so nothing is cached.

:func:`prepare_gemm` exposes a plan as an object for callers that want to skip even the signature lookup:
it checks the example tensors once, and each call trusts that the tensors have the example's metadata
(their pointers are still checked).
"""

from __future__ import annotations

from threading import get_ident as _get_ident
from typing import Callable

import torch

from .. import env
from ..kernels import gemm as gemm_host
from ..kernels import quant as quant_host
from ..kernels import split_k
from ..runtime import target
from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS, get_num_sms, m_major_strides
from .checks import byte_span, capturing as _capturing, check_expected_m, is_meta
from .dispatch import normalise_scales, operands
from .family import GemmFamily

_Tensor = torch.Tensor
#: Plans per op and weights per index; cleared when full (a model has a handful of signatures per op).
MAX_PLANS = 1024
#: Encoded tensor-map sets (one per pointer tuple) cached per plan.
MAX_MAP_SETS = 64
#: Split-K workspaces (one per stream) a plan holds.
MAX_WORKSPACES = 64
#: Signatures (typically row counts) remembered per weight in the guard index.
MAX_GUARDS_PER_WEIGHT = 8
_MAPS_BYTES = gemm_host.MAPS_BYTES
_GEMM_PARAMS_BYTES = gemm_host.PARAMS_BYTES
# struct.pack_into and the offset of the bf16 kinds' tail / the quantisers' three pointers, bound once: the hot
# path packs them with one C call, no Python frame of FieldPacker's.
_pack_tail, _TAIL_START = gemm_host.params_packer(gemm_host.TAIL_1D2D).bound()
_pack_workspace, _WORKSPACE_START = gemm_host.params_packer(("split_counters", "split_partials")).bound()
_QUANT_POINTERS = quant_host.params_packer(quant_host.POINTER_FIELDS)
_param_slot = None  # driver.param_slot, bound when the first GPU plan is built (no CUDA import before)
try:  # torch's C++ tensor-metadata check (dynamo's own); None: the signature dicts alone serve (tests set it so)
    from torch._C._dynamo.guards import TensorGuards as TENSOR_GUARDS
except ImportError:  # pragma: no cover - every torch this package supports has it
    TENSOR_GUARDS = None
# torch's low-overhead allocators (what inductor's generated code calls): ``(sizes, strides, dtype)`` ->
# ``at::detail::empty_strided_{cpu,cuda}`` without the Python argument parser or the dispatcher, ~0.65 µs per
# tensor less than ``new_empty_strided`` here. The CUDA one allocates on the *current* device (checked per
# call). Private API: where it is missing a plan allocates with new_empty_strided.
try:
    from torch._C._dynamo.guards import _empty_strided_cpu as _empty_cpu, _empty_strided_cuda as _empty_cuda
except ImportError:  # pragma: no cover - present in the supported torch (2.13)
    _empty_cpu = _empty_cuda = None
ALLOCATORS = {"cpu": _empty_cpu, "cuda": _empty_cuda}  # device type -> fast allocator (None: not in this torch)
# Dynamo folds is_dynamo_compiling() to True while it traces (one frame, returns False: ~0.1 µs less per call
# than is_compiling(), which also reads torch.jit.is_scripting()). is_compiling() is also True for Python that runs,
# not traced, during a compile session or a non-strict export (AOTAutograd, make_fx): there the tensors are
# FakeTensors (type check) or a dispatch mode is active (_dispatch_depth), so the entries refuse them all the same.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack
_FP8, _F32, _BF16, _I32 = torch.float8_e4m3fn, torch.float32, torch.bfloat16, torch.int32


def _bind_driver() -> None:
    global _param_slot
    from ..runtime import driver

    _param_slot = driver.param_slot


def guard(*tensors):
    """A check that tensors have exactly these tensors' sizes, strides, dtype and device, in C++:
    ``torch._C._dynamo.guards.TensorGuards`` (dynamo's own, static dims), ~4x cheaper than building and
    comparing the Python signature tuple. It also compares dispatch keys and requires_grad, which can only
    turn a hit into a miss (then the signature dict serves the call). None when this torch lacks it."""
    if TENSOR_GUARDS is None:
        return None
    try:
        return TENSOR_GUARDS(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    except Exception:  # an API change in a future torch: the dict path alone stays correct
        return None


def _overlaps_or_misaligned(p: int, span: int, *others: tuple[int, int]) -> bool:
    """True when the 4-byte-aligned range ``[p, p + span)`` (sD: fp32 scales) might be misaligned or share a byte
    with any ``(pointer, span)`` of ``others`` (a zero pointer: an absent tensor)."""
    if p & 3:
        return True
    hi = p + span
    for q, q_span in others:
        if q and p < q + q_span and q < hi:
            return True
    return False


def block_for(seen: dict, key: tuple, size: int, limit: int = MAX_MAP_SETS) -> tuple[object, bool]:
    """The parameter block a plan packs for the pointer tuple ``key`` (a call whose tuple has no block yet), and
    whether to keep it: on the tuple's second call a block of its own (True: :func:`keep_block` it once packed; it is
    never written again, so any thread may launch from it); on its first this thread's slot (False: packed for this
    launch only, so a tensor allocated anew every step costs no block per call). ``seen``: the tuples met once
    (cleared at ``4 * limit``)."""
    from ..runtime import driver

    if key in seen:
        del seen[key]
        return driver.param_block(size), True
    if len(seen) >= 4 * limit:
        seen.clear()
    seen[key] = None
    return driver.param_slot(size), False


def keep_block(blocks: dict, key: tuple, block, limit: int = MAX_MAP_SETS) -> None:
    """Keep ``block`` (from :func:`block_for`, packed) as ``blocks[key]``; the dict cleared when it holds ``limit``."""
    if len(blocks) >= limit:
        blocks.clear()
    blocks[key] = block


def _remember(plans: dict, key: tuple, plan):
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


# The three steps of every plan family's miss (a call whose signature the guard index did not serve), one place.
def signature(tensors: tuple, *extra) -> tuple:
    """The Python signature of ``tensors`` (per tensor: shape, strides, dtype, device) followed by ``extra`` (the
    non-tensor part: expected_m, options, the settings key): the key of a family's plans dict."""
    return tuple(v for t in tensors for v in (t.shape, t.stride(), t.dtype, t.device)) + extra


def plan_of(plans: dict, key: tuple, make: Callable[[], object]):
    """``plans[key]``; made by ``make()`` (which runs the op's full checks) and remembered if absent, the dict
    cleared when it holds :data:`MAX_PLANS`."""
    plan = plans.get(key)
    return plan if plan is not None else _remember(plans, key, make())


def index_entry(index: dict, weight: object, entry: tuple) -> None:
    """Put ``entry`` (a guard check, the non-tensor signature, the plan) first among ``index[id(weight)]``'s: at most
    :data:`MAX_GUARDS_PER_WEIGHT` per weight, the index cleared when it holds :data:`MAX_PLANS` weights. ``id`` only
    narrows the search: a reused id is harmless, the guard checks every tensor."""
    entries = index.get(id(weight))
    if entries is None:
        if len(index) >= MAX_PLANS:
            index.clear()
        entries = index[id(weight)] = []
    entries.insert(0, entry)
    del entries[MAX_GUARDS_PER_WEIGHT:]


# ---------------------------------------------------------------------------------------------- GEMM plans
class GemmPlan:
    """The checked, prepared form of one signature of a 1D2D GEMM family of any output (bf16; FP8 and SwiGLU·FP8,
    whose output is the pair ``(D, sD)`` and whose option is ``use_ue8m0``; dense, contiguous, masked, psum; see the
    module docstring). Call it with tensors of that signature: ``plan(a, sa, b, sb, out, grouped_layout, sd)``
    (``grouped_layout`` None for dense; ``out`` = D and ``sd`` = sD for the FP8 outputs, ``sd`` None for bf16).

    ``sa_major`` (``GemmConfig.sa_major``; "k" / "g": fp8_einsum's plan, ``ops.einsum_plans``): sA is read in that
    layout where it lies, never converted; a call whose sA the kernel cannot read so (a misaligned address) is the
    caller's to route elsewhere (``ValueError`` here)."""

    __slots__ = ("family", "spec", "expected_m", "options", "empty", "index", "rows", "groups", "cfg", "launcher",
                 "blocks", "heads", "seen", "sa_ready", "sb_ready", "gl_ready", "ready", "spans", "ld_sd", "values_check",
                 "workspace", "device", "fast", "sa_major")

    def __init__(self, spec: GemmEntrySpec, a, sa, b, sb, out, gl, expected_m: int | None, sd=None,
                 options: tuple = (), sa_major: str = "m"):
        outs = (out,) if sd is None else (out, sd)
        problem = spec.check(a, sa, b, sb, *outs, gl, expected_m)
        self.family, self.spec, self.expected_m, self.options = spec.family, spec, expected_m, options
        self.empty = problem.empty
        # Byte spans of A, sA, B, sB, out (D), grouped layout, sD from their data pointers (0: empty / absent).
        self.spans = (byte_span(a), byte_span(sa), byte_span(b), byte_span(sb), byte_span(out),
                      0 if gl is None else byte_span(gl), 0 if sd is None else byte_span(sd))
        self.ld_sd = 0 if sd is None else sd.stride(-1)  # the FP8 outputs' sD column stride (a kernel field)
        self.rows, self.groups = a.shape[-2], problem.groups
        # A value check of the grouped layout on every call: on a CPU always (as the op does it), on a GPU only in
        # the DFG_CHECK_LAYOUTS debug mode (a sync; graph-safe otherwise), the empty problem included. Meta tensors:
        # the shape-only path, nothing read, nothing run.
        on_gpu = target.gpu_index(a.device) is not None
        debug = on_gpu and env.check_layouts()
        self.values_check = spec.values_check if (not on_gpu and not is_meta(a)) or debug else None
        if is_meta(a):
            self.empty = True
        self.index = None if self.empty else target.gpu_index(a.device)
        self.cfg = self.launcher = None
        self.workspace = None  # split-K: {stream: (counters, partials, buffers kept alive)}; else None
        self.device = a.device
        # Whole parameter blocks (maps and tail) per pointer tuple (pa, psa, pb, pd, psb, pgl): never written after
        # they are built, so any thread launches from one (the launch copies the bytes).
        self.blocks: dict[tuple[int, int, int, int, int, int], object] = {}
        # The encoded maps per (pa, psa, pb, pd), and the six-pointer tuples seen once (a block is built on the
        # second call with a tuple: a grouped layout allocated anew every step costs no block per call).
        self.heads: dict[tuple[int, int, int, int], bytes] = {}
        self.seen: dict[tuple[int, int, int, int, int, int], None] = {}
        self.sa_major = sa_major
        self.sa_ready = (sa.numel() == 0 or sa.stride() == m_major_strides(tuple(sa.shape)) if sa_major == "m"
                         else gemm_host.sa_major_of(sa, address=False) == sa_major)  # address: per call
        self.sb_ready = sb.is_contiguous()
        self.gl_ready = gl is None or gl.is_contiguous()
        self.ready = self.sa_ready and self.sb_ready and self.gl_ready  # no conversion needed on any call
        self.fast = False  # a GPU launch with neither conversions nor a value check (set by _prepare_gpu)
        if self.index is not None:
            self._prepare_gpu(a, b)

    def _prepare_gpu(self, a, b) -> None:
        from ..runtime import driver

        target.backend_of(a.device, "gemm")  # RuntimeError on a GPU other than sm_90, as the op
        _bind_driver()
        cfg = self.family.plan(a, b, self.expected_m, get_num_sms(), *self.options, sa_major=self.sa_major)
        self.launcher = driver.PreparedLaunch(gemm_host.cuda_kernel(cfg, self.index), _GEMM_PARAMS_BYTES,
                                              grid=cfg.grid_size, block=cfg.num_threads, cluster=cfg.cluster_size,
                                              smem_bytes=cfg.smem_bytes, pdl=PROCESS_SETTINGS.pdl)
        self.cfg = cfg
        if cfg.split_k > 1:
            self.workspace = {}
        self.fast = self.ready and self.values_check is None

    def __call__(self, a, sa, b, sb, out, gl=None, sd=None) -> None:
        pa, psa, pb, psb, pd = a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), out.data_ptr()
        pgl = 0 if gl is None else gl.data_ptr()
        psd = 0 if sd is None else sd.data_ptr()
        # A block exists only for pointers that passed the pointer checks (a function of the pointers and this
        # plan's spans alone): a hit skips them. Only on the plain GPU path (``fast``: no conversion, no value
        # check): otherwise blocks are keyed by the converted operands' pointers.
        block = self.blocks.get((pa, psa, pb, pd, psb, pgl, psd)) if self.fast else None
        if block is None:
            block = self._checked_block(a, sa, b, sb, out, gl, sd, pa, psa, pb, psb, pd, pgl, psd)
            if block is None:  # nothing to launch: CPU / empty problem, done
                return
        if self.workspace is None:  # launch()'s common case without its frame
            self.launcher.launch(block, target.current_stream(self.index))
        else:
            self.launch(block)

    def launch(self, block) -> None:
        """Launch from ``block``, a parameter block of this plan (one it holds in ``blocks``, or one a call packed):
        on the current stream, with the split-K workspace of that stream added."""
        launcher = self.launcher
        stream = target.current_stream(self.index)
        if self.workspace is not None:  # split-K: the block with its stream's workspace, in this thread's slot
            slot = _param_slot(_GEMM_PARAMS_BYTES)
            view = slot.view
            if block is not slot:
                view[:_GEMM_PARAMS_BYTES] = block.view
            ws = self._split_k_workspace(stream)
            _pack_workspace(view, _WORKSPACE_START, ws[0], ws[1])
            launcher.launch(slot, stream)
            return
        launcher.launch(block, stream)

    def _checked_block(self, a, sa, b, sb, out, gl, sd, pa, psa, pb, psb, pd, pgl, psd):
        """A call whose pointers have no block yet, or any call of a plan that is not ``fast``: the pointer checks,
        the CPU / empty path (returns None: done), the layout value check and the operand conversions, then the
        block of the (converted) pointers, built if new."""
        span_a, span_sa, span_b, span_sb, span_out, span_gl, span_sd = self.spans
        hi = pd + span_out
        # Conservative: any possible misalignment or overlap (empty tensors included) runs the op's full check,
        # which raises its usual message (the metadata is the plan's, so the first rule that fails is a pointer
        # rule), or passes.
        if ((pa | pb | pd) & 15 or (pd < pa + span_a and pa < hi) or (pd < psa + span_sa and psa < hi)
                or (pd < pb + span_b and pb < hi) or (pd < psb + span_sb and psb < hi)
                or (pgl and pd < pgl + span_gl and pgl < hi)
                or (psd and _overlaps_or_misaligned(psd, span_sd, (pa, span_a), (psa, span_sa), (pb, span_b),
                                                    (psb, span_sb), (pgl, span_gl), (pd, span_out)))):
            self.spec.check(a, sa, b, sb, *((out,) if sd is None else (out, sd)), gl, self.expected_m)
        if self.launcher is None:  # empty problem, or CPU: the reference (or the simulator), through the family
            if self.values_check is not None and (self.index is None or not _capturing()):
                self.values_check(gl, self.rows, self.groups)
            if not self.empty:
                self.family.dispatch(a, sa, b, sb, *((out,) if sd is None else (out, sd)), gl, self.expected_m,
                                     *self.options)
            return None
        if self.values_check is not None and not _capturing():  # DFG_CHECK_LAYOUTS=1 on a GPU: syncs
            self.values_check(gl, self.rows, self.groups)
        if not self.ready or psa & 15:
            if self.sa_major != "m":  # normalise_scales makes the M-major layout, which this kernel does not read
                raise ValueError(f"a plan of sa_major={self.sa_major!r} reads sA where it lies: it needs a "
                                 f"16-byte aligned sA of that layout, got address {psa:#x}, strides {sa.stride()}")
            if not self.sa_ready or psa & 15:
                sa = normalise_scales(sa)
                psa = sa.data_ptr()
            if not self.sb_ready:
                sb = sb.contiguous()
                psb = sb.data_ptr()
            if not self.gl_ready:
                gl = gl.contiguous()
                pgl = gl.data_ptr()
        key = (pa, psa, pb, pd, psb, pgl, psd)
        block = self.blocks.get(key)
        if block is not None:
            return block
        head = self.heads.get(key[:4])
        if head is None:
            head = self._encode(a, sa, b, out, key[:4])
        block, keep = block_for(self.seen, key, _GEMM_PARAMS_BYTES)
        view = block.view
        view[:_MAPS_BYTES] = head
        # The whole tail (sD and its stride 0 for bf16); split-K's workspace is written per launch.
        _pack_tail(view, _TAIL_START, psb, pgl, self.rows, psd, self.ld_sd, 0, 0)
        if keep:
            keep_block(self.blocks, key, block)
        return block

    def _split_k_workspace(self, stream: int) -> tuple:
        """``(counters, partials, ...)`` of this launch: eager, this plan's buffers on ``stream``, held by the plan
        (so its pointers stay valid even after the shared cache grows and replaces them; the counters stay zero
        between launches either way); captured into a CUDA graph, a pair of the capture's own, never cached
        (``kernels/split_k.py``: a graph's baked-in workspace must outlive later growth and not be shared with
        another graph)."""
        if target.is_capturing(self.index):
            counters, partials = split_k.buffers(self.cfg, self.rows, self.device, stream, capturing=True)
            return counters.data_ptr(), partials.data_ptr(), counters, partials
        ws = self.workspace.get(stream)
        if ws is None:
            counters, partials = split_k.buffers(self.cfg, self.rows, self.device, stream)
            if len(self.workspace) >= MAX_WORKSPACES:
                self.workspace.clear()
            ws = self.workspace[stream] = (counters.data_ptr(), partials.data_ptr(), counters, partials)
        return ws

    def _encode(self, a, sa, b, out, key: tuple) -> bytes:
        """The four tensor maps of pointers ``key`` = (pa, psa, pb, pd), encoded (the driver's map cache serving
        what it holds) and cached."""
        head = b"".join(gemm_host.encode_maps(gemm_host.tensor_map_args_1d2d(self.cfg, a, sa, b, out), Backend.CUDA))
        if len(self.heads) >= MAX_MAP_SETS:
            self.heads.clear()
        self.heads[key] = head
        return head


class GemmEntrySpec:
    """How a 1D2D GEMM family's eager calls are planned (made by the family module):

    * ``family``: its :class:`~deep_fp8_gemm._core.family.GemmFamily` (``plan`` and ``dispatch`` with the uniform
      signatures ``plan(a, b, expected_m, num_sms, *options)`` / ``dispatch(a, sa, b, sb, *outs, grouped_layout,
      expected_m, *options)``);
    * ``check(a, sa, b, sb, *outs, grouped_layout, expected_m) -> Problem``: the op's full checks;
    * ``layout_name``: the grouped-layout argument's name in messages (None: dense, no such argument);
    * ``expected_m``: ``"none"`` (the kind takes none), ``"required"`` or ``"optional"``;
    * ``values_check(grouped_layout, rows, groups)``: the check of the layout's values, run on every CPU call and,
      with ``DFG_CHECK_LAYOUTS=1``, on every GPU call; None for dense;
    * ``pair_output``: the output is ``(D, sD)`` with one bool option, ``use_ue8m0`` (the FP8 and SwiGLU·FP8
      outputs); False: one bf16 tensor, no option.
    """

    __slots__ = ("family", "check", "layout_name", "expected_m", "values_check", "pair_output")

    def __init__(self, family: GemmFamily, check: Callable, layout_name: str | None, expected_m: str,
                 values_check: Callable | None = None, pair_output: bool = False):
        if expected_m not in ("none", "required", "optional"):
            raise ValueError(f"expected_m must be 'none', 'required' or 'optional', got {expected_m!r}")
        self.family, self.check, self.layout_name = family, check, layout_name
        self.expected_m, self.values_check, self.pair_output = expected_m, values_check, pair_output


#: kind -> the eager entry of every 1D2D GEMM family (filled by :func:`gemm_entry` and :func:`pair_output_entry`).
GEMM_ENTRIES: dict[str, Callable] = {}


def gemm_entry(spec: GemmEntrySpec) -> Callable:
    """The eager entry of a bf16-output GEMM family: ``entry(a, sa, b, sb, out, grouped_layout, expected_m) ->
    bool`` runs the call through its plan and returns True when :func:`~deep_fp8_gemm._core.dispatch.eager`
    allows (else False: nothing done, the op's own path runs and raises what it raises, in its order).

    The plans live in the closure: ``entry.plans`` (signature tuple -> plan) and ``entry.index`` (``id(B)`` ->
    ``[(guard, expected_m, settings key, plan)]``, newest first; a guard is torch's C++ tensor-metadata check, see
    :func:`guard`; expected_m and the settings key are the non-tensor part of the signature). ``id(B)`` only
    narrows the search (a reused id is harmless: the guard checks every tensor, B included).

    NOTES: the entry is three closures (no grouped layout / a layout without expected_m / with it) and the eager
    test is spelled out in each (``type(t) is not _Tensor`` per tensor) instead of calling
    ``_core.dispatch.eager``: a call and a built ``extra`` tuple cost ~0.25 µs and ~0.1 µs per op here
    (bench.bench_host's dense and contiguous rows, 2-core CI machine), 3% and 1% of their host path.
    """
    plans: dict[tuple, GemmPlan] = {}
    index: dict[int, list] = {}
    expected_rule = spec.expected_m
    settings = PROCESS_SETTINGS

    def plan_and_call(key, expected_m, tensors) -> None:
        gl = tensors[5] if len(tensors) > 5 else None
        plan = plan_of(plans, signature(tensors, expected_m, key),
                       lambda: GemmPlan(spec, *tensors[:5], gl, expected_m))
        g = guard(*tensors)
        if g is not None:
            index_entry(index, tensors[2], (g.check, expected_m, key, plan.__call__))
        plan(*tensors)

    # Index entries are (guard check, expected_m, settings key, plan call); the settings key is interned, so `is`
    # compares it; the bound methods are stored so that a hit looks no attribute up.
    if spec.layout_name is None:
        def entry(a, sa, b, sb, out, gl=None, expected_m=None) -> bool:
            if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                    type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor:
                return False
            key = settings.key
            entries = index.get(id(b))
            if entries is not None:
                for hit, _, k, call in entries:
                    if k is key and hit(a, sa, b, sb, out):
                        call(a, sa, b, sb, out)
                        return True
            plan_and_call(key, None, (a, sa, b, sb, out))
            return True
    elif expected_rule == "none":
        def entry(a, sa, b, sb, out, gl, expected_m=None) -> bool:
            if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                    type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor or \
                    type(gl) is not _Tensor:
                return False
            key = settings.key
            entries = index.get(id(b))
            if entries is not None:
                for hit, _, k, call in entries:
                    if k is key and hit(a, sa, b, sb, out, gl):
                        call(a, sa, b, sb, out, gl)
                        return True
            plan_and_call(key, None, (a, sa, b, sb, out, gl))
            return True
    else:
        def entry(a, sa, b, sb, out, gl, expected_m=None) -> bool:
            if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                    type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor or \
                    type(gl) is not _Tensor:
                return False
            if (expected_m is not None or expected_rule == "required") and \
                    (type(expected_m) is not int or expected_m <= 0):
                # Before the lookup (True == 1 as a key): the required kind raises here, the optional one
                # leaves the error to the op's own path.
                if expected_rule == "required":
                    check_expected_m(expected_m)
                return False
            key = settings.key
            entries = index.get(id(b))
            if entries is not None:
                for hit, em, k, call in entries:
                    if k is key and em == expected_m and hit(a, sa, b, sb, out, gl):
                        call(a, sa, b, sb, out, gl)
                        return True
            plan_and_call(key, expected_m, (a, sa, b, sb, out, gl))
            return True

    def hit(a, sa, b, sb, out, gl=None, expected_m=None) -> bool:
        """Run the call through a plan of the weight's index when one matches, else return False having done
        nothing (no plan built, no check run): see :func:`cached_call`."""
        if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor or \
                (expected_m is not None and type(expected_m) is not int):  # True == 1: never an int's match
            return False
        entries = index.get(id(b))
        if entries is None:
            return False
        if spec.layout_name is None:
            if gl is not None:
                return False
            tensors = (a, sa, b, sb, out)
        elif type(gl) is not _Tensor:
            return False
        else:
            tensors = (a, sa, b, sb, out, gl)
        key = settings.key
        for matches, em, k, call in entries:
            if k is key and em == expected_m and matches(*tensors):
                call(a, sa, b, sb, out, gl)
                return True
        return False

    entry.kind, entry.plans, entry.index, entry.spec, entry.hit = spec.family.kind, plans, index, spec, hit
    GEMM_ENTRIES[spec.family.kind] = entry
    return entry


def cached_call(kind: str) -> Callable:
    """``hit(a, sa, b, sb, out, grouped_layout=None, expected_m=None) -> bool`` of the bf16-output family ``kind``:
    runs an eager call through the plan of its exact signature (tensor metadata, expected_m, process settings) if
    the family's entry holds one, and returns False, having done nothing, if not. A plan exists only for a
    signature whose call passed every check of the op, so a wrapper whose own argument rules are functions of that
    signature (the reference-compatible names of :mod:`deep_fp8_gemm.compat`: no SM100 dtypes, a bf16 ``d``)
    may call it before them; on False it runs them and the op, which builds the plan for the next call."""
    return GEMM_ENTRIES[kind].hit


def pair_output_entry(spec: GemmEntrySpec) -> Callable:
    """The eager entry of an FP8-output or SwiGLU·FP8 family (``spec.pair_output``): ``entry(a, sa, b, sb, d, sd,
    grouped_layout, expected_m, use_ue8m0) -> bool``, as :func:`gemm_entry`'s (same plans, same index, same rules)
    with the output pair and the option in the signature. One closure for the three layouts (dense: no grouped
    layout; with or without expected_m): these calls' floor is higher (6-8 arguments) and their epilogue longer, so
    a few branches cost proportionally less than on the bf16 entries."""
    plans: dict[tuple, GemmPlan] = {}
    index: dict[int, list] = {}
    dense = spec.layout_name is None
    takes_none, required = spec.expected_m == "none", spec.expected_m == "required"
    settings = PROCESS_SETTINGS

    # Index entries are (guard check, expected_m, settings key, use_ue8m0, plan call).
    def entry(a, sa, b, sb, d, sd, gl, expected_m, ue8m0) -> bool:
        if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
                type(b) is not _Tensor or type(sb) is not _Tensor or type(d) is not _Tensor or \
                type(sd) is not _Tensor or type(ue8m0) is not bool or (gl is not None if dense else
                                                                       type(gl) is not _Tensor):
            return False
        if takes_none:
            if expected_m is not None:
                return False  # the op's own path raises
        elif (expected_m is not None or required) and (type(expected_m) is not int or expected_m <= 0):
            if required:  # as gemm_entry: the required kind raises here
                check_expected_m(expected_m)
            return False
        tensors = (a, sa, b, sb, d, sd) if dense else (a, sa, b, sb, d, sd, gl)
        key = settings.key
        entries = index.get(id(b))
        if entries is not None:
            for hit, em, k, option, call in entries:
                if k is key and em == expected_m and option is ue8m0 and hit(*tensors):
                    call(a, sa, b, sb, d, gl, sd)
                    return True
        plan = plan_of(plans, signature(tensors, expected_m, key, ue8m0),
                       lambda: GemmPlan(spec, a, sa, b, sb, d, gl, expected_m, sd, (ue8m0,)))
        g = guard(*tensors)
        if g is not None:
            index_entry(index, b, (g.check, expected_m, key, ue8m0, plan.__call__))
        plan(a, sa, b, sb, d, gl, sd)
        return True

    entry.kind, entry.plans, entry.index, entry.spec = spec.family.kind, plans, index, spec
    GEMM_ENTRIES[spec.family.kind] = entry
    return entry


# ---------------------------------------------------------------------------------------------- prepared calls
class PreparedGemm:
    """A GEMM checked once against example tensors; calling it skips the per-call signature checks.

    Made by :func:`prepare_gemm`. Call it exactly like the op it was prepared for, with tensors that have the
    example's shapes, strides and device (**not checked** per call: that is what it saves; use :meth:`matches`
    while developing): ``p(lhs, rhs, out)`` (dense), ``p(lhs, rhs, out, m_indices)`` (contiguous),
    ``p(lhs, rhs, out, masked_m)`` (masked; the ``expected_m`` given to :func:`prepare_gemm`),
    ``p(lhs, rhs, out, grouped_layout)`` (psum; likewise).
    Checked on every call: the dtypes (the easy slip — a bf16 A that was never quantised has A's shape and
    strides — raises the op's ``TypeError`` instead of computing garbage; ~0.4 µs on the loaded 2-core CI
    machine when it went in, issue 24) and the data pointers (16-byte alignment, no overlap of out with an
    input), with the ops' messages; the grouped layout's values as the op checks them (on a CPU). CUDA-graph
    capturable like the ops (after one call).
    A contiguous / psum GEMM is prepared for the contiguous alignment of the time (its BLOCK_M): called after
    ``set_mk_alignment_for_contiguous_layout`` changed it, it raises ``RuntimeError`` (prepare it again).
    """

    __slots__ = ("kind", "expected_m", "_plan", "_key", "_alignment", "_invariant")

    def __init__(self, kind: str, plan: GemmPlan, key: tuple, expected_m: int | None):
        self.kind, self._plan, self._key, self.expected_m = kind, plan, key, expected_m
        self._alignment = PROCESS_SETTINGS.contiguous_alignment if kind in ("contiguous", "psum") else None
        self._invariant = PROCESS_SETTINGS.batch_invariant

    def __call__(self, lhs, rhs, out, grouped_layout=None) -> None:
        if self._alignment is not None and PROCESS_SETTINGS.contiguous_alignment != self._alignment:
            raise RuntimeError(
                f"this PreparedGemm({self.kind!r}) was prepared for get_m_alignment_for_contiguous_layout()="
                f"{self._alignment} (its kernel's BLOCK_M), now {PROCESS_SETTINGS.contiguous_alignment}: prepare it "
                "again")
        if PROCESS_SETTINGS.batch_invariant is not self._invariant:
            raise RuntimeError(f"this PreparedGemm({self.kind!r}) was prepared with is_batch_invariant()="
                               f"{self._invariant} (its kernel's split-K and swap-AB choice), now "
                               f"{PROCESS_SETTINGS.batch_invariant}: prepare it again")
        try:
            a, sa = lhs
            b, sb = rhs
            if a.dtype is not _FP8 or sa.dtype is not _F32 or b.dtype is not _FP8 or sb.dtype is not _F32 or \
                    out.dtype is not _BF16 or (grouped_layout is not None and grouped_layout.dtype is not _I32):
                raise TypeError
        except (TypeError, ValueError, AttributeError):  # not pairs, not tensors, or another dtype
            self._reject(lhs, rhs, out, grouped_layout)
        self._plan(a, sa, b, sb, out, grouped_layout)

    def _reject(self, lhs, rhs, out, grouped_layout) -> None:
        """Raise the op's own error for arguments whose types or dtypes are not the example's."""
        spec = GEMM_ENTRIES[self.kind].spec
        extra = () if grouped_layout is None else ((grouped_layout, spec.layout_name),)
        a, sa, b, sb = operands(lhs, rhs, out, *extra)
        spec.check(a, sa, b, sb, out, grouped_layout, self.expected_m)
        raise TypeError(f"{self!r} called with tensors whose dtypes differ from the example's")  # pragma: no cover

    def matches(self, lhs, rhs, out, grouped_layout=None) -> bool:
        """True when these tensors have the example's signature (what a call assumes without checking)."""
        return _prepared_key(self.kind, lhs, rhs, out, grouped_layout, self.expected_m) == self._key

    def __repr__(self) -> str:
        return f"PreparedGemm(kind={self.kind!r}, config={self._plan.cfg})"


def _prepared_key(kind, lhs, rhs, out, gl, expected_m) -> tuple:
    tensors = (*lhs, *rhs, out) + (() if gl is None else (gl,))
    return (kind, expected_m, PROCESS_SETTINGS.key) + tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)


def prepare_gemm(kind: str, lhs, rhs, out, grouped_layout: torch.Tensor | None = None,
                 expected_m: int | None = None) -> PreparedGemm:
    """Check a GEMM once and return a callable that runs it with new tensors of the same signature.

    Args:
        kind: ``"dense"`` (:func:`~deep_fp8_gemm.gemm_fp8_fp8_bf16_nt`), ``"contiguous"``
            (:func:`~deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`, ``grouped_layout`` = m_indices) or
            ``"masked"`` (:func:`~deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked`, ``grouped_layout`` =
            masked_m, ``expected_m`` required) or ``"psum"``
            (:func:`~deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`, ``grouped_layout`` = the
            group ends, ``expected_m`` optional; on a CPU the ends are checked on every call, as by the op).
        lhs, rhs, out, grouped_layout: example arguments, exactly as the op takes them (shapes, dtypes, layouts
            and errors as documented there); nothing is computed.

    Returns:
        A :class:`PreparedGemm`. On a GPU its kernel is compiled and loaded here.

    Raises:
        The op's TypeError / ValueError / RuntimeError for bad example arguments; ValueError for an unknown
        ``kind`` or a grouped_layout given to / missing from the wrong kind.
    """
    kinds = [k for k, e in GEMM_ENTRIES.items() if not e.spec.pair_output]  # the bf16-output families
    if kind not in kinds:
        raise ValueError(f"kind must be one of {', '.join(repr(k) for k in kinds)}, got {kind!r}")
    spec = GEMM_ENTRIES[kind].spec
    if (grouped_layout is None) != (spec.layout_name is None):
        raise ValueError("prepare_gemm('dense', ...) takes no grouped_layout" if kind == "dense" else
                         f"prepare_gemm({kind!r}, ...) needs grouped_layout ({spec.layout_name})")
    if spec.expected_m == "required" or (spec.expected_m == "optional" and expected_m is not None):
        check_expected_m(expected_m)
    elif spec.expected_m == "none" and expected_m is not None:
        kinds = [k for k in kinds if GEMM_ENTRIES[k].spec.expected_m != "none"]
        raise ValueError(f"expected_m is only for kind={' or '.join(repr(k) for k in kinds)}, got {expected_m=} "
                         f"for {kind=}")
    extra = () if grouped_layout is None else ((grouped_layout, spec.layout_name),)
    a, sa, b, sb = operands(lhs, rhs, out, *extra)
    plan = GemmPlan(spec, a, sa, b, sb, out, grouped_layout, expected_m)
    return PreparedGemm(kind, plan, _prepared_key(kind, (a, sa), (b, sb), out, grouped_layout, expected_m), expected_m)


# ---------------------------------------------------------------------------------------------- quantisers
class QuantPlan:
    """One quantiser signature: ``kind`` ("per_token" | "per_block" | "silu"), checked and prepared.

    Not an sm_90 GPU: calls the quantiser's own implementation (``fallback``: its backend policy decides between
    plain torch and the simulator). sm_90: allocates the outputs with the cached shapes / strides, packs the
    ``QuantParams`` pointers into the plan's parameter block (the constants are there already, packed by name from
    ``kernels.quant``'s launch plan, the one the general path uses) and launches the fused kernel (vectorised when
    the input address is 16-byte aligned and the shape allows)."""

    __slots__ = ("kind", "ue8m0", "fallback", "index", "device", "launch_plan", "_launchers", "out_proto",
                 "scale_proto", "thread", "block", "call", "_consts")

    def __init__(self, kind: str, x: torch.Tensor, check: Callable, fallback: Callable, ue8m0: bool):
        check(x)
        self.kind, self.ue8m0 = kind, ue8m0
        self.fallback = fallback if kind == "silu" else (lambda t: fallback(t, ue8m0))
        self.call = self.fallback  # what a call runs: the fallback, or _launch once prepared for sm_90 below
        self.index = None
        if target.backend_of(x.device, "quant") is not Backend.CUDA:
            return
        self.index = target.gpu_index(x.device)
        self.device = x.device
        _bind_driver()
        self.launch_plan = lp = quant_host.plan_quant(x, quant_host.QUANT_KINDS[kind], ue8m0)
        self._launchers: dict[bool, object] = {}
        # 0-element prototypes (no memory): the outputs are made with their new_empty_strided.
        self.out_proto = torch.empty(0, dtype=_FP8, device=self.device)
        self.scale_proto = torch.empty(0, dtype=_F32, device=self.device)
        # The plan's own parameter block, written only by the thread that built the plan: the constants are
        # packed once here, a call writes the three pointers in front of them.
        self.thread = _get_ident()
        self.call = self._launch
        if not lp.empty:
            from ..runtime import driver

            self._consts = quant_host.params_packer(tuple(lp.fields))
            self.block = driver.param_block(quant_host.QUANT_PARAMS_BYTES)
            self._consts.pack_into(self.block.view, *lp.fields.values())
            empty = ALLOCATORS.get(self.device.type)
            if not lp.copy and empty is not None:
                self.call = self._fast_call(driver, empty)

    def _launcher(self, vectorized: bool):
        from ..runtime import driver

        config = self.launch_plan.kernel_config(vectorized)
        launcher = driver.PreparedLaunch(quant_host.cuda_kernel(config, self.index), quant_host.QUANT_PARAMS_BYTES,
                                         grid=self.launch_plan.grid, block=config.num_threads,
                                         smem_bytes=config.smem_bytes, pdl=PROCESS_SETTINGS.pdl)
        self._launchers[vectorized] = launcher
        return launcher

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.call(x)

    def _fast_call(self, driver, empty):
        """``self.call`` of a non-empty plan whose input needs no copy: one Python frame that does what
        :meth:`_launch` then :meth:`PreparedLaunch.launch <deep_fp8_gemm.runtime.driver.PreparedLaunch.launch>`
        do in the common case (the current device is the input's, aligned input if vectorised, this plan's
        thread, a stream already seen, on the null stream the kernel's context current); anything else goes
        through :meth:`_launch` / :meth:`_finish` / ``launch``, so every rule stays in one place. Locals instead
        of attribute loads, the driver's functions bound once (the binding is the module's ``driver`` at plan
        time). ``empty``: torch's ``(sizes, strides, dtype)`` allocator for the plan's device type; its tensors
        are what ``new_empty_strided`` makes (own storage of exactly the size, offset 0, no grad), except that
        torch's deterministic mode does not NaN-fill them (the kernel writes every element)."""
        lp = self.launch_plan
        out_shape, out_strides, scale_shape, scale_strides = lp.out_shape, lp.out_strides, lp.scale_shape, lp.scale_strides
        vectorizable = lp.vectorizable
        launcher = self._launchers.get(vectorizable) or self._launcher(vectorizable)
        configs, kernel, index, thread = launcher._configs, launcher.kernel, self.index, self.thread
        finish = self._finish
        function, context = kernel.function, kernel.context
        block = self.block
        view, address = block.view, block.pointers_address
        pack, start = _QUANT_POINTERS.bound()
        get_current, launch_ex = driver.driver.cuCtxGetCurrent, driver.driver.cuLaunchKernelEx
        get_ident = _get_ident

        slow = self._launch

        def call(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if target.current_device() != index:  # the allocator's device: not the input's
                return slow(x)
            out = empty(out_shape, out_strides, _FP8)
            scales = empty(scale_shape, scale_strides, _F32)
            px = x.data_ptr()
            stream = target.current_stream(index)
            config = configs.get(stream)
            if config is None or (vectorizable and px & 15) or get_ident() != thread:
                return finish(x, out, scales, px)
            pack(view, start, px, out.data_ptr(), scales.data_ptr())
            if stream == 0:  # null stream: this kernel's context must be current (else launch() pushes it)
                err, current = get_current()
                if err or current != context:  # CUcontext == compares the handles
                    launcher.launch(block, stream)
                    return out, scales
            err = launch_ex(config, function, address, 0)[0]
            if err:
                launcher.raise_error(err, stream)
            return out, scales

        return call

    def _launch(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sm_90 path (``self.call`` there unless :meth:`_fast_call` serves): allocate the outputs, pack
        the pointers, launch."""
        lp = self.launch_plan
        if lp.copy:
            x = x.contiguous()
        # Two new tensors, each with its own storage (module docstring, "Quantiser outputs"); new_empty_strided
        # of a 0-element prototype skips parsing dtype= and device= (~0.15 µs each on the CI machine).
        out = self.out_proto.new_empty_strided(lp.out_shape, lp.out_strides)
        scales = self.scale_proto.new_empty_strided(lp.scale_shape, lp.scale_strides)
        if lp.empty:
            return out, scales
        return self._finish(x, out, scales, x.data_ptr())

    def _finish(self, x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, px: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack the parameters of ``x`` -> ``(out, scales)`` and launch (``px`` = ``x.data_ptr()``)."""
        vectorized = self.launch_plan.vectorizable and not px & 15
        launcher = self._launchers.get(vectorized) or self._launcher(vectorized)
        if _get_ident() == self.thread:  # the constants are already in the plan's own block
            block = self.block
            _QUANT_POINTERS.pack_into(block.view, px, out.data_ptr(), scales.data_ptr())
        else:  # another thread: the plan's block is not its to write; pack everything into its own slot
            block = _param_slot(quant_host.QUANT_PARAMS_BYTES)
            _QUANT_POINTERS.pack_into(block.view, px, out.data_ptr(), scales.data_ptr())
            self._consts.pack_into(block.view, *self.launch_plan.fields.values())
        launcher.launch(block, target.current_stream(self.index))
        return out, scales


#: Every quantiser's signature dict and hot lists (see :func:`quantiser`), for :func:`clear` and :func:`stats`.
_quant_plans: dict[tuple, QuantPlan] = {}
_quant_hot: list[list] = []


def quantiser(kind: str, check: Callable, fallback: Callable):
    """The eager entry of quantiser ``kind`` ("per_token" | "per_block" | "silu"): ``entry(x, ue8m0)`` runs it
    through its plan when :func:`~deep_fp8_gemm._core.dispatch.eager` allows and returns ``(out, scales)``, else
    None (nothing done). ``check(x)`` is the public op's check (run on a new signature), ``fallback`` its
    implementation where the fused kernels do not run (called as ``fallback(x, ue8m0)``, or ``fallback(x)`` for
    "silu"); ``ue8m0`` a bool (the caller checks its type).

    Hot path: per ``ue8m0`` a list of ``(guard.check, plan.call)``, newest first, at most
    ``MAX_GUARDS_PER_WEIGHT`` — one C++ metadata check and one call per hit, the kind and the lists bound in
    the closure (no key built, no dict looked up)."""
    hot = ([], [])  # indexed by ue8m0 (False -> 0, True -> 1)
    _quant_hot.extend(hot)

    def entry(x: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        if _is_compiling() or _dispatch_depth() or type(x) is not _Tensor:
            return None
        for hit, call in hot[ue8m0]:
            if hit(x):
                return call(x)
        key = (kind, ue8m0, x.shape, x.stride(), x.dtype, x.device)
        plan = _quant_plans.get(key)
        if plan is None:
            plan = _remember(_quant_plans, key, QuantPlan(kind, x, check, fallback, ue8m0))
        g = guard(x)
        if g is not None:
            entries = hot[ue8m0]
            entries.insert(0, (g.check, plan.call))
            del entries[MAX_GUARDS_PER_WEIGHT:]
        return plan.call(x)

    return entry


# ---------------------------------------------------------------------------------------------- introspection
#: The plan caches of the families whose plans live next to their ops (``ops.bf16``, ...): prefix -> (clear, stats).
_OTHER_CACHES: dict[str, tuple[Callable[[], None], Callable[[], dict]]] = {}


def register_cache(prefix: str, clear_plans: Callable[[], None], plan_stats: Callable[[], dict]) -> None:
    """Make :func:`clear` forget another family's plans too and :func:`stats` report them (as ``prefix + name``):
    one reset for every per-call cache (tests that fake a GPU must not leave plans that later CPU calls meet)."""
    _OTHER_CACHES[prefix] = (clear_plans, plan_stats)


def clear() -> None:
    """Forget every plan, every family's (tests; a loaded kernel stays loaded)."""
    for entry in GEMM_ENTRIES.values():
        entry.plans.clear()
        entry.index.clear()
    _quant_plans.clear()
    for hot in _quant_hot:
        hot.clear()
    for clear_plans, _ in _OTHER_CACHES.values():
        clear_plans()


def stats() -> dict[str, tuple[int, int]]:
    """``{kind: (plans, weights indexed)}`` for every GEMM family with an eager entry, ``"quant"``: (plans, hot
    entries), and the registered caches' entries as ``prefix + name`` (:func:`register_cache`). What tests and
    benchmarks inspect instead of the entries' state."""
    out = {kind: (len(e.plans), len(e.index)) for kind, e in GEMM_ENTRIES.items()}
    out["quant"] = (len(_quant_plans), sum(len(h) for h in _quant_hot))
    for prefix, (_, plan_stats) in _OTHER_CACHES.items():
        out.update({prefix + name: value for name, value in plan_stats().items()})
    return out


def plans_of(kind: str) -> list[GemmPlan]:
    """The plans a GEMM family's entry holds (tests: a pointer-only change must reuse one)."""
    return list(GEMM_ENTRIES[kind].plans.values())


def inject_guard_for_tests(kind: str, weight: torch.Tensor, guard_tensors: tuple, plan: GemmPlan) -> None:
    """Put ``(guard(*guard_tensors), plan)`` first in ``kind``'s index under ``id(weight)`` (tests: an entry whose guard
    does not match a call's tensors, as after a freed weight's id is reused, must never serve it)."""
    GEMM_ENTRIES[kind].index[id(weight)] = [(guard(*guard_tensors).check, plan.expected_m, PROCESS_SETTINGS.key,
                                             plan.__call__)]
