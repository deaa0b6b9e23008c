"""CUDA driver API for the JIT kernels: lazy init, kernel loading, TMA tensor maps, ``cuLaunchKernelEx``.

Everything goes through ``cuda.bindings.driver`` (cuda-python), referenced as the module attribute
``driver`` so tests can swap in a fake. Every ``CUresult`` is checked; failures raise
:class:`CudaDriverError` carrying the result's name and the call.

Contexts. The CUDA runtime, and so torch, runs every device in that device's *primary context*;
:func:`primary_context` retains exactly that context (``cuDevicePrimaryCtxRetain``, idempotent
whether torch initialised the device first or not; never released, like the runtime's own), so
this module needs no torch import and shares its memory, streams and kernels with torch.

Loading. Kernels are loaded with ``cuLibraryLoadData`` + ``cuLibraryGetKernel`` (CUDA >= 12.0):
a ``CUlibrary`` is context-independent, so one load serves every device and thread, and a
``CUkernel`` launched by ``cuLaunchKernelEx`` (cast to ``CUfunction``, as the driver API documents)
runs in the context of the launch stream. ``cuModuleLoadData`` would bind the function to whichever
context is current at load time, which is the wrong one whenever the caller's current device differs.

Launch ABI. Every kernel takes ONE ``__grid_constant__`` parameter struct by value
(``DFG_DEFINE_KERNEL`` in include/deep_fp8_gemm/hal/ptx.cuh). ``kernelParams`` is therefore a
``void*[1]`` whose element points at the struct bytes. cuda.bindings accepts ``kernelParams`` as
``None``, an ``int`` (taken verbatim as the ``void**``), a buffer-protocol object, or a
``((values...), (ctypes types...))`` pair that it marshals on every call
(``_HelperKernelParams.__cinit__`` in cuda/bindings/_lib/utils.pxi). We pass the ``int`` address of
a preallocated per-thread ``c_void_p[1]`` that points at a per-thread 128-byte-aligned copy of the
params: no allocation and no marshalling per call. The driver copies the parameters when the launch
is enqueued, so the buffer is free again as soon as ``cuLaunchKernelEx`` returns.

NOTES (host costs, cuda-bindings 13.4.4 on the 2-core CI machine, driver replaced by the stub
tests/gpu_kernels/stub_libcuda.c, so the real driver's own work is not included): a whole
:func:`launch` costs ~2-3 us (the binding's cuLaunchKernelEx with an int kernelParams ~0.4-0.8 us;
its tuple form ~1-1.8 us); building a ``CUlaunchConfig`` costs ~0.8 us, ~4.7 us with a cluster
attribute, hence the config cache (~0.1 us per hit); staging 384 bytes of params ~0.1 us (bytes) to
~0.7 us (ctypes.Structure); the ``cuCtxGetCurrent`` check of a null-stream launch ~0.5 us.
:func:`encode_tensor_map` costs ~6-10 us (``spec.validate`` ~3 us, argument objects, the copy-out),
a :class:`TensorMapCache` hit ~1-1.5 us: keep maps of unchanging tensors (weights) in the cache.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import threading
from typing import Any

from cuda.bindings import driver

from .tensor_map import TensorMapSpec

TENSOR_MAP_BYTES = 128
# Parameter blocks are copied into 128-byte-aligned thread-local storage (CUtensorMap alignment).
_PARAM_ALIGN = 128
_MAX_CLUSTER = 8  # portable cluster size limit (larger needs CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)
_MAX_CACHED_CONFIGS = 4096
_tls = threading.local()  # per-thread parameter slot and tensor-map output buffer


# ---------------------------------------------------------------------------------------- errors
class CudaDriverError(RuntimeError):
    """A CUDA driver call returned an error.

    Attributes:
        what: the call, with its salient arguments.
        result: the ``CUresult`` as an int.
        name: its name, e.g. ``"CUDA_ERROR_INVALID_VALUE"``.
    """

    def __init__(self, what: str, result: int, name: str, description: str = ""):
        self.what = what
        self.result = result
        self.name = name
        detail = f": {description}" if description else ""
        super().__init__(f"{what} failed with {name} ({result}){detail}")


def _error_text(err: Any) -> tuple[str, str]:
    """Name and description of a CUresult; falls back to the enum's own name if the driver can't say."""
    name = description = ""
    try:
        e, raw = driver.cuGetErrorName(err)
        if int(e) == 0 and raw:
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
        e, raw = driver.cuGetErrorString(err)
        if int(e) == 0 and raw:
            description = raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:  # no driver library, or the error code itself is unknown to it
        pass
    if not name:
        name = getattr(err, "name", None) or f"CUresult({int(err)})"
    return name, description


def _raise(err: Any, what: str) -> None:
    name, description = _error_text(err)
    raise CudaDriverError(what, int(err), name, description)


def check(result: Any, what: str) -> Any:
    """Unwraps a cuda.bindings return value, raising :class:`CudaDriverError` on a failed ``CUresult``.

    cuda.bindings calls return ``(err, *values)``. Returns None for no values, the value for one,
    the tuple of values for several. A bare ``CUresult`` is accepted too.
    """
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != 0:  # CUresult is an int enum (IntEnum / FastEnum): CUDA_SUCCESS == 0
        _raise(err, what)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------------------------------- init, contexts
_lock = threading.RLock()  # guards every cache below except the lock-free fast-path reads
_initialized = False
_contexts: dict[int, Any] = {}


def ensure_initialized() -> None:
    """``cuInit(0)``, once per process (thread-safe; later calls cost one global read).

    Raises:
        RuntimeError: ``"no CUDA driver available: ..."`` when the driver library is missing.
        CudaDriverError: cuInit failed (e.g. ``CUDA_ERROR_NO_DEVICE``).
    """
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        try:
            result = driver.cuInit(0)
        except (RuntimeError, OSError) as exc:  # cuda.pathfinder's DynamicLibNotFoundError is a RuntimeError
            raise RuntimeError(f"no CUDA driver available: {exc}") from exc
        check(result, "cuInit(0)")
        _initialized = True


def primary_context(device: int) -> Any:
    """The primary ``CUcontext`` of ``device`` (the one the CUDA runtime and torch use), retained once."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    ensure_initialized()
    with _lock:
        ctx = _contexts.get(device)
        if ctx is None:
            dev = check(driver.cuDeviceGet(device), f"cuDeviceGet({device})")
            ctx = check(driver.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain(device={device})")
            _contexts[device] = ctx
    return ctx


def _current_context() -> int:
    return int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent()"))


def _make_current_if_none(ctx: Any) -> None:
    """Makes ``ctx`` current on this thread if no context is (never displaces the caller's context)."""
    if _current_context() == 0:
        check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent(primary context)")


# ---------------------------------------------------------------------------------------- device properties
_properties: dict[int, dict] = {}


def device_properties(device: int) -> dict:
    """Properties of ``device`` (cached per process).

    Returns a dict with ``name`` (str), ``compute_capability`` ((major, minor)), ``num_sms``,
    ``max_smem_per_block_optin`` (bytes of dynamic + static shared memory one block may opt in to),
    ``max_smem_per_sm``, ``l2_cache_bytes`` and ``cluster_launch`` (bool).
    """
    props = _properties.get(device)
    if props is not None:
        return props
    ensure_initialized()
    dev = check(driver.cuDeviceGet(device), f"cuDeviceGet({device})")
    attr = driver.CUdevice_attribute

    def get(a: Any) -> int:
        return int(check(driver.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name}, device={device})"))

    raw_name = check(driver.cuDeviceGetName(256, dev), f"cuDeviceGetName(device={device})")
    props = {
        "name": raw_name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name),
        "compute_capability": (
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        "num_sms": get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "max_smem_per_block_optin": get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        "max_smem_per_sm": get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        "l2_cache_bytes": get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        "cluster_launch": bool(get(attr.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)),
    }
    with _lock:
        return _properties.setdefault(device, props)


# ---------------------------------------------------------------------------------------- kernels
class LoadedKernel:
    """One ``extern "C"`` kernel of a loaded cubin, ready to launch on ``device``.

    Attributes:
        name: entry symbol.
        key: cache key of the cubin (the JIT cache key, or its sha256).
        device: device ordinal the launch attributes were set for.
        library: the ``CUlibrary`` (context-independent; shared by every device).
        kernel: the ``CUkernel``.
        function: the same handle as a ``CUfunction``, the type ``cuLaunchKernelEx`` takes.
        context: the device's primary ``CUcontext``.
        param_size: bytes of the kernel's single parameter (``cuKernelGetParamInfo``), or None
            if the driver could not say; launches check the parameter block against it.
    """

    __slots__ = ("name", "key", "device", "library", "kernel", "function", "context", "param_size",
                 "max_dynamic_smem", "_context_handle")

    def __init__(self, name: str, key: str, device: int, library: Any, kernel: Any, context: Any,
                 param_size: int | None):
        self.name = name
        self.key = key
        self.device = device
        self.library = library
        self.kernel = kernel
        self.function = driver.CUfunction(int(kernel))
        self.context = context
        self._context_handle = int(context)
        self.param_size = param_size
        self.max_dynamic_smem = 0  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as last set

    def set_max_dynamic_smem(self, smem_bytes: int) -> None:
        """Raises the kernel's dynamic shared-memory limit on ``device`` to ``smem_bytes``."""
        check(
            driver.cuKernelSetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes,
                self.kernel,
                check(driver.cuDeviceGet(self.device), f"cuDeviceGet({self.device})"),
            ),
            f"cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem_bytes}, kernel={self.name!r}, "
            f"device={self.device})",
        )
        self.max_dynamic_smem = smem_bytes

    def __repr__(self) -> str:
        return f"LoadedKernel(name={self.name!r}, device={self.device}, param_size={self.param_size})"


