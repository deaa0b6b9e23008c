"""Host time per call of every eager op, against the floor of any Python launcher.

``python -m bench.bench_host [--json PATH|-] [--quick] [--ops a,b] [--device all|stub|cuda]`` prints, per op
(dense, contiguous, masked, psum GEMM; the FP8-output dense GEMM and the masked SwiGLU·FP8 one; the reference's
names ``fp8_gemm_nt``, ``m_grouped_fp8_gemm_nt_contiguous``, ``fp8_m_grouped_gemm_nt_masked`` as vLLM calls them
through the drop-in ``deep_gemm`` module, and ``fp8_gemm_nt_1x32`` = ``fp8_gemm_nt(..., recipe=(1, 32, 32))`` as SGLang
calls it for DeepSeek-V4.1; the fused quantisers per_token, per_block, silu_mul_quant; the BF16 GEMMs
bf16_dense = ``bf16_gemm_nt``, bf16_masked, bf16_contiguous = ``m_grouped_bf16_gemm_nt_{masked,contiguous}``)::

    {"ops": [{"op": "dense", "call_us": ..., "launch_floor_us": ..., "ratio": ..., "device": "stub", ...}, ...]}

* ``dense_prepared``: the dense call through :func:`deep_fp8_gemm.prepare_gemm`'s object (no signature lookup).
* ``call_us``: median over ``--repeats`` batches of back-to-back public calls (warm: kernel compiled and loaded,
  tensor maps encoded) of the per-call host time; a batch is as many calls as last ~0.4 ms (at most ``--calls``).
* ``launch_floor_us``: the same statistic for one bare ``cuLaunchKernelEx`` issued through cuda-bindings with a
  prebuilt ``CUlaunchConfig`` and the op's argument count passed the way a Python launcher passes kernel
  arguments (``((values...), (ctypes types...))``, marshalled by the binding): one argument per tensor the op
  reads or writes plus one per Python scalar argument (dense 5, contiguous 6, masked 7, psum 6 — called without
  its optional ``expected_m`` —, dense_fp8out 6, masked_swiglu 8, the reference's names one more than their rows
  for ``disable_ue8m0_cast``, ``fp8_gemm_nt_1x32`` 7 (``recipe`` too), quantisers 3: input, output, scales;
  bf16_dense 3: a, b, d; bf16_masked 5: a, b, d, masked_m, expected_m; bf16_contiguous 4: a, b, d, grouped_layout;
  wgrad_1d1d 5: a, sa, b, sb and d, which is also c: ``gemm_fp8_fp8_fp32_nt_1d1d`` accumulating in place; the
  decode-path rows: mqa_logits 7: q, kv, kv_scales, weights, ks, ke, logits; paged_mqa_logits and its
  ``fp8_fp4_`` spelling 8: q, kv_cache, weights, context_lens, block_table, schedule_meta, logits, max_context_len;
  hc_prenorm 5: a, b, d, sqr_sum, num_splits; einsum 4: a, b, d, expr; fp8_einsum 6: x, sx, y, sy, d, expr;
  mxfp4_masked 8: x, sa, d, masked_m, the prepared tiles, meta, wave flags, expected_m; per_channel 3 (plain torch:
  no kernel, the stub sees no launch); cast_transpose 5: x and its four outputs; k_grouped_transpose 4: x, its two
  outputs, ks).
* ``ratio = call_us / launch_floor_us``.
* ``outputs``: how many new tensors the op returns (its documented results: the quantisers 2, cast_transpose 4,
  k_grouped_transpose 2, the three MQA-logits rows 1 each — the dense one a view of its padded buffer —,
  per_channel 2; the GEMMs write the caller's ``d`` and return none). For those ops ``outputs_floor_us`` is the floor of any launcher *of that op*: the bare
  launch plus making tensors like the op's results (same sizes, strides, dtypes, storage sizes) with the cheapest
  calls torch has (:func:`output_maker`), timed in the same alternation; ``ratio_outputs = call_us /
  outputs_floor_us``. A torch tensor costs ~0.75 µs to make and free here even with no elements, so no
  implementation returning two new tensors can come within 1.5x of the bare launch (2.7 µs for three arguments).
* ``bar_ratio``: the ratio issue 45's bar (1.5) applies to: ``ratio_outputs`` where the op returns new tensors,
  else ``ratio``; null for per_channel, which launches no kernel (plain torch on every device, as the reference's:
  on the stub its ``call_us`` is torch's arithmetic on the CPU, not a launch path).

The op's and the floor's timed batches alternate and last alike, so both medians see the same load of a shared
machine.

Rows with ``"device": "stub"`` run in a child process whose ``libcuda.so.1`` is the stub of
``tests/gpu_kernels/stub_libcuda.c`` (built here with ``cc``): the real cuda-bindings marshal every call, the
stub records and returns. CPU tensors are sent down the GPU launch path through the one seam the ops have for
it, :mod:`deep_fp8_gemm.runtime.target` (this tool maps the CPU device to ordinal 0, capability 9.0, current
device 0 and the default stream 0), so the host code measured is exactly what a GPU call runs, except the driver's
own work and
torch's CUDA caching allocator (the quantisers allocate their outputs with torch's CPU allocator here). The
kernels are really compiled (NVRTC) and "loaded" (the stub keeps the cubin's first bytes).
Rows with ``"device": "cuda"`` are added when an sm_90 GPU is present: the same calls on CUDA tensors and the
real driver (host time of the enqueue loop, synchronised between batches), the floor an empty kernel with the
same parameter count. ``--device cuda`` measures only those (``bench/device_check.sh``'s bench-host step: no C
compiler needed, and no process with the stub ``libcuda.so.1`` on a GPU machine).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

_STUB_ENV = "BENCH_HOST_STUB_DIR"  # internal, parent -> child (not a DFG_ setting): the stub's directory
_NUM_SMS_ENV = "BENCH_HOST_NUM_SMS"  # internal, parent -> child: the SM count the parent compiled for
_REPO = Path(__file__).resolve().parent.parent
_STUB_SOURCE = _REPO / "tests" / "gpu_kernels" / "stub_libcuda.c"
GEMM_PARAMS_BYTES = 576
QUANT_PARAMS_BYTES = 72
BF16_PARAMS_BYTES = 384  # kernels.bf16_gemm.Bf16GemmParams

# Decode-sized problems (DeepSeek-V3 shapes, ANCHORS.md section 5).
DENSE = dict(m=64, n=2112, k=7168)
CONTIGUOUS = dict(groups=4, m_per_group=128, n=4096, k=7168)
MASKED = dict(groups=8, m_max=64, n=7168, k=2048, expected_m=32)
PSUM = dict(ends=(100, 228, 356, 484), m_sum=512, n=4096, k=7168)  # 4 groups of 100 rows, 128-aligned starts
PER_TOKEN = dict(m=64, k=7168)
PER_BLOCK = dict(n=576, k=7168)
SILU = dict(m=64, two_i=4096)
SWIGLU = dict(groups=8, m_max=64, two_i=4096, k=7168, expected_m=32)  # w13 of 8 local experts (EP), decode
#: The GEMM family of each row whose name is not its kind (precompile).
FAMILY_OF = {"dense_prepared": "dense", "fp8_gemm_nt": "dense", "m_grouped_fp8_gemm_nt_contiguous": "contiguous",
             "fp8_m_grouped_gemm_nt_masked": "masked", "fp8_gemm_nt_1x32": "dense_block32", "wgrad_1d1d": "1d1d"}
BF16_DENSE = dict(m=64, n=2112, k=7168)  # bf16_gemm_nt: a [m, k], b [n, k], d [m, n] bf16
BF16_MASKED = dict(groups=8, m_max=64, n=4096, k=2048, expected_m=32)  # m_grouped_bf16_gemm_nt_masked
BF16_CONTIGUOUS = dict(groups=4, m_per_group=128, n=4096, k=2048)  # m_grouped_bf16_gemm_nt_contiguous
WGRAD_1D1D = dict(m=64, n=2112, k=7168)  # gemm_fp8_fp8_fp32_nt_1d1d, d = c [m, n] fp32 (a main-grad buffer)
MQA_PARAMS_BYTES = 640  # kernels.mqa_logits.MqaLogitsParams
HC_PARAMS_BYTES = 320  # kernels.hc_prenorm.HcPrenormParams
MXFP4_PARAMS_BYTES = 576  # kernels.mxfp4_gemm.Mxfp4Params
TRANSPOSE_PARAMS_BYTES = 80  # kernels.quant.TransposeParams
# The DeepSeek-V3.2 / V4 decode-path ops (issue 45's remaining entry points). The indexer: H 64, D 128 (V3.2's).
MQA = dict(seq_len=64, heads=64, head_dim=128, seq_len_kv=8192)  # fp8_mqa_logits (64 queries, one window each)
PAGED_MQA = dict(batch=32, next_n=1, heads=64, head_dim=128, context=8192)  # fp8_paged_mqa_logits, one decode step
HC = dict(m=64, n=24, k=4 * 7168, num_splits=16)  # tf32_hc_prenorm_gemm: V4's mHC at decode (bench_bf16.HC)
HEADS = dict(b=64, h=8, r=4096, d=1024)  # einsum / fp8_einsum("bhr,hdr->bhd"): V4's o_proj heads (bench_bf16.HEADS)
MXFP4 = dict(groups=8, m_max=64, n=7168, k=2048, expected_m=8)  # V4's w2 (bench_mxfp4.SHAPES), 8 local experts
PER_CHANNEL = dict(m=128, n=7168)  # per_channel_cast_to_fp8 (no kernel: plain torch on every device)
CAST_TRANSPOSE = dict(m=128, k=7168)  # per_token_cast_to_fp8_and_transpose
K_GROUPED = dict(ks=(128, 128, 128, 128), n=4096)  # transpose_cast_to_fp8_k_grouped


# ---------------------------------------------------------------------------------------------- operands
def _fp8(shape, device, gpu: bool) -> torch.Tensor:
    # Zeros on a GPU (the kernels really run there); uninitialised on the stub (nothing reads them).
    return (torch.zeros if gpu else torch.empty)(shape, dtype=torch.float8_e4m3fn, device=device)


def _scales(shape, device) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.float32, device=device)


def make_ops(device: torch.device) -> list[tuple[str, int, str, object, tuple]]:
    """``(name, argument count, params kind, fn, args)`` of every measured op on ``device``."""
    import deep_fp8_gemm as dfg
    from deep_fp8_gemm.moe import silu_mul_quant
    from deep_fp8_gemm.utils import empty_m_major

    gpu = device.type == "cuda"
    ops = []

    m, n, k = DENSE["m"], DENSE["n"], DENSE["k"]
    kb = (k + 127) // 128
    sa = empty_m_major((m, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((m, k), device, gpu), sa)
    rhs = (_fp8((n, k), device, gpu), _scales(((n + 127) // 128, kb), device))
    out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    ops.append(("dense", 5, "gemm", dfg.gemm_fp8_fp8_bf16_nt, (lhs, rhs, out)))
    ops.append(("dense_prepared", 5, "gemm", dfg.prepare_gemm("dense", lhs, rhs, out), (lhs, rhs, out)))

    g, mg, n, k = CONTIGUOUS["groups"], CONTIGUOUS["m_per_group"], CONTIGUOUS["n"], CONTIGUOUS["k"]
    kb, m_sum = (k + 127) // 128, g * mg
    sa = empty_m_major((m_sum, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((m_sum, k), device, gpu), sa)
    rhs = (_fp8((g, n, k), device, gpu), _scales((g, (n + 127) // 128, kb), device))
    out = torch.empty((m_sum, n), dtype=torch.bfloat16, device=device)
    m_indices = torch.arange(m_sum, dtype=torch.int32, device=device) // mg
    ops.append(("contiguous", 6, "gemm", dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, (lhs, rhs, out, m_indices)))

    g, m_max, n, k = MASKED["groups"], MASKED["m_max"], MASKED["n"], MASKED["k"]
    kb = (k + 127) // 128
    sa = empty_m_major((g, m_max, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((g, m_max, k), device, gpu), sa)
    rhs = (_fp8((g, n, k), device, gpu), _scales((g, (n + 127) // 128, kb), device))
    out = torch.empty((g, m_max, n), dtype=torch.bfloat16, device=device)
    masked_m = torch.full((g,), MASKED["expected_m"], dtype=torch.int32, device=device)
    ops.append(("masked", 7, "gemm", dfg.m_grouped_gemm_fp8_fp8_bf16_nt_masked,
                (lhs, rhs, out, masked_m, MASKED["expected_m"])))

    ends, m_sum, n, k = PSUM["ends"], PSUM["m_sum"], PSUM["n"], PSUM["k"]
    kb, g = (k + 127) // 128, len(ends)
    sa = empty_m_major((m_sum, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((m_sum, k), device, gpu), sa)
    rhs = (_fp8((g, n, k), device, gpu), _scales((g, (n + 127) // 128, kb), device))
    out = torch.empty((m_sum, n), dtype=torch.bfloat16, device=device)
    layout = torch.tensor(ends, dtype=torch.int32, device=device)
    ops.append(("psum", 6, "gemm", dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum, (lhs, rhs, out, layout)))

    # The FP8-output kinds: the dense GEMM whose output feeds the next GEMM, and the MoE decode up-projection.
    m, n, k = DENSE["m"], DENSE["n"], DENSE["k"]
    kb = (k + 127) // 128
    sa = empty_m_major((m, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((m, k), device, gpu), sa)
    rhs = (_fp8((n, k), device, gpu), _scales(((n + 127) // 128, kb), device))
    out8 = (_fp8((m, n), device, gpu), empty_m_major((m, (n + 127) // 128), device))
    ops.append(("dense_fp8out", 6, "gemm", dfg.gemm_fp8_fp8_fp8_nt, (lhs, rhs, out8)))
    g, m_max, n, k = SWIGLU["groups"], SWIGLU["m_max"], SWIGLU["two_i"], SWIGLU["k"]
    kb = (k + 127) // 128
    sa = empty_m_major((g, m_max, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((g, m_max, k), device, gpu), sa)
    rhs = (_fp8((g, n, k), device, gpu), _scales((g, (n + 127) // 128, kb), device))
    out8 = (_fp8((g, m_max, n // 2), device, gpu), empty_m_major((g, m_max, (n // 2 + 127) // 128), device))
    masked_m = torch.full((g,), SWIGLU["expected_m"], dtype=torch.int32, device=device)
    ops.append(("masked_swiglu", 8, "gemm", dfg.m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu,
                (lhs, rhs, out8, masked_m, SWIGLU["expected_m"])))

    # The reference's names as vLLM calls them (``import deep_gemm``: the drop-in module; disable_ue8m0_cast passed to
    # every FP8 GEMM, ANCHORS.md section 6b), on the dense / contiguous / masked rows' operands above.
    from deep_fp8_gemm.compat import deep_gemm

    for name, row, call in (
            ("fp8_gemm_nt", "dense", lambda lhs, rhs, out: deep_gemm.fp8_gemm_nt(lhs, rhs, out,
                                                                                 disable_ue8m0_cast=True)),
            ("m_grouped_fp8_gemm_nt_contiguous", "contiguous",
             lambda lhs, rhs, out, layout: deep_gemm.m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, layout,
                                                                                     disable_ue8m0_cast=True)),
            ("fp8_m_grouped_gemm_nt_masked", "masked",
             lambda lhs, rhs, out, masked_m, expected_m: deep_gemm.fp8_m_grouped_gemm_nt_masked(
                 lhs, rhs, out, masked_m, expected_m, disable_ue8m0_cast=True))):
        _, num_args, kind, _, args = next(op for op in ops if op[0] == row)
        ops.append((name, num_args + 1, kind, call, args))
    # SGLang's DeepSeek-V4.1 dense call: recipe (1, 32, 32), 1x32 activation scales (M-major, as its quantiser
    # writes them) and 32x32 weight scales.
    m, n, k = DENSE["m"], DENSE["n"], DENSE["k"]
    kb = (k + 31) // 32
    sa = empty_m_major((m, kb), device)
    sa.fill_(1.0)
    lhs = (_fp8((m, k), device, gpu), sa)
    rhs = (_fp8((n, k), device, gpu), _scales(((n + 31) // 32, kb), device))
    out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    ops.append(("fp8_gemm_nt_1x32", 7, "gemm",
                lambda lhs, rhs, out: deep_gemm.fp8_gemm_nt(lhs, rhs, out, recipe=(1, 32, 32), disable_ue8m0_cast=True),
                (lhs, rhs, out)))

    x = torch.zeros((PER_TOKEN["m"], PER_TOKEN["k"]), dtype=torch.bfloat16, device=device)
    ops.append(("per_token", 3, "quant", dfg.per_token_cast_to_fp8, (x,)))
    w = torch.zeros((PER_BLOCK["n"], PER_BLOCK["k"]), dtype=torch.bfloat16, device=device)
    ops.append(("per_block", 3, "quant", dfg.per_block_cast_to_fp8, (w,)))
    h = torch.zeros((SILU["m"], SILU["two_i"]), dtype=torch.bfloat16, device=device)
    ops.append(("silu_mul_quant", 3, "quant", silu_mul_quant, (h,)))

    m, n, k = BF16_DENSE["m"], BF16_DENSE["n"], BF16_DENSE["k"]
    a = torch.zeros((m, k), dtype=torch.bfloat16, device=device)
    b = torch.zeros((n, k), dtype=torch.bfloat16, device=device)
    d = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    ops.append(("bf16_dense", 3, "bf16", dfg.bf16_gemm_nt, (a, b, d)))

    g, m_max, n, k = BF16_MASKED["groups"], BF16_MASKED["m_max"], BF16_MASKED["n"], BF16_MASKED["k"]
    a = torch.zeros((g, m_max, k), dtype=torch.bfloat16, device=device)
    b = torch.zeros((g, n, k), dtype=torch.bfloat16, device=device)
    d = torch.empty((g, m_max, n), dtype=torch.bfloat16, device=device)
    masked_m = torch.full((g,), BF16_MASKED["expected_m"], dtype=torch.int32, device=device)
    ops.append(("bf16_masked", 5, "bf16", dfg.m_grouped_bf16_gemm_nt_masked,
                (a, b, d, masked_m, BF16_MASKED["expected_m"])))

    g, mg, n, k = BF16_CONTIGUOUS["groups"], BF16_CONTIGUOUS["m_per_group"], BF16_CONTIGUOUS["n"], BF16_CONTIGUOUS["k"]
    a = torch.zeros((g * mg, k), dtype=torch.bfloat16, device=device)
    b = torch.zeros((g, n, k), dtype=torch.bfloat16, device=device)
    d = torch.empty((g * mg, n), dtype=torch.bfloat16, device=device)
    m_indices = torch.arange(g * mg, dtype=torch.int32, device=device) // mg
    ops.append(("bf16_contiguous", 4, "bf16", dfg.m_grouped_bf16_gemm_nt_contiguous, (a, b, d, m_indices)))

    # The weight-gradient GEMMs, accumulating in place into fp32 d (c = d: one tensor read and written).
    m, n, k = WGRAD_1D1D["m"], WGRAD_1D1D["n"], WGRAD_1D1D["k"]
    kb = (k + 127) // 128
    sa, sb = empty_m_major((m, kb), device), empty_m_major((n, kb), device)
    sa.fill_(1.0)
    sb.fill_(1.0)
    d = torch.zeros((m, n), dtype=torch.float32, device=device)
    ops.append(("wgrad_1d1d", 5, "gemm", dfg.gemm_fp8_fp8_fp32_nt_1d1d,
                ((_fp8((m, k), device, gpu), sa), (_fp8((n, k), device, gpu), sb), d, d)))
    ops += _decode_path_ops(device, gpu)
    return ops


def _decode_path_ops(device: torch.device, gpu: bool) -> list[tuple[str, int, str, object, tuple]]:
    """The DeepSeek-V3.2 / V4 decode-path rows (see the module docstring for their argument counts)."""
    import deep_fp8_gemm as dfg
    from deep_fp8_gemm import attention
    from deep_fp8_gemm.compat import attention as compat_attention
    from deep_fp8_gemm.ops import einsum, hc_prenorm, mxfp4
    from deep_fp8_gemm.utils import get_col_major_tma_aligned_tensor, get_num_sms

    ops = []
    s, h, dh, s_kv = MQA["seq_len"], MQA["heads"], MQA["head_dim"], MQA["seq_len_kv"]
    q = _fp8((s, h, dh), device, gpu)
    kv = (_fp8((s_kv, dh), device, gpu), _scales((s_kv,), device))
    w = _scales((s, h), device)
    ks = torch.zeros((s,), dtype=torch.int32, device=device)
    ke = torch.full((s,), s_kv, dtype=torch.int32, device=device)
    ops.append(("mqa_logits", 7, "mqa", attention.fp8_mqa_logits, (q, kv, w, ks, ke)))

    b, nn_, h, dh, ctx = (PAGED_MQA[x] for x in ("batch", "next_n", "heads", "head_dim", "context"))
    blocks = ctx // attention.BLOCK_KV
    q = _fp8((b, nn_, h, dh), device, gpu)
    cache = torch.zeros((b * blocks, attention.BLOCK_KV, 1, dh + 4), dtype=torch.uint8, device=device)
    w = _scales((b * nn_, h), device)
    context_lens = torch.full((b, nn_), ctx, dtype=torch.int32, device=device)
    block_table = torch.arange(b * blocks, dtype=torch.int32, device=device).view(b, blocks)
    meta = attention.get_paged_mqa_logits_metadata(context_lens, attention.BLOCK_KV, get_num_sms())
    args = (q, cache, w, context_lens, block_table, meta, ctx)
    ops.append(("paged_mqa_logits", 8, "mqa", attention.fp8_paged_mqa_logits, args))
    ops.append(("fp8_fp4_paged_mqa_logits", 8, "mqa",
                lambda q, *rest: compat_attention.fp8_fp4_paged_mqa_logits((q, None), *rest), args))

    m, n, k, splits = HC["m"], HC["n"], HC["k"], HC["num_splits"]
    a = torch.zeros((m, k), dtype=torch.bfloat16, device=device)
    bw = torch.zeros((n, k), dtype=torch.float32, device=device)
    d = torch.empty((splits, m, n), dtype=torch.float32, device=device)
    sqr = torch.empty((splits, m), dtype=torch.float32, device=device)
    ops.append(("hc_prenorm", 5, "hc", hc_prenorm.tf32_hc_prenorm_gemm, (a, bw, d, sqr, splits)))

    nb, h, r, dd = HEADS["b"], HEADS["h"], HEADS["r"], HEADS["d"]
    a = torch.zeros((nb, h, r), dtype=torch.bfloat16, device=device)
    bw = torch.zeros((h, dd, r), dtype=torch.bfloat16, device=device)
    d = torch.empty((nb, h, dd), dtype=torch.bfloat16, device=device)
    ops.append(("einsum", 4, "bf16", einsum.einsum, ("bhr,hdr->bhd", a, bw, d)))
    # sx as the library's quantiser hands it over (per_token_cast_to_fp8(x.view(-1, r)): M-major [b * h, r / 128],
    # TMA-aligned) viewed back as [b, h, r / 128]: G-major for the kernel, read in place (h % 4 == 0).
    sx = get_col_major_tma_aligned_tensor(_scales((nb * h, r // 128), device)).view(nb, h, r // 128)
    x = (_fp8((nb, h, r), device, gpu), sx)
    y = (_fp8((h, dd, r), device, gpu), _scales((h, dd // 128, r // 128), device))
    ops.append(("fp8_einsum", 6, "gemm", einsum.fp8_einsum, ("bhr,hdr->bhd", x, y, d)))

    g, m_max, n, k, em = (MXFP4[x] for x in ("groups", "m_max", "n", "k", "expected_m"))
    prepared = mxfp4.PreparedMxfp4(  # zeros: valid codes and metadata (nothing is read on the stub)
        torch.zeros((g, k // 128, n // mxfp4.WAVE_ROWS, mxfp4.TILE_BYTES), dtype=torch.uint8, device=device),
        torch.zeros((g, k // 128, n // mxfp4.WAVE_ROWS, mxfp4.META_BYTES), dtype=torch.uint8, device=device),
        torch.zeros((g, n // mxfp4.WAVE_ROWS), dtype=torch.uint8, device=device))
    # sa as DeepEP's low-latency dispatch hands it over (fp32 [E, T, H/128], M-major, T % 4 == 0): read in place.
    x = (_fp8((g, m_max, k), device, gpu), get_col_major_tma_aligned_tensor(_scales((g, m_max, k // 128), device)))
    d = torch.empty((g, m_max, n), dtype=torch.bfloat16, device=device)
    masked_m = torch.full((g,), em, dtype=torch.int32, device=device)
    ops.append(("mxfp4_masked", 8, "mxfp4", mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked,
                (x, prepared, d, masked_m, em)))

    x = torch.zeros((PER_CHANNEL["m"], PER_CHANNEL["n"]), dtype=torch.bfloat16, device=device)
    ops.append(("per_channel", 3, "none", dfg.per_channel_cast_to_fp8, (x,)))
    x = torch.zeros((CAST_TRANSPOSE["m"], CAST_TRANSPOSE["k"]), dtype=torch.bfloat16, device=device)
    ops.append(("cast_transpose", 5, "transpose", dfg.per_token_cast_to_fp8_and_transpose, (x,)))
    ks = list(K_GROUPED["ks"])
    x = torch.zeros((sum(ks), K_GROUPED["n"]), dtype=torch.bfloat16, device=device)
    ops.append(("k_grouped_transpose", 4, "transpose", dfg.transpose_cast_to_fp8_k_grouped, (x, ks)))
    return ops


# ---------------------------------------------------------------------------------------------- timing
def per_call_us(fn, args: tuple, *, calls: int, repeats: int, sync=None) -> float:
    """Median over ``repeats`` batches of the mean host time of ``calls`` calls of ``fn(*args)``, in µs."""
    samples = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(*args)
        samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(samples)


_FLOOR_SOURCE = 'extern "C" __global__ void {name}({params}) {{}}\n'


def floor_cubin(num_args: int) -> tuple[str, bytes]:
    """Name and cubin of an empty kernel taking ``num_args`` pointers (JIT-cached)."""
    from deep_fp8_gemm.runtime.compiler import compile_kernel

    name = f"dfg_host_floor_{num_args}"
    params = ", ".join(f"void* p{i}" for i in range(num_args))
    return name, compile_kernel(name, _FLOOR_SOURCE.format(name=name, params=params)).cubin


def floor_launcher(num_args: int, stream: int, index: int = 0):
    """``(fn, args)``: a bare ``cuLaunchKernelEx`` of an empty kernel taking ``num_args`` pointers, with a
    prebuilt one-CTA config, its arguments given as ``((pointers...), (c_void_p,) * num_args)``."""
    from cuda.bindings import driver

    from deep_fp8_gemm.runtime import driver as drv

    name, cubin = floor_cubin(num_args)
    drv.ensure_initialized()
    drv._make_current_if_none(drv.primary_context(index))
    library = drv.check(driver.cuLibraryLoadData(cubin, None, None, 0, None, None, 0), "cuLibraryLoadData")
    kernel = drv.check(driver.cuLibraryGetKernel(library, name.encode()), "cuLibraryGetKernel")
    function = driver.CUfunction(int(kernel))
    config = driver.CUlaunchConfig()
    config.gridDimX = config.gridDimY = config.gridDimZ = 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 32, 1, 1
    config.sharedMemBytes = 0
    config.hStream = driver.CUstream(stream)
    config.numAttrs = 0
    values = tuple(0x7F0000001000 + 256 * i for i in range(num_args))
    kernel_args = (values, (ctypes.c_void_p,) * num_args)
    launch = driver.cuLaunchKernelEx

    def fn():
        err = launch(config, function, kernel_args, 0)[0]
        if err != 0:
            raise RuntimeError(f"floor launch failed: {err}")

    fn._keep = library  # the library must outlive the launches
    return fn


_BATCH_US = 400.0  # target length of one timed batch


def _batch_calls(fn, args: tuple, max_calls: int) -> int:
    """Calls per batch so that a batch lasts about ``_BATCH_US`` (at most ``max_calls``, at least 10): batches of
    the op and of the floor then last alike and are equally likely to be preempted on a shared machine."""
    t0 = time.perf_counter_ns()
    for _ in range(10):
        fn(*args)
    per_call = max((time.perf_counter_ns() - t0) / 10 / 1e3, 1e-3)
    return max(10, min(max_calls, int(_BATCH_US / per_call)))


def measure(device: torch.device, *, calls: int, repeats: int, only: set[str] | None, label: str,
            before_warmup=None, sync=None, launched=None) -> list[dict]:
    """One row per op. The op's batches and its floor's batches alternate, so that both medians see the same
    machine load (the 2-core development machine is shared). ``launched()`` (the stub): the driver's launch
    count so far; every timed call of the op and of the floor must have reached the driver."""
    from deep_fp8_gemm.runtime import target

    rows = []
    floors: dict[int, object] = {}
    index = target.gpu_index(device)
    stream = target.current_stream(index)
    for name, num_args, params_kind, fn, args in make_ops(device):
        if only and name not in only:
            continue
        if before_warmup is not None:
            before_warmup(params_kind)
        for _ in range(3):  # compile, load, encode the tensor maps
            fn(*args)
        if num_args not in floors:
            if before_warmup is not None:
                before_warmup("floor")
            floors[num_args] = floor_launcher(num_args, stream, index)
            floors[num_args]()
        floor = floors[num_args]
        outputs = new_outputs(fn(*args), args)
        floor_out = floor_with_outputs(floor, output_maker(outputs)) if outputs else None
        op_calls, floor_calls = _batch_calls(fn, args, calls), _batch_calls(floor, (), calls)
        out_calls = _batch_calls(floor_out, (), calls) if outputs else 0
        op_samples, floor_samples, out_samples = [], [], []
        before = launched() if launched is not None else 0
        for _ in range(repeats):
            op_samples.append(per_call_us(fn, args, calls=op_calls, repeats=1, sync=sync))
            floor_samples.append(per_call_us(floor, (), calls=floor_calls, repeats=1, sync=sync))
            if outputs:
                out_samples.append(per_call_us(floor_out, (), calls=out_calls, repeats=1, sync=sync))
        op_launches = 0 if params_kind == "none" else op_calls  # "none": plain torch, no kernel
        if launched is not None and launched() - before != repeats * (op_launches + floor_calls + out_calls):
            raise RuntimeError(f"{name}: the stub driver saw {launched() - before} launches, expected "
                               f"{repeats} x ({op_launches} + {floor_calls} + {out_calls}): the calls did not "
                               f"reach it")
        call_us, floor_us = statistics.median(op_samples), statistics.median(floor_samples)
        row = {"op": name, "call_us": round(call_us, 3), "launch_floor_us": round(floor_us, 3),
               "ratio": round(call_us / floor_us, 2), "args": num_args, "device": label, "outputs": len(outputs)}
        if outputs:  # the op returns new tensors: the floor of its launcher makes them too
            out_us = statistics.median(out_samples)
            row["outputs_floor_us"] = round(out_us, 3)
            row["ratio_outputs"] = round(call_us / out_us, 2)
        # No kernel (plain torch, as the reference's per_channel_cast_to_fp8): the stub runs torch's arithmetic on
        # the CPU, so call_us is that compute, not a launch path; the bar does not apply.
        row["bar_ratio"] = None if params_kind == "none" else row.get("ratio_outputs", row["ratio"])
        rows.append(row)
    return rows


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or tuples / lists of them; other objects hold none for this)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def new_outputs(result, args: tuple) -> tuple[torch.Tensor, ...]:
    """The tensors an op's ``result`` returns that it made: storage shared with no tensor of ``args``."""
    inputs = {t.untyped_storage().data_ptr() for t in _tensors(args)}
    return tuple(t for t in _tensors(result) if t.untyped_storage().data_ptr() not in inputs)


