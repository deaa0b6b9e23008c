"""deep_fp8_gemm.runtime.driver on the CPU, against a fake ``cuda.bindings.driver``.

The fake records every call and returns what the real binding would; the binding's *types* (enums,
``cuuint64_t``, ``CUlaunchConfig``, ``CUtensorMap`` ...) are the real ones, which work without a GPU, so
the launch configs and argument lists checked here are exactly what the real driver would receive.
The GPU-side checks of the same paths are in tests/gpu/test_gpu_jit.py.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cuda.bindings import driver as real_driver

from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec, TmaDtype, TmaL2Promotion, TmaOobFill, TmaSwizzle

OK = real_driver.CUresult.CUDA_SUCCESS
INVALID_VALUE = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE


class FakeDriver:
    """Records calls; functions return ``(CUresult, *values)`` like cuda.bindings. Types come from the real module."""

    def __init__(self):
        self.calls: dict[str, list[tuple]] = collections.defaultdict(list)
        self.fail: dict[str, object] = {}  # function name -> CUresult to return
        self.current_ctx = 0
        self.ctx_stack: list[int] = []
        self.param_sizes = [384]  # cuKernelGetParamInfo sizes, one per parameter
        self.param_sizes_by_name: dict[str, list[int]] = {}  # kernels whose sizes differ from param_sizes
        self._kernel_names: dict[int, str] = {}
        self.launches: list[dict] = []
        self.tensor_map_out: list[int] = []  # output addresses of the tensor-map encodes
        self.attributes = {
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 233472,
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 50331648,
            real_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: 1,
        }

    def __getattr__(self, name):  # enums and types: the real binding's
        return getattr(real_driver, name)

    def _ret(self, name, *args, values=()):
        self.calls[name].append(args)
        return (self.fail.get(name, OK), *values)

    def cuInit(self, flags):
        return self._ret("cuInit", flags)

    def cuGetErrorName(self, err):
        return (OK, real_driver.CUresult(int(err)).name.encode())

    def cuGetErrorString(self, err):
        return (OK, b"fake description")

    def cuDeviceGet(self, ordinal):
        return self._ret("cuDeviceGet", ordinal, values=(real_driver.CUdevice(ordinal),))

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._ret("cuDevicePrimaryCtxRetain", int(dev), values=(real_driver.CUcontext(0x1000 + int(dev)),))

    def cuCtxGetCurrent(self):
        return self._ret("cuCtxGetCurrent", values=(real_driver.CUcontext(self.current_ctx),))

    def cuCtxSetCurrent(self, ctx):
        self.current_ctx = int(ctx)
        return self._ret("cuCtxSetCurrent", int(ctx))

    def cuCtxPushCurrent(self, ctx):
        self.ctx_stack.append(self.current_ctx)
        self.current_ctx = int(ctx)
        return self._ret("cuCtxPushCurrent", int(ctx))

    def cuCtxPopCurrent(self):
        popped = self.current_ctx
        self.current_ctx = self.ctx_stack.pop()
        return self._ret("cuCtxPopCurrent", values=(real_driver.CUcontext(popped),))

    def cuDeviceGetAttribute(self, attrib, dev):
        return self._ret("cuDeviceGetAttribute", attrib, int(dev), values=(self.attributes[attrib],))

    def cuDeviceGetName(self, length, dev):
        return self._ret("cuDeviceGetName", length, int(dev), values=(b"NVIDIA H200".ljust(length, b"\0"),))

    def cuDriverGetVersion(self):
        return self._ret("cuDriverGetVersion", values=(12080,))

    def cuLibraryLoadData(self, code, *options):
        n = len(self.calls["cuLibraryLoadData"])
        return self._ret("cuLibraryLoadData", bytes(code), *options, values=(real_driver.CUlibrary(0x2000 + n),))

    def cuLibraryGetKernel(self, library, name):
        n = len(self.calls["cuLibraryGetKernel"])
        self._kernel_names[0x3000 + n] = name.decode() if isinstance(name, bytes) else str(name)
        return self._ret("cuLibraryGetKernel", int(library), name, values=(real_driver.CUkernel(0x3000 + n),))

    def sizes_of(self, kernel) -> list[int]:
        return self.param_sizes_by_name.get(self._kernel_names.get(int(kernel), ""), self.param_sizes)

    def cuKernelGetParamInfo(self, kernel, index):
        self.calls["cuKernelGetParamInfo"].append((int(kernel), index))
        sizes = self.sizes_of(kernel)
        if index >= len(sizes):
            return (INVALID_VALUE, 0, 0)
        return (OK, sum(sizes[:index]), sizes[index])

    def cuKernelSetAttribute(self, attrib, value, kernel, dev):
        return self._ret("cuKernelSetAttribute", attrib, value, int(kernel), int(dev))

    def c_encode_tiled(self, out, *args):
        """Stands in for the ctypes ``cuTensorMapEncodeTiled`` (C signature; returns a CUresult int)."""
        self.calls["cuTensorMapEncodeTiled"].append(args)
        self.tensor_map_out.append(out)
        if "cuTensorMapEncodeTiled" in self.fail:
            return int(self.fail["cuTensorMapEncodeTiled"])
        ctypes.memmove(out, struct.pack("<16Q", *(0x0101010101010101 * (i + 1) for i in range(16))), 128)
        return 0

    def cuLaunchKernelEx(self, config, f, kernel_params, extra):
        # What the driver does: kernelParams is a void**; element 0 points at the parameter struct.
        assert isinstance(kernel_params, int), "kernelParams must be passed as the int address of a void*[1]"
        arg0 = ctypes.c_void_p.from_address(kernel_params).value
        size = self.sizes_of(int(f))[0]
        attrs = []
        for i in range(config.numAttrs):
            a = config.attrs[i]
            attrs.append((a.id, a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z))
        self.launches.append({
            "grid": (config.gridDimX, config.gridDimY, config.gridDimZ),
            "block": (config.blockDimX, config.blockDimY, config.blockDimZ),
            "smem": config.sharedMemBytes,
            "stream": int(config.hStream),
            "attrs": attrs,
            "function": int(f),
            "name": self._kernel_names.get(int(f)),
            "function_type": type(f),
            "params": ctypes.string_at(arg0, size),
            "params_address": arg0,
            "extra": extra,
            "context": self.current_ctx,
            "config": config,
        })
        return self._ret("cuLaunchKernelEx", config, f, kernel_params, extra)


@pytest.fixture
def fake(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(drv, "driver", fake)
    monkeypatch.setattr(drv, "_c_encode_tiled", fake.c_encode_tiled)
    drv._reset_for_tests()
    yield fake
    drv._reset_for_tests()


def spec_fp8_3d(**overrides) -> TensorMapSpec:
    fields = dict(
        dtype=TmaDtype.UINT8,
        global_address=0x7F0000001000,
        global_dims=(7168, 4096, 2),
        global_strides=(7168, 7168 * 4096),
        box_dims=(128, 64, 1),
        swizzle=TmaSwizzle.B128,
        l2_promotion=TmaL2Promotion.B256,
        oob_fill=TmaOobFill.ZERO,
    )
    fields.update(overrides)
    return TensorMapSpec(**fields)


# ---------------------------------------------------------------------------------------- init and errors
def test_ensure_initialized_without_driver_library_says_so():
    drv._reset_for_tests()
    try:
        real_driver.cuInit(0)
    except RuntimeError:
        pass
    else:
        pytest.skip("a CUDA driver library is present on this machine")
    with pytest.raises(RuntimeError, match=r"^no CUDA driver available: ") as info:
        drv.ensure_initialized()
    assert not isinstance(info.value, drv.CudaDriverError)
    assert drv._initialized is False


def test_ensure_initialized_calls_cuinit_once(fake):
    drv.ensure_initialized()
    drv.ensure_initialized()
    assert fake.calls["cuInit"] == [(0,)]


def test_cuinit_failure_is_a_named_driver_error(fake):
    fake.fail["cuInit"] = real_driver.CUresult.CUDA_ERROR_NO_DEVICE
    with pytest.raises(drv.CudaDriverError, match=r"cuInit\(0\) failed with CUDA_ERROR_NO_DEVICE \(100\)"):
        drv.ensure_initialized()
    assert drv._initialized is False


def test_check_unwraps_values(fake):
    assert drv.check((OK,), "x") is None
    assert drv.check((OK, 5), "x") == 5
    assert drv.check((OK, 5, 6), "x") == (5, 6)
    assert drv.check(OK, "x") is None


def test_check_raises_with_result_name_and_call(fake):
    with pytest.raises(drv.CudaDriverError) as info:
        drv.check((INVALID_VALUE, None), "cuSomething(arg=1)")
    err = info.value
    assert isinstance(err, RuntimeError)
    assert (err.name, err.result, err.what) == ("CUDA_ERROR_INVALID_VALUE", 1, "cuSomething(arg=1)")
    assert str(err) == "cuSomething(arg=1) failed with CUDA_ERROR_INVALID_VALUE (1): fake description"


def test_check_names_the_error_without_a_driver_library():
    # The real cuGetErrorName needs libcuda; the enum's own name is the fallback.
    with pytest.raises(drv.CudaDriverError, match=r"cuX\(\) failed with CUDA_ERROR_LAUNCH_FAILED \(719\)"):
        drv.check((real_driver.CUresult.CUDA_ERROR_LAUNCH_FAILED,), "cuX()")


# ---------------------------------------------------------------------------------------- tensor maps
@pytest.mark.parametrize(
    "spec",
    [
        spec_fp8_3d(),
        TensorMapSpec(TmaDtype.BFLOAT16, 0x10000, (4096, 256), (8192,), (64, 32), TmaSwizzle.B128,
                      TmaL2Promotion.NONE, TmaOobFill.NAN),
        TensorMapSpec(TmaDtype.FLOAT32, 0x20000, (1000,), (), (32,), TmaSwizzle.NONE, TmaL2Promotion.B64),
        spec_fp8_3d(dtype=TmaDtype.UINT16, box_dims=(32, 8, 1), swizzle=TmaSwizzle.B64),
    ],
    ids=["fp8-3d-sw128", "bf16-2d-nan", "f32-1d", "u16-3d-sw64"],
)
def test_encode_tensor_map_passes_the_spec_exactly(fake, spec):
    data = drv.encode_tensor_map(spec)
    (args,) = fake.calls["cuTensorMapEncodeTiled"]
    assert len(args) == 11
    dtype, rank, address, dims, strides, box, elem_strides, interleave, swizzle, l2, oob = args
    (out,) = fake.tensor_map_out
    assert out % 64 == 0, "the driver API requires a 64-byte-aligned tensorMap"

    assert dtype == int(spec.dtype) and rank == spec.rank and address == spec.global_address
    assert list(dims) == list(spec.global_dims) and isinstance(dims, ctypes.Array)
    assert list(strides)[: spec.rank - 1] == list(spec.global_strides)
    assert list(box) == list(spec.box_dims) and list(elem_strides) == [1] * spec.rank
    assert (dims._type_, strides._type_, box._type_) == (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32)
    assert interleave == 0 and swizzle == int(spec.swizzle) and l2 == int(spec.l2_promotion)
    assert oob == int(spec.oob_fill)

    # The 128 raw bytes of the CUtensorMap, in memory order.
    assert data == b"".join(struct.pack("<Q", 0x0101010101010101 * (i + 1)) for i in range(16))


_DRIVER_ENUM_NAMES = {
    TmaDtype: ("CUtensorMapDataType", {m: f"CU_TENSOR_MAP_DATA_TYPE_{m.name}" for m in TmaDtype}),
    TmaSwizzle: ("CUtensorMapSwizzle", {TmaSwizzle.NONE: "CU_TENSOR_MAP_SWIZZLE_NONE",
                                        TmaSwizzle.B32: "CU_TENSOR_MAP_SWIZZLE_32B",
                                        TmaSwizzle.B64: "CU_TENSOR_MAP_SWIZZLE_64B",
                                        TmaSwizzle.B128: "CU_TENSOR_MAP_SWIZZLE_128B"}),
    TmaL2Promotion: ("CUtensorMapL2promotion", {TmaL2Promotion.NONE: "CU_TENSOR_MAP_L2_PROMOTION_NONE",
                                                TmaL2Promotion.B64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
                                                TmaL2Promotion.B128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
                                                TmaL2Promotion.B256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}),
    TmaOobFill: ("CUtensorMapFloatOOBfill", {TmaOobFill.ZERO: "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
                                             TmaOobFill.NAN: "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"}),
}


@pytest.mark.parametrize("ours", list(_DRIVER_ENUM_NAMES), ids=lambda e: e.__name__)
def test_tensor_map_enums_equal_the_drivers(ours):
    # tensor_map.py's IntEnums are written down by hand (the simulator must not need cuda.bindings).
    cls_name, names = _DRIVER_ENUM_NAMES[ours]
    assert set(names) == set(ours), f"{ours.__name__}: a member has no driver counterpart in this table"
    for member, name in names.items():
        assert int(getattr(getattr(real_driver, cls_name), name)) == int(member), f"{ours.__name__}.{member.name}"


def test_binding_tensor_map_bytes_are_its_opaque_words():
    # encode_tensor_map reads the binding object's storage through getPtr(); check that is `opaque`.
    tensor_map = real_driver.CUtensorMap()
    words = [(i * 0x0123456789ABCDEF) & (2**64 - 1) for i in range(16)]
    tensor_map.opaque = [real_driver.cuuint64_t(w) for w in words]
    assert ctypes.string_at(tensor_map.getPtr(), 128) == struct.pack("<16Q", *words)


def test_invalid_spec_never_reaches_the_driver(fake):
    with pytest.raises(ValueError, match="swizzle span"):
        drv.encode_tensor_map(spec_fp8_3d(box_dims=(256, 64, 1)))
    assert not fake.calls["cuTensorMapEncodeTiled"]


def test_encode_error_names_result_and_spec(fake):
    fake.fail["cuTensorMapEncodeTiled"] = INVALID_VALUE
    with pytest.raises(drv.CudaDriverError, match=r"cuTensorMapEncodeTiled\(TensorMapSpec\(.*CUDA_ERROR_INVALID_VALUE"):
        drv.encode_tensor_map(spec_fp8_3d())


def test_tensor_map_cache_hit_skips_the_driver(fake):
    cache = drv.TensorMapCache(maxsize=2)
    a, b, c = spec_fp8_3d(), spec_fp8_3d(global_address=0x7F0000002000), spec_fp8_3d(box_dims=(64, 64, 1))
    first = cache.get(a)
    assert cache.get(spec_fp8_3d()) == first  # equal spec, new object: hit
    assert len(fake.calls["cuTensorMapEncodeTiled"]) == 1
    assert (cache.hits, cache.misses) == (1, 1)
    cache.get(b)
    cache.get(a)  # a is now most recent
    cache.get(c)  # evicts b
    assert len(cache) == 2
    assert len(fake.calls["cuTensorMapEncodeTiled"]) == 3
    cache.get(a)
    assert len(fake.calls["cuTensorMapEncodeTiled"]) == 3
    cache.get(b)
    assert len(fake.calls["cuTensorMapEncodeTiled"]) == 4
    assert drv.tensor_map_cache(a) == first  # the module-level cache works the same way


def test_tensor_map_cache_lookup_by_argument_tuple(fake):
    """The GEMM launch path keys by the spec's argument tuple and builds the spec only on a miss."""
    from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec

    cache = drv.TensorMapCache()
    spec = spec_fp8_3d()
    args = (spec.dtype, spec.global_address, spec.global_dims, spec.global_strides, spec.box_dims, spec.swizzle)
    assert TensorMapSpec(*args) == spec
    first = cache.lookup(args, args)
    assert cache.lookup(args, args) == first
    assert len(fake.calls["cuTensorMapEncodeTiled"]) == 1 and (cache.hits, cache.misses) == (1, 1)
    assert cache.get(spec) == first  # same encoding whichever key found it


