"""Benchmarks of deep_fp8_gemm against block-scaled cuBLAS, bf16 matmul and the reference design's
published H800 numbers. Run from the repository root as modules::

    python -m bench.bench_dense   --shapes deepseek-v3|decode|all [--quick] [--out DIR]
    python -m bench.bench_grouped --kind contiguous|masked       [--quick] [--out DIR]
    python -m bench.report        # rebuild bench/RESULTS.md from bench/results/*.json
    bash bench/device_check.sh OUTDIR [--dry-run]

Shape tables live in :mod:`bench.shapes`, the timing method in :mod:`bench.timing`, the baselines in
:mod:`bench.baselines`. Nothing here is imported by the library itself.
"""