def output_maker(outputs: tuple[torch.Tensor, ...]):
    """A function making new tensors like ``outputs`` — same sizes, strides, storage offset, dtype, device and
    storage size — with the cheapest calls torch offers (its ``_empty_strided_{cpu,cuda}(sizes, strides, dtype)``,
    inductor's allocator, and, for a view of a larger storage such as the MQA logits' ``[:seq_len, :width]`` of a
    padded buffer, ``_reinterpret_tensor`` of one; ``new_empty_strided`` / ``as_strided`` where torch lacks them):
    what any launcher returning the op's documented results must do besides the launch."""
    from deep_fp8_gemm._core import plans

    try:
        from torch._C._dynamo.guards import _reinterpret_tensor as alias
    except ImportError:  # pragma: no cover - present in the supported torch (2.13)
        alias = torch.Tensor.as_strided
    plain, views = [], []  # (size, stride, dtype) made directly; (storage args, view args) made then viewed
    for t in outputs:
        size, stride, offset, dtype = tuple(t.shape), t.stride(), t.storage_offset(), t.dtype
        elements = t.untyped_storage().nbytes() // t.element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if t.numel() else 0
        if offset == 0 and span == elements:
            plain.append((size, stride, dtype))
        else:  # a view of a bigger storage: make the storage, then the view (the op's documented result)
            views.append((((elements,), (1,), dtype), (size, stride, offset)))
    device = outputs[0].device
    empty = plans.ALLOCATORS.get(device.type)
    if empty is None or {t.device for t in outputs} != {device}:
        protos = {t.dtype: torch.empty(0, dtype=t.dtype, device=t.device) for t in outputs}

        def empty(sizes, strides, dtype):
            return protos[dtype].new_empty_strided(sizes, strides)
    # Unrolled for the rows' shapes, so the floor pays no Python loop or extra frame per tensor.
    if views:
        if plain or len(views) > 1:
            raise NotImplementedError("output_maker: one view output, alone (the MQA logits), is all the rows need")
        (s0, t0, d0), view = views[0]
        return lambda: alias(empty(s0, t0, d0), *view)
    if len(plain) == 1:
        (s0, t0, d0), = plain
        return lambda: empty(s0, t0, d0)
    if len(plain) == 2:
        (s0, t0, d0), (s1, t1, d1) = plain
        return lambda: (empty(s0, t0, d0), empty(s1, t1, d1))
    if len(plain) == 4:
        (s0, t0, d0), (s1, t1, d1), (s2, t2, d2), (s3, t3, d3) = plain
        return lambda: (empty(s0, t0, d0), empty(s1, t1, d1), empty(s2, t2, d2), empty(s3, t3, d3))
    return lambda: tuple(empty(*a) for a in plain)


