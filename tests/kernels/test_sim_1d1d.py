"""The 1D1D kernel family (kind "1d1d": per-row B scales, fp32 D = C + A·Bᵀ), executed by the CPU simulator,
against an independent float64 model (numpy; tests/_operands.py).

Configs are forced so that each path runs: one and two math warpgroups, one and two m64 waves, m and n not
multiples of the tile, a K tail, accumulation into a nonzero C held in d itself (in place) and in another
tensor (then d is NaN-poisoned: the kernel must not read it), and a planted bug (sB's per-row layout replaced by
a per-block one) that must be caught.
"""

from __future__ import annotations

import shutil
import zlib

import numpy as np
import pytest
import torch

from deep_fp8_gemm import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.config import GemmConfig, check_config, get_config, smem_bytes
from deep_fp8_gemm.kernels import gemm
from tests._operands import wgrad_operands

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


@pytest.fixture(autouse=True)
def exact_accumulation(request, monkeypatch):
    """Exact fp32 wgmma accumulation (DFG_SIM_EXACT_MMA=1) for the tight float64 comparisons below: they check
    the family's indexing and fp32 D = C + A·Bᵀ semantics to fp32 rounding. The tensor-core model (13-bit
    truncating accumulator inside a k32 step) is exercised by test_1d1d_under_the_tensor_core_model."""
    if "tensor_core_model" not in request.node.name:
        monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")


def model64(a, sa, b, sb, c):
    """float64 C + dequant(A) · dequant(B)ᵀ with 1x128 scales on both (numpy)."""
    k = a.shape[-1]
    ad = a.float().double().numpy() * np.repeat(sa.double().numpy(), 128, axis=1)[:, :k]
    bd = b.float().double().numpy() * np.repeat(sb.double().numpy(), 128, axis=1)[:, :k]
    return c.double().numpy() + ad @ bd.T


CASES = {
    # name: (m, n, k, block_m, block_n, stages, grid)
    "bm64_bn16_odd_m": (37, 48, 256, 64, 16, 3, 2),
    "bm64_bn64_k_tail": (64, 72, 208, 64, 64, 2, 3),
    "bm128_two_warpgroups_odd_n": (131, 40, 384, 128, 32, 3, 2),
    "bm256_two_waves": (190, 64, 256, 256, 32, 2, 1),
    "bm64_bn128": (65, 136, 128, 64, 128, 2, 2),
}


_operands = wgrad_operands


@pytest.mark.parametrize("in_place", [True, False], ids=["c_is_d", "c_separate"])
@pytest.mark.parametrize("name", list(CASES))
def test_1d1d_kernel_matches_float64(name, in_place):
    m, n, k, block_m, block_n, stages, grid = CASES[name]
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=block_m, block_n=block_n, num_stages=stages, cluster_m=1, cluster_n=1, band_width=16, grid_size=grid)
    check_config(cfg)
    a, sa, b, sb, c = _operands(m, n, k, seed=zlib.crc32(name.encode()) % 1000)
    expected = model64(a, sa, b, sb, c)
    if in_place:
        d = c.clone()
        c_arg = d
    else:
        d = torch.full((m, n), float("nan"))
        c_arg = c
    gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d, c_arg,
                  "sim")
    got = d.double().numpy()
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    # fp32 accumulation of k products: relative error well under 1e-5 of the row-norm scale.
    scale = np.abs(expected - c.double().numpy()).max() + 1.0
    assert np.abs(got - expected).max() <= 1e-5 * scale * max(1, k // 128)


def test_1d1d_separate_c_is_not_written():
    m, n, k = 37, 48, 256
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=64, block_n=16, num_stages=2, cluster_m=1, cluster_n=1, band_width=16, grid_size=2)
    a, sa, b, sb, c = _operands(m, n, k, seed=5)
    c_before = c.clone()
    d = torch.full((m, n), float("nan"))
    gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d, c, "sim")
    assert torch.equal(c, c_before)
    assert torch.isfinite(d).all()


