"""Expert-parallel MoE and tensor-parallel FP8 linears on gloo worlds of 2 and 3 CPU processes.

Each spawned world runs every check (spawning costs seconds, checks milliseconds); every rank builds the same
global weights and tokens from fixed seeds and compares its part of the distributed result with the
single-process layer's result on all tokens: bit-identical for the MoE paths and the column-parallel linear,
within the bf16 rounding of the partial sums for the row-parallel one (see each check).
"""

from __future__ import annotations

import pytest
import torch

from tests._dist import WorldError, WorldTimeout, run_world

H, I, E_LOCAL, TOP_K = 256, 128, 2, 3


# --- shared data (identical on every rank: CPU generators with fixed seeds) ---------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _expert_weights(num_experts: int):
    g = _gen(1234)
    w13 = torch.randn(num_experts, 2 * I, H, generator=g).div_(H ** 0.5).bfloat16()
    w2 = torch.randn(num_experts, H, I, generator=g).div_(I ** 0.5).bfloat16()
    return w13, w2


def _routing(case: str, tokens: list[int], num_experts: int, seed: int):
    """Global hidden [T, H], topk_ids [T, TOP_K], topk_weights for ``case``; ``tokens`` = tokens per rank."""
    g = _gen(seed)
    total = sum(tokens)
    hidden = torch.randn(total, H, generator=g).bfloat16()
    scores = torch.rand(total, num_experts, generator=g)
    if case == "one_rank":  # every slot to rank 1's experts (two slots of a token share an expert)
        ids = torch.randint(E_LOCAL, 2 * E_LOCAL, (total, TOP_K), generator=g)
    elif case == "empty_experts":  # only experts 0 and 3: the others get no rows at all
        ids = torch.tensor([0, 3])[torch.randint(0, 2, (total, TOP_K), generator=g)]
    else:
        ids = scores.topk(TOP_K, dim=1).indices
    if case == "dropped":
        ids = torch.where(torch.rand(total, TOP_K, generator=g) < 0.4, torch.full_like(ids, -1), ids)
        if total:
            ids[0] = -1  # a token with every slot dropped
    weights = torch.rand(total, TOP_K, generator=g)
    return hidden, ids.to(torch.int32), weights


CASES = [("balanced", None), ("one_rank", None), ("no_tokens", 0), ("dropped", None), ("empty_experts", None)]


def _tokens(world: int, case: str) -> list[int]:
    tokens = [5 + 3 * r for r in range(world)]
    if case == "no_tokens":
        tokens[1] = 0
    return tokens


# --- rank workers ---------------------------------------------------------------------------------------------
def _moe_worker(rank: int, world: int) -> list[str]:
    from deep_fp8_gemm.distributed import EPMoE, ep_moe_forward
    from deep_fp8_gemm.moe import FP8MoE

    num_experts = E_LOCAL * world
    w13, w2 = _expert_weights(num_experts)
    full = FP8MoE.from_weights(w13, w2)
    local = EPMoE.from_experts(w13, w2)
    lo, hi = rank * E_LOCAL, (rank + 1) * E_LOCAL
    max_tokens = max(max(_tokens(world, c)) for c, _ in CASES)
    # "one_rank" repeats experts within a token: up to max_tokens * TOP_K slots per expert and source rank.
    buffers = local.decode_buffers(max_tokens, TOP_K, max_rows_per_expert=world * max_tokens * TOP_K)
    done = []
    for seed, (case, _) in enumerate(CASES):
        tokens = _tokens(world, case)
        hidden, ids, weights = _routing(case, tokens, num_experts, seed)
        start = sum(tokens[:rank])
        mine = slice(start, start + tokens[rank])
        expected = full(hidden, ids, weights)[mine]
        got = ep_moe_forward(hidden[mine], ids[mine], weights[mine], full.w13[lo:hi], full.w13_scale[lo:hi],
                             full.w2[lo:hi], full.w2_scale[lo:hi])
        assert got.dtype == torch.bfloat16 and got.shape == (tokens[rank], H)
        assert torch.equal(got, expected), f"{case}: ep_moe_forward differs, max {(got.float() - expected.float()).abs().max()}"
        got = local(hidden[mine], ids[mine], weights[mine])
        assert torch.equal(got, expected), f"{case}: EPMoE differs"
        for _ in range(2):  # the static buffers are reused: a second call must not see the first one's rows
            got = local.forward_decode(hidden[mine], ids[mine], weights[mine], buffers, expected_m=4)
            assert torch.equal(got, expected), f"{case}: decode differs"
        done.append(case)

    # Default buffers (m_max = world * max_tokens) overflow when every slot of every token goes to expert 2
    # (rank 1): rank 1 raises after the last collective, the others finish normally.
    small = local.decode_buffers(max_tokens, TOP_K)
    tokens = _tokens(world, "balanced")
    hidden, _, weights = _routing("balanced", tokens, num_experts, 99)
    ids = torch.full((sum(tokens), TOP_K), 2, dtype=torch.int32)
    start = sum(tokens[:rank])
    mine = slice(start, start + tokens[rank])
    if rank == 1:
        with pytest.raises(RuntimeError, match="max_rows_per_expert"):
            local.forward_decode(hidden[mine], ids[mine], weights[mine], small, expected_m=4)
    else:
        local.forward_decode(hidden[mine], ids[mine], weights[mine], small, expected_m=4)
    done.append("overflow")
    return done


def test_ep_moe_two_ranks():
    assert run_world(2, _moe_worker) == [[c for c, _ in CASES] + ["overflow"]] * 2
