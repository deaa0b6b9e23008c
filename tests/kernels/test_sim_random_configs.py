"""Random legal configs x random problems through the simulator (seeded, so CI is reproducible).

The fixed cases elsewhere cover each path on purpose; this sweep covers the combinations nobody chose:
any BLOCK_M / BLOCK_N / stages / cluster shape / band width / grid that check_config accepts, on odd n, k,
m and group layouts. A wider run of the same generator (hundreds of configs) passed before this was
committed; `DFG_SIM_RANDOM_CASES=N` runs more.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest
import torch

from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.config import GemmConfig, check_config

from tests.kernels.test_sim_gemm import contiguous_layout, quantised_operands, run_sim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

NUM_CASES = int(os.environ.get("DFG_SIM_RANDOM_CASES", "8"))


def random_case(rng: random.Random):
    """A legal config and its problem (kind-specific) drawn from rng."""
    while True:
        kind = rng.choice(["dense", "dense", "contiguous", "masked"])
        cluster = rng.choice([(1, 1), (1, 1), (1, 2)] + ([(2, 1)] if kind == "dense" else []))
        cfg = GemmConfig(kind=kind, shape_n=8 * rng.randint(2, 60), shape_k=16 * rng.randint(1, 40), num_groups=1 if kind == "dense" else rng.randint(1, 5), block_m=rng.choice([64, 128, 256] if kind != "contiguous" else [64, 128]), block_n=rng.choice(range(16, 161, 16)), num_stages=rng.randint(2, 6), cluster_m=cluster[0], cluster_n=cluster[1], band_width=rng.randint(1, 8), grid_size=cluster[0] * cluster[1] * rng.randint(1, 3))
        try:
            check_config(cfg)
        except ValueError:
            continue
        if kind == "dense":
            return cfg, rng.randint(1, 300)
        if kind == "contiguous":
            return cfg, [rng.choice([0, 1, 50, 128, 129, 200]) for _ in range(cfg.num_groups - 1)] + [rng.randint(1, 200)]
        m_max = rng.randint(1, 200)
        return cfg, (m_max, [rng.randint(0, m_max) for _ in range(cfg.num_groups)])


@pytest.mark.parametrize("seed", range(NUM_CASES))
def test_random_config(seed):
    cfg, problem = random_case(random.Random(1000 + seed))
    n, k, groups = cfg.shape_n, cfg.shape_k, cfg.num_groups
    if cfg.kind == "dense":
        a, sa, b, sb = quantised_operands((problem,), n, k, seed=seed)
        d = torch.full((problem, n), float("nan"), dtype=torch.bfloat16)
        run_sim(cfg, a, sa, b, sb, d)
        ref = torch.empty_like(d)
        reference.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), ref)
        valid = [(d, ref)]
    elif cfg.kind == "contiguous":
        layout = contiguous_layout(problem)
        a, sa, b, sb = quantised_operands((layout.numel(),), n, k, groups=groups, seed=seed)
        d = torch.full((layout.numel(), n), float("nan"), dtype=torch.bfloat16)
        run_sim(cfg, a, sa, b, sb, d, layout)
        ref = torch.empty_like(d)
        reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), ref, layout)
        valid = [(d[layout >= 0], ref[layout >= 0])]
    else:
        m_max, counts = problem
        masked_m = torch.tensor(counts, dtype=torch.int32)
        a, sa, b, sb = quantised_operands((groups, m_max), n, k, groups=groups, seed=seed)
        d = torch.full((groups, m_max, n), float("nan"), dtype=torch.bfloat16)
        run_sim(cfg, a, sa, b, sb, d, masked_m)
        ref = torch.empty_like(d)
        reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), ref, masked_m, 1)
        valid = [(d[g, :c], ref[g, :c]) for g, c in enumerate(counts) if c]
        assert all(d[g].isnan().all() for g, c in enumerate(counts) if not c), "an empty group was written"
    for got, want in valid:
        assert not got.isnan().any(), f"{cfg.kernel_name()}: unwritten output"
        assert calc_diff(got, want) < 1e-3, f"{cfg.kernel_name()}: calc_diff {calc_diff(got, want):.2e}"
