"""Fused quantisation kernels (include/deep_fp8_gemm/kernels/quant.cuh, jit/quant.cu, kernels/quant.py).

CPU checks:
* every variant compiles with NVRTC for sm_90a, with zero spills, no local memory and the e4m3x2 conversion
  (``F2FP``) in its SASS — the same static audit ``python -m deep_fp8_gemm audit --kind quant`` runs;
* the device code's index math, reductions and numerics run on the CPU: the kernel header is compiled with
  g++ against a minimal thread-per-thread stand-in for the hal (std::thread + std::barrier, an independent
  e4m3 rounding; one library for all 18 variants, ~3 s), driven through the real host code of
  kernels/quant.py (parameter struct, layouts, grid), and compared bit for bit with the torch quantisers of
  deep_fp8_gemm.quant; three variants also run through the project's CPU simulator (hal/sim.hpp);
* the host-side parameter mirror and argument errors.
GPU checks (sm_90 only): the fused kernels against the torch quantisers on the same GPU, bit for bit (SiLU·mul:
up to rare last-bit differences of expf), and CUDA-graph capture.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import deep_fp8_gemm.kernels.quant as kq
from deep_fp8_gemm.quant import per_block_cast_to_fp8_torch, per_token_cast_to_fp8_torch
from deep_fp8_gemm.runtime.paths import include_dir
from tests._gpu import requires_sm90
from tests._mutate import carry_simulator_entries


def _nvrtc_available() -> str | None:
    try:
        from deep_fp8_gemm.runtime.compiler import nvrtc_version

        nvrtc_version()
    except Exception as exc:  # noqa: BLE001 - any failure to load libnvrtc means "not available"
        return f"NVRTC unavailable: {exc}"
    return None


@pytest.fixture
def private_jit_cache(tmp_path, monkeypatch):
    from deep_fp8_gemm.runtime import cache

    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(tmp_path / "jit-cache"))
    monkeypatch.delenv("DFG_JIT_DISABLE_CACHE", raising=False)
    cache.clear_memory_cache()
    yield
    cache.clear_memory_cache()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _assert_silu_close(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]):
    """GPU SiLU: the kernel's expf (NVRTC's libdevice) and torch's CUDA exp (nvcc's) are the same routine in
    every toolkit seen so far, but nothing guarantees it across versions: allow 1-ulp fp32 differences of
    SiLU to flip a rare e4m3 rounding (<= 0.01% of values) or an amax-derived scale by an ulp."""
    (q, s), (rq, rs) = actual, expected
    mismatch = (_bits(q) != _bits(rq)).sum().item()
    assert mismatch <= max(1, q.numel() // 10_000), f"{mismatch} of {q.numel()} e4m3 values differ"
    torch.testing.assert_close(s, rs, rtol=2e-7, atol=0)


def _assert_same(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    (q, s), (rq, rs) = actual, expected
    assert q.shape == rq.shape and s.shape == rs.shape
    mismatch = (_bits(q) != _bits(rq)).sum().item()
    assert mismatch == 0, f"{mismatch} of {q.numel()} e4m3 values differ"
    assert torch.equal(s, rs), f"scales differ: max |diff| {(s - rs).abs().max().item()}"


# ---------------------------------------------------------------------------------------------- audit
def test_params_struct_mirror():
    assert ctypes.sizeof(kq.QuantParams) == 72
    offsets = [getattr(kq.QuantParams, name).offset for name, _ in kq.QuantParams._fields_]
    assert offsets == [0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68]


def test_render_names_are_stable_and_distinct():
    configs = [kq.QuantKernelConfig(k, t, v) for k in kq.QuantKind for t in kq.InputType for v in (True, False)]
    names = [kq.render_source(c)[0] for c in configs]
    assert len(set(names)) == len(configs)
    kq.render_source.cache_clear()
    assert [kq.render_source(c)[0] for c in configs] == names
    name, source = kq.render_source(configs[0])
    assert f"DFG_DEFINE_KERNEL({name}," in source and "{{" not in source


@pytest.mark.skipif(_nvrtc_available() is not None, reason=str(_nvrtc_available()))
def test_every_variant_compiles_without_spills(private_jit_cache):
    from deep_fp8_gemm.runtime.audit import audit
    from deep_fp8_gemm.runtime.sass import find_disassembler

    try:
        find_disassembler()
        have_sass = True
    except Exception:  # noqa: BLE001 - no nvdisasm/cuobjdump: compile-only audit
        have_sass = False
    all_targets = kq.audit_targets()
    # 6 kinds (per_token_32: the 1x32 recipe's) x 3 x 2 + 5 UE8M0 + 2 of the reference design's arithmetic (the
    # deep_gemm drop-in's casts)
    assert len(all_targets) == 43 and {t.kind for t in all_targets} == {"quant"}
    assert sum(t.config.get("numerics") == "deep_gemm_cuda" for t in all_targets) == 2
    # Every kind x {vectorised, scalar} in bf16, plus the vectorised fp16 / fp32 variants: the per-type code is
    # one load routine, and 18 compiles would take most of the CPU test budget on a 2-core machine.
    targets = [t for t in all_targets if t.config["input"] == "bf16" or t.config["vectorized"]
               and t.config["kind"] == "per_token"]
    if not have_sass:
        from deep_fp8_gemm.runtime.compiler import compile_kernel

        for t in targets:
            res = compile_kernel(t.name, t.source).resources
            assert res.spill_bytes == 0 and res.stack_bytes == 0, (t.config, res)
        pytest.skip("nvdisasm/cuobjdump not found: compiled and checked spills only, SASS not inspected")
    records = audit(targets, progress=False)
    for record in records:
        assert record["ok"], (record["config"], record["problems"])
        assert record["spill_bytes"] == 0 and record["stack_bytes"] == 0
        assert record["sass"]["F2FP"] > 0 and record["sass"]["STL"] == 0 and record["sass"]["LDL"] == 0
        # 256 threads at <= 128 registers keeps >= 2 CTAs per SM for the memory-bound loop
        assert record["registers"] <= 128, record


# ---------------------------------------------------------------------------------------------- CPU emulation
# A minimal stand-in for the hal, just enough for quant.cuh: one std::thread per CUDA thread, std::barrier
# for __syncthreads, and an e4m3 conversion written independently of torch (frexp + round-half-even,
# saturating at 448).
_HAL_STUB = r"""
#pragma once
#include "../common.cuh"
#include <barrier>
#include <cmath>
namespace dfg { namespace hal {
inline thread_local u32 t_tid, t_bid;
inline u8* g_smem;
inline std::barrier<>* g_cta;
inline u32 thread_idx() { return t_tid; }
inline u32 block_idx() { return t_bid; }
inline u8* dynamic_smem() { return g_smem; }
inline void sync_threads() { g_cta->arrive_and_wait(); }
// One launch at a time on the host: programmatic dependent launch has no earlier grid to wait for.
inline void grid_dependency_wait() {}
inline void launch_dependents() {}
inline u8 e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    const u8 sign = (__builtin_bit_cast(u32, f) >> 24) & 0x80;
    const float a = std::fabs(f);
    if (a >= 448.f) return sign | 0x7e;
    if (a < 0.015625f) return sign | u8(std::nearbyint(a * 512.f));  // subnormals, step 2^-9
    int e;
    const float m = std::frexp(a, &e) * 2.f;
    int mant = int(std::nearbyint((m - 1.f) * 8.f));
    e -= 1;
    if (mant == 8) { mant = 0; ++e; }
    const int code = ((e + 7) << 3) | mant;
    return sign | u8(code > 0x7e ? 0x7e : code);
}
inline u16 pack_e4m3x2(float lo, float hi) { return u16(e4m3(lo)) | u16(u16(e4m3(hi)) << 8); }
}}
"""

_DRIVER = r"""
#include <deep_fp8_gemm/kernels/quant.cuh>
#include <thread>
#include <vector>
using namespace dfg;
template <quant::QuantKind K, quant::InputType T, bool V>
void run(const quant::QuantParams& p, u32 grid) {
    constexpr u32 N = 256;
    std::vector<u8> smem(quant::quant_smem_bytes<N>() + 64);
    hal::g_smem = reinterpret_cast<u8*>((reinterpret_cast<unsigned long>(smem.data()) + 63) & ~63ul);
    std::barrier<> cta(N);
    hal::g_cta = &cta;
    for (u32 b = 0; b < grid; ++b) {
        std::vector<std::thread> threads;
        for (u32 t = 0; t < N; ++t)
            threads.emplace_back([&, t, b] { hal::t_tid = t; hal::t_bid = b; quant::quant_body<K, T, V, N>(p); });
        for (auto& t : threads) t.join();
    }
}
extern "C" void launch(int kind, int type, int vec, u32 grid, const quant::QuantParams* p) {
#define DFG_CASE(K, T, V) \
    if (kind == K && type == T && vec == V) run<(quant::QuantKind)K, (quant::InputType)T, V>(*p, grid);
#define DFG_TYPES(K, V) DFG_CASE(K, 0, V) DFG_CASE(K, 1, V) DFG_CASE(K, 2, V)
    DFG_TYPES(0, 1) DFG_TYPES(0, 0) DFG_TYPES(1, 1) DFG_TYPES(1, 0) DFG_TYPES(2, 1) DFG_TYPES(2, 0)
}
"""


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """kernels/quant.py's host code with the g++-built CPU emulation as the launcher (CPU tensors)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot build the CPU emulation of the quantisation kernels")
    root = tmp_path_factory.mktemp("quant_emulation")
    inc = root / "include"
    shutil.copytree(include_dir() / "deep_fp8_gemm", inc / "deep_fp8_gemm")
    (inc / "deep_fp8_gemm" / "hal" / "sim.hpp").write_text(_HAL_STUB)
    (root / "driver.cpp").write_text(_DRIVER)
    lib_path = root / "libquant_emulation.so"
    result = subprocess.run(
        [gxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-DDFG_SIMULATOR", f"-I{inc}", str(root / "driver.cpp"),
         "-o", str(lib_path), "-lpthread"],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0 and "barrier" in result.stderr and "No such file" in result.stderr:
        pytest.skip(f"g++ lacks C++20 <barrier>: {result.stderr[:200]}")
    assert result.returncode == 0, result.stderr
    lib = ctypes.CDLL(str(lib_path))

    def launch(config, params, grid, device):
        assert device.type == "cpu"
        lib.launch(int(config.kind), int(config.input_type), int(config.vectorized), grid, ctypes.byref(params))

    class Emulated:
        """The host code of kernels/quant.py (minus the CUDA device check) driving the CPU emulation."""

        per_token_cast_to_fp8_cuda = staticmethod(lambda x: kq.run_per_token(x, kq.QuantKind.PER_TOKEN, "x", launch))
        silu_mul_quant_cuda = staticmethod(lambda x: kq.run_per_token(x, kq.QuantKind.SILU_MUL_PER_TOKEN, "x", launch))
        per_block_cast_to_fp8_cuda = staticmethod(lambda w: kq.run_per_block(w, launch))

    return Emulated


_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_SHAPES = ((1, 128), (5, 256), (33, 200), (7, 48), (3, 7), (64, 384))


def _activations(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[0, : min(k, 128)] = 0  # an all-zero group: amax clamps to 1e-4
    if m > 2:
        x[2, min(3, k - 1)] = 6e4 if dtype == torch.float16 else 1e5  # one huge value flattens its group
    return x.to(dtype)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("m,k", _SHAPES)
def test_emulated_per_token_matches_torch(emulated, dtype, m, k):
    x = _activations(m, k, dtype, seed=m * 1000 + k)
    q, s = emulated.per_token_cast_to_fp8_cuda(x)
    assert s.stride() == (1, (m + 3) // 4 * 4), "scales must come out M-major and TMA-aligned"
    _assert_same((q, s), per_token_cast_to_fp8_torch(x))
    strided = torch.randn(m, k + 24).to(dtype)[:, 8 : 8 + k]  # row stride != k, 16-byte aligned start
    _assert_same(emulated.per_token_cast_to_fp8_cuda(strided), per_token_cast_to_fp8_torch(strided))


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("m,k", _SHAPES)
def test_emulated_silu_mul_matches_torch(emulated, dtype, m, k):
    x = (torch.randn(m, 2 * k, generator=torch.Generator().manual_seed(k)) * 4).to(dtype)
    q, s = emulated.silu_mul_quant_cuda(x)
    y = F.silu(x[:, :k].float()) * x[:, k:].float()
    _assert_same((q, s), per_token_cast_to_fp8_torch(y))


def test_emulated_batched_per_token(emulated):
    x = torch.randn(3, 5, 256, dtype=torch.bfloat16)
    q, s = emulated.per_token_cast_to_fp8_cuda(x)
    assert s.shape == (3, 5, 2) and s.stride() == (16, 1, 8)
    for g in range(3):
        _assert_same((q[g], s[g]), per_token_cast_to_fp8_torch(x[g]))
    q3, s3 = emulated.silu_mul_quant_cuda(torch.cat([x, x.flip(0)], dim=-1))
    for g in range(3):
        y = F.silu(x[g].float()) * x.flip(0)[g].float()
        _assert_same((q3[g], s3[g]), per_token_cast_to_fp8_torch(y))


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("n,k", ((128, 128), (300, 200), (7, 48), (130, 7)))
def test_emulated_per_block_matches_torch(emulated, dtype, n, k):
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 5).to(dtype)
    q, s = emulated.per_block_cast_to_fp8_cuda(w)
    assert s.is_contiguous()
    _assert_same((q, s), per_block_cast_to_fp8_torch(w))
    transposed = torch.randn(k, n).to(dtype).t()  # non-unit last stride: copied first
    _assert_same(emulated.per_block_cast_to_fp8_cuda(transposed), per_block_cast_to_fp8_torch(transposed))
    if dtype != torch.bfloat16:
        return  # the batched (per-expert) indexing does not depend on the input type
    experts = torch.randn(2, n, k).to(dtype)
    q3, s3 = emulated.per_block_cast_to_fp8_cuda(experts)
    for e in range(2):
        _assert_same((q3[e], s3[e]), per_block_cast_to_fp8_torch(experts[e]))


def test_emulated_empty_inputs(emulated):
    q, s = emulated.per_token_cast_to_fp8_cuda(torch.empty(0, 256, dtype=torch.bfloat16))
    assert q.shape == (0, 256) and s.shape == (0, 2)
    q, s = emulated.per_block_cast_to_fp8_cuda(torch.empty(0, 256, dtype=torch.bfloat16))
    assert q.shape == (0, 256) and s.shape == (0, 2)


# ---------------------------------------------------------------------------------------------- simulator
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found: the CPU simulator cannot build kernels")
def test_real_simulator_runs_the_rendered_kernels(private_jit_cache, tmp_path):
    """The exact translation units NVRTC compiles, built with -DDFG_SIMULATOR against hal/sim.hpp (which also
    checks shared-memory bounds and barrier use), one build per kind (~5 s each, hence only three)."""
    from deep_fp8_gemm.simulator.runner import launch as sim_launch

    carry_simulator_entries(tmp_path / "jit-cache")  # the session's runtime and prelude: only the kernels are built

    def launch(config, params, grid, device):
        name, source = kq.render_source(config)
        sim_launch(name, source, bytes(params), grid=grid, block=config.num_threads, cluster=1,
                   smem_bytes=config.smem_bytes)

    x = _activations(40, 384, torch.bfloat16, seed=7)
    _assert_same(kq.run_per_token(x, kq.QuantKind.PER_TOKEN, "x", launch), per_token_cast_to_fp8_torch(x))
    gate_up = torch.randn(9, 512, dtype=torch.bfloat16) * 3
    y = F.silu(gate_up[:, :256].float()) * gate_up[:, 256:].float()
    _assert_same(kq.run_per_token(gate_up, kq.QuantKind.SILU_MUL_PER_TOKEN, "x", launch), per_token_cast_to_fp8_torch(y))
    w = torch.randn(300, 200, dtype=torch.bfloat16)  # k % 16 != 0: the scalar variant, partial edge blocks
    _assert_same(kq.run_per_block(w, launch), per_block_cast_to_fp8_torch(w))


# ---------------------------------------------------------------------------------------------- errors
def test_argument_errors():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        kq.per_token_cast_to_fp8_cuda([1.0])
    with pytest.raises(TypeError, match="x.dtype=torch.int32"):
        kq.per_token_cast_to_fp8_cuda(torch.zeros(2, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="rank"):
        kq.per_block_cast_to_fp8_cuda(torch.zeros(128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="CUDA tensor"):
        kq.silu_mul_quant_cuda(torch.zeros(2, 256, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------- GPU
# Every input the GPU tests quantise, as (m, k, dtype); tests/gpu/test_gpu_cases.py runs the host path of each on
# the CPU (checks, kernel config, grid) with a launcher that only validates the launch.
GPU_BIT_EXACT_SHAPES = [(1, 7168), (128, 7168), (4096, 2048), (33, 200), (5, 48), (3, 7)]
GPU_PUBLIC_SHAPE = (256, 7168)
GPU_GRAPH_SHAPE = (64, 1024)  # silu_mul input [m, 2I]
GPU_CASE_TABLES = (_DTYPES, GPU_BIT_EXACT_SHAPES)


def gpu_quant_inputs() -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(function, input shape, dtype) of every fused-kernel call of the GPU tests below."""
    calls = []
    for dtype in _DTYPES:
        for m, k in GPU_BIT_EXACT_SHAPES:
            calls += [("per_token", (m, k), dtype), ("per_block", (m, k), dtype), ("silu_mul", (m, 2 * k), dtype)]
    calls += [("per_token", GPU_PUBLIC_SHAPE, torch.bfloat16), ("per_block", GPU_PUBLIC_SHAPE, torch.bfloat16),
              ("silu_mul", GPU_GRAPH_SHAPE, torch.bfloat16)]
    return calls


@requires_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("m,k", GPU_BIT_EXACT_SHAPES)
def test_gpu_kernels_bit_exact(dtype, m, k):
    x = _activations(m, k, dtype, seed=k).cuda()
    _assert_same(kq.per_token_cast_to_fp8_cuda(x), per_token_cast_to_fp8_torch(x))
    _assert_same(kq.per_block_cast_to_fp8_cuda(x), per_block_cast_to_fp8_torch(x))
    gate_up = (torch.randn(m, 2 * k, device="cuda") * 4).to(dtype)
    y = F.silu(gate_up[:, :k].float()) * gate_up[:, k:].float()
    _assert_silu_close(kq.silu_mul_quant_cuda(gate_up), per_token_cast_to_fp8_torch(y))


@requires_sm90
@pytest.mark.gpu
def test_gpu_public_quantisers_use_the_fused_kernels():
    import deep_fp8_gemm

    x = torch.randn(*GPU_PUBLIC_SHAPE, dtype=torch.bfloat16, device="cuda")
    q, s = deep_fp8_gemm.per_token_cast_to_fp8(x)
    assert s.stride() == (1, 256)
    _assert_same((q, s), per_token_cast_to_fp8_torch(x))
    _assert_same(deep_fp8_gemm.per_block_cast_to_fp8(x), per_block_cast_to_fp8_torch(x))


@requires_sm90
@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x = torch.randn(*GPU_GRAPH_SHAPE, dtype=torch.bfloat16, device="cuda")
    kq.silu_mul_quant_cuda(x)  # compile + load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = kq.silu_mul_quant_cuda(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    y = F.silu(x[:, :512].float()) * x[:, 512:].float()
    _assert_silu_close((q, s), per_token_cast_to_fp8_torch(y))
