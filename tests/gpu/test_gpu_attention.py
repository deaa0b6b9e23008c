"""The indexer's MQA logits on an sm_90 device (issue 44; marked ``gpu``: skipped, with the reason, anywhere else),
and, on the CPU, the legality of every case they launch.

On the GPU: the dense and paged kernels against the exact float64 reference (the CPU path) on DeepSeek-V3.2's
indexer shapes (H 64, D 128) and the reference test's SM90 variants, the written windows' values (the reference's
metric: calc_diff of the masked logits < 1e-5 against the float64 reference, as its ``simulated_diff`` bound of 5e-6
fp32 / 3e-5 bf16), the same -inf positions with clean_logits, twenty calls bitwise equal (the reference's
self-consistency loop), CUDA-graph capture of the paged decode form, and PDL on.

The cases are module-level tables (``GPU_CASE_TABLES``); ``test_gpu_cases_are_legal_on_the_cpu`` runs each through the
op's checks, the kernel config, every tensor map's encode rules (``TensorMapSpec.validate``) and the launch-shape rules
of the driver layer, so an illegal GPU case fails here, not only on the rare GPU run.
"""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm import attention as A
from deep_fp8_gemm import set_pdl
from deep_fp8_gemm.kernels import mqa_logits as K
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec
from deep_fp8_gemm.utils import calc_diff, get_num_sms
from tests._attention import NEG_INF, dense_inputs, generate_ks_ke, paged_inputs

# (seq_len, seq_len_kv, heads, head_dim, logits dtype, clean, compressed, disable_cp): DeepSeek-V3.2 prefill (H 64,
# D 128) at 2K x 8K and 4K x 16K, and the reference test's SM90 variants at smaller sizes.
DENSE = [
    (2048, 8192, 64, 128, "float32", True, False, True),
    (4096, 16384, 64, 128, "bfloat16", False, True, False),
    (1024, 8192, 32, 128, "float32", False, False, False),
    (512, 4096, 64, 64, "bfloat16", True, False, True),
    (256, 2048, 32, 32, "float32", False, True, True),
]
# (batch, next_n, heads, head_dim, average context, logits dtype): DeepSeek-V3.2 decode (H 64, D 128) with and without
# MTP at 4K-64K contexts, and H 32.
PAGED = [
    (64, 1, 64, 128, 4096, "float32"),
    (32, 2, 64, 128, 16384, "bfloat16"),
    (8, 1, 64, 128, 65536, "float32"),
    (128, 2, 32, 128, 2048, "float32"),
    (16, 1, 64, 64, 8192, "float32"),
]
GPU_CASE_TABLES = (DENSE, PAGED)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _dense_case(seq_len, seq_len_kv, heads, head_dim, dtype, clean, compressed, disable_cp, device):
    q, (kv, kv_sf), w, _, _ = dense_inputs(seq_len, seq_len_kv, heads, head_dim, seed=seq_len)
    ks, ke = generate_ks_ke(seq_len, seq_len_kv, disable_cp)
    width = int((ke - ks).max()) if compressed else 0
    args = [t.to(device) for t in (q, kv, kv_sf, w, ks, ke)]
    return args, dict(clean_logits=clean, max_seqlen_k=width, logits_dtype=_dtype(dtype))


def _paged_case(batch, next_n, heads, head_dim, avg_kv, dtype, device):
    q, cache, w, context, table, width = paged_inputs(batch, next_n, heads, head_dim, avg_kv, seed=batch)
    return [t.to(device) for t in (q, cache, w, context, table)], width, _dtype(dtype)


def _masked_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    written = ref != NEG_INF
    return calc_diff(out.double().masked_fill(~written, 0), ref.double().masked_fill(~written, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len,seq_len_kv,heads,head_dim,dtype,clean,compressed,disable_cp", DENSE)
def test_gpu_dense(seq_len, seq_len_kv, heads, head_dim, dtype, clean, compressed, disable_cp):
    args, kw = _dense_case(seq_len, seq_len_kv, heads, head_dim, dtype, clean, compressed, disable_cp, "cuda")
    q, kv, kv_sf, w, ks, ke = args
    out = A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, **kw)
    ref = A.fp8_mqa_logits_reference(q, (kv, kv_sf), w, ks, ke, **kw)  # float64 on the GPU
    assert out.shape == ref.shape and out.stride() == ref.stride()
    if clean:
        assert torch.equal(out == NEG_INF, ref == NEG_INF)
    assert _masked_diff(out, ref) < (3e-5 if dtype == "bfloat16" else 5e-6)
    written = ref != NEG_INF
    for _ in range(20):
        again = A.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, **kw)
        assert torch.equal(again[written], out[written])


