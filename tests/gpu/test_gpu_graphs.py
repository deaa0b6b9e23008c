"""Every public op captured in a CUDA graph and replayed with new contents in the same buffers (sm_90 only).

Each test runs the op once eagerly (compile, load, plan, encode the tensor maps), captures one call, then
writes new values into every input buffer (new activations, new scales, new ``m_indices`` / ``masked_m`` /
counts) and poisons the outputs, replays, and compares with the reference computed from the new contents on
the CPU. A graph that baked in anything read on the host at capture time (a count, a pointer of a temporary,
a tensor map of another buffer) fails here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deep_fp8_gemm as dfg
from deep_fp8_gemm import calc_diff, quant, reference
from deep_fp8_gemm.moe import fp8_moe_forward_masked, silu_mul_quant

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn


def _activations(shape, k, seed):
    torch.manual_seed(seed)
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(*shape, k, device="cuda").reshape(-1, k))
    return a.view(*shape, k), sa.reshape(*shape, -1)


def _weights(groups, n, k, seed):
    torch.manual_seed(seed)
    w = torch.randn(groups, n, k, device="cuda")
    pairs = [dfg.per_block_cast_to_fp8(w[g]) for g in range(groups)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _refill(dst: torch.Tensor, src: torch.Tensor) -> None:
    """New contents, same buffer (and same strides: copy_ keeps dst's layout)."""
    dst.copy_(src)


def _capture(fn):
    fn()  # compile + load + plan outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def test_dense_graph_replays_new_contents():
    m, n, k = 64, 2112, 7168
    a, sa = _activations((m,), k, seed=1)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    b, sb = _weights(1, n, k, seed=2)
    b, sb = b[0], sb[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    graph, _ = _capture(lambda: dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out))
    new_a, new_sa = _activations((m,), k, seed=3)
    new_b, new_sb = _weights(1, n, k, seed=4)
    _refill(a, new_a), _refill(sa, new_sa), _refill(b, new_b[0]), _refill(sb, new_sb[0])
    out.fill_(float("nan"))
    graph.replay()
    ref = torch.empty(m, n, dtype=torch.bfloat16)
    reference.gemm_fp8_fp8_bf16_nt((a.cpu(), sa.cpu()), (b.cpu(), sb.cpu()), ref)
    torch.cuda.synchronize()
    assert calc_diff(out.cpu(), ref) < 1e-3


def test_prepared_gemm_graph_replays_new_contents():
    m, n, k = 32, 576, 7168
    a, sa = _activations((m,), k, seed=5)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    b, sb = _weights(1, n, k, seed=6)
    b, sb = b[0], sb[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    call = dfg.prepare_gemm("dense", (a, sa), (b, sb), out)
    graph, _ = _capture(lambda: call((a, sa), (b, sb), out))
    new_a, new_sa = _activations((m,), k, seed=7)
    _refill(a, new_a), _refill(sa, new_sa)
    out.fill_(float("nan"))
    graph.replay()
    ref = torch.empty(m, n, dtype=torch.bfloat16)
    reference.gemm_fp8_fp8_bf16_nt((a.cpu(), sa.cpu()), (b.cpu(), sb.cpu()), ref)
    torch.cuda.synchronize()
    assert calc_diff(out.cpu(), ref) < 1e-3


def test_contiguous_graph_replays_new_contents_and_m_indices():
    groups, n, k = 4, 4096, 7168
    m_sum = 4 * 128
    a, sa = _activations((m_sum,), k, seed=8)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    b, sb = _weights(groups, n, k, seed=9)
    m_indices = torch.arange(m_sum, dtype=torch.int32, device="cuda") // 128
    out = torch.empty(m_sum, n, dtype=torch.bfloat16, device="cuda")
    graph, _ = _capture(lambda: dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), out, m_indices))
    new_a, new_sa = _activations((m_sum,), k, seed=10)
    _refill(a, new_a), _refill(sa, new_sa)
    # New routing: experts 3, 3, -1 (padding block), 0.
    blocks = torch.tensor([3, 3, -1, 0], dtype=torch.int32, device="cuda")
    _refill(m_indices, blocks.repeat_interleave(128))
    out.fill_(float("nan"))
    graph.replay()
    ref = torch.empty(m_sum, n, dtype=torch.bfloat16)
    cpu_indices = m_indices.cpu()
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a.cpu(), sa.cpu()), (b.cpu(), sb.cpu()), ref, cpu_indices)
    torch.cuda.synchronize()
    valid = cpu_indices >= 0
    assert calc_diff(out.cpu()[valid], ref[valid]) < 1e-3


