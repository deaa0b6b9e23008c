"""The throughput model of one SM (H100/H200 class) that ranks configs (:mod:`.heuristic`) and predicts times
(``bench/predict.py``).

NOTES: a model to be calibrated on an H200 — see bench/RESULTS.md. A tile costs ``max(MMA time, shared-memory bandwidth
time (wgmma operand reads + TMA writes), instruction issue time (:func:`issue_cycles_per_k_block`), L2 -> shared fill
time)``; a config costs ``SM waves x tile cost`` bounded below by HBM traffic.
"""

from __future__ import annotations

from ..utils import ceil_div
from .rules import (BLOCK32_KINDS, BLOCK_K, FP8_OUTPUT_BLOCK_N, FP8_OUTPUT_KINDS, FP32_ACCUMULATE_KINDS, K_GROUPED,
                    LAYOUT_OF, SWIGLU_KINDS, GemmConfig, block32_product_floats, num_math_warpgroups, output_columns,
                    round_up, waves_m)

# Throughput model of one SM (H100/H200 class), used to rank configs and for bench/predict.py.
MODEL_CLOCK_HZ = 1.83e9  # SM clock the model's cycles are converted at (the FP8 peak's clock, ANCHORS.md)
_MMA_FLOP_PER_CLK = 8192
_SMEM_FILL_BYTES_PER_CLK = 96  # L2 -> shared memory through TMA
_SMEM_BYTES_PER_CLK = 128  # shared-memory bandwidth: wgmma operand reads + TMA writes share it
_HBM_BYTES_PER_CLK_PER_SM = 4.8e12 / MODEL_CLOCK_HZ / 132  # H200 datasheet HBM bandwidth, shared by 132 SMs
# NOTES: guess, calibrate on H200 — one warpgroup cannot hide its own promotion work.
_MMA_EFFICIENCY = {64: 0.70, 128: 0.85, 256: 0.90}
_TILE_FIXED_CYCLES = 600  # NOTES: guess, calibrate on H200 — per-tile fixed cost: pipeline ramp, epilogue
# Instruction issue per K block (NOTES: fitted to the audit's static K-loop analysis, runtime/kloop.py, NVRTC
# 13.5 sm_90a, within 8% of every loop `audit --kind all` compiles (issue 28's last pass: refitted from 7 / 21 /
# 29 / 70 when the loops lost 2-13 instructions per K block); see docs/kloop.md). Per m64 wave of a
# math warp: BLOCK_N / 2 FFMA (promotion) + 4 QGMMA + sA loads + 2 FMUL + fence and drain; tiles whose BLOCK_N
# does not divide 128 straddle two sB blocks (2 more FMUL and a bit-mask select per segment); per K block (the
# rolled K loop, pipeline.cuh): barrier wait and release, sB load, the stage record's and the descriptors'
# addresses (one multiply-add each), one descriptor add per wgmma, the pass's counter; the producer warp (one
# thread) shares one SM sub-partition.
_ISSUE_PER_WAVE = 9
_ISSUE_STRADDLE = 13
_ISSUE_PER_K_BLOCK = 25
_ISSUE_PRODUCER = 62
# The second wgmma chunk of a wave (the SwiGLU kinds): its 4 QGMMA, fence / commit / wait, its descriptors and the
# FMULs of its own sB block (audit: 188 per K block at 64x256 and 128x256, modelled 184).
_ISSUE_PER_MMA_CHUNK = 20
# The 1x32 recipe (policy_block32.cuh), per K block per math warp: 4 slices x BLOCK_N / 2 FFMA, the products' 16-byte
# loads (4 or 8) and the fixed rest (4 QGMMA, 8 WARPGROUP, the barrier, descriptors, loop: 37); the audit: 105 / 169
# / 237 / 301 at BLOCK_N 32 / 64 / 96 / 128, exactly. Its scale warps (one per 64 rows, each on a sub-partition of
# its own) issue ~55 + BLOCK_N / 4 per K block (audit: 59-87).
_ISSUE_BLOCK32_FIXED = 37
_ISSUE_BLOCK32_SCALE_WARP = 55


def num_m_blocks(kind: str, m: int, block_m: int, num_groups: int) -> int:
    if LAYOUT_OF[kind] in ("masked", K_GROUPED):  # m is the (expected) rows per group
        return num_groups * ceil_div(m, block_m)
    return ceil_div(m, block_m)


