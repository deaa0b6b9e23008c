"""What the CPU accepts the GPU computes: the grouped layouts' value rules, checked on CPU tensors (the reference
and the simulator path alike) exactly as the kernels rely on them.

* contiguous (``m_indices``): one expert per BLOCK_M block, an expert row first or last in a block holding any
  (``scheduler.cuh``: ``contiguous_block_expert`` reads the first and last rows, skips a block whose both are -1),
  BLOCK_M being ``get_m_alignment_for_contiguous_layout()`` (128, or 64 when set);
* psum (group ends): non-negative, non-decreasing, last end <= m_sum;
* masked (``masked_m``): every count in ``[0, m_max]``.

The simulator cases show both directions on the real kernels, at both alignments: every layout the check accepts
is computed right (padding at a segment's head, in its middle, whole padding blocks), and every layout it rejects
is computed wrong by the kernels when launched behind the check's back — so the rule is neither looser nor
stricter than the kernels.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, reference
from deep_fp8_gemm.config import GemmConfig, check_config, contiguous_block_m
from deep_fp8_gemm.kernels import gemm
from tests._operands import gemm_operands, quantised_activations, quantised_weights

N, K, G = 64, 128, 2
SENTINEL = -7.0


def _rows(*runs: tuple[int, int]) -> torch.Tensor:
    """m_indices from ``(value, count)`` runs."""
    return torch.tensor([v for v, c in runs for _ in range(c)], dtype=torch.int32)


# (id, m_indices, text the ValueError must contain): layouts the kernels compute wrongly.
BAD_CONTIGUOUS = [
    # The case: expert 0 on rows 0..99, expert 1 on 100..227 (not padded to the alignment).
    ("unpadded_experts", _rows((0, 100), (1, 128), (-1, 28)), "m_indices[0:128] (block 0 of the kernels' 128-row"),
    ("two_experts_one_block", _rows((0, 64), (1, 64), (-1, 128)), "holds rows of 2 experts"),
    ("ends_padding_128", _rows((-1, 10), (0, 108), (-1, 10), (1, 128)), "first and last rows are padding"),
    # Would pass with 64-row blocks (each has an expert row at an end), not with the kernels' 128.
    ("skipped_at_128", _rows((-1, 10), (0, 54), (-1, 64), (1, 128)), "m_indices[0:128]"),
    ("expert_out_of_range", _rows((0, 128), (2, 128)), "values must be in [-1, G)"),
    ("below_minus_one", _rows((0, 128), (-2, 128)), "values must be in [-1, G)"),
    # A partial last block (m_sum not a multiple of the alignment) obeys the same rule.
    ("partial_block_two_experts", _rows((0, 128), (0, 10), (1, 10)), "holds rows of 2 experts"),
    ("partial_block_ends_padding", _rows((0, 128), (-1, 5), (1, 10), (-1, 5)), "first and last rows are padding"),
]
# Layouts the kernels compute right at every BLOCK_M (not only what deep_fp8_gemm.layout builds).
GOOD_CONTIGUOUS = [
    ("built", _rows((0, 100), (-1, 28), (1, 128))),
    ("head_padding", _rows((-1, 28), (0, 100), (1, 128))),
    ("middle_padding", _rows((0, 10), (-1, 108), (0, 10), (1, 128))),
    ("padding_block_between", _rows((0, 128), (-1, 128), (1, 1), (-1, 127))),
    ("all_padding", _rows((-1, 256))),
    ("empty_expert_0", _rows((1, 256))),
    # Rows 0..63 hold an expert row between padding rows: fine for 128-row blocks (row 127 names the expert).
    ("padding_around_a_row", _rows((-1, 30), (0, 1), (-1, 33), (0, 64), (1, 128))),
    # m_sum not a multiple of the alignment, as the reference accepts (issue 40): Hugging Face transformers' experts
    # path leaves -1 rows at the tail of a buffer sized without rounding; a partial last block of an expert's rows.
    ("partial_tail_padding", _rows((0, 100), (-1, 28), (1, 50), (-1, 22))),
    ("partial_expert_block", _rows((0, 128), (1, 72))),
    ("partial_padding_only_block", _rows((0, 128), (-1, 3))),
]
#: At alignment 64 (BLOCK_M 64): what 128-row blocks accept and 64-row ones do not, and experts at 64-row starts.
BAD_AT_64 = [("padding_around_a_row", dict(GOOD_CONTIGUOUS)["padding_around_a_row"],
              "m_indices[0:64] (block 0 of the kernels' 64-row"),
             ("two_experts_one_block", _rows((0, 32), (1, 32), (-1, 64)), "holds rows of 2 experts")]
GOOD_AT_64 = [("experts_at_64", _rows((0, 64), (1, 40), (-1, 24))), *(c for c in GOOD_CONTIGUOUS
                                                                    if c[0] != "padding_around_a_row")]


@pytest.fixture
def alignment_64():
    dfg.set_mk_alignment_for_contiguous_layout(64)
    try:
        yield
    finally:
        dfg.set_mk_alignment_for_contiguous_layout(128)


def _operands(m_sum: int, seed: int = 0):
    return gemm_operands((m_sum,), N, K, G, seed)


def _expected(a, sa, b, sb, m_indices) -> torch.Tensor:
    out = torch.full((a.shape[0], N), SENTINEL, dtype=torch.bfloat16)
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    return out


@pytest.mark.parametrize("case_id,m_indices,text", BAD_CONTIGUOUS, ids=[c[0] for c in BAD_CONTIGUOUS])
def test_contiguous_op_rejects_what_the_kernels_compute_wrongly(case_id, m_indices, text):
    a, sa, b, sb = _operands(m_indices.numel())
    out = torch.zeros(m_indices.numel(), N, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as info:
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    assert text in str(info.value) and "m_indices" in str(info.value), str(info.value)
    for _ in range(2):  # the cached plan checks the values on every call too
        with pytest.raises(ValueError, match="m_indices"):
            dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    with pytest.raises(ValueError, match="m_indices"):  # the custom op (torch.compile's path) as well
        torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, m_indices)
    with pytest.raises(ValueError, match="m_indices"):
        dfg.check_contiguous_layout(m_indices, G)


@pytest.mark.parametrize("case_id,m_indices", GOOD_CONTIGUOUS, ids=[c[0] for c in GOOD_CONTIGUOUS])
def test_contiguous_op_accepts_what_the_kernels_compute(case_id, m_indices):
    a, sa, b, sb = _operands(m_indices.numel())
    out = torch.full((m_indices.numel(), N), SENTINEL, dtype=torch.bfloat16)
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
    assert torch.equal(out, _expected(a, sa, b, sb, m_indices))
    dfg.check_contiguous_layout(m_indices, G)


def test_contiguous_rule_follows_the_alignment(alignment_64):
    """Read through get_m_alignment_for_contiguous_layout(): at 64 the kernels' blocks are 64 rows, so experts may
    start at any multiple of 64, m_sum need only be one, and 64-row blocks must each name their expert."""
    assert contiguous_block_m(dfg.get_m_alignment_for_contiguous_layout()) == 64
    for case_id, m_indices in GOOD_AT_64:
        a, sa, b, sb = _operands(m_indices.numel())
        out = torch.full((m_indices.numel(), N), SENTINEL, dtype=torch.bfloat16)
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices)
        assert torch.equal(out, _expected(a, sa, b, sb, m_indices)), case_id
    for case_id, m_indices, text in BAD_AT_64:
        with pytest.raises(ValueError) as info:
            dfg.check_contiguous_layout(m_indices, G)
        assert text in str(info.value), (case_id, str(info.value))
    dfg.check_contiguous_layout(_rows((0, 100)), G)  # any m_sum, as the reference (a partial second block)


def test_contiguous_rule_at_128_refuses_experts_at_64_row_starts():
    with pytest.raises(ValueError, match="holds rows of 2 experts"):
        dfg.check_contiguous_layout(GOOD_AT_64[0][1], G)


def test_explicit_layout_checks_reject_wrong_types():
    with pytest.raises(TypeError, match="m_indices"):
        dfg.check_contiguous_layout(torch.zeros(128, dtype=torch.int64), G)
    with pytest.raises(ValueError, match="num_groups"):
        dfg.check_contiguous_layout(torch.zeros(128, dtype=torch.int32), 0)
    with pytest.raises(TypeError, match="masked_m"):
        dfg.check_masked_layout([1, 2], 4)
    with pytest.raises(ValueError, match="m_max"):
        dfg.check_masked_layout(torch.zeros(2, dtype=torch.int32), -1)
    with pytest.raises(TypeError, match="grouped_layout"):
        dfg.check_psum_layout(torch.zeros(2, dtype=torch.int64), 128)
    dfg.check_masked_layout(torch.tensor([0, 4], dtype=torch.int32), 4)
    dfg.check_psum_layout(torch.tensor([0, 100, 200], dtype=torch.int32), 200)


# ---------------------------------------------------------------------------------------------- masked, psum
def _masked(counts):
    a, sa = quantised_activations((G, 32, K), seed=3)
    b, sb = quantised_weights((G, N, K), seed=4)
    return a, sa, b, sb, torch.zeros(G, 32, N, dtype=torch.bfloat16), torch.tensor(counts, dtype=torch.int32)


def _recording_launcher(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setattr(gemm, "launch_1d2d", lambda cfg, *args: calls.append(cfg.kind))
    return calls


@pytest.mark.parametrize("simulate", [False, True], ids=["reference", "simulator"])
@pytest.mark.parametrize("counts,text", [([33, 1], "masked_m[0] must be in [0, m_max=32], got 33"),
                                         ([1, -1], "masked_m[1] must be in [0, m_max=32], got -1")])
def test_masked_counts_checked_on_every_cpu_path(monkeypatch, simulate, counts, text):
    """The simulator path used to launch counts above m_max (the kernel clamps them): now both CPU paths raise
    before anything runs, and the cached plan does on its second call too."""
    calls = _recording_launcher(monkeypatch)
    if simulate:
        monkeypatch.setenv("DFG_SIMULATE", "1")
    a, sa, b, sb, out, masked_m = _masked(counts)
    for _ in range(2):
        with pytest.raises(ValueError, match=text.replace("[", r"\[").replace("]", r"\]")):
            dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, 16)
    assert calls == []
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, torch.tensor([3, 32], dtype=torch.int32), 16)
    assert calls == (["masked"] if simulate else [])


def test_moe_masked_names_counts():
    from deep_fp8_gemm.moe import fp8_moe_forward_masked

    w13, w13s = quantised_weights((G, 256, 128), seed=5)
    w2, w2s = quantised_weights((G, 128, 128), seed=6)
    hidden = torch.zeros(G, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"counts\[0\] must be in \[0, m_max=4\], got 5"):
        fp8_moe_forward_masked(hidden, torch.tensor([5, 1], dtype=torch.int32), w13, w13s, w2, w2s)


@pytest.mark.parametrize("simulate", [False, True], ids=["reference", "simulator"])
@pytest.mark.parametrize("ends,text", [([100, 50], "non-decreasing"), ([-1, 50], "non-negative"),
                                       ([100, 300], "exceeds the rows")])
def test_psum_ends_checked_on_every_cpu_path(monkeypatch, simulate, ends, text):
    calls = _recording_launcher(monkeypatch)
    if simulate:
        monkeypatch.setenv("DFG_SIMULATE", "1")
    a, sa, b, sb = _operands(256)
    out = torch.zeros(256, N, dtype=torch.bfloat16)
    for _ in range(2):
        with pytest.raises(ValueError, match=text):
            dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum((a, sa), (b, sb), out,
                                                               torch.tensor(ends, dtype=torch.int32))
    assert calls == []


def test_check_layouts_flag_is_validated(monkeypatch):
    from deep_fp8_gemm import env
    from deep_fp8_gemm.runtime.target import layout_values_checked

    assert layout_values_checked(torch.device("cpu")) and not layout_values_checked(torch.device("meta"))
    monkeypatch.setenv("DFG_CHECK_LAYOUTS", "yes")
    with pytest.raises(ValueError, match="DFG_CHECK_LAYOUTS must be 1"):
        env.check_layouts()
    monkeypatch.setenv("DFG_CHECK_LAYOUTS", "1")
    assert env.check_layouts()


# ---------------------------------------------------------------------------------------------- the kernels
sim = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")


def _contiguous_config(block_m: int) -> GemmConfig:
    cfg = GemmConfig(kind="contiguous", shape_n=N, shape_k=K, num_groups=G, block_m=block_m, block_n=64,
                     num_stages=2, cluster_m=1, cluster_n=1, band_width=16, grid_size=2)
    check_config(cfg)
    return cfg


def _kernel_result(block_m: int, a, sa, b, sb, m_indices) -> torch.Tensor:
    """The contiguous kernel (BLOCK_M ``block_m``) in the simulator, launched directly (no layout check)."""
    out = torch.full((a.shape[0], N), float("nan"), dtype=torch.bfloat16)
    gemm.launch_1d2d(_contiguous_config(block_m), a, dfg.get_col_major_tma_aligned_tensor(sa), b, sb, out,
                     m_indices, backend="sim")
    return out


@sim
@pytest.mark.parametrize("alignment", [128, 64])
def test_kernels_compute_every_accepted_layout(monkeypatch, alignment):
    """Every accepted layout, computed by the kernel the op would run (BLOCK_M = the alignment)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    dfg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        for case_id, m_indices in GOOD_CONTIGUOUS if alignment == 128 else GOOD_AT_64:
            a, sa, b, sb = _operands(m_indices.numel(), seed=11)
            want = _expected(a, sa, b, sb, m_indices)
            got = _kernel_result(alignment, a, sa, b, sb, m_indices)
            valid = m_indices >= 0
            if valid.any():
                assert calc_diff(got[valid], want[valid]) < 1e-3, case_id
    finally:
        dfg.set_mk_alignment_for_contiguous_layout(128)