@pytest.mark.gpu
@pytest.mark.parametrize("batch,next_n,heads,head_dim,avg_kv,dtype", PAGED)
def test_gpu_paged(batch, next_n, heads, head_dim, avg_kv, dtype):
    (q, cache, w, context, table), width, logits_dtype = _paged_case(batch, next_n, heads, head_dim, avg_kv, dtype,
                                                                      "cuda")
    meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
    out = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width, logits_dtype=logits_dtype)
    ref = A.fp8_paged_mqa_logits_reference(q, cache, w, context, table, meta, width, False, logits_dtype)
    assert _masked_diff(out, ref) < (3e-5 if dtype == "bfloat16" else 5e-6)
    assert torch.isfinite(out[ref != NEG_INF]).all()


@pytest.mark.gpu
def test_gpu_paged_graph_capture_and_pdl():
    """The decode form as a serving loop runs it: metadata and logits captured in one CUDA graph (no host sync in
    either), replayed after the context lengths grow; PDL on."""
    (q, cache, w, context, table), width, _ = _paged_case(*PAGED[0][:5], "float32", "cuda")
    set_pdl(True)
    try:
        A.fp8_paged_mqa_logits(q, cache, w, context, table, A.get_paged_mqa_logits_metadata(context, 64, get_num_sms()),
                               width)  # compile and load before capturing
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
            out = A.fp8_paged_mqa_logits(q, cache, w, context, table, meta, width)
        context.sub_(7).clamp_(min=0)
        graph.replay()
        ref = A.fp8_paged_mqa_logits_reference(q, cache, w, context, table, meta, width)
        assert _masked_diff(out, ref) < 5e-6
    finally:
        set_pdl(False)


# ---------------------------------------------------------------------------------------------- on the CPU
def _check_maps(args) -> None:
    for spec in args:
        TensorMapSpec(*spec).validate()


@pytest.mark.parametrize("case", DENSE + PAGED, ids=str)
def test_gpu_cases_are_legal_on_the_cpu(case):
    """Each GPU case through the op's checks and the kernel host code on meta-sized CPU stand-ins: the config, the
    tensor maps' encode rules, the launch shape (640 threads, the config's shared memory, the grid)."""
    if case in DENSE:
        seq_len, seq_len_kv, heads, head_dim, dtype, clean, compressed, disable_cp = case
        q = torch.empty(seq_len, heads, head_dim, dtype=torch.float8_e4m3fn)
        kv = torch.empty(seq_len_kv, head_dim, dtype=torch.float8_e4m3fn)
        kv_sf, w = torch.empty(seq_len_kv), torch.empty(seq_len, heads)
        ks, ke = generate_ks_ke(seq_len, seq_len_kv, disable_cp)
        width = int((ke - ks).max()) if compressed else 0
        A.check_dense(q, kv, kv_sf, w, ks, ke, clean, width, _dtype(dtype))
        config = K.dense_config(heads, head_dim, _dtype(dtype), clean, compressed)
        _check_maps(K.dense_map_args(config, q, kv, kv_sf, w))
        grid = min(132, -(-seq_len // config.queries))
    else:
        batch, next_n, heads, head_dim, avg_kv, dtype = case
        q = torch.empty(batch, next_n, heads, head_dim, dtype=torch.float8_e4m3fn)
        blocks = batch * (-(-int(1.3 * avg_kv) // 64)) + 3
        cache = torch.empty(blocks, 64, 1, head_dim + 4, dtype=torch.uint8)
        w = torch.empty(batch * next_n, heads)
        context = torch.full((batch, next_n), avg_kv, dtype=torch.int32)
        table = torch.zeros(batch, -(-int(1.3 * avg_kv) // 64), dtype=torch.int32)
        meta = A.get_paged_mqa_logits_metadata(context, 64, get_num_sms())
        A.check_paged(q, cache, w, context, table, meta, table.shape[1] * 64, False, _dtype(dtype))
        config = K.paged_config(heads, head_dim, next_n, _dtype(dtype))
        _check_maps(K.paged_map_args(config, q, cache, w))
        grid = meta.shape[0] - 1
    assert config.smem_bytes <= K.SMEM_LIMIT
    drv._launch_config(grid, K.NUM_THREADS, 1, config.smem_bytes, 0)
