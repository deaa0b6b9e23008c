"""The FP8-output and SwiGLU kernels (issue 27), executed by the CPU simulator.

Two kinds of check:

* bits: with the simulator's exact tensor-core mode (``DFG_SIM_EXACT_MMA=1``) and operands whose float32 sums are
  exact (small integers, power-of-two scales), the kernel's fp32 accumulators equal the reference's float32 GEMM, so
  ``(D, sD)`` must equal the families' reference, ``per_token_cast_to_fp8_torch(reciprocal=True)`` of it, bit for
  bit: the amax over the quad, the 1e-4 floor, the IEEE division by 448, ``ceil_to_ue8m0``, the one IEEE reciprocal
  per row and 128 columns and the multiply by it (issue 45; ``test_dense_bits_at_reciprocal_ties`` on rows where a
  division would round differently), the RNE / saturating e4m3 cast and the M-major scale layout are the
  reference's exactly (partial row blocks, a partial last scale group, zero rows, split-K, a phantom tile of a 2-CTA
  cluster, the grouped layouts' padding and empty groups included);
* numerics (the tensor-core model): the SwiGLU kernel against its reference, against the unfused path (bf16 GEMM
  output + ``silu_mul_quant``) and both against float64.

Outputs are poisoned first (e4m3 NaN, NaN scales) so that unwritten elements show. The planted bugs are in
tests/kernels/test_sim_planted_fp8.py.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from deep_fp8_gemm import (calc_diff, get_col_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8,
                           set_mk_alignment_for_contiguous_layout)
from deep_fp8_gemm.config import GemmConfig, check_config, smem_bytes
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.ops import FAMILIES, outputs
from deep_fp8_gemm.ops.moe import quantise_experts
from deep_fp8_gemm.quant import per_token_cast_to_fp8_torch, silu_mul_quant_torch
from deep_fp8_gemm.utils import ceil_div

from tests.kernels.test_sim_gemm import contiguous_layout

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

FP8 = torch.float8_e4m3fn
E4M3_NAN = 0x7F


def make_config(kind, n, k, block_m, *, groups=1, stages=2, cluster=(1, 1), grid=2, split_k=1, ue8m0=False):
    block_n = 256 if kind.endswith("swiglu") else 128
    cfg = GemmConfig(kind=kind, shape_n=n, shape_k=k, num_groups=groups, block_m=block_m, block_n=block_n,
                     num_stages=stages, cluster_m=cluster[0], cluster_n=cluster[1], band_width=16, grid_size=grid,
                     split_k=split_k, ue8m0=ue8m0)
    check_config(cfg)
    assert cfg.smem_bytes == smem_bytes(block_m, block_n, stages, kind)
    return cfg


def exact_operands(m_shape, n, k, groups=None, seed=0, zero_rows=()):
    """e4m3 integers in [-4, 4] with power-of-two scales: every product and float32 sum of the GEMM is exact."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-4, 5, (*m_shape, k), generator=g).float()
    for r in zero_rows:
        a.view(-1, k)[r] = 0
    sa = 2.0 ** torch.randint(-2, 3, (*m_shape, ceil_div(k, 128)), generator=g).float()
    b_lead = (groups,) if groups else ()
    b = torch.randint(-4, 5, (*b_lead, n, k), generator=g).float()
    sb = 2.0 ** torch.randint(-1, 2, (*b_lead, ceil_div(n, 128), ceil_div(k, 128)), generator=g).float()
    return a.to(FP8), sa, b.to(FP8), sb


def poisoned_out(lead, rows, n_out):
    d, sd = outputs.empty_out(lead, rows, n_out, "cpu")
    d.view(torch.uint8).fill_(E4M3_NAN)
    sd.fill_(float("nan"))
    return d, sd


def run_sim(cfg, a, sa, b, sb, out, layout=None):
    gemm.launch_fp8_output(cfg, a, get_col_major_tma_aligned_tensor(sa), b, sb, out[0], out[1], layout, "sim")


def assert_same_bits(out, ref, what=""):
    (d, sd), (rd, rsd) = out, ref
    mismatch = (d.view(torch.uint8) != rd.view(torch.uint8)).sum().item()
    assert mismatch == 0, f"{what}: {mismatch} of {d.numel()} e4m3 values differ"
    assert torch.equal(sd, rsd), f"{what}: scales differ, max |diff| {(sd - rsd).abs().nan_to_num(1e30).max().item()}"


def dequantised(d, sd):
    n = d.shape[-1]
    return d.float() * sd.repeat_interleave(128, dim=-1)[..., :n]


