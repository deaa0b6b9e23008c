"""CPU tests of the issue-7 benchmarks (``bench.bench_quant``, ``bench.bench_moe``): shape tables and byte
counts, the CPU smoke pipelines, the bit-exactness check catching wrong kernels, the per-expert block-scaled
``torch._scaled_mm`` loop (with a CPU emulation of the block-scaled call), the report rows of the quant and
moe families, and device_check.sh's plan. No GPU and no timing claims."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import report, shapes
from bench.shapes import MoEShape, QuantShape

torch = pytest.importorskip("torch")
pytest.importorskip("deep_fp8_gemm")

REPO = Path(__file__).resolve().parents[2]


# --- shapes -------------------------------------------------------------------------------------------------

def test_quant_shapes_and_bytes():
    full, quick = shapes.quant_shapes(), shapes.quant_shapes(quick=True)
    assert len(full) == 6 + len(shapes.DEEPSEEK_V3_NK) + 3 + 3 and set(quick) < set(full)
    assert {s.kind for s in quick} == set(QuantShape.KINDS)
    assert QuantShape("per_token", 128, 7168).bytes() == 128 * 7168 * 2 + 128 * 7168 + 128 * 56 * 4
    assert QuantShape("per_block", 2112, 7168).bytes() == 2112 * 7168 * 3 + 17 * 56 * 4
    assert QuantShape("silu_mul", 4096, 2048).bytes() == 4096 * 4096 * 2 + 4096 * 2048 + 4096 * 16 * 4
    # cast-transpose: x read once, two e4m3 outputs, the scales of x [m, 56] and of xᵀ [7168, ceil(m/128)]
    assert QuantShape("cast_transpose", 130, 7168).bytes() == 130 * 7168 * 4 + (130 * 56 + 7168 * 2) * 4
    for s in full:
        assert s.flops() == 0 and shapes.shape_from_dict(shapes.shape_to_dict(s)) == s
    with pytest.raises(ValueError, match="unknown quantisation kind"):
        QuantShape("per_row", 1, 1)


def test_moe_shapes_flops_and_bytes():
    assert [s.tokens for s in shapes.moe_shapes()] == [1, 16, 128, 1024, 4096]
    assert [s.tokens for s in shapes.moe_shapes(quick=True)] == [16, 1024]
    assert [s.tokens for s in shapes.moe_shapes(tokens=(3,))] == [3]
    s = MoEShape(1)
    assert (s.num_experts, s.top_k, s.hidden, s.inter, s.valid_m) == (256, 8, 7168, 2048, 8)
    assert s.flops() == 2 * 8 * 3 * 7168 * 2048
    assert s.expected_active_experts() == pytest.approx(8.0)
    assert MoEShape(4096).expected_active_experts() == pytest.approx(256.0)
    # 256 experts' e4m3 weights + scales: the 11.3 GB of the issue.
    assert 256 * s.expert_bytes() == pytest.approx(11.3e9, rel=0.01)
    assert s.bytes() == round(8 * s.expert_bytes()) + 2 * 7168 * 2
    assert shapes.shape_from_dict(shapes.shape_to_dict(s)) == s


# --- CPU smoke pipelines ------------------------------------------------------------------------------------

def _run(module, argv, tmp_path) -> tuple[int, dict]:
    rc = module.main([*argv, "--device", "cpu", "--quick", "--no-plot", "--out", str(tmp_path)])
    (doc_path,) = tmp_path.glob("*.json")
    return rc, json.loads(doc_path.read_text())


def test_quant_cpu_smoke(tmp_path):
    from bench import bench_quant

    rc, doc = _run(bench_quant, ["--smoke"], tmp_path)
    assert rc == 0 and doc["family"] == "quant-smoke" and len(doc["rows"]) == len(bench_quant.SMOKE)
    for row in doc["rows"]:
        for name in (report.OURS, "torch_quant"):
            rec = row["impls"][name]
            assert rec["status"] == "ok" and rec["diff"] == 0.0 and rec["runs"] == 20, (name, rec)
    md = (tmp_path / "quant-smoke.md").read_text()
    assert "% of 4.8 TB/s" in md and "× torch" in md and "HBM bandwidth" in md and "plain-torch" in md


def test_moe_cpu_smoke(tmp_path):
    from bench import bench_moe

    rc, doc = _run(bench_moe, ["--smoke"], tmp_path)
    assert rc == 0 and doc["family"] == "moe-smoke"
    for row in doc["rows"]:
        ours, bf16 = row["impls"][report.OURS], row["impls"]["bf16_layer"]
        assert ours["status"] == "ok" and 1e-4 < ours["diff"] < bench_moe.MOE_THRESHOLD  # FP8 vs bf16: real error
        assert ours["tflops"] == pytest.approx(row["flops"] / ours["us"] / 1e6)
        assert bf16["status"] == "ok" and bf16["diff"] == 0.0  # the reference itself
        assert row["impls"]["cublas_block"]["status"] == "n/a"  # H=256: not a multiple of 512
        unfused = row["impls"]["deep_fp8_gemm_unfused"]  # issue 27: the unfused up-projection, one kernel more
        assert unfused["status"] == "ok" and 1e-4 < unfused["diff"] < bench_moe.MOE_THRESHOLD
        for name in ("ep_world1", "ep_decode_world1"):  # issue 16's rows: the same bits as ours
            assert row["impls"][name]["status"] == "ok" and row["impls"][name]["diff"] == ours["diff"]
    md = (tmp_path / "moe-smoke.md").read_text()
    assert "× bf16 layer" in md and "TFLOPS (routed)" in md and "calc_diff vs the bf16 layer" in md


def test_quant_check_catches_a_wrong_kernel(tmp_path, monkeypatch):
    """A fused kernel that differs in one e4m3 byte, or returns row-major per-token scales, is 'wrong'."""
    from bench import bench_quant

    good = bench_quant._fused_fns(torch.device("cpu"))

    def flip_one(x):
        x_fp8, scales = good["per_block"](x)
        x_fp8 = x_fp8.clone()
        x_fp8.view(torch.uint8)[0, 0] ^= 1
        return x_fp8, scales

    def row_major(x):
        x_fp8, scales = good["per_token"](x)
        return x_fp8, scales.contiguous()

    def flip_one_transposed(x):  # cast-transpose: one byte of xᵀ off
        x_fp8, x_sf, xt_fp8, xt_sf = good["cast_transpose"](x)
        xt_fp8 = xt_fp8.clone()
        xt_fp8.view(torch.uint8)[-1, -1] ^= 1
        return x_fp8, x_sf, xt_fp8, xt_sf

    monkeypatch.setattr(bench_quant, "_fused_fns", lambda device: {**good, "per_block": flip_one,
                                                                   "per_token": row_major,
                                                                   "cast_transpose": flip_one_transposed})
    monkeypatch.setattr(bench_quant, "SMOKE", [QuantShape("per_block", 8, 256), QuantShape("per_token", 6, 256),
                                               QuantShape("silu_mul", 4, 128), QuantShape("cast_transpose", 6, 256)])
    rc, doc = _run(bench_quant, ["--smoke"], tmp_path)
    assert rc == 1
    statuses = [r["impls"][report.OURS]["status"] for r in doc["rows"]]
    assert statuses == ["wrong", "wrong", "ok", "wrong"]
    assert all(r["impls"]["torch_quant"]["status"] == "ok" for r in doc["rows"])
    assert "wrong result" in (tmp_path / "quant-smoke.md").read_text()


def _fake_block_scaled_mm(a, bt, scale_a, scale_b):
    """CPU emulation of block-scaled ``torch._scaled_mm`` (1x128 activation, 128x128 weight scales)."""
    k, n = bt.shape
    a_deq = a.float() * scale_a.repeat_interleave(128, dim=1)[:, :k]
    b_deq = bt.float() * scale_b.repeat_interleave(128, dim=0)[:k].repeat_interleave(128, dim=1)[:, :n]
    return (a_deq @ b_deq).to(torch.bfloat16)


def test_cublas_moe_loop_matches_ours_on_cpu(monkeypatch):
    """The per-expert _scaled_mm layer (GPU-only baseline) run with an emulated block-scaled call: the same FP8
    math as fp8_moe_forward, so it agrees far more closely than FP8 agrees with bf16."""
    from bench import baselines, bench_moe
    from deep_fp8_gemm import calc_diff
    from deep_fp8_gemm.moe import fp8_moe_forward

    monkeypatch.setattr(baselines, "_scaled_mm", _fake_block_scaled_mm)
    shape = MoEShape(5, num_experts=3, top_k=2, hidden=512, inter=512)
    w = bench_moe.weights(shape, torch.device("cpu"))
    fp8 = (w["w13"], w["w13_scale"], w["w2"], w["w2_scale"])
    hidden, ids, topk_weights = bench_moe.make_inputs(shape, torch.device("cpu"))
    ids[0, 1] = -1  # a dropped slot
    loop = bench_moe.cublas_moe(*fp8)(hidden, ids, topk_weights)
    ours = fp8_moe_forward(hidden, ids, topk_weights, *fp8)
    bf16 = bench_moe.example().bf16_moe(hidden, ids, topk_weights, *w["bf16"])
    assert loop.shape == hidden.shape and loop.dtype == torch.bfloat16
    assert calc_diff(loop, ours) < 1e-4
    assert calc_diff(ours, bf16) < bench_moe.MOE_THRESHOLD


def test_moe_pipeline_with_all_baselines(tmp_path, monkeypatch):
    """Whole moe pipeline with the cuBLAS loop running (emulated), and without the bf16 layer (memory short):
    then the cuBLAS loop is the reference and the bf16 layer is n/a with the reason."""
    from bench import baselines, bench_moe, timing

    monkeypatch.setattr(baselines, "_scaled_mm", _fake_block_scaled_mm)
    monkeypatch.setattr(bench_moe, "SMOKE", [MoEShape(2, num_experts=2, top_k=2, hidden=512, inter=512)])

    def one_call(fn, arg_sets, **kwargs):  # the checks are under test here, not the timing: keep it fast
        fn(*arg_sets[-1])
        return timing.summarize([1.0] * timing.MIN_RUNS)

    monkeypatch.setattr(timing, "time_call", one_call)
    rc, doc = _run(bench_moe, ["--smoke"], tmp_path)
    impls = doc["rows"][0]["impls"]
    assert rc == 0 and {r["status"] for r in impls.values()} == {"ok"}, impls
    assert "calc_diff vs deep_fp8_gemm" in impls["cublas_block"]["note"]
    assert report.speedup(doc["rows"][0], "cublas_block") is not None

    bench_moe._WEIGHTS.clear()
    monkeypatch.setattr(bench_moe, "_bf16_fits", lambda shape, device: (False, "bf16 layer skipped: test"))
    for path in tmp_path.glob("*"):
        path.unlink()
    rc, doc = _run(bench_moe, ["--smoke"], tmp_path)
    impls = doc["rows"][0]["impls"]
    assert rc == 0 and impls[report.OURS]["status"] == "ok" and impls[report.OURS]["diff"] < 1e-4
    assert impls["bf16_layer"] == {"status": "n/a", "note": "bf16 layer skipped: test"}
    assert "vs the cuBLAS loop" in impls[report.OURS]["note"]
    bench_moe._WEIGHTS.clear()


# --- report -------------------------------------------------------------------------------------------------

def _quant_rows() -> list[dict]:
    rows = []
    for shape, us, us_kernel, torch_us in ((QuantShape("per_token", 16384, 7168), 80.0, None, 400.0),
                                           (QuantShape("per_token", 128, 2048), 4.0, 0.5, 20.0)):
        ours = {"status": "ok", "us": us, "diff": 0.0, "runs": 20, "tflops": 0.0, "gbs": shape.bytes() / us / 1e3}
        if us_kernel:
            ours["us_kernel"] = us_kernel
        rows.append({"shape": shapes.shape_to_dict(shape), "label": shape.label, "flops": 0, "bytes": shape.bytes(),
                     "h800_published_tflops": None,
                     "impls": {report.OURS: ours, "torch_quant": {"status": "ok", "us": torch_us}}})
    return rows


def _moe_rows() -> list[dict]:
    rows = []
    for shape, us in ((MoEShape(16), 1000.0), (MoEShape(1024), 3000.0)):
        ours = {"status": "ok", "us": us, "diff": 2e-3, "runs": 20, "tflops": shape.flops() / us / 1e6,
                "gbs": shape.bytes() / us / 1e3, "note": "fp8_moe_forward"}
        rows.append({"shape": shapes.shape_to_dict(shape), "label": shape.label, "flops": shape.flops(),
                     "bytes": shape.bytes(), "h800_published_tflops": None,
                     "impls": {report.OURS: ours, "bf16_layer": {"status": "ok", "us": 4 * us, "diff": 0.0},
                               "cublas_block": {"status": "n/a", "note": "no block-scaled _scaled_mm"}}})
    return rows


def test_quant_report_rows(tmp_path):
    rows = _quant_rows()
    table = report.markdown_table(rows)
    # 356 MB in 80 µs (events) = 4450 GB/s = 93%; 0.79 MB in 0.5 µs (CUPTI) = 1589 GB/s = 33%.
    assert "| per_token m=16384 k=7168 | 356.0 | 80.0 | – | 4450 | 93% | 400.0 | 5.00x | 0.0e+00 |" in table
    assert "| 33% (CUPTI) |" in table
    head = "\n".join(report.headline(rows))
    assert "plain-torch quantisation: **5.00x**" in head and "**1/2** calls at or above the 80% target" in head
    paths = report.write_family("quant", rows, {"gpu": "Synthetic GPU"}, tmp_path, plot=True)
    assert "% of 4.8 TB/s" in (tmp_path / "quant.md").read_text()
    if any(p.suffix == ".png" for p in paths):
        assert (tmp_path / "quant.png").read_bytes()[:4] == b"\x89PNG"
    assert "xtorch" in report.compact_table(rows)


def test_moe_report_rows(tmp_path):
    rows = _moe_rows()
    table = report.markdown_table(rows)
    assert "| T=16 E=256 top-8 H=7168 I=2048 | 128 | 1000.0 | 11 | 4000.0 | 4.00x | n/a | – | 2.0e-03 |" in table
    assert "cuBLAS: no block-scaled _scaled_mm" in table
    head = "\n".join(report.headline(rows))
    assert "bf16 PyTorch MoE layer: **4.00x** over 2 shapes" in head and "2.0e-03" in head
    report.write_family("moe", rows, {"gpu": "Synthetic GPU"}, tmp_path, plot=True)
    report.write_family("quant", _quant_rows(), {"gpu": "Synthetic GPU"}, tmp_path, plot=False)
    summary = tmp_path / "RESULTS.md"
    assert report.main(["--results", str(tmp_path), "--summary", str(summary)]) == 0
    text = summary.read_text()
    assert "## moe" in text and "## quant" in text and "× bf16 layer" in text and "% of 4.8 TB/s" in text


def test_not_measured_summary_names_the_new_families(tmp_path):
    summary = tmp_path / "RESULTS.md"
    report.write_summary(tmp_path / "none", summary)
    text = summary.read_text()
    assert report.NOT_MEASURED in text and "`quant`" in text and "`moe`" in text
    assert "bench.bench_quant" in text and "bench.bench_moe" in text
    # The checked-in summary is what the generator writes.
    assert (REPO / "bench" / "RESULTS.md").read_text() == text


# --- device_check.sh ----------------------------------------------------------------------------------------

def _device_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "bench" / "device_check.sh"), *args], capture_output=True, text=True,
                          timeout=60)


def test_device_check_plans_the_new_steps(tmp_path):
    result = _device_check(str(tmp_path / "dc"), "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.strip()}
    assert "<=  30s" in lines["bench-quant"] and "-m bench.bench_quant --quick" in lines["bench-quant"]
    assert "<=  60s" in lines["bench-moe"] and "-m bench.bench_moe --quick" in lines["bench-moe"]
    assert "best-effort" in lines["bench-moe"]
    order = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert order.index("bench-masked") < order.index("bench-quant") < order.index("bench-moe") < order.index("report")
    skipped = _device_check(str(tmp_path / "dc"), "--dry-run", "--skip", "bench-quant,bench-moe")
    assert skipped.returncode == 0 and "bench-quant      skipped (--skip)" in skipped.stdout
    assert "bench-moe        skipped (--skip)" in skipped.stdout


def test_device_check_keeps_the_existing_limits_and_deadline():
    """The GEMM steps' planned limits and reserves are unchanged; the new steps are best-effort inside the
    deadline. The smoke step (60 s, first) came with 60 s more deadline (470 -> 530 s), so the steps after it
    keep the time they had."""
    text = (REPO / "bench" / "device_check.sh").read_text()
    assert "BUDGET=530" in text and "run_step smoke 60 360 " in text
    for line in ("bench bench-dense 70 200 ", "bench bench-decode 75 125 ", "bench bench-contiguous 60 65 ",
                 "bench bench-masked 45 20 ", "run_step gpu-tests 150 270 ", "run_step report 20 0 ",
                 "bench bench-quant 30 80 ", "bench bench-moe 60 20 "):
        assert line in text, line
