"""Expert-parallel MoE and tensor-parallel FP8 linears on gloo worlds of 2 and 3 CPU processes.

Each spawned world runs every check (spawning costs seconds, checks milliseconds); every rank builds the same
global weights and tokens from fixed seeds and compares its part of the distributed result with the
single-process layer's result on all tokens: bit-identical for the MoE paths and the column-parallel linear,
within the bf16 rounding of the partial sums for the row-parallel one (see each check).
"""

from __future__ import annotations

import time

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


CASES = ["balanced", "one_rank", "no_tokens", "dropped", "empty_experts", "all_empty"]


def _tokens(world: int, case: str) -> list[int]:
    tokens = [5 + 3 * r for r in range(world)]
    if case == "no_tokens":
        tokens[1] = 0
    if case == "all_empty":  # no rank has a token: every collective moves nothing, every rank still calls
        tokens = [0] * world
    return tokens


# --- rank workers ---------------------------------------------------------------------------------------------
def _moe_worker(rank: int, world: int) -> list[str]:
    from deep_fp8_gemm.distributed import EPMoE, ep_moe_forward
    from deep_fp8_gemm.moe import FP8MoE, fp8_moe_forward

    num_experts = E_LOCAL * world
    w13, w2 = _expert_weights(num_experts)
    full = FP8MoE.from_weights(w13, w2)
    local = EPMoE.from_experts(w13, w2)
    lo, hi = rank * E_LOCAL, (rank + 1) * E_LOCAL
    max_tokens = max(max(_tokens(world, c)) for c in CASES)
    # "one_rank" repeats experts within a token: up to max_tokens * TOP_K slots per expert and source rank.
    buffers = local.decode_buffers(max_tokens, TOP_K, max_rows_per_expert=world * max_tokens * TOP_K)
    done = []
    for seed, case in enumerate(CASES):
        tokens = _tokens(world, case)
        hidden, ids, weights = _routing(case, tokens, num_experts, seed)
        start = sum(tokens[:rank])
        mine = slice(start, start + tokens[rank])
        expected = full(hidden, ids, weights)[mine]  # the fused up-projection (issue 27): FP8MoE's default
        shard = (full.w13[lo:hi], full.w13_scale[lo:hi], full.w2[lo:hi], full.w2_scale[lo:hi])
        # the interleaved layout is per expert: a slice of experts is this rank's interleaved weights
        got = ep_moe_forward(hidden[mine], ids[mine], weights[mine], *shard,
                             w13_swiglu=full.swiglu_pair.experts(slice(lo, hi)))
        assert got.dtype == torch.bfloat16 and got.shape == (tokens[rank], H)
        assert torch.equal(got, expected), f"{case}: ep_moe_forward differs, max |error| " \
            f"{(got.float() - expected.float()).abs().max()}"
        unfused = fp8_moe_forward(hidden, ids, weights, full.w13, full.w13_scale, full.w2, full.w2_scale)[mine]
        assert torch.equal(ep_moe_forward(hidden[mine], ids[mine], weights[mine], *shard), unfused), \
            f"{case}: unfused ep_moe_forward differs"
        got = local(hidden[mine], ids[mine], weights[mine])
        assert torch.equal(got, expected), f"{case}: EPMoE differs"
        for _ in range(2):  # the static buffers are reused: a second call must not see the first one's rows
            got = local.forward_decode(hidden[mine], ids[mine], weights[mine], buffers, expected_m=4)
            assert torch.equal(got, expected), f"{case}: decode differs"
        done.append(case)

    # Default buffers (m_max = world * max_tokens) overflow when every slot of every token goes to expert 2
    # (rank 1): the overflow flag rides in rank 1's status rows of the return exchange, so every rank raises the
    # same RuntimeError after the last collective (rank 0 used to return a wrong result: calc_diff 0.99).
    small = local.decode_buffers(max_tokens, TOP_K)
    tokens = _tokens(world, "balanced")
    hidden, _, weights = _routing("balanced", tokens, num_experts, 99)
    ids = torch.full((sum(tokens), TOP_K), 2, dtype=torch.int32)
    start = sum(tokens[:rank])
    mine = slice(start, start + tokens[rank])
    with pytest.raises(RuntimeError, match="a local expert of rank 1 received .* slots, more than buffers.m_max"):
        local.forward_decode(hidden[mine], ids[mine], weights[mine], small, expected_m=4)
    assert small.status[1].tolist() == [4, sum(tokens) * TOP_K] and small.status[0, 0] == 0
    done.append("overflow")

    # Ranks that disagree on top_k: every rank raises after the header exchange (none waits for the payload).
    k = TOP_K if rank == 0 else TOP_K - 1
    with pytest.raises(ValueError, match="disagree on"):
        local(hidden[mine], ids[mine, :k], weights[mine, :k])
    done.append("peer_mismatch")
    return done


