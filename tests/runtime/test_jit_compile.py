"""NVRTC compile path, ptxas report parsing, SASS histogram and the static audit (CPU only)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from deep_fp8_gemm.runtime import sass
from deep_fp8_gemm.runtime.audit import AuditTarget, audit, format_table
from deep_fp8_gemm.runtime.compiler import CompileError, compile_kernel, nvrtc_options, nvrtc_version
from deep_fp8_gemm.runtime.resources import KernelResources, parse_ptxas_log
from tests.jit_kernels import SPILL_OPTIONS, jit_cache, probe_source, simple_source  # noqa: F401 (fixture)

# Real NVRTC 13.5 logs (--ptxas-options=-v) of tests/jit_kernels/spill.cu and setmaxnreg_no_bounds.cu.
SPILL_LOG = """\
ptxas info    : Overriding maximum register limit 256 for 'k_spill' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_spill' for 'sm_90a'
ptxas info    : Function properties for k_spill
ptxas         .     288 bytes stack frame, 552 bytes spill stores, 584 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 288 bytes cumulative stack size
ptxas info    : Compile time = 23.503 ms
\x00"""
WARNING_LOG = """\
ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at entry.
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_setma' for 'sm_90a'
ptxas info    : Function properties for k_setma
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 2.722 ms
"""
# Older ptxas format with constant-bank usage and two functions, plus a warning line.
TWO_FUNCTION_LOG = """\
ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Function properties for other
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 380 bytes cmem[0]
ptxas warning : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized
ptxas info    : Compiling entry function 'gemm' for 'sm_90a'
ptxas info    : Function properties for gemm
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, 2048 bytes smem, 544 bytes cmem[0], 8 bytes cmem[2]
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The wgmma probe compiled once for this module (in a private cache), with its SASS histogram."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DFG_JIT_CACHE_DIR", str(tmp_path_factory.mktemp("probe-cache")))
    try:
        kernel = compile_kernel("dfg_test_probe", probe_source("dfg_test_probe"))
    finally:
        mp.undo()
    return kernel, sass.instruction_histogram(sass.disassemble(kernel.cubin))


# ---------------------------------------------------------------------------------------- parser
def test_parse_spill_log():
    res = parse_ptxas_log(SPILL_LOG, "k_spill")
    assert (res.registers, res.stack_bytes, res.spill_store_bytes, res.spill_load_bytes) == (32, 288, 552, 584)
    assert res.spill_bytes == 1136 and res.warnings == ()


def test_parse_warning_log():
    res = parse_ptxas_log(WARNING_LOG)  # default: first entry function
    assert res.registers == 12 and res.static_smem_bytes == 1024 and res.warnings == ("C7508",)


def test_parse_selects_the_named_function():
    res = parse_ptxas_log(TWO_FUNCTION_LOG, "gemm")
    assert res == KernelResources(registers=168, static_smem_bytes=2048, cmem_bytes={0: 544, 2: 8},
                                  warnings=("C7511",))
    assert parse_ptxas_log(TWO_FUNCTION_LOG, "other").stack_bytes == 8
    assert parse_ptxas_log("", "gemm") == KernelResources()


def test_resources_json_round_trip():
    res = parse_ptxas_log(TWO_FUNCTION_LOG, "gemm")
    assert KernelResources.from_json(res.to_json()) == res
    with pytest.raises(ValueError, match="malformed"):
        KernelResources.from_json({"registers": 1})


# ---------------------------------------------------------------------------------------- compile
def test_probe_compiles_to_sm90a_cubin(probe):
    kernel, _ = probe
    assert kernel.cubin[:4] == b"\x7fELF" and kernel.name == "dfg_test_probe"
    assert kernel.cache_hit == "" and kernel.compile_seconds > 0 and len(kernel.key) == 64
    assert kernel.resources.registers > 0 and kernel.resources.spill_bytes == 0
    assert kernel.resources.stack_bytes == 0 and kernel.resources.warnings == ()
    assert "Compiling entry function 'dfg_test_probe' for 'sm_90a'" in kernel.ptxas_log
    assert nvrtc_version() >= (12, 0)
    assert "--gpu-architecture=sm_90a" in nvrtc_options()


def test_probe_sass_has_hopper_instructions(probe):
    _, histogram = probe
    for opcode in ("QGMMA", "UTMALDG", "USETMAXREG", "WARPGROUP", "SYNCS"):
        assert histogram[opcode] > 0, opcode
    assert histogram["USETMAXREG"] == 2 and histogram["UTMALDG"] == 2
    assert histogram["STL"] == 0 and histogram["LDL"] == 0


