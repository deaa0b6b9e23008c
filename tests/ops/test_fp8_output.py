"""The FP8-output and SwiGLU GEMM families (issue 27) on the CPU path: their references against float64, the output
pair's layout and checks (errors name the argument), the custom ops under tracing, the config rules, and the grouped
layouts' contracts of their bf16 twins (issues 23 / 24): BLOCK_M = the contiguous alignment, psum at 128 only, the
layout values checked where the twins check them, padding rows computed as the kernels compute them.

The kernels themselves run in tests/kernels/test_sim_fp8_output.py (bits equal to these references with exact sums).
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff
from deep_fp8_gemm._core.reference_math import gemm_nt_promoted
from deep_fp8_gemm.config import (FP8_OUTPUT_KINDS, GemmConfig, check_config, fused_swiglu_wins, get_config,
                                  output_bytes, up_projection_seconds)
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.ops import FAMILIES, outputs
from deep_fp8_gemm.ops.moe import quantise_experts
from deep_fp8_gemm.quant import per_token_cast_to_fp8_torch
from deep_fp8_gemm.utils import empty_m_major

from tests._operands import gemm64_batched, gemm_operands

FP8 = torch.float8_e4m3fn


_operands = gemm_operands
_f64 = gemm64_batched


def _deq(d, sd):
    return d.float() * sd.repeat_interleave(128, -1)[..., :d.shape[-1]]


def test_dense_reference_is_the_quantiser_on_the_promoted_fp32_gemm():
    m, n, k = 70, 320, 384  # a partial last scale group (320 = 2.5 groups)
    a, sa, b, sb = _operands((m,), n, k)
    d, sd = outputs.empty_out((), m, n, "cpu")
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), (d, sd))
    # the bf16 kind's fp32 accumulator, quantised by the epilogue's rule (x * fl(1 / scale), issue 45)
    q, s = per_token_cast_to_fp8_torch(gemm_nt_promoted(a, sa, b, sb), reciprocal=True)
    assert torch.equal(d.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sd, s)
    assert sd.stride() == (1, 72)  # M-major, rows rounded up to 4: what per_token_cast_to_fp8 returns
    # against float64: one e4m3 rounding of the output on top of the bf16 kind's error
    bf16 = torch.empty(m, n, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), bf16)
    truth = _f64(a, sa, b, sb)
    assert calc_diff(_deq(d, sd), truth) < 1e-3
    assert calc_diff(bf16.float(), truth) < calc_diff(_deq(d, sd), truth)  # e4m3 is the coarser rounding
    # use_ue8m0: power-of-two scales
    d2, sd2 = outputs.empty_out((), m, n, "cpu")
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), (d2, sd2), use_ue8m0=True)
    assert ((sd2.view(torch.int32) & 0x7FFFFF) == 0).all()
    assert calc_diff(_deq(d2, sd2), truth) < 2e-3


def test_grouped_references():
    n, k, groups = 256, 256, 3
    a, sa, b, sb = _operands((256,), n, k, groups, seed=1)
    m_indices = torch.tensor([0] * 100 + [-1] * 28 + [2] * 128, dtype=torch.int32)
    d, sd = outputs.empty_out((), 256, n, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous((a, sa), (b, sb), (d, sd), m_indices)
    for rows, e in ((slice(0, 100), 0), (slice(128, 256), 2)):
        q, s = per_token_cast_to_fp8_torch(_f64(a[rows], sa[rows], b[e], sb[e]).float(), reciprocal=True)
        assert calc_diff(_deq(d[rows], sd[rows]), _deq(q, s)) < 1e-6
    # psum: the same rows as ends
    d2, sd2 = outputs.empty_out((), 256, n, "cpu")
    ends = torch.tensor([100, 100, 256], dtype=torch.int32)
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum((a, sa), (b, sb), (d2, sd2), ends)
    for rows in (slice(0, 100), slice(128, 256)):
        assert torch.equal(d2[rows].view(torch.uint8), d[rows].view(torch.uint8)) and torch.equal(sd2[rows], sd[rows])
    # masked: the same per-row values
    am, sam = a.view(2, 128, k), sa.view(2, 128, -1)
    d3, sd3 = outputs.empty_out((2,), 128, n, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked((am, sam), (b[[0, 2]], sb[[0, 2]]), (d3, sd3),
                                             torch.tensor([100, 128], dtype=torch.int32), 100)
    assert torch.equal(d3[0, :100].view(torch.uint8), d[:100].view(torch.uint8))
    assert torch.equal(sd3[1], sd[128:])


def test_reference_multiplies_by_the_reciprocal_of_the_scale():
    """The epilogue's rule (issue 45): ``e4m3(x * fl(1 / scale))``, one IEEE reciprocal per row and 128 columns, as
    the reference design's ``x * (1.0 / sf)``; not ``x / scale``. Rows of integers where the two round to different
    e4m3 codes (row max 52, value 39: ``39 / fl(52 / 448)`` rounds to 336.0, an e4m3 tie that goes to 320 (even),
    while ``39 * fl(1 / fl(52 / 448))`` rounds to one float32 ulp above it, hence 352); with ``use_ue8m0`` (power-of-two scales) the two agree."""
    values = torch.zeros(4, 256)
    for r, (amax, x) in enumerate([(52, 39), (76, 57), (104, 78), (124, 93)]):
        values[r, :2] = torch.tensor([amax, x])
        values[r, 128:130] = -values[r, :2]  # the second scale group: the same, negated
    q, s = per_token_cast_to_fp8_torch(values, reciprocal=True)
    want = (values.view(4, 2, 128) * (1 / s).unsqueeze(-1)).view(4, 256).clamp(-448, 448).to(FP8)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))
    division, s_div = per_token_cast_to_fp8_torch(values)
    assert torch.equal(s, s_div)
    assert (q.view(torch.uint8) != division.view(torch.uint8)).sum().item() == 8, "one code per group differs"
    d, sd = outputs.empty_out((), 4, 256, "cpu")
    outputs.FP8_OUT.store((d, sd), slice(None), values, (False,))
    assert torch.equal(d.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sd, s)
    q8, s8 = per_token_cast_to_fp8_torch(values, True, reciprocal=True)
    d8, s8_div = per_token_cast_to_fp8_torch(values, True)
    assert torch.equal(q8.view(torch.uint8), d8.view(torch.uint8)) and torch.equal(s8, s8_div)


def test_swiglu_reference_is_silu_mul_of_the_promoted_fp32_gemm_quantised():
    hidden, inter, groups = 256, 256, 2
    a, sa, w, sw = _operands((128,), 2 * inter, hidden, groups, seed=2)
    wi, swi = dfg.interleave_swiglu_weights(w, sw)
    m_indices = torch.tensor([1] * 128, dtype=torch.int32)
    d, sd = outputs.empty_out((), 128, inter, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (wi, swi), (d, sd), m_indices)
    gate_up = gemm_nt_promoted(a, sa, w[1], sw[1])
    q, s = per_token_cast_to_fp8_torch(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], reciprocal=True)
    assert torch.equal(d.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sd, s)
    # masked: the same rows
    d3, sd3 = outputs.empty_out((groups,), 64, inter, "cpu")
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu((a.view(2, 64, hidden), sa.view(2, 64, -1)), (wi[[1, 1]], swi[[1, 1]]),
                                                    (d3, sd3), torch.tensor([64, 64], dtype=torch.int32), 64)
    assert torch.equal(d3.reshape(128, inter).view(torch.uint8), d.view(torch.uint8))


def test_output_pair_errors_name_the_argument():
    m, n, k = 64, 256, 256
    a, sa, b, sb = _operands((m,), n, k)
    d, sd = outputs.empty_out((), m, n, "cpu")
    call = dfg.gemm_fp8_fp8_fp8_nt
    with pytest.raises(TypeError, match="out must be a"):
        call((a, sa), (b, sb), d)
    with pytest.raises(TypeError, match=r"out\[0\] \(D\) must be torch.float8_e4m3fn"):
        call((a, sa), (b, sb), (d.view(torch.uint8), sd))
    with pytest.raises(ValueError, match=r"out\[1\] \(sD\) must have shape"):
        call((a, sa), (b, sb), (d, sd[:, :1]))
    with pytest.raises(ValueError, match=r"out\[1\] \(sD\) must be M-major"):
        call((a, sa), (b, sb), (d, sd.contiguous()))
    with pytest.raises(ValueError, match=r"out\[0\] \(D\) must not overlap"):
        call((a, sa), (b, sb), (a.view(m, k)[:, :n], sd))
    with pytest.raises(TypeError, match="use_ue8m0"):
        call((a, sa), (b, sb), (d, sd), use_ue8m0=1)
    with pytest.raises(ValueError, match="16-byte rows"):
        dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b[:72], sb[:1]), outputs.empty_out((), m, 72, "cpu"))
    w, sw = quantise_experts(torch.randn(2, 320, k))  # 2I = 320: I not a multiple of 128
    with pytest.raises(ValueError, match="I a multiple of 128"):
        dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (w, sw), outputs.empty_out((), m, 160, "cpu"),
                                                            torch.zeros(m, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"out\[0\] \(D\) must have shape"):  # SwiGLU: D has I columns, not 2I
        w, sw = quantise_experts(torch.randn(2, 256, k))
        dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu((a, sa), (w, sw), outputs.empty_out((), m, 256, "cpu"),
                                                            torch.zeros(m, dtype=torch.int32))


def test_custom_ops_trace_as_single_nodes():
    m, n, k = 64, 256, 256
    a, sa, b, sb = _operands((m,), n, k)

    def step(a, sa, b, sb):
        d, sd = empty_like_out(a.shape[0], b.shape[0])
        dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b, sb), (d, sd))
        return d.view(torch.uint8), sd

    def empty_like_out(rows, cols):
        return torch.empty(rows, cols, dtype=FP8), empty_m_major((rows, cols // 128), "cpu")

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = compiled(a, sa, b, sb), step(a, sa, b, sb)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for name in ("gemm_fp8_fp8_fp8_nt", "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous", "m_grouped_gemm_fp8_fp8_fp8_nt_masked",
                 "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum", "m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu",
                 "m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu"):
        assert hasattr(torch.ops.deep_fp8_gemm, name), name


def test_config_rules_and_model():
    for kind in FP8_OUTPUT_KINDS:
        swiglu = kind.endswith("swiglu")
        cfg = get_config(256, 4096, 7168, 1 if kind == "dense_fp8out" else 8, kind)
        assert cfg.block_n == (256 if swiglu else 128) and cfg.mma_n == 128
        if swiglu:
            assert cfg.waves_m == 1 and cfg.mma_chunks == 2
    base = dict(kind="contiguous_swiglu", shape_n=4096, shape_k=7168, num_groups=8, block_m=128, block_n=256,
                num_stages=4, cluster_m=1, cluster_n=1, band_width=16, grid_size=132)
    check_config(GemmConfig(**base))
    for bad, why in ((dict(block_n=128), "block_n must be 256"), (dict(block_m=256), "block_m <= 128"),
                     (dict(shape_n=4096 + 128), "I a multiple of 128"), (dict(kind="contiguous", ue8m0=True, block_n=128),
                                                                        "ue8m0")):
        with pytest.raises(ValueError, match=why):
            check_config(GemmConfig(**dict(base, **bad)))
    with pytest.raises(ValueError, match="block_n must be 128"):
        check_config(GemmConfig(**dict(base, kind="dense_fp8out", num_groups=1, block_n=160)))
    # bytes: e4m3 D + one fp32 scale per 128 columns; the SwiGLU kinds write n / 2 columns
    assert output_bytes("dense", 10, 256) == 10 * 512
    assert output_bytes("dense_fp8out", 10, 256) == 10 * (256 + 8)
    assert output_bytes("masked_swiglu", 10, 4096) == 10 * (2048 + 64)
    # the model picks the fused up-projection at DeepSeek-V3's shapes, decode (masked, m <= 32) included: faster
    # at decode sizes; at m = 256 the bf16 kernel's 256x128 tile (two waves; the SwiGLU tile is one wave of 256
    # columns) models 1.4% faster, within FUSED_SWIGLU_MARGIN, so the fused kernel is still the pick
    for m in (1, 8, 32):
        assert up_projection_seconds("masked", True, m, 2048, 7168, 8) < \
            up_projection_seconds("masked", False, m, 2048, 7168, 8, silu_rows=8 * 128)
    for m in (1, 8, 32, 256, 1024):  # the unfused quantiser streams the whole [G, m_max, 2I] buffer, m_max >= m
        assert fused_swiglu_wins("masked", m, 2048, 7168, 8, silu_rows=8 * max(m, 128)), m
    assert up_projection_seconds("contiguous", True, 4096 * 8, 2048, 7168, 8) < \
        up_projection_seconds("contiguous", False, 4096 * 8, 2048, 7168, 8)


def test_opcheck():
    """Fake kernels against the real ones' metadata and AOT dispatch with dynamic shapes (as tests/test_custom_ops)."""
    ops = torch.ops.deep_fp8_gemm
    a, sa, b, sb = _operands((128,), 256, 256, seed=4)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    d, sd = outputs.empty_out((), 128, 256, "cpu")
    utils = ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.gemm_fp8_fp8_fp8_nt.default, (a, sa, b, sb, d, sd, False), test_utils=utils)
    w, sw = quantise_experts(torch.randn(2, 256, 256))
    wi, swi = dfg.interleave_swiglu_weights(w, sw)
    h, sh = outputs.empty_out((), 128, 128, "cpu")
    m_indices = torch.cat([torch.zeros(96, dtype=torch.int32), torch.full((32,), -1, dtype=torch.int32)])
    torch.library.opcheck(ops.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu.default,
                          (a, sa, wi, swi, h, sh, m_indices, False), test_utils=utils)


