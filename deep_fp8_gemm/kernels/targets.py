"""What the kernel audit compiles: the DeepSeek-V3 problem tables (ANCHORS.md section 5) and every distinct GEMM
kernel the heuristic picks for them (``python -m deep_fp8_gemm audit``, ``precompile``, the demo, bench_jit)."""

from __future__ import annotations

import functools
from typing import Sequence

from ..config import (FP8_OUTPUT_KINDS, FP32_ACCUMULATE_KINDS, KINDS, SA_MAJOR_KINDS, SWIGLU_KINDS, GemmConfig,
                      get_config, k_grouped_config)
from ..kinds import TABLE
from .gemm import render_source

# Dense (N, K) and grouped (N, K).
DEEPSEEK_V3_DENSE = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (576, 7168))
DEEPSEEK_V3_GROUPED = ((4096, 7168), (7168, 2048))
DEFAULT_DENSE_MS = (1, 16, 64, 128, 256, 1024, 4096, 8192)
CONTIGUOUS_EXPERTS = ((4, 8192), (8, 4096), (32, 256))  # (experts, rows per expert)
#: The contiguous alignments (``set_mk_alignment_for_contiguous_layout``) the contiguous / psum kinds are audited at:
#: each is their BLOCK_M, and the psum kinds compile it in (``GemmConfig.psum_alignment``).
CONTIGUOUS_AUDIT_ALIGNMENTS = (128, 64)
MASKED_GROUPS = (4, 8, 32)
MASKED_EXPECTED_MS = (1, 32, 256, 1024)
# 1D1D (weight gradients of the dense layers above): dW [N, K] = dY^T . X, i.e. m = N (out features), n = K (in
# features), k = tokens; audited for the in-feature counts x 4096 tokens and the out-feature counts as m.
DEEPSEEK_V3_WGRAD = ((7168, 4096), (1536, 4096), (512, 4096), (16384, 4096), (2048, 4096))
WGRAD_MS = (576, 2112, 4096, 7168, 24576)
# k-grouped (MoE expert weight gradients): dW13 [2 x 2048, 7168] and dW2 [7168, 2048] of each local expert, i.e.
# (n, nominal k) shapes with n = 7168 / 2048 and ms = 4096 / 7168 (out features), for 8 and 32 local experts.
DEEPSEEK_V3_K_GROUPED = ((7168, 4096), (2048, 4096))
K_GROUPED_MS = (4096, 7168)
K_GROUPED_GROUPS = (8, 32)

# The SwiGLU kinds (the MoE up-projection): w13 of DeepSeek-V3's experts, N = 2I = 4096 gate and up columns, K = H.
DEEPSEEK_V3_SWIGLU = ((4096, 7168),)

# The 1x32 / 32x32 recipe (kind dense_block32): DeepSeek-V4.1's dense FP8 projections (N, K). V4.1's own config.json
# was not in the sources this library could read; these are DeepSeek-V4-Pro's published dimensions (hidden 7168,
# q_lora_rank 1536, 128 heads of 512 with one KV head, o_lora_rank 1024 x 16 groups, a shared expert of intermediate
# 2048; the indexer's 64 heads of 128), the head-sharded ones at tensor-parallel 8 as SGLang runs them: wq_a
# (1536, 7168), wkv (512, 7168), wq_b / 8 and the indexer's wq_b (8192, 1536), wo_b / 8 and the shared expert's w2
# (7168, 2048), the shared expert's w13 (4096, 7168), the indexer's wk (128, 7168). docs/block32.md.
DEEPSEEK_V41_DENSE_BLOCK32 = ((4096, 7168), (7168, 2048), (1536, 7168), (512, 7168), (8192, 1536), (128, 7168))

# fp8_einsum("bhr,hdr->bhd") (ops.einsum): DeepSeek-V4's o_proj heads, wo_a per group of heads (o_lora_rank d = 1024
# over r = 128 heads x 512 / 16 groups = 4096), as (N, K) = (d, r), at 16 and 8 groups (tensor-parallel 1 and 2) and
# the masked kind's expected rows; the kernels that read sx where the caller left it (GemmConfig.sa_major "k": row-major
# sx, "g": per_token_cast_to_fp8's M-major sx viewed back), audited with the masked kind. Not K-loop gated: their
# tiles are the heuristic's picks for other shapes than the ceilings were set on (the 64 x 112 tile of 8 heads at
# 1 token issues 0.464 per tensor cycle, over the masked m64 ceiling 0.42, as its M-major twin does); instead
# tests/kernels/test_sa_major_kernels.py holds a variant's math loop to its M-major twin's, instruction for instruction.
DEEPSEEK_V4_EINSUM_HEADS = ((1024, 4096),)
EINSUM_GROUPS = (16, 8)
EINSUM_SA_MAJORS = ("k", "g")


