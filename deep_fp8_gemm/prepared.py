"""The eager ops' per-call host path: checks cached per tensor signature, launches prepared once.

A decode GEMM runs for 3-25 µs on the GPU, so the Python in front of its launch must cost about one launch.
Everything the ops check and compute before a launch, except the data pointers, is a function of the
arguments' *signature*: per tensor ``(shape, stride(), dtype, device)``, plus ``expected_m`` and the
:func:`~deep_fp8_gemm.set_num_sms` override. So an eager call looks up a **plan** for its signature: first
among the plans last used with the same weight (``id(B)``; ``id(x)``-free for the quantisers), each guarded by
torch's C++ tensor-metadata check (``TensorGuards``, dynamo's own: sizes, strides, dtype, device, plus
dispatch keys and requires_grad, which can only cause a miss), else in a dict keyed by the Python signature
tuple (~4x dearer to build and compare):

* new signature: the full checks of :mod:`.validation` run (same errors, same messages, same order as before), and the
  plan records their outcome: the problem is empty or not, the GPU ordinal (``runtime.target``), whether sA
  already has the M-major TMA-aligned layout and sB / the grouped layout are contiguous (else the same
  conversions as before run on every call), the byte span of every tensor (for the overlap check), and for a
  GPU: the kernel config, the loaded kernel and a :class:`~deep_fp8_gemm.runtime.driver.PreparedLaunch`.
* known signature: only what depends on the data pointers runs: 16-byte alignment of A, B and out, out overlapping no
  input (integer compares against the cached spans; on a hit of either the full pointer check runs and raises
  its usual message), sA's alignment, the tensor maps, the parameter bytes, the launch. The psum layout's group
  ends are values, not metadata: on a CPU they are checked on every call (as by the op), on a GPU never read.

A changed shape, stride, dtype or device is a different signature, so it misses and is checked in full; a
changed pointer is checked on every call.

Tensor maps: a ``CUtensorMap`` is opaque (the driver API documents no field offsets, so its global address
cannot be patched on the host), so the four encoded maps are cached per plan under the four data pointers
(64 pointer tuples per plan, then cleared), on top of the driver's LRU keyed by the full encode arguments
(weights always hit there). The allocator hands a decode loop the same addresses, so a steady state never
encodes.

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

import ctypes
import struct
from threading import get_ident as _get_ident

import torch

from . import utils
from .kernels.gemm import _PARAMS_TAIL, PARAMS_BYTES, PARAMS_SPLIT_K_OFFSET
from .kernels.quant import QuantParams
from .runtime import target
from .validation import check_expected_m

_Tensor = torch.Tensor
_MAX_PLANS = 1024  # per op; cleared when full (a model has a handful of signatures per op)
_MAX_HEADS = 64  # encoded tensor-map sets per plan
_GEMM_PARAMS_BYTES = PARAMS_BYTES  # sizeof(dfg::GemmParams)
# At offset 512, after the four tensor maps: sb, grouped_layout, rows, reserved, zeros (the 1D1D fields), then at
# PARAMS_SPLIT_K_OFFSET the split-K workspace's counters and partials (0, 0 without split-K).
_GEMM_TAIL = struct.Struct(f"{_PARAMS_TAIL.format}{PARAMS_SPLIT_K_OFFSET - 512 - _PARAMS_TAIL.size}xQQ"
                           f"{PARAMS_BYTES - PARAMS_SPLIT_K_OFFSET - 16}x")
# dfg::quant::QuantParams, packed straight into the parameter slot (no ctypes.Structure built per call).
_QUANT_PARAMS = struct.Struct("<" + "".join({8: "Q", 4: "I"}[ctypes.sizeof(t)] for _, t in QuantParams._fields_))
# The three pointers at the front of QuantParams (input, output, scales), as packed by _QUANT_PARAMS.
_QUANT_POINTERS = struct.Struct(_QUANT_PARAMS.format[:4])
_param_slot = None  # driver.param_slot, bound when the first GPU plan is built (no CUDA import before)
try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - every torch this package supports has it
    _TensorGuards = None
# torch's low-overhead allocators (what inductor's generated code calls): ``(sizes, strides, dtype)`` ->
# ``at::detail::empty_strided_{cpu,cuda}`` without the Python argument parser or the dispatcher, ~0.65 µs per
# tensor less than ``new_empty_strided`` here. The CUDA one allocates on the *current* device (checked per
# call). Private API: where it is missing a plan allocates with new_empty_strided as before.
try:
    from torch._C._dynamo.guards import _empty_strided_cpu as _empty_cpu, _empty_strided_cuda as _empty_cuda
except ImportError:  # pragma: no cover - present in the supported torch (2.13)
    _empty_cpu = _empty_cuda = None
_is_compiling = torch.compiler.is_compiling
_FP8, _F32 = torch.float8_e4m3fn, torch.float32
_dispatch_depth = torch._C._len_torch_dispatch_stack


def eager(*tensors: object) -> bool:
    """True when a call may take this path: not tracing, no dispatch mode active, plain tensors only (the same
    rule as ``ops._eager``; anything else goes through the custom op so compiled code sees one node)."""
    if _is_compiling() or _dispatch_depth():
        return False
    for t in tensors:
        if type(t) is not _Tensor:
            return False
    return True


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _bind_driver() -> None:
    global _param_slot
    from .runtime import driver

    _param_slot = driver.param_slot


def _span(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element (0 for an empty tensor), as ``_byte_range``."""
    if t.numel() == 0:
        return 0
    from .validation import _byte_range

    lo, hi = _byte_range(t)
    return hi - lo


