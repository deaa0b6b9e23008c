"""CPU tests of the benchmark tooling: shape tables, counting formulas, the timing statistics, the report
writers (synthetic results), the pipeline on tiny CPU shapes, device_check.sh's argument handling and
--dry-run, and the demo's no-GPU path. No GPU and no timing claims: the numbers here test code paths."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import report, shapes, timing
from bench.shapes import ContiguousShape, DenseShape, MaskedShape

REPO = Path(__file__).resolve().parents[2]


# --- shape tables -----------------------------------------------------------------------------------------

def test_dense_tables_have_expected_sizes():
    assert len(shapes.dense_shapes("deepseek-v3")) == 7 * 3
    assert len(shapes.dense_shapes("decode")) == 7 * 10
    assert len(shapes.dense_shapes("all")) == 7 * 12  # {1..64} ∪ {128} ∪ {256, 1024, 2048, 4096}, no duplicates
    quick = shapes.dense_shapes("decode", quick=True)
    assert set(quick) < set(shapes.dense_shapes("decode"))
    with pytest.raises(ValueError, match="unknown dense table"):
        shapes.dense_shapes("llama")


@pytest.mark.parametrize("quick", [False, True])
def test_every_published_shape_is_benchmarked(quick):
    tables = {"dense": shapes.dense_shapes("deepseek-v3", quick), "contiguous": shapes.contiguous_shapes(quick),
              "masked": shapes.masked_shapes(quick)}
    for shape in shapes.H800_PUBLISHED:
        assert shape in tables[shape.family], shape
    assert len(shapes.H800_PUBLISHED) == 18 + 4 + 6


def test_shapes_are_legal_for_the_ops():
    everything = (shapes.dense_shapes("all") + shapes.contiguous_shapes() + shapes.masked_shapes()
                  + list(shapes.SMOKE_SHAPES))
    for s in everything:
        assert s.n % 8 == 0 and s.k % 16 == 0, s  # the ops' TMA rules
        assert s.k % 512 == 0 or s in shapes.SMOKE_SHAPES, s  # safe block-scaled cuBLAS baseline
        assert s.flops() > 0 and s.bytes() > 0
        assert shapes.shape_from_dict(shapes.shape_to_dict(s)) == s
    for s in shapes.contiguous_shapes():
        assert s.segment % 128 == 0 and s.m_sum >= s.valid_m


@pytest.mark.parametrize("shape", sorted(shapes.H800_PUBLISHED_DENSE))
def test_bytes_formula_matches_published_bandwidth(shape):
    tflops, gbs = shapes.H800_PUBLISHED_DENSE[shape]
    seconds = shape.flops() / (tflops * 1e12)
    assert shape.bytes() / seconds / 1e9 == pytest.approx(gbs, rel=0.02)


def test_flops_and_bytes_by_hand():
    d = DenseShape(64, 2112, 7168)
    assert d.flops() == 2 * 64 * 2112 * 7168
    assert d.bytes() == 64 * 7168 + 64 * 56 * 4 + 2112 * 7168 + 17 * 56 * 4 + 64 * 2112 * 2
    c = ContiguousShape(4, 100, 256, 512, pad_per_group=50)
    assert (c.segment, c.m_sum, c.valid_m) == (256, 1024, 400)
    assert c.flops() == 2 * 400 * 256 * 512  # valid rows only
    assert c.bytes() == 400 * 512 + 400 * 4 * 4 + 4 * (256 * 512 + 2 * 4 * 4) + 400 * 256 * 2
    m = MaskedShape(2, 5, 256, 512, m_max=16)
    assert (m.rows_per_group, m.valid_m, m.flops()) == (16, 10, 2 * 10 * 256 * 512)
    assert MaskedShape(4, 256, 4096, 7168).rows_per_group == 256


# --- timing -------------------------------------------------------------------------------------------------

def test_summarize_statistics():
    s = timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median_us, s.min_us, s.runs) == (3.0, 1.0, 5)
    assert s.p20_us <= s.median_us <= s.p80_us
    assert s.spread == pytest.approx((s.p80_us - s.p20_us) / 3.0)
    with pytest.raises(ValueError):
        timing.summarize([])


def test_time_call_on_cpu_counts_runs_and_rotates_inputs():
    seen = []
    stats = timing.time_call(lambda i: seen.append(i), [(0,), (1,), (2,)], device="cpu",
                             flusher=timing.L2Flusher("cpu"), runs=20, warmup=2)
    assert stats.runs == 20
    assert seen[:3] == [0, 0, 1] and set(seen[3:]) == {0, 1, 2}  # JIT call, warm-up, then every copy
    with pytest.raises(ValueError, match="runs must be"):
        timing.time_call(lambda: None, [()], device="cpu", flusher=None, runs=5)


def test_split_per_call_sums_kernels_between_flushes():
    kernels = [("flush", 0, 50), ("gemm", 60, 5), ("reduce", 66, 1), ("flush", 70, 50), ("gemm", 130, 6),
               ("early", -10, 99)]  # a record before the first flush is ignored
    assert timing.split_per_call(kernels, {"flush"}) == [6, 6]
    assert timing.split_per_call([("gemm", 0, 5)], {"flush"}) == []


def test_check_rejects_unwritten_output():
    torch = pytest.importorskip("torch")
    pytest.importorskip("deep_fp8_gemm")
    ref = torch.randn(8, 16, dtype=torch.float64)
    assert timing.check(ref.to(torch.bfloat16), ref)[0]
    poisoned = ref.clone()
    poisoned[3, 4] = float("nan")
    assert not timing.check(poisoned, ref)[0]
    assert not timing.check(-ref, ref)[0]


# --- report -------------------------------------------------------------------------------------------------

def _synthetic_rows() -> list[dict]:
    rows = []
    for shape, ours_us, cublas in ((DenseShape(64, 2112, 7168), 5.0, {"status": "ok", "us": 10.0, "us_kernel": 8.0}),
                                   (DenseShape(128, 576, 7168), 4.0, {"status": "n/a", "note": "unsupported"}),
                                   (DenseShape(4096, 7168, 2048), 200.0, {"status": "wrong", "diff": 0.5})):
        ours = {"status": "ok", "us": ours_us, "us_kernel": ours_us - 1, "diff": 2e-6, "runs": 20,
                "tflops": shape.flops() / ours_us / 1e6, "gbs": shape.bytes() / ours_us / 1e3}
        rows.append({"shape": shapes.shape_to_dict(shape), "label": shape.label, "flops": shape.flops(),
                     "bytes": shape.bytes(), "h800_published_tflops": shapes.h800_published(shape),
                     "impls": {report.OURS: ours, "cublas_block": cublas,
                               "bf16_matmul": {"status": "ok", "us": ours_us * 3}}})
    rows.append({"shape": shapes.shape_to_dict(DenseShape(1, 2112, 7168)), "label": "m=1 n=2112 k=7168",
                 "flops": 1, "bytes": 1, "h800_published_tflops": None,
                 "impls": {report.OURS: {"status": "skipped", "note": "time budget"}}})
    return rows


def test_speedups_and_headline():
    rows = _synthetic_rows()
    assert report.speedup(rows[0], "cublas_block") == pytest.approx(2.0)
    assert report.speedup(rows[0], "cublas_block", "us_kernel") == pytest.approx(2.0)  # 8 / (5 - 1)
    assert report.speedup(rows[1], "cublas_block") is None  # baseline unsupported
    assert report.speedup(rows[2], "cublas_block") is None  # baseline wrong: no speedup claimed
    assert report.speedup(rows[0], shapes.H800_LABEL) == pytest.approx(rows[0]["impls"][report.OURS]["tflops"] / 206)
    assert report.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    text = "\n".join(report.headline(rows))
    assert "3/4 shapes" in text and "bf16 matmul: **3.00x**" in text
    table = report.compact_table(rows).splitlines()
    assert len(table) == 5 and "2.00" in table[1] and table[4].endswith("skipped")


def test_write_family_outputs(tmp_path):
    rows = _synthetic_rows()
    env = {"gpu": "Synthetic GPU", "driver": "0", "cuda": "13.0", "torch": "x", "date": "2026-01-01 00:00 UTC"}
    paths = report.write_family("dense-test", rows, env, tmp_path,
                                extra={"host_overhead": [{"impl": report.OURS, "label": "m=1", "calls": 200,
                                                          "host_us": 6.0, "wall_us": 6.5, "gpu_us": 6.4,
                                                          "kernel_us": 5.0}]}, plot=True)
    doc = json.loads((tmp_path / "dense-test.json").read_text())
    assert doc["family"] == "dense-test" and len(doc["rows"]) == 4 and "L2 flush" in doc["method"]
    md = (tmp_path / "dense-test.md").read_text()
    assert "| m=64 n=2112 k=7168 | 5.0 | 4.0 |" in md and "2.00x" in md and "Host overhead" in md
    assert "kernel µs (CUPTI)" in md
    assert "wrong result" in md and "skipped" in md
    if any(p.suffix == ".png" for p in paths):
        assert (tmp_path / "dense-test.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        pytest.importorskip("matplotlib")  # only acceptable when matplotlib is missing


def test_summary_without_and_with_results(tmp_path):
    summary = tmp_path / "RESULTS.md"
    report.write_summary(tmp_path / "none", summary)
    text = summary.read_text()
    assert report.NOT_MEASURED in text
    assert "| dense | m=4096 n=7168 k=16384 | 1520 | 384 |" in text  # the reference table
    assert "| masked | G=4 m=256 n=7168 k=2048 | 815 | – |" in text
    # m=64 n=2112 k=7168 moves 15.9 MB: memory-bound, 3.3 µs at 4.8 TB/s.
    assert "| dense | m=64 n=2112 k=7168 | 206 | 1688 | 9.4 | 3.3 | memory |" in text
    report.write_family("dense-test", _synthetic_rows(), {"gpu": "Synthetic GPU", "quick": True}, tmp_path, plot=False)
    assert report.main(["--results", str(tmp_path), "--summary", str(summary)]) == 0
    text = summary.read_text()
    assert report.NOT_MEASURED not in text and "Synthetic GPU" in text and "geomean speedup" in text


def test_summary_skips_the_host_runs_file(tmp_path):
    """bench/results/host_stub.json (bench_host's recorded runs) sits beside the families' JSONs and is its own
    section: the summary must not read it as a family (it has no "env"; the default results directory holds it)."""
    (tmp_path / report.HOST_RESULTS.name).write_text('{"what": "w", "machine": "m", "runs": []}')
    summary = tmp_path / "RESULTS.md"
    assert report.main(["--results", str(tmp_path), "--summary", str(summary)]) == 0
    assert report.NOT_MEASURED in summary.read_text()


# --- the pipeline on tiny CPU shapes -------------------------------------------------------------------------

@pytest.mark.parametrize("entry, argv", [
    ("bench.bench_dense", ["--shapes", "smoke", "--no-host-overhead"]),
    ("bench.bench_grouped", ["--kind", "masked", "--smoke"]),
    ("bench.bench_grouped", ["--kind", "contiguous", "--smoke"]),
    ("bench.bench_wgrad", ["--smoke"]),
    ("bench.bench_wgrad", ["--family", "k_grouped", "--smoke"]),
    ("bench.bench_block32", ["--smoke"]),
])
def test_cpu_smoke_pipeline(tmp_path, entry, argv):
    pytest.importorskip("deep_fp8_gemm")
    module = __import__(entry, fromlist=["main"])
    assert module.main([*argv, "--device", "cpu", "--quick", "--no-plot", "--out", str(tmp_path)]) == 0
    (doc_path,) = tmp_path.glob("*.json")
    doc = json.loads(doc_path.read_text())
    for row in doc["rows"]:
        ours = row["impls"][report.OURS]
        assert ours["status"] == "ok" and ours["diff"] < 1e-3 and ours["runs"] == 20
        # Baselines either ran correctly or say why not ("n/a" with a reason) — never a crash.
        for name, rec in row["impls"].items():
            assert rec["status"] in ("ok", "n/a"), (name, rec)
            assert rec["status"] == "ok" or rec.get("note")


# --- device_check.sh ----------------------------------------------------------------------------------------

def _device_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "bench" / "device_check.sh"), *args], capture_output=True, text=True,
                          timeout=60)


def test_device_check_dry_run(tmp_path):
    out = tmp_path / "dc"
    result = _device_check(str(out), "--dry-run")
    assert result.returncode == 0, result.stderr
    for step in ("preflight", "install", "precompile", "gpu-tests", "bench-dense", "bench-decode",
                 "bench-contiguous", "bench-masked", "bench-host", "report", "summary"):
        assert step in result.stdout
    host = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["bench-host"])
    assert "--device cuda" in host and f"{out}/results/host/bench_host.json" in host and "--time-budget" not in host
    assert "--no-index" in result.stdout and "-m gpu" in result.stdout and "--quick" in result.stdout
    assert not out.exists()  # a dry run writes nothing
    full = _device_check(str(out), "--dry-run", "--full", "--no-install", "--budget", "900")
    assert full.returncode == 0 and "--quick" not in full.stdout and "skipped (--no-install)" in full.stdout


def test_device_check_smoke_step_comes_first_under_the_watchdog(tmp_path):
    """The smoke step runs before everything that can take long (precompile, the GPU suite, benchmarks), in the
    watchdog build, with a per-test timeout, on tests that exist."""
    result = _device_check(str(tmp_path / "dc"), "--dry-run")
    assert result.returncode == 0, result.stderr
    steps = [line.split()[0] for line in result.stdout.splitlines()[1:] if line.startswith("  ")]
    assert steps.index("smoke") < min(steps.index(s) for s in steps if s in ("precompile", "gpu-tests")
                                      or s.startswith("bench-"))
    smoke = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["smoke"])
    limit = int(re.search(r"<=\s*(\d+)s", smoke).group(1))
    assert limit <= 60
    assert "DFG_WATCHDOG_SECONDS=" in smoke and "--dfg-test-timeout" in smoke and "-m gpu" in smoke
    for test_id in re.findall(r"(tests/\S+\.py(?:::\w+)?)", smoke):
        path, _, name = test_id.partition("::")
        assert (REPO / path).exists() and (not name or f"def {name}(" in (REPO / path).read_text()), test_id
    skipped = _device_check(str(tmp_path / "dc"), "--dry-run", "--skip", "smoke")
    assert re.search(r"smoke\s+skipped \(--skip\)", skipped.stdout)


def test_per_test_timeout_ends_a_hung_test(tmp_path):
    """--dfg-test-timeout (tests/conftest.py): a test that does not return is named, its stack dumped, the run ended."""
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--dfg-test-timeout", "2",
                          str(tmp_path / "test_hang.py")], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert time.monotonic() - start < 50 and run.returncode != 0
    assert "test_hang.py::test_hangs" in run.stdout and "Timeout" in run.stderr and "in test_hangs" in run.stderr


@pytest.mark.parametrize("args, message", [
    ((), "usage"),
    (("a", "b"), "more than one OUTDIR"),
    (("x", "--bogus"), "unknown option"),
    (("x", "--budget", "soon"), "whole seconds"),
])
def test_device_check_rejects_bad_arguments(args, message):
    result = _device_check(*args, "--dry-run")
    assert result.returncode == 2 and message in result.stderr


# --- demo ---------------------------------------------------------------------------------------------------

def test_demo_cpu_path(monkeypatch, capsys):
    pytest.importorskip("deep_fp8_gemm")
    from deep_fp8_gemm import demo

    calls = []

    def fake_audit(m):
        calls.append(m)
        return demo.NOT_RUN, [{"ok": True}]

    monkeypatch.setattr(demo, "audit_layer", fake_audit)
    assert demo.main(["--cpu", "--reduce", "32"]) == 0
    out = capsys.readouterr().out
    assert calls == [128]
    assert "not executed" in out and "JIT cache:" in out and "torch " in out
    assert out.count(" ok") >= 8 and "FAIL" not in out  # 6 dense + contiguous + masked


def test_demo_reports_missing_audit(monkeypatch, capsys):
    pytest.importorskip("deep_fp8_gemm")
    from deep_fp8_gemm import demo

    monkeypatch.setitem(sys.modules, "deep_fp8_gemm.kernels.targets", None)  # import fails like a missing module
    message, records = demo.audit_layer(128)
    assert records is None and "unavailable" in message


def test_demo_gpu_path_code_on_cpu(capsys):
    """The GPU path's code (inputs, checks against the reference, table, cuBLAS fallback) on reduced CPU sizes."""
    pytest.importorskip("deep_fp8_gemm")
    from deep_fp8_gemm import demo

    assert demo.gpu_demo(8, device="cpu", scale=32) == 0
    out = capsys.readouterr().out
    assert "all results match the reference" in out and out.count(" ok") == 8
