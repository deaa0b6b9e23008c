"""The prefix-sum ("psum") contiguous layout: scheduler (host build), kernel (simulator), reference, errors.

Group g owns rows ``[start_g, ends[g])``, ``start_0 = 0``, ``start_g = round_up(ends[g-1], alignment)``, the
alignment the contiguous one (128, or 64 after ``set_mk_alignment_for_contiguous_layout(64)``), which the kernel
has compiled in (``GemmConfig.psum_alignment``, BLOCK_M dividing it). The models here are written from that contract: a row -> group map built row by row in Python, compared against the
tiles the real scheduler code (include/deep_fp8_gemm/scheduler.cuh, GemmKind::GroupedContiguousPsum) visits,
and against float64 GEMMs of the real kernel run by the CPU simulator with NaN-poisoned outputs.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff
from deep_fp8_gemm.config import check_config
from deep_fp8_gemm import check_psum_layout, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum as psum_gemm
from tests._gpu import requires_sm90
from tests._operands import gemm64, gemm_operands

from tests._mutate import mutated_headers

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host build / simulator need g++")
PSUM_KIND = 3  # dfg::GemmKind::GroupedContiguousPsum


def _ends_from_sizes(sizes, align=128):
    """Ends of the psum layout whose groups hold ``sizes`` rows (group g starts at the aligned previous end)."""
    ends, cursor = [], 0
    for s in sizes:
        ends.append(cursor + s)
        cursor = (cursor + s + align - 1) // align * align
    return ends


def _row_groups(ends, rows, align=128):
    """Group of each row (-1: padding), straight from the definition."""
    owner = [-1] * rows
    previous = 0
    for g, end in enumerate(ends):
        start = 0 if g == 0 else (previous + align - 1) // align * align
        for r in range(start, min(end, rows)):
            owner[r] = g
        previous = end
    return owner


# ---------------------------------------------------------------------------------------------- scheduler
@needs_gxx
@pytest.mark.parametrize("block_m,cluster_n,align", [(64, 1, 128), (128, 1, 128), (128, 2, 128), (64, 2, 128),
                                                     (64, 1, 64), (64, 2, 64)])
def test_scheduler_visits_each_group_block_once(tmp_path_factory, block_m, cluster_n, align):
    from tests.kernels.test_scheduler import _build, _run

    shape_n, block_n, num_groups = 512, 128, 7
    exe = _build(tmp_path_factory.mktemp("psum_probe"), KIND=PSUM_KIND, SHAPE_N=shape_n, BLOCK_M=block_m,
                 BLOCK_N=block_n, NUM_GROUPS=num_groups, CLUSTER_M=1, CLUSTER_N=cluster_n, BAND_WIDTH=2,
                 PSUM_ALIGNMENT=align)
    rng = random.Random(block_m * 10 + cluster_n + align)
    layouts = [
        _ends_from_sizes([0] * num_groups, align),  # all empty: nothing scheduled
        _ends_from_sizes([128, 256, 0, 0, 384, 128, 128], align),  # multiples of 128, empty groups in the middle
        _ends_from_sizes([0, 1, 64, 65, 127, 129, 0], align),  # partial blocks, empty first / last groups
        [50, 60, 60, 300, 300, 301, 700],  # ends inside the previous group's padding = empty groups
        [40, 100, 100, 190, 250, 250, 400],  # 64-row starts: groups 1, 3 and 6 exist at 64, not all at 128
    ] + [_ends_from_sizes([rng.choice([0, 1, 63, 128, 200, rng.randint(0, 300)]) for _ in range(num_groups)],
                          align) for _ in range(4)]
    for ends in layouts:
        rows = max(ends[-1] + rng.choice([0, 5, 128]), 1)  # the buffer may extend past the last group
        grid = cluster_n * rng.randint(1, 5)
        tiles, _ = _run(exe, rows, grid, ends)
        owner = _row_groups(ends, rows, align)
        expected = {}
        for mb in range((rows + block_m - 1) // block_m):
            groups = {g for g in owner[mb * block_m:(mb + 1) * block_m] if g >= 0}
            assert len(groups) <= 1, "the layout contract keeps a block inside one group"
            for nb in range(shape_n // block_n):
                if groups:
                    expected[(mb, nb)] = next(iter(groups))
        got = collections.Counter((mb, nb) for _, _, mb, nb, _, _ in tiles)
        assert set(got) == set(expected), f"{ends}: scheduled blocks differ from the blocks holding group rows"
        assert all(c == 1 for c in got.values()), f"{ends}: a block was scheduled twice"
        for _, _, mb, nb, g, _ in tiles:
            assert g == expected[(mb, nb)], f"{ends}: block {mb} mapped to group {g}, expected {expected[(mb, nb)]}"


# ---------------------------------------------------------------------------------------------- operands
def _operands(m_sum, n, k, groups, seed):
    return gemm_operands((m_sum,), n, k, groups, seed)


def _check_against_float64(out, a, sa, b, sb, ends, block_m=None, align=128):
    owner = torch.tensor(_row_groups(ends, out.shape[0], align))
    for g in range(b.shape[0]):
        rows = (owner == g).nonzero().flatten()
        if rows.numel() == 0:
            continue
        got = out[rows]
        assert not got.isnan().any(), f"group {g}: rows left unwritten"
        expected = gemm64(a[rows], sa.contiguous()[rows], b[g], sb[g]).value
        assert calc_diff(got, torch.from_numpy(expected)) < 1e-3, f"group {g}"
    if block_m is not None:  # padding-only blocks are skipped: untouched (still NaN)
        for blk in range((out.shape[0] + block_m - 1) // block_m):
            if (owner[blk * block_m:(blk + 1) * block_m] < 0).all():
                assert out[blk * block_m:(blk + 1) * block_m].isnan().all(), f"padding-only block {blk} was written"


# ---------------------------------------------------------------------------------------------- simulator
SIM_CASES = {
    # name: (group sizes, block_m, cluster, extra rows after the last group, alignment)
    "empty_groups_and_partial_blocks": ([70, 0, 128, 1], 128, (1, 1), 0, 128),
    "multiples_of_128_multicast_a": ([128, 0, 256, 128], 64, (1, 2), 128, 128),
    "all_empty_but_last": ([0, 0, 0, 200], 64, (1, 1), 56, 128),
    "alignment_64_partial_blocks_multicast_a": ([40, 60, 0, 129, 1], 64, (1, 2), 64, 64),
}


def _psum_config(n, k, block_m, groups, cluster, align):
    from tests.kernels.test_sim_gemm import make_config

    cfg = dataclasses.replace(make_config("psum", n, k, block_m, 64, groups=groups, cluster=cluster,
                                          grid=2 * cluster[1]), psum_alignment=align)
    check_config(cfg)
    return cfg


@needs_gxx
@pytest.mark.parametrize("case", sorted(SIM_CASES))
def test_simulated_kernel_matches_float64(case):
    from tests.kernels.test_sim_gemm import run_sim

    sizes, block_m, cluster, extra, align = SIM_CASES[case]
    n, k, groups = 256, 256, len(sizes)
    ends = _ends_from_sizes(sizes, align)
    m_sum = ends[-1] + extra
    cfg = _psum_config(n, k, block_m, groups, cluster, align)
    a, sa, b, sb = _operands(m_sum, n, k, groups, seed=len(case))
    d = torch.full((m_sum, n), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, torch.tensor(ends, dtype=torch.int32))
    _check_against_float64(d, a, sa, b, sb, ends, block_m, align)


@needs_gxx
def test_planted_scheduler_bug_is_caught(tmp_path, monkeypatch):
    """A group start that forgets the 128-row rounding maps padding blocks to the next group: must fail."""
    from tests.kernels.test_sim_gemm import make_config, run_sim

    original = "return start <= first ? static_cast<i32>(lo) : -1;"
    mutated_headers(tmp_path, monkeypatch, "scheduler.cuh", original, "return static_cast<i32>(lo);")
    ends = _ends_from_sizes([40, 100])  # rows 64..127 are padding: a BLOCK_M=64 block of group 1 under the bug
    cfg = make_config("psum", 128, 128, 64, 64, groups=2, grid=2)
    a, sa, b, sb = _operands(ends[-1], 128, 128, 2, seed=9)
    d = torch.full((ends[-1], 128), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, torch.tensor(ends, dtype=torch.int32))
    with pytest.raises(AssertionError, match="padding-only block"):
        _check_against_float64(d, a, sa, b, sb, ends, 64)


@needs_gxx
def test_planted_fixed_128_alignment_is_caught(tmp_path, monkeypatch):
    """The kernel rounding group starts to a fixed 128 (as before the alignment was compiled in) under a 64-row
    layout: group 1 of ends [40, 100] (rows 64..99) reads as empty, its rows left unwritten: must fail."""
    from tests.kernels.test_sim_gemm import run_sim

    original = "kGroupAlignment));"
    mutated_headers(tmp_path, monkeypatch, "scheduler.cuh", original, "128u));")
    ends = _ends_from_sizes([40, 36], 64)
    assert ends == [40, 100]
    cfg = _psum_config(128, 128, 64, 2, (1, 1), 64)
    a, sa, b, sb = _operands(ends[-1], 128, 128, 2, seed=10)
    d = torch.full((ends[-1], 128), float("nan"), dtype=torch.bfloat16)
    run_sim(cfg, a, sa, b, sb, d, torch.tensor(ends, dtype=torch.int32))
    with pytest.raises(AssertionError, match="group 1: rows left unwritten"):
        _check_against_float64(d, a, sa, b, sb, ends, 64, 64)


@pytest.fixture
def contiguous_alignment(request):
    previous = dfg.get_mk_alignment_for_contiguous_layout()
    dfg.set_mk_alignment_for_contiguous_layout(request.param)
    yield request.param
    dfg.set_mk_alignment_for_contiguous_layout(previous)


# alignment -> (group sizes, rows after the last group, k)
PUBLIC_CASES = {128: ([0, 256, 33, 0, 128], 60, 384), 64: ([40, 0, 65, 1, 64], 30, 256)}


@pytest.mark.parametrize("contiguous_alignment", sorted(PUBLIC_CASES), indirect=True)
@pytest.mark.parametrize("simulate", (False, True))
def test_public_op_cpu_and_simulator(simulate, contiguous_alignment, monkeypatch):
    """The public op on the CPU reference and the simulated kernel, at both contiguous alignments: at 64 groups
    start at 64-row multiples, BLOCK_M and the kernel's psum_alignment are 64 (the same ends give other groups at
    128). ``m_sum`` need not be a multiple of the alignment."""
    if simulate:
        if shutil.which("g++") is None:
            pytest.skip("the simulator builds kernels with g++")
        monkeypatch.setenv("DFG_SIMULATE", "1")
        monkeypatch.setenv("DFG_SIM_NUM_SMS", "3")
    align = contiguous_alignment
    sizes, extra, k = PUBLIC_CASES[align]
    ends = _ends_from_sizes(sizes, align)
    m_sum = ends[-1] + extra
    a, sa, b, sb = _operands(m_sum, 128, k, len(sizes), seed=4)
    d = torch.full((m_sum, 128), float("nan"), dtype=torch.bfloat16)
    from deep_fp8_gemm.ops import psum as psum_ops

    cfg = psum_ops.FAMILIES["psum"].plan(a, b, 128, 132)
    assert (cfg.block_m, cfg.psum_alignment) == (align, align)
    assert cfg.kernel_name().endswith("_a64") == (align == 64)
    psum_gemm((a, sa), (b, sb), d, torch.tensor(ends, dtype=torch.int32), expected_m=128)
    _check_against_float64(d, a, sa, b, sb, ends, align, align)


# ---------------------------------------------------------------------------------------------- errors
def test_bad_layouts_raise():
    a, sa, b, sb = _operands(512, 128, 128, 3, seed=1)
    d = torch.empty(512, 128, dtype=torch.bfloat16)
    call = lambda layout, **kw: psum_gemm((a, sa), (b, sb), d, layout, **kw)  # noqa: E731
    with pytest.raises(ValueError, match=r"must have G=3 entries .*shape=\(4,\)"):
        call(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"non-decreasing \(grouped_layout\[0\]=300\), got grouped_layout\[1\]=200"):
        call(torch.tensor([300, 200, 400], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"grouped_layout\[2\]=513 exceeds the rows of lhs\[0\] \(A\), m_sum=512"):
        call(torch.tensor([100, 200, 513], dtype=torch.int32))
    with pytest.raises(ValueError, match="non-negative"):
        call(torch.tensor([-1, 200, 300], dtype=torch.int32))
    with pytest.raises(TypeError, match="grouped_layout must be torch.int32"):
        call(torch.tensor([1, 2, 3], dtype=torch.int64))
    with pytest.raises(ValueError, match="expected_m must be positive"):
        call(torch.tensor([1, 2, 3], dtype=torch.int32), expected_m=0)
    with pytest.raises(ValueError, match="non-decreasing"):
        check_psum_layout(torch.tensor([5, 4], dtype=torch.int32), 10)
    with pytest.raises(ValueError, match=r"grouped_layout\[1\]=11 exceeds m_sum=10"):  # the caller's argument
        check_psum_layout(torch.tensor([5, 11], dtype=torch.int32), 10)


# ---------------------------------------------------------------------------------------------- GPU
@requires_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("contiguous_alignment", [128, 64], indirect=True)
def test_gpu_psum_matches_float64_and_is_graph_safe(contiguous_alignment):
    align = contiguous_alignment
    sizes = [0, 300, 128, 0, 1, 512, 77, 0]
    ends = _ends_from_sizes(sizes, align)
    m_sum = ends[-1] + 128
    a, sa, b, sb = _operands(m_sum, 512, 1024, len(sizes), seed=5)
    layout = torch.tensor(ends, dtype=torch.int32, device="cuda")
    d = torch.full((m_sum, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    args = ((a.cuda(), sa.cuda()), (b.cuda(), sb.cuda()), d, layout)
    psum_gemm(*args, expected_m=128)
    torch.cuda.synchronize()
    _check_against_float64(d.cpu(), a, sa, b, sb, ends, align, align)
    # Replay under a CUDA graph with new ends on the device: no host read of the layout.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        psum_gemm(*args, expected_m=128)
    new_ends = _ends_from_sizes([128, 0, 0, 0, 0, 0, 0, 10], align)
    layout.copy_(torch.tensor(new_ends, dtype=torch.int32))
    d.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check_against_float64(d.cpu(), a, sa, b, sb, new_ends, align, align)


# ---------------------------------------------------------------------------------------------- custom op
def test_custom_op_opcheck_and_compile():
    """One torch.library op (``torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum``): fake
    kernel vs real, AOT dispatch with dynamic shapes, and torch.compile(fullgraph=True) through the 2.x name."""
    ends = torch.tensor(_ends_from_sizes([100, 0, 128]), dtype=torch.int32)
    a, sa, b, sb = _operands(int(ends[-1]), 128, 256, 3, seed=7)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    out = torch.zeros(int(ends[-1]), 128, dtype=torch.bfloat16)
    op = torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum.default
    torch.library.opcheck(op, (a, sa, b, sb, out, ends, 64), test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    written = [arg.name for arg in op._schema.arguments if arg.alias_info is not None and arg.alias_info.is_write]
    assert written == ["out"]

    def model(a, sa, b, sb, ends):
        d = torch.zeros(a.size(0), b.size(1), dtype=torch.bfloat16)
        dfg.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ends, use_psum_layout=True,
                                             expected_m_for_psum_layout=64)
        return d * 2

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(a, sa, b, sb, ends), model(a, sa, b, sb, ends))
    finally:
        torch._dynamo.reset()
