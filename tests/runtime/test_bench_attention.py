"""The indexer's benchmark and cost model on the CPU (issue 44): ``bench/bench_attention.py`` skips (exit 0, with the
reason) without an sm_90 device, and its byte / FLOP model gives the figures docs/indexer.md quotes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import bench_attention as B

DOC = Path(__file__).resolve().parents[2] / "docs" / "indexer.md"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs the benchmark instead of skipping it")
def test_benchmark_skips_without_a_gpu(capsys, tmp_path):
    assert B.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "skipped" in capsys.readouterr().out and not any(tmp_path.iterdir())


@pytest.mark.parametrize("next_n,batch,context", [(1, 1, 4096), (1, 32, 131072), (2, 32, 65536), (2, 128, 131072)])
def test_the_docs_paged_rows_are_the_model(next_n, batch, context):
    nbytes = B.paged_bytes(batch, next_n, context)
    hbm, tensor = B.floors_us(nbytes, B.paged_flops(batch, next_n, context))
    row = (f"| {next_n} | {batch} | {context // 1024}K | {nbytes / 1e6:,.2f} | {hbm:,.2f} | {tensor:,.2f} | "
           f"{batch * -(-context // 256):,} |")
    assert row in DOC.read_text()


def test_model_counts_blocks_whole_and_each_row_once():
    one = B.paged_bytes(1, 1, 64)
    assert B.paged_bytes(1, 1, 1) == 64 * 132 + 64 * 132 + 4 + 4  # a partial block is read whole
    assert B.paged_bytes(2, 1, 64) == 2 * one
    assert B.paged_bytes(1, 2, 64) - one == 64 * 132 + 64 * 4  # the second query: its q + weights and its logits
