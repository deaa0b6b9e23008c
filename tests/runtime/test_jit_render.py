"""Template rendering, kernel naming and path discovery (pure Python, no compiler)."""

from __future__ import annotations

import enum

import pytest

from deep_fp8_gemm.runtime import paths
from deep_fp8_gemm.runtime.render import cpp_literal, kernel_name, render, render_string
from tests.jit_kernels import KERNEL_DIR, probe_source


class _Kind(enum.IntEnum):
    DENSE = 0
    MASKED = 2


def test_literals():
    assert cpp_literal(True) == "true" and cpp_literal(False) == "false"
    assert cpp_literal(7168) == "7168" and cpp_literal(-1) == "-1"
    assert cpp_literal(_Kind.MASKED) == "2"
    assert cpp_literal("dfg::GemmKind::Dense") == "dfg::GemmKind::Dense"
    with pytest.raises(TypeError, match="float"):
        cpp_literal(1.5)


def test_render_substitutes_every_placeholder():
    out = render_string("a={{A}}; b={{ B }}; {{EXTRA_CODE}} again={{A}}", {"A": 128, "B": False}, "// x")
    assert out == "a=128; b=false; // x again=128"


def test_render_rejects_missing_and_unused_constants():
    with pytest.raises(ValueError, match=r"no constant for placeholder\(s\) \['B'\]"):
        render_string("{{A}} {{B}}", {"A": 1})
    with pytest.raises(ValueError, match=r"not used by the template"):
        render_string("{{A}}", {"A": 1, "TYPO": 2})
    with pytest.raises(ValueError, match="extra_code"):
        render_string("{{EXTRA_CODE}}", {"EXTRA_CODE": "x"})


def test_render_is_not_format_or_eval():
    # Braces and format fields in values or template text pass through untouched.
    out = render_string("{x} {{A}} {0}", {"A": "{__import__('os')}"})
    assert out == "{x} {__import__('os')} {0}"


def test_render_file_and_missing_template():
    source = probe_source("k_test")
    assert "DFG_DEFINE_KERNEL(k_test," in source
    assert "struct WgmmaFp8<8>" in source and "{{" not in source
    with pytest.raises(FileNotFoundError):
        render("no_such_template.cu", {}, directory=KERNEL_DIR)


def test_kernel_name_is_deterministic_and_unique():
    a, b = kernel_name("dfg_gemm", "source 1"), kernel_name("dfg_gemm", "source 2")
    assert a == kernel_name("dfg_gemm", "source 1") and a != b
    assert a.startswith("dfg_gemm_") and len(a) == len("dfg_gemm_") + 16
    with pytest.raises(ValueError, match="C identifier"):
        kernel_name("not an identifier", "x")


def test_paths():
    include = paths.include_dir()
    assert (include / "deep_fp8_gemm" / "common.cuh").is_file()
    headers = paths.header_files()
    assert headers == sorted(headers)
    assert include / "deep_fp8_gemm" / "hal" / "ptx.cuh" in headers
    assert all(h.suffix in (".cuh", ".hpp", ".h") for h in headers)
    assert paths.template_dir().is_dir()
