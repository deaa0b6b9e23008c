"""Fused cast-transpose kernels (CastTranspose / KGroupedTranspose in include/deep_fp8_gemm/kernels/quant.cuh).

CPU checks: the rendered translation units run in the project's simulator (hal/sim.hpp, shared memory poisoned
with NaN) through the real host code of kernels/quant.py (parameters, layouts, grid) and must match the torch
path of deep_fp8_gemm.cast_transpose bit for bit: odd m and k, m not a multiple of 128, empty groups, UE8M0,
every input dtype; planted bugs (a column amax over half the rows, an unswizzled read of the xᵀ tile, an
off-by-one group search) must make them fail. The sm_90a compile (zero spills, F2FP / LDG / STG in the SASS) is
tests/kernels/test_quant_kernels.py::test_every_variant_compiles_without_spills, which covers every quant kind.
GPU checks (sm_90 only): the same comparisons on the GPU, through the public functions, and CUDA-graph capture.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
import deep_fp8_gemm.kernels.quant as kq
from deep_fp8_gemm.cast_transpose import cast_transpose_torch, k_grouped_torch
from deep_fp8_gemm.utils import get_col_major_tma_aligned_tensor
from tests._gpu import requires_sm90

from tests._mutate import mutated_headers

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _mismatches(actual, expected) -> list[str]:
    """Names of the outputs whose shape, strides or bits differ (empty: identical)."""
    problems = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a.shape != e.shape or a.dtype != e.dtype:
            problems.append(f"output {i}: {tuple(a.shape)} {a.dtype} vs {tuple(e.shape)} {e.dtype}")
        elif a.numel() and not torch.equal(_bits(a).cpu(), _bits(e).cpu()):
            problems.append(f"output {i}: {(_bits(a).cpu() != _bits(e).cpu()).sum().item()} of {a.numel()} differ")
    return problems


def _input(m: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows and columns of different magnitudes (a scale taken along the wrong axis changes the bits), an
    all-zero column (amax floor) and one huge value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-4, 4, (m, 1), generator=g).float())
    x = x * torch.exp2(torch.randint(-4, 4, (1, n), generator=g).float())
    x[:, n // 2] = 0
    x[m // 2, min(3, n - 1)] = 6e4 if dtype == torch.float16 else 1e5
    return x.to(dtype)


def expected_cast_transpose(x: torch.Tensor, ue8m0: bool):
    x_fp8, x_sf, xt_fp8, xt_sf = cast_transpose_torch(x, ue8m0)
    return x_fp8, get_col_major_tma_aligned_tensor(x_sf), xt_fp8, get_col_major_tma_aligned_tensor(xt_sf)


def expected_k_grouped(x: torch.Tensor, ks: list[int], ue8m0: bool):
    flat, sf = k_grouped_torch(x, ks, ue8m0)
    return flat, get_col_major_tma_aligned_tensor(sf)


def _sim_launch(config, params, grid, device, seed: int | None = None):
    from deep_fp8_gemm.simulator.runner import launch

    assert device.type == "cpu"
    name, source = kq.render_source(config)
    launch(name, source, bytes(params), grid=grid, block=config.num_threads, cluster=1,
           smem_bytes=config.smem_bytes, seed=seed)


# (m, k, dtype, ue8m0, row stride padding): each row is one simulator build (~5 s) of one kernel variant.
SIM_CAST_TRANSPOSE_CASES = [
    (130, 200, torch.bfloat16, False, 0),  # scalar: odd k, m not a multiple of 128 or 16, partial edge tiles
    (144, 256, torch.bfloat16, True, 0),   # vectorised (m % 16 == k % 16 == 0), UE8M0
    (32, 272, torch.float16, False, 24),   # vectorised fp16 with a row stride != k
    (3, 7, torch.float32, False, 0),       # scalar fp32, a single partial tile
]
# (ks, n, dtype, ue8m0)
SIM_K_GROUPED_CASES = [
    ([128, 0, 256, 0], 144, torch.bfloat16, False),  # vectorised, empty groups between and after
    ([0, 128, 128], 77, torch.float32, True),         # scalar (odd n), a leading empty group, UE8M0
]


@needs_gxx
@pytest.mark.parametrize("m,k,dtype,ue8m0,pad", SIM_CAST_TRANSPOSE_CASES)
def test_sim_cast_transpose_matches_torch(m, k, dtype, ue8m0, pad):
    x = _input(m, k + pad, dtype, seed=m + k)[:, pad // 2: pad // 2 + k]
    out = kq.run_cast_transpose(x, _sim_launch, ue8m0=ue8m0)
    expected = expected_cast_transpose(x, ue8m0)
    assert not _mismatches(out, expected)
    assert [t.stride() for t in out] == [t.stride() for t in expected]
    # and the contract: two per-token quantisations
    assert not _mismatches(out, (*dfg.per_token_cast_to_fp8(x, use_ue8m0=ue8m0),
                                 *dfg.per_token_cast_to_fp8(x.t().contiguous(), use_ue8m0=ue8m0)))


@needs_gxx
@pytest.mark.parametrize("ks,n,dtype,ue8m0", SIM_K_GROUPED_CASES)
def test_sim_k_grouped_matches_torch(ks, n, dtype, ue8m0):
    x = _input(sum(ks), n, dtype, seed=n)
    out = kq.run_k_grouped_transpose(x, ks, _sim_launch, ue8m0=ue8m0)
    assert not _mismatches(out, expected_k_grouped(x, ks, ue8m0))
    assert out[1].stride() == (1, (n + 3) // 4 * 4)


@needs_gxx
@pytest.mark.parametrize("seed", [1, 2])
def test_sim_under_adversarial_schedules(seed):
    """Seeded adversarial fiber schedules (sim/schedule.hpp): the three CTA barriers must order every shared
    memory hand-over whatever order the threads run in. Same variants as the first cases above (cached builds)."""
    def launch(config, params, grid, device):
        _sim_launch(config, params, grid, device, seed=seed)

    m, k, dtype, _, _ = SIM_CAST_TRANSPOSE_CASES[0]
    x = _input(m, k, dtype, seed=seed)
    assert not _mismatches(kq.run_cast_transpose(x, launch), expected_cast_transpose(x, False))
    ks, n, dtype, ue8m0 = SIM_K_GROUPED_CASES[0]
    xg = _input(sum(ks), n, dtype, seed=seed)
    assert not _mismatches(kq.run_k_grouped_transpose(xg, ks, launch, ue8m0=ue8m0), expected_k_grouped(xg, ks, ue8m0))


def test_host_rejects_what_the_kernels_cannot_address():
    with pytest.raises(ValueError, match="CUDA tensor"):
        kq.per_token_cast_to_fp8_and_transpose_cuda(torch.zeros(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="rank"):
        kq.transpose_cast_to_fp8_k_grouped_cuda(torch.zeros(128, dtype=torch.bfloat16), [128])
    with pytest.raises(ValueError, match=r"x.shape=\(0, 4\)"):
        kq.run_cast_transpose(torch.zeros(0, 4), launch=lambda *a: None)
    assert ctypes_size() == 80


def ctypes_size() -> int:
    import ctypes

    offsets = [getattr(kq.TransposeParams, name).offset for name, _ in kq.TransposeParams._fields_]
    assert offsets == [0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68, 72, 76]
    return ctypes.sizeof(kq.TransposeParams)


def test_empty_groups_launch_nothing():
    def no_launch(*args):
        raise AssertionError("nothing to launch")

    flat, sf = kq.run_k_grouped_transpose(torch.zeros(0, 40), [0, 0], no_launch)
    assert flat.numel() == 0 and sf.shape == (40, 0)
    flat, sf = kq.run_k_grouped_transpose(torch.zeros(256, 0), [256], no_launch)
    assert flat.numel() == 0 and sf.shape == (0, 2)


# ---------------------------------------------------------------------------------------------- planted bugs
# name: (original text in kernels/quant.cuh, planted text, "cast_transpose" or "k_grouped")
PLANTED = {
    "column_amax_over_half_the_rows": (
        "for (u32 s = 0; s < kRowSlots; ++s) amax = max_of(amax,",
        "for (u32 s = 0; s < kRowSlots / 2; ++s) amax = max_of(amax,",
        "cast_transpose",
    ),
    "unswizzled_xt_tile_read": (
        "reinterpret_cast<const Vec16B*>(xt_tile + swizzle_xt_word(c, w));",
        "reinterpret_cast<const Vec16B*>(xt_tile + c * kWordsPerTileRow + w);",
        "cast_transpose",
    ),
    "missing_barrier_before_the_xt_tile": (
        "    hal::sync_threads();  // 2: column scales; the column partials are dead\n",
        "",
        "cast_transpose",
    ),
    "group_search_off_by_one": (
        "if (u32(prefix[mid]) <= row) {",
        "if (u32(prefix[mid]) < row) {",
        "k_grouped",
    ),
}


@needs_gxx
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path, monkeypatch):
    from deep_fp8_gemm.simulator import SimulationError

    original, planted, kind = PLANTED[bug]
    mutated_headers(tmp_path, monkeypatch, "kernels/quant.cuh", original, planted)
    try:
        if kind == "cast_transpose":
            x = _input(256, 160, torch.bfloat16, seed=1)
            problems = _mismatches(kq.run_cast_transpose(x, _sim_launch), expected_cast_transpose(x, False))
        else:
            ks = [128, 0, 256]
            x = _input(sum(ks), 48, torch.bfloat16, seed=2)
            problems = _mismatches(kq.run_k_grouped_transpose(x, ks, _sim_launch), expected_k_grouped(x, ks, False))
    except SimulationError as e:
        print(f"{bug}: simulator reported:\n{str(e)[:1000]}")
        return
    assert problems, f"{bug} went unnoticed"


# ---------------------------------------------------------------------------------------------- GPU
# Every input the GPU tests quantise; tests/gpu/test_gpu_cases.py runs the host path of each on the CPU.
GPU_CAST_TRANSPOSE_SHAPES = [(4096, 7168), (130, 200), (1, 7), (256, 2048), (4000, 7168)]
GPU_K_GROUPED_CASES = [([128, 0, 256, 512], 7168), ([0, 1024, 128], 77), ([4096] * 8, 2048)]
GPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GPU_CASE_TABLES = (GPU_CAST_TRANSPOSE_SHAPES, GPU_K_GROUPED_CASES, GPU_DTYPES)


def gpu_transpose_calls() -> list[tuple]:
    """("cast_transpose", (m, k), dtype) / ("k_grouped", (ks, n), dtype) of every fused call of the GPU tests."""
    calls = [("cast_transpose", shape, dtype) for shape in GPU_CAST_TRANSPOSE_SHAPES for dtype in GPU_DTYPES]
    calls += [("k_grouped", (tuple(ks), n), dtype) for ks, n in GPU_K_GROUPED_CASES for dtype in GPU_DTYPES]
    return calls


@requires_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("m,k", GPU_CAST_TRANSPOSE_SHAPES)
def test_gpu_cast_transpose_bit_exact(m, k, dtype):
    x = _input(m, k, dtype, seed=k).cuda()
    for ue8m0 in (False, True):
        out = kq.per_token_cast_to_fp8_and_transpose_cuda(x, ue8m0)
        assert not _mismatches(out, expected_cast_transpose(x, ue8m0))
        public = dfg.per_token_cast_to_fp8_and_transpose(x, use_ue8m0=ue8m0)
        assert not _mismatches(public, (*dfg.per_token_cast_to_fp8(x, use_ue8m0=ue8m0),
                                        *dfg.per_token_cast_to_fp8(x.t().contiguous(), use_ue8m0=ue8m0)))


@requires_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("ks,n", GPU_K_GROUPED_CASES)
def test_gpu_k_grouped_bit_exact(ks, n, dtype):
    x = _input(sum(ks), n, dtype, seed=n).cuda()
    for ue8m0 in (False, True):
        out = dfg.transpose_cast_to_fp8_k_grouped(x, ks, use_ue8m0=ue8m0)
        assert not _mismatches(out, expected_k_grouped(x, ks, ue8m0))


@requires_sm90
@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    m, k = GPU_CAST_TRANSPOSE_SHAPES[3]
    ks, n = GPU_K_GROUPED_CASES[0]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    xg = torch.randn(sum(ks), n, dtype=torch.bfloat16, device="cuda")
    kq.per_token_cast_to_fp8_and_transpose_cuda(x)  # compile + load, and the group prefix, outside the capture
    kq.transpose_cast_to_fp8_k_grouped_cuda(xg, ks)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kq.per_token_cast_to_fp8_and_transpose_cuda(x)
        out_g = kq.transpose_cast_to_fp8_k_grouped_cuda(xg, ks)
    x.copy_(torch.randn_like(x))
    xg.copy_(torch.randn_like(xg))
    graph.replay()
    torch.cuda.synchronize()
    assert not _mismatches(out, expected_cast_transpose(x, False))
    assert not _mismatches(out_g, expected_k_grouped(xg, ks, False))
