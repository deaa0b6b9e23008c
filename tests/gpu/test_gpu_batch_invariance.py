"""Batch invariance on an sm_90 GPU (issue 37, item 5; skipped, with the reason, anywhere else): the simulator's
check (tests/kernels/test_sim_batch_invariance.py) on the hardware. The same rows in batches of several sizes, under
the tiles the heuristic picks at each size (forced onto one problem), give identical bits, the cancelling rows
included; and swap-AB against the plain kernel for the same rows, which holds only if the tensor core's inner product
is symmetric in its operands (the simulator's stated assumption, hal/sim/numerics.hpp): the first GPU run confirms it
or says the fast mode's swap-AB must stay out of the invariant mode for a reason beyond split-K."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm import ops
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.config import get_config
from tests._gpu import requires_sm90
from tests._invariance import run_rows
from tests.kernels.test_sim_batch_invariance import PROBLEMS, forced, picks, target

pytestmark = pytest.mark.gpu

#: (kind, batches): each family's tiles (the heuristic's picks forced onto its simulator problem) over these batches.
INVARIANCE_CASES = [("dense", ((6, 0), (150, 120), (1000, 600))), ("contiguous", ((6, 0), (300, 200))),
                    ("masked", ((6, 0), (150, 120))), ("dense_fp8out", ((6, 0), (150, 120)))]
#: (m of the swap-AB pick on 2112 x 7168, batches) for swap-AB against the plain kernel.
SWAP_AB_CASES = [(8, ((6, 0), (30, 24)))]
GPU_CASE_TABLES = (INVARIANCE_CASES, SWAP_AB_CASES)


def _runs(kind, configs, batches, monkeypatch):
    rows, rhs = target(kind)
    out = []
    for cfg in configs:
        plans.clear()  # a cached plan holds the config it was made with
        monkeypatch.setattr(ops.FAMILIES[kind], "plan", lambda *a, _cfg=cfg, **k: _cfg)
        for i, (batch, at) in enumerate(batches):
            out.append((cfg.kernel_name(), batch, run_rows(kind, rows, rhs, batch, at, seed=30 + i, device="cuda")))
    return out


def _assert_same(runs):
    name0, batch0, first = runs[0]
    for name, batch, run in runs[1:]:
        for got, want in zip(run, first):
            assert torch.equal(got, want), f"{name} at batch {batch} differs from {name0} at batch {batch0}"


@requires_sm90
@pytest.mark.parametrize("kind,batches", INVARIANCE_CASES)
def test_rows_do_not_depend_on_batch_or_tile_on_the_gpu(kind, batches, monkeypatch):
    _assert_same(_runs(kind, picks(kind), batches, monkeypatch))


@requires_sm90
@pytest.mark.parametrize("m,batches", SWAP_AB_CASES)
def test_swap_ab_and_the_plain_kernel_agree_on_the_gpu(m, batches, monkeypatch):
    n, k, _ = PROBLEMS["dense"]
    plain = forced(get_config(m, 2112, 7168), n, k, 1)
    swapped = forced(get_config(m, 2112, 7168, swap_ab=True), n, k, 1)
    _assert_same(_runs("dense", [plain, swapped], batches, monkeypatch))


def launch_cases() -> list[dict]:
    """Every GEMM this module launches (tests/gpu/test_gpu_cases.py, family ``batch_invariance``)."""
    cases = []
    for kind, batches in INVARIANCE_CASES:
        n, k, _ = PROBLEMS[kind]
        for cfg in picks(kind):
            for batch, _ in batches:
                cases.append(_case(kind, cfg, batch, n, k))
    for m, batches in SWAP_AB_CASES:
        n, k, _ = PROBLEMS["dense"]
        for cfg in (forced(get_config(m, 2112, 7168, swap_ab=s), n, k, 1) for s in (False, True)):
            cases += [_case("dense", cfg, batch, n, k) for batch, _ in batches]
    return cases


def _case(kind, cfg, batch, n, k):
    """The operands run_rows makes for ``batch`` (tests/_invariance.py), as a launch case."""
    case = dict(kind=kind, n=n, k=k, config=cfg, test="invariance", a_shape=(batch, k))
    if kind == "contiguous":  # group 0's padded segment, then one 128-row segment
        case.update(a_shape=((batch + 127) // 128 * 128 + 128, k), groups=2)
    elif kind == "masked":
        case.update(a_shape=(2, max(batch, 24) + 16, k), groups=2, expected_m=batch)
    return case