# ---------------------------------------------------------------------------------------- kernels
def test_load_kernel_once_per_device_cubin_and_name(fake):
    cubin = b"\x7fELF fake cubin"
    k1 = drv.load_kernel(cubin, "dfg_k", 0)
    assert drv.load_kernel(cubin, "dfg_k", 0) is k1
    assert drv.load_kernel(bytes(cubin), "dfg_k", 0) is k1  # keyed by content, not identity
    k2 = drv.load_kernel(cubin, "dfg_k", 1)
    k3 = drv.load_kernel(cubin, "dfg_other", 0, key="jit-key")
    assert len({id(k1), id(k2), id(k3)}) == 3

    # The library is context-independent: one load per cubin key, whatever the device.
    assert [c[0] for c in fake.calls["cuLibraryLoadData"]] == [cubin, cubin]
    assert fake.calls["cuLibraryLoadData"][0][1:] == (None, None, 0, None, None, 0)
    assert [c[1] for c in fake.calls["cuLibraryGetKernel"]] == [b"dfg_k", b"dfg_k", b"dfg_other"]
    assert fake.calls["cuDevicePrimaryCtxRetain"] == [(0,), (1,)]
    assert fake.calls["cuInit"] == [(0,)]
    assert (k1.device, k2.device, k1.param_size) == (0, 1, 384)
    assert int(k1.context) == 0x1000 and int(k2.context) == 0x1001
    assert isinstance(k1.function, real_driver.CUfunction) and int(k1.function) == int(k1.kernel)
    assert fake.current_ctx == 0x1000  # a thread with no current context gets device 0's primary context