# key -> (CUlibrary, cubin). The cubin is kept alive with its library: with lazy loading the driver
# may read the image after cuLibraryLoadData returns (the API does not promise a copy).
_libraries: dict[str, tuple[Any, bytes]] = {}
_kernels: dict[tuple[int, str, str], LoadedKernel] = {}


def driver_version() -> int:
    """``cuDriverGetVersion``: 1000 * major + 10 * minor of the CUDA version the driver supports."""
    ensure_initialized()
    return int(check(driver.cuDriverGetVersion(), "cuDriverGetVersion()"))


def _library(key: str, cubin: bytes) -> Any:
    entry = _libraries.get(key)
    if entry is None:
        what = f"cuLibraryLoadData(cubin of {len(cubin)} bytes, key={key[:16]})"
        try:
            library = check(driver.cuLibraryLoadData(cubin, None, None, 0, None, None, 0), what)
        except CudaDriverError as exc:
            # The usual cause: a cubin from a newer CUDA than the driver supports (NVRTC 13.x needs a
            # CUDA 13 driver, r580+). Say so instead of leaving a bare CUresult.
            major = _nvrtc_major()
            hint = (f"the driver supports CUDA {_supported_cuda()}; cubins from NVRTC {major}.x "
                    f"need a driver for CUDA {major}.0 or newer (match nvidia-cuda-nvrtc to the driver)")
            raise CudaDriverError(what, exc.result, exc.name, hint) from exc
        entry = _libraries[key] = (library, cubin)
    return entry[0]


