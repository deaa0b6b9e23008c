"""The 1x32 / 32x32 kernel (kind ``dense_block32``; include/deep_fp8_gemm/policy_block32.cuh) executed by the CPU
simulator: every tile the heuristic emits (BLOCK_N 32 / 64 / 96 / 128, one or two math warpgroups, a multicast
pair), K tails that end inside a stage (K = 352: three k32 slices of the last stage are real), N tails inside a
32-column scale block, fp32 and UE8M0 scales; bit-equal to the CPU reference under the fp32-exact tensor-core model
(the reference computes what the kernel computes: an exact partial per 32 K, promoted in K order) and within one
bf16 ulp of float64 under the default (truncating) model; and planted bugs that must be caught."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.config import GemmConfig, check_config, get_config
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.simulator import SimulationError
from tests._mutate import mutated_headers
from tests._operands import gemm64, quantised_activations, quantised_weights

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


def config(n, k, block_m, block_n, stages=3, grid=3, cluster_n=1):
    cfg = GemmConfig(kind="dense_block32", shape_n=n, shape_k=k, num_groups=1, block_m=block_m, block_n=block_n,
                     num_stages=stages, cluster_m=1, cluster_n=cluster_n, band_width=16, grid_size=grid)
    check_config(cfg)
    return cfg


def operands(m, n, k, seed, use_ue8m0=False):
    a, sa = quantised_activations((m, k), seed, gran_k=32, use_ue8m0=use_ue8m0)
    b, sb = quantised_weights((n, k), seed + 1, gran_k=32, use_ue8m0=use_ue8m0)
    return a, sa, b, sb


def run(cfg, m, seed=0, use_ue8m0=False):
    a, sa, b, sb = operands(m, cfg.shape_n, cfg.shape_k, seed, use_ue8m0)
    d = torch.full((m, cfg.shape_n), float("nan"), dtype=torch.bfloat16)
    gemm.launch_1d2d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, sb, d, None, backend="sim")
    return d, (a, sa, b, sb)


def reference(ops):
    a, sa, b, sb = ops
    out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16)
    dfg.reference.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), out)
    return out


# (m, n, k, block_m, block_n, cluster_n): the heuristic's tiles forced onto problems the simulator runs in seconds.
CASES = {
    "bm64_bn32_k_tail": (33, 200, 352, 64, 32, 1),
    "bm64_bn64_n_tail": (70, 136, 256, 64, 64, 1),
    "bm64_bn96_three_blocks": (64, 192, 352, 64, 96, 1),
    "bm128_bn128_two_warpgroups": (130, 256, 224, 128, 128, 1),
    "bm128_bn128_multicast_a": (128, 256, 256, 128, 128, 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_is_the_reference_bit_for_bit_with_exact_mma(name, monkeypatch):
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    m, n, k, bm, bn, cn = CASES[name]
    d, ops = run(config(n, k, bm, bn, grid=4 if cn == 2 else 3, cluster_n=cn), m, seed=len(name))
    assert not d.isnan().any(), "unwritten outputs"
    assert torch.equal(d.view(torch.int16), reference(ops).view(torch.int16))


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_kernel_under_the_truncating_tensor_core_model(use_ue8m0):
    """The default tensor-core model (13-bit alignment per k16 group, hal/sim/numerics.hpp): each 32-wide partial is
    short, so the result stays within 1e-3 calc_diff of float64 (and close to the exact reference)."""
    d, ops = run(config(200, 352, 64, 64), 70, seed=11, use_ue8m0=use_ue8m0)
    truth = torch.from_numpy(gemm64(*ops, gran=32).value)
    assert float(dfg.calc_diff(d.double(), truth)) < 1e-3
    assert float(dfg.calc_diff(d.double(), reference(ops).double())) < 1e-5


def test_the_public_op_runs_the_heuristics_pick_in_the_simulator(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    a, sa, b, sb = operands(48, 96, 320, seed=4)
    d = torch.empty(48, 96, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt_block32((a, sa), (b, sb), d)  # row-major sA: converted on the host
    assert torch.equal(d.view(torch.int16), reference((a, sa, b, sb)).view(torch.int16))
    assert get_config(48, 96, 320, 1, "dense_block32", 132).kind == "dense_block32"


def test_rows_do_not_depend_on_the_batch(monkeypatch):
    """Batch invariance (docs/batch-invariance.md) for the tiles the heuristic picks across batch sizes: the
    target rows' bits under a 64-row and a 128-row tile, alone and with neighbours."""
    monkeypatch.setenv("DFG_SIMULATE", "1")
    a, sa, b, sb = operands(96, 128, 256, seed=9)
    rows = []
    for cfg in (config(128, 256, 64, 64), config(128, 256, 128, 128)):
        for batch in (slice(0, 1), slice(0, 96)):
            d = torch.empty(batch.stop, 128, dtype=torch.bfloat16)
            gemm.launch_1d2d(cfg, a[batch], get_col_major_tma_aligned_tensor(sa[batch]), b, sb, d, None, "sim")
            rows.append(d[0].clone())
    assert all(torch.equal(r.view(torch.int16), rows[0].view(torch.int16)) for r in rows[1:])


