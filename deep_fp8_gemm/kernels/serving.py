"""The kernel set a model's serving needs: ``python -m deep_fp8_gemm precompile --model deepseek-v3 --tp 8``.

A serving stack (vLLM, SGLang) calls this library's 2.x names for every FP8 linear layer and, with expert
parallelism, the MoE experts; the first call of each distinct kernel would compile it at boot or, worse, during the
first requests. :func:`serving_targets` lists every kernel those calls can pick for a model at a tensor-parallel
degree, for **every** token count M in 1..:data:`M_MAX` per rank (the heuristic's pick changes at M values that are
not multiples of any tile: a sparser sweep misses kernels), in the library's default mode (batch-invariant; a
process that calls ``set_batch_invariant(False)`` also needs the fast mode's split-K / swap-AB picks, which
``precompile --kind dense`` lists) and the default contiguous alignment (128).

DeepSeek-V3 (also V3.1 and R1: the same shapes; hidden 7168, q_lora_rank 1536, kv_lora_rank 512 + rope 64, 128 heads of
qk 192 / v 128, dense-layer intermediate 18432, 256 routed experts of intermediate 2048, top-8, one shared expert
of 2048), at ``tp`` = T ranks, the sharding vLLM and SGLang use:

* **dense** (``fp8_gemm_nt``, bf16 out), (N, K) per rank: fused q_a + kv_a (2112, 7168) replicated; q_b
  (24576 / T, 1536); kv_b (32768 / T, 512); o_proj (7168, 16384 / T); the three dense layers' gate + up
  (36864 / T, 7168) and down (7168, 18432 / T); the shared expert's gate + up (4096 / T, 7168) and down
  (7168, 2048 / T) (TP-sharded, not fused into the routed experts).
* **contiguous** (``m_grouped_fp8_gemm_nt_contiguous``, prefill: DeepEP normal dispatch, vLLM's DeepGemmExperts),
  experts split by expert parallelism over the T ranks (256 / T local experts of full size): w13 (4096, 7168) and
  w2 (7168, 2048), m_sum every multiple of 128 up to 8 x 8192 routed rows plus one 128-row pad per local expert.
* **masked** (``m_grouped_fp8_gemm_nt_masked``, decode: DeepEP low-latency dispatch, vLLM's
  BatchedDeepGemmExperts), the same experts, expected_m every value in 1..8192.
* **quant**: every fused quantiser kernel (``per_token_cast_to_fp8``, ``per_block_cast_to_fp8``,
  ``silu_mul_quant``; shape-free, the audit's ``--kind quant``).

Not in the set: the FP8-output / SwiGLU / psum kinds (no 2.x name of the serving stacks calls them), the weight-
gradient kinds (training), the lm_head (bf16), the V3.2 indexer (``--kind attention``).
"""

from __future__ import annotations

import dataclasses

#: Token counts per rank the serving set covers: every M in 1..M_MAX.
M_MAX = 8192
#: The contiguous layout's alignment the serving stacks use (``get_mk_alignment_for_contiguous_layout()``).
ALIGNMENT = 128
MODELS = ("deepseek-v3",)

# DeepSeek-V3's dimensions (config.json of deepseek-ai/DeepSeek-V3).
_HIDDEN, _Q_LORA, _KV_LORA, _ROPE, _HEADS, _QK_HEAD, _V_HEAD, _NOPE = 7168, 1536, 512, 64, 128, 192, 128, 128
_DENSE_INTER, _MOE_INTER, _EXPERTS, _TOP_K = 18432, 2048, 256, 8


@dataclasses.dataclass(frozen=True)
class ServingProblem:
    """One weight of the model on one rank: ``kind`` (dense / contiguous / masked), ``(n, k)``, ``groups`` (local
    experts; 1 for dense), ``ms`` (the M values the calls can have: rows, m_sum or expected_m), ``what`` (a label)."""

    what: str
    kind: str
    n: int
    k: int
    groups: int
    ms: range