# ---------------------------------------------------------------------------------------------- bits
DENSE_EXACT_CASES = {
    # partial row block (70 of 128), partial last scale group (n = 192: the second group's upper half is the
    # zero-filled tail of B), two zero rows (the 1e-4 floor)
    "bm64_partial_block_and_group": dict(m=70, n=192, k=256, block_m=64, zero_rows=(3, 69)),
    "bm128_two_warpgroups_ue8m0": dict(m=130, n=256, k=384, block_m=128, ue8m0=True),
    "split_k": dict(m=64, n=128, k=512, block_m=64, split_k=2, grid=4),
    # B multicast over a 2x1 cluster with 3 m-blocks and 3 n-blocks: the tail's phantom tile (n-block 3, past N)
    # must store nothing
    "cluster_phantom_tile": dict(m=150, n=384, k=256, block_m=64, cluster=(2, 1), grid=2),
    # two m64 waves per math warpgroup (the heuristic's large-M tile since the register model's recalibration):
    # rows 256..299 a partial second block, each wave's 1x128 scales from its own rows
    "bm256_two_waves": dict(m=300, n=256, k=256, block_m=256),
}


@pytest.mark.parametrize("case", sorted(DENSE_EXACT_CASES))
def test_dense_bits(case, monkeypatch):
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    c = dict(DENSE_EXACT_CASES[case])
    m, n, k = c["m"], c["n"], c["k"]
    cfg = make_config("dense_fp8out", n, k, c["block_m"], cluster=c.get("cluster", (1, 1)), grid=c.get("grid", 2),
                      split_k=c.get("split_k", 1), ue8m0=c.get("ue8m0", False))
    a, sa, b, sb = exact_operands((m,), n, k, seed=len(case), zero_rows=c.get("zero_rows", ()))
    out = poisoned_out((), m, n)
    run_sim(cfg, a, sa, b, sb, out)
    ref = poisoned_out((), m, n)
    FAMILIES["dense_fp8out"].reference((a, sa), (b, sb), ref, use_ue8m0=cfg.ue8m0)
    assert_same_bits(out, ref, case)
    if cfg.ue8m0:
        exponent_only = (out[1].view(torch.int32) & 0x7FFFFF) == 0
        assert exponent_only.all(), "use_ue8m0 scales must be powers of two"


# Row maxima r and values x of those rows where x / fl(r / 448) and x * fl(1 / fl(r / 448)) round to different e4m3
# codes (39 / fl(52 / 448) rounds to 336.0, an e4m3 tie going to 320; the reciprocal's product is an ulp above: 352).
RECIPROCAL_TIES = {52: (39,), 76: (57,), 104: (39, 78), 124: (93,)}


def reciprocal_tie_operands(m, row_max):
    """e4m3 0 / ±1 operands with D[r, c] = min(row_max[r], c + 1) for c < 128 and its negation for c in [128, 256)
    (k = 128, unit scales): exact sums whose rows hold the :data:`RECIPROCAL_TIES` pairs."""
    k = 128
    a = (torch.arange(k).expand(m, k) < torch.tensor(row_max).view(m, 1)).float()
    prefix = (torch.arange(k).expand(128, k) < torch.arange(1, 129).view(128, 1)).float()
    b = torch.cat([prefix, -prefix])
    return a.to(FP8), torch.ones(m, 1), b.to(FP8), torch.ones(2, 1)