def test_load_kernel_keeps_the_callers_current_context(fake):
    fake.current_ctx = 0xABC
    drv.load_kernel(b"cubin", "k", 0)
    assert fake.current_ctx == 0xABC
    assert not fake.calls["cuCtxSetCurrent"]


def test_load_kernel_rejects_a_kernel_with_two_parameters(fake):
    fake.param_sizes = [8, 8]
    with pytest.raises(ValueError, match="more than one parameter"):
        drv.load_kernel(b"cubin", "k", 0)


def test_load_kernel_missing_symbol(fake):
    fake.fail["cuLibraryGetKernel"] = real_driver.CUresult.CUDA_ERROR_NOT_FOUND
    with pytest.raises(drv.CudaDriverError, match=r"cuLibraryGetKernel\('nope'\) failed with CUDA_ERROR_NOT_FOUND"):
        drv.load_kernel(b"cubin", "nope", 0)


def test_device_properties(fake):
    props = drv.device_properties(0)
    assert props == {
        "name": "NVIDIA H200",
        "compute_capability": (9, 0),
        "num_sms": 132,
        "max_smem_per_block_optin": 232448,
        "max_smem_per_sm": 233472,
        "l2_cache_bytes": 50331648,
        "cluster_launch": True,
    }
    n = len(fake.calls["cuDeviceGetAttribute"])
    assert drv.device_properties(0) is props
    assert len(fake.calls["cuDeviceGetAttribute"]) == n


