"""Batch invariance on the CPU path and in the heuristic (issue 37): a row's bits do not depend on its batch, its
neighbours, its padding or the device's SM count; the fast mode is the only one that splits K or swaps A and B."""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm._core import reference_math
from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.kernels.targets import DEEPSEEK_V3_DENSE, DEEPSEEK_V3_GROUPED
from deep_fp8_gemm.kinds import TABLE
from tests._invariance import cancelling_operands, random_rows, run_rows

KINDS_1D2D = TABLE.kinds_where(accumulation="1d2d")
#: (batch, position of the target rows): alone, among few and many neighbours, across a 128-row block boundary.
BATCHES = [(6, 0), (19, 7), (64, 50), (200, 125)]


def _target(k: int, n: int):
    """Four cancelling rows and two random ones, and B."""
    a, sa, b, sb = cancelling_operands(k, n, 4, seed=1)
    ra, rsa = random_rows(2, k, seed=2)
    return (torch.cat([a.view(torch.uint8), ra.view(torch.uint8)]).view(a.dtype), torch.cat([sa, rsa])), (b, sb)


@pytest.mark.parametrize("kind", KINDS_1D2D)
def test_cpu_rows_do_not_depend_on_their_batch(kind):
    target, rhs = _target(256, 256)
    runs = [run_rows(kind, target, rhs, batch, at, seed=10 + i) for i, (batch, at) in enumerate(BATCHES)]
    for run in runs[1:]:
        for got, want in zip(run, runs[0]):
            assert torch.equal(got, want), kind


def test_an_m_dependent_split_fails_the_cpu_check(monkeypatch):
    """The check is sharp: a reference that splits K in two halves for small batches (as the fast mode's split-K
    does on the GPU) gives other bits for the cancelling rows."""
    promoted = reference_math.gemm_nt_promoted

    def planted(a, sa, b, sb, gran=reference_math.BLOCK128):
        if a.shape[0] > 8:
            return promoted(a, sa, b, sb, gran)
        half = a.shape[1] // 2
        return (promoted(a[:, :half], sa[:, :1], b[:, :half], sb[:, :1], gran)
                + promoted(a[:, half:], sa[:, 1:], b[:, half:], sb[:, 1:], gran))

    monkeypatch.setattr("deep_fp8_gemm.ops.gemm_family.gemm_nt_promoted", planted)
    target, rhs = _target(256, 256)
    small, large = run_rows("dense", target, rhs, 6, 0, seed=3), run_rows("dense", target, rhs, 64, 0, seed=4)
    assert not torch.equal(small[0], large[0])


def test_the_cpu_reference_is_exact_block_partials_promoted_in_order():
    """Independent of any BLAS: float64 of the e4m3 products per 128-K block, promoted in fp32 in block order."""
    a, sa = random_rows(5, 384, seed=5)
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(256, 384))
    got = reference_math.gemm_nt_promoted(a, sa, b, sb)
    acc = torch.zeros(5, 256, dtype=torch.float32)
    for j in range(3):
        p = sum(a[:, 128 * j + i].double()[:, None] * b[:, 128 * j + i].double()[None, :] for i in range(128))
        scale = sa[:, j:j + 1] * sb[:, j].repeat_interleave(128)[None, :256]
        acc = (acc.double() + p.float().double() * scale.double()).float()
    assert torch.equal(got, acc)


# ---------------------------------------------------------------------------------------------- the heuristic
def _ms() -> list[int]:
    """M in {1, 2, 4, ..., 8192} and every M where a dense pick changes in the fast mode (its breakpoints)."""
    ms = {2 ** i for i in range(14)}
    for n, k in DEEPSEEK_V3_DENSE:
        previous = None
        for m in range(1, 1025):
            name = get_config(m, n, k, batch_invariant=False).kernel_name()
            if name != previous:
                ms.add(m)
            previous = name
    return sorted(ms)


@pytest.mark.parametrize("num_sms", [132, 114, 78])
def test_the_invariant_heuristic_never_splits_or_swaps(num_sms):
    """Default mode, every DeepSeek-V3 dense and grouped shape, every M of the grid and the fast mode's breakpoints,
    three SM counts: split factor 1 and no swap-AB everywhere (what `audit` shows)."""
    assert dfg.is_batch_invariant()
    ms = _ms()
    for kind in TABLE.names:
        row = TABLE.row(kind)
        if row.accumulation != "1d2d":
            continue
        shapes = DEEPSEEK_V3_DENSE if row.layout == "dense" else DEEPSEEK_V3_GROUPED
        if row.output == "swiglu_fp8":
            shapes = ((4096, 7168),)
        groups = 1 if row.layout == "dense" else 8
        for n, k in shapes:
            for m in ms:
                cfg = get_config(m if row.layout != "contiguous" else max(m, 1) * 1, n, k, groups, kind, num_sms)
                assert (cfg.split_k, cfg.swap_ab) == (1, False), (kind, n, k, m, num_sms, cfg.kernel_name())


def test_the_fast_mode_is_a_switch(monkeypatch):
    """``set_batch_invariant(False)`` lets the model split K and swap A and B where it wins (decode shapes); the
    drop-in's ``use_deterministic_algorithms(True)`` turns the invariant mode back on; a prepared GEMM is bound to
    the mode it was prepared in."""
    from deep_fp8_gemm import compat

    assert get_config(8, 576, 7168, batch_invariant=False).split_k > 1
    try:
        dfg.set_batch_invariant(False)
        assert not dfg.is_batch_invariant()
        a, sa = random_rows(8, 7168, seed=6)
        b, sb = dfg.per_block_cast_to_fp8(torch.randn(576, 7168))
        assert dfg.ops.FAMILIES["dense"].plan(a, b, None, 132).split_k > 1
        compat.use_deterministic_algorithms(True)
        assert dfg.is_batch_invariant() and dfg.ops.FAMILIES["dense"].plan(a, b, None, 132).split_k == 1
        compat.use_deterministic_algorithms(False)  # no citable meaning in the reference: nothing changes
        assert dfg.is_batch_invariant()
        with pytest.raises(TypeError, match="enabled must be a bool"):
            dfg.set_batch_invariant(1)
        prepared = dfg.prepare_gemm("dense", (a, sa), (b, sb), torch.empty(8, 576, dtype=torch.bfloat16))
        dfg.set_batch_invariant(False)
        with pytest.raises(RuntimeError, match="prepared with is_batch_invariant"):
            prepared((a, sa), (b, sb), torch.empty(8, 576, dtype=torch.bfloat16))
    finally:
        dfg.set_batch_invariant(True)