def floor_with_outputs(floor, make):
    """One launch floor plus the making of the op's new outputs: the floor of any launcher of that op."""
    def fn():
        floor()
        return make()

    return fn


# ---------------------------------------------------------------------------------------------- stub child
def _run_stub_child(stub_dir: str, calls: int, repeats: int, only: set[str] | None) -> list[dict]:
    """In the child: the binding has loaded the stub; map CPU tensors onto it and measure."""
    from cuda.bindings import driver as binding

    from deep_fp8_gemm.runtime import target

    stub = ctypes.CDLL(os.path.join(stub_dir, "libcuda.so.1"))
    param_size = ctypes.c_size_t.in_dll(stub, "g_param_size")
    launches = ctypes.c_int.in_dll(stub, "g_launches")
    sizes = {"gemm": GEMM_PARAMS_BYTES, "quant": QUANT_PARAMS_BYTES, "bf16": BF16_PARAMS_BYTES, "floor": 8,
             "mqa": MQA_PARAMS_BYTES, "hc": HC_PARAMS_BYTES, "mxfp4": MXFP4_PARAMS_BYTES,
             "transpose": TRANSPOSE_PARAMS_BYTES, "none": 8}

    def before_warmup(kind: str) -> None:
        # cuKernelGetParamInfo of the stub reports this size for the kernel loaded next; the stub's launch
        # copies that many bytes of the first argument.
        param_size.value = sizes[kind]

    from deep_fp8_gemm import utils

    utils.set_num_sms(int(os.environ[_NUM_SMS_ENV]))
    param_size.value = GEMM_PARAMS_BYTES  # make_ops already loads the GEMM kernel (prepare_gemm)
    binding.cuInit(0)
    target.gpu_index = lambda device: 0
    target.capability = lambda index: (9, 0)
    target.current_stream = lambda index: 0
    target.is_capturing = lambda index: False
    target.current_device = lambda: 0
    return measure(torch.device("cpu"), calls=calls, repeats=repeats, only=only, label="stub",
                   before_warmup=before_warmup, launched=lambda: launches.value)