# ---------------------------------------------------------------------------------------------- planted bugs
NUMERIC_BUGS = {
    # every column promoted with the tile's first 32-column block's products
    "products_of_block_zero": ("policy_block32.cuh", "const float lo = pr.lo(j / 4), hi = pr.hi(j / 4);",
                               "const float lo = pr.lo(0), hi = pr.hi(0);"),
    # a slice's partial promoted with the next slice's products
    "products_of_the_next_slice": ("kernels/fp8_gemm.cuh", "promote_slice(bank[(ks - 1) % 2], stage, ks - 1);",
                                   "promote_slice(bank[(ks - 1) % 2], stage, ks % B32::kSlices);"),
    # the scale warps' row pairs shifted by one row (the math threads read another row's products)
    "row_pair_mapping": ("policy_block32.cuh", "return 16 * (p / 8) + p % 8; }", "return 16 * (p / 8) + (p + 1) % 8; }"),
    # the sB block of a slice past the tile's first column block read with the wrong stride
    "sb_stride": ("policy_block32.cuh", "const float value = sb[h.group_base + row * kNumSlicesK + slice];",
                  "const float value = sb[h.group_base + row + slice];"),
    # the staged sB of the stage's first slice used for all four
    "staged_slice_zero": ("policy_block32.cuh", "const F32x4 b = reinterpret_cast<const F32x4*>(staging)[s];",
                          "const F32x4 b = reinterpret_cast<const F32x4*>(staging)[0];"),
}


@pytest.mark.parametrize("bug", sorted(NUMERIC_BUGS))
def test_planted_numeric_bug_is_caught(bug, tmp_path, monkeypatch):
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    mutated_headers(tmp_path, monkeypatch, *NUMERIC_BUGS[bug])
    d, ops = run(config(136, 256, 64, 128), 40, seed=2)
    assert not torch.equal(d.view(torch.int16), reference(ops).view(torch.int16)), f"{bug} went unnoticed"


def test_planted_bank_read_before_its_wgmma_retired(tmp_path, monkeypatch):
    """wait_group 2 where 1 is needed: the promotion reads a bank whose wgmma may still be running (undefined in
    the PTX ISA). The simulator's deferred wgmma execution hands back the bank's previous contents (and, with the
    in-flight register rule, names the read)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh",
                    "                    if (ks > 0) {  // the slice before retires while this one runs\n"
                    "                        hal::wgmma_wait<1>();",
                    "                    if (ks > 0) {  // the slice before retires while this one runs\n"
                    "                        hal::wgmma_wait<2>();")
    try:
        d, ops = run(config(128, 256, 64, 64), 32, seed=5)
    except SimulationError as e:
        assert "wgmma" in str(e)
        return
    assert not torch.equal(d.view(torch.int16), reference(ops).view(torch.int16))


ORDERING_BUGS = {
    # the math warps release the stage before reading its last slice's products: the scale warps may overwrite them
    "released_before_the_products_are_read": (
        "kernels/fp8_gemm.cuh",
        "                Products pr;\n"
        "                pr.load(reinterpret_cast<const float*>(smem + products0 + stage * kSmemRecordBytes +\n"
        "                                                       (B32::kSlices - 1) * B32::kSliceProductBytes));\n"
        "                // Lane 0 (lane r < cluster size) arrives for the warp: every lane's product reads before it.\n"
        "                hal::warp_sync();\n"
        "                release_stage(empty, peer_window, stage, lane);\n",
        "                hal::warp_sync();\n"
        "                release_stage(empty, peer_window, stage, lane);\n"
        "                Products pr;\n"
        "                pr.load(reinterpret_cast<const float*>(smem + products0 + stage * kSmemRecordBytes +\n"
        "                                                       (B32::kSlices - 1) * B32::kSliceProductBytes));\n"),
    # a scale warp signals the stage full before its products are written
    "arrive_before_the_products": (
        "kernels/fp8_gemm.cuh",
        "            B32::template write_products<kNumScaleBlocksN32, kNumSlicesK>(record, params.sb, header, scale_warp, lane);\n"
        "            hal::warp_sync();\n"
        "            if (lane == 0)\n"
        "                hal::mbar_arrive(&full[stage]);\n",
        "            hal::warp_sync();\n"
        "            if (lane == 0)\n"
        "                hal::mbar_arrive(&full[stage]);\n"
        "            B32::template write_products<kNumScaleBlocksN32, kNumSlicesK>(record, params.sb, header, scale_warp, lane);\n"),
}


@pytest.mark.parametrize("bug", sorted(ORDERING_BUGS))
def test_planted_ordering_bug_is_a_race(bug, tmp_path, monkeypatch):
    """One CTA, eight K blocks through a two-stage ring: the producer side runs ahead, so the reordered accesses
    meet; the race detector names them whatever the values."""
    mutated_headers(tmp_path, monkeypatch, *ORDERING_BUGS[bug])
    cfg = dataclasses.replace(config(64, 1024, 64, 64, stages=2, grid=1))
    with pytest.raises(SimulationError, match="race"):
        run(cfg, 16, seed=8)