# ---------------------------------------------------------------------------------------- launch
class Params(ctypes.Structure):
    """A stand-in for a kernel's parameter struct: a 128-byte tensor map, a pointer, two ints."""

    _fields_ = [("tensor_map", ctypes.c_uint64 * 16), ("out", ctypes.c_uint64), ("m", ctypes.c_int32),
                ("n", ctypes.c_int32)]


def test_launch_config_and_kernel_params(fake):
    fake.param_sizes = [ctypes.sizeof(Params)]
    kernel = drv.load_kernel(b"cubin", "k", 0)
    params = Params(out=0xDEADBEEF, m=3, n=4)
    params.tensor_map[:] = range(16)

    drv.launch(kernel, params, grid=132, block=384, smem_bytes=200_000, stream=0x5555)
    (launch,) = fake.launches
    assert launch["grid"] == (132, 1, 1) and launch["block"] == (384, 1, 1)
    assert launch["smem"] == 200_000 and launch["stream"] == 0x5555
    assert launch["attrs"] == [] and launch["config"].numAttrs == 0
    assert launch["function"] == int(kernel.kernel) and launch["function_type"] is real_driver.CUfunction
    assert launch["extra"] == 0
    # kernelParams[0] points at a 128-byte-aligned copy of the parameter struct.
    assert launch["params"] == bytes(params)
    assert launch["params_address"] % 128 == 0
    # the dynamic shared-memory limit was raised before the launch, for device 0
    (set_attr,) = fake.calls["cuKernelSetAttribute"]
    assert set_attr == (real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        200_000, int(kernel.kernel), 0)
    # a non-null stream carries its context: no context calls on the launch path
    assert fake.calls["cuCtxGetCurrent"] == [()]  # the one from load_kernel