# ---------------------------------------------------------------------------------------------- GEMM plans
class GemmPlan:
    """The checked, prepared form of one GEMM signature (see the module docstring). Call it with tensors of
    that signature: ``plan(a, sa, b, sb, out, grouped_layout)`` (``grouped_layout`` None for dense)."""

    __slots__ = ("kind", "expected_m", "empty", "index", "rows", "cfg", "launcher", "heads", "sa_ready",
                 "sb_ready", "gl_ready", "ready", "spans", "_ops", "psum_values", "workspace", "device")

    def __init__(self, kind: str, a, sa, b, sb, out, gl, expected_m: int | None):
        from . import ops
        from .validation import check_contiguous, check_dense, check_masked

        self._ops = ops
        self.kind, self.expected_m = kind, expected_m
        if kind == "dense":
            m, n, _ = check_dense(a, sa, b, sb, out)
            self.empty = not (m and n)
        elif kind == "contiguous":
            m_sum, n, _, _ = check_contiguous(a, sa, b, sb, out, gl)
            self.empty = not (m_sum and n)
        elif kind == "psum":
            from .psum import check_contiguous_psum

            m_sum, n, _, _ = check_contiguous_psum(a, sa, b, sb, out, gl)
            if expected_m is not None:
                check_expected_m(expected_m)
            self.empty = not (m_sum and n)
        else:
            _, m_max, n, _ = check_masked(a, sa, b, sb, out, gl, expected_m)
            self.empty = not (m_max and n)
        # Byte spans of A, sA, B, sB, out, grouped layout from their data pointers (0: empty / absent).
        self.spans = (_span(a), _span(sa), _span(b), _span(sb), _span(out), 0 if gl is None else _span(gl))
        self.rows = a.shape[-2]
        # psum on a CPU: the group ends are read and checked on every call (as the op does; free there). Never
        # on a GPU (graph-safe; the empty problem included), hence gpu_index and not the emptiness below.
        self.psum_values = kind == "psum" and a.device.type == "cpu" and target.gpu_index(a.device) is None
        self.index = None if self.empty else target.gpu_index(a.device)
        self.cfg = self.launcher = None
        self.workspace = None  # split-K: {stream: (counters, partials, buffers kept alive)}; else None
        self.device = a.device
        self.heads: dict[tuple[int, int, int, int], bytes] = {}
        canonical = utils._m_major_strides(tuple(sa.shape))
        self.sa_ready = sa.numel() == 0 or sa.stride() == canonical
        self.sb_ready = sb.is_contiguous()
        self.gl_ready = gl is None or gl.is_contiguous()
        self.ready = self.sa_ready and self.sb_ready and self.gl_ready  # no conversion needed on any call
        if self.index is not None:
            self._prepare_gpu(a, sa, b, sb)

    def _prepare_gpu(self, a, sa, b, sb) -> None:
        from .kernels import gemm
        from .runtime import driver

        self._ops._require_sm90(a.device, self.index)
        _bind_driver()
        cfg = gemm.problem_config(self.kind, a, b, self.expected_m, utils.get_num_sms())
        kernel = gemm._cuda_kernel(cfg, self.index)
        self.launcher = driver.PreparedLaunch(kernel, _GEMM_PARAMS_BYTES, grid=cfg.grid_size, block=cfg.num_threads,
                                              cluster=cfg.cluster_size, smem_bytes=cfg.smem_bytes)
        self.cfg = cfg
        if cfg.split_k > 1:
            self.workspace = {}

    def __call__(self, a, sa, b, sb, out, gl=None) -> None:
        pa, psa, pb, psb, pd = a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), out.data_ptr()
        pgl = 0 if gl is None else gl.data_ptr()
        span_a, span_sa, span_b, span_sb, span_out, span_gl = self.spans
        hi = pd + span_out
        # Conservative: any possible misalignment or overlap (empty tensors included) runs the full check,
        # which raises the usual message, or passes.
        if ((pa | pb | pd) & 15 or (pd < pa + span_a and pa < hi) or (pd < psa + span_sa and psa < hi)
                or (pd < pb + span_b and pb < hi) or (pd < psb + span_sb and psb < hi)
                or (pgl and pd < pgl + span_gl and pgl < hi)):
            self._check_pointers(a, sa, b, sb, out, gl)
        launcher = self.launcher
        if launcher is None:  # empty problem, or CPU: the reference (or the simulator), as before
            if self.psum_values:
                from .reference import check_psum_values

                check_psum_values(gl.tolist(), self.rows)
            if not self.empty:
                self._ops._dispatch(self.kind, a, sa, b, sb, out, grouped_layout=gl, expected_m=self.expected_m)
            return
        if not self.ready or psa & 15:
            if not self.sa_ready or psa & 15:
                sa = self._ops._normalise_sa(sa)
                psa = sa.data_ptr()
            if not self.sb_ready:
                sb = sb.contiguous()
                psb = sb.data_ptr()
            if not self.gl_ready:
                gl = gl.contiguous()
                pgl = gl.data_ptr()
        key = (pa, psa, pb, pd)
        head = self.heads.get(key)
        if head is None:
            head = self._encode(a, sa, b, out, key)
        slot = _param_slot(_GEMM_PARAMS_BYTES)
        view = slot.view
        view[:512] = head
        stream = target.current_stream(self.index)
        if self.workspace is None:
            _GEMM_TAIL.pack_into(view, 512, psb, pgl, self.rows, 0, 0, 0)
        else:
            ws = self.workspace.get(stream)
            if ws is None:
                ws = self._split_k_workspace(stream)
            _GEMM_TAIL.pack_into(view, 512, psb, pgl, self.rows, 0, ws[0], ws[1])
        launcher.launch(slot, stream)

    def _split_k_workspace(self, stream: int) -> tuple:
        """This plan's split-K buffers on ``stream``, held by the plan (so its pointers stay valid even after the
        shared cache grows and replaces them; the counters stay zero between launches either way)."""
        from . import split_k

        counters, partials = split_k.buffers(self.cfg, self.rows, self.device, stream)
        if len(self.workspace) >= _MAX_HEADS:
            self.workspace.clear()
        ws = self.workspace[stream] = (counters.data_ptr(), partials.data_ptr(), counters, partials)
        return ws

    def _check_pointers(self, a, sa, b, sb, out, gl) -> None:
        from .validation import _check_pointers

        extra = () if gl is None else ((gl, _LAYOUT_NAMES[self.kind]),)
        _check_pointers(a, sa, b, sb, out, extra)

    def _encode(self, a, sa, b, out, key) -> bytes:
        from .kernels.gemm import tensor_map_args
        from .runtime import driver

        cache = driver.tensor_map_cache
        head = b"".join(cache.lookup(args, args) for args in tensor_map_args(self.cfg, a, sa, b, out))
        if len(self.heads) >= _MAX_HEADS:
            self.heads.clear()
        self.heads[key] = head
        return head


