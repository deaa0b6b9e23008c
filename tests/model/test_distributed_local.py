"""The distributed layers' single-process pieces: wire format, SM reservation, argument checks, and a world of
one rank (gloo, in this process: no spawn) that must reproduce the single-GPU layer exactly."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import deep_fp8_gemm
from deep_fp8_gemm import utils
from deep_fp8_gemm.distributed import (
    ColumnParallelFP8Linear,
    EPDecodeBuffers,
    EPMoE,
    RowParallelFP8Linear,
    ep_moe_forward,
    ep_moe_forward_decode,
    reserve_sms,
)
from deep_fp8_gemm.distributed.wire import pack_rows, row_bytes, unpack_rows
from deep_fp8_gemm.moe import FP8MoE

H, I, E = 256, 128, 4


def test_wire_roundtrip_is_bitwise():
    x = torch.randn(5, H)
    x_fp8, scales = deep_fp8_gemm.per_token_cast_to_fp8(x)
    ids = torch.tensor([[0, -1], [3, 1], [-1, -1], [2, 2], [1, 0]], dtype=torch.int32)
    rows = pack_rows(x_fp8, scales, ids)
    assert rows.dtype == torch.uint8 and rows.shape == (5, row_bytes(H, 2)) == (5, H + 4 * 2 + 8)
    got_x, got_s, got_ids = unpack_rows(rows, H, 2)
    assert torch.equal(got_x.view(torch.uint8), x_fp8.view(torch.uint8))
    assert torch.equal(got_s, scales) and torch.equal(got_ids, ids)


def test_reserve_sms_restores_the_previous_setting():
    utils.reset_num_sms()
    total = deep_fp8_gemm.get_num_sms()
    with reserve_sms(20) as left:
        assert left == total - 20 == deep_fp8_gemm.get_num_sms()
    assert deep_fp8_gemm.get_num_sms() == total and utils.PROCESS_SETTINGS.num_sms_override is None
    deep_fp8_gemm.set_num_sms(100)
    try:
        with reserve_sms(0):
            assert deep_fp8_gemm.get_num_sms() == 100
        assert utils.PROCESS_SETTINGS.num_sms_override == 100
        with pytest.raises(ValueError, match="num_comm_sms"):
            with reserve_sms(100):
                pass
        with pytest.raises(TypeError, match="num_comm_sms"):
            with reserve_sms(1.5):
                pass
    finally:
        utils.reset_num_sms()


def test_needs_an_initialised_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    moe = FP8MoE(E, H, I)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ep_moe_forward(torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(1, 2, dtype=torch.int32),
                       torch.ones(1, 2), moe.w13, moe.w13_scale, moe.w2, moe.w2_scale)


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    init = tmp_path_factory.mktemp("dist") / "init"
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def _inputs(tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, H, generator=g).bfloat16()
    ids = torch.randint(-1, E, (tokens, 3), generator=g, dtype=torch.int64).to(torch.int32)
    return hidden, ids, torch.rand(tokens, 3, generator=g)


def test_world_of_one_equals_the_single_gpu_layer(world_of_one):
    g = torch.Generator().manual_seed(3)
    w13 = torch.randn(E, 2 * I, H, generator=g).bfloat16() / 16
    w2 = torch.randn(E, H, I, generator=g).bfloat16() / 11
    single, layer = FP8MoE.from_weights(w13, w2), EPMoE.from_experts(w13, w2)
    buffers = layer.decode_buffers(9, 3, max_rows_per_expert=27)
    for tokens in (9, 1, 0):
        hidden, ids, weights = _inputs(tokens, tokens)
        want = single(hidden, ids, weights)
        assert torch.equal(layer(hidden, ids, weights), want)
        assert torch.equal(layer.forward_decode(hidden, ids, weights, buffers, expected_m=8), want)
    local = EPMoE.from_experts(w13, w2, local=True)
    assert local.num_experts == E and torch.equal(local.experts.w2, single.w2)
    assert "local experts [0, 4)" in repr(layer)


def test_argument_errors_name_the_argument(world_of_one):
    moe = FP8MoE(E, H, I)
    weights = (moe.w13, moe.w13_scale, moe.w2, moe.w2_scale)
    hidden, ids, topk_weights = _inputs(4)
    with pytest.raises(ValueError, match="hidden must be"):
        ep_moe_forward(hidden[:, :128], ids, topk_weights, *weights)
    with pytest.raises(ValueError, match=r"global expert ids in \[0, world \* E_local = 4\)"):
        ep_moe_forward(hidden, ids + 5, topk_weights, *weights)
    with pytest.raises(TypeError, match="topk_ids"):
        ep_moe_forward(hidden, ids.float(), topk_weights, *weights)
    buffers = EPDecodeBuffers.allocate(2, H, 3, E)
    with pytest.raises(ValueError, match="max_tokens=2"):
        ep_moe_forward_decode(hidden, ids, topk_weights, *weights, buffers, expected_m=4)
    with pytest.raises(ValueError, match="allocated for"):
        ep_moe_forward_decode(hidden[:2, :], ids[:2, :2], topk_weights[:2, :2], *weights, buffers, expected_m=4)
    with pytest.raises(ValueError, match="expected_m"):
        ep_moe_forward_decode(hidden[:2], ids[:2], topk_weights[:2], *weights, buffers, expected_m=0)
    with pytest.raises(TypeError, match="buffers"):
        ep_moe_forward_decode(hidden[:2], ids[:2], topk_weights[:2], *weights, None, expected_m=4)
    with pytest.raises(ValueError, match="max_rows_per_expert"):
        EPDecodeBuffers.allocate(2, H, 3, E, max_rows_per_expert=0)
    with pytest.raises(ValueError, match="num_experts must be"):
        EPMoE(3 if dist.get_world_size() > 1 else 0, H, I)
    with pytest.raises(TypeError, match="linear must be"):
        ColumnParallelFP8Linear.from_linear(object())
    with pytest.raises(TypeError, match="reduce_dtype"):
        RowParallelFP8Linear(H, H, reduce_dtype=torch.float16)


def test_tensor_parallel_world_of_one(world_of_one):
    linear = torch.nn.Linear(H, 128).bfloat16()
    x = torch.randn(4, H).bfloat16()
    want = deep_fp8_gemm.nn.FP8Linear.from_linear(linear)(x)
    assert torch.equal(ColumnParallelFP8Linear.from_linear(linear, gather_output=True)(x), want)
    row = RowParallelFP8Linear.from_linear(linear)
    # One rank: bf16 GEMM output + bias in fp32, one rounding: the same as FP8Linear.
    assert torch.equal(row(x), want)
    fresh = RowParallelFP8Linear(H, 128, sequence_parallel=True)
    assert fresh(x).shape == (4, 128) and "sequence_parallel=True" in repr(fresh)


# --- sizes that must agree, casts: the tensor-parallel layers' checks run before any collective of their own ---
@pytest.fixture
def two_ranks(monkeypatch, world_of_one):
    """The tensor-parallel layers' view of a 2-rank group (their size checks use group_size / group_rank; the
    agreement collective runs on the real world of one)."""
    from deep_fp8_gemm.distributed import tensor_parallel

    monkeypatch.setattr(tensor_parallel, "group_size", lambda group=None: 2)
    monkeypatch.setattr(tensor_parallel, "group_rank", lambda group=None: 0)
    return tensor_parallel


def test_tensor_parallel_size_errors_quote_the_argument_and_world(two_ranks):
    """Was: ``ColumnParallelFP8Linear(128, 100)`` on 2 ranks said ``out_features=50``, the per-rank shard."""
    tp = two_ranks
    with pytest.raises(ValueError) as info:
        tp.ColumnParallelFP8Linear(128, 100)
    text = str(info.value)
    assert "out_features=100 over world=2 ranks gives 50 per rank" in text and "multiple of world * 8 = 16" in text
    with pytest.raises(ValueError, match=r"in_features=80 over world=2 ranks gives 40 per rank, which must be a "
                                         r"multiple of 16"):
        tp.RowParallelFP8Linear(80, 64)
    with pytest.raises(ValueError, match=r"out_features=101 world=2"):
        tp.ColumnParallelFP8Linear(128, 101)
    with pytest.raises(ValueError, match=r"out_features=100 over world=2"):
        tp.ColumnParallelFP8Linear.from_linear(torch.nn.Linear(128, 100))
    assert tp.ColumnParallelFP8Linear(128, 112).linear.out_features == 56


def test_tensor_parallel_layers_keep_their_fp8_state_under_casts(world_of_one):
    layer = RowParallelFP8Linear.from_linear(torch.nn.Linear(128, 64))
    layer.float()
    assert layer.bias.dtype == torch.bfloat16 and layer.linear.weight_fp8.dtype == torch.float8_e4m3fn
    col = ColumnParallelFP8Linear.from_linear(torch.nn.Linear(128, 64)).half()
    assert col.linear.weight_fp8.dtype == torch.float8_e4m3fn and col.linear.weight_scale.dtype == torch.float32