def _agreement_worker(rank: int, world: int) -> dict[str, str]:
    """Every way one rank can differ from the others makes every rank raise — the same error where the ranks see
    the same facts — and leaves the world usable: the last checks are good calls, bit for bit as before. Returns
    each case's message on this rank (the parent compares them across ranks)."""
    from deep_fp8_gemm.distributed import ColumnParallelFP8Linear, EPDecodeBuffers, EPMoE, ep_moe_forward
    from deep_fp8_gemm.moe import FP8MoE

    num_experts = E_LOCAL * world
    w13, w2 = _expert_weights(num_experts)
    full = FP8MoE.from_weights(w13, w2)
    lo, hi = rank * E_LOCAL, (rank + 1) * E_LOCAL
    mine_w = (full.w13[lo:hi], full.w13_scale[lo:hi], full.w2[lo:hi], full.w2_scale[lo:hi])
    tokens = _tokens(world, "balanced")
    hidden, ids, weights = _routing("balanced", tokens, num_experts, 5)
    start = sum(tokens[:rank])
    mine = slice(start, start + tokens[rank])
    expected = full(hidden, ids, weights)[mine]
    messages: dict[str, str] = {}

    def raises(case: str, exc, pattern: str, fn) -> None:
        with pytest.raises(exc, match=pattern) as info:
            fn()
        messages[case] = str(info.value)

    # Prefill, ranks disagreeing on the local expert count (2 vs 3): gloo used to abort the other process
    # ("Received data size doesn't match expected size"); the header is fixed-size now.
    if rank == 0:
        wrong = FP8MoE.from_weights(*_expert_weights(E_LOCAL + 1))
        args = (wrong.w13, wrong.w13_scale, wrong.w2, wrong.w2_scale)
    else:
        args = mine_w
    raises("prefill_e_local", ValueError, r"disagree on \(H, top_k, E_local\)",
           lambda: ep_moe_forward(hidden[mine], ids[mine], weights[mine], *args))
    # Prefill, one rank's arguments rejected (fp32 hidden): that rank's TypeError, the others' naming it.
    bad_hidden = hidden[mine].float() if rank == 1 else hidden[mine]
    raises("prefill_bad_arg", TypeError, "hidden must have dtype" if rank == 1 else "rank 1 of the group rejected",
           lambda: ep_moe_forward(bad_hidden, ids[mine], weights[mine], *mine_w))
    # Layer construction: disagreeing sizes, one rank's bad size.
    raises("epmoe_sizes", ValueError, r"EPMoE: the ranks of the group disagree on num_experts",
           lambda: EPMoE(num_experts + (world if rank == 0 else 0), H, I))
    raises("epmoe_bad_arg", ValueError, "hidden_size" if rank == 1 else "rank 1 of the group rejected",
           lambda: EPMoE(num_experts, H + (8 if rank == 1 else 0), I))
    raises("tp_sizes", ValueError, "ColumnParallelFP8Linear: the ranks of the group disagree",
           lambda: ColumnParallelFP8Linear(H, 128 * world * (2 if rank == 0 else 1)))
    # Decode buffers: disagreeing top_k / E_local.
    raises("buffers_top_k", ValueError, "EPDecodeBuffers.allocate: the ranks of the group disagree",
           lambda: EPDecodeBuffers.allocate(8, H, TOP_K - (rank == 0), E_LOCAL))
    raises("buffers_e_local", ValueError, "EPDecodeBuffers.allocate: the ranks of the group disagree",
           lambda: EPDecodeBuffers.allocate(8, H, TOP_K, E_LOCAL + (rank == 1)))
    # Decode calls: one rank's arguments rejected (more tokens than the buffers hold / weights of another E_local).
    layer = EPMoE.from_experts(w13, w2)
    buffers = layer.decode_buffers(max(tokens), TOP_K, max_rows_per_expert=world * max(tokens) * TOP_K)
    big = torch.cat([hidden[mine], hidden[mine]]) if rank == 1 else hidden[mine]
    big_ids = torch.cat([ids[mine], ids[mine]]) if rank == 1 else ids[mine]
    big_w = torch.cat([weights[mine], weights[mine]]) if rank == 1 else weights[mine]
    raises("decode_bad_arg", ValueError, "more than buffers.max_tokens" if rank == 1 else "rank 1 of the group "
           "rejected", lambda: layer.forward_decode(big, big_ids, big_w, buffers, expected_m=4))
    from deep_fp8_gemm.distributed import ep_moe_forward_decode

    raises("decode_weights", ValueError, "buffers were allocated for" if rank == 0 else "rank 0 of the group rejected",
           lambda: ep_moe_forward_decode(hidden[mine], ids[mine], weights[mine], *(args if rank == 0 else mine_w),
                                         buffers, 4))
    # The world is still in step: good calls after all of that, bit for bit (with the fused up-projection, FP8MoE's
    # and EPMoE's default).
    fused = full.swiglu_pair.experts(slice(lo, hi))
    assert torch.equal(ep_moe_forward(hidden[mine], ids[mine], weights[mine], *mine_w, w13_swiglu=fused), expected)
    assert torch.equal(layer(hidden[mine], ids[mine], weights[mine]), expected)
    assert torch.equal(layer.forward_decode(hidden[mine], ids[mine], weights[mine], buffers, expected_m=4), expected)
    return messages