_LAYOUT_NAMES = {"contiguous": "m_indices", "masked": "masked_m", "psum": "grouped_layout"}  # in the ops' messages
_dense_plans: dict[tuple, GemmPlan] = {}
_contiguous_plans: dict[tuple, GemmPlan] = {}
_masked_plans: dict[tuple, GemmPlan] = {}
_psum_plans: dict[tuple, GemmPlan] = {}
# Fast index: id(B) -> [(guard, extra, plan)], newest first. A guard is torch's C++ tensor-metadata check
# (see _guard); extra holds the non-tensor part of the signature. id(B) only narrows the search (a reused id
# is harmless: the guard checks every tensor, B included).
_dense_index: dict[int, list] = {}
_contiguous_index: dict[int, list] = {}
_masked_index: dict[int, list] = {}
_psum_index: dict[int, list] = {}
_MAX_GUARDS_PER_WEIGHT = 8  # signatures (typically row counts) remembered per weight


def _guard(*tensors):
    """A check that tensors have exactly these tensors' sizes, strides, dtype and device, in C++:
    ``torch._C._dynamo.guards.TensorGuards`` (dynamo's own, static dims), ~4x cheaper than building and
    comparing the Python signature tuple. It also compares dispatch keys and requires_grad, which can only
    turn a hit into a miss (then the signature dict serves the call). None when this torch lacks it."""
    if _TensorGuards is None:
        return None
    try:
        return _TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    except Exception:  # an API change in a future torch: the dict path alone stays correct
        return None