def test_launch_cluster_attribute(fake):
    kernel = drv.load_kernel(b"cubin", "k", 0)
    drv.launch(kernel, bytes(384), grid=132, block=256, cluster=2, smem_bytes=0, stream=7)
    (launch,) = fake.launches
    assert launch["config"].numAttrs == 1
    assert launch["attrs"] == [(real_driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 2, 1, 1)]
    assert not fake.calls["cuKernelSetAttribute"]  # smem 0: nothing to raise


@pytest.mark.parametrize("kind", [bytes, bytearray, "structure"])
def test_launch_accepts_bytes_bytearray_and_structures(fake, kind):
    fake.param_sizes = [ctypes.sizeof(Params)]
    kernel = drv.load_kernel(b"cubin", "k", 0)
    params = Params(out=0x1234, m=-1, n=2**31 - 1)
    arg = params if kind == "structure" else kind(bytes(params))
    drv.launch(kernel, arg, grid=1, block=128, smem_bytes=0, stream=1)
    assert fake.launches[-1]["params"] == bytes(params)


def test_launch_rejects_wrong_parameter_size_and_type(fake):
    kernel = drv.load_kernel(b"cubin", "k", 0)
    with pytest.raises(ValueError, match="takes a 384-byte parameter struct, got 383 bytes"):
        drv.launch(kernel, bytes(383), grid=1, block=128, smem_bytes=0, stream=1)
    with pytest.raises(TypeError, match="params must be"):
        drv.launch(kernel, [0] * 384, grid=1, block=128, smem_bytes=0, stream=1)
    with pytest.raises(ValueError, match="cluster must be"):
        drv.launch(kernel, bytes(384), grid=3, block=128, cluster=2, smem_bytes=0, stream=1)
    assert not fake.launches


