"""bench/bench_host.py end to end on the CPU: the stub driver is built, the child really launches through it,
and the JSON has one row per op with the documented fields (timings are not asserted: shared machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler for the stub")
def test_bench_host_json_rows():
    run = subprocess.run([sys.executable, "-m", "bench.bench_host", "--quick", "--ops", "dense,masked,per_token",
                          "--json", "-"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    rows = {row["op"]: row for row in result["ops"] if row["device"] == "stub"}
    assert set(rows) == {"dense", "masked", "per_token"}  # --ops filters
    assert (rows["dense"]["args"], rows["masked"]["args"], rows["per_token"]["args"]) == (5, 7, 3)
    for row in rows.values():
        assert row["call_us"] > 0 and row["launch_floor_us"] > 0
        assert row["ratio"] == pytest.approx(row["call_us"] / row["launch_floor_us"], rel=0.01)
    assert rows["per_token"]["alloc_us"] > 0
