"""``python -m deep_fp8_gemm`` commands on a machine without a GPU (test kernels stand in for the GEMMs)."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import subprocess
import sys
import types

import pytest

from deep_fp8_gemm import cli
from deep_fp8_gemm.runtime.audit import AuditTarget
from tests.jit_kernels import PYTHON, REPO_ROOT, SPILL_OPTIONS, jit_cache, probe_source, simple_source, subprocess_env  # noqa: F401


def _probe_target(name: str = "dfg_test_cli_probe") -> AuditTarget:
    return AuditTarget("dense", {"block_m": 64, "smem_bytes": 4104}, name, probe_source(name))


@pytest.fixture
def targets(monkeypatch):
    """Replaces the kernel families' target lists with the given test kernels."""
    chosen: list[AuditTarget] = []
    monkeypatch.setattr(cli, "collect_targets", lambda *args, **kwargs: list(chosen))
    return chosen


def test_audit_json_stdout_is_only_json(jit_cache, targets, capsys):
    targets.append(_probe_target())
    assert cli.main(["audit", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    (record,) = json.loads(out)
    assert record["ok"] and record["name"] == "dfg_test_cli_probe" and record["smem_bytes"] == 4104
    assert set(record) >= {"kind", "config", "compile_seconds", "cache_hit", "registers", "spill_bytes",
                           "smem_bytes", "sass", "warnings"}
    assert all(record["sass"][op] >= 0 for op in ("QGMMA", "UTMALDG", "UTMASTG", "USETMAXREG", "STL", "LDL"))
    assert "1/1" in err  # progress bar on stderr


def test_audit_jobs_gives_the_same_records_in_order(jit_cache, capsys, tmp_path):
    """``audit --jobs 2`` (worker processes, each its share) reports the same kernels in the same order, with the same
    binaries, as one process."""
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert cli.main(["audit", "--kind", "tf32", "--json", str(one)]) == 0
    assert cli.main(["audit", "--kind", "tf32", "--jobs", "2", "--json", str(two)]) == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert len(a) == 2 and [(r["name"], r["cubin_sha256"], r["ok"]) for r in a] == \
        [(r["name"], r["cubin_sha256"], r["ok"]) for r in b]
    assert cli.main(["audit", "--kind", "tf32", "--jobs", "0"]) == 2
    assert "--jobs must be positive, got 0" in capsys.readouterr().err


def test_audit_failure_sets_exit_status_and_writes_table(jit_cache, targets, capsys, tmp_path):
    targets += [_probe_target("dfg_test_cli_ok"),
                AuditTarget("test", {}, "dfg_test_cli_spill", simple_source("spill.cu", "dfg_test_cli_spill"),
                            required_sass=(), options=SPILL_OPTIONS)]
    report = tmp_path / "audit.json"
    assert cli.main(["audit", "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "dfg_test_cli_spill" in out and "FAIL" in out and "2 kernels, 1 failed" in out
    assert [r["ok"] for r in json.loads(report.read_text())] == [True, False]


def test_precompile_fills_the_cache(jit_cache, targets, capsys):
    targets.append(_probe_target("dfg_test_cli_pre"))
    assert cli.main(["precompile", "--shapes", "7168,2048", "--m", "64,128"]) == 0
    assert "precompiled 1 kernels (1 compiled, 0 cached, 0 failed)" in capsys.readouterr().out
    assert cli.main(["cache", "info"]) == 0
    assert "entries: 1" in capsys.readouterr().out


def test_precompile_check_names_what_the_cache_lacks_and_compiles_nothing(jit_cache, targets, capsys):
    targets += [_probe_target("dfg_test_cli_chk_a"), _probe_target("dfg_test_cli_chk_b")]
    assert cli.main(["precompile", "--check"]) == 1  # an empty cache: both missing, nothing compiled
    out = capsys.readouterr().out
    assert "missing: dfg_test_cli_chk_a" in out and "missing: dfg_test_cli_chk_b" in out and "0 of 2 kernels" in out
    assert not list(jit_cache.glob("*.cubin"))
    del targets[1]
    assert cli.main(["precompile"]) == 0
    capsys.readouterr()
    targets.append(_probe_target("dfg_test_cli_chk_b"))
    assert cli.main(["precompile", "--check"]) == 1
    out = capsys.readouterr().out
    assert "missing: dfg_test_cli_chk_b" in out and "chk_a" not in out.split("1 of 2")[0]
    assert "1 of 2 kernels" in out and "warm start: 1 cubins read and verified in" in out
    # A damaged entry counts as missing (the checksum is verified, as a load would)
    (cubin,) = jit_cache.glob("*.cubin")
    data = cubin.read_bytes()
    cubin.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    del targets[1]
    assert cli.main(["precompile", "--check"]) == 1 and "missing: dfg_test_cli_chk_a" in capsys.readouterr().out


def test_precompile_check_times_the_driver_load_only_where_a_gpu_is(jit_cache, targets, capsys, monkeypatch):
    """The warm start's driver part: without an sm_90 GPU it says it was not timed; with one (the device and the
    driver calls stood in for here; tests/gpu/test_gpu_jit.py runs the real ones) every present cubin, and only
    those, is loaded by its cache key and made resident."""
    from deep_fp8_gemm.runtime import driver

    targets += [_probe_target("dfg_test_cli_warm_a"), _probe_target("dfg_test_cli_warm_b")]
    assert cli.main(["precompile"]) == 0
    targets.append(_probe_target("dfg_test_cli_warm_c"))  # not in the cache
    capsys.readouterr()
    assert cli.main(["precompile", "--check"]) == 1
    assert "driver part: not timed (no sm_90 GPU here" in capsys.readouterr().out
    loaded, resident = [], []
    monkeypatch.setattr(cli, "_sm90_device", lambda: 3)
    monkeypatch.setattr(driver, "load_kernel",
                        lambda cubin, name, device, *, key: loaded.append((name, device, key, cubin[:4])) or name)
    monkeypatch.setattr(driver, "make_resident", resident.append)
    assert cli.main(["precompile", "--check"]) == 1
    out = capsys.readouterr().out
    assert "missing: dfg_test_cli_warm_c" in out and "driver part: 2 kernels loaded on GPU 3 in" in out
    assert [(n, d, c) for n, d, _, c in loaded] == [("dfg_test_cli_warm_a", 3, b"\x7fELF"),
                                                   ("dfg_test_cli_warm_b", 3, b"\x7fELF")]
    assert all(len(key) == 64 for _, _, key, _ in loaded) and resident == ["dfg_test_cli_warm_a", "dfg_test_cli_warm_b"]


def test_bad_arguments_exit_2(capsys):
    assert cli.main(["audit", "--shapes", "7168"]) == 2
    assert "shape must be N,K" in capsys.readouterr().err
    assert cli.main(["precompile", "--num-sms", "0"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["audit", "--kind", "sparse"])


def test_cache_info_and_clear(jit_cache, capsys):
    """info: the checks' result, then cubins, simulator libraries and saved failing sources; clear: all three."""
    (jit_cache / "sim").mkdir(parents=True)
    (jit_cache / "errors").mkdir()
    (jit_cache / ("0" * 64 + ".json")).write_text("{}")
    (jit_cache / ("0" * 64 + ".cubin")).write_bytes(b"\x7fELF")
    (jit_cache / "sim" / f"k_{'0' * 24}.json").write_text("{}")
    (jit_cache / "sim" / f"k_{'0' * 24}.so").write_bytes(b"lib")
    (jit_cache / "errors" / f"k-{'0' * 16}.cu").write_text("bad")
    assert cli.main(["cache", "info"]) == 0
    me = f"{pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})"
    assert capsys.readouterr().out == (
        f"dir: {jit_cache}\nchecks: ok: owned by {me}, mode 0700; neither it, its subfolders nor its "
        "ancestors can be written by anyone else (a sticky temp root excepted)\nentries: 1\nbytes: 6\n"
        f"simulator libraries: 1 (5 bytes in {jit_cache / 'sim'})\n"
        f"saved failing sources: 1 (3 bytes in {jit_cache / 'errors'})\n")
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 entries, 1 simulator libraries and 1 saved sources" in capsys.readouterr().out
    assert sorted(p.name for p in jit_cache.rglob("*")) == ["errors", "sim"]  # the owner-only folders stay


def test_module_entry_point_env_and_cache(jit_cache):
    """``python -m deep_fp8_gemm`` in a real process (one per command: each pays the package import)."""
    env = subprocess_env(DFG_JIT_CACHE_DIR=str(jit_cache))

    def run(*args):
        result = subprocess.run([PYTHON, "-m", "deep_fp8_gemm", *args], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    out = run("env")
    for field in ("torch:", "device:", "nvrtc:", "cache dir:", "disassembler:"):
        assert field in out
    assert str(jit_cache) in out
    assert "entries: 0" in run("cache", "info")


@pytest.mark.skipif(importlib.util.find_spec("deep_fp8_gemm.kernels.gemm") is None,
                    reason="deep_fp8_gemm.kernels.gemm (GEMM audit targets) not present yet")
def test_audit_real_gemm_kernel(jit_cache, capsys):
    status = cli.main(["audit", "--kind", "dense", "--shapes", "7168,2048", "--m", "128", "--json", "-"])
    records = json.loads(capsys.readouterr().out)
    assert records and all(r["kind"] == "dense" for r in records)
    assert status == (0 if all(r["ok"] for r in records) else 1)
    assert all(r["ok"] for r in records), [r["problems"] for r in records]


def test_demo_gets_its_arguments_untouched(monkeypatch):
    seen = []
    fake = types.ModuleType("deep_fp8_gemm.demo")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "deep_fp8_gemm.demo", fake)
    assert cli.main(["demo", "--size", "3", "-h"]) == 0
    assert seen == [["--size", "3", "-h"]]


# --- the audit's exit status: what CI gates (issue 24, item 5) ------------------------------------------------------
def _tiny_ceilings(monkeypatch):
    """Every dense kernel over its K-loop ceilings (the per-tile keys too)."""
    from deep_fp8_gemm.runtime import kloop

    real = kloop.load_ceilings()
    tiny = {key: 0.01 for key in real["dense"] if key.startswith("issue_per_tensor_cycle_")}
    monkeypatch.setattr(kloop, "load_ceilings", lambda path=None: dict(real, dense=tiny))


def test_audit_gates_the_k_loop_of_the_kernels_ci_gates_only(jit_cache, monkeypatch, capsys):
    """With every ceiling tiny: 256x512 at m=64 is a user shape (over the ceiling: reported as a note, exit 0; it
    used to exit 1), while dense 2112x7168 at m=64 gives picks of the DeepSeek-V3 table (both modes' picks, each
    gated: over a ceiling -> exit 1). The table's issue/tc column is filled (it used to be blank)."""
    _tiny_ceilings(monkeypatch)
    assert cli.main(["audit", "--kind", "dense", "--shapes", "256,512", "--m", "64"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("dense "))
    assert line.split()[-4] == "1.312", line  # issue/tc, before compile s / cache / status
    assert "note: math loop issues 1.312 slots per tensor cycle > ceiling 0.01" in out and "not gated" in out
    assert cli.main(["audit", "--kind", "dense", "--shapes", "2112,7168", "--m", "64", "--json", "-"]) == 1
    records = json.loads(capsys.readouterr().out)
    assert records and all(r["kloop_gated"] and not r["ok"] and "> ceiling 0.01" in r["problems"][0]
                           for r in records)


def test_watchdog_build_is_gated_on_spills_and_sass_only(jit_cache, monkeypatch, capsys):
    """DFG_WATCHDOG_SECONDS=5: the debug build's extra loop instructions are figures, not failures (it used to exit
    1 for the DeepSeek-V3 dense 4096x7168 kernel at m=128)."""
    _tiny_ceilings(monkeypatch)
    monkeypatch.setenv("DFG_WATCHDOG_SECONDS", "5")
    assert cli.main(["audit", "--kind", "dense", "--shapes", "2112,7168", "--m", "64", "--json", "-"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records
    for record in records:
        assert record["watchdog"] and record["ok"] and record["kloop_gated"] is False and record["kloop"]
        assert record["notes"] and "the watchdog build" in record["notes"][0] and not record["problems"]


def test_audit_argument_errors_are_messages_not_tracebacks(capsys):
    assert cli.main(["audit", "--kind", "dense", "--shapes", "512,1000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no kernel for --kind dense --shapes 512,1000: ") and "k % 16 == 0" in err
    assert "Traceback" not in err
    for extra in (["--shapes", "4096,7168"], ["--m", "64"], ["--num-groups", "4"]):
        assert cli.main(["audit", "--kind", "quant", *extra]) == 2
        assert "do not apply to --kind quant" in capsys.readouterr().err


def test_help_says_the_demo_runs_without_a_gpu():
    description = cli.build_parser().description
    assert "all of it works without a GPU" in description and "but ``demo``" not in description
