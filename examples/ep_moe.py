"""Expert-parallel FP8 MoE over ``torch.distributed``: each rank owns a slice of the experts.

    torchrun --nproc-per-node 2 examples/ep_moe.py            # gloo on CPU, or NCCL on sm_90 GPUs
    torchrun --nproc-per-node 3 examples/ep_moe.py --tokens 64 --experts-per-rank 4

Every rank builds the same global expert weights and routing from a fixed seed (so the example needs no data
loading), keeps its own experts in an :class:`deep_fp8_gemm.distributed.EPMoE` (rank ``r`` owns experts
``[r*E_local, (r+1)*E_local)``), and runs its own tokens — a different count per rank, one rank's slots partly
dropped — through the prefill path (``forward``) and the CUDA-graph-friendly decode path (``forward_decode``).
Each rank then checks its rows against the single-process :class:`deep_fp8_gemm.moe.FP8MoE` over all ranks'
tokens with all experts (bit-identical expected) and prints the bytes it dispatched.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

from deep_fp8_gemm.distributed import EPMoE
from deep_fp8_gemm.distributed.wire import row_bytes
from deep_fp8_gemm.moe import FP8MoE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens on rank 0 (rank r has tokens + 3r)")
    parser.add_argument("--experts-per-rank", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--inter", type=int, default=128)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if use_cuda else torch.device("cpu")
    num_experts, top_k, hidden_size = args.experts_per_rank * world, args.top_k, args.hidden

    # The same global weights and tokens on every rank (CPU generator, fixed seed).
    g = torch.Generator().manual_seed(0)
    w13 = (torch.randn(num_experts, 2 * args.inter, hidden_size, generator=g) / hidden_size ** 0.5).bfloat16()
    w2 = (torch.randn(num_experts, hidden_size, args.inter, generator=g) / args.inter ** 0.5).bfloat16()
    tokens = [args.tokens + 3 * r for r in range(world)]
    hidden = torch.randn(sum(tokens), hidden_size, generator=g).bfloat16()
    logits = torch.randn(sum(tokens), num_experts, generator=g)
    topk_weights, topk_ids = logits.softmax(-1).topk(top_k, dim=-1)
    topk_ids = topk_ids.to(torch.int32)
    topk_ids[: tokens[0] // 4, -1] = -1  # some dropped slots (e.g. capacity limits)
    start = sum(tokens[:rank])
    mine = slice(start, start + tokens[rank])

    layer = EPMoE.from_experts(w13.to(device), w2.to(device))
    x, ids, weights = hidden[mine].to(device), topk_ids[mine].to(device), topk_weights[mine].to(device)
    t0 = time.perf_counter()
    out = layer(x, ids, weights)
    prefill_s = time.perf_counter() - t0
    buffers = layer.decode_buffers(max(tokens), top_k)
    expected_m = max(1, sum(tokens) * top_k // num_experts)
    out_decode = layer.forward_decode(x, ids, weights, buffers, expected_m)

    reference = FP8MoE.from_weights(w13.to(device), w2.to(device))(hidden.to(device), topk_ids.to(device),
                                                                    topk_weights.to(device))[mine]
    same = torch.equal(out, reference) and torch.equal(out_decode, reference)
    destinations = (topk_ids[mine].long().clamp(min=0) // args.experts_per_rank).masked_fill(topk_ids[mine] < 0, -1)
    pairs = sum(len(set(row) - {-1}) for row in destinations.tolist())
    slots = int((topk_ids[mine] >= 0).sum())
    dispatched = pairs * row_bytes(hidden_size, top_k)
    print(f"rank {rank}/{world} ({dist.get_backend()}): experts [{layer.expert_offset}, "
          f"{layer.expert_offset + layer.num_local_experts}), {tokens[rank]} tokens, {slots} routed slots; "
          f"dispatched {pairs} rows = {dispatched} B ({dispatched / max(pairs, 1):.0f} B/row vs "
          f"{2 * hidden_size} B in bf16), returned {slots * 2 * hidden_size} B; prefill {prefill_s * 1e3:.1f} ms; "
          f"prefill and decode bit-identical to the single-process layer: {same}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
