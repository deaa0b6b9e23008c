"""The real GEMM kernels compile for sm_90a, and only for sm_90a (proof that they use its features).

The CI's `python -m deep_fp8_gemm audit --kind all` audits every DeepSeek-V3 config; this test keeps a
representative of each kernel family in the pytest run too, plus the negative sm_90 compile.
"""

from __future__ import annotations

import pytest

from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.kernels.gemm import render_source
from deep_fp8_gemm.runtime.compiler import CompileError, compile_kernel
from deep_fp8_gemm.runtime.sass import disassemble, instruction_histogram

FAMILIES = {
    "dense_decode": (1, 2112, 7168, 1, "dense"),
    "dense_multicast": (4096, 7168, 2048, 1, "dense"),
    "contiguous": (8 * 4096, 4096, 7168, 8, "contiguous"),
    "masked": (256, 7168, 2048, 4, "masked"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_compiles_clean_for_sm90a(family):
    cfg = get_config(*FAMILIES[family], 132)
    kernel = compile_kernel(cfg.kernel_name(), render_source(cfg))
    assert kernel.cubin[:4] == b"\x7fELF"
    assert kernel.resources.spill_bytes == 0 and kernel.resources.stack_bytes == 0
    sass = instruction_histogram(disassemble(kernel.cubin))
    for op in ("QGMMA", "UTMALDG", "UTMASTG", "USETMAXREG"):
        assert sass[op] > 0, f"{op} missing from {cfg.kernel_name()}"
    assert sass["STL"] == sass["LDL"] == 0


def test_plain_sm90_rejects_the_kernel():
    cfg = get_config(128, 7168, 2048, 1, "dense", 132)
    with pytest.raises(CompileError) as excinfo:
        compile_kernel(cfg.kernel_name(), render_source(cfg), arch="sm_90")
    assert "sm_90a" in str(excinfo.value) or "wgmma" in str(excinfo.value) or "setmaxnreg" in str(excinfo.value)
