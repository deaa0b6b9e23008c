"""The heuristic: a pure function of the problem and the device's SM count and shared memory to the config the cost
model (:mod:`.cost`) ranks cheapest among the legal ones (:func:`.rules.check_config`).

``get_config(m, n, k, num_groups, kind, num_sms, smem_limit)`` depends on nothing else (no device queries, no
globals), so it is cached and tested on the CPU. Small m gets BLOCK_M = 64 and a BLOCK_N small enough to spread B
over all SMs (B streaming is the whole cost), large m gets 128/256-row tiles, and unaligned BLOCK_N (112, 144, 160)
are picked when they fill the SMs better.
"""

from __future__ import annotations

import functools

from ..constants import DEFAULT_CONTIGUOUS_ALIGNMENT
from ..utils import ceil_div
from .cost import estimate_cycles, estimate_seconds, num_m_blocks, silu_mul_quant_seconds
from .rules import (BAND_BLOCKS, BLOCK32_BLOCK_M, BLOCK32_BLOCK_N, BLOCK32_KINDS, BLOCK_K, BLOCK_M_CHOICES,
                    BLOCK_N_CHOICES, CONTIGUOUS_ALIGNMENT, CONTIGUOUS_KINDS, FP8_OUTPUT_BLOCK_N, FP8_OUTPUT_KINDS,
                    FP32_ACCUMULATE_KINDS, K_GROUPED, LAYOUT_OF, MULTICAST_MIN_M, SMEM_LIMIT, SWAP_AB_BLOCK_M,
                    SWAP_AB_BLOCK_N, SWAP_AB_KINDS, SWAP_AB_MARGIN, SWAP_AB_MAX_M, SWIGLU_BLOCK_N, SWIGLU_KINDS,
                    GemmConfig, check_config, contiguous_block_m, max_stages, problem_rules)