def test_nvdisasm_without_dataflow_gives_the_plain_text(probe):
    """sass.NVDISASM_OPTIONS leaves out nvdisasm's dataflow pass (20% of its time): the text must be what plain
    ``-c`` prints, on the probe and on a shipped kernel with the most control flow (the MXFP4 register-A kernel:
    two K loops, per-tile branches)."""
    import subprocess

    from deep_fp8_gemm.kernels import mxfp4_gemm

    tool, path = sass.find_disassembler()
    if tool != "nvdisasm":
        pytest.skip(f"the disassembler here is {tool}")
    shipped = compile_kernel(*mxfp4_gemm.render_source(mxfp4_gemm.audit_configs()[0])).cubin
    for cubin in (probe[0].cubin, shipped):
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / "k.cubin"
            file.write_bytes(cubin)
            plain = subprocess.run([str(path), "-c", str(file)], capture_output=True, text=True, check=True).stdout
        assert sass.disassemble(cubin) == plain and "-ndf" in sass.NVDISASM_OPTIONS


def test_histogram_parsing():
    text = """
        /*0050*/               @P0 BRA `(.L_x_1) ;
        /*0060*/              @!UP1 QGMMA.64x8x32.F32.E4M3.E4M3 gdesc[UR4], RZ, !UPT ;
        /*0070*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;
        /*0080*/                   STL [R1], R2 ;                                  /* 0x000fe20003800000 */
    """
    assert sass.instruction_histogram(text) == {"BRA": 1, "QGMMA": 1, "USETMAXREG": 1, "STL": 1}


def test_plain_sm90_rejects_wgmma_and_setmaxnreg(jit_cache):
    with pytest.raises(CompileError) as info:
        compile_kernel("dfg_test_probe_sm90", probe_source("dfg_test_probe_sm90"), arch="sm_90")
    assert "not supported on .target 'sm_90'" in info.value.log


def test_syntax_error_surfaces_log_and_source(jit_cache):
    source = simple_source("syntax_error.cu", "dfg_test_syntax")
    with pytest.raises(CompileError) as info:
        compile_kernel("dfg_test_syntax", source)
    message = str(info.value)
    assert 'error: expected a ";"' in message and str(info.value.source_path) in message
    assert info.value.source_path.read_text() == source
    assert not list(jit_cache.glob("*.json"))  # nothing cached for a failed compile


def test_spilling_kernel_reports_spills(jit_cache):
    kernel = compile_kernel("dfg_test_spill", simple_source("spill.cu", "dfg_test_spill"), options=SPILL_OPTIONS)
    assert kernel.resources.registers <= 32
    assert kernel.resources.spill_store_bytes > 0 and kernel.resources.spill_load_bytes > 0


def test_setmaxnreg_without_bounds_warns(jit_cache):
    kernel = compile_kernel("dfg_test_c7508", simple_source("setmaxnreg_no_bounds.cu", "dfg_test_c7508"))
    assert "C7508" in kernel.resources.warnings


def test_debug_dumps_and_verbose_log(jit_cache, monkeypatch, capsys):
    monkeypatch.setenv("DFG_JIT_DEBUG", "1")
    monkeypatch.setenv("DFG_JIT_PTXAS_VERBOSE", "1")
    kernel = compile_kernel("dfg_test_debug", probe_source("dfg_test_debug"))
    err = capsys.readouterr().err
    assert "ptxas report for dfg_test_debug" in err and "compiled dfg_test_debug in" in err
    assert kernel.source_path == jit_cache / f"{kernel.key}.cu" and kernel.source_path.is_file()
    assert ".target sm_90a" in (jit_cache / f"{kernel.key}.ptx").read_text()
    assert "QGMMA" in (jit_cache / f"{kernel.key}.sass").read_text()


# ---------------------------------------------------------------------------------------- audit
def test_audit_passes_and_fails_the_right_kernels(jit_cache):
    targets = [
        AuditTarget("dense", {"smem_bytes": 4104}, "dfg_test_audit_probe", probe_source("dfg_test_audit_probe")),
        AuditTarget("test", {}, "dfg_test_audit_spill", simple_source("spill.cu", "dfg_test_audit_spill"),
                    required_sass=(), options=SPILL_OPTIONS),
        AuditTarget("test", {}, "dfg_test_audit_c7508",
                    simple_source("setmaxnreg_no_bounds.cu", "dfg_test_audit_c7508"), required_sass=("USETMAXREG",)),
        AuditTarget("dense", {}, "dfg_test_audit_syntax", simple_source("syntax_error.cu", "dfg_test_audit_syntax")),
    ]
    probe, spill, c7508, syntax = audit(targets, progress=False)

    assert probe["ok"], probe["problems"]
    assert probe["smem_bytes"] == 4104 and probe["spill_bytes"] == 0 and probe["cache_hit"] == ""
    assert probe["sass"]["QGMMA"] >= 1 and probe["sass"]["UTMASTG"] == 0

    assert not spill["ok"] and spill["sass"]["STL"] > 0
    assert any("spills" in p for p in spill["problems"]) and any("STL" in p for p in spill["problems"])

    assert not c7508["ok"] and c7508["warnings"] == ["C7508"]
    assert any("C7508" in p for p in c7508["problems"])

    assert not syntax["ok"] and "compile failed" in syntax["problems"][0]

    table = format_table([probe, spill, c7508, syntax])
    assert "dfg_test_audit_probe" in table and "4 kernels, 3 failed" in table