def test_1d1d_planted_bug_per_block_b_scales_is_caught():
    """Feeding the kernel sB with one scale per 128 rows (the 1D2D recipe, broadcast) must not pass the model."""
    m, n, k = 64, 64, 256
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=64, block_n=64, num_stages=2, cluster_m=1, cluster_n=1, band_width=16, grid_size=1)
    a, sa, b, sb, c = _operands(m, n, k, seed=9)
    wrong = sb[:1].expand_as(sb).contiguous()  # every row gets row 0's scales
    d = c.clone()
    gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(wrong), d, d,
                  "sim")
    expected = model64(a, sa, b, sb, c)
    assert np.abs(d.double().numpy() - expected).max() > 1e-2


def test_1d1d_smem_map_and_config_rules():
    # no bf16 D tile; sB stage = round_up(BLOCK_N * 4, 128)
    assert smem_bytes(64, 64, 3, "1d1d") == 3 * (8192 + 8192 + 256 + 256) + 48
    assert smem_bytes(64, 64, 3) == 8192 + 3 * (8192 + 8192 + 384)  # 1D2D: records of sA, sB, two barriers
    cfg = get_config(8192, 7168, 4096, 1, "1d1d", 132)
    assert cfg.cluster_size == 1 and cfg.kind == "1d1d"
    with pytest.raises(ValueError, match="1D1D kernel does not multicast"):
        check_config(GemmConfig(kind="1d1d", shape_n=256, shape_k=256, num_groups=1, block_m=128, block_n=128, num_stages=3, cluster_m=1, cluster_n=2, band_width=8, grid_size=2))
    with pytest.raises(ValueError, match="num_groups=1"):
        get_config(128, 256, 256, 2, "1d1d")


def test_1d1d_params_pack_to_the_struct_size():
    """dfg::GemmParams is 576 bytes for every kind; the 1D1D fields (d_f32, c_f32, ld_d, ld_c) sit at 536."""
    import struct

    d = torch.zeros(4, 8)
    c = torch.zeros(4, 12)[:, :8]
    raw = gemm.pack_params([bytes(128)] * 4, rows=4, d_f32=d.data_ptr(), c_f32=c.data_ptr(), ld_d=d.stride(0),
                           ld_c=c.stride(0))
    assert len(raw) == gemm.PARAMS_BYTES == len(gemm.pack_params([bytes(128)] * 4, rows=4))
    assert struct.unpack_from("<QQII", raw, 536) == (d.data_ptr(), c.data_ptr(), 8, 12)


def test_1d1d_c_and_d_with_different_row_strides():
    """C read with its own row stride (ld_c) and D written with its own (ld_d): a swapped stride shows."""
    m, n, k = 40, 48, 256
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=64, block_n=16, num_stages=2, cluster_m=1, cluster_n=1, band_width=16, grid_size=2)
    a, sa, b, sb, c = _operands(m, n, k, seed=11)
    c_wide = torch.full((m, n + 16), float("nan"))
    c_wide[:, :n] = c
    d_wide = torch.full((m, n + 8), float("nan"))
    d = d_wide[:, :n]
    gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d,
                  c_wide[:, :n], "sim")
    expected = model64(a, sa, b, sb, c)
    assert np.abs(d.double().numpy() - expected).max() <= 1e-4 * (np.abs(expected).max() + 1)
    assert torch.isnan(d_wide[:, n:]).all()  # nothing written past column n


def test_1d1d_under_the_tensor_core_model():
    """With the simulator's model of the FP8 tensor core (the default), promotion every 128 K keeps the
    product within the accumulator's ~2^-13 relative precision per K block of the float64 model."""
    from deep_fp8_gemm.utils import calc_diff

    m, n, k = 131, 40, 384
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=128, block_n=32, num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=2)
    a, sa, b, sb, c = _operands(m, n, k, seed=11)
    d = torch.full((m, n), float("nan"))
    gemm.launch_1d1d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb), d, c, "sim")
    product = torch.from_numpy(model64(a, sa, b, sb, torch.zeros(m, n)))
    got = d.double() - c.double()
    assert torch.isfinite(got).all()
    assert calc_diff(got, product) < 1e-6
    assert (got - product).abs().max() <= 2.0**-10 * product.abs().max()
