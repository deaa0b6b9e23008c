"""The expert-parallel layer on an sm_90 GPU: a one-rank NCCL world in this process (no spawn, no network).

Checks what the CPU tests cannot: the CUDA paths of ``ep_moe_forward`` / ``ep_moe_forward_decode`` (the
JIT kernels on strided views of the received rows) and that the decode path captures into a CUDA graph and
replays with new routing — which it can only do if nothing in it synchronises with the host.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import deep_fp8_gemm
from deep_fp8_gemm.distributed import EPDecodeBuffers, ep_moe_forward, ep_moe_forward_decode
from deep_fp8_gemm.moe import FP8MoE, fp8_moe_forward
from tests._gpu import requires_sm90

H, I, E, TOP_K, T = 512, 256, 8, 4, 48

pytestmark = [requires_sm90, pytest.mark.gpu]


@pytest.fixture(scope="module")
def nccl_world_of_one(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    init = tmp_path_factory.mktemp("nccl") / "init"
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def _weights():
    layer = FP8MoE(E, H, I, device="cuda")
    return layer.w13, layer.w13_scale, layer.w2, layer.w2_scale


def _routing(seed: int, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(T, H, device=device, generator=g).bfloat16()
    ids = torch.rand(T, E, device=device, generator=g).topk(TOP_K, dim=1).indices.to(torch.int32)
    ids[:5, 1] = -1
    return hidden, ids, torch.rand(T, TOP_K, device=device, generator=g)


def test_prefill_equals_the_single_gpu_layer(nccl_world_of_one):
    w = _weights()
    hidden, ids, weights = _routing(1)
    want = fp8_moe_forward(hidden, ids, weights, *w)
    # One rank: the same contiguous layout, the same GEMM configurations -> the same bits.
    assert torch.equal(ep_moe_forward(hidden, ids, weights, *w), want)


def test_decode_captures_in_a_cuda_graph(nccl_world_of_one):
    w = _weights()
    hidden, ids, weights = _routing(2)
    buffers = EPDecodeBuffers.allocate(T, H, TOP_K, E, device="cuda")
    expected_m = T * TOP_K // E
    eager = ep_moe_forward_decode(hidden, ids, weights, *w, buffers, expected_m)  # also compiles the kernels
    assert deep_fp8_gemm.calc_diff(eager, fp8_moe_forward(hidden, ids, weights, *w)) < 1e-6

    static = [t.clone() for t in (hidden, ids, weights)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ep_moe_forward_decode(*static, *w, buffers, expected_m)
    for seed in (3, 4):
        new = _routing(seed)
        for dst, src in zip(static, new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ep_moe_forward_decode(*new, *w, buffers, expected_m))