def _supported_cuda() -> str:
    try:
        version = driver_version()
    except Exception:  # the hint must never hide the original error
        return "?"
    return f"{version // 1000}.{version % 1000 // 10}"


def _nvrtc_major() -> str:
    try:
        from .compiler import nvrtc_version

        return str(nvrtc_version()[0])
    except Exception:  # the hint must never hide the original error
        return "?"


def _param_size(kernel: Any, name: str) -> int | None:
    """Size of the kernel's one parameter, or None if this driver/binding cannot report it.

    Raises:
        ValueError: the kernel takes more than one parameter (launch ABI violated).
    """
    get_info = getattr(driver, "cuKernelGetParamInfo", None)  # CUDA >= 12.4
    if get_info is None:
        return None
    try:
        first = get_info(kernel, 0)
    except RuntimeError:  # the binding raises when the driver lacks the entry point
        return None
    if first[0] != 0:
        return None
    if get_info(kernel, 1)[0] == 0:
        raise ValueError(f"kernel {name!r} takes more than one parameter; kernels take one parameter struct")
    return int(first[2])


def load_kernel(cubin: bytes, name: str, device: int, *, key: str | None = None) -> LoadedKernel:
    """Loads kernel ``name`` from ``cubin`` for ``device``; each (device, cubin, name) loads once.

    Args:
        cubin: an sm_90a CUBIN (never PTX: the driver may be older than the compiler).
        name: the ``extern "C"`` entry symbol.
        device: CUDA device ordinal (as torch numbers them).
        key: identifies the cubin (e.g. the JIT cache key); default its sha256.

    Raises:
        RuntimeError: no CUDA driver.
        CudaDriverError: the driver rejected the image or has no such symbol.
        ValueError: the kernel does not take exactly one parameter.
    """
    if key is None:
        key = hashlib.sha256(cubin).hexdigest()
    cache_key = (device, key, name)
    hit = _kernels.get(cache_key)
    if hit is not None:
        return hit
    ctx = primary_context(device)
    with _lock:
        hit = _kernels.get(cache_key)
        if hit is not None:
            return hit
        _make_current_if_none(ctx)
        library = _library(key, cubin)
        kernel = check(driver.cuLibraryGetKernel(library, name.encode()), f"cuLibraryGetKernel({name!r})")
        loaded = LoadedKernel(name, key, device, library, kernel, ctx, _param_size(kernel, name))
        _kernels[cache_key] = loaded
    return loaded


