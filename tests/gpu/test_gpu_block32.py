"""The 1x32 / 32x32 kernel (kind ``dense_block32``, policy_block32.cuh) on an sm_90 GPU (skipped, with the reason,
anywhere else): the heuristic's picks for DeepSeek-V4.1's dense projections and odd shapes against the CPU reference
(the same promotion order; the tensor core's partials keep ~13 bits, so within 1e-5 calc_diff of it) and float64
(1e-3), fp32 and UE8M0 scales, row-major scales as SGLang passes UE8M0 checkpoints' through the drop-in, every tile
forced on one problem, and the rows' bits across batch sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import compat, ops
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.config import get_config
from tests._gpu import requires_sm90
from tests._operands import gemm64, quantised_activations, quantised_weights

pytestmark = pytest.mark.gpu

#: (m, n, k): DeepSeek-V4.1's dense projections (kernels/targets.py DEEPSEEK_V41_DENSE_BLOCK32) at decode and prefill
#: rows, K that is not a multiple of 128, N tails inside a 32-column block.
BLOCK32_CASES = [(1, 4096, 7168), (64, 7168, 2048), (4096, 4096, 7168), (4096, 7168, 2048), (128, 1536, 7168),
                 (33, 512, 7168), (200, 8192, 1536), (70, 200, 352), (1, 136, 96)]
#: (n, k, tile) forced on one problem: every BLOCK_M x BLOCK_N the heuristic emits, and the multicast pair.
BLOCK32_TILES = [(4096, 7168, (64, 32, 1)), (4096, 7168, (64, 64, 1)), (7168, 2048, (64, 96, 1)),
                 (7168, 2048, (64, 128, 1)), (1536, 7168, (128, 96, 1)), (7168, 2048, (128, 128, 1)),
                 (4096, 7168, (128, 128, 2))]
#: Scale values: fp32 (amax / 448) and UE8M0 (powers of two, DeepSeek-V4.1's checkpoints).
SCALE_KINDS = [False, True]
GPU_CASE_TABLES = (BLOCK32_CASES, BLOCK32_TILES, SCALE_KINDS)


def launch_cases() -> list[dict]:
    """Every GEMM this module launches (tests/gpu/test_gpu_cases.py, family ``block32``)."""
    cases = [dict(kind="dense_block32", a_shape=(m, k), n=n, k=k, test=f"block32 {m}x{n}x{k}")
             for m, n, k in BLOCK32_CASES]
    cases += [dict(kind="dense_block32", a_shape=(256, k), n=n, k=k, config=forced(n, k, tile),
                   test=f"block32 tile {tile}") for n, k, tile in BLOCK32_TILES]
    return cases


def forced(n, k, tile):
    block_m, block_n, cluster_n = tile
    base = get_config(4096, n, k, 1, "dense_block32")
    return dataclasses.replace(base, block_m=block_m, block_n=block_n, cluster_n=cluster_n,
                               band_width=16 // cluster_n, num_stages=min(base.num_stages, 4), grid_size=132)


def _operands(m, n, k, seed, use_ue8m0=False):
    a, sa = quantised_activations((m, k), seed, gran_k=32, use_ue8m0=use_ue8m0)
    b, sb = quantised_weights((n, k), seed + 1, gran_k=32, use_ue8m0=use_ue8m0)
    return a, sa, b, sb


def _check(d_gpu, a, sa, b, sb):
    ref = torch.empty(d_gpu.shape, dtype=torch.bfloat16)
    dfg.reference.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), ref)
    got = d_gpu.cpu()
    assert float(dfg.calc_diff(got.double(), ref.double())) < 1e-5
    assert float(dfg.calc_diff(got.double(), torch.from_numpy(gemm64(a, sa, b, sb, gran=32).value))) < 1e-3


@requires_sm90
@pytest.mark.parametrize("m,n,k", BLOCK32_CASES)
@pytest.mark.parametrize("use_ue8m0", SCALE_KINDS)
def test_block32_matches_the_reference_on_the_gpu(m, n, k, use_ue8m0):
    a, sa, b, sb = _operands(m, n, k, seed=m + n, use_ue8m0=use_ue8m0)
    d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    dfg.gemm_fp8_fp8_bf16_nt_block32((a.cuda(), sa.cuda()), (b.cuda(), sb.cuda()), d)
    _check(d, a, sa, b, sb)
    # the drop-in as SGLang calls it, with the row-major scales of a UE8M0 checkpoint
    d2 = torch.empty_like(d)
    compat.fp8_gemm_nt((a.cuda(), sa.cuda().contiguous()), (b.cuda(), sb.cuda()), d2, recipe=(1, 32, 32))
    assert torch.equal(d2, d)


@requires_sm90
@pytest.mark.parametrize("n,k,tile", BLOCK32_TILES)
def test_every_block32_tile_on_the_gpu(n, k, tile, monkeypatch):
    cfg = forced(n, k, tile)
    plans.clear()
    monkeypatch.setattr(ops.FAMILIES["dense_block32"], "plan", lambda *a, **kw: cfg)
    a, sa, b, sb = _operands(256, n, k, seed=3)
    d = torch.empty(256, n, dtype=torch.bfloat16, device="cuda")
    dfg.gemm_fp8_fp8_bf16_nt_block32((a.cuda(), sa.cuda()), (b.cuda(), sb.cuda()), d)
    _check(d, a, sa, b, sb)
    # batch invariance: row 7 alone and in the batch, under this tile
    one = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    dfg.gemm_fp8_fp8_bf16_nt_block32((a[7:8].cuda(), sa[7:8].cuda()), (b.cuda(), sb.cuda()), one)
    assert torch.equal(one[0], d[7])