def default_shapes(kind: str) -> tuple[tuple[int, int], ...]:
    """The (N, K) table a kind is audited on, from its axis values: the 1x32 recipe DeepSeek-V4.1's dense
    projections; otherwise DeepSeek-V3's: the SwiGLU output the up-projection's
    w13, the 1D1D dense kernel the weight gradients, the k-grouped layout the experts' weight gradients, the dense
    layout the dense projections, every other grouped layout the experts' GEMMs."""
    row = TABLE.row(kind)
    if row.granularity == "1x32/32x32":
        return DEEPSEEK_V41_DENSE_BLOCK32
    if row.output == "swiglu_fp8":
        return DEEPSEEK_V3_SWIGLU
    if row.layout == "k_grouped":
        return DEEPSEEK_V3_K_GROUPED
    if row.layout == "dense":
        return DEEPSEEK_V3_WGRAD if row.accumulation == "1d1d" else DEEPSEEK_V3_DENSE
    return DEEPSEEK_V3_GROUPED
#: The SM count CI audits for (``audit --kind all``'s default ``--num-sms``).
GATED_NUM_SMS = 132


def _configs(kind: str, shapes: Sequence[tuple[int, int]], ms: Sequence[int] | None, num_sms: int,
             num_groups: int | None) -> list[GemmConfig]:
    """The heuristic's pick for every problem of ``kind`` over ``shapes`` x ``ms`` (see :func:`audit_targets`)."""
    configs: list[GemmConfig] = []
    row = TABLE.row(kind)
    for n, k in shapes:
        if row.layout == "dense":
            for m in ms or (DEFAULT_DENSE_MS if row.accumulation == "1d2d" else WGRAD_MS):
                # Both modes' picks: the default batch-invariant one, and the fast mode's (split-K, swap-AB).
                for invariant in (True, False):
                    configs.append(get_config(m, n, k, 1, kind, num_sms, batch_invariant=invariant))
        elif row.layout == "k_grouped":  # k: the nominal per-group K of the cost model (the binary has none)
            for g in ([num_groups] if num_groups else K_GROUPED_GROUPS):
                for m in ms or K_GROUPED_MS:
                    configs.append(k_grouped_config(m, n, g, num_sms, k))
        elif row.layout in ("contiguous", "psum"):
            if not ms:
                pairs = list(CONTIGUOUS_EXPERTS)
            elif num_groups:
                pairs = [(num_groups, m) for m in ms]
            else:
                pairs = [(g, m) for g, _ in CONTIGUOUS_EXPERTS for m in ms]
            for g, m in pairs:
                for alignment in CONTIGUOUS_AUDIT_ALIGNMENTS:
                    configs.append(get_config(g * m, n, k, g, kind, num_sms, contiguous_alignment=alignment))
        else:
            for g in ([num_groups] if num_groups else MASKED_GROUPS):
                for m in ms or MASKED_EXPECTED_MS:
                    configs.append(get_config(m, n, k, g, kind, num_sms))
    return configs


def einsum_configs(kind: str, ms: Sequence[int] | None, num_sms: int, num_groups: int | None) -> list[GemmConfig]:
    """fp8_einsum's kernels of ``kind`` (none but for :data:`~deep_fp8_gemm.config.SA_MAJOR_KINDS`): the heuristic's
    pick for DeepSeek-V4's o_proj heads (:data:`DEEPSEEK_V4_EINSUM_HEADS`) per sA layout of :data:`EINSUM_SA_MAJORS`,
    ``ms`` tokens (default the masked kind's expected rows), ``num_groups`` heads (default :data:`EINSUM_GROUPS`)."""
    if kind not in SA_MAJOR_KINDS:
        return []
    return [get_config(m, n, k, g, kind, num_sms, sa_major=major) for n, k in DEEPSEEK_V4_EINSUM_HEADS
            for g in ([num_groups] if num_groups else EINSUM_GROUPS) for m in ms or MASKED_EXPECTED_MS
            for major in EINSUM_SA_MAJORS]


#: The fp32 epilogue (policy_1d1d.cuh, store_fp32_accumulate) moves each fragment pair as one 8-byte load of C and
#: one 8-byte store of D; a 4-byte STG.E in these kernels means the vectorisation was lost (issue 25, item 5).
FP32_EPILOGUE_REQUIRED_SASS = ("LDG.E.64", "STG.E.64")
FP32_EPILOGUE_FORBIDDEN_SASS = ("STG.E",)


#: The FP8-output epilogue (epilogue_fp8.cuh) takes one IEEE reciprocal per row and 128-column scale block and
#: multiplies every value by it (issue 45): per math thread and m64 wave, rows r and r + 8, i.e. 2 MUFU.RCP, where a
#: division per value took 64 (one per value of the m64n128 fragment). The SwiGLU kinds' SiLU, x / (1 + e^-x), divides
#: once per output value (that is the activation, not the quantiser: 64 per wave).
FP8_EPILOGUE_RCP_PER_WAVE = 2
SWIGLU_SILU_RCP_PER_WAVE = 64
#: MUFU.RCP elsewhere in a GEMM kernel: the scheduler's integer divisions by run-time values and the slow-path
#: subroutines of IEEE division and reciprocal (4 in the reciprocal's); the issue-45 audit of the DeepSeek-V3 tables
#: found 2-4 in the bf16 kernels and 7-11 in the FP8-output ones.
GEMM_OTHER_RCP = 16