def _validate_problem(m: int, n: int, k: int, num_groups: int, kind: str, num_sms: int) -> None:
    for name, value in (("m", m), ("n", n), ("k", k), ("num_groups", num_groups), ("num_sms", num_sms)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if m < 0 or n <= 0 or k <= 0 or num_groups <= 0 or num_sms <= 0:
        raise ValueError(f"need m >= 0 and n, k, num_groups, num_sms > 0: {m=} {n=} {k=} {num_groups=} {num_sms=}")
    problems = problem_rules(kind, n, k, num_groups)
    if problems:
        raise ValueError("; ".join(problems))


MAX_SPLIT_K = 16
SPLIT_K_MARGIN = 0.10  # a split config must model at least ~10% faster than the best unsplit one


def _split_k_choices(kind: str, m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int) -> tuple[int, ...]:
    """Split counts the heuristic weighs for a tile shape: 1, and for a dense problem with fewer tiles than SMs
    (few rows, narrow N, long K: decode) the divisors of the K block count up to MAX_SPLIT_K that keep the work
    items within one wave (more would only add partial traffic)."""
    tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
    if LAYOUT_OF[kind] != "dense" or kind in BLOCK32_KINDS or m >= MULTICAST_MIN_M or tiles * 2 > num_sms or block_m > 128:
        return (1,)
    k_blocks = ceil_div(k, BLOCK_K)
    return (1, *(s for s in range(2, MAX_SPLIT_K + 1) if k_blocks % s == 0 and tiles * s <= num_sms))


@functools.lru_cache(maxsize=1024)
def _legal_tiles(kind: str, n: int, shape_k: int, num_groups: int, smem_limit: int,
                 block_ms: tuple[int, ...], sa_major: str = "m") -> tuple[tuple[int, int, int], ...]:
    """``(block_m, block_n, num_stages)`` of every tile :func:`check_config` accepts for this problem without M
    (its rules do not read M), BLOCK_M-major in the heuristic's order. Cached: a sweep over M (``precompile
    --model``) asks for the same list thousands of times."""
    tiles = []
    for block_m in block_ms:
        for block_n in block_n_choices(kind):
            num_stages = max_stages(block_m, block_n, smem_limit, kind, sa_major)
            candidate = GemmConfig(kind=kind, shape_n=n, shape_k=shape_k, num_groups=num_groups, block_m=block_m,
                                   block_n=block_n, num_stages=num_stages, cluster_m=1, cluster_n=1, band_width=1,
                                   grid_size=1, sa_major=sa_major)
            try:
                check_config(candidate, smem_limit)
            except ValueError:
                continue
            tiles.append((block_m, block_n, num_stages))
    return tuple(tiles)


@functools.lru_cache(maxsize=4096)
def get_config(
    m: int,
    n: int,
    k: int,
    num_groups: int = 1,
    kind: str = "dense",
    num_sms: int = 132,
    smem_limit: int = SMEM_LIMIT,
    contiguous_alignment: int = CONTIGUOUS_ALIGNMENT,
    ue8m0: bool = False,
    swap_ab: bool | None = None,
    batch_invariant: bool = True,
    sa_major: str = "m",
) -> GemmConfig:
    """The config for a problem. ``m``: rows (dense), m_sum (contiguous) or expected rows per group (masked).
    ``kind="k_grouped"``: ``m`` / ``n`` of every group, ``k`` the per-group K the cost model assumes (the config's
    ``shape_k`` is BLOCK_K: one binary for every ks). ``contiguous_alignment`` (the kinds of CONTIGUOUS_KINDS only;
    64 or 128): the layout's alignment, which is their BLOCK_M (:func:`contiguous_block_m`). ``n`` of the SwiGLU
    kinds is ``2I`` (gate and up columns); ``ue8m0``: the FP8-output kinds' power-of-two scales (compiled in).
    ``swap_ab`` (dense, ``m <= SWAP_AB_MAX_M``): None lets the model choose (swap-AB where it models at least
    ``SWAP_AB_MARGIN`` faster than the best plain config), False never, True the best swap-AB config (benchmarks
    and the predictions table compare both; ``ValueError`` where swap-AB does not apply).

    ``batch_invariant`` (the default; ``deep_fp8_gemm.set_batch_invariant``): no split-K and no swap-AB unless
    ``swap_ab=True`` asks for it, so the choices that change a row's arithmetic (a split's partial sums, the
    transposed tile) never depend on ``m`` or ``num_sms``; the tile, cluster, multicast and stages still follow
    them (they do not change an element's arithmetic: docs/batch-invariance.md). False: the fast mode, split-K and
    swap-AB weighed by the model for each problem.

    ``sa_major`` (``config.SA_MAJORS``; "k" / "g" for the masked kind only): sA's global layout, compiled in; a K- or
    G-major sA takes four times the sA shared memory per stage, so a tile may get fewer stages (the cost model does
    not weigh stages or sA: the tile, cluster and grid are the "m" pick's).

    Pure and cached: the same arguments always give the same config.
    """
    _validate_problem(m, n, k, num_groups, kind, num_sms)
    m_eff = max(m, 1)
    shape_k = BLOCK_K if kind == K_GROUPED else k
    block_ms = ((contiguous_block_m(contiguous_alignment),) if kind in CONTIGUOUS_KINDS
                else BLOCK32_BLOCK_M if kind in BLOCK32_KINDS else BLOCK_M_CHOICES)
    best = None
    for block_m, block_n, num_stages in _legal_tiles(kind, n, shape_k, num_groups, smem_limit, block_ms, sa_major):
        if block_m > 64 and m_eff <= 64 and kind not in CONTIGUOUS_KINDS:
            continue  # a 64-row tile already covers all rows
        splits = (1,) if batch_invariant else _split_k_choices(kind, m_eff, n, k, block_m, block_n, num_sms)
        for split_k in splits:
            cost = estimate_cycles(kind, m_eff, n, k, num_groups, block_m, block_n, num_sms, split_k)
            if split_k > 1:  # uncalibrated model: split only on a clear win (not for n = 4096, m = 1: -1%)
                cost *= 1 + SPLIT_K_MARGIN
            # Ties: no split, then larger tiles (fewer, better-amortised), then larger BLOCK_M.
            key = (round(cost), split_k, -block_m * block_n, -block_m)
            if best is None or key < best[0]:
                best = (key, block_m, block_n, num_stages, split_k, False)
    if best is None:
        raise ValueError(f"no legal config for {kind=} {m=} {n=} {k=} {num_groups=} {smem_limit=}")
    swap_applies = kind in SWAP_AB_KINDS and m_eff <= SWAP_AB_MAX_M
    if swap_ab and not swap_applies:
        raise ValueError(f"swap_ab=True needs the dense kind and m <= {SWAP_AB_MAX_M}, got {kind=} {m=}")
    weigh_swap = swap_ab if swap_ab is not None else not batch_invariant  # invariant: only when asked for
    swap = _best_swap_ab(m_eff, n, k, num_sms, smem_limit, batch_invariant) if swap_applies and weigh_swap else None
    if swap is not None and (swap_ab or swap[0][0] < best[0][0]):
        best = swap
    _, block_m, block_n, num_stages, split_k, swap_ab = best

    num_n_blocks = ceil_div(n, block_n)
    m_blocks_total = num_m_blocks(kind, m_eff, block_m, num_groups)
    cluster_m, cluster_n = 1, 1
    worth_multicast = (m >= MULTICAST_MIN_M and num_sms >= 2 and m_blocks_total * num_n_blocks >= num_sms
                       and kind not in FP32_ACCUMULATE_KINDS)
    layout = LAYOUT_OF[kind]
    if worth_multicast:
        if num_n_blocks % 2 == 0:
            cluster_n = 2
        elif layout == "dense":
            cluster_m = 2
    cluster_size = cluster_m * cluster_n
    band_width = max(1, BAND_BLOCKS // cluster_n)
    max_clusters = num_sms // cluster_size
    if layout == "masked":
        num_clusters = max_clusters  # per-group row counts live on the GPU: launch the full persistent grid
    else:
        m_blocks = ceil_div(m_eff, block_m)
        # B multicast pairs m-blocks; an odd last m-block row is the unicast tail, two n-blocks per cluster
        # tile (scheduler.cuh), not a row of phantom tiles.
        cluster_tiles = (m_blocks // 2 * num_n_blocks + m_blocks % 2 * ceil_div(num_n_blocks, 2) if cluster_m == 2
                         else m_blocks * (num_n_blocks // cluster_n))
        if kind == K_GROUPED:
            cluster_tiles *= num_groups
        num_clusters = max(1, min(max_clusters, cluster_tiles * split_k))
    psum_alignment = contiguous_alignment if layout == "psum" else DEFAULT_CONTIGUOUS_ALIGNMENT
    cfg = GemmConfig(kind=kind, shape_n=n, shape_k=shape_k, num_groups=num_groups, block_m=block_m, block_n=block_n,
                     num_stages=num_stages, cluster_m=cluster_m, cluster_n=cluster_n, band_width=band_width,
                     grid_size=num_clusters * cluster_size, split_k=split_k, ue8m0=ue8m0, swap_ab=swap_ab,
                     psum_alignment=psum_alignment, sa_major=sa_major)
    check_config(cfg, smem_limit)
    return cfg


def _best_swap_ab(m: int, n: int, k: int, num_sms: int, smem_limit: int, batch_invariant: bool) -> tuple | None:
    """The best swap-AB candidate of a dense problem of ``m <= SWAP_AB_MAX_M`` rows, as ``get_config``'s ``best``
    tuple, its key's cost raised by ``SWAP_AB_MARGIN`` (a new, uncalibrated kernel: it must model a clear win over
    the plain kernel to be picked); None if no candidate is legal."""
    best = None
    for block_m in SWAP_AB_BLOCK_M:
        for block_n in SWAP_AB_BLOCK_N:
            num_stages = max_stages(block_m, block_n, smem_limit, "dense")
            candidate = GemmConfig(kind="dense", shape_n=n, shape_k=k, num_groups=1, block_m=block_m, block_n=block_n,
                                   num_stages=num_stages, cluster_m=1, cluster_n=1, band_width=1, grid_size=1,
                                   swap_ab=True)
            try:
                check_config(candidate, smem_limit)
            except ValueError:
                continue
            splits = (1,) if batch_invariant else _split_k_choices("dense", m, n, k, block_m, block_n, num_sms)
            for split_k in splits:
                cost = estimate_cycles("dense", m, n, k, 1, block_m, block_n, num_sms, split_k, swap_ab=True)
                cost *= (1 + SWAP_AB_MARGIN) * (1 + SPLIT_K_MARGIN if split_k > 1 else 1)
                # Ties (the HBM floor): no split, the token tile with the fewest padding columns, wider weight tiles.
                key = (round(cost), split_k, ceil_div(m, block_m) * block_m - m, -block_n)
                if best is None or key < best[0]:
                    best = (key, block_m, block_n, num_stages, split_k, True)
    return best


def block_n_choices(kind: str) -> tuple[int, ...]:
    """BLOCK_N values the heuristic weighs: 16..160, the one tile of the FP8-output (128) and SwiGLU (256) kinds, or
    the 1x32 recipe's whole 32-column scale blocks (32..128)."""
    if kind in SWIGLU_KINDS:
        return (SWIGLU_BLOCK_N,)
    if kind in FP8_OUTPUT_KINDS:
        return (FP8_OUTPUT_BLOCK_N,)
    if kind in BLOCK32_KINDS:
        return BLOCK32_BLOCK_N
    return BLOCK_N_CHOICES


#: Per-group K the k-grouped config is chosen for: the config (and so the binary) depends on m, n and G only, not on
#: the ks of a call (routing changes them every step; a new binary per step would compile mid-training).
K_GROUPED_NOMINAL_K = 4096


def k_grouped_config(m: int, n: int, num_groups: int, num_sms: int, nominal_k: int = K_GROUPED_NOMINAL_K
                     ) -> GemmConfig:
    """The k-grouped kernel's config for ``num_groups`` groups of ``[m, n]`` outputs (any ks)."""
    return get_config(m, n, nominal_k, num_groups, K_GROUPED, num_sms)




def up_projection_seconds(layout: str, fused: bool, m: int, inter: int, hidden: int, num_groups: int,
                          num_sms: int = 132, silu_rows: int | None = None) -> float:
    """Modelled time of a MoE up-projection ``x [rows, H] -> h = quant(SiLU(x W1ᵀ) * (x W3ᵀ)) [rows, I]``:
    ``fused``, the SwiGLU kind of ``layout`` (``"contiguous"``: ``m`` = m_sum; ``"masked"``: ``m`` = expected rows per
    group); else the bf16 kind plus :func:`silu_mul_quant_seconds` over ``silu_rows`` rows (default: the GEMM's rows;
    the masked path's quantiser streams the whole ``[G, m_max, 2I]`` buffer, pass ``G * m_max``)."""
    if layout not in ("contiguous", "masked"):
        raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")
    kind = f"{layout}_swiglu" if fused else layout
    seconds = estimate_seconds(get_config(max(m, 1), 2 * inter, hidden, num_groups, kind, num_sms), max(m, 1))
    if fused:
        return seconds
    rows = silu_rows if silu_rows is not None else m * (num_groups if layout == "masked" else 1)
    return seconds + silu_mul_quant_seconds(rows, inter)


#: The unfused up-projection is taken only where it models at least this much faster than the fused one. The two
#: paths round differently (the fused one skips the bf16 gate | up), so a per-call choice that flips on a modelled
#: difference of 0.05% (H = 256, I = 128, m_sum 128 vs 256) gives the same tokens different bits on two EP ranks or
#: in two batch sizes; within the model's error (uncalibrated, as SPLIT_K_MARGIN) the choice is the fused kernel.
FUSED_SWIGLU_MARGIN = 0.05


def fused_swiglu_wins(layout: str, m: int, inter: int, hidden: int, num_groups: int, num_sms: int = 132,
                      silu_rows: int | None = None) -> bool:
    """Whether the model picks the SwiGLU-fused up-projection: legal (``I % 128 == 0``) and the bf16 GEMM plus
    ``silu_mul_quant`` not modelled ``FUSED_SWIGLU_MARGIN`` faster (see :func:`up_projection_seconds`)."""
    if inter <= 0 or inter % FP8_OUTPUT_BLOCK_N:
        return False
    fused = up_projection_seconds(layout, True, m, inter, hidden, num_groups, num_sms)
    unfused = up_projection_seconds(layout, False, m, inter, hidden, num_groups, num_sms, silu_rows)
    return fused <= unfused * (1 + FUSED_SWIGLU_MARGIN)
