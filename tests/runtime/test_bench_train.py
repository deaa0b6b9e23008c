"""CPU tests of bench/bench_train.py (issue 15): the training-step pipeline on a tiny layer, its FLOP count,
and device_check.sh's plan. No GPU and no timing claims."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deep_fp8_gemm")

from bench import bench_train, report  # noqa: E402
from bench.shapes import MoEShape  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_train_shapes_and_flops():
    quick, full = bench_train.train_shapes(True), bench_train.train_shapes(False)
    assert [s.tokens for s in quick] == [4096] and [s.tokens for s in full] == [1024, 4096]
    s = full[0]
    assert (s.num_experts, s.top_k, s.hidden, s.inter) == (32, 8, 7168, 2048)
    # forward + input gradient + weight gradient: three times the forward's GEMM FLOPs
    assert s.flops() == 3 * MoEShape(1024, 32, 8, 7168, 2048).flops() == 3 * 2 * 1024 * 8 * 3 * 7168 * 2048
    assert s.label.startswith("train T=1024")


def test_train_cpu_smoke(tmp_path):
    rc = bench_train.main(["--smoke", "--tokens", "5", "--device", "cpu", "--quick", "--no-plot",
                           "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "train-smoke.json").read_text())
    assert rc == 0 and doc["family"] == "train-smoke" and len(doc["rows"]) == 1
    row = doc["rows"][0]
    ours, bf16 = row["impls"][report.OURS], row["impls"]["bf16_layer"]
    # FP8 forward + backward against the bf16 layer: a real (quantisation) difference, below the threshold
    assert ours["status"] == "ok" and 1e-4 < ours["diff"] < bench_train.TRAIN_THRESHOLD and ours["runs"] == 20
    assert ours["tflops"] == pytest.approx(row["flops"] / ours["us"] / 1e6)
    assert bf16["status"] == "ok" and bf16["diff"] == 0.0


def test_train_check_catches_a_wrong_gradient(tmp_path, monkeypatch):
    """An input gradient that reshapes W instead of transposing it (right shapes, wrong values) is 'wrong'."""
    from deep_fp8_gemm import autograd

    def reshaped(w_fp8, w_sf):
        return w_fp8.reshape(*w_fp8.shape[:-2], w_fp8.shape[-1], w_fp8.shape[-2]), w_sf.transpose(-1, -2).contiguous()

    monkeypatch.setattr(autograd, "_transpose_blocks", reshaped)
    rc = bench_train.main(["--smoke", "--tokens", "5", "--device", "cpu", "--quick", "--no-plot",
                           "--no-baselines", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "train-smoke.json").read_text())
    assert rc == 1 and doc["rows"][0]["impls"][report.OURS]["status"] == "wrong"


def test_device_check_plans_bench_train(tmp_path):
    result = subprocess.run(["bash", str(REPO / "bench" / "device_check.sh"), str(tmp_path / "dc"), "--dry-run"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.strip()}
    assert "<=  40s" in lines["bench-train"] and "-m bench.bench_train --quick" in lines["bench-train"]
    assert "best-effort" in lines["bench-train"]
    order = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert order.index("bench-wgrad") < order.index("bench-train") < order.index("report")
    text = (REPO / "bench" / "device_check.sh").read_text()
    assert "bench bench-train 40 20 bench.bench_train" in text