def _mqa_kernel(args) -> None:
    from deep_fp8_gemm.kernels import mqa_logits
    from deep_fp8_gemm.runtime.compiler import compile_kernel

    q = args[0]
    if q.dim() == 3:  # dense, clean (the default)
        cfg = mqa_logits.dense_config(q.shape[1], q.shape[2], torch.float32, True, False)
    else:
        cfg = mqa_logits.paged_config(q.shape[2], q.shape[3], q.shape[1], torch.float32)
    compile_kernel(*mqa_logits.render_source(cfg))


def _hc_kernel(args) -> None:
    from deep_fp8_gemm.kernels import hc_prenorm
    from deep_fp8_gemm.runtime.compiler import compile_kernel

    compile_kernel(*hc_prenorm.render_source(hc_prenorm.pick_config(args[1].shape[0])))


def _einsum_kernel(args) -> None:
    from deep_fp8_gemm.kernels import bf16_gemm
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.utils import get_num_sms

    _, a, b, _ = args
    nb, h, r = a.shape
    cfg = bf16_gemm.pick_config(bf16_gemm.Bf16Form.BATCHED, nb, b.shape[1], r, h, "k", "k", torch.bfloat16, False,
                                get_num_sms())
    compile_kernel(*bf16_gemm.render_source(cfg))