#: Cases in which every rank sees the same facts, so every rank must raise the very same message.
SAME_MESSAGE = ("prefill_e_local", "epmoe_sizes", "tp_sizes", "buffers_top_k", "buffers_e_local")


def _tp_worker(rank: int, world: int) -> list[str]:
    from torch import nn

    from deep_fp8_gemm import calc_diff
    from deep_fp8_gemm.distributed import ColumnParallelFP8Linear, RowParallelFP8Linear
    from deep_fp8_gemm.nn import FP8Linear

    g = _gen(77)
    tokens = 4 * world  # divisible by world: sequence parallelism splits the tokens
    share = slice(rank * 4, rank * 4 + 4)
    done = []

    # Column-parallel: 128 output features per rank (whole 128x128 scale blocks) -> bit-identical.
    full = nn.Linear(H, 128 * world).bfloat16()
    with torch.no_grad():
        full.weight.copy_(torch.randn(full.weight.shape, generator=g) / H ** 0.5)
        full.bias.copy_(torch.randn(full.bias.shape, generator=g))
    x = torch.randn(tokens, 2, H, generator=g).bfloat16()  # leading dims [T, 2]
    expected = FP8Linear.from_linear(full)(x)
    cols = slice(rank * 128, (rank + 1) * 128)
    assert torch.equal(ColumnParallelFP8Linear.from_linear(full)(x), expected[..., cols])
    assert torch.equal(ColumnParallelFP8Linear.from_linear(full, gather_output=True)(x), expected)
    seq = ColumnParallelFP8Linear.from_linear(full, gather_output=True, sequence_parallel=True)
    assert torch.equal(seq(x[share]), expected)
    done.append("column")

    # Row-parallel: 128 input features per rank; partials rounded to bf16 by each GEMM, summed in fp32.
    full = nn.Linear(128 * world, H).bfloat16()
    with torch.no_grad():
        full.weight.copy_(torch.randn(full.weight.shape, generator=g) / (128 * world) ** 0.5)
        full.bias.copy_(torch.randn(full.bias.shape, generator=g))
    x = torch.randn(tokens, 128 * world, generator=g).bfloat16()
    single = FP8Linear.from_linear(full)(x)
    partials = []
    for r in range(world):  # the sharded math, evaluated in one process (float64 sum of the bf16 partials)
        shard = nn.Linear(128, H, bias=False).bfloat16()
        with torch.no_grad():
            shard.weight.copy_(full.weight[:, r * 128:(r + 1) * 128])
        partials.append(FP8Linear.from_linear(shard)(x[:, r * 128:(r + 1) * 128]).double())
    exact = sum(partials) + full.bias.double()

    magnitude = sum(p.abs() for p in partials)

    def check(got, rows, reduce_bf16=False):
        want = exact[rows]
        # fp32 sum of the `world` bf16 partials + bias, one bf16 rounding: within 1 bf16 ulp (2^-8 relative) of
        # the float64 sum. A bf16 reduction rounds each partial sum (relative to the partials, which the bias
        # may then cancel): one ulp of the partials' magnitude per step.
        tol = 2.0 ** -8 * want.abs() + 1e-6
        if reduce_bf16:
            tol = tol + world * 2.0 ** -8 * magnitude[rows]
        assert got.shape == want.shape and bool(((got.double() - want).abs() <= tol).all()), \
            f"row-parallel off by {((got.double() - want).abs() / want.abs().clamp_min(1e-3)).max():.2e} relative"
        assert calc_diff(got, single[rows]) < 1e-4

    mine = slice(rank * 128, (rank + 1) * 128)
    check(RowParallelFP8Linear.from_linear(full)(x[:, mine]), slice(None))
    check(RowParallelFP8Linear.from_linear(full, input_is_parallel=False)(x), slice(None))
    check(RowParallelFP8Linear.from_linear(full, sequence_parallel=True)(x[:, mine]), share)
    check(RowParallelFP8Linear.from_linear(full, reduce_dtype=torch.bfloat16)(x[:, mine]), slice(None), True)
    # Freshly initialised layers: the bias is broadcast, so every rank holds rank 0's.
    layer = RowParallelFP8Linear(128 * world, H, group=None)
    bias = layer.bias.clone()
    import torch.distributed as dist

    dist.broadcast(bias, src=0)
    assert torch.equal(bias, layer.bias)
    done.append("row")
    return done