@pytest.mark.parametrize("block_m, m", [(64, 70), (256, 300)], ids=["bm64", "bm256_two_waves"])
def test_dense_bits_at_reciprocal_ties(block_m, m, monkeypatch):
    """The epilogue multiplies by one IEEE reciprocal per row and 128-column group (issue 45), bit for bit the
    reference's ``x * fl(1 / scale)``: on rows where that and ``x / scale`` round to different codes, so the check
    tells the two rules apart (the division's codes differ from the kernel's)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    n, k = 256, 128
    ties = list(RECIPROCAL_TIES)
    row_max = [ties[r % len(ties)] if r % 5 else 1 + r % 128 for r in range(m)]
    cfg = make_config("dense_fp8out", n, k, block_m)
    a, sa, b, sb = reciprocal_tie_operands(m, row_max)
    out = poisoned_out((), m, n)
    run_sim(cfg, a, sa, b, sb, out)
    ref = poisoned_out((), m, n)
    FAMILIES["dense_fp8out"].reference((a, sa), (b, sb), ref)
    assert_same_bits(out, ref, cfg.kernel_name())
    acc = torch.minimum(torch.tensor(row_max).view(m, 1), torch.arange(1, 129).view(1, 128)).float()
    division, _ = per_token_cast_to_fp8_torch(torch.cat([acc, -acc], dim=1))
    differ = (division.view(torch.uint8) != out[0].view(torch.uint8)).sum().item()
    want = 2 * sum(len(RECIPROCAL_TIES[row_max[r]]) for r in range(m) if row_max[r] in RECIPROCAL_TIES)
    assert differ == want, f"{differ} codes differ from x / scale's, {want} expected at the ties"


def assert_same_poisoned_bits(out, ref, what=""):
    """:func:`assert_same_bits` over whole outputs: rows left unwritten must be so in both (the poison's bits)."""
    assert_same_bits((out[0], out[1].view(torch.int32)), (ref[0], ref[1].view(torch.int32)), what)


def test_contiguous_bits_with_padding_and_empty_experts(monkeypatch):
    """The whole output: the padding rows of a block holding an expert's rows are computed and quantised with that
    expert (D and sD: Fp8TmaStore stores every row of a tile), as the reference computes them; padding-only blocks
    are never computed (D and sD untouched) on either side."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    n, k, groups = 256, 256, 4
    # partial block, a padding-only block, empty expert 1, exact block, single row
    layout = torch.cat([contiguous_layout([70]), torch.full((128,), -1, dtype=torch.int32),
                        contiguous_layout([0, 0, 128, 1])])
    m_sum = layout.numel()
    cfg = make_config("contiguous_fp8out", n, k, 128, groups=groups)
    a, sa, b, sb = exact_operands((m_sum,), n, k, groups=groups, seed=5)
    out = poisoned_out((), m_sum, n)
    run_sim(cfg, a, sa, b, sb, out, layout)
    ref = poisoned_out((), m_sum, n)
    FAMILIES["contiguous_fp8out"].reference((a, sa), (b, sb), ref, layout)
    assert_same_poisoned_bits(out, ref, "contiguous")
    assert not out[1][70:128].isnan().any() and not out[1][385:].isnan().any(), "mixed blocks' padding rows"
    assert (out[0][128:256].view(torch.uint8) == E4M3_NAN).all() and out[1][128:256].isnan().all(), "padding-only"


def test_contiguous_swiglu_at_alignment_64(monkeypatch):
    """At alignment 64 experts start at 64-row multiples: the op (DFG_SIMULATE=1, its own plan) must run BLOCK_M 64
    (a 128-row block would hold two experts), and the reference computes the mixed blocks' padding rows as the kernel.
    Exact sums; SiLU may round differently on the host (the tolerance of test_masked_swiglu_bits_multicast)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    monkeypatch.setenv("DFG_SIMULATE", "1")
    hidden, inter, groups = 128, 128, 3
    layout = contiguous_layout([40, 64, 1], align=64)  # 40 + 24 padding | 64 | 1 + 63 padding
    m_sum = layout.numel()
    a, sa, w, sw = exact_operands((m_sum,), 2 * inter, hidden, groups=groups, seed=13)
    sw = sw / 8  # keep SiLU's argument within a few units
    set_mk_alignment_for_contiguous_layout(64)
    try:
        out = poisoned_out((), m_sum, inter)
        FAMILIES["contiguous_swiglu"].public((a, sa), (w, sw), out, layout)
        ref = poisoned_out((), m_sum, inter)
        FAMILIES["contiguous_swiglu"].reference((a, sa), (w, sw), ref, layout)
    finally:
        set_mk_alignment_for_contiguous_layout(128)
    (q, s), (rq, rs) = out, ref
    assert not s.isnan().any() and not rs.isnan().any(), "every block holds an expert's rows: all rows computed"
    mismatch = (q.view(torch.uint8) != rq.view(torch.uint8)).sum().item()
    assert mismatch <= max(1, q.numel() // 10_000), f"{mismatch} of {q.numel()} e4m3 values differ"
    torch.testing.assert_close(s, rs, rtol=2e-7, atol=0)


@pytest.mark.parametrize("block_m, m_max, rows", [(64, 96, 37), (256, 200, 150)], ids=["bm64", "bm256_two_waves"])
def test_masked_bits(monkeypatch, block_m, m_max, rows):
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    n, k, groups = 128, 256, 3
    masked_m = torch.tensor([0, rows, m_max], dtype=torch.int32)
    cfg = make_config("masked_fp8out", n, k, block_m, groups=groups)
    a, sa, b, sb = exact_operands((groups, m_max), n, k, groups=groups, seed=6)
    out = poisoned_out((groups,), m_max, n)
    run_sim(cfg, a, sa, b, sb, out, masked_m)
    ref = poisoned_out((groups,), m_max, n)
    FAMILIES["masked_fp8out"].reference((a, sa), (b, sb), ref, masked_m, int(masked_m.max()))
    for g, rows in enumerate(masked_m.tolist()):
        assert_same_bits((out[0][g, :rows], out[1][g, :rows]), (ref[0][g, :rows], ref[1][g, :rows]), f"group {g}")
    assert (out[0][0].view(torch.uint8) == E4M3_NAN).all() and out[1][0].isnan().all(), "masked_m == 0 writes nothing"
    assert out[1][1].stride() == (1, m_max) and out[1].stride() == (m_max, 1, m_max)  # per-group M-major planes


@pytest.mark.parametrize("align", [128, 64])
def test_psum_bits(monkeypatch, align):
    """Alignment 128: group 1 empty, group 2 = rows [128, 300), rows [100, 128) and [300, 384) padding of a group's
    last block, computed with it. Alignment 64 (BLOCK_M 64, psum_alignment 64), the same ends: group 1 empty, group
    2 = rows [128, 300) too, the padding computed is [100, 128) and [300, 320); rows [320, 384) are untouched."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    n, k, groups, m_sum = 128, 128, 3, 384
    ends = torch.tensor([100, 100, 300], dtype=torch.int32)
    cfg = dataclasses.replace(make_config("psum_fp8out", n, k, align, groups=groups), psum_alignment=align)
    check_config(cfg)
    a, sa, b, sb = exact_operands((m_sum,), n, k, groups=groups, seed=7)
    out = poisoned_out((), m_sum, n)
    run_sim(cfg, a, sa, b, sb, out, ends)
    ref = poisoned_out((), m_sum, n)
    set_mk_alignment_for_contiguous_layout(align)
    try:
        FAMILIES["psum_fp8out"].reference((a, sa), (b, sb), ref, ends)
    finally:
        set_mk_alignment_for_contiguous_layout(128)
    assert_same_poisoned_bits(out, ref, "psum")
    if align == 128:
        assert not out[1].isnan().any()
    else:
        assert not out[1][:320].isnan().any() and out[1][320:].isnan().all(), "rows past the last 64-row block"


# ---------------------------------------------------------------------------------------------- SwiGLU
def moe_operands(m_shape, hidden, inter, groups, seed, up_gain=1.0):
    """Normal activations and experts (DeepSeek-V3's MoE scaled down): A quantised per token, w13 per 128x128 block
    in the checkpoint layout and interleaved (``up_gain`` scales the up projection W3, hence its block scales)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*m_shape, hidden, generator=g)
    a, sa = per_token_cast_to_fp8(x.reshape(-1, hidden))
    w13 = torch.randn(groups, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w13[:, inter:] *= up_gain
    w8, ws = quantise_experts(w13)
    wi, wis = outputs.interleave_swiglu_weights(w8, ws)
    return a.reshape(*m_shape, hidden), sa.reshape(*m_shape, -1), (w8, ws), (wi, wis)


def swiglu_float64(a, sa, w8, ws):
    """SiLU(gate) * up of one group's rows in float64 from the dequantised operands (checkpoint layout)."""
    a64 = a.double() * sa.double().repeat_interleave(128, dim=-1)[..., :a.shape[-1]]
    w64 = w8.double() * ws.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:w8.shape[0], :w8.shape[1]]
    acc = a64 @ w64.t()
    inter = acc.shape[-1] // 2
    return torch.nn.functional.silu(acc[..., :inter]) * acc[..., inter:]


def unfused(a, sa, w8, ws):
    """The unfused path of one group's rows: the bf16 GEMM (its exact reference), then silu_mul_quant."""
    from deep_fp8_gemm._core.reference_math import gemm_nt_promoted

    gate_up = gemm_nt_promoted(a, sa, w8, ws).to(torch.bfloat16)
    q, s = silu_mul_quant_torch(gate_up)
    return dequantised(q, s)


def test_contiguous_swiglu_numerics():
    """Fused vs its reference (the tensor-core model's sums vs float32 sums), vs the unfused path (<= 2e-3, the
    issue's bound) and vs float64 (no worse than the unfused path's)."""
    hidden, inter, groups = 256, 256, 3
    layout = contiguous_layout([70, 0, 200])
    m_sum = layout.numel()
    a, sa, (w8, ws), (wi, wis) = moe_operands((m_sum,), hidden, inter, groups, seed=11)
    cfg = make_config("contiguous_swiglu", 2 * inter, hidden, 128, groups=groups)
    out = poisoned_out((), m_sum, inter)
    run_sim(cfg, a, sa, wi, wis, out, layout)
    ref = poisoned_out((), m_sum, inter)
    FAMILIES["contiguous_swiglu"].reference((a, sa), (wi, wis), ref, layout)
    fused_all, ref_all = dequantised(*out), dequantised(*ref)
    for e in range(groups):
        rows = layout == e
        if not rows.any():
            continue
        fused, truth, plain = fused_all[rows], swiglu_float64(a[rows], sa[rows], w8[e], ws[e]), unfused(a[rows], sa[rows], w8[e], ws[e])
        assert not fused.isnan().any()
        assert calc_diff(fused, ref_all[rows]) < 1e-4, e
        assert calc_diff(fused, plain) <= 2e-3, e
        assert calc_diff(fused, truth) <= calc_diff(plain, truth) * 1.05 + 1e-6, e


def test_masked_swiglu_bits_multicast(monkeypatch):
    """Exact sums (SiLU itself may round differently on the host than torch: the quantiser kernels' tolerance)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    hidden, inter, groups, m_max = 128, 256, 2, 192
    masked_m = torch.tensor([130, 64], dtype=torch.int32)
    a, sa, w, sw = exact_operands((groups, m_max), 2 * inter, hidden, groups=groups, seed=12)
    sw = sw / 8  # keep SiLU's argument within a few units
    cfg = make_config("masked_swiglu", 2 * inter, hidden, 64, groups=groups, cluster=(1, 2), grid=4)
    out = poisoned_out((groups,), m_max, inter)
    run_sim(cfg, a, sa, w, sw, out, masked_m)
    ref = poisoned_out((groups,), m_max, inter)
    FAMILIES["masked_swiglu"].reference((a, sa), (w, sw), ref, masked_m, 64)
    for g, rows in enumerate(masked_m.tolist()):
        (q, s), (rq, rs) = (out[0][g, :rows], out[1][g, :rows]), (ref[0][g, :rows], ref[1][g, :rows])
        mismatch = (q.view(torch.uint8) != rq.view(torch.uint8)).sum().item()
        assert mismatch <= max(1, q.numel() // 10_000), f"group {g}: {mismatch} of {q.numel()} e4m3 values differ"
        torch.testing.assert_close(s, rs, rtol=2e-7, atol=0)


def test_interleave_is_a_permutation():
    w8 = torch.randn(2, 512, 256).to(FP8)
    ws = torch.rand(2, 4, 2) + 0.5
    wi, wis = outputs.interleave_swiglu_weights(w8, ws)
    assert torch.equal(wi[1, 128:256].view(torch.uint8), w8[1, 256:384].view(torch.uint8))  # up block 0
    assert torch.equal(wi[1, 256:384].view(torch.uint8), w8[1, 128:256].view(torch.uint8))  # gate block 1
    assert torch.equal(wis[:, 1], ws[:, 2]) and torch.equal(wis[:, 2], ws[:, 1])
    cols = torch.arange(512).float().expand(3, 512)
    back = outputs.deinterleave_swiglu_columns(cols[:, torch.cat([torch.arange(0, 128), torch.arange(256, 384),
                                                                      torch.arange(128, 256), torch.arange(384, 512)])])
    assert torch.equal(back, cols)
    with pytest.raises(ValueError, match="I a multiple of 128"):
        outputs.interleave_swiglu_weights(w8[:, :320], ws[:, :3])


def test_fp8_epilogues_under_adversarial_schedules(monkeypatch):
    """Seeded adversarial schedules (hal/sim/schedule.hpp) over the epilogue's exchanges: the quad's partials,
    the D tile before its TMA store, two warpgroups, split-K's reduce before the FP8 store."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    cases = [dict(m=130, n=256, k=384, block_m=128, ue8m0=True), dict(m=64, n=128, k=512, block_m=64, split_k=2, grid=4)]
    for c in cases:
        cfg = make_config("dense_fp8out", c["n"], c["k"], c["block_m"], grid=c.get("grid", 2),
                          split_k=c.get("split_k", 1), ue8m0=c.get("ue8m0", False))
        a, sa, b, sb = exact_operands((c["m"],), c["n"], c["k"], seed=3)
        ref = poisoned_out((), c["m"], c["n"])
        FAMILIES["dense_fp8out"].reference((a, sa), (b, sb), ref, use_ue8m0=cfg.ue8m0)
        for seed in (1, 2, 3, 4):
            monkeypatch.setenv("DFG_SIM_SEED", str(seed))
            out = poisoned_out((), c["m"], c["n"])
            run_sim(cfg, a, sa, b, sb, out)
            assert_same_bits(out, ref, f"{cfg.kernel_name()} seed {seed}")