def _fp8_einsum_kernel(args) -> None:
    from deep_fp8_gemm import ops
    from deep_fp8_gemm.kernels import gemm
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.utils import get_num_sms

    _, (x, sx), (y, _), _ = args
    major = gemm.sa_major_of(sx.permute(1, 0, 2)) or "m"  # the kernel of sx's layout (ops.einsum._fp8_run)
    cfg = ops.FAMILIES["masked"].plan(x.permute(1, 0, 2), y, x.shape[0], get_num_sms(), sa_major=major)
    compile_kernel(cfg.kernel_name(), gemm.render_source(cfg))


def _mxfp4_kernel(args) -> None:
    from deep_fp8_gemm.kernels import mxfp4_gemm
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.utils import get_num_sms

    g, n, k = args[1].shape
    compile_kernel(*mxfp4_gemm.render_source(mxfp4_gemm.pick_config(n, k, g, args[4], get_num_sms())))


def _transpose_kernel(kind_name: str, rows_multiple: int):
    def compile_one(args) -> None:
        from deep_fp8_gemm.kernels import quant

        x = args[0]
        vectorized = x.shape[1] % 16 == 0 and x.data_ptr() % 16 == 0 and x.shape[0] % rows_multiple == 0
        quant.compile_config(quant.QuantKernelConfig(quant.QuantKind[kind_name], quant.InputType.BF16, vectorized))

    return compile_one


