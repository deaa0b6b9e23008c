"""The BF16 / TF32 benchmark on the CPU (issue 41): ``bench/bench_bf16.py`` skips (exit 0, with the reason) without an
sm_90 device, and its byte / FLOP floors count what the docstring says."""

from __future__ import annotations

import pytest
import torch

from bench import bench_bf16 as B


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs the benchmark instead of skipping it")
def test_benchmark_skips_without_a_gpu(capsys, tmp_path):
    assert B.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "skipped" in capsys.readouterr().out and not any(tmp_path.iterdir())


def test_floors_count_operands_once():
    assert B.gemm_bytes(1, 7168, 16384) == 2 * 16384 + 2 * 7168 * 16384 + 2 * 7168
    assert B.gemm_bytes(8, 4096, 7168, groups=32) == 32 * B.gemm_bytes(8, 4096, 7168)
    assert B.hc_bytes(64, 28672) == 2 * 64 * 28672 + 4 * 24 * 28672 + 4 * 16 * 64 * 25
    hbm, tensor = B.floors_us(B.gemm_bytes(4096, 7168, 2048), 2 * 4096 * 7168 * 2048)
    assert tensor > hbm  # prefill is tensor-bound
    hbm, tensor = B.floors_us(B.gemm_bytes(1, 7168, 16384), 2 * 7168 * 16384)
    assert hbm > 10 * tensor  # decode is bound by the weight bytes