# ---------------------------------------------------------------------------------------------- layout contracts
@pytest.fixture
def alignment_64():
    dfg.set_mk_alignment_for_contiguous_layout(64)
    try:
        yield
    finally:
        dfg.set_mk_alignment_for_contiguous_layout(128)


def _rows(*runs: tuple[int, int]) -> torch.Tensor:
    """m_indices from ``(value, count)`` runs."""
    return torch.tensor([v for v, c, *_ in runs for _ in range(c)], dtype=torch.int32)


def _recording_launcher(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setattr(gemm, "launch_fp8_output", lambda cfg, *args: calls.append(cfg.kind))
    return calls


def _grouped_call(kind: str):
    """A small call of a grouped kind (k = 128, G = 2; contiguous / psum: m_sum = 128; masked: m_max = 32) as a
    function of its layout tensor."""
    swiglu = kind.endswith("swiglu")
    n, n_out = (256, 128) if swiglu else (128, 128)
    masked = kind.startswith("masked")
    a, sa, b, sb = _operands((2, 32) if masked else (128,), n, 128, 2, seed=7)
    if swiglu:
        b, sb = dfg.interleave_swiglu_weights(b, sb)
    out = lambda: outputs.empty_out((2,) if masked else (), 32 if masked else 128, n_out, "cpu")  # noqa: E731
    op = {"contiguous_fp8out": dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous,
          "contiguous_swiglu": dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu,
          "masked_fp8out": dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked,
          "masked_swiglu": dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu,
          "psum_fp8out": dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum}[kind]
    if masked:
        return lambda layout: op((a, sa), (b, sb), out(), layout, 16)
    return lambda layout: op((a, sa), (b, sb), out(), layout)


# kind -> (a layout the kernels compute wrongly, the twin's ValueError text, a good layout)
_LAYOUTS = {
    "contiguous_fp8out": (_rows((0, 64), (1, 64)), "holds rows of 2 experts", _rows((0, 100), (-1, 28))),
    "contiguous_swiglu": (_rows((-1, 10), (0, 108), (-1, 10)), "first and last rows are padding",
                          _rows((1, 100), (-1, 28))),
    "masked_fp8out": (torch.tensor([33, 1], dtype=torch.int32), r"masked_m\[0\] must be in \[0, m_max=32\], got 33",
                      torch.tensor([3, 32], dtype=torch.int32)),
    "masked_swiglu": (torch.tensor([1, -1], dtype=torch.int32), r"masked_m\[1\] must be in \[0, m_max=32\], got -1",
                      torch.tensor([0, 5], dtype=torch.int32)),
    "psum_fp8out": (torch.tensor([100, 50], dtype=torch.int32), "non-decreasing",
                    torch.tensor([100, 128], dtype=torch.int32)),
}


@pytest.mark.parametrize("simulate", [False, True], ids=["reference", "simulator"])
@pytest.mark.parametrize("kind", sorted(_LAYOUTS))
def test_layout_values_checked_on_every_cpu_path(monkeypatch, kind, simulate):
    """What the bf16 twins check on CPU tensors, on every call of the reference and the simulator path alike: the
    contiguous block rule (the reference used to compute any in-range m_indices, the simulator path to launch them),
    the masked counts (the simulator path used to launch counts the kernel clamps), the psum ends."""
    calls = _recording_launcher(monkeypatch)
    if simulate:
        monkeypatch.setenv("DFG_SIMULATE", "1")
    call = _grouped_call(kind)
    bad, text, good = _LAYOUTS[kind]
    for _ in range(2):
        with pytest.raises(ValueError, match=text):
            call(bad)
    assert calls == []
    call(good)
    assert calls == ([kind] if simulate else [])


@pytest.mark.parametrize("kind", sorted(_LAYOUTS))
def test_layout_values_checked_where_the_bf16_twins_check_them(monkeypatch, kind):
    """The decision is the twins' ``runtime.target.layout_values_checked(device)``: False (CUDA tensors without
    DFG_CHECK_LAYOUTS=1, or under CUDA-graph capture) launches without reading the values; True (CPU tensors,
    DFG_CHECK_LAYOUTS=1 on CUDA) checks them before the launch."""
    calls = _recording_launcher(monkeypatch)
    monkeypatch.setenv("DFG_SIMULATE", "1")
    module = importlib.import_module("deep_fp8_gemm.ops.gemm_family")  # where every 1D2D custom op decides it
    call = _grouped_call(kind)
    bad, text, _ = _LAYOUTS[kind]
    asked = []
    monkeypatch.setattr(module, "layout_values_checked", lambda device: asked.append(device) or False)
    # Under a dispatch mode the call runs the custom op (what compiled code runs), whose kernel decides here; an
    # eager call decides in its plan (_core.plans.GemmPlan, the rule the bf16 twins' plans share).
    with _PassThrough():
        call(bad)
    assert calls == [kind] and asked == [torch.device("cpu")]
    monkeypatch.setattr(module, "layout_values_checked", lambda device: True)
    with _PassThrough(), pytest.raises(ValueError, match=text):
        call(bad)
    assert calls == [kind]


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that runs every op as is: the public call then goes through the custom op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_contiguous_block_m_is_the_alignment(alignment_64):
    """The kernels' BLOCK_M is the layout's alignment (a 128-row block would hold two experts' 64-row segments)."""
    a, _, b, _ = _operands((256,), 256, 128, 2)
    for kind in ("contiguous_fp8out", "contiguous_swiglu"):
        assert FAMILIES[kind].plan(a, b, None, 132).block_m == 64, kind
    dfg.set_mk_alignment_for_contiguous_layout(128)
    for kind in ("contiguous_fp8out", "contiguous_swiglu", "psum_fp8out"):
        assert FAMILIES[kind].plan(a, b, None, 132).block_m == 128, kind


def test_psum_fp8out_at_alignment_64_plans_the_64_row_kernel(monkeypatch, alignment_64):
    """As psum: group starts at 64-row multiples, BLOCK_M 64 and the kernel's compiled-in psum_alignment 64; the
    simulator path launches that config (test_sim_fp8_output.py::test_psum_bits runs it)."""
    calls = []
    monkeypatch.setattr(gemm, "launch_fp8_output", lambda cfg, *args: calls.append(cfg))
    monkeypatch.setenv("DFG_SIMULATE", "1")
    a, _, b, _ = _operands((128,), 128, 128, 2)
    cfg = FAMILIES["psum_fp8out"].plan(a, b, None, 132)
    assert (cfg.block_m, cfg.psum_alignment) == (64, 64) and cfg.kernel_name().endswith("_a64")
    _grouped_call("psum_fp8out")(torch.tensor([40, 100], dtype=torch.int32))
    assert [(c.kind, c.block_m, c.psum_alignment) for c in calls] == [("psum_fp8out", 64, 64)]


def _quantised_rows(a, sa, w, sw, rows, swiglu):
    """``per_token_cast_to_fp8_torch(reciprocal=True)`` (the epilogue's rule) of the float32 GEMM of these rows alone
    (the promoted reference of _core.reference_math; checkpoint-order w13)."""
    acc = gemm_nt_promoted(a[rows], sa[rows], w, sw)
    if swiglu:
        acc = F.silu(acc[:, :acc.shape[1] // 2]) * acc[:, acc.shape[1] // 2:]
    return per_token_cast_to_fp8_torch(acc, reciprocal=True)


def _assert_rows(d, sd, rows, want, what):
    q, s = want
    assert torch.equal(d[rows].view(torch.uint8), q.view(torch.uint8)), what
    assert torch.equal(sd[rows], s), what


# alignment -> runs (value, count[, the expert a padding run is computed with; None: a padding-only block])
_PADDED = {128: [(0, 100), (-1, 28, 0), (-1, 128, None), (1, 1), (-1, 127, 1)],
           64: [(0, 40), (-1, 24, 0), (-1, 64, None), (1, 65), (-1, 63, 1)]}


@pytest.mark.parametrize("swiglu", [False, True], ids=["fp8out", "swiglu"])
@pytest.mark.parametrize("alignment", [128, 64])
def test_contiguous_reference_computes_padding_rows_as_the_kernels(swiglu, alignment):
    """Fp8TmaStore stores every row of a tile, D and sD (output.cuh): a padding row sharing a BLOCK_M block with an
    expert's rows is computed and quantised with that expert, a padding-only block is never computed. The reference
    does the same, and each expert's own rows go through a matmul of their own (a row does not depend on its padding:
    bit-equal to the GEMM of those rows alone)."""
    dfg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        runs = _PADDED[alignment]
        layout = _rows(*runs)
        m_sum, n = layout.numel(), 256
        a, sa, w, sw = _operands((m_sum,), n, 256, 2, seed=8)
        b, sb = dfg.interleave_swiglu_weights(w, sw) if swiglu else (w, sw)
        op = (dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu if swiglu
              else dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous)
        d, sd = outputs.empty_out((), m_sum, n // 2 if swiglu else n, "cpu")
        d.view(torch.uint8).fill_(0x7F)
        sd.fill_(float("nan"))
        op((a, sa), (b, sb), (d, sd), layout)
        start = 0
        for value, count, *computed_with in runs:
            rows = torch.arange(start, start + count)
            start += count
            expert = value if value >= 0 else computed_with[0]
            if expert is None:
                assert (d[rows].view(torch.uint8) == 0x7F).all() and sd[rows].isnan().all(), "padding-only block"
            else:
                _assert_rows(d, sd, rows, _quantised_rows(a, sa, w[expert], sw[expert], rows, swiglu),
                             f"rows {rows[0].item()}..{rows[-1].item()} with expert {expert}")
    finally:
        dfg.set_mk_alignment_for_contiguous_layout(128)


def test_psum_reference_computes_padding_rows_as_the_kernel():
    """Group g's rows and the padding rows after them up to the end of its last 128-row block: computed with g, each
    in a matmul of its own; rows of a padding-only block untouched."""
    n, k = 128, 128
    a, sa, b, sb = _operands((512,), n, k, 3, seed=9)
    ends = torch.tensor([100, 100, 300], dtype=torch.int32)  # group 1 empty, group 2 = rows [128, 300)
    d, sd = outputs.empty_out((), 512, n, "cpu")
    d.view(torch.uint8).fill_(0x7F)
    sd.fill_(float("nan"))
    dfg.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_psum((a, sa), (b, sb), (d, sd), ends)
    for g, start, stop in ((0, 0, 100), (0, 100, 128), (2, 128, 300), (2, 300, 384)):
        rows = torch.arange(start, stop)
        _assert_rows(d, sd, rows, _quantised_rows(a, sa, b[g], sb[g], rows, False), f"rows {start}:{stop}")
    assert (d[384:].view(torch.uint8) == 0x7F).all() and sd[384:].isnan().all()