#: The decode-path rows' kernels (precompile): name -> compile(args).
_DECODE_PATH_KERNELS = {
    "mqa_logits": _mqa_kernel, "paged_mqa_logits": _mqa_kernel, "fp8_fp4_paged_mqa_logits": _mqa_kernel,
    "hc_prenorm": _hc_kernel, "einsum": _einsum_kernel, "fp8_einsum": _fp8_einsum_kernel, "mxfp4_masked": _mxfp4_kernel,
    "per_channel": lambda args: None, "cast_transpose": _transpose_kernel("CAST_TRANSPOSE", 16),
    "k_grouped_transpose": _transpose_kernel("K_GROUPED_TRANSPOSE", 1),
}


def precompile(only: set[str] | None) -> None:
    """Compile (into the on-disk JIT cache) every kernel the stub child loads.

    NVRTC itself crashes in a process whose ``libcuda.so.1`` is the stub (it calls into the driver), so the
    child must only get cache hits (and ``DFG_JIT_DISABLE_CACHE`` must be off)."""
    from deep_fp8_gemm import ops
    from deep_fp8_gemm.kernels import bf16_gemm, gemm, quant
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.utils import get_num_sms

    kinds = {"per_token": quant.QuantKind.PER_TOKEN, "per_block": quant.QuantKind.PER_BLOCK,
             "silu_mul_quant": quant.QuantKind.SILU_MUL_PER_TOKEN}
    counts = set()
    for name, num_args, params_kind, _, args in make_ops(torch.device("cpu")):
        if only and name not in only and name != "dense_prepared":  # make_ops loads that one (prepare_gemm)
            continue
        counts.add(num_args)
        if name in _DECODE_PATH_KERNELS:
            _DECODE_PATH_KERNELS[name](args)
        elif params_kind == "gemm":
            kind = FAMILY_OF.get(name, name)
            if kind == "1d1d":  # plan(m, n, k, num_sms)
                (m, k), n = args[0][0].shape, args[1][0].shape[0]
                cfg = ops.FAMILIES[kind].plan(m, n, k, get_num_sms())
            else:
                expected_m = args[4] if kind.startswith("masked") else None
                cfg = ops.FAMILIES[kind].plan(args[0][0], args[1][0], expected_m, get_num_sms())
            compile_kernel(cfg.kernel_name(), gemm.render_source(cfg))
        elif params_kind == "bf16":
            a, b, d = args[:3]
            form = {"bf16_dense": bf16_gemm.Bf16Form.DENSE, "bf16_masked": bf16_gemm.Bf16Form.M_GROUPED_MASKED,
                    "bf16_contiguous": bf16_gemm.Bf16Form.M_GROUPED_CONTIGUOUS}[name]
            groups = b.shape[0] if b.dim() == 3 else 1
            cfg = bf16_gemm.pick_config(form, a.shape[-2], b.shape[-2], a.shape[-1], groups, "k", "k", d.dtype, False,
                                        get_num_sms())
            compile_kernel(*bf16_gemm.render_source(cfg))
        else:
            x = args[0]
            plan = quant.plan_quant(x, kinds[name])
            quant.compile_config(plan.kernel_config(plan.vectorizable and x.data_ptr() % 16 == 0))
    for n in counts:
        floor_cubin(n)


