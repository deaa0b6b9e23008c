"""The FP8-output epilogue takes one IEEE reciprocal per row and 128-column scale block and multiplies every value by
it (epilogue_fp8.cuh, issue 45), where it used to divide every value: the audit bounds an FP8-output kernel's
``MUFU.RCP`` count (``targets.fp8_epilogue_max_rcp``: 2 per thread and m64 wave, the SwiGLU kinds' SiLU division per
value, the kernel's others), checked here on real kernels of both wave counts and of a SwiGLU kind, and on a planted
division per value, which the audit must fail. Numerics: tests/kernels/test_sim_fp8_output.py."""

from __future__ import annotations

import pytest

from deep_fp8_gemm.config import FP8_OUTPUT_KINDS, KINDS, SWIGLU_KINDS, get_config
from deep_fp8_gemm.kernels import gemm, targets
from deep_fp8_gemm.kinds import TABLE
from deep_fp8_gemm.runtime.audit import AuditTarget, audit
from tests._mutate import mutated_headers

RECIPROCAL = "hal::pack_e4m3x2(x0 * inv, x1 * inv);"
DIVISION = "hal::pack_e4m3x2(x0 / scale[w][h], x1 / scale[w][h]); (void)inv;"


def _target(cfg) -> AuditTarget:
    return AuditTarget(kind=cfg.kind, config=cfg.as_dict(), name=cfg.kernel_name(), source=gemm.render_source(cfg),
                       **targets.sass_rules(cfg))


def _configs():
    """DeepSeek-V3 picks: one m64 wave (BLOCK_M 64), two (BLOCK_M 256, two math warpgroups), and a SwiGLU kernel."""
    configs = [get_config(64, 4096, 7168, 1, "dense_fp8out", 132), get_config(4096, 4096, 7168, 1, "dense_fp8out", 132),
               get_config(4096, 4096, 7168, 4, "contiguous_swiglu", 132)]
    assert [c.waves_m for c in configs] == [1, 2, 1]
    return configs


def test_fp8_output_kinds_carry_the_rcp_bound_and_the_others_do_not():
    for kind in KINDS:
        layout = TABLE.row(kind).layout
        if layout == "k_grouped":  # configs of its own (k_grouped_config); an fp32-output kind (test_fp32_epilogue)
            continue
        cfg = get_config(4096, 4096, 7168, 1 if layout == "dense" else 4, kind, 132)
        rules = targets.sass_rules(cfg)
        if kind not in FP8_OUTPUT_KINDS:
            assert "max_sass" not in rules, kind
            continue
        silu = targets.SWIGLU_SILU_RCP_PER_WAVE if kind in SWIGLU_KINDS else 0
        bound = cfg.waves_m * (targets.FP8_EPILOGUE_RCP_PER_WAVE + silu) + targets.GEMM_OTHER_RCP
        assert rules["max_sass"] == (("MUFU.RCP", bound),), kind
        # a division per value (64 per thread and wave) cannot fit under it
        assert bound < cfg.waves_m * (64 + silu), kind


def test_fp8_epilogue_takes_one_reciprocal_per_row_block():
    records = audit([_target(cfg) for cfg in _configs()], progress=False)
    for cfg, record in zip(_configs(), records):
        assert record["ok"], (record["name"], record["problems"])
        silu = targets.SWIGLU_SILU_RCP_PER_WAVE if cfg.kind in SWIGLU_KINDS else 0
        rcp = record["sass"]["MUFU.RCP"]
        # the epilogue's own: at least the 2 per wave; the rest are the kernel's (bf16 kernels hold 2-4)
        assert cfg.waves_m * (2 + silu) <= rcp <= targets.fp8_epilogue_max_rcp(cfg), (record["name"], rcp)


@pytest.mark.parametrize("which", [1, 2], ids=["swiglu", "two_waves"])
def test_planted_division_per_value_fails_the_audit(which, tmp_path, monkeypatch):
    mutated_headers(tmp_path, monkeypatch, "epilogue_fp8.cuh", RECIPROCAL, DIVISION)
    cfg = _configs()[2 if which == 1 else 1]
    (record,) = audit([_target(cfg)], progress=False)
    assert not record["ok"] and record["sass"]["MUFU.RCP"] > targets.fp8_epilogue_max_rcp(cfg)
    assert any("MUFU.RCP" in p for p in record["problems"]), record["problems"]