def _index(index: dict, weight_id: int, guard, extra, plan) -> None:
    if guard is None:
        return
    entries = index.get(weight_id)
    if entries is None:
        if len(index) >= _MAX_PLANS:
            index.clear()
        entries = index[weight_id] = []
    entries.insert(0, (guard, extra, plan))
    del entries[_MAX_GUARDS_PER_WEIGHT:]


def _remember(plans: dict, key: tuple, plan):
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def _plan_and_call(kind: str, plans: dict, index: dict, extra, expected_m, *tensors) -> None:
    """The miss path shared by the GEMM entries: the plan of these tensors' signature (sizes, strides, dtype
    and device of each, plus ``extra``), built on first use; indexed under the weight B's id for the guard
    check; then called. ``tensors`` is ``(a, sa, b, sb, out)`` plus the grouped kinds' layout tensor."""
    key = tuple(x for t in tensors for x in (t.shape, t.stride(), t.dtype, t.device)) + (extra,)
    plan = plans.get(key)
    if plan is None:
        layout = tensors[5] if len(tensors) > 5 else None
        plan = _remember(plans, key, GemmPlan(kind, *tensors[:5], layout, expected_m))
    _index(index, id(tensors[2]), _guard(*tensors), extra, plan)
    plan(*tensors)


def dense(a, sa, b, sb, out) -> bool:
    """``gemm_fp8_fp8_bf16_nt`` through its plan when :func:`eager` allows; False (nothing done) otherwise."""
    if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
            type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor:
        return False
    extra = utils._num_sms_override
    entries = _dense_index.get(id(b))
    if entries is not None:
        for guard, guard_extra, plan in entries:
            if guard_extra == extra and guard.check(a, sa, b, sb, out):
                plan(a, sa, b, sb, out)
                return True
    _plan_and_call("dense", _dense_plans, _dense_index, extra, None, a, sa, b, sb, out)
    return True


