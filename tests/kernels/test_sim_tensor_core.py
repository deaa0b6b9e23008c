"""The simulator's model of the Hopper FP8 tensor-core inner product, and why the kernels promote every 128 K.

The simulated wgmma accumulates like the hardware's (numerics.hpp, mma_fp8_k32: addends aligned to the
largest exponent in flight and truncated to 13 bits, accumulator kept with 13 mantissa bits), not in exact
fp32; ``DFG_SIM_EXACT_MMA=1`` switches back to exact fp32. The operands below make the difference large:
K = 512 = four 128-blocks, the first and last blocks hold large products that cancel exactly, the middle two
small ones that carry the whole result. The real kernel promotes every 128 K to fp32 on the CUDA cores, so
the small products never meet the large partial sum inside the tensor core; a planted kernel that promotes
only every 512 K keeps the large sum in the accumulator while the small products arrive, and loses them.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from deep_fp8_gemm import calc_diff, get_col_major_tma_aligned_tensor, reference
from deep_fp8_gemm.kernels import gemm

from tests.kernels.test_sim_gemm import make_config
from tests._mutate import mutated_headers

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

BOUND = 1e-3  # the simulator GEMM tests' calc_diff bound (tests/kernels/test_sim_gemm.py)
M, N, K = 64, 128, 512

# The kernel with promotion every 4 K blocks (512 K): the scratch accumulator keeps accumulating across K
# blocks (scale-d stays on), and is promoted (then restarted) only every fourth block. Exact with the
# constant scales used here; wrong by the tensor core's arithmetic only.
PROMOTE_EVERY_512 = [
    # (the 1D2D / 1D1D consumer's k_block, told from the 1x32 recipe's by the comment that follows its barrier wait)
    ("const auto k_block = [&](u32 stage, u32 phase, u32 /*kb*/) {\n"
     "                const u32 a_lo = a_lo0 + stage * (kSmemOpABytes >> 4);\n"
     "                const u32 b_lo = b_lo0 + stage * (kSmemOpBBytes >> 4);\n"
     "                hal::mbar_wait(&full[stage], phase, full_barrier(stage));\n"
     "                // Scales are read",
     "const auto k_block = [&](u32 stage, u32 phase, u32 kb) {\n"
     "                const u32 a_lo = a_lo0 + stage * (kSmemOpABytes >> 4);\n"
     "                const u32 b_lo = b_lo0 + stage * (kSmemOpBBytes >> 4);\n"
     "                hal::mbar_wait(&full[stage], phase, full_barrier(stage));\n"
     "                // Scales are read"),
    ("                                scratch, ks > 0);",
     "                                scratch, ks > 0 || kb % 4 != 0);"),
    ("promote(acc[w], scratch, sa_lo, sa_hi, sb0, sb1, masks);",
     "if (kb % 4 == 3 || kb + 1 == kNumKBlocks) promote(acc[w], scratch, sa_lo, sa_hi, sb0, sb1, masks);"),
]


def cancelling_operands(seed: int = 0):
    """e4m3 A [M, K], B [N, K] with unit scales: blocks 0 and 3 of K cancel exactly (a[:, 384:] = -a[:, :128],
    b[:, 384:] = b[:, :128], magnitudes ~2^6 and ~2^4), blocks 1-2 hold products of magnitude ~1."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g)
    a[:, :128] *= 64
    b[:, :128] *= 16
    a[:, 384:] = -a[:, :128]
    b[:, 384:] = b[:, :128]
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    sa = torch.ones(M, K // 128)
    sb = torch.ones(N // 128, K // 128)
    return a8, sa, b8, sb


def run_gemm() -> float:
    a, sa, b, sb = cancelling_operands()
    cfg = make_config("dense", N, K, 64, 128, stages=2, grid=1)
    d = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    gemm.launch_1d2d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, sb, d, None, backend="sim")
    ref = torch.empty_like(d)
    reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
    assert not d.isnan().any()
    return calc_diff(d, ref)


def test_promotion_every_128_k_stays_within_the_bound():
    diff = run_gemm()
    print(f"promotion every 128 K: calc_diff = {diff:.3e}")
    assert diff < BOUND


@pytest.mark.parametrize("exact", [False, True])
def test_promotion_every_512_k_exceeds_the_bound_only_with_the_tensor_core_model(exact, tmp_path, monkeypatch):
    header = "kernels/fp8_gemm.cuh"
    mutated_headers(tmp_path, monkeypatch, header, *PROMOTE_EVERY_512[0])
    target = tmp_path / "include" / "deep_fp8_gemm" / header
    text = target.read_text()
    for original, planted in PROMOTE_EVERY_512[1:]:
        assert text.count(original) == 1, f"{original!r} is no longer in fp8_gemm.cuh; update this test"
        text = text.replace(original, planted)
    target.write_text(text)
    if exact:
        monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    diff = run_gemm()
    print(f"promotion every 512 K, {'exact fp32' if exact else 'tensor-core model'}: calc_diff = {diff:.3e}")
    if exact:
        assert diff < BOUND  # the planted kernel is correct in exact arithmetic
    else:
        assert diff > 10 * BOUND, "the tensor-core model should lose the small products under the large partial sum"
