"""Host build of the kernel's tile scheduler and scale-column selection, checked against Python models.

The probe (tests/cpp/scheduler_probe.cpp) compiles include/deep_fp8_gemm/scheduler.cuh and scales.cuh
with g++ — the exact code the GPU runs — and prints every (CTA, iteration) -> tile. The checks here
are written from the contract, not from the C++: every valid output tile exactly once per launch, the
two CTAs of a cluster always paired on the operand they multicast (or, in the tail of an odd m-block
count with B multicast, on two n-blocks of the last m-block, unicast), padding-only blocks never
scheduled, the right sB block for every 8-column group.
"""

from __future__ import annotations

import collections
import hashlib
import random
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "cpp" / "scheduler_probe.cpp"
KIND = {"dense": 0, "contiguous": 1, "masked": 2}

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found (host build of the scheduler)")


def _build(tmp_root: Path, **consts: int) -> Path:
    flags = [f"-DP_{k}={v}u" if k != "KIND" else f"-DP_{k}={v}" for k, v in sorted(consts.items())]
    digest = hashlib.sha256((" ".join(flags) + PROBE.read_text()).encode()).hexdigest()[:16]
    exe = tmp_root / f"probe_{digest}"
    if not exe.exists():
        cmd = ["g++", "-std=c++17", "-O1", "-DDFG_SIMULATOR", f"-I{REPO / 'include'}", *flags, str(PROBE), "-o", str(exe)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def _run(exe: Path, rows: int, grid: int, layout: list[int]):
    stdin = f"{rows} {grid} {len(layout)} " + " ".join(map(str, layout))
    out = subprocess.run([str(exe)], input=stdin, check=True, capture_output=True, text=True).stdout
    tiles, scales = [], {}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "tile":  # (cta, iter, m_block, n_block, group, multicast)
            tiles.append(tuple(map(int, parts[1:])))
        else:
            scales[int(parts[1])] = list(map(int, parts[2:]))
    return tiles, scales


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("scheduler_probe")


def _ceil_div(a, b):
    return (a + b - 1) // b


def _check_cluster_pairs(tiles, grid, cluster_m, cluster_n, num_m_blocks=None):
    per_cta = collections.defaultdict(list)
    for cta, it, mb, nb, g, mc in tiles:
        per_cta[cta].append((it, mb, nb, g, mc))
    size = cluster_m * cluster_n
    if size == 1:
        assert all(not mc for *_, mc in tiles), "a CTA without a cluster multicasts"
        return
    for c in range(grid // size):
        r0, r1 = per_cta[2 * c], per_cta[2 * c + 1]
        # Equal counts: every math warp arrives on both CTAs' empty barriers, so both must walk the same stage uses.
        assert len(r0) == len(r1), f"cluster {c}: CTAs take different tile counts {len(r0)} vs {len(r1)}"
        for (i0, m0, n0, g0, mc0), (i1, m1, n1, g1, mc1) in zip(r0, r1):
            assert g0 == g1 and mc0 == mc1
            if cluster_n == 2:  # A multicast: same m-block, n-blocks 2j and 2j+1
                assert mc0 and m0 == m1 and n0 % 2 == 0 and n1 == n0 + 1, (c, i0, m0, n0, m1, n1)
            elif mc0:  # B multicast: same n-block, m-blocks 2i and 2i+1
                assert n0 == n1 and m0 % 2 == 0 and m1 == m0 + 1, (c, i0, m0, n0, m1, n1)
            else:  # the tail of an odd m-block count: last m-block, n-blocks 2j and 2j+1, no multicast
                assert num_m_blocks % 2 == 1 and m0 == m1 == num_m_blocks - 1, (c, i0, m0, m1, num_m_blocks)
                assert n0 % 2 == 0 and n1 == n0 + 1, (c, i0, n0, n1)


def _check_scales(scales, shape_n, block_n):
    num_scale_blocks = _ceil_div(shape_n, 128)
    for nb, blocks in scales.items():
        expected = [min((nb * block_n + 8 * j) // 128, num_scale_blocks - 1) for j in range(block_n // 8)]
        assert blocks == expected, f"n-block {nb}: sB blocks {blocks}, expected {expected}"


DENSE_CASES = [
    # shape_n, block_m, block_n, cluster_m, cluster_n, band
    (2112, 64, 16, 1, 1, 16),
    (7168, 128, 112, 1, 2, 8),
    (4096, 256, 144, 2, 1, 16),
    (576, 128, 160, 1, 1, 3),
    (2112, 128, 96, 2, 1, 5),
]


@pytest.mark.parametrize("shape_n,block_m,block_n,cluster_m,cluster_n,band", DENSE_CASES)
def test_dense_every_tile_once(probe_dir, shape_n, block_m, block_n, cluster_m, cluster_n, band):
    exe = _build(probe_dir, KIND=0, SHAPE_N=shape_n, BLOCK_M=block_m, BLOCK_N=block_n, NUM_GROUPS=1,
                 CLUSTER_M=cluster_m, CLUSTER_N=cluster_n, BAND_WIDTH=band)
    rng = random.Random(shape_n * 7 + block_n)
    num_n_blocks = _ceil_div(shape_n, block_n)
    size = cluster_m * cluster_n
    # 1 and 3 * block_m - 5: one and three m-blocks (odd: the 2-CTA tail when B is multicast)
    for m in [1, 3 * block_m - 5] + [rng.choice([1, 7, 63, 64, 65, 129, 1000, rng.randint(1, 3000)]) for _ in range(4)]:
        grid = size * rng.randint(1, 8)
        tiles, scales = _run(exe, m, grid, [0])
        num_m_blocks = _ceil_div(m, block_m)
        counts = collections.Counter((mb, nb) for _, _, mb, nb, _, _ in tiles)
        valid = {(mb, nb) for mb in range(num_m_blocks) for nb in range(num_n_blocks)}
        assert {t for t in counts if t in valid} == valid, "a valid tile was never scheduled"
        assert all(c == 1 for c in counts.values()), "a tile was scheduled twice"
        phantoms = set(counts) - valid
        if cluster_m == 2 and num_m_blocks % 2 and num_n_blocks % 2:
            # the only phantom: the second CTA of the last tail tile (no partner n-block), never a whole row
            assert phantoms == {(num_m_blocks - 1, num_n_blocks)}, sorted(phantoms)[:5]
        else:
            assert not phantoms, f"unexpected tiles {sorted(phantoms)[:5]}"
        tail = [t for t in tiles if t[2] == num_m_blocks - 1]
        if cluster_m == 2 and num_m_blocks % 2:
            assert tail and not any(mc for *_, mc in tail), "the tail of an odd m-block count is multicast"
            expected_tiles = (num_m_blocks // 2 * num_n_blocks + (num_n_blocks + 1) // 2) * 2
            assert len(tiles) == expected_tiles, f"{len(tiles)} CTA tiles, expected {expected_tiles}"
        _check_cluster_pairs(tiles, grid, cluster_m, cluster_n, num_m_blocks)
        _check_scales(scales, shape_n, block_n)


def _contiguous_layout(sizes, align=128):
    layout = []
    for e, s in enumerate(sizes):
        padded = _ceil_div(s, align) * align
        layout += [e] * s + [-1] * (padded - s)
    return layout


@pytest.mark.parametrize("block_m,cluster_n", [(64, 1), (128, 1), (128, 2), (64, 2)])
def test_contiguous_skips_padding_blocks(probe_dir, block_m, cluster_n):
    shape_n, block_n, num_groups = 1024, 128, 6
    exe = _build(probe_dir, KIND=1, SHAPE_N=shape_n, BLOCK_M=block_m, BLOCK_N=block_n, NUM_GROUPS=num_groups,
                 CLUSTER_M=1, CLUSTER_N=cluster_n, BAND_WIDTH=4)
    rng = random.Random(block_m + cluster_n)
    for _ in range(5):
        sizes = [rng.choice([0, 0, 1, 64, 65, 127, 128, 200, rng.randint(0, 400)]) for _ in range(num_groups)]
        layout = _contiguous_layout(sizes)
        if not layout:
            layout = [-1] * 128
        grid = cluster_n * rng.randint(1, 6)
        tiles, _ = _run(exe, len(layout), grid, layout)
        expected = {}
        for mb in range(_ceil_div(len(layout), block_m)):
            rows = layout[mb * block_m:(mb + 1) * block_m]
            experts = {e for e in rows if e >= 0}
            assert len(experts) <= 1
            if experts:
                for nb in range(shape_n // block_n):
                    expected[(mb, nb)] = experts.pop() if len(experts) == 1 else None
                    experts = {e for e in rows if e >= 0}
        got = collections.Counter((mb, nb) for _, _, mb, nb, _, _ in tiles)
        assert set(got) == set(expected), "scheduled blocks differ from the blocks holding valid rows"
        assert all(c == 1 for c in got.values())
        for _, _, mb, nb, g, _ in tiles:
            assert g == expected[(mb, nb)], f"block {mb} mapped to expert {g}, expected {expected[(mb, nb)]}"
        _check_cluster_pairs(tiles, grid, 1, cluster_n)


@pytest.mark.parametrize("block_m,block_n,cluster_n", [(64, 64, 1), (128, 112, 2), (256, 128, 1)])
def test_masked_groups(probe_dir, block_m, block_n, cluster_n):
    shape_n, num_groups, m_max = 1792, 5, 300
    exe = _build(probe_dir, KIND=2, SHAPE_N=shape_n, BLOCK_M=block_m, BLOCK_N=block_n, NUM_GROUPS=num_groups,
                 CLUSTER_M=1, CLUSTER_N=cluster_n, BAND_WIDTH=16 // cluster_n)
    rng = random.Random(block_m)
    num_n_blocks = _ceil_div(shape_n, block_n)
    for masked in ([0] * num_groups, [m_max] * num_groups, [0, 1, 300, 64, 999],
                   [rng.randint(0, m_max) for _ in range(num_groups)]):
        grid = cluster_n * rng.randint(1, 7)
        tiles, _ = _run(exe, m_max, grid, masked)
        expected = {(g, mb, nb) for g, mm in enumerate(masked)
                    for mb in range(_ceil_div(min(mm, m_max), block_m)) for nb in range(num_n_blocks)}
        got = collections.Counter((g, mb, nb) for _, _, mb, nb, g, _ in tiles)
        assert set(got) == expected and all(c == 1 for c in got.values()), masked
        _check_cluster_pairs(tiles, grid, 1, cluster_n)


@pytest.mark.parametrize("shape_n,block_m,block_n,split_k", [(576, 64, 32, 7), (2112, 128, 144, 4), (96, 64, 16, 2)])
def test_split_k_every_tile_split_once(probe_dir, shape_n, block_m, block_n, split_k):
    """Split-K work items: each (tile, split) exactly once, the splits of a tile on consecutive work items, so with
    a grid of at least split_k CTAs they run at the same time (split_k.cuh)."""
    exe = _build(probe_dir, KIND=0, SHAPE_N=shape_n, BLOCK_M=block_m, BLOCK_N=block_n, NUM_GROUPS=1, CLUSTER_M=1,
                 CLUSTER_N=1, BAND_WIDTH=16, SPLIT_K=split_k)
    num_n_blocks = _ceil_div(shape_n, block_n)
    for m, grid in ((1, 1), (1, split_k), (65, 3), (3 * block_m - 5, 132)):
        stdin = f"{m} {grid} 1 0"
        out = subprocess.run([str(exe)], input=stdin, check=True, capture_output=True, text=True).stdout
        items = [tuple(map(int, line.split()[1:])) for line in out.splitlines() if line.startswith("split")]
        counts = collections.Counter((mb, nb, s) for _, _, mb, nb, s in items)
        expected = {(mb, nb, s) for mb in range(_ceil_div(m, block_m)) for nb in range(num_n_blocks)
                    for s in range(split_k)}
        assert set(counts) == expected and all(c == 1 for c in counts.values())
        by_cta_iter = {(cta, it): (mb, nb, s) for cta, it, mb, nb, s in items}
        for cta, it, mb, nb, s in items:  # work item w = it * grid + cta is split w % split_k of tile w // split_k
            w = it * grid + cta
            assert s == w % split_k and by_cta_iter[(cta, it)] == (mb, nb, s)