def test_launch_caches_configs_and_raises_smem_limit_once(fake):
    kernel = drv.load_kernel(b"cubin", "k", 0)
    for smem in (100_000, 100_000, 50_000, 200_000, 200_000):
        drv.launch(kernel, bytes(384), grid=132, block=384, smem_bytes=smem, stream=1)
    assert [c[1] for c in fake.calls["cuKernelSetAttribute"]] == [100_000, 200_000]
    configs = [launch["config"] for launch in fake.launches]
    assert configs[0] is configs[1] and configs[3] is configs[4] and configs[0] is not configs[2]


def test_launch_error_names_kernel_and_configuration(fake):
    kernel = drv.load_kernel(b"cubin", "dfg_gemm", 0)
    fake.fail["cuLaunchKernelEx"] = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(drv.CudaDriverError) as info:
        drv.launch(kernel, bytes(384), grid=132, block=384, cluster=2, smem_bytes=1024, stream=0x10)
    message = str(info.value)
    assert message.startswith(
        "cuLaunchKernelEx('dfg_gemm', grid=132, block=384, cluster=2, smem_bytes=1024, stream=0x10)")
    assert "CUDA_ERROR_INVALID_VALUE" in message


def test_launch_on_null_stream_runs_in_the_kernels_context(fake):
    kernel = drv.load_kernel(b"cubin", "k", 1)  # device 1: primary context 0x1001
    fake.current_ctx = 0x1000  # caller's current device is 0
    drv.launch(kernel, bytes(384), grid=1, block=128, smem_bytes=0, stream=0)
    assert fake.launches[-1]["context"] == 0x1001
    assert fake.current_ctx == 0x1000  # pushed for the launch, popped after
    fake.current_ctx = 0x1001
    drv.launch(kernel, bytes(384), grid=1, block=128, smem_bytes=0, stream=0)
    assert len(fake.calls["cuCtxPushCurrent"]) == 1  # already current: no push


def test_launch_pops_the_context_when_the_launch_raises(fake, monkeypatch):
    kernel = drv.load_kernel(b"cubin", "k", 1)
    fake.current_ctx = 0x1000

    def boom(*args):
        raise RuntimeError("binding failure")

    monkeypatch.setattr(fake, "cuLaunchKernelEx", boom)
    with pytest.raises(RuntimeError, match="binding failure"):
        drv.launch(kernel, bytes(384), grid=1, block=128, smem_bytes=0, stream=0)
    assert fake.current_ctx == 0x1000 and not fake.ctx_stack


