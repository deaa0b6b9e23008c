"""The adversarial run (tests/adversarial.py) over the public API: 0 silent wrong results, 0 crashes, 0 misleading
errors, 0 refused valid inputs, over at least 160 kinds of bad and edge input.

The cases run in a child process that logs each case before and after it runs, so a crash (a signal, an abort in
a native library) is blamed on its case and the run resumes after it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.adversarial import CASES, WORLD_CASES
from tests.jit_kernels import REPO_ROOT, subprocess_env


def _run(tmp_path) -> list[dict]:
    records: list[dict] = []
    start = 0
    while True:
        log = tmp_path / f"progress-{start}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "tests.adversarial", "--start", str(start), "--progress", str(log)],
                              cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=900)
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        done = [line for line in lines if "outcome" in line]
        records += done
        running = [line["running"] for line in lines if "running" in line]
        finished = {line["id"] for line in done}
        crashed = [cid for cid in running if cid not in finished]
        if proc.returncode in (0, 1) and not crashed:
            return records
        assert crashed, f"the run died outside any case (exit {proc.returncode}): {proc.stderr[-2000:]}"
        records.append(dict(id=crashed[0], outcome="crash", detail=f"exit {proc.returncode}: {proc.stderr[-500:]}"))
        start = [c.id for c in CASES].index(crashed[0]) + 1


def test_adversarial_public_api(tmp_path):
    records = _run(tmp_path)
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == len(CASES) + len(WORLD_CASES) >= 160
    bad = [r for r in records if r["outcome"] not in ("clear", "handled")]
    assert not bad, "\n".join(f"{r['outcome']}: {r['id']}: {r['detail']}" for r in bad)