def math_issue_per_k_block(kind: str, block_m: int, block_n: int, swap_ab: bool = False) -> float:
    """Modelled math-loop instructions per K block per math warp (what ``audit``'s K-loop analysis reports as
    ``kloop.math.per_k_block.total``). Swap-AB: per wave BLOCK_M / 2 FFMA, BLOCK_M / 4 FMUL (sA x sB per column)
    and the wave's fixed part; per K block the BLOCK_M / 8 sA pair loads."""
    if swap_ab:
        return block_n // 64 * (block_m / 2 + block_m / 4 + _ISSUE_PER_WAVE) + block_m / 8 + _ISSUE_PER_K_BLOCK
    if kind in BLOCK32_KINDS:  # one wave: a promotion per 32 K
        loads = 4 * -(-block32_product_floats(block_n) // 4)
        return 2 * block_n + loads + _ISSUE_BLOCK32_FIXED
    waves = waves_m(block_m)
    if kind in FP32_ACCUMULATE_KINDS:  # per-column B scales: FMUL + FFMA per value, BLOCK_N / 8 sB load pairs
        return waves * (block_n + _ISSUE_PER_WAVE - 2) + block_n / 8 + _ISSUE_PER_K_BLOCK
    if kind in SWIGLU_KINDS:  # two m64n128 chunks per wave, each promoted with its own sB block (no straddle select)
        return waves * (block_n / 2 + _ISSUE_PER_WAVE + _ISSUE_PER_MMA_CHUNK) + _ISSUE_PER_K_BLOCK
    per_wave = block_n / 2 + _ISSUE_PER_WAVE + (_ISSUE_STRADDLE if 128 % block_n else 0)
    return waves * per_wave + _ISSUE_PER_K_BLOCK


def issue_cycles_per_k_block(kind: str, block_m: int, block_n: int, swap_ab: bool = False) -> float:
    """Issue cycles per K block on the busiest SM sub-partition: one warp of every math warpgroup plus the
    producer warp live on it, and a sub-partition issues one instruction per clock. Compare with the tensor
    cycles of a K block, ``block_m * block_n / 32``: their ratio (math part only) is the audit's
    ``issue_per_tensor_cycle``."""
    if swap_ab:  # one math warpgroup
        return math_issue_per_k_block(kind, block_m, block_n, True) + _ISSUE_PRODUCER
    if kind in BLOCK32_KINDS:  # the busiest sub-partition: the producer's, or a scale warp's (no sub-partition has both)
        extra = max(_ISSUE_PRODUCER, _ISSUE_BLOCK32_SCALE_WARP + block_n / 4)
        return math_issue_per_k_block(kind, block_m, block_n) * num_math_warpgroups(block_m) + extra
    return math_issue_per_k_block(kind, block_m, block_n) * num_math_warpgroups(block_m) + _ISSUE_PRODUCER


def estimate_cycles(kind: str, m: int, n: int, k: int, num_groups: int, block_m: int, block_n: int, num_sms: int,
                     split_k: int = 1, swap_ab: bool = False) -> float:
    """Modelled kernel time in SM clocks (for ranking configs only). ``split_k`` > 1: tiles x split_k work items
    of k / split_k each, plus the fp32 partials and the last CTA's reduce (:func:`_split_k_cycles`). ``swap_ab``:
    the same terms for the transposed tile (the wgmma's rows are the BLOCK_N weight rows, its columns the BLOCK_M
    tokens; policy_swap_ab.cuh); the A box is BLOCK_M rows, not zero-filled to 64."""
    num_tiles = num_m_blocks(kind, m, block_m, num_groups) * ceil_div(n, block_n)
    sm_waves = ceil_div(num_tiles * split_k, num_sms)
    k_padded = round_up(k, BLOCK_K) // split_k
    rows, cols = (block_n, block_m) if swap_ab else (block_m, block_n)  # the wgmma tile
    mma = 2 * rows * cols * k_padded / (_MMA_FLOP_PER_CLK * _MMA_EFFICIENCY[64 if swap_ab else block_m])
    fill = (block_m + block_n) * k_padded / _SMEM_FILL_BYTES_PER_CLK
    # Every m64 wgmma reads its A slice and the whole B tile from shared memory, so narrow tiles are
    # bound by shared-memory bandwidth before the tensor cores: per K element, (rows/64) x (64 + cols)
    # operand bytes plus (BM + BN) bytes written by TMA.
    smem = ((rows // 64) * (64 + cols) + block_m + block_n) * k_padded / _SMEM_BYTES_PER_CLK
    issue = ceil_div(k, BLOCK_K) // split_k * issue_cycles_per_k_block(kind, block_m, block_n, swap_ab)
    mma = max(mma, smem, issue)
    tile = max(mma, fill) + _TILE_FIXED_CYCLES + epilogue_cycles(kind, block_m)
    if split_k > 1:
        tile += _split_k_cycles(block_m, block_n, split_k)
    layout = LAYOUT_OF[kind]
    groups_touched = num_groups if layout != "dense" else 1
    rows = m * (num_groups if layout == "masked" else 1)
    k_blocks = ceil_div(k, BLOCK_K)
    if kind in FP32_ACCUMULATE_KINDS:  # fp32 C read + fp32 D written; per-row sB (k-grouped: per group, k per group)
        groups = num_groups if kind == K_GROUPED else 1
        hbm_bytes = groups * (rows * k + n * k + rows * n * 8 + 4 * (rows + n) * k_blocks)
        return max(sm_waves * tile, hbm_bytes / (_HBM_BYTES_PER_CLK_PER_SM * num_sms))
    if kind in BLOCK32_KINDS:  # 1x32 / 32x32 scales
        scale_bytes = 4 * ceil_div(k, 32) * (rows + groups_touched * ceil_div(n, 32))
    else:
        scale_bytes = 4 * (rows * k_blocks + groups_touched * ceil_div(n, 128) * k_blocks)  # sA, sB
    hbm_bytes = rows * k + groups_touched * n * k + output_bytes(kind, rows, n) + scale_bytes  # A, B, D (+ sD), scales
    return max(sm_waves * tile, hbm_bytes / (_HBM_BYTES_PER_CLK_PER_SM * num_sms))


# The FP8 epilogue per output value and math thread (NOTES: counted from the kernel source, not yet measured): |x|
# max (1), the multiply by the row's reciprocal of the scale (1; until issue 45 an IEEE fp32 division, ~8 issue
# slots on sm_90 with its fast path; the reciprocal, once per row and 64 values, is left out), the e4m3 pack and
# the 2-byte shared store (1); the SwiGLU kinds add SiLU (exp + division + multiply, ~12).
_EPILOGUE_ISSUE_PER_VALUE = {"fp8": 3, "swiglu": 15}


def epilogue_cycles(kind: str, block_m: int) -> float:
    """Issue cycles of the FP8 / SwiGLU epilogue of one tile beyond the bf16 store (in ``_TILE_FIXED_CYCLES``): 64
    output values per thread and m64 wave, one warp of every math warpgroup per SM sub-partition."""
    if kind not in FP8_OUTPUT_KINDS:
        return 0.0
    per_value = _EPILOGUE_ISSUE_PER_VALUE["swiglu" if kind in SWIGLU_KINDS else "fp8"]
    return waves_m(block_m) * (FP8_OUTPUT_BLOCK_N // 2) * per_value * num_math_warpgroups(block_m)


def output_bytes(kind: str, rows: int, n: int) -> int:
    """Bytes a GEMM of ``rows`` x ``n`` writes: bf16 D, or e4m3 D plus one fp32 scale per 128 columns (FP8-output
    kinds; the SwiGLU kinds' D has ``n / 2`` columns)."""
    if kind not in FP8_OUTPUT_KINDS:
        return rows * n * 2
    cols = output_columns(kind, n)
    return rows * (cols + 4 * ceil_div(cols, FP8_OUTPUT_BLOCK_N))


# Split-K (NOTES: modelled, not measured): fp32 partials go to L2 and back at the L2 -> SM fill rate; the counter
# atomic is an L2 round trip plus two warpgroup barriers; the last CTA reads split_k - 1 partial tiles.
_SPLIT_K_ATOMIC_CYCLES = 1200


def _split_k_cycles(block_m: int, block_n: int, split_k: int) -> float:
    """Extra clocks of a split-K work item on the critical path: store its partial, the counter round trip,
    and (for the tile's last split, which ends the tile) reading the other splits' partials."""
    partial = block_m * block_n * 4 / _SMEM_FILL_BYTES_PER_CLK
    return partial * split_k + _SPLIT_K_ATOMIC_CYCLES


def estimate_seconds(cfg: GemmConfig, m: int, num_sms: int = 132, k: int | None = None) -> float:
    """The heuristic's modelled time of ``cfg`` for ``m`` (dense rows, contiguous m_sum, masked rows per
    group). A prediction to compare with measurements (bench/predict.py), not a measurement. ``k``: the k-grouped
    kind's per-group K (required: its binary is compiled for shape_k = BLOCK_K whatever the ks, so the config
    does not know it; ``ValueError`` without); the other kinds model their compiled shape_k (``k`` must be None
    or equal to it)."""
    if cfg.kind == K_GROUPED:
        if k is None:
            raise ValueError("estimate_seconds of a k-grouped config needs k= (the per-group K to model): its "
                             f"binary is compiled for shape_k={BLOCK_K} whatever the ks")
    elif k is not None and k != cfg.shape_k:
        raise ValueError(f"k={k} differs from the config's compiled shape_k={cfg.shape_k} ({cfg.kind})")
    cycles = estimate_cycles(cfg.kind, max(m, 1), cfg.shape_n, cfg.shape_k if k is None else k, cfg.num_groups,
                              cfg.block_m, cfg.block_n, num_sms, cfg.split_k, cfg.swap_ab)
    return cycles / MODEL_CLOCK_HZ


# ---------------------------------------------------------------------------------------------- the MoE up-projection
# The unfused up-projection is the bf16 GEMM plus silu_mul_quant (kernels/quant.cuh SiluMulPerToken), a second,
# memory-bound kernel. NOTES: guesses, calibrate on H200 — the cost of one more kernel on the stream (launch gap and
# its ramp, without PDL), and the fraction of the HBM datasheet bandwidth a one-pass quantiser streams at.
KERNEL_LAUNCH_SECONDS = 2.5e-6
_QUANT_HBM_EFFICIENCY = 0.8
HBM_BYTES_PER_SECOND = 4.8e12  # H200 datasheet


def silu_mul_quant_bytes(rows: int, inter: int) -> int:
    """Bytes ``silu_mul_quant`` moves for ``rows`` rows of ``[gate | up]``: the bf16 input read, the e4m3 output and
    its 1x128 scales written."""
    return rows * (2 * 2 * inter + inter + 4 * ceil_div(inter, FP8_OUTPUT_BLOCK_N))


def silu_mul_quant_seconds(rows: int, inter: int) -> float:
    """Modelled time of the unfused path's second kernel (a launch plus its bytes at the quantisers' bandwidth)."""
    return KERNEL_LAUNCH_SECONDS + silu_mul_quant_bytes(rows, inter) / (HBM_BYTES_PER_SECOND * _QUANT_HBM_EFFICIENCY)


# ---------------------------------------------------------------------------------------------- MXFP4 experts
#: The MXFP4 decode kernel's folded K loop, issue slots per K block per SMSP by (BLOCK_M, BLOCK_N): measured by the
#: audit (``python -m deep_fp8_gemm audit --kind mxfp4``, NVRTC 13.5; tests/kernels/test_mxfp4_cost.py compares).
MXFP4_ISSUE_PER_K_BLOCK = {(8, 256): 442, (16, 256): 475, (32, 128): 291, (16, 64): 148, (64, 64): 202,
                           (128, 64): 274}
#: Bytes the kernel reads per weight row and 128 K: 64 of codes + the 272-byte record per 64 rows (ops/mxfp4.py).
MXFP4_BYTES_PER_ROW_K_BLOCK = 64 + 272 / 64
#: The checkpoint's: 64 of codes + 4 UE8M0 scales (the FP4 HBM floor's bytes).
MXFP4_CHECKPOINT_BYTES_PER_ROW_K_BLOCK = 64 + 4


def mxfp4_hbm_bytes(m: int, n: int, k: int, num_groups: int, block_n: int, stored: bool = True) -> float:
    """HBM bytes of a masked MXFP4 GEMM with ``m`` tokens in each of ``num_groups`` experts: the weights (the stored
    form, or the checkpoint's with ``stored=False``), the activations and their scales once (every tile of ``block_n``
    weight rows reads its expert's tokens; after the first, from L2: decode's tokens are a few MB against 50 MB),
    D in bf16. ``block_n`` is the tile's (unused by the HBM count; kept for the call sites' symmetry with the
    simulator's TMA byte count, which counts every tile's read)."""
    k_blocks = ceil_div(k, BLOCK_K)
    per_row = MXFP4_BYTES_PER_ROW_K_BLOCK if stored else MXFP4_CHECKPOINT_BYTES_PER_ROW_K_BLOCK
    weights = num_groups * n * k_blocks * per_row
    tokens = num_groups * m * (k + (4 * k_blocks if stored else 0))
    return weights + tokens + num_groups * m * n * 2


#: The MXFP4 conversion kernel (kernels/mxfp4_convert_gemm.cuh, prefill) per K block by BLOCK_M (BLOCK_N 128):
#: (the conversion warps' issue slots, the math loop's per warp), measured by the audit (``python -m deep_fp8_gemm audit
#: --kind mxfp4``, NVRTC 13.5, kind ``mxfp4_convert``: the conversion figure is static, both table paths of a unit
#: counted). A conversion warp shares its SM sub-partition with BLOCK_M / 64 math warps.
MXFP4_CONVERT_ISSUE_PER_K_BLOCK = {128: (618, 184), 64: (618, 187)}


def mxfp4_convert_estimate_seconds(m: int, n: int, k: int, num_groups: int, block_m: int,
                                   num_sms: int = 132) -> float:
    """Modelled time of the MXFP4 conversion kernel (kernels/mxfp4_convert_gemm.cuh) for ``m`` tokens per expert on a
    contiguous layout: tiles of ``block_m`` tokens x 128 weight rows over the SMs, each the larger of its busiest SM
    sub-partition's issue time (a conversion warp and BLOCK_M / 64 math warps, :data:`MXFP4_CONVERT_ISSUE_PER_K_BLOCK`)
    and its tensor time (the FP8 model's efficiency at ``block_m``), plus the per-tile fixed cost; bounded below by the
    bytes at the HBM bandwidth (the weights once per m-block of an expert beyond L2 are not modelled: as
    :func:`mxfp4_estimate_seconds`). A prediction, not a measurement."""
    tiles = num_groups * ceil_div(max(m, 1), block_m) * ceil_div(n, 128)
    sm_waves = ceil_div(tiles, num_sms)
    k_blocks = ceil_div(k, BLOCK_K)
    convert, math = MXFP4_CONVERT_ISSUE_PER_K_BLOCK[block_m]
    issue = k_blocks * (convert + block_m // 64 * math)
    mma = 2 * 128 * block_m * k_blocks * BLOCK_K / (_MMA_FLOP_PER_CLK * _MMA_EFFICIENCY[block_m])
    tile = max(issue, mma) + _TILE_FIXED_CYCLES
    hbm = mxfp4_hbm_bytes(m, n, k, num_groups, 128) / (_HBM_BYTES_PER_CLK_PER_SM * num_sms)
    return max(sm_waves * tile, hbm) / MODEL_CLOCK_HZ


def mxfp4_estimate_seconds(m: int, n: int, k: int, num_groups: int, block_m: int, block_n: int,
                           num_sms: int = 132) -> float:
    """Modelled time of the MXFP4 masked kernel (kernels/mxfp4_gemm.cuh) for ``m`` tokens per expert: tiles of
    ``block_n`` weight rows x ``block_m`` tokens over the SMs, each the larger of its issue time (the measured folded
    loop, :data:`MXFP4_ISSUE_PER_K_BLOCK`, one math warp per SMSP) and its tensor-core time, plus the per-tile fixed cost;
    bounded below by all bytes at the HBM bandwidth. A prediction, not a measurement."""
    tiles = num_groups * ceil_div(max(m, 1), block_m) * ceil_div(n, block_n)
    sm_waves = ceil_div(tiles, num_sms)
    k_blocks = ceil_div(k, BLOCK_K)
    issue = k_blocks * MXFP4_ISSUE_PER_K_BLOCK[(block_m, block_n)]
    # The tensor cores: m64 waves of the weights' rows (one math warpgroup, the FP8 model's m64 efficiency).
    mma = 2 * block_n * block_m * k_blocks * BLOCK_K / (_MMA_FLOP_PER_CLK * _MMA_EFFICIENCY[64])
    tile = max(issue, mma) + _TILE_FIXED_CYCLES
    hbm = mxfp4_hbm_bytes(m, n, k, num_groups, block_n) / (_HBM_BYTES_PER_CLK_PER_SM * num_sms)
    return max(sm_waves * tile, hbm) / MODEL_CLOCK_HZ
