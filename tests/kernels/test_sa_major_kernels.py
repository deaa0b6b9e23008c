"""The masked kernels that read fp8_einsum's sx where it lies (``GemmConfig.sa_major`` "k" / "g", scales.cuh
``ScaleMajor``; issue 45): the config rules, and compiled (NVRTC, sm_90a) against their M-major twins — the same K
loop instruction for instruction (the math warps' sA read only changes its constant offset: ``sa[4 r]`` for
``sa[r]``), the producer's loop as long, no spills. The audit lists them with the masked kind
(``kernels.targets.einsum_configs``); their simulator tests: tests/kernels/test_sim_einsum_sa.py."""

from __future__ import annotations

import dataclasses

import pytest

from deep_fp8_gemm.config import SA_MAJORS, GemmConfig, check_config, get_config, smem_bytes
from deep_fp8_gemm.kernels import targets
from deep_fp8_gemm.kernels.gemm import render_source
from deep_fp8_gemm.runtime import kloop
from deep_fp8_gemm.runtime.compiler import compile_kernel
from deep_fp8_gemm.runtime.sass import disassemble


def _masked(**kw) -> GemmConfig:
    base = dict(kind="masked", shape_n=1024, shape_k=4096, num_groups=8, block_m=64, block_n=128, num_stages=4,
                cluster_m=1, cluster_n=1, band_width=16, grid_size=132)
    return GemmConfig(**{**base, **kw})


def test_rules_names_and_shared_memory():
    for major in SA_MAJORS:
        check_config(_masked(sa_major=major))
    for bad in (dict(kind="dense", num_groups=1, sa_major="k"), dict(kind="masked_fp8out", sa_major="g"),
                dict(sa_major="n")):
        with pytest.raises(ValueError, match="sa_major"):
            check_config(_masked(**bad))
    m, k = _masked(), _masked(sa_major="k")
    assert k.kernel_name() == m.kernel_name() + "_sak" and _masked(sa_major="g").kernel_name().endswith("_sag")
    # four times the sA bytes per stage: 64 rows x 16 bytes instead of x 4, in 128-byte records
    assert k.smem_bytes - m.smem_bytes == 4 * (64 * 16 - 256) == k.num_stages * 768
    assert k.smem_bytes == smem_bytes(64, 128, 4, "masked", False, "k") and k.sa_pitch == 4 and m.sa_pitch == 1
    assert m.template_constants()["SA_MAJOR"] == 0 and k.template_constants()["SA_MAJOR"] == 1


def test_the_heuristic_picks_the_m_major_tile():
    """The cost model does not weigh sA: the tile, cluster and grid of every fp8_einsum audit pick are the M-major
    pick's, the stages at most as many (the sA records are larger)."""
    for cfg in targets.einsum_configs("masked", None, 132, None):
        same = get_config(*_problem_of(cfg), "masked", 132)
        assert dataclasses.replace(same, sa_major=cfg.sa_major, num_stages=cfg.num_stages) == cfg
        assert cfg.num_stages <= same.num_stages
    assert targets.einsum_configs("dense", None, 132, None) == []


def _problem_of(cfg):
    """(m, n, k, groups) the audit asked for a config of einsum_configs."""
    for n, k in targets.DEEPSEEK_V4_EINSUM_HEADS:
        for g in targets.EINSUM_GROUPS:
            for m in targets.MASKED_EXPECTED_MS:
                if get_config(m, n, k, g, "masked", 132, sa_major=cfg.sa_major) == cfg:
                    return m, n, k, g
    raise AssertionError(cfg)


def _loops(cfg: GemmConfig) -> dict:
    kernel = compile_kernel(cfg.kernel_name(), render_source(cfg))
    assert kernel.resources.spill_bytes == 0 and kernel.resources.stack_bytes == 0, kernel.resources
    return kernel.resources.registers, kloop.analyse_sass(disassemble(kernel.cubin), block_m=cfg.block_m, block_n=cfg.block_n,
                              num_math_warpgroups=cfg.num_math_warpgroups, function=cfg.kernel_name(),
                              mma_chunks=cfg.mma_chunks)


@pytest.mark.parametrize("m,groups", [(32, 8), (256, 16)])  # 64 x 128 (one warpgroup), 256 x 128 (two, two waves)
def test_k_loop_is_the_m_major_twins(m, groups):
    twin = get_config(m, 1024, 4096, groups, "masked", 132)
    registers, expected = _loops(twin)
    for major in ("k", "g"):
        cfg = get_config(m, 1024, 4096, groups, "masked", 132, sa_major=major)
        got_registers, got = _loops(cfg)
        assert got_registers == registers
        assert got["math"]["per_k_block"] == expected["math"]["per_k_block"], major
        assert got["math"]["overhead_per_k_block_per_wave"] == expected["math"]["overhead_per_k_block_per_wave"]
        assert got["producer"]["per_k_block"]["total"] == expected["producer"]["per_k_block"]["total"], major
        assert got["issue_per_tensor_cycle"] == expected["issue_per_tensor_cycle"]
        assert kloop.check_ceilings("masked", cfg.block_m, got, kloop.load_ceilings()) == []