def stub_rows(calls: int, repeats: int, only: set[str] | None) -> list[dict]:
    """Build the stub driver, run the measurement in a child process that loads it, return its rows."""
    precompile(only)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("bench_host needs a C compiler (cc) to build the stub libcuda.so.1")
    with tempfile.TemporaryDirectory(prefix="dfg-host-bench-") as tmp:
        subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", os.path.join(tmp, "libcuda.so.1"),
                        str(_STUB_SOURCE)], check=True)
        env = dict(os.environ, LD_LIBRARY_PATH=tmp + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))
        env[_STUB_ENV] = tmp
        # The child must pick the configs compiled here without asking torch.cuda for the SM count (torch's
        # CUDA runtime would load the stub libcuda.so.1 too).
        from deep_fp8_gemm.utils import get_num_sms

        env[_NUM_SMS_ENV] = str(get_num_sms())
        # The quantisers allocate their outputs on every call. On a GPU torch's caching allocator serves a
        # repeated size from its cache; glibc would instead mmap / trim (a system call) for every ~0.5 MB
        # buffer. Keep freed memory in the heap so the CPU stand-in is closer to the caching allocator.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
        env["PYTHONPATH"] = os.pathsep.join([str(_REPO), os.environ.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "bench.bench_host", "--calls", str(calls), "--repeats", str(repeats),
               "--json", "-"] + (["--ops", ",".join(sorted(only))] if only else [])
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(_REPO))
        if run.returncode != 0:
            raise RuntimeError(f"stub measurement failed:\n{run.stderr}")
        return json.loads(run.stdout)["ops"]


