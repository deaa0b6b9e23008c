"""Benchmarks of deep_fp8_gemm against block-scaled cuBLAS, bf16 matmul and the reference design's
published H800 numbers. Run from the repository root as modules::

    python -m bench.bench_dense   --shapes deepseek-v3|decode|all [--quick] [--out DIR]
    python -m bench.bench_grouped --kind contiguous|masked       [--quick] [--out DIR]
    python -m bench.bench_quant   [--quick] [--out DIR]          # fused quantisation kernels vs HBM floor / torch
    python -m bench.bench_moe     [--quick] [--tokens T ...]     # issue-7 MoE layer vs bf16 layer / cuBLAS loop
    python -m bench.report        # rebuild bench/RESULTS.md from bench/results/*.json
    bash bench/device_check.sh OUTDIR [--dry-run]

Shape tables live in :mod:`bench.shapes` (with the reference design's published H800 numbers), the timing
method in :mod:`bench.timing`, the baselines and float64 references in :mod:`bench.baselines`, the
per-shape loop in :mod:`bench.harness`, the JSON / Markdown / PNG writers in :mod:`bench.report`.
The MoE benchmark reuses ``examples/moe_layer.py`` (its bf16 layer and per-expert loop).
``--device cpu`` (with ``--shapes smoke`` / ``--smoke``) runs the whole pipeline on tiny CPU shapes to test
the code path; those numbers are not benchmarks. Nothing here is imported by the library itself.
"""
