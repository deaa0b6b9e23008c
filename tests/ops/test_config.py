"""Kernel configuration: the heuristic's output is always legal, deterministic and sensible; the legality
function rejects every illegal config with a reason.

The rules restated here come from the hardware (shared memory per block, register file, wgmma N) and from
the kernel's contract (multicast pairing, sB straddling), independently of config.py's code.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from tests._hypothesis import given, settings, st  # stand-ins (skips) without hypothesis

from deep_fp8_gemm.config import SMEM_LIMIT, GemmConfig, check_config, get_config, smem_bytes

N_VALUES = st.integers(1, 4096).map(lambda x: 8 * x)  # n % 8 == 0 (TMA)
K_VALUES = st.integers(1, 1024).map(lambda x: 16 * x)  # k % 16 == 0 (TMA)


def _ceil_div(a, b):
    return -(-a // b)


def _assert_sensible(cfg: GemmConfig, m: int, num_sms: int) -> None:
    check_config(cfg)
    assert cfg.smem_bytes <= SMEM_LIMIT
    assert cfg.block_n % 16 == 0 and 16 <= cfg.block_n <= 256  # e4m3 wgmma N, 16-column epilogue chunks
    if cfg.swap_ab:  # the transposed tile (policy_swap_ab.cuh): tokens 8..32, weight rows 64 / 128
        assert cfg.kind == "dense" and m <= 32 and cfg.block_m in (8, 16, 24, 32) and cfg.block_n in (64, 128)
    else:
        assert cfg.block_m in (64, 128, 256)
    assert cfg.cluster_size in (1, 2) and cfg.grid_size % cfg.cluster_size == 0
    assert cfg.cluster_size <= cfg.grid_size <= num_sms, "persistent grid: at most one CTA per SM"
    if cfg.cluster_n == 2:
        assert _ceil_div(cfg.shape_n, cfg.block_n) % 2 == 0, "A multicast pairs n-blocks"
    # Register file: producer 128 x 40 + math 128 x wg x (232 | 240) <= 64K.
    assert 128 * 40 + 128 * cfg.num_math_warpgroups * cfg.math_registers <= 65536
    # Two sB blocks at most under any BLOCK_N-aligned column window.
    assert all((nb * cfg.block_n) % 128 + cfg.block_n <= 256 for nb in range(128))
    if m <= 64 and cfg.kind == "dense" and not cfg.swap_ab:
        assert cfg.block_m == 64, "a 64-row tile covers every row"


@settings(max_examples=150, deadline=None)
@given(m=st.integers(0, 20000), n=N_VALUES, k=K_VALUES, num_sms=st.integers(1, 132))
def test_dense_configs_are_legal_and_deterministic(m, n, k, num_sms):
    cfg = get_config(m, n, k, 1, "dense", num_sms)
    _assert_sensible(cfg, m, num_sms)
    get_config.cache_clear()
    assert get_config(m, n, k, 1, "dense", num_sms) == cfg, "the heuristic must be a pure function"
    if m > 0:  # the grid never exceeds the work (split-K: tiles x splits work items)
        tiles = _ceil_div(_ceil_div(m, cfg.block_m), cfg.cluster_m) * (_ceil_div(n, cfg.block_n) // cfg.cluster_n)
        assert cfg.grid_size <= max(tiles, 1) * cfg.cluster_size * cfg.split_k


@settings(max_examples=80, deadline=None)
@given(groups=st.integers(1, 64), m=st.integers(1, 8192), n=N_VALUES, k=K_VALUES, kind=st.sampled_from(["contiguous", "masked"]))
def test_grouped_configs_are_legal(groups, m, n, k, kind):
    cfg = get_config(m, n, k, groups, kind, 132)
    _assert_sensible(cfg, m, 132)
    assert cfg.num_groups == groups
    assert cfg.cluster_m == 1, "grouped kinds never multicast B: a pair must not straddle experts"
    if kind == "contiguous":
        assert cfg.block_m <= 128, "experts are padded to 128 rows"
    else:
        assert cfg.grid_size == 132 // cfg.cluster_size * cfg.cluster_size, "masked: full persistent grid"


def test_smem_limit_is_honoured():
    small = get_config(4096, 7168, 7168, 1, "dense", 132, smem_limit=100_000)
    assert small.smem_bytes <= 100_000
    assert small.num_stages < get_config(4096, 7168, 7168, 1, "dense", 132).num_stages or small.block_n < 160


@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (128, 7168, 2048), (4096, 7168, 16384), (1, 576, 7168)])
def test_deepseek_shapes_pick_expected_families(m, n, k):
    cfg = get_config(m, n, k, 1, "dense", 132)
    if m <= 128:
        assert cfg.multicast == "none", "decode shapes are memory-bound: no cluster"
    else:
        assert cfg.multicast != "none" and cfg.block_m >= 128


BASE = GemmConfig(kind="dense", shape_n=7168, shape_k=2048, num_groups=1, block_m=128, block_n=128, num_stages=4, cluster_m=1, cluster_n=1, band_width=16, grid_size=132)
ILLEGAL = {
    "block_m": dict(block_m=96),
    "block_n not multiple of 16": dict(block_n=120),
    "three sB blocks": dict(block_n=176),
    "registers": dict(block_m=256, block_n=160, num_stages=2),
    "shared memory": dict(num_stages=12),
    "stages": dict(num_stages=1),
    "dense groups": dict(num_groups=2),
    "contiguous block_m": dict(kind="contiguous", block_m=256, block_n=64, num_groups=4, num_stages=2),
    "odd pair": dict(shape_n=7168 + 128, cluster_n=2),
    "grouped B multicast": dict(kind="masked", num_groups=4, cluster_m=2),
    "cluster shape": dict(cluster_m=2, cluster_n=2),
    "grid vs cluster": dict(cluster_n=2, grid_size=131),
    "tma rows": dict(shape_k=2040),
}


@pytest.mark.parametrize("case", sorted(ILLEGAL))
def test_check_config_rejects(case):
    cfg = dataclasses.replace(BASE, **ILLEGAL[case])
    with pytest.raises(ValueError, match="illegal GEMM config"):
        check_config(cfg)


def test_base_config_is_legal_and_smem_formula():
    check_config(BASE)
    # D tile 128x128 bf16 + 4 x (A 128x128 + B 128x128 + the stage record: sA 512, sB 16, the full and empty
    # barriers 16, padded to 640 for the next record's sA, a TMA destination).
    assert smem_bytes(128, 128, 4) == 32768 + 4 * (16384 + 16384 + 640) == BASE.smem_bytes
    # 1D1D: no D tile; records of sA 512 + sB 512, then the 2 x 6 barriers.
    assert smem_bytes(128, 128, 6, "1d1d") == 6 * (16384 + 16384 + 512 + 512) + 96


@pytest.mark.parametrize("bad", [dict(m=-1), dict(n=12), dict(k=8), dict(kind="sparse"), dict(num_groups=0)])
def test_get_config_argument_errors(bad):
    args = dict(m=128, n=256, k=256, num_groups=1, kind="dense", num_sms=132) | bad
    with pytest.raises(ValueError):
        get_config(**args)


def test_get_config_type_errors():
    with pytest.raises(TypeError):
        get_config(128.0, 256, 256)
    assert math.isfinite(hash(BASE))


def test_estimate_seconds_of_a_k_grouped_config_needs_its_per_group_k():
    """The k-grouped binary has shape_k = BLOCK_K for any ks: modelling that K (only the fp32 C and D traffic
    left) would be ~3x too fast at K = 4096, so the per-group K must be given, and it is what get_config ranked
    with."""
    from deep_fp8_gemm.config import estimate_cycles, estimate_seconds, k_grouped_config

    cfg = k_grouped_config(4096, 7168, 8, 132, 4096)
    assert cfg.shape_k == 128
    with pytest.raises(ValueError, match="needs k="):
        estimate_seconds(cfg, 4096)
    cycles = estimate_cycles("k_grouped", 4096, 7168, 4096, 8, cfg.block_m, cfg.block_n, 132)
    assert math.isclose(estimate_seconds(cfg, 4096, k=4096) * 1.83e9, cycles)
    assert estimate_seconds(cfg, 4096, k=4096) > 3 * estimate_seconds(cfg, 4096, k=128)
    dense = get_config(64, 4096, 7168)
    assert estimate_seconds(dense, 64) == estimate_seconds(dense, 64, k=7168)
    with pytest.raises(ValueError, match="differs from the config's compiled shape_k=7168"):
        estimate_seconds(dense, 64, k=4096)