def test_masked_graph_replays_new_contents_and_masked_m():
    groups, m_max, n, k = 8, 64, 7168, 2048
    a, sa = _activations((groups, m_max), k, seed=11)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    b, sb = _weights(groups, n, k, seed=12)
    masked_m = torch.full((groups,), 16, dtype=torch.int32, device="cuda")
    out = torch.empty(groups, m_max, n, dtype=torch.bfloat16, device="cuda")
    graph, _ = _capture(lambda: dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sa), (b, sb), out, masked_m, 16))
    new_a, new_sa = _activations((groups, m_max), k, seed=13)
    _refill(a, new_a), _refill(sa, new_sa)
    _refill(masked_m, torch.tensor([64, 0, 1, 33, 17, 64, 2, 50], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    ref = torch.empty(groups, m_max, n, dtype=torch.bfloat16)
    counts = masked_m.cpu()
    reference.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a.cpu(), sa.cpu()), (b.cpu(), sb.cpu()), ref, counts, 16)
    torch.cuda.synchronize()
    got = out.cpu()
    for g, rows in enumerate(counts.tolist()):
        if rows:
            assert not got[g, :rows].isnan().any(), f"group {g}: rows < masked_m not written"
            assert calc_diff(got[g, :rows], ref[g, :rows]) < 1e-3, f"group {g}"


@pytest.mark.parametrize("name", ["per_token", "per_block", "silu_mul_quant"])
def test_quantiser_graph_replays_new_contents(name):
    fn = {"per_token": dfg.per_token_cast_to_fp8, "per_block": dfg.per_block_cast_to_fp8,
          "silu_mul_quant": silu_mul_quant}[name]
    x = torch.randn(96, 1024, dtype=torch.bfloat16, device="cuda")
    graph, (q, s) = _capture(lambda: fn(x))
    _refill(x, torch.randn_like(x) * 3)
    q.view(torch.uint8).fill_(0), s.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    xc = x.cpu().float()
    if name == "per_token":
        ref_q, ref_s = quant.per_token_cast_to_fp8_torch(xc)
    elif name == "per_block":
        ref_q, ref_s = quant.per_block_cast_to_fp8_torch(xc)
    else:
        ref_q, ref_s = quant.per_token_cast_to_fp8_torch(F.silu(xc[:, :512]) * xc[:, 512:])
    # Fused kernels equal the torch definition bit for bit, SiLU up to the last bit of expf.
    assert torch.allclose(s.cpu(), ref_s, rtol=1e-6, atol=0)
    assert calc_diff(q.cpu().float(), ref_q.float()) < 1e-4


def test_moe_forward_masked_graph_replays_new_tokens_and_counts():
    experts, m_max, hidden, inter = 4, 32, 1024, 512
    torch.manual_seed(14)
    w13, w13_scale = _weights(experts, 2 * inter, hidden, seed=15)
    w2, w2_scale = _weights(experts, hidden, inter, seed=16)
    tokens = torch.randn(experts, m_max, hidden, dtype=torch.bfloat16, device="cuda")
    counts = torch.tensor([32, 5, 0, 17], dtype=torch.int32, device="cuda")
    graph, out = _capture(lambda: fp8_moe_forward_masked(tokens, counts, w13, w13_scale, w2, w2_scale,
                                                         expected_m=16))
    _refill(tokens, torch.randn_like(tokens))
    _refill(counts, torch.tensor([3, 32, 9, 0], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    expected = fp8_moe_forward_masked(tokens.cpu(), counts.cpu(), w13.cpu(), w13_scale.cpu(), w2.cpu(),
                                      w2_scale.cpu(), expected_m=16)
    got = out.cpu()
    for e, c in enumerate(counts.tolist()):
        if c:
            assert calc_diff(got[e, :c], expected[e, :c]) < 1e-4, f"expert {e}"
