"""The JIT + driver path on the GPU: compile (NVRTC) -> load -> encode tensor maps -> launch.

Kernels are in tests/gpu_kernels/; each takes one parameter struct, mirrored here by a ctypes.Structure
(the layout tests below run on the CPU, as does compiling the kernels). GPU tests (marked ``gpu``) are
skipped without an sm_90 device, with the reason:
  (a) ``scale.cu``: out[i] = a[i] * 2 + blockIdx.x — launch, params, dynamic-smem attribute, streams;
  (b) ``tma_roundtrip.cu``: TMA load of a box -> raw shared-memory dump -> TMA store through a second
      tensor map; validates encode_tensor_map (dtype, dims, strides, box, swizzle, OOB fill) against torch;
  (c) ``cluster_rank.cu``: a cluster launch (cluster=2) reads %cluster_ctarank / %cluster_nctarank.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
import torch

from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime.compiler import compile_kernel
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from tests._gpu import requires_sm90

KERNEL_DIR = Path(__file__).resolve().parents[1] / "gpu_kernels"


def gpu_test(fn):
    """Needs an sm_90 device: marked ``gpu`` (conftest skips it with the reason) and skipped by ``requires_sm90``."""
    return pytest.mark.gpu(requires_sm90(fn))


# ---------------------------------------------------------------------------------------- parameter mirrors
class ScaleParams(ctypes.Structure):
    """dfg_test::ScaleParams (scale.cu)."""

    _fields_ = [("a", ctypes.c_uint64), ("out", ctypes.c_uint64), ("n", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class TmaParams(ctypes.Structure):
    """dfg_test::TmaParams (tma_roundtrip.cu). TensorMap is alignas(64): the struct is padded to 320 bytes."""

    _fields_ = [
        ("load_map", ctypes.c_ubyte * 128),
        ("store_map", ctypes.c_ubyte * 128),
        ("smem_dump", ctypes.c_uint64),
        ("box_bytes", ctypes.c_uint32),
        ("boxes0", ctypes.c_uint32),
        ("boxes1", ctypes.c_uint32),
        ("box0", ctypes.c_uint32),
        ("box1", ctypes.c_uint32),
        ("box2", ctypes.c_uint32),
        ("_pad", ctypes.c_ubyte * 32),
    ]


class ClusterParams(ctypes.Structure):
    """dfg_test::ClusterParams (cluster_rank.cu)."""

    _fields_ = [("out", ctypes.c_uint64)]


# (mirror, kernel file, C++ struct name, kernel symbol)
MIRRORS = [
    (ScaleParams, "scale.cu", "ScaleParams", "dfg_test_scale"),
    (TmaParams, "tma_roundtrip.cu", "TmaParams", "dfg_test_tma_roundtrip"),
    (ClusterParams, "cluster_rank.cu", "ClusterParams", "dfg_test_cluster_rank"),
]


def _cxx_layout(path: Path, struct_name: str) -> tuple[int, dict[str, int]]:
    """sizeof and the documented field offsets (``// offset N`` comments) of a struct in a kernel file."""
    text = path.read_text()
    size = int(re.search(rf"static_assert\(sizeof\({struct_name}\) == (\d+)", text).group(1))
    body = re.search(rf"struct {struct_name} \{{(.*?)\n\}};", text, re.S).group(1)
    offsets = {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+);\s*// offset (\d+)", body)}
    return size, offsets


@pytest.mark.parametrize("mirror, filename, struct_name, symbol", MIRRORS, ids=[m[2] for m in MIRRORS])
def test_param_mirror_matches_the_cuda_struct(mirror, filename, struct_name, symbol):
    size, offsets = _cxx_layout(KERNEL_DIR / filename, struct_name)
    assert offsets, f"no '// offset N' comments found for {struct_name} in {filename}"
    assert ctypes.sizeof(mirror) == size, f"{mirror.__name__}: ctypes size {ctypes.sizeof(mirror)} != C++ {size}"
    for field, offset in offsets.items():
        assert getattr(mirror, field).offset == offset, f"{mirror.__name__}.{field}"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """kernel symbol -> CompiledKernel, built in a private JIT cache (compiling needs no GPU)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFG_JIT_CACHE_DIR", str(tmp_path_factory.mktemp("jit-cache")))
        yield {symbol: compile_kernel(symbol, (KERNEL_DIR / filename).read_text())
               for _, filename, _, symbol in MIRRORS}


def test_gpu_kernels_compile_for_sm90a(compiled):
    for symbol, kernel in compiled.items():
        assert kernel.cubin[:4] == b"\x7fELF", symbol
        assert kernel.resources.spill_store_bytes == 0, symbol


# ---------------------------------------------------------------------------------------- GPU helpers
@pytest.fixture
def device() -> int:
    dev = torch.cuda.current_device()
    torch.empty(1, device=dev)  # torch has initialised CUDA (its primary context) on the device
    return dev


def _load(compiled, symbol: str, device: int) -> drv.LoadedKernel:
    kernel = compiled[symbol]
    return drv.load_kernel(kernel.cubin, symbol, device, key=kernel.key)


def _stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


# ---------------------------------------------------------------------------------------- context, properties
@gpu_test
def test_primary_context_is_the_one_torch_uses(device):
    assert drv._current_context() == int(drv.primary_context(device)), (
        "torch's current context is not the device's primary context: kernels would not see torch's memory"
    )


@gpu_test
def test_device_properties_agree_with_torch(device):
    props = drv.device_properties(device)
    torch_props = torch.cuda.get_device_properties(device)
    assert props["compute_capability"] == (torch_props.major, torch_props.minor) == (9, 0)
    assert props["num_sms"] == torch_props.multi_processor_count
    assert props["max_smem_per_block_optin"] >= 227 * 1024  # Hopper: 227 KiB per block with opt-in
    assert props["cluster_launch"] is True


# ---------------------------------------------------------------------------------------- (a) simple launch
@gpu_test
def test_scale_kernel_output_matches_torch(compiled, device):
    kernel = _load(compiled, "dfg_test_scale", device)
    assert kernel.param_size == ctypes.sizeof(ScaleParams), "cuKernelGetParamInfo disagrees with the mirror"
    assert _load(compiled, "dfg_test_scale", device) is kernel

    n = SCALE_N
    a = torch.randn(n, device=device)
    out = torch.full((n,), float("nan"), device=device)
    params = ScaleParams(a=a.data_ptr(), out=out.data_ptr(), n=n)
    # 100 KB of dynamic shared memory (unused by the kernel) exercises the opt-in attribute (> 48 KiB).
    drv.launch(kernel, params, grid=(n + 127) // 128, block=128, smem_bytes=SCALE_SMEM_BYTES, stream=_stream(device))
    expected = a * 2 + (torch.arange(n, device=device) // 128).float()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)

    # the same launch from bytes, on a side stream, ordered after torch work on that stream
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))  # `a` was written on the current stream
    with torch.cuda.stream(side):
        b = a + 1
        out2 = torch.empty_like(out)
        params2 = ScaleParams(a=b.data_ptr(), out=out2.data_ptr(), n=n)
        drv.launch(kernel, bytes(params2), grid=(n + 127) // 128, block=128, smem_bytes=0, stream=side.cuda_stream)
    side.synchronize()
    torch.testing.assert_close(out2, b * 2 + (torch.arange(n, device=device) // 128).float(), rtol=0, atol=0)


@gpu_test
def test_make_resident_loads_a_lazily_loaded_kernel_in_its_context(compiled, device):
    """``precompile --check``'s warm start: ``make_resident`` finishes the load of a kernel (lazy loading leaves it
    to the first launch), leaves the caller's current context as it was, and the kernel then runs."""
    from cuda.bindings import driver as binding

    kernel = _load(compiled, "dfg_test_scale", device)
    before = drv._current_context()
    drv.make_resident(kernel)
    drv.make_resident(kernel)  # a loaded one: no effect
    assert drv._current_context() == before
    function = drv.check(binding.cuKernelGetFunction(kernel.kernel), "cuKernelGetFunction")
    assert int(drv.check(binding.cuFuncIsLoaded(function), "cuFuncIsLoaded")) == int(
        binding.CUfunctionLoadingState.CU_FUNCTION_LOADING_STATE_LOADED)
    a = torch.randn(SCALE_N, device=device)
    out = torch.empty_like(a)
    drv.launch(kernel, ScaleParams(a=a.data_ptr(), out=out.data_ptr(), n=SCALE_N), grid=(SCALE_N + 127) // 128,
               block=128, smem_bytes=0, stream=_stream(device))
    torch.testing.assert_close(out, a * 2 + (torch.arange(SCALE_N, device=device) // 128).float(), rtol=0, atol=0)


@gpu_test
def test_launch_checks_the_parameter_size_reported_by_the_driver(compiled, device):
    kernel = _load(compiled, "dfg_test_scale", device)
    with pytest.raises(ValueError, match="24-byte parameter struct, got 16 bytes"):
        drv.launch(kernel, bytes(16), grid=1, block=128, smem_bytes=0, stream=_stream(device))


# ---------------------------------------------------------------------------------------- (b) TMA round trip
def _unswizzle_offsets(rows: int, row_bytes: int, swizzle: TmaSwizzle) -> torch.Tensor:
    """Shared-memory byte offset of each (row, byte) of a box, as TMA writes it.

    Swizzle<B, 4, 3> on byte addresses (B = 3/2/1 for 128/64/32-byte swizzle; CuTe
    copy_traits_sm90_tma_swizzle.hpp): address bits [4, 4+B) ^= bits [7, 7+B), i.e. the 16-byte chunk
    index is XORed with the 128-byte line index modulo 8/4/2. The box starts 1024-byte aligned.
    """
    r = torch.arange(rows).view(-1, 1)
    j = torch.arange(row_bytes).view(1, -1)
    offset = r * row_bytes + j
    mask = swizzle.span_bytes // 16 - 1 if swizzle.span_bytes else 0
    return offset ^ (((offset >> 7) & mask) << 4)


# (torch dtype, TMA dtype, swizzle, box rows). The box is one swizzle span wide (128 bytes without swizzle),
# except (bf16, B32), which is the epilogue's D box exactly: 16 columns x the rows one math warpgroup stores
# (kernels/gemm.py tensor_map_args: (16, wg_rows, 1), wg_rows 64 or 128; tests/gpu/test_gpu_cases.py checks it).
TMA_CASES = [
    (torch.uint8, TmaDtype.UINT8, TmaSwizzle.B128, 64),
    (torch.bfloat16, TmaDtype.BFLOAT16, TmaSwizzle.B128, 64),
    (torch.bfloat16, TmaDtype.BFLOAT16, TmaSwizzle.B64, 64),
    (torch.bfloat16, TmaDtype.BFLOAT16, TmaSwizzle.B32, 128),
    (torch.bfloat16, TmaDtype.BFLOAT16, TmaSwizzle.B32, 64),
    (torch.uint8, TmaDtype.UINT8, TmaSwizzle.NONE, 64),
    (torch.float32, TmaDtype.FLOAT32, TmaSwizzle.NONE, 64),  # the sA maps' dtype
]
# Launches of the other kernels: scale.cu (grid, block, dynamic smem), cluster_rank.cu (grid, cluster sizes).
SCALE_N, SCALE_SMEM_BYTES = 1000, 100_000
CLUSTER_GRID, CLUSTER_SIZES = 8, [1, 2]
GPU_CASE_TABLES = (TMA_CASES, CLUSTER_SIZES)


class TmaGeometry:
    """The tensor, boxes and launch of one TMA round-trip case (shared with tests/gpu/test_gpu_cases.py).

    A [3, 100, 200-byte] tensor inside rows padded to 208 bytes: dimensions 0 and 1 both end mid-box.
    """

    d0_bytes, pitch, d1, d2 = 200, 208, 100, 3

    def __init__(self, torch_dtype, tma_dtype, swizzle, box_rows):
        self.torch_dtype, self.tma_dtype, self.swizzle = torch_dtype, tma_dtype, swizzle
        esize = torch.empty(0, dtype=torch_dtype).element_size()
        self.row_bytes = swizzle.span_bytes or 128  # one swizzle row per box row
        self.box = (self.row_bytes // esize, box_rows, 1)  # innermost first
        self.dims = (self.d0_bytes // esize, self.d1, self.d2)
        self.strides = (self.pitch, self.pitch * self.d1)
        self.boxes = (-(-self.dims[0] // self.box[0]), -(-self.d1 // self.box[1]), self.d2)
        self.num_blocks = self.boxes[0] * self.boxes[1] * self.boxes[2]

    def spec(self, address: int) -> TensorMapSpec:
        return TensorMapSpec(self.tma_dtype, address, self.dims, self.strides, self.box, self.swizzle)

    @property
    def box_bytes(self) -> int:
        return self.spec(0).box_bytes

    @property
    def smem_bytes(self) -> int:
        return -(-self.box_bytes // 1024) * 1024 + 1024  # box, then the mbarrier on its own 1 KiB


@gpu_test
@pytest.mark.parametrize("torch_dtype, tma_dtype, swizzle, box_rows", TMA_CASES,
                         ids=lambda v: getattr(v, "name", str(v)))
def test_tma_round_trip(compiled, device, torch_dtype, tma_dtype, swizzle, box_rows):
    kernel = _load(compiled, "dfg_test_tma_roundtrip", device)
    geo = TmaGeometry(torch_dtype, tma_dtype, swizzle, box_rows)
    box, boxes, num_blocks, row_bytes = geo.box, geo.boxes, geo.num_blocks, geo.row_bytes
    d0_bytes, pitch, d1, d2 = geo.d0_bytes, geo.pitch, geo.d1, geo.d2
    src = torch.randint(1, 256, (d2, d1, pitch), dtype=torch.uint8, device=device)  # no zero bytes
    dst = torch.full_like(src, 0xAB)

    def spec(tensor: torch.Tensor) -> TensorMapSpec:
        return geo.spec(tensor.data_ptr())

    load_spec, store_spec = spec(src.view(torch_dtype)), spec(dst.view(torch_dtype))
    box_bytes = load_spec.box_bytes
    dump = torch.full((num_blocks * box_bytes,), 0xCD, dtype=torch.uint8, device=device)
    load_map = drv.encode_tensor_map(load_spec)
    assert len(load_map) == 128
    assert drv.encode_tensor_map(load_spec) == load_map == drv.tensor_map_cache(load_spec), "encoding not deterministic"
    params = TmaParams(
        smem_dump=dump.data_ptr(), box_bytes=box_bytes, boxes0=boxes[0], boxes1=boxes[1],
        box0=box[0], box1=box[1], box2=box[2],
    )
    ctypes.memmove(params.load_map, load_map, 128)
    ctypes.memmove(params.store_map, drv.encode_tensor_map(store_spec), 128)
    drv.launch(kernel, params, grid=num_blocks, block=128, smem_bytes=geo.smem_bytes, stream=_stream(device))
    torch.cuda.synchronize(device)

    # 1. load -> store reproduces the tensor; the row padding (outside the tensor map) is never written.
    assert torch.equal(dst[..., :d0_bytes], src[..., :d0_bytes]), "TMA round trip changed the tensor"
    assert bool((dst[..., d0_bytes:] == 0xAB).all()), "TMA store wrote outside the tensor (OOB part of a box)"

    # 2. Each block's raw shared memory: the box of the tensor (zero-filled out of bounds), swizzled.
    offsets = _unswizzle_offsets(box[1], row_bytes, swizzle)
    padded = torch.zeros((d2, boxes[1] * box[1], boxes[0] * row_bytes), dtype=torch.uint8)
    padded[:, :d1, :d0_bytes] = src[..., :d0_bytes].cpu()
    dump = dump.cpu().view(num_blocks, box_bytes)
    for b in range(num_blocks):
        i0, i1, i2 = b % boxes[0], b // boxes[0] % boxes[1], b // (boxes[0] * boxes[1])
        expected = padded[i2, i1 * box[1]:(i1 + 1) * box[1], i0 * row_bytes:(i0 + 1) * row_bytes]
        got = dump[b][offsets]
        assert torch.equal(got, expected), (
            f"block {b} (box {i0},{i1},{i2}): shared-memory image != {swizzle.name}-swizzled box with zero OOB fill; "
            f"{int((got != expected).sum())} of {expected.numel()} bytes differ"
        )


@gpu_test
def test_binding_and_aligned_tensor_map_encodings_agree(device):
    # encode_tensor_map always encodes into a 64-byte-aligned buffer (the driver API's requirement); the
    # binding's own call writes into a CUtensorMap object that is only 16-byte aligned. Same bytes expected.
    from cuda.bindings import driver

    t = torch.empty((4, 256, 512), dtype=torch.bfloat16, device=device)
    spec = TensorMapSpec(TmaDtype.BFLOAT16, t.data_ptr(), (512, 256, 4), (1024, 1024 * 256), (64, 32, 1),
                         TmaSwizzle.B128)
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, binding_map = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType(int(spec.dtype)), spec.rank, spec.global_address,
        [u64(v) for v in spec.global_dims], [u64(v) for v in spec.global_strides], [u32(v) for v in spec.box_dims],
        [u32(1)] * spec.rank, driver.CUtensorMapInterleave(0), driver.CUtensorMapSwizzle(int(spec.swizzle)),
        driver.CUtensorMapL2promotion(int(spec.l2_promotion)), driver.CUtensorMapFloatOOBfill(int(spec.oob_fill)))
    if int(err) != 0:
        pytest.skip(f"this driver rejects the binding's unaligned output object ({err}); nothing to compare")
    assert drv.encode_tensor_map(spec) == ctypes.string_at(binding_map.getPtr(), 128), (
        "binding and aligned-buffer encodings differ"
    )


# ---------------------------------------------------------------------------------------- (c) clusters
@gpu_test
@pytest.mark.parametrize("cluster", CLUSTER_SIZES)
def test_cluster_launch(compiled, device, cluster):
    kernel = _load(compiled, "dfg_test_cluster_rank", device)
    grid = CLUSTER_GRID
    out = torch.full((2 * grid,), 0xFFFF, dtype=torch.int32, device=device)
    drv.launch(kernel, ClusterParams(out=out.data_ptr()), grid=grid, block=128, cluster=cluster, smem_bytes=0,
               stream=_stream(device))
    got = out.view(grid, 2).cpu()
    assert got[:, 0].tolist() == [b % cluster for b in range(grid)], "%cluster_ctarank"
    assert got[:, 1].tolist() == [cluster] * grid, "%cluster_nctarank (CTAs per cluster)"