def contiguous(a, sa, b, sb, out, m_indices) -> bool:
    """``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` through its plan when :func:`eager` allows; else False."""
    if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
            type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor or \
            type(m_indices) is not _Tensor:  # eager(), inlined (as in dense)
        return False
    extra = utils._num_sms_override
    entries = _contiguous_index.get(id(b))
    if entries is not None:
        for guard, guard_extra, plan in entries:
            if guard_extra == extra and guard.check(a, sa, b, sb, out, m_indices):
                plan(a, sa, b, sb, out, m_indices)
                return True
    _plan_and_call("contiguous", _contiguous_plans, _contiguous_index, extra, None, a, sa, b, sb, out, m_indices)
    return True


def masked(a, sa, b, sb, out, masked_m, expected_m: int) -> bool:
    """``m_grouped_gemm_fp8_fp8_bf16_nt_masked`` through its plan when :func:`eager` allows; else False."""
    if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
            type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor or \
            type(masked_m) is not _Tensor:  # eager(), inlined (as in dense)
        return False
    if type(expected_m) is not int or expected_m <= 0:  # before the lookup: True == 1 as a key
        check_expected_m(expected_m)
    extra = (expected_m, utils._num_sms_override)
    entries = _masked_index.get(id(b))
    if entries is not None:
        for guard, guard_extra, plan in entries:
            if guard_extra == extra and guard.check(a, sa, b, sb, out, masked_m):
                plan(a, sa, b, sb, out, masked_m)
                return True
    _plan_and_call("masked", _masked_plans, _masked_index, extra, expected_m, a, sa, b, sb, out, masked_m)
    return True


def psum(a, sa, b, sb, out, grouped_layout, expected_m) -> bool:
    """``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum`` through its plan when :func:`eager` allows and
    ``expected_m`` is None or a valid int; else False (nothing done: the op's own path runs, and raises
    what it raises, in its order)."""
    if _is_compiling() or _dispatch_depth() or type(a) is not _Tensor or type(sa) is not _Tensor or \
            type(b) is not _Tensor or type(sb) is not _Tensor or type(out) is not _Tensor or \
            type(grouped_layout) is not _Tensor:  # eager(), inlined (as in dense)
        return False
    if expected_m is not None and (type(expected_m) is not int or expected_m <= 0):
        return False
    extra = (expected_m, utils._num_sms_override)
    entries = _psum_index.get(id(b))
    if entries is not None:
        for guard, guard_extra, plan in entries:
            if guard_extra == extra and guard.check(a, sa, b, sb, out, grouped_layout):
                plan(a, sa, b, sb, out, grouped_layout)
                return True
    _plan_and_call("psum", _psum_plans, _psum_index, extra, expected_m, a, sa, b, sb, out, grouped_layout)
    return True


def clear() -> None:
    """Forget every plan (tests; a loaded kernel stays loaded)."""
    for plans in (_dense_plans, _contiguous_plans, _masked_plans, _psum_plans, _quant_plans, _dense_index,
                  _contiguous_index, _masked_index, _psum_index, *_quant_hot):
        plans.clear()


