"""The BF16 GEMM kernels (issue 41, ``kernels/bf16_gemm.py`` + ``kernels/bf16_gemm.cuh``) in the simulator against
float64: every form, all four majors, partial M / N / K tiles, fp32 D with C and with C aliasing D, masked groups
empty / partial / full, contiguous padding, batched operands on permuted (non-contiguous) views, the reduce form,
row bits independent of m; and planted bugs (a wrong transpose bit, an off-by-one stage parity, an epilogue that
ignores C, masked rows written past masked_m) that must each fail a check.

Metric: ``calc_diff`` (1 - cosine-like similarity, as the mini GEMM test) against the exact float64 product, with
the simulator's fp32 tensor-core model: <= 1e-9 for fp32 D (measured ~3e-14); bf16 D adds its own rounding (~2^-9
relative), so <= 1e-5 there (measured ~1.4e-6); rows outside the output (masked, padding) are checked bit for bit
against a sentinel.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from deep_fp8_gemm.kernels import bf16_gemm as bg
from deep_fp8_gemm.kernels.bf16_gemm import Bf16Form as F, Bf16GemmConfig as Cfg
from deep_fp8_gemm.runtime.target import Backend
from deep_fp8_gemm.simulator import SimulationError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

SENTINEL = 1234.5  # exactly representable in bf16 and fp32
TOL = {"fp32": 1e-9, "bf16": 1e-5}


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def randn(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def operand(rows: int, k: int, major: str, seed: int) -> torch.Tensor:
    """``[rows, k]`` bf16, K-major (contiguous) or MN-major (the transpose of a contiguous ``[k, rows]``)."""
    return randn(rows, k, seed=seed) if major == "k" else randn(k, rows, seed=seed).T


def run(cfg: Cfg, a, b, d, c=None, **kw) -> None:
    bg.launch(cfg, a, b, d, c, backend=Backend.SIM, **kw)


# ---------------------------------------------------------------------------------------------- dense
# (major_a, major_b, out, accumulate, block_m, block_n, math warpgroups): the four majors, one and two warpgroups, one
# warpgroup with two m64 waves, bf16 and fp32 D.
DENSE = [("k", "k", "bf16", False, 128, 64, 2), ("k", "mn", "fp32", True, 64, 128, 1),
         ("mn", "k", "fp32", True, 128, 64, 1), ("mn", "mn", "bf16", False, 128, 64, 2)]


def dense_case(major_a: str, major_b: str, out: str, acc: bool, bm: int, bn: int, wgs: int, *, planted: str = "none",
               m: int = 104, n: int = 136, k: int = 200, alias: bool = False) -> float:
    """One dense call (m, n, k all partial tiles: 104 of 128 rows, 136 = 2 x 64 + 8 columns, 200 = 3 x 64 + 8 of K);
    returns calc_diff against float64."""
    cfg = Cfg(F.DENSE, bm, bn, 3, wgs, major_a, major_b, out, acc, planted=planted)
    a, b = operand(m, k, major_a, 1), operand(n, k, major_b, 2)
    dtype = bg.OUT_DTYPES[out]
    c = randn(m, n, seed=3).to(dtype) if acc else None
    d = c if alias else torch.full((m, n), SENTINEL, dtype=dtype)
    ref = a.double() @ b.double().T + (c.double() if acc else 0)  # c read before d is written (c may be d)
    run(cfg, a, b, d, c)
    return calc_diff(d, ref)


@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"{c[0]}{c[1]}-{c[2]}")
def test_dense_majors(case):
    assert dense_case(*case) <= TOL[case[2]]


def test_fp32_c_aliasing_d():
    assert dense_case(*DENSE[1], alias=True) <= TOL["fp32"]


def test_row_bits_do_not_depend_on_m():
    """The first rows computed alone (m = 5) and inside m = 104 are the same bits: K order fixed, K never split."""
    a, b = operand(104, 200, "k", 1), operand(136, 200, "k", 2)
    cfg = Cfg(F.DENSE, 128, 64, 3, 2)
    full, few = torch.empty(104, 136, dtype=torch.bfloat16), torch.empty(5, 136, dtype=torch.bfloat16)
    run(cfg, a, b, full)
    run(cfg, a[:5], b, few)
    assert torch.equal(full[:5].view(torch.int16), few.view(torch.int16))


def test_config_rules_and_tma_strides():
    with pytest.raises(ValueError, match="block_n % 64"):
        Cfg(F.DENSE, 128, 96, 3, 2, "k", "mn")
    with pytest.raises(ValueError, match="reduce form"):
        Cfg(F.BATCHED_REDUCE, 128, 64, 3, 2, out_dtype="bf16")
    with pytest.raises(ValueError, match="shared memory"):
        Cfg(F.DENSE, 128, 256, 8, 2)
    cfg = Cfg(F.DENSE, 128, 64, 3, 2)
    a = randn(16, 100, seed=1)[:, :90]  # row stride 200 bytes: not a multiple of 16
    with pytest.raises(ValueError, match="a: TMA needs its row stride"):
        run(cfg, a, randn(8, 90, seed=2), torch.empty(16, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="b must be MN-major"):
        run(Cfg(F.DENSE, 128, 64, 3, 2, "k", "mn"), randn(16, 64, seed=1), randn(64, 64, seed=2),
            torch.empty(16, 64, dtype=torch.bfloat16))


def test_pick_config():
    cfg = bg.pick_config(F.DENSE, 4096, 7168, 2048, 1, "k", "k", torch.bfloat16, False, 132)
    assert cfg.block_m == 128 and cfg.smem_bytes() <= bg.SMEM_LIMIT
    small = bg.pick_config(F.M_GROUPED_MASKED, 32, 4096, 7168, 8, "k", "k", torch.bfloat16, False, 132)
    assert small.block_m == 64 and small.num_math_warpgroups == 1
    assert bg.pick_config(F.BATCHED, 256, 512, 128, 16, "k", "mn", torch.bfloat16, False, 132).block_n % 64 == 0


# ---------------------------------------------------------------------------------------------- grouped
def contiguous_case() -> None:
    """Three groups: group 0 rows [0, 100) then 28 padding rows, group 2 rows [128, 256), then a block of padding
    only (its rows stay untouched); group 1 is empty."""
    m, n, k, groups = 384, 72, 136, 3
    layout = torch.full((m,), -1, dtype=torch.int32)
    layout[:100], layout[128:256] = 0, 2
    a, b = randn(m, k, seed=4), randn(groups, n, k, seed=5)
    d = torch.full((m, n), SENTINEL, dtype=torch.bfloat16)
    run(Cfg(F.M_GROUPED_CONTIGUOUS, 128, 64, 3, 2), a, b, d, grouped_layout=layout)
    for lo, hi, g in ((0, 100, 0), (128, 256, 2)):
        assert calc_diff(d[lo:hi], a[lo:hi].double() @ b[g].double().T) <= TOL["bf16"], g
    assert (d[256:] == SENTINEL).all()


def masked_case(planted: str = "none") -> None:
    """Four groups of capacity 96: empty, full, 33 rows (partial m64 block), 64 rows (exactly one block)."""
    groups, m, n, k = 4, 96, 80, 72
    masked_m = torch.tensor([0, 96, 33, 64], dtype=torch.int32)
    a, b = randn(groups, m, k, seed=6), randn(groups, n, k, seed=7)
    d = torch.full((groups, m, n), SENTINEL, dtype=torch.bfloat16)
    run(Cfg(F.M_GROUPED_MASKED, 64, 64, 3, 1, planted=planted), a, b, d, masked_m=masked_m)
    for g, rows in enumerate(masked_m.tolist()):
        if rows:
            assert calc_diff(d[g, :rows], a[g, :rows].double() @ b[g].double().T) <= TOL["bf16"], g
        assert (d[g, rows:] == SENTINEL).all(), f"group {g}: rows past masked_m written"


def test_contiguous_with_padding():
    contiguous_case()


def test_masked_empty_partial_full_groups():
    masked_case()


# ---------------------------------------------------------------------------------------------- batched
def test_batched_einsum_bhd_hdr_bhr():
    """einsum bhd,hdr->bhr: A_h = x[:, h, :] ([b, d], K-major, rows h*d apart), B_h = w[h].T ([r, d], MN-major), D_h =
    out[:, h, :] (rows h*r apart): every operand a permuted view with strides as given."""
    bsz, h, dd, r = 40, 3, 72, 128
    x, w = randn(bsz, h, dd, seed=8), randn(h, dd, r, seed=9)
    out = torch.full((bsz, h, r), SENTINEL, dtype=torch.bfloat16)
    run(Cfg(F.BATCHED, 64, 64, 3, 1, "k", "mn"), x.permute(1, 0, 2), w.transpose(1, 2), out.permute(1, 0, 2))
    assert calc_diff(out, torch.einsum("bhd,hdr->bhr", x.double(), w.double())) <= TOL["bf16"]


def test_batched_einsum_bhr_hdr_bhd():
    """einsum bhr,hdr->bhd: A_h = x[:, h, :] ([b, r], K-major), B_h = w[h] ([d, r], K-major), D_h = out[:, h, :]."""
    bsz, h, dd, r = 70, 2, 80, 136
    x, w = randn(bsz, h, r, seed=10), randn(h, dd, r, seed=11)
    out = torch.full((bsz, h, dd), SENTINEL, dtype=torch.bfloat16)
    run(Cfg(F.BATCHED, 64, 64, 3, 1), x.permute(1, 0, 2), w, out.permute(1, 0, 2))
    assert calc_diff(out, torch.einsum("bhr,hdr->bhd", x.double(), w.double())) <= TOL["bf16"]


def test_batched_reduce_bmk_bnk_mn():
    """einsum bmk,bnk->mn accumulated into fp32 D: D = C + sum_s A_s . B_s^T, three s of 2 + 1/8 K blocks each."""
    s, m, n, k = 3, 72, 88, 136
    a, b = randn(s, m, k, seed=12), randn(s, n, k, seed=13)
    d = randn(m, n, seed=14).float()
    ref = d.double() + torch.einsum("bmk,bnk->mn", a.double(), b.double())
    run(Cfg(F.BATCHED_REDUCE, 128, 64, 4, 2, out_dtype="fp32", accumulate=True), a, b, d, d)
    assert calc_diff(d, ref) <= TOL["fp32"]


# ---------------------------------------------------------------------------------------------- planted bugs
def fails(check) -> bool:
    """Whether ``check`` fails: a wrong result (AssertionError) or a simulator report (race, deadlock, ...)."""
    try:
        check()
    except (AssertionError, SimulationError):
        return True
    return False


PLANTED_CHECKS = {
    # MN-major B read as K-major: the transpose bit is not a no-op.
    "trans_b": lambda: _assert_dense(DENSE[1], "trans_b"),
    # The math side reads a stage one phase early (before its TMA lands, or what the producer is overwriting).
    "full_parity": lambda: _assert_dense(DENSE[0], "full_parity", k=456),
    # fp32 D = acc instead of C + acc.
    "ignore_c": lambda: _assert_dense(DENSE[2], "ignore_c"),
    # The masked form stores rows of its last block past masked_m.
    "masked_rows": lambda: masked_case("masked_rows"),
}


def _assert_dense(case, planted: str, **kw) -> None:
    assert dense_case(*case, planted=planted, **kw) <= TOL[case[2]]


@pytest.mark.parametrize("planted", sorted(PLANTED_CHECKS))
def test_planted_bug_fails(planted):
    assert fails(PLANTED_CHECKS[planted]), f"planted bug {planted!r} went unnoticed"
