"""Split-K in the config layer: legality rules, the heuristic's choice, the workspace sizes (deep_fp8_gemm/config.py)."""

from __future__ import annotations

import dataclasses

import pytest

from deep_fp8_gemm.config import (GemmConfig, estimate_cycles, check_config, estimate_seconds, get_config,
                                  split_k_workspace)


def _dense(n, k, block_m, block_n, split_k, **kw):
    fields = dict(kind="dense", shape_n=n, shape_k=k, num_groups=1, block_m=block_m, block_n=block_n, num_stages=4,
                  cluster_m=1, cluster_n=1, band_width=16, grid_size=8, split_k=split_k)
    fields.update(kw)
    return GemmConfig(**fields)


@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_few_tile_decode_shape_gets_split_k_and_it_wins_in_the_model(m):
    cfg = get_config(m, 576, 7168, batch_invariant=False)  # 36 or fewer 64-row tiles on 132 SMs; the fast mode
    assert cfg.split_k > 1 and 56 % cfg.split_k == 0
    tiles = -(-m // cfg.block_m) * -(-576 // cfg.block_n)
    assert cfg.grid_size == min(132, tiles * cfg.split_k)
    unsplit = min(estimate_cycles("dense", m, 576, 7168, 1, bm, bn, 132) for bm in (64, 128) for bn in range(16, 161, 16))
    assert estimate_seconds(cfg, m) * 1.83e9 < unsplit
    check_config(cfg)


@pytest.mark.parametrize("m,n,k", [(4096, 576, 7168), (8192, 7168, 2048), (1024, 24576, 1536)])
def test_many_tile_shapes_do_not_split(m, n, k):
    assert get_config(m, n, k, batch_invariant=False).split_k == 1


@pytest.mark.parametrize("kind", ["contiguous", "masked", "psum", "1d1d"])
def test_other_kinds_never_split(kind):
    groups = 1 if kind == "1d1d" else 4
    assert get_config(16, 576, 7168, groups, kind, batch_invariant=False).split_k == 1


@pytest.mark.parametrize("change,message", [
    (dict(split_k=3), "divisor of the K block count 4"),
    (dict(split_k=0), "divisor"),
    (dict(kind="masked", num_groups=2), "dense kind"),
    (dict(cluster_n=2, grid_size=8), "1x1 cluster"),
    (dict(block_m=256, num_stages=2), "one m64 wave"),
])
def test_illegal_split_k_configs_are_rejected(change, message):
    cfg = dataclasses.replace(_dense(256, 512, 64, 32, 2), **change)
    with pytest.raises(ValueError, match=message):
        check_config(cfg)


def test_split_k_is_part_of_the_binary_identity():
    one, two = _dense(256, 512, 64, 32, 1), _dense(256, 512, 64, 32, 2)
    assert one.kernel_name() != two.kernel_name() and two.kernel_name().endswith("_sk2")
    assert one.template_constants()["SPLIT_K"] == 1 and two.template_constants()["SPLIT_K"] == 2


def test_workspace_sizes():
    cfg = _dense(200, 512, 128, 64, 4)  # 2 warpgroups; m = 130 -> 2 m-blocks, 4 n-blocks
    assert split_k_workspace(cfg, 130) == (2 * 4 * 2, 2 * 4 * 4 * 128 * 64)
    assert split_k_workspace(dataclasses.replace(cfg, split_k=1), 130) == (0, 0)


def test_a_marginal_model_win_does_not_split():
    """n = 4096, k = 7168, m = 1: split 2 models ~1% faster than the best unsplit tile, under SPLIT_K_MARGIN."""
    from deep_fp8_gemm.config import SPLIT_K_MARGIN

    cfg = get_config(1, 4096, 7168, batch_invariant=False)
    assert cfg.split_k == 1
    split = min(estimate_cycles("dense", 1, 4096, 7168, 1, 64, bn, 132, 2) for bn in range(16, 161, 16))
    assert split < estimate_seconds(cfg, 1) * 1.83e9 < split * (1 + SPLIT_K_MARGIN)


def test_audit_covers_the_split_k_kernels_the_heuristic_picks():
    """`python -m deep_fp8_gemm audit` (kind dense, default shapes and M) compiles the split-K kernels too, so their
    spills and K-loop ceilings are checked."""
    from deep_fp8_gemm.kernels import targets as audit

    targets = audit.audit_targets("dense")
    split = [t for t in targets if t.config["split_k"] > 1]
    assert split and any(t.name.startswith("dfg_fp8_gemm_dense_n576_k7168") for t in split)
    tail = lambda t: (f", {t.config['split_k']}, false, {str(t.config['swap_ab']).lower()},\n"  # noqa: E731
                      f"{' ' * 34}{t.config['psum_alignment']}, static_cast<dfg::ScaleMajor>(0)>;")  # sA M-major
    assert all("SPLIT_K" not in t.source and tail(t) in t.source for t in targets)
