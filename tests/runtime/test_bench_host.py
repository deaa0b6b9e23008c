"""bench/bench_host.py end to end on the CPU: the stub driver is built, the child really launches through it,
and the JSON has one row per op with the documented fields (timings are not asserted: shared machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler for the stub")
def test_bench_host_json_rows():
    names = ("dense", "masked", "psum", "masked_swiglu", "fp8_gemm_nt", "per_token", "bf16_dense", "wgrad_1d1d",
             "paged_mqa_logits")
    run = subprocess.run([sys.executable, "-m", "bench.bench_host", "--quick", "--ops", ",".join(names),
                          "--json", "-"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    rows = {row["op"]: row for row in result["ops"] if row["device"] == "stub"}
    assert set(rows) == set(names)  # --ops filters; every timed call reached the stub's launch (measure checks)
    assert [rows[op]["args"] for op in names] == [5, 7, 6, 8, 6, 3, 3, 5, 8]
    for row in rows.values():
        assert row["call_us"] > 0 and row["launch_floor_us"] > 0
        assert row["ratio"] == pytest.approx(row["call_us"] / row["launch_floor_us"], rel=0.01)
    # The GEMMs write the caller's d; the quantiser returns two new tensors, the indexer its logits: their floors
    # make them too.
    assert {op: row["outputs"] for op, row in rows.items() if row["outputs"]} == {"per_token": 2, "paged_mqa_logits": 1}
    per_token = rows["per_token"]
    assert per_token["outputs_floor_us"] > per_token["launch_floor_us"]
    assert per_token["ratio_outputs"] == pytest.approx(per_token["call_us"] / per_token["outputs_floor_us"], rel=0.01)
    assert per_token["bar_ratio"] == per_token["ratio_outputs"] and rows["dense"]["bar_ratio"] == rows["dense"]["ratio"]


def test_output_maker_makes_the_ops_results():
    """The floor's outputs are the op's: sizes, strides, storage offset and size, dtype; a view of a padded buffer
    (the MQA logits) is made as one; outputs sharing an input's storage are not new."""
    import torch

    from bench import bench_host

    base = torch.empty((8, 40), dtype=torch.float32)
    outs = (torch.empty((8, 3), dtype=torch.float8_e4m3fn), torch.empty_strided((8, 2), (1, 8)), base[:6, :33])
    x = torch.zeros(4)
    assert bench_host.new_outputs((x, outs), (x, (x, x))) == outs
    made = bench_host.output_maker(outs[:2])()
    assert [(t.shape, t.stride(), t.dtype) for t in made] == [(t.shape, t.stride(), t.dtype) for t in outs[:2]]
    view = bench_host.output_maker(outs[2:])()
    assert (view.shape, view.stride(), view.storage_offset()) == ((6, 33), (40, 1), 0)
    assert view.untyped_storage().nbytes() == base.untyped_storage().nbytes()


def test_bench_host_cuda_rows_without_a_gpu_exit_3():
    """``--device cuda`` (device_check.sh's bench-host step) refuses to report nothing: no sm_90 GPU, exit 3."""
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("an sm_90 GPU is present")
    run = subprocess.run([sys.executable, "-m", "bench.bench_host", "--quick", "--device", "cuda", "--json", "-"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 3 and "sm_90" in run.stderr and not run.stdout


def test_gpu_rows_measure_cuda_tensors_synchronised(monkeypatch):
    """The GPU rows' wiring, checked here with torch.cuda faked: CUDA device, label "cuda", a synchronise
    before every timed batch, no stub launch counter (the real driver launches)."""
    import torch

    from bench import bench_host

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(bench_host, "measure", lambda device, **kw: seen.update(device=device, **kw) or ["row"])
    assert bench_host.gpu_rows(7, 3, {"psum"}) == ["row"]
    assert seen["device"].type == "cuda" and seen["label"] == "cuda" and seen["sync"] is torch.cuda.synchronize
    assert (seen["calls"], seen["repeats"], seen["only"]) == (7, 3, {"psum"}) and seen.get("launched") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert bench_host.gpu_rows(7, 3, None) == []
