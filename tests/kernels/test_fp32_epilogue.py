"""The fp32 epilogue of the 1D1D and k-grouped kernels (policy_1d1d.cuh, store_fp32_accumulate) moves every
fragment pair as one 8-byte load of C and one 8-byte store of D (issue 25, item 5): the SASS has LDG.E.64 /
STG.E.64 and no 4-byte STG.E (the audit's rule for these kinds, checked here on real kernels and on a planted
scalar epilogue); the simulator fails a misaligned vector access (a planted off-by-one column); the hosts refuse
``d`` / ``c`` views the vector accesses cannot serve, on every path, with a ValueError naming the argument."""

from __future__ import annotations

import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.ops import k_grouped
from deep_fp8_gemm.config import GemmConfig, get_config, k_grouped_config
from deep_fp8_gemm.kernels import gemm, targets
from deep_fp8_gemm.runtime.audit import AuditTarget, audit
from tests._mutate import mutated_headers
from tests._operands import quantised_activations, wgrad_operands

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

VECTOR = ("const F32x2 cv = hal::ld_global_f32x2(c + static_cast<u64>(row) * ld_c + col);\n"
          "                hal::st_global_f32x2(d + static_cast<u64>(row) * ld_d + col,\n"
          "                                     F32x2{cv.x + acc[w][4 * j + 2 * h + 0], cv.y + acc[w][4 * j + 2 * h + 1]});")
SCALAR = ("const u64 dof = static_cast<u64>(row) * ld_d + col, cof = static_cast<u64>(row) * ld_c + col;\n"
          "                const float c0 = c[cof], c1 = c[cof + 1];\n"
          "                d[dof] = c0 + acc[w][4 * j + 2 * h + 0];\n"
          "                d[dof + 1] = c1 + acc[w][4 * j + 2 * h + 1];")


def _target(cfg: GemmConfig) -> AuditTarget:
    return AuditTarget(kind=cfg.kind, config=cfg.as_dict(), name=cfg.kernel_name(), source=gemm.render_source(cfg),
                       **targets.sass_rules(cfg))


def _fp32_configs() -> list[GemmConfig]:
    return [get_config(4096, 2048, 4096, 1, "1d1d", 132), k_grouped_config(2048, 7168, 8, 132)]


def test_the_fp32_kinds_carry_the_vector_rule_and_the_others_do_not():
    for cfg in _fp32_configs():
        rules = targets.sass_rules(cfg)
        assert {"LDG.E.64", "STG.E.64", "QGMMA"} <= set(rules["required_sass"]) and rules["forbidden_sass"] == ("STG.E",)
    assert targets.sass_rules(get_config(4096, 2048, 4096, 1, "dense", 132)) == {}


def test_fp32_epilogue_sass_is_8_byte():
    records = audit([_target(cfg) for cfg in _fp32_configs()], progress=False)
    for record in records:
        assert record["ok"], record["problems"]
        assert record["sass"]["STG.E.64"] > 0 and record["sass"]["LDG.E.64"] > 0 and record["sass"]["STG.E"] == 0


def test_planted_scalar_epilogue_fails_the_audit(tmp_path, monkeypatch):
    mutated_headers(tmp_path, monkeypatch, "policy_1d1d.cuh", VECTOR, SCALAR)
    (record,) = audit([_target(_fp32_configs()[0])], progress=False)
    assert not record["ok"] and record["sass"]["STG.E"] > 0
    assert any(p.startswith("forbidden SASS ['STG.E x") for p in record["problems"]), record["problems"]
    assert any("missing SASS" in p and "STG.E.64" in p for p in record["problems"]), record["problems"]


def _operands(m, n, k, seed):
    a, sa, b, sb, _ = wgrad_operands(m, n, k, seed)
    return a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb)


@needs_gxx
def test_planted_misaligned_column_fails_in_the_simulator(tmp_path, monkeypatch):
    """An off-by-one column makes every pair 4-byte aligned only: a GPU would fault (misaligned address); the
    simulator fails the launch and names the access."""
    from deep_fp8_gemm.simulator import SimulationError

    planted = VECTOR.replace("* ld_d + col,", "* ld_d + col + 1,")
    mutated_headers(tmp_path, monkeypatch, "policy_1d1d.cuh", VECTOR, planted)
    m, n, k = 64, 64, 128
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=64, block_n=64, num_stages=2,
                     cluster_m=1, cluster_n=1, band_width=16, grid_size=1)
    a, sa, b, sb = _operands(m, n, k, seed=3)
    d = torch.zeros(m, n + 8)[:, :n]
    with pytest.raises(SimulationError, match=r"st\.global\.v2\.f32: address .* is not 8-byte aligned"):
        gemm.launch_1d1d(cfg, a, sa, b, sb, d, d, "sim")


def _odd(shape) -> torch.Tensor:
    """A float32 view one element (4 bytes) past an aligned allocation."""
    numel = 1
    for s in shape:
        numel *= s
    return torch.zeros(numel + 4)[1:1 + numel].view(*shape)


@pytest.mark.parametrize("which", ["d", "c"])
def test_odd_element_views_are_refused_by_the_ops(which):
    m, n, k = 64, 64, 128
    a, sa, b, sb = _operands(m, n, k, seed=5)
    d, c = torch.zeros(m, n), torch.zeros(m, n)
    if which == "d":
        d = _odd((m, n))
    else:
        c = _odd((m, n))
    with pytest.raises(ValueError, match=rf"{which}\.data_ptr\(\) must be 16-byte aligned"):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
    ks, kg_m, kg_n = [128, 256], 64, 64
    a2, sa2 = quantised_activations((kg_m, sum(ks)), 7)
    b2, sb2 = quantised_activations((kg_n, sum(ks)), 8)
    # A_g [m, K_g] back to back: the k-grouped op takes flat operands
    flat_a = torch.cat([a2[:, o:o + kk].reshape(-1) for o, kk in zip((0, 128), ks)])
    flat_b = torch.cat([b2[:, o:o + kk].reshape(-1) for o, kk in zip((0, 128), ks)])
    d3, c3 = torch.zeros(2, kg_m, kg_n), torch.zeros(2, kg_m, kg_n)
    if which == "d":
        d3 = _odd((2, kg_m, kg_n))
    else:
        c3 = _odd((2, kg_m, kg_n))
    with pytest.raises(ValueError, match=rf"{which}\.data_ptr\(\) must be 16-byte aligned"):
        k_grouped.k_grouped_gemm_fp8_fp8_fp32_nt((flat_a, sa2), (flat_b, sb2), d3, ks, c=c3)


def test_explicit_config_launchers_refuse_what_the_vector_accesses_cannot_serve():
    m, n, k = 64, 64, 128
    cfg = GemmConfig(kind="1d1d", shape_n=n, shape_k=k, num_groups=1, block_m=64, block_n=64, num_stages=2,
                     cluster_m=1, cluster_n=1, band_width=16, grid_size=1)
    a, sa, b, sb = _operands(m, n, k, seed=6)
    good = torch.zeros(m, n)
    with pytest.raises(ValueError, match=r"d must be 8-byte aligned with an even row stride"):
        gemm.launch_1d1d(cfg, a, sa, b, sb, _odd((m, n)), good, "sim")
    with pytest.raises(ValueError, match=r"c must be 8-byte aligned with an even row stride"):
        gemm.launch_1d1d(cfg, a, sa, b, sb, good, torch.zeros(m, n + 1)[:, :n], "sim")
