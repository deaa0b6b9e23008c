"""The audit's register-split rule (setmaxnreg), on hand-made numbers and on a real kernel config."""

from __future__ import annotations

import pytest

from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.runtime.audit import _check_register_split


def _problems(registers: int, **config) -> list[str]:
    record = {"problems": []}
    _check_register_split(record, config, registers)
    return record["problems"]


@pytest.mark.parametrize("registers,ok", [(168, True), (160, False), (240, False)])
def test_384_thread_split(registers, ok):
    # 128 producer threads 168 -> 40 free 16384 registers; 256 math threads 168 -> 232 need 16384.
    config = dict(producer_registers=40, math_registers=232, num_math_warpgroups=2)
    assert (not _problems(registers, **config)) == ok


def test_256_thread_split_rejects_allocation_above_the_math_target():
    config = dict(producer_registers=40, math_registers=240, num_math_warpgroups=1)
    assert not _problems(240, **config)
    assert _problems(248, **config), "setmaxnreg.inc to fewer registers than allocated is undefined"


def test_gemm_configs_carry_the_split():
    cfg = get_config(4096, 7168, 2048, 1, "dense", 132).as_dict()
    assert {"producer_registers", "math_registers", "num_math_warpgroups"} <= cfg.keys()
    assert not _problems(168 if cfg["num_math_warpgroups"] == 2 else 240, **cfg)
    assert _problems(0, kind="quant") == []  # kernels without a split are not checked