def _all_worker(rank: int, world: int) -> tuple[list[str], dict[str, str]]:
    return _moe_worker(rank, world) + _tp_worker(rank, world), _agreement_worker(rank, world)


ALL = [*CASES, "overflow", "peer_mismatch", "column", "row"]


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_world(world):
    """ep_moe_forward, EPMoE (prefill and decode) and both TP linears on a spawned gloo world; then every way a
    rank can disagree with its peers or fail its checks (_agreement_worker), each raising on every rank."""
    results = run_world(world, _all_worker, timeout=300)
    assert [done for done, _ in results] == [ALL] * world
    messages = [m for _, m in results]
    for case in SAME_MESSAGE:
        assert len({m[case] for m in messages}) == 1, (case, [m[case] for m in messages])
    assert set(messages[0]) == set(messages[-1]) and len(messages[0]) == 9


# --- a failing or hanging rank ends the test in bounded time ---------------------------------------------------
def _raising_worker(rank: int, world: int) -> None:
    from deep_fp8_gemm.distributed import ep_moe_forward
    from deep_fp8_gemm.moe import FP8MoE

    experts = FP8MoE(E_LOCAL, H, I)
    hidden = torch.zeros((3, H), dtype=torch.bfloat16)
    ids = torch.zeros((3, TOP_K), dtype=torch.int32)
    if rank == 1:
        hidden = hidden[:, :128]  # rank 1's ValueError travels in the header exchange: both ranks raise it
    ep_moe_forward(hidden, ids, torch.ones(3, TOP_K), experts.w13, experts.w13_scale, experts.w2, experts.w2_scale)


def _hanging_worker(rank: int, world: int) -> None:
    import time

    import torch.distributed as dist

    if rank == 1:
        time.sleep(60)  # never joins the collective (bounded even if this test's process is killed)
    dist.all_reduce(torch.ones(1))


def test_raising_rank_fails_fast():
    start = time.monotonic()
    with pytest.raises(WorldError, match="hidden must be"):
        run_world(2, _raising_worker, timeout=120)
    assert time.monotonic() - start < 60  # terminated when rank 1 exited, not at gloo's timeout


def test_hanging_rank_times_out():
    start = time.monotonic()
    with pytest.raises(WorldTimeout, match="terminated"):
        run_world(2, _hanging_worker, timeout=8)
    assert time.monotonic() - start < 30