# ---------------------------------------------------------------------------------------------- prepared calls
class PreparedGemm:
    """A GEMM checked once against example tensors; calling it skips the per-call signature checks.

    Made by :func:`prepare_gemm`. Call it exactly like the op it was prepared for, with tensors that have the
    example's shapes, strides, dtypes and device (**not checked** per call: that is what it saves; use
    :meth:`matches` while developing): ``p(lhs, rhs, out)`` (dense), ``p(lhs, rhs, out, m_indices)``
    (contiguous), ``p(lhs, rhs, out, masked_m)`` (masked; the ``expected_m`` given to :func:`prepare_gemm`),
    ``p(lhs, rhs, out, grouped_layout)`` (psum; likewise).
    Data pointers may change from call to call and are still checked (16-byte alignment, no overlap of out
    with an input), with the ops' messages. CUDA-graph capturable like the ops (after one call).
    """

    __slots__ = ("kind", "expected_m", "_plan", "_key")

    def __init__(self, kind: str, plan: GemmPlan, key: tuple, expected_m: int | None):
        self.kind, self._plan, self._key, self.expected_m = kind, plan, key, expected_m

    def __call__(self, lhs, rhs, out, grouped_layout=None) -> None:
        a, sa = lhs
        b, sb = rhs
        self._plan(a, sa, b, sb, out, grouped_layout)

    def matches(self, lhs, rhs, out, grouped_layout=None) -> bool:
        """True when these tensors have the example's signature (what a call assumes without checking)."""
        return _gemm_key(self.kind, lhs, rhs, out, grouped_layout, self.expected_m) == self._key

    def __repr__(self) -> str:
        return f"PreparedGemm(kind={self.kind!r}, config={self._plan.cfg})"


def _gemm_key(kind, lhs, rhs, out, gl, expected_m) -> tuple:
    tensors = (*lhs, *rhs, out) + (() if gl is None else (gl,))
    return (kind, expected_m, utils._num_sms_override) + tuple(
        (t.shape, t.stride(), t.dtype, t.device) for t in tensors)


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
    from . import ops
    from .validation import check_expected_m

    if kind not in ("dense", "contiguous", "masked", "psum"):
        raise ValueError(f"kind must be 'dense', 'contiguous', 'masked' or 'psum', got {kind!r}")
    if (grouped_layout is None) != (kind == "dense"):
        raise ValueError(f"prepare_gemm('dense', ...) takes no grouped_layout" if kind == "dense" else
                         f"prepare_gemm({kind!r}, ...) needs grouped_layout ({_LAYOUT_NAMES[kind]})")
    if kind == "masked" or (kind == "psum" and expected_m is not None):
        check_expected_m(expected_m)
    elif kind != "psum" and expected_m is not None:
        raise ValueError(f"expected_m is only for kind='masked' or 'psum', got {expected_m=} for {kind=}")
    extra = () if grouped_layout is None else ((grouped_layout, _LAYOUT_NAMES[kind]),)
    a, sa, b, sb = ops._operands(lhs, rhs, out, *extra)
    plan = GemmPlan(kind, a, sa, b, sb, out, grouped_layout, expected_m)
    return PreparedGemm(kind, plan, _gemm_key(kind, (a, sa), (b, sb), out, grouped_layout, expected_m), expected_m)


