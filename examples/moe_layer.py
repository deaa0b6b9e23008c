"""A DeepSeek-V3-shaped FP8 MoE layer next to the bf16 PyTorch layer it replaces.

    python examples/moe_layer.py                 # GPU if an sm_90 device is visible, else a reduced CPU run
    python examples/moe_layer.py --device cpu    # reduced shapes, runs anywhere in seconds
    python examples/moe_layer.py --tokens 1 128 4096

Full size (GPU): E = 256 experts, top-8 routing, H = 7168, I = 2048 (DeepSeek-V3's routed experts); the bf16
weights take 22.5 GB, their FP8 copies 11.3 GB. Reduced (CPU): E = 8, top-4, H = 256, I = 128, T = 32.

For each token count the script prints the accuracy of the FP8 layer against the bf16 layer (``calc_diff``,
float64; two chained FP8 GEMMs with requantised activations give ~2e-3 at the reduced size, against ~7e-4 for
a single FP8 GEMM) and, on a GPU, both layers' times (CUDA events, median of several runs after a warm-up; no
L2 flush, so small-T numbers are optimistic for both) and the FP8 layer's effective TFLOPS over the routed
(non-dropped) slots.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
import torch.nn.functional as F

import deep_fp8_gemm
from deep_fp8_gemm.moe import FP8MoE

FULL = dict(num_experts=256, top_k=8, hidden=7168, inter=2048, tokens=(1, 16, 128, 1024, 4096))
REDUCED = dict(num_experts=8, top_k=4, hidden=256, inter=128, tokens=(1, 32))


def per_expert_moe(hidden, topk_ids, topk_weights, num_experts, expert_ffn):
    """A per-expert loop MoE layer: ``expert_ffn(e, tokens) -> [len(tokens), H]`` runs expert ``e`` on the token
    indices routed to it; the results are weighted and summed in fp32 (bf16 result). Dropped slots (-1) are
    skipped. Shared by the bf16 layer below and ``bench/bench_moe.py``'s block-scaled ``torch._scaled_mm`` loop."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    flat = topk_ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts).tolist()
    start = int((flat < 0).sum())  # dropped slots (-1) sort first
    for e, count in enumerate(counts):
        if count == 0:
            continue
        slots = order[start : start + count]
        start += count
        tokens = slots // topk_ids.shape[1]
        y = expert_ffn(e, tokens)
        out.index_add_(0, tokens, y.float() * topk_weights.flatten()[slots, None])
    return out.to(torch.bfloat16)


def bf16_moe(hidden, topk_ids, topk_weights, w13, w2):
    """The bf16 PyTorch layer: per-expert matmuls on the routed tokens, fp32 weighted sum, bf16 result."""
    inter = w13.shape[1] // 2

    def expert_ffn(e, tokens):
        gate_up = hidden[tokens] @ w13[e].t()
        return (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t()

    return per_expert_moe(hidden, topk_ids, topk_weights, w13.shape[0], expert_ffn)


def route(num_tokens, num_experts, top_k, device, generator):
    logits = torch.randn(num_tokens, num_experts, generator=generator, device=device)
    weights, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    return ids, (weights / weights.sum(-1, keepdim=True)).float()


def time_ms(fn, repeats: int = 10) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--tokens", type=int, nargs="*", help="token counts to run (default depends on device)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    )
    device = torch.device("cuda" if use_cuda else "cpu")
    shape = FULL if use_cuda else REDUCED
    tokens = args.tokens or shape["tokens"]
    E, K, H, I = shape["num_experts"], shape["top_k"], shape["hidden"], shape["inter"]
    print(f"device={device} E={E} top_k={K} H={H} I={I}")

    generator = torch.Generator(device=device).manual_seed(args.seed)
    w13 = (torch.randn(E, 2 * I, H, generator=generator, device=device) / math.sqrt(H)).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=generator, device=device) / math.sqrt(I)).to(torch.bfloat16)
    layer = FP8MoE.from_weights(w13, w2)  # quantised once, 128x128 blocks per expert

    print(f"{'T':>6} {'calc_diff':>10} {'fp8 ms':>9} {'bf16 ms':>9} {'speed-up':>8} {'fp8 TFLOPS':>10}")
    for num_tokens in tokens:
        hidden = torch.randn(num_tokens, H, generator=generator, device=device).to(torch.bfloat16)
        ids, weights = route(num_tokens, E, K, device, generator)
        fp8_out = layer(hidden, ids, weights)
        bf16_out = bf16_moe(hidden, ids, weights, w13, w2)
        diff = deep_fp8_gemm.calc_diff(fp8_out, bf16_out)
        if use_cuda:
            fp8_ms = time_ms(lambda: layer(hidden, ids, weights))
            bf16_ms = time_ms(lambda: bf16_moe(hidden, ids, weights, w13, w2))
            flops = 2 * int((ids >= 0).sum()) * (2 * I * H + H * I)
            print(f"{num_tokens:>6} {diff:>10.2e} {fp8_ms:>9.3f} {bf16_ms:>9.3f} {bf16_ms / fp8_ms:>7.2f}x "
                  f"{flops / fp8_ms / 1e9:>10.1f}")
        else:
            print(f"{num_tokens:>6} {diff:>10.2e} {'-':>9} {'-':>9} {'-':>8} {'-':>10}")


if __name__ == "__main__":
    main()