def fp8_epilogue_max_rcp(cfg: GemmConfig) -> int:
    """The most ``MUFU.RCP`` an FP8-output kernel of ``cfg`` may hold (``AuditTarget.max_sass``): a reciprocal per
    row block and thread, not a division per value (:data:`FP8_EPILOGUE_RCP_PER_WAVE`)."""
    per_wave = FP8_EPILOGUE_RCP_PER_WAVE + (SWIGLU_SILU_RCP_PER_WAVE if cfg.kind in SWIGLU_KINDS else 0)
    return cfg.waves_m * per_wave + GEMM_OTHER_RCP


def sass_rules(cfg: GemmConfig) -> dict:
    """``AuditTarget`` keywords: the SASS a GEMM kernel of ``cfg`` must (``required_sass``) and must not
    (``forbidden_sass``) contain beyond every GEMM's, and the opcodes with a bound on their count (``max_sass``:
    the FP8-output kinds' ``MUFU.RCP``, :func:`fp8_epilogue_max_rcp`)."""
    from ..runtime.audit import GEMM_REQUIRED_SASS

    if cfg.kind in FP8_OUTPUT_KINDS:
        return {"max_sass": (("MUFU.RCP", fp8_epilogue_max_rcp(cfg)),)}
    if cfg.kind not in FP32_ACCUMULATE_KINDS:
        return {}
    return {"required_sass": GEMM_REQUIRED_SASS + FP32_EPILOGUE_REQUIRED_SASS,
            "forbidden_sass": FP32_EPILOGUE_FORBIDDEN_SASS}


@functools.lru_cache(maxsize=None)
def gated_kernel_names(kind: str) -> frozenset[str]:
    """The kernels CI gates on the K-loop ceilings (``kloop_ceilings.json``): what ``audit --kind all`` picks for
    the DeepSeek-V3 tables at :data:`GATED_NUM_SMS` SMs. The ceilings were set ~10% above the worst of these; a
    kernel the heuristic picks for other shapes is reported against them, not failed."""
    shapes = default_shapes(kind)
    return frozenset(cfg.kernel_name() for cfg in _configs(kind, shapes, None, GATED_NUM_SMS, None))


def audit_targets(kind: str, shapes: Sequence[tuple[int, int]] | None = None, ms: Sequence[int] | None = None,
                  num_sms: int = GATED_NUM_SMS, num_groups: int | None = None) -> list:
    """Every distinct kernel the heuristic picks for ``kind`` over shapes x M (deduplicated by binary).

    dense / 1d1d: ``ms`` are row counts (default 1..8192 / the wgrad out-feature counts), the picks of both the
    batch-invariant mode (the default) and the fast mode (``set_batch_invariant(False)``: split-K, swap-AB);
    contiguous / psum:
    ``ms`` are rows per expert (default the DeepSeek-V3 pairs of experts x rows), at both contiguous alignments
    (:data:`CONTIGUOUS_AUDIT_ALIGNMENTS`); masked: ``ms`` are expected rows
    per group; k_grouped: ``ms`` are the out-feature counts, shapes ``(n, nominal K per group)``. The FP8-output and
    SwiGLU kinds take their layout kind's ``ms``; the SwiGLU kinds' shapes are ``(2I, H)`` (default DeepSeek-V3's
    up-projection, 4096 x 7168). The masked kind adds fp8_einsum's kernels (:func:`einsum_configs`: sA read K- or
    G-major) where no ``shapes`` are given. Each target's ``gate_kloop`` says whether it is a kernel CI gates
    (:func:`gated_kernel_names`).
    """
    from ..runtime.audit import AuditTarget

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    configs = _configs(kind, tuple(shapes) if shapes else default_shapes(kind), ms, num_sms, num_groups)
    if not shapes:
        configs += einsum_configs(kind, ms, num_sms, num_groups)
    gated = gated_kernel_names(kind)
    targets, seen = [], set()
    for cfg in configs:
        name = cfg.kernel_name()
        if name in seen:
            continue
        seen.add(name)
        targets.append(AuditTarget(kind=kind, config=cfg.as_dict(), name=name, source=render_source(cfg),
                                   gate_kloop=name in gated, **sass_rules(cfg)))
    if TABLE.row(kind).layout == "k_grouped":  # every k-grouped call launches the map builder first (one binary for all configs)
        from . import group_maps

        targets.append(group_maps.audit_target())
    return targets