@sim
@pytest.mark.parametrize("alignment", [128, 64])
def test_kernels_compute_every_rejected_layout_wrongly(monkeypatch, alignment):
    """Each block-rule case the check rejects gives wrong rows at the BLOCK_M it names (the range cases are left
    out: an expert id >= G traps on the GPU)."""
    monkeypatch.setenv("DFG_SIM_EXACT_MMA", "1")
    cases = BAD_CONTIGUOUS if alignment == 128 else BAD_AT_64
    for case_id, m_indices, text in cases:
        if "range" in case_id or "minus" in case_id:
            continue
        a, sa, b, sb = _operands(m_indices.numel(), seed=12)
        want = _expected(a, sa, b, sb, m_indices)
        got = _kernel_result(alignment, a, sa, b, sb, m_indices)
        valid = m_indices >= 0
        wrong = ~((got[valid].float() - want[valid].float()).abs().amax(1) <= 1e-2)  # NaN (unwritten) is wrong
        assert bool(wrong.any()), f"{case_id}: the kernel computed a rejected layout right at BLOCK_M {alignment}"


def test_layout_stats_agree_between_numpy_and_torch():
    """CPU calls check in numpy, GPU calls in torch (read back once): the same figures for every case."""
    from deep_fp8_gemm.ops.contiguous import contiguous_layout_stats

    for _, m_indices, *_ in BAD_CONTIGUOUS + [(c, m, "") for c, m in GOOD_CONTIGUOUS]:
        assert contiguous_layout_stats(m_indices, 128) == contiguous_layout_stats(m_indices.numpy(), 128)
        assert contiguous_layout_stats(m_indices, 64) == contiguous_layout_stats(m_indices.numpy(), 64)
    from deep_fp8_gemm.ops import masked as masked_ops

    masked = torch.tensor([3, 40, -1], dtype=torch.int32)
    assert masked_ops.masked_layout_stats(masked, 32) == [1, 1, 40]
    assert masked_ops.masked_layout_stats(masked[:1], 32) == [0, 0, 3]
    with pytest.raises(ValueError, match=r"masked_m\[1\] must be in \[0, m_max=32\], got 40"):
        masked_ops.check_masked_values(masked, 32)