def test_param_slot_is_aligned_and_grows():
    slot, size = drv._stage_params(bytes(range(200)))
    assert size == 200 and slot.address % 128 == 0
    assert ctypes.c_void_p.from_address(slot.pointers_address).value == slot.address
    big = bytes(9000)
    slot2, size2 = drv._stage_params(big)
    assert size2 == 9000 and slot2.capacity >= 9000 and slot2.address % 128 == 0


# ---------------------------------------------------------------------------------------- real binding, stub driver
# The fakes above stand in for cuda.bindings itself. This test keeps the real binding and replaces only
# libcuda.so.1 (tests/gpu_kernels/stub_libcuda.c), so the binding's own marshalling of our arguments
# into C (kernelParams as an int void**, CUlaunchConfig fields, the cluster attribute, tensor-map arrays)
# is what gets checked. A child process: the binding loads libcuda once per process.
_STUB_CHILD = r"""
import ctypes, json, os, struct, sys
from cuda.bindings import driver
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec, TmaDtype, TmaL2Promotion, TmaOobFill, TmaSwizzle

stub = ctypes.CDLL(os.path.join(sys.argv[1], "libcuda.so.1"))
def g(name, ctype):
    value = ctype.in_dll(stub, name)
    return list(value) if isinstance(value, ctypes.Array) else value.value

class Params(ctypes.Structure):
    _fields_ = [("tensor_map", ctypes.c_uint64 * 16), ("out", ctypes.c_uint64), ("rest", ctypes.c_uint32 * 62)]

out = {}
kernel = drv.load_kernel(b"\x7fELF-cubin", "dfg_k", 0)
out["kernel_name"] = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(stub, "g_kernel_name"))).decode()
out["code_head"] = bytes(g("g_code_head", ctypes.c_ubyte * 8)).hex()
out["param_size"] = kernel.param_size
params = Params(out=0xDEADBEEF)
params.tensor_map[:] = range(100, 116)
drv.launch(kernel, params, grid=132, block=384, cluster=2, smem_bytes=200000, stream=0x5555)
out["grid"], out["block"] = g("g_grid", ctypes.c_uint * 3), g("g_block", ctypes.c_uint * 3)
out["smem"], out["stream"] = g("g_smem", ctypes.c_uint), g("g_stream", ctypes.c_uint64)
out["num_attrs"], out["attr_id"] = g("g_num_attrs", ctypes.c_uint), g("g_attr_id", ctypes.c_int)
out["cluster"] = g("g_cluster", ctypes.c_uint * 3)
out["params_ok"] = bytes(g("g_params", ctypes.c_ubyte * 384)) == bytes(params)
out["params_align"] = g("g_params_ptr", ctypes.c_uint64) % 128
out["function"], out["extra"] = g("g_function", ctypes.c_uint64), g("g_extra", ctypes.c_uint64)
out["smem_attr"] = [g("g_smem_attr", ctypes.c_int), g("g_smem_value", ctypes.c_int), g("g_smem_device", ctypes.c_int)]
drv.launch(kernel, bytes(params), grid=4, block=128, smem_bytes=0, stream=0)
out["null_stream_launch"] = [g("g_launches", ctypes.c_int), g("g_num_attrs", ctypes.c_uint),
                             g("g_stream", ctypes.c_uint64)]

spec = TensorMapSpec(TmaDtype.BFLOAT16, 0x7F0000001000, (7168, 4096, 2), (14336, 14336 * 4096), (64, 32, 1),
                     TmaSwizzle.B128, TmaL2Promotion.B256, TmaOobFill.NAN)
data = drv.encode_tensor_map(spec)
out["tm_bytes_ok"] = data == b"".join(struct.pack("<Q", 0x0101010101010101 * (i + 1)) for i in range(16))
def tensor_map_args():
    i32, u32, u64 = ctypes.c_int, ctypes.c_uint, ctypes.c_uint64
    return [g("g_tm_dtype", i32), g("g_tm_rank", i32), g("g_tm_address", u64), g("g_tm_dims", u64 * 5)[:3],
            g("g_tm_strides", u64 * 4)[:2], g("g_tm_box", u32 * 5)[:3], g("g_tm_elem_strides", u32 * 5)[:3],
            g("g_tm_interleave", i32), g("g_tm_swizzle", i32), g("g_tm_l2", i32), g("g_tm_oob", i32)]
out["tm_args"] = tensor_map_args()
out["tm_calls"] = g("g_tm_calls", ctypes.c_int)
out["tm_out_align"] = g("g_tm_out", ctypes.c_uint64) % 64
# The binding's own call, as a reference: same arguments and bytes (its output object is not 64-byte aligned).
u64, u32 = driver.cuuint64_t, driver.cuuint32_t
err, binding_map = driver.cuTensorMapEncodeTiled(
    driver.CUtensorMapDataType(9), 3, spec.global_address, [u64(v) for v in spec.global_dims],
    [u64(v) for v in spec.global_strides], [u32(v) for v in spec.box_dims], [u32(1)] * 3,
    driver.CUtensorMapInterleave(0), driver.CUtensorMapSwizzle(3), driver.CUtensorMapL2promotion(3),
    driver.CUtensorMapFloatOOBfill(1))
out["binding_bytes_ok"] = int(err) == 0 and ctypes.string_at(binding_map.getPtr(), 128) == data
out["binding_tm_args"] = tensor_map_args()
# A driver that insists on a 64-byte-aligned tensorMap accepts our call at once.
os.environ["STUB_CUDA_STRICT_ALIGN"] = "1"
out["strict_bytes_ok"] = drv.encode_tensor_map(spec) == data
out["strict_tm_calls"] = g("g_tm_calls", ctypes.c_int)
out["strict_out_align"] = g("g_tm_out", ctypes.c_uint64) % 64
out["strict_tm_args"] = tensor_map_args()
out["props"] = drv.device_properties(0)
print(json.dumps(out))
"""