def problems(model: str, tp: int) -> list[ServingProblem]:
    """The GEMM problems of ``model`` on one of ``tp`` tensor-parallel ranks (module docstring).

    Raises:
        ValueError: an unknown model, or a ``tp`` that does not divide the sharded dimensions.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    # Every dimension tensor parallelism splits must split into whole 128-wide scale blocks.
    sharded = (_HEADS * _QK_HEAD, _HEADS * (_NOPE + _V_HEAD), _HEADS * _V_HEAD, _DENSE_INTER, _MOE_INTER)
    if tp <= 0 or _EXPERTS % tp or any(d % (128 * tp) for d in sharded):
        raise ValueError(f"tp must split DeepSeek-V3's sharded dimensions into multiples of 128 and its {_EXPERTS} "
                         f"experts evenly (1, 2, 4, 8 or 16), got {tp}")
    dense_ms = range(1, M_MAX + 1)
    dense = (("fused q_a + kv_a", _Q_LORA + _KV_LORA + _ROPE, _HIDDEN), ("q_b", _HEADS * _QK_HEAD // tp, _Q_LORA),
             ("kv_b", _HEADS * (_NOPE + _V_HEAD) // tp, _KV_LORA), ("o_proj", _HIDDEN, _HEADS * _V_HEAD // tp),
             ("dense gate + up", 2 * _DENSE_INTER // tp, _HIDDEN), ("dense down", _HIDDEN, _DENSE_INTER // tp),
             ("shared expert gate + up", 2 * _MOE_INTER // tp, _HIDDEN), ("shared expert down", _HIDDEN, _MOE_INTER // tp))
    out = [ServingProblem(what, "dense", n, k, 1, dense_ms) for what, n, k in dense]
    local = _EXPERTS // tp
    m_sum_max = _TOP_K * M_MAX + local * ALIGNMENT
    experts = (("experts w13", 2 * _MOE_INTER, _HIDDEN), ("experts w2", _HIDDEN, _MOE_INTER))
    for what, n, k in experts:
        out.append(ServingProblem(what, "contiguous", n, k, local, range(ALIGNMENT, m_sum_max + 1, ALIGNMENT)))
    for what, n, k in experts:
        out.append(ServingProblem(what, "masked", n, k, local, range(1, M_MAX + 1)))
    return out


def problem_targets(problem: ServingProblem, num_sms: int) -> list:
    """The :class:`~deep_fp8_gemm.runtime.audit.AuditTarget` of every distinct kernel the heuristic picks for
    ``problem`` over its M values for ``num_sms`` SMs, with the audit's SASS rules and K-loop gating (so ``audit``
    could check the same list). Picklable arguments: workers of ``precompile --jobs`` run it."""
    from ..config import get_config
    from ..runtime.audit import AuditTarget
    from .gemm import render_source
    from .targets import gated_kernel_names, sass_rules

    configs = {}
    for m in problem.ms:
        cfg = get_config(m, problem.n, problem.k, problem.groups, problem.kind, num_sms, contiguous_alignment=ALIGNMENT)
        configs.setdefault(cfg.kernel_name(), cfg)
    gated = gated_kernel_names(problem.kind)
    return [AuditTarget(kind=problem.kind, config=cfg.as_dict(), name=name, source=render_source(cfg),
                        gate_kloop=name in gated, **sass_rules(cfg)) for name, cfg in configs.items()]


#: M values per sweep task: each problem's range is cut into pieces of this many, so that a build box's
#: ``--jobs 16`` has more than the 12 problems to share out.
SWEEP_CHUNK = 2048


def serving_targets(model: str, tp: int, num_sms: int, map_fn=map) -> list:
    """Every distinct kernel of :func:`problems` (:func:`problem_targets` of each problem's M range in pieces of
    :data:`SWEEP_CHUNK`, run through ``map_fn``: a process pool's ``map`` sweeps them in parallel), first pick first,
    then the quantisers'."""
    from . import quant

    items = [dataclasses.replace(p, ms=p.ms[i:i + SWEEP_CHUNK]) for p in problems(model, tp)
             for i in range(0, len(p.ms), SWEEP_CHUNK)]
    targets, seen = [], set()
    for chunk in map_fn(problem_targets, items, [num_sms] * len(items)):
        for target in chunk:
            if target.name not in seen:
                seen.add(target.name)
                targets.append(target)
    return targets + quant.audit_targets()
