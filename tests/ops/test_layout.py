"""MoE contiguous-layout builder and top-k routing (deep_fp8_gemm.layout) against plain Python loops."""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm.layout import build_contiguous_layout, max_m_sum_bound, route_topk


def _loop_layout(counts: list[int], alignment: int) -> tuple[list[int], list[int], list[int]]:
    """Reference: padded sizes, offsets and m_indices, one row at a time."""
    padded, offsets, m_indices = [], [0], []
    for e, c in enumerate(counts):
        size = -(-c // alignment) * alignment
        padded.append(size)
        offsets.append(offsets[-1] + size)
        m_indices += [e] * c + [-1] * (size - c)
    return padded, offsets, m_indices


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alignment", (1, 4, 128))
def test_layout_matches_loop(seed, alignment):
    g = torch.Generator().manual_seed(seed)
    num_experts = int(torch.randint(1, 12, (1,), generator=g))
    counts = torch.randint(0, 300, (num_experts,), generator=g)
    counts[torch.rand(num_experts, generator=g) < 0.3] = 0  # experts with no tokens
    layout = build_contiguous_layout(counts.to(torch.int32), alignment)
    padded, offsets, m_indices = _loop_layout(counts.tolist(), alignment)
    assert layout.padded_sizes.tolist() == padded
    assert layout.offsets.tolist() == offsets
    assert layout.m_sum == offsets[-1] and layout.m_sum % alignment == 0
    assert layout.m_indices.dtype == torch.int32 and layout.m_indices.tolist() == m_indices
    assert layout.num_experts == num_experts


def test_layout_docstring_example_and_edge_cases():
    layout = build_contiguous_layout(torch.tensor([2, 0, 5]), 4)
    assert layout.m_indices.tolist() == [0, 0, -1, -1, 2, 2, 2, 2, 2, -1, -1, -1]
    assert layout.offsets.tolist() == [0, 4, 4, 12]
    empty = build_contiguous_layout(torch.zeros(3, dtype=torch.int64))
    assert empty.m_sum == 0 and empty.m_indices.shape == (0,)
    exact = build_contiguous_layout(torch.tensor([128, 256]))
    assert exact.m_sum == 384 and (exact.m_indices >= 0).all()


def test_layout_sync_free_bound():
    counts = torch.tensor([3, 0, 130, 1])
    bound = max_m_sum_bound(int(counts.sum()), 4, 128)
    layout = build_contiguous_layout(counts, 128, max_m_sum=bound)
    exact = build_contiguous_layout(counts, 128)
    assert layout.m_sum == bound >= exact.m_sum
    assert layout.m_indices[: exact.m_sum].tolist() == exact.m_indices.tolist()
    assert (layout.m_indices[exact.m_sum :] == -1).all()
    with pytest.raises(RuntimeError):
        build_contiguous_layout(counts, 128, max_m_sum=128)  # below the padded total: device assert


def test_layout_errors():
    with pytest.raises(TypeError, match="tokens_per_expert must be a torch.Tensor"):
        build_contiguous_layout([1, 2])
    with pytest.raises(TypeError, match="integer tensor"):
        build_contiguous_layout(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="1-D"):
        build_contiguous_layout(torch.tensor([[1]]))
    with pytest.raises(ValueError, match="non-negative"):
        build_contiguous_layout(torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="alignment=0"):
        build_contiguous_layout(torch.tensor([1]), 0)
    with pytest.raises(ValueError, match="max_m_sum=100"):
        build_contiguous_layout(torch.tensor([1]), 128, max_m_sum=100)


def _loop_route(ids: list[list[int]], num_experts: int, alignment: int):
    """Reference routing: slots of each expert in (t, j) order, then the padded layout."""
    per_expert = [[] for _ in range(num_experts)]
    for t, row in enumerate(ids):
        for j, e in enumerate(row):
            if e >= 0:
                per_expert[e].append((t, j))
    counts = [len(p) for p in per_expert]
    _, offsets, m_indices = _loop_layout(counts, alignment)
    gather = [-1] * offsets[-1]
    scatter = [[-1] * len(row) for row in ids]
    for e, slots in enumerate(per_expert):
        for rank, (t, j) in enumerate(slots):
            gather[offsets[e] + rank] = t
            scatter[t][j] = offsets[e] + rank
    return m_indices, gather, scatter


@pytest.mark.parametrize("seed", range(5))
def test_route_topk_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    num_tokens, top_k, num_experts = int(torch.randint(1, 60, (1,), generator=g)), 3, 7
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(num_tokens)])
    ids[torch.rand(ids.shape, generator=g) < 0.25] = -1  # dropped slots
    ids[ids == 5] = 2  # expert 5 gets no tokens (duplicates within a row are allowed)
    routed = route_topk(ids, num_experts, alignment=8)
    m_indices, gather, scatter = _loop_route(ids.tolist(), num_experts, 8)
    assert routed.layout.m_indices.tolist() == m_indices
    assert routed.gather_index.tolist() == gather
    assert routed.scatter_index.tolist() == scatter
    # sync-free variant: same prefix, padding tail
    bound = max_m_sum_bound(ids.numel(), num_experts, 8)
    free = route_topk(ids, num_experts, alignment=8, max_m_sum=bound)
    assert free.layout.m_sum == bound
    assert free.gather_index[: len(gather)].tolist() == gather and (free.gather_index[len(gather) :] == -1).all()
    assert free.scatter_index.tolist() == scatter


def test_route_topk_edge_cases_and_errors():
    routed = route_topk(torch.empty(0, 8, dtype=torch.int64), 4)
    assert routed.layout.m_sum == 0 and routed.scatter_index.shape == (0, 8)
    all_dropped = route_topk(torch.full((3, 2), -1), 4)
    assert all_dropped.layout.m_sum == 0 and (all_dropped.scatter_index == -1).all()
    one = route_topk(torch.tensor([[3]], dtype=torch.int32), 4)
    assert one.layout.m_sum == 128 and one.scatter_index.tolist() == [[0]] and one.gather_index[0] == 0
    with pytest.raises(ValueError, match=r"-1 or in \[0, 4\)"):
        route_topk(torch.tensor([[4]]), 4)
    with pytest.raises(ValueError, match=r"-1 or in \[0, 4\)"):
        route_topk(torch.tensor([[-2]]), 4)
    with pytest.raises(TypeError, match="topk_ids.dtype"):
        route_topk(torch.tensor([[0.0]]), 4)
    with pytest.raises(ValueError, match="2-D"):
        route_topk(torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="num_experts"):
        route_topk(torch.tensor([[0]]), 0)


# Marked gpu so that the device check's `pytest -m gpu tests` runs it (unmarked, -m gpu deselected it).
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CPU/CUDA equality not checkable")
def test_route_topk_same_on_cuda():
    ids = torch.randint(-1, 16, (300, 8))
    cpu = route_topk(ids, 16)
    gpu = route_topk(ids.cuda(), 16)
    assert gpu.layout.m_indices.cpu().tolist() == cpu.layout.m_indices.tolist()
    assert gpu.gather_index.cpu().tolist() == cpu.gather_index.tolist()
    assert gpu.scatter_index.cpu().tolist() == cpu.scatter_index.tolist()