def test_real_binding_marshals_our_calls(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stub libcuda.so.1")
    source = Path(__file__).resolve().parents[1] / "gpu_kernels" / "stub_libcuda.c"
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(source)], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), STUB_CUDA_STRICT_ALIGN="0")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _STUB_CHILD, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["kernel_name"] == "dfg_k" and got["code_head"] == b"\x7fELF-cub".hex() and got["param_size"] == 384
    assert got["grid"] == [132, 1, 1] and got["block"] == [384, 1, 1]
    assert got["smem"] == 200000 and got["stream"] == 0x5555
    # one attribute: CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (4) = (2, 1, 1)
    assert got["num_attrs"] == 1 and got["attr_id"] == 4 and got["cluster"] == [2, 1, 1]
    assert got["params_ok"] and got["params_align"] == 0
    assert got["function"] == 0x3000 and got["extra"] == 0  # the CUkernel handle, cast to CUfunction
    assert got["smem_attr"] == [8, 200000, 0]  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES on device 0
    assert got["null_stream_launch"] == [2, 0, 0]
    assert got["props"]["num_sms"] == 132 and got["props"]["name"] == "Stub H200"
    tm_args = [9, 3, 0x7F0000001000, [7168, 4096, 2], [14336, 14336 * 4096], [64, 32, 1], [1, 1, 1], 0, 3, 3, 1]
    assert got["tm_bytes_ok"] and got["tm_args"] == tm_args
    assert got["tm_calls"] == 1 and got["tm_out_align"] == 0  # always the aligned buffer
    assert got["binding_bytes_ok"] and got["binding_tm_args"] == tm_args  # the binding's call agrees
    # strict driver (rejects an unaligned tensorMap): one call, accepted, same arguments and bytes
    assert got["strict_bytes_ok"] and got["strict_tm_args"] == tm_args
    assert got["strict_tm_calls"] == 3 and got["strict_out_align"] == 0


def test_rejected_cubin_names_driver_and_compiler_versions(fake):
    """A cubin the driver cannot load (typically: NVRTC newer than the driver) says which versions clash."""
    fake.fail["cuLibraryLoadData"] = real_driver.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    with pytest.raises(drv.CudaDriverError, match=r"CUDA_ERROR_UNSUPPORTED_PTX_VERSION.*driver supports CUDA 12\.8"):
        drv.load_kernel(b"\x7fELF not really", "k", 0)
