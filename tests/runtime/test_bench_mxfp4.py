"""The MXFP4 benchmark and cost model on the CPU (issue 42): ``bench/bench_mxfp4.py`` skips (exit 0, with the reason)
without an sm_90 device and prints the modelled table with ``--model``; the model's bytes are what the stored form
holds; its issue terms are the audit's measurement of the compiled folded loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench import bench_mxfp4 as B
from deep_fp8_gemm.config import cost
from deep_fp8_gemm.kernels import mxfp4_gemm


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs the benchmark instead of skipping it")
def test_benchmark_skips_without_a_gpu(capsys, tmp_path):
    assert B.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "skipped" in capsys.readouterr().out and not any(tmp_path.iterdir())


def test_model_table_and_decode_within_ten_percent_of_the_fp4_floor(capsys):
    assert B.main(["--model"]) == 0
    assert "| Kimi-K3 | w13 | 6144 | 3584 | 8 | 8x256 |" in capsys.readouterr().out
    for row in B.model_rows():
        if row["m"] <= 16:
            assert row["over_floor"] <= 1.10, row  # the issue's bound, as modelled
            assert row["speedup_vs_fp8"] > 1.5, row  # half the weight bytes of the FP8 kernel


def test_model_bytes_are_the_stored_forms():
    from deep_fp8_gemm.ops import mxfp4
    assert cost.MXFP4_BYTES_PER_ROW_K_BLOCK == mxfp4.TILE_BYTES / mxfp4.WAVE_ROWS + mxfp4.META_BYTES / mxfp4.WAVE_ROWS
    n, k, g = 256, 1024, 2
    assert cost.mxfp4_hbm_bytes(0, n, k, g, 128, stored=False) == g * n * (k // 2 + k // 32)


def test_issue_terms_are_the_audits_measurement():
    """The model's per-K-block issue slots per tile are the K-loop analyser's count of the compiled folded loop."""
    from deep_fp8_gemm.runtime import kloop
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.runtime.sass import disassemble

    for (block_m, block_n), issue in cost.MXFP4_ISSUE_PER_K_BLOCK.items():
        cfg = dataclasses.replace(mxfp4_gemm.pick_config(6144, 3584, 32, block_m, 132), block_m=block_m,
                                  block_n=block_n)
        name, source = mxfp4_gemm.render_source(cfg)
        d = cfg.as_dict()
        analysis = kloop.analyse_sass(disassemble(compile_kernel(name, source).cubin), block_m=d["mma_rows"],
                                      block_n=d["mma_cols"], num_math_warpgroups=1, function=name,
                                      loop_qgmma=d["kloop_qgmma"])
        assert analysis["math"]["per_k_block"]["total"] == issue, (block_m, block_n)