def make_resident(kernel: LoadedKernel) -> None:
    """Finish loading ``kernel`` onto its device now. With lazy loading (``CUDA_MODULE_LOADING=LAZY``, the
    default since CUDA 12.2) ``cuLibraryLoadData`` leaves the device-side load to the first launch;
    ``precompile --check`` times a boot's whole load, so it asks for it here: ``cuKernelGetFunction`` (the
    function in the kernel's primary context, pushed for the call: a CUkernel's function is per context) then
    ``cuFuncLoad`` (no effect on a loaded one)."""
    check(driver.cuCtxPushCurrent(kernel.context), "cuCtxPushCurrent(primary context)")
    try:
        function = check(driver.cuKernelGetFunction(kernel.kernel), f"cuKernelGetFunction({kernel.name!r})")
        check(driver.cuFuncLoad(function), f"cuFuncLoad({kernel.name!r})")
    finally:
        check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent()")


# ---------------------------------------------------------------------------------------- tensor maps
_c_encode_tiled = None  # ctypes function for cuTensorMapEncodeTiled, made on first use


def encode_tensor_map(spec: TensorMapSpec) -> bytes:
    """The 128 bytes of the ``CUtensorMap`` that ``cuTensorMapEncodeTiled`` makes of ``spec``.

    Interleave is NONE and element strides are all 1. The bytes go, unchanged, into a 64-byte-aligned
    ``dfg::TensorMap`` of a kernel's parameter struct.

    The driver API requires the output ``tensorMap`` to be 64-byte aligned. The binding's own
    ``cuTensorMapEncodeTiled`` writes into a ``CUtensorMap`` object that CPython allocates 16-byte
    aligned, so the call always goes through ctypes into a 128-byte-aligned per-thread buffer
    (tests/gpu/test_gpu_jit.py checks on the GPU that the bytes equal the binding's).

    Raises:
        ValueError: ``spec.validate()`` rejects the spec.
        CudaDriverError: the driver rejects it.
    """
    global _c_encode_tiled
    spec.validate()
    ensure_initialized()
    if _c_encode_tiled is None:
        # The library cuda.bindings loaded (dlopen by soname returns the same handle).
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        # CUresult cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t rank, void* address,
        #   const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
        #   const cuuint32_t* elementStrides, interleave, swizzle, l2Promotion, oobFill)  [enums are C ints]
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p] + [ctypes.c_void_p] * 4 + [
            ctypes.c_int] * 4
        _c_encode_tiled = fn
    rank = spec.rank
    out = getattr(_tls, "tensor_map_out", None)
    if out is None:
        raw = ctypes.create_string_buffer(2 * TENSOR_MAP_BYTES)
        out = _tls.tensor_map_out = (raw, (ctypes.addressof(raw) + TENSOR_MAP_BYTES - 1) & ~(TENSOR_MAP_BYTES - 1))
    err = _c_encode_tiled(
        out[1], int(spec.dtype), rank, spec.global_address,
        (ctypes.c_uint64 * rank)(*spec.global_dims),
        (ctypes.c_uint64 * max(rank - 1, 1))(*spec.global_strides),
        (ctypes.c_uint32 * rank)(*spec.box_dims),
        (ctypes.c_uint32 * rank)(*([1] * rank)),
        0, int(spec.swizzle), int(spec.l2_promotion), int(spec.oob_fill),
    )
    if err != 0:  # the message is formatted only on failure: the spec's repr costs more than the call
        try:
            err = driver.CUresult(err)
        except ValueError:  # a code this binding does not know: reported as CUresult(<int>)
            pass
        _raise(err, f"cuTensorMapEncodeTiled({spec})")
    return ctypes.string_at(out[1], TENSOR_MAP_BYTES)