def gpu_rows(calls: int, repeats: int, only: set[str] | None) -> list[dict]:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return []
    return measure(torch.device("cuda"), calls=calls, repeats=repeats, only=only, label="cuda",
                   sync=torch.cuda.synchronize)


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the JSON result here ('-' = stdout)")
    parser.add_argument("--calls", type=int, default=200, help="most calls per timed batch (default 200)")
    parser.add_argument("--repeats", type=int, default=51, help="timed batches; the median is reported (51)")
    parser.add_argument("--quick", action="store_true", help="50 calls x 9 batches")
    parser.add_argument("--ops", help="comma-separated subset of ops")
    parser.add_argument("--device", choices=("all", "stub", "cuda"), default="all",
                        help="rows to measure: the stub driver's, the GPU's (exit status 3 when there is no sm_90 "
                             "GPU), or both (default; GPU rows only where one is present)")
    args = parser.parse_args(argv)
    calls, repeats = (50, 9) if args.quick else (args.calls, args.repeats)
    only = set(args.ops.split(",")) if args.ops else None

    stub_dir = os.environ.get(_STUB_ENV)
    if stub_dir:  # the child
        rows = _run_stub_child(stub_dir, calls, repeats, only)
    else:
        rows = stub_rows(calls, repeats, only) if args.device in ("all", "stub") else []
        if args.device in ("all", "cuda"):
            cuda = gpu_rows(calls, repeats, only)
            if not cuda and args.device == "cuda":
                print("bench_host: --device cuda needs an sm_90 GPU visible to torch; none is", file=sys.stderr)
                return 3
            rows += cuda
    result = {"ops": rows, "calls": calls, "repeats": repeats}
    if args.json:
        text = json.dumps(result, indent=None if args.json == "-" else 2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(text + "\n")
    if not stub_dir and args.json != "-":
        width = max([len("op")] + [len(row["op"]) for row in rows]) + 2
        print(f"{'op':<{width}}{'device':<8}{'call_us':>10}{'floor_us':>10}{'ratio':>8}{'+outputs_us':>12}"
              f"{'ratio':>8}{'bar':>7}")
        for row in rows:
            outs = (f"{row['outputs_floor_us']:>12.2f}{row['ratio_outputs']:>8.2f}" if "outputs_floor_us" in row
                    else f"{'':>12}{'':>8}")
            print(f"{row['op']:<{width}}{row['device']:<8}{row['call_us']:>10.2f}{row['launch_floor_us']:>10.2f}"
                  f"{row['ratio']:>8.2f}{outs}{_bar(row['bar_ratio']):>7}")
    return 0


def _bar(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