# ---------------------------------------------------------------------------------------------- quantisers
class QuantPlan:
    """One quantiser signature: ``kind`` ("per_token" | "per_block" | "silu"), checked and prepared.

    CPU (or a non-sm_90 GPU): calls the plain-torch implementation, as before. sm_90: allocates the outputs
    with the cached shapes / strides, packs ``QuantParams`` into the parameter slot and launches the fused
    kernel (vectorised when the input address is 16-byte aligned and the shape allows, as before)."""

    __slots__ = ("kind", "ue8m0", "fallback", "index", "device", "copy", "out_shape", "out_strides", "scale_shape",
                 "scale_strides", "consts", "grid", "vectorizable", "_launchers", "_config_args", "empty",
                 "out_proto", "scale_proto", "thread", "block", "call")

    def __init__(self, kind: str, x: torch.Tensor, check, fallback, ue8m0: bool):
        from .kernels import quant as kq

        check(x)
        self.kind, self.ue8m0 = kind, ue8m0
        self.fallback = fallback if kind == "silu" else (lambda t: fallback(t, ue8m0))
        self.call = self.fallback  # what a call runs: the fallback, or _launch once prepared for sm_90 below
        self.index = target.gpu_index(x.device)
        if self.index is not None and target.capability(self.index) != (9, 0):
            self.index = None
        if self.index is None:
            return
        kq._check_tensor(x, "w" if kind == "per_block" else "x", (2, 3))
        self.device = x.device
        _bind_driver()
        view = kq._rows_view(x)
        self.copy = view is not x
        self._launchers: dict[bool, object] = {}
        dtype = kq._INPUT_TYPES[x.dtype]
        if kind == "per_block":
            self._prepare_per_block(kq, view, dtype)
        else:
            self._prepare_per_token(kq, view, dtype)
        # 0-element prototypes (no memory): the outputs are made with their new_empty_strided.
        self.out_proto = torch.empty(0, dtype=_FP8, device=self.device)
        self.scale_proto = torch.empty(0, dtype=_F32, device=self.device)
        # The plan's own parameter block, written only by the thread that built the plan: the constants are
        # packed once here, a call writes the three pointers in front of them.
        self.thread = _get_ident()
        self.call = self._launch
        if not self.empty:
            from .runtime import driver

            self.block = driver.param_block(_QUANT_PARAMS.size)
            _QUANT_PARAMS.pack_into(self.block.view, 0, 0, 0, 0, *self.consts)
            empty = {"cpu": _empty_cpu, "cuda": _empty_cuda}.get(self.device.type)
            if not self.copy and empty is not None:
                self.call = self._fast_call(driver, empty)

    def _prepare_per_token(self, kq, x, dtype) -> None:
        name = "x"
        in_cols = x.shape[-1]
        if self.kind == "silu":
            if in_cols % 2:
                raise ValueError(f"{name} must have an even last dim (gate | up halves), got "
                                 f"{name}.shape={tuple(x.shape)}")
            cols, up_offset = in_cols // 2, in_cols // 2
            kind = kq.QuantKind.SILU_MUL_PER_TOKEN
        else:
            cols, up_offset = in_cols, 0
            kind = kq.QuantKind.PER_TOKEN
        if cols <= 0:
            raise ValueError(f"{name} must have at least one output column, got {name}.shape={tuple(x.shape)}")
        batch = x.shape[0] if x.dim() == 3 else 1
        m = x.shape[-2]
        groups = (cols + kq.GROUP - 1) // kq.GROUP
        aligned_m = kq._aligned_m(m)
        self.out_shape = (*x.shape[:-1], cols)
        self.out_strides = _contiguous_strides(self.out_shape)
        if x.dim() == 3:
            self.scale_shape, self.scale_strides = (batch, m, groups), (aligned_m * groups, 1, aligned_m)
        else:
            self.scale_shape, self.scale_strides = (m, groups), (1, aligned_m)
        rows = batch * m
        self.empty = rows == 0
        if self.empty:
            return
        units = rows * groups
        kq._check_size(units, rows, cols, name)
        row_stride = kq._row_stride(x)
        self.consts = (row_stride, cols, up_offset, aligned_m * groups, rows, cols, m, aligned_m)
        es = x.element_size()
        self.vectorizable = cols % 16 == 0 and (row_stride * es) % 16 == 0 and (up_offset * es) % 16 == 0
        units_per_block = kq.NUM_THREADS // 8
        self.grid = (units + units_per_block - 1) // units_per_block
        self._config_args = (kind, dtype)

    def _prepare_per_block(self, kq, w, dtype) -> None:
        batch = w.shape[0] if w.dim() == 3 else 1
        n, k = w.shape[-2], w.shape[-1]
        if k <= 0:
            raise ValueError(f"w must have at least one column, got w.shape={tuple(w.shape)}")
        nb, kb = (n + kq.GROUP - 1) // kq.GROUP, (k + kq.GROUP - 1) // kq.GROUP
        self.out_shape = tuple(w.shape)
        self.out_strides = _contiguous_strides(self.out_shape)
        self.scale_shape = (*w.shape[:-2], nb, kb)
        self.scale_strides = _contiguous_strides(self.scale_shape)
        blocks = batch * nb * kb
        self.empty = blocks == 0
        if self.empty:
            return
        kq._check_size(blocks, batch * n, k, "w")
        row_stride = kq._row_stride(w)
        self.consts = (row_stride, k, 0, nb * kb, batch * n, k, n, kb)
        self.vectorizable = k % 16 == 0 and (row_stride * w.element_size()) % 16 == 0
        self.grid = blocks
        self._config_args = (kq.QuantKind.PER_BLOCK, dtype)

    def _launcher(self, vectorized: bool):
        from .kernels import quant as kq
        from .runtime import driver

        config = kq.QuantKernelConfig(*self._config_args, vectorized, ue8m0=self.ue8m0)
        launcher = driver.PreparedLaunch(kq._kernel(config, self.index), _QUANT_PARAMS.size, grid=self.grid,
                                         block=config.num_threads, smem_bytes=config.smem_bytes)
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
        out_shape, out_strides, scale_shape, scale_strides = (self.out_shape, self.out_strides, self.scale_shape,
                                                              self.scale_strides)
        vectorizable = self.vectorizable
        launcher = self._launchers.get(vectorizable) or self._launcher(vectorizable)
        configs, kernel, index, thread = launcher._configs, launcher.kernel, self.index, self.thread
        finish = self._finish
        function, context = kernel.function, kernel.context
        block = self.block
        view, address = block.view, block.pointers_address
        pack = _QUANT_POINTERS.pack_into
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
            pack(view, 0, px, out.data_ptr(), scales.data_ptr())
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
        if self.copy:
            x = x.contiguous()
        # Two new tensors, each with its own storage (module docstring, "Quantiser outputs"); new_empty_strided
        # of a 0-element prototype skips parsing dtype= and device= (~0.15 µs each on the CI machine).
        out = self.out_proto.new_empty_strided(self.out_shape, self.out_strides)
        scales = self.scale_proto.new_empty_strided(self.scale_shape, self.scale_strides)
        if self.empty:
            return out, scales
        return self._finish(x, out, scales, x.data_ptr())

    def _finish(self, x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, px: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack the parameters of ``x`` -> ``(out, scales)`` and launch (``px`` = ``x.data_ptr()``)."""
        vectorized = self.vectorizable and not px & 15
        launcher = self._launchers.get(vectorized) or self._launcher(vectorized)
        if _get_ident() == self.thread:  # the constants are already in the plan's own block
            block = self.block
            _QUANT_POINTERS.pack_into(block.view, 0, px, out.data_ptr(), scales.data_ptr())
        else:  # another thread: the plan's block is not its to write; pack everything into its own slot
            block = _param_slot(_QUANT_PARAMS.size)
            _QUANT_PARAMS.pack_into(block.view, 0, px, out.data_ptr(), scales.data_ptr(), *self.consts)
        launcher.launch(block, target.current_stream(self.index))
        return out, scales


_quant_plans: dict[tuple, QuantPlan] = {}
# Every quantiser's hot lists (see quantiser), for clear().
_quant_hot: list[list] = []


def quantiser(kind: str, check, fallback):
    """The eager entry of quantiser ``kind`` ("per_token" | "per_block" | "silu"): ``entry(x, ue8m0)`` runs it
    through its plan when :func:`eager` allows and returns ``(out, scales)``, else None (nothing done).
    ``check(x)`` is the public op's check (run on a new signature), ``fallback`` its implementation for devices
    without the fused kernels (called as ``fallback(x, ue8m0)``, or ``fallback(x)`` for "silu"); ``ue8m0`` a
    bool (the caller checks its type).

    Hot path: per ``ue8m0`` a list of ``(guard.check, plan.call)``, newest first, at most
    ``_MAX_GUARDS_PER_WEIGHT`` — one C++ metadata check and one call per hit, the kind and the lists bound in
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
        guard = _guard(x)
        if guard is not None:
            entries = hot[ue8m0]
            entries.insert(0, (guard.check, plan.call))
            del entries[_MAX_GUARDS_PER_WEIGHT:]
        return plan.call(x)

    return entry