class TensorMapCache:
    """Bounded LRU of encoded tensor maps, keyed by the (frozen, hashable) :class:`TensorMapSpec` or by
    the tuple of its constructor arguments (:meth:`lookup`, for per-call launch code that should not
    build spec objects on a hit).

    The encoding is a pure function of the spec (address included), so a hit is always correct,
    even when a freed tensor's address is reused by a tensor of the same shape. Thread-safe.
    """

    def __init__(self, maxsize: int = 4096, encode=None):
        if maxsize < 1:
            raise ValueError(f"TensorMapCache maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._encode = encode  # None: module-level encode_tensor_map, looked up per miss (patchable)
        self._entries: collections.OrderedDict[object, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, spec: TensorMapSpec) -> bytes:
        """The encoded map of ``spec``; calls the driver only on a miss."""
        return self.lookup(spec, spec)

    def lookup(self, key: object, spec: TensorMapSpec | tuple) -> bytes:
        """The encoded map cached under ``key``; on a miss ``spec`` (a :class:`TensorMapSpec`, or the tuple
        of its constructor arguments) is encoded."""
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return data
        if not isinstance(spec, TensorMapSpec):
            spec = TensorMapSpec(*spec)
        data = (self._encode or encode_tensor_map)(spec)
        with self._lock:
            self.misses += 1
            self._entries[key] = data
            if len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return data

    __call__ = get

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


tensor_map_cache = TensorMapCache()


# ---------------------------------------------------------------------------------------- launch
class _ParamSlot:
    """Per-thread parameter block: 128-byte-aligned storage and the ``void*[1]`` that points at it."""

    __slots__ = ("capacity", "address", "view", "pointers", "pointers_address", "_raw")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._raw = ctypes.create_string_buffer(capacity + _PARAM_ALIGN)
        self.address = (ctypes.addressof(self._raw) + _PARAM_ALIGN - 1) & ~(_PARAM_ALIGN - 1)
        self.view = memoryview((ctypes.c_ubyte * capacity).from_address(self.address)).cast("B")
        self.pointers = (ctypes.c_void_p * 1)(self.address)
        self.pointers_address = ctypes.addressof(self.pointers)


def _stage_params(params: Any) -> tuple[_ParamSlot, int]:
    """Copies ``params`` into this thread's slot; returns the slot and the byte count."""
    if isinstance(params, ctypes.Structure):
        size = ctypes.sizeof(params)
    elif isinstance(params, (bytes, bytearray)):
        size = len(params)
    else:
        raise TypeError(f"params must be bytes, bytearray or a ctypes.Structure, got {type(params).__name__}")
    slot = param_slot(size)
    if size:
        if isinstance(params, ctypes.Structure):
            ctypes.memmove(slot.address, ctypes.addressof(params), size)
        else:
            slot.view[:size] = params
    return slot, size


_configs: dict[tuple[int, int, int, int, int], Any] = {}


def _launch_config(grid: int, block: int, cluster: int, smem_bytes: int, stream: int, pdl: bool = False) -> Any:
    """A ``CUlaunchConfig`` for a 1-D launch (cached: built configs are never mutated). ``pdl``: a programmatic
    dependent launch (``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``): the kernel may start before the
    previous kernel of the stream has finished, and must execute ``griddepcontrol.wait`` before it touches memory
    that kernel may write (every deep_fp8_gemm kernel does; the audit's ``pdl`` field)."""
    key = (grid, block, cluster, smem_bytes, stream, pdl)
    config = _configs.get(key)
    if config is not None:
        return config
    if grid < 1 or block < 1 or smem_bytes < 0:
        raise ValueError(f"invalid launch shape: {grid=} {block=} {smem_bytes=}")
    if not 1 <= cluster <= _MAX_CLUSTER or grid % cluster:
        raise ValueError(f"cluster must be in [1, {_MAX_CLUSTER}] and divide grid: {cluster=} {grid=}")
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem_bytes
    config.hStream = driver.CUstream(stream)
    attrs = []
    if cluster > 1:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dim = attr.value.clusterDim
        dim.x, dim.y, dim.z = cluster, 1, 1
        attrs.append(attr)
    if pdl:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if attrs:
        config.attrs = attrs  # the binding copies the attributes into an array the config owns
    config.numAttrs = len(attrs)
    if len(_configs) >= _MAX_CACHED_CONFIGS:
        _configs.clear()
    _configs[key] = config
    return config


def launch(
    kernel: LoadedKernel,
    params: bytes | bytearray | ctypes.Structure,
    *,
    grid: int,
    block: int,
    cluster: int = 1,
    smem_bytes: int,
    stream: int,
    pdl: bool = False,
) -> None:
    """Enqueues ``kernel<<<grid, block, smem_bytes, stream>>>(params)`` with cluster size ``cluster``.

    Args:
        kernel: from :func:`load_kernel`.
        params: the bytes of the kernel's single parameter struct (copied before this returns).
        grid, block: 1-D grid (blocks) and block (threads) sizes; ``grid`` must be a multiple of ``cluster``.
        cluster: CTAs per cluster along x (1 = no cluster attribute).
        smem_bytes: dynamic shared memory per block; the kernel's limit is raised once as needed.
        stream: a ``CUstream`` handle as an int (``torch.cuda.current_stream(device).cuda_stream``);
            it must belong to ``kernel.device``. 0 is the legacy default stream of the context
            current on this thread; if that is not ``kernel.device``'s primary context, the launch
            runs with that context pushed.
        pdl: launch as a programmatic dependent launch (:func:`_launch_config`).

    Raises:
        TypeError / ValueError: bad ``params`` type or size, bad launch shape.
        CudaDriverError: the launch failed (the message names the kernel and the configuration).
    """
    slot, size = _stage_params(params)
    if kernel.param_size is not None and size != kernel.param_size:
        raise ValueError(f"kernel {kernel.name!r} takes a {kernel.param_size}-byte parameter struct, got {size} bytes")
    if smem_bytes > kernel.max_dynamic_smem:
        kernel.set_max_dynamic_smem(smem_bytes)
    _enqueue(kernel, _launch_config(grid, block, cluster, smem_bytes, stream, pdl), slot, stream, grid, block, cluster,
             smem_bytes)


def _enqueue(kernel: LoadedKernel, config: Any, slot: _ParamSlot, stream: int, grid: int, block: int, cluster: int,
             smem_bytes: int) -> None:
    """``cuLaunchKernelEx`` of ``kernel`` with ``config`` and the parameters staged in ``slot`` (null stream:
    in ``kernel.device``'s primary context, pushed if another one is current)."""
    pushed = False
    if stream == 0:
        err, current = driver.cuCtxGetCurrent()  # _current_context() inlined: this runs on every launch
        if err != 0:
            _raise(err, "cuCtxGetCurrent()")
        current = int(current)
        if current != kernel._context_handle:
            if current == 0:
                check(driver.cuCtxSetCurrent(kernel.context), "cuCtxSetCurrent(primary context)")
            else:
                check(driver.cuCtxPushCurrent(kernel.context), "cuCtxPushCurrent(primary context)")
                pushed = True
    try:
        err = driver.cuLaunchKernelEx(config, kernel.function, slot.pointers_address, 0)[0]
    finally:
        if pushed:
            check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent()")
    if err != 0:
        _raise(err, f"cuLaunchKernelEx({kernel.name!r}, {grid=}, {block=}, {cluster=}, {smem_bytes=}, "
                    f"stream={stream:#x})")


def param_slot(size: int) -> _ParamSlot:
    """This thread's 128-byte-aligned parameter block with room for ``size`` bytes; write the parameters into
    ``slot.view`` (a writable byte memoryview) and launch with :meth:`PreparedLaunch.launch`. Nothing else may
    launch on this thread in between (the block is shared by every launch of the thread)."""
    slot = getattr(_tls, "slot", None)
    if slot is None or slot.capacity < size:
        slot = _tls.slot = _ParamSlot(max(4096, size))
    return slot


def param_block(size: int) -> _ParamSlot:
    """A new 128-byte-aligned parameter block of ``size`` bytes owned by the caller (not this thread's shared
    slot): a prepared call keeps its constant parameters packed in one and rewrites only what changes per
    launch; only one thread at a time may write it and launch from it (the launch copies the bytes)."""
    return _ParamSlot(size)


class PreparedLaunch:
    """One kernel with a fixed launch shape and parameter size, checked once; per launch only the parameter
    bytes and the stream vary (the ``CUlaunchConfig`` is built once per stream).

    What :func:`launch` checks and does on every call (parameter size, shared-memory limit, launch shape) is
    done here at construction; each :meth:`launch` is the null-stream context check (as :func:`launch`) and
    ``cuLaunchKernelEx``.

    Raises (constructor): ValueError for a parameter size the kernel does not take or a bad launch shape;
    CudaDriverError if raising the shared-memory limit fails.
    """

    __slots__ = ("kernel", "grid", "block", "cluster", "smem_bytes", "param_size", "pdl", "_configs", "_function",
                 "_context", "_get_current", "_launch_ex")

    def __init__(self, kernel: LoadedKernel, param_size: int, *, grid: int, block: int, cluster: int = 1,
                 smem_bytes: int, pdl: bool = False):
        if kernel.param_size is not None and param_size != kernel.param_size:
            raise ValueError(f"kernel {kernel.name!r} takes a {kernel.param_size}-byte parameter struct, got "
                             f"{param_size} bytes")
        if smem_bytes > kernel.max_dynamic_smem:
            kernel.set_max_dynamic_smem(smem_bytes)
        self.kernel, self.grid, self.block, self.cluster = kernel, grid, block, cluster
        self.smem_bytes, self.param_size, self.pdl = smem_bytes, param_size, pdl
        self._configs: dict[int, Any] = {}
        _launch_config(grid, block, cluster, smem_bytes, 0)  # validates the shape now
        # What a launch calls, bound once (the binding is the module's ``driver`` now): launch() is every per-call
        # plan's launch, so its fast path costs no module or attribute lookups.
        self._function, self._context = kernel.function, kernel.context
        self._get_current, self._launch_ex = driver.cuCtxGetCurrent, driver.cuLaunchKernelEx

    def launch(self, slot: _ParamSlot, stream: int) -> None:
        """Enqueue the kernel with the first ``param_size`` bytes of ``slot`` (from :func:`param_slot`) on
        ``stream`` (same meaning as in :func:`launch`)."""
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = _launch_config(self.grid, self.block, self.cluster, self.smem_bytes,
                                                            stream, self.pdl)
        if stream == 0:  # null stream: launch here only if kernel.device's primary context is current
            err, current = self._get_current()
            if err or current != self._context:  # CUcontext == compares the handles
                _enqueue(self.kernel, config, slot, stream, self.grid, self.block, self.cluster, self.smem_bytes)
                return
        err = self._launch_ex(config, self._function, slot.pointers_address, 0)[0]
        if err:
            self.raise_error(err, stream)

    def raise_error(self, err: int, stream: int) -> None:
        """Raise CudaDriverError for ``cuLaunchKernelEx`` having returned ``err`` (for callers that inline
        :meth:`launch`'s fast path)."""
        _raise(err, f"cuLaunchKernelEx({self.kernel.name!r}, grid={self.grid}, block={self.block}, "
                    f"cluster={self.cluster}, smem_bytes={self.smem_bytes}, stream={stream:#x})")


def _reset_for_tests() -> None:
    """Forgets every cached handle (the driver objects themselves are not released)."""
    global _initialized
    with _lock:
        _initialized = False
        _contexts.clear()
        _properties.clear()
        _libraries.clear()
        _kernels.clear()
        _configs.clear()
        tensor_map_cache.clear()
    _tls.__dict__.clear()
