"""The DeepSeek-V3.2 / V4 lightning indexer on SM90: FP8 MQA logits (dense and paged) and the paged form's schedule.

The indexer scores every cached token for every query with one FP8 "MQA" head group and keeps the top k::

    logits[i, j] = s_kv[j] · Σ_h w[i, h] · ReLU(q[i, h, :] · kv[j, :])

``q`` float8_e4m3fn ``[.., H, D]`` (its per-token scale folded into ``w`` by the caller), ``kv`` float8_e4m3fn ``[.., D]``
with one float32 scale ``s_kv`` per token, ``w`` float32 ``[.., H]`` (any sign), ``H`` in {32, 64}, ``D`` in
{32, 64, 128} (DeepSeek-V3.2: H 64, D 128). Semantics are DeepGEMM 2.6.1's SM90 functions (``csrc/apis/attention.hpp``
at 54e2261), with their argument order, defaults, output shapes and strides, and their refusals (``TypeError`` /
``ValueError`` naming the argument and its value instead of an assert); ``deep_fp8_gemm.compat`` (and the
``deep_gemm`` drop-in) add the reference's two spellings, ``fp8_fp4_*`` (``q`` as a ``(values, scales-or-None)``
pair, FP4 refused on SM90) and the legacy ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``.

It is not a row of the GEMM kinds table (``deep_fp8_gemm.kinds``): like the quantisers it is an op family module of its
own (layer 6 of ARCHITECTURE.md) over its kernel host code (:mod:`deep_fp8_gemm.kernels.mqa_logits`), and it
dispatches through ``runtime.target.backend_of(device, "attention")``: an sm_90 GPU runs the JIT kernels, CPU
tensors the exact reference below, or with ``DFG_SIMULATE=1`` the same kernels in the CPU simulator.

Which logits are written. Every call returns a view of a fresh buffer whose row stride is the reference's (rows 1024-
byte aligned, slack past the view); the entries a consumer must not read are left as they were allocated
(``torch.empty``) by the kernels, so their top-k must be restricted to the written window, as vLLM's and SGLang's are:

* dense, ``clean_logits=True``: ``logits[i, j]`` for ``j`` in ``[ks[i], ke[i])``, ``-inf`` for every other ``j <
  seq_len_kv`` (windows are clamped to ``[0, seq_len_kv)``; an empty one makes the row all ``-inf``);
* dense, ``clean_logits=False``: only the window is written;
* dense, ``max_seqlen_k > 0`` (compressed, ``clean_logits`` must be False): row ``i`` holds the window from column
  0, ``logits[i, c] = value(i, ks[i] + c)`` for ``c < min(ke[i] - ks[i], max_seqlen_k)``; nothing else is written;
* paged: ``logits[b * next_n + t, p]`` for ``p < min(context_lens[b, t], context_lens[b, next_n - 1],
  max_context_len)`` (the last query's context bounds the row's work, as in the reference's schedule); nothing else.

The exact references (``*_reference``, and CPU tensors) compute in float64 from the dequantised inputs (``q · kv``
exact, the weighted head sum and the scale in float64), round once to the logits dtype and write ``-inf`` at every
entry the kernels leave unwritten. The kernels differ from them by fp32 rounding (and the tensor cores' k32
accumulation).
"""

from __future__ import annotations

import torch

from ._core.checks import check_bool, check_is_tensor, check_same_device, check_tensor, is_meta
from ._core.dispatch import eager
from ._core.family import register_op
from .kernels import mqa_logits as kernels
from .ops import mqa_plans
from .runtime import target
from .runtime.target import Backend

FP8 = torch.float8_e4m3fn
HEADS = kernels.HEADS            # SM90: 32 or 64 heads
HEAD_DIMS = kernels.HEAD_DIMS    # 32, 64 or 128
BLOCK_KV = kernels.BLOCK_KV      # paged cache block (SM90: 64 only)
SPLIT_KV = kernels.TILE_ROWS     # tokens per schedule split (the paged kernel's 256-token tile)
MAX_NEXT_N = 2                   # SM90 paged: next_n 1 or 2
LOGITS_DTYPES = kernels.LOGITS_DTYPES
DENSE_Q_TOKENS = kernels.DENSE_Q_TOKENS
_ROW_ALIGN_BYTES = 1024          # logits rows start 1024-byte aligned (the reference's stride rule)
_NEG_INF = float("-inf")


def _align(x: int, y: int) -> int:
    return (x + y - 1) // y * y


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def _check_logits_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"logits_dtype must be a torch.dtype, got {type(dtype).__name__} ({dtype!r})")
    if dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits_dtype must be torch.float32 or torch.bfloat16, got logits_dtype={dtype}")
    return dtype


def _check_heads(num_heads: int, head_dim: int, name: str, shape) -> None:
    if num_heads not in HEADS:
        raise ValueError(f"{name} must have 32 or 64 heads on SM90 (the reference's SM90 kernels), got "
                         f"{name}.shape={tuple(shape)}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"{name} must have head_dim 32, 64 or 128, got {name}.shape={tuple(shape)}")


def _check_contiguous(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got {name}.stride()={t.stride()} for shape {tuple(t.shape)}")


def _check_weights(weights: object, rows: int, num_heads: int, rows_doc: str) -> None:
    check_is_tensor(weights, "weights")
    if weights.dtype == torch.bfloat16:
        raise TypeError("weights must be float32 on SM90 (bfloat16 weights are the reference's SM100 path), got "
                        f"weights.dtype={weights.dtype}")
    check_tensor(weights, "weights", torch.float32, 2)
    if tuple(weights.shape) != (rows, num_heads):
        raise ValueError(f"weights must be {rows_doc} = ({rows}, {num_heads}), got weights.shape={tuple(weights.shape)}")
    if weights.numel() and weights.stride(1) != 1:
        raise ValueError(f"weights must have a unit last stride, got weights.stride()={weights.stride()}")


# ============================================================================================== dense
def check_dense(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k, logits_dtype) -> tuple[int, int, int, int]:
    """Every argument rule of :func:`fp8_mqa_logits` (the reference's, then the kernels'); returns ``(seq_len,
    seq_len_kv, num_heads, head_dim)``."""
    check_tensor(q, "q", FP8, 3)
    seq_len, num_heads, head_dim = q.shape
    _check_heads(num_heads, head_dim, "q", q.shape)
    _check_contiguous(q, "q")
    check_tensor(kv, "kv[0]", FP8, 2)
    seq_len_kv = kv.shape[0]
    if kv.shape[1] != head_dim:
        raise ValueError(f"kv[0] must be [seq_len_kv, head_dim] with q's head_dim {head_dim}, got "
                         f"kv[0].shape={tuple(kv.shape)}")
    _check_contiguous(kv, "kv[0]")
    check_is_tensor(kv_scales, "kv[1]")
    if kv_scales.dtype == torch.int32:
        raise TypeError("kv[1] must be float32 per-token scales: int32 (packed UE8M0) scales are the FP4 path, SM100 "
                        "only")
    check_tensor(kv_scales, "kv[1]", torch.float32, 1)
    if kv_scales.shape[0] != seq_len_kv:
        raise ValueError(f"kv[1] must be [seq_len_kv] = ({seq_len_kv},), got kv[1].shape={tuple(kv_scales.shape)}")
    _check_contiguous(kv_scales, "kv[1]")
    _check_weights(weights, seq_len, num_heads, "[seq_len, num_heads]")
    for t, name in ((ks, "cu_seq_len_k_start"), (ke, "cu_seq_len_k_end")):
        check_tensor(t, name, torch.int32, 1)
        if t.shape[0] != seq_len:
            raise ValueError(f"{name} must be [seq_len] = ({seq_len},), got {name}.shape={tuple(t.shape)}")
        _check_contiguous(t, name)
    check_bool(clean_logits, "clean_logits")
    _check_int(max_seqlen_k, "max_seqlen_k", 0)
    if max_seqlen_k > 0 and clean_logits:
        raise ValueError(f"clean_logits must be False with compressed logits (max_seqlen_k={max_seqlen_k} > 0), as "
                         "in the reference")
    _check_logits_dtype(logits_dtype)
    check_same_device(q.device, ((kv, "kv[0]"), (kv_scales, "kv[1]"), (weights, "weights"),
                                 (ks, "cu_seq_len_k_start"), (ke, "cu_seq_len_k_end")), first="q")
    return seq_len, seq_len_kv, num_heads, head_dim


def dense_logits_layout(seq_len: int, seq_len_kv: int, num_heads: int, max_seqlen_k: int, logits_dtype: torch.dtype
                        ) -> tuple[tuple[int, int], int]:
    """``((rows, row_stride), width)`` of the buffer and the view's columns, as the reference allocates them:
    ``rows = align(seq_len, 128 / H)``; plain: ``row_stride = align(seq_len_kv + 256, 1024 B)``, width
    ``seq_len_kv``; compressed: ``align(align(max_seqlen_k, 256), 1024 B)``, width ``max_seqlen_k``."""
    per_row = _ROW_ALIGN_BYTES // torch.empty((), dtype=logits_dtype).element_size()
    rows = _align(seq_len, DENSE_Q_TOKENS // num_heads)
    if max_seqlen_k == 0:
        return (rows, _align(seq_len_kv + SPLIT_KV, per_row)), seq_len_kv
    return (rows, _align(_align(max_seqlen_k, SPLIT_KV), per_row)), max_seqlen_k


def _empty_view(buffer_shape: tuple[int, int], rows: int, width: int, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.empty(buffer_shape, dtype=dtype, device=device)[:rows, :width]


def dense_values_f64(q: torch.Tensor, kv: torch.Tensor, kv_scales: torch.Tensor, weights: torch.Tensor,
                     cols: slice | None = None) -> torch.Tensor:
    """float64 ``[seq_len, n]`` ``s_kv[j] · Σ_h w[i, h] · ReLU(q[i, h] · kv[j])`` for the KV rows ``cols`` (default
    all), in KV chunks that keep the ``[seq_len, H, chunk]`` scores below ~64 MB. ``q · kv`` is exact in float64
    (e4m3 products, at most 128 of them)."""
    kv = kv if cols is None else kv[cols]
    kv_scales = kv_scales if cols is None else kv_scales[cols]
    seq_len, num_heads, _ = q.shape
    qf, wf = q.double(), weights.double()[:, :, None]
    out = torch.empty((seq_len, kv.shape[0]), dtype=torch.float64, device=q.device)
    chunk = max(1, (1 << 23) // max(1, seq_len * num_heads))
    for c0 in range(0, kv.shape[0], chunk):
        scores = torch.einsum("mhd,nd->mhn", qf, kv[c0:c0 + chunk].double()).clamp_min_(0)
        out[:, c0:c0 + chunk] = (scores * wf).sum(1) * kv_scales[c0:c0 + chunk].double()[None]
    return out


def _windows(ks: torch.Tensor, ke: torch.Tensor, seq_len_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = ks.long().clamp(0, seq_len_kv), ke.long().clamp(0, seq_len_kv)
    return lo, torch.maximum(hi, lo)


def reference_dense_into(logits, q, kv, kv_scales, weights, ks, ke, max_seqlen_k) -> None:
    """The exact dense reference into ``logits`` (the view :func:`fp8_mqa_logits` returns): every entry written, the
    ones the kernels leave unwritten (or clean) as ``-inf``."""
    seq_len_kv = kv.shape[0]
    lo, hi = _windows(ks, ke, seq_len_kv)
    values = dense_values_f64(q, kv, kv_scales, weights)
    width = logits.shape[1]
    if max_seqlen_k == 0:
        j = torch.arange(seq_len_kv, device=q.device)
        inside = (j[None] >= lo[:, None]) & (j[None] < hi[:, None])
        logits.copy_(values.masked_fill(~inside, _NEG_INF))
        return
    if seq_len_kv == 0:
        logits.fill_(_NEG_INF)
        return
    c = torch.arange(width, device=q.device)
    inside = c[None] < (hi - lo).clamp(max=width)[:, None]
    src = (lo[:, None] + c[None]).clamp(max=seq_len_kv - 1)
    logits.copy_(values.gather(1, src).masked_fill(~inside, _NEG_INF))


def _dense_impl(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k, logits_dtype) -> torch.Tensor:
    seq_len, seq_len_kv, num_heads, head_dim = check_dense(q, kv, kv_scales, weights, ks, ke, clean_logits,
                                                           max_seqlen_k, logits_dtype)
    buffer_shape, width = dense_logits_layout(seq_len, seq_len_kv, num_heads, max_seqlen_k, logits_dtype)
    logits = _empty_view(buffer_shape, seq_len, width, logits_dtype, q.device)
    if is_meta(q):
        return logits
    backend = target.backend_of(q.device, "attention")
    if backend is Backend.REFERENCE:
        reference_dense_into(logits, q, kv, kv_scales, weights, ks, ke, max_seqlen_k)
        return logits
    config = kernels.dense_config(num_heads, head_dim, logits_dtype, clean_logits, max_seqlen_k > 0)
    kernels.launch_dense(config, _tma_ready(q), _tma_ready(kv), _tma_ready(kv_scales), _tma_rows(weights), ks, ke,
                         logits, width, backend)
    return logits


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous) at a 16-byte aligned address, as a TMA map needs it: a copy only when it is not."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _tma_rows(w: torch.Tensor) -> torch.Tensor:
    """Weights rows at a 16-byte aligned address and row stride (the TMA map's), else a contiguous copy."""
    if w.data_ptr() % 16 == 0 and (w.stride(0) * 4) % 16 == 0 and w.stride(0) >= w.shape[1]:
        return w
    return w.clone(memory_format=torch.contiguous_format)


def _dense_fake(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k, logits_dtype):
    seq_len, seq_len_kv, num_heads, _ = check_dense(q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k,
                                                    logits_dtype)
    (_, stride), width = dense_logits_layout(seq_len, seq_len_kv, num_heads, max_seqlen_k, logits_dtype)
    return torch.empty_strided((seq_len, width), (stride, 1), dtype=logits_dtype, device=q.device)


DENSE_OP = register_op(
    "fp8_mqa_logits", "(Tensor q, Tensor kv, Tensor kv_scales, Tensor weights, Tensor cu_seq_len_k_start, "
    "Tensor cu_seq_len_k_end, bool clean_logits, int max_seqlen_k, ScalarType logits_dtype) -> Tensor",
    _dense_impl, _dense_fake)


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True,
                   max_seqlen_k: int = 0, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Indexer logits of ``seq_len`` queries against a contiguous KV (prefill), each query over its own window.

    Args:
        q: ``[seq_len, H, D]`` float8_e4m3fn, contiguous; ``H`` 32 or 64, ``D`` 32, 64 or 128.
        kv: ``(kv, kv_scales)``: ``[seq_len_kv, D]`` float8_e4m3fn contiguous, ``[seq_len_kv]`` float32 contiguous
            (one scale per token).
        weights: ``[seq_len, H]`` float32 (any sign), unit last stride.
        cu_seq_len_k_start, cu_seq_len_k_end: ``[seq_len]`` int32 contiguous: query ``i`` scores KV rows
            ``[ks[i], ke[i])``, clamped to ``[0, seq_len_kv)`` (values are not read on the host).
        clean_logits: write ``-inf`` at every other column ``< seq_len_kv`` (not with ``max_seqlen_k > 0``).
        max_seqlen_k: 0, or the compressed form's width: row ``i`` holds its window from column 0 (at most this
            many columns), so the ``[seq_len, seq_len_kv]`` matrix is never materialised.
        logits_dtype: torch.float32 or torch.bfloat16.

    Returns:
        ``[seq_len, seq_len_kv]`` (compressed: ``[seq_len, max_seqlen_k]``) of ``logits_dtype``: a view of a fresh
        ``[align(seq_len, 128 / H), row_stride]`` buffer, ``row_stride`` = ``align(seq_len_kv + 256, 1024 B)``
        (compressed ``align(align(max_seqlen_k, 256), 1024 B)``) elements; which entries are written: the module
        docstring.

    Raises:
        TypeError / ValueError: the reference's refusals (heads other than 32 / 64, bfloat16 weights, int32 KV
        scales, ``clean_logits`` with compressed logits, ...) and wrong shapes, dtypes, devices, contiguity.
    """
    kv_values, kv_scales = kv if type(kv) is tuple and len(kv) == 2 else _pair(kv, "kv")
    return _dense_entry(q, kv_values, kv_scales, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                        max_seqlen_k, logits_dtype)


def _dense_general(*args) -> torch.Tensor:  # (q, kv, kv_scales, weights, ks, ke, clean_logits, max_seqlen_k, dtype)
    if eager(*args[:6]):  # the op's path; else the custom op (tracing, a dispatch mode, a tensor subclass)
        return _dense_impl(*args)
    for t, name in zip(args, ("q", "kv[0]", "kv[1]", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end")):
        check_is_tensor(t, name)
    return DENSE_OP(*args[:6], check_bool(args[6], "clean_logits"), _check_int(args[7], "max_seqlen_k", 0),
                    _check_logits_dtype(args[8]))


def fp8_mqa_logits_reference(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits: bool = True,
                             max_seqlen_k: int = 0, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The exact reference of :func:`fp8_mqa_logits` (same signature, shape and strides), on any device: every
    entry written, ``-inf`` wherever the kernels write ``-inf`` or nothing."""
    kv_values, kv_scales = _pair(kv, "kv")
    seq_len, seq_len_kv, num_heads, _ = check_dense(q, kv_values, kv_scales, weights, cu_seq_len_k_start,
                                                    cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype)
    buffer_shape, width = dense_logits_layout(seq_len, seq_len_kv, num_heads, max_seqlen_k, logits_dtype)
    logits = _empty_view(buffer_shape, seq_len, width, logits_dtype, q.device)
    reference_dense_into(logits, q, kv_values, kv_scales, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                         max_seqlen_k)
    return logits


def _pair(pair: object, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (values, scales) pair, got {type(pair).__name__}")
    return pair[0], pair[1]


# ============================================================================================== paged
def check_metadata_args(context_lens, block_kv, num_sms) -> tuple[int, int]:
    """Every argument rule of :func:`get_paged_mqa_logits_metadata`; returns ``(batch, next_n)``."""
    _check_context_lens(context_lens)
    _check_contiguous(context_lens, "context_lens")
    _check_int(block_kv, "block_kv", 1)
    if block_kv != BLOCK_KV:
        raise ValueError(f"block_kv must be {BLOCK_KV} on SM90, got block_kv={block_kv}")
    _check_int(num_sms, "num_sms", 1)
    return context_lens.shape[0], context_lens.shape[1]


def _metadata_impl(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    batch, next_n = check_metadata_args(context_lens, block_kv, num_sms)
    out = torch.empty((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)
    if is_meta(context_lens):
        return out
    device = context_lens.device
    atom = 2 if next_n >= 2 else 1
    atoms = (next_n + atom - 1) // atom
    splits = (context_lens[:, -1].long().clamp_min(0) + SPLIT_KV - 1) // SPLIT_KV if batch else \
        torch.zeros(0, dtype=torch.long, device=device)
    prefix = torch.cumsum(splits, 0)
    # ext[i] = splits of rows < i; ext[batch + 1] = total again: a split past the last row has no segments.
    ext = torch.cat([torch.zeros(1, dtype=torch.long, device=device), prefix, prefix[-1:] if batch else
                     torch.zeros(1, dtype=torch.long, device=device)])
    total = ext[-1] * atoms
    share, rest = total // num_sms, total % num_sms
    sm = torch.arange(num_sms, device=device)
    # The reference's "reversed allocation": the first num_sms - rest SMs get `share` segments, the last rest one more.
    seg = sm * share + (sm - (num_sms - rest)).clamp_min(0)
    row = torch.searchsorted(prefix * atoms, seg, right=True)
    segs = ext[row + 1] - ext[row]
    offset = seg - ext[row] * atoms
    some = segs > 0
    out[:num_sms, 0] = row * atoms + torch.where(some, offset // segs.clamp_min(1), 0)
    out[:num_sms, 1] = torch.where(some, offset % segs.clamp_min(1), 0)
    out[num_sms, 0] = batch * atoms
    out[num_sms, 1] = 0
    return out


def _metadata_fake(context_lens, block_kv, num_sms):
    check_metadata_args(context_lens, block_kv, num_sms)
    return torch.empty((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)


METADATA_OP = register_op("get_paged_mqa_logits_metadata", "(Tensor context_lens, int block_kv, int num_sms) -> Tensor",
                          _metadata_impl, _metadata_fake)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """The paged logits' work split over ``num_sms`` persistent CTAs, as the reference's SM90 metadata kernel.

    Args:
        context_lens: ``[batch, next_n]`` int32 contiguous (2-D only, as the reference); row ``b``'s work is
            ``ceil(context_lens[b, next_n - 1] / 256)`` splits of 256 tokens (negative lengths count as 0).
        block_kv: the cache's block size, 64 (the only SM90 one).
        num_sms: CTAs of the paged launch; :func:`fp8_paged_mqa_logits` requires ``get_num_sms()``.

    Returns:
        ``[num_sms + 1, 2]`` int32 on ``context_lens``' device: row ``c`` = ``(row atom, split)`` where CTA ``c``
        starts (next_n <= 2: the atom is the batch row), the last row ``(batch x atoms, 0)``; CTA ``c`` does the
        splits from row ``c`` up to row ``c + 1``. Computed with torch ops on the device (no host synchronisation:
        capturable in a CUDA graph); the values are the reference's.
    """
    if eager(context_lens):
        return _metadata_impl(context_lens, block_kv, num_sms)
    check_is_tensor(context_lens, "context_lens")
    return METADATA_OP(context_lens, _check_int(block_kv, "block_kv", 1), _check_int(num_sms, "num_sms", 1))


def check_paged(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits,
                logits_dtype) -> tuple[int, int, int, int]:
    """Every argument rule of :func:`fp8_paged_mqa_logits`; returns ``(batch, next_n, num_heads, head_dim)``."""
    check_tensor(q, "q", FP8, 4)
    batch, next_n, num_heads, head_dim = q.shape
    if next_n < 1 or next_n > MAX_NEXT_N:
        raise ValueError(f"q must have next_n 1 or 2 on SM90 (the reference's SM90 kernel), got "
                         f"q.shape={tuple(q.shape)}")
    _check_heads(num_heads, head_dim, "q", q.shape)
    _check_contiguous(q, "q")
    check_tensor(kv_cache, "kv_cache", torch.uint8, 4)
    _, block_kv, heads_kv, row_bytes = kv_cache.shape
    if block_kv != BLOCK_KV:
        raise ValueError(f"kv_cache must have blocks of {BLOCK_KV} tokens on SM90, got kv_cache.shape="
                         f"{tuple(kv_cache.shape)}")
    if heads_kv != 1 or row_bytes != head_dim + 4:
        raise ValueError(f"kv_cache must be [num_blocks, 64, 1, head_dim + 4] (head_dim {head_dim} e4m3 bytes and a "
                         f"float32 scale per token), got kv_cache.shape={tuple(kv_cache.shape)}")
    if kv_cache.stride(1) != row_bytes or kv_cache.stride(3) != 1:
        raise ValueError(f"kv_cache must have stride(1) == head_dim + 4 and stride(3) == 1, got "
                         f"kv_cache.stride()={kv_cache.stride()}")
    if kv_cache.stride(0) % 16:
        raise ValueError("kv_cache's block stride must be a multiple of 16 bytes (the reference's is of 4; the TMA "
                         f"maps need 16), got kv_cache.stride()={kv_cache.stride()}")
    _check_weights(weights, batch * next_n, num_heads, "[batch * next_n, num_heads]")
    _check_contiguous(weights, "weights")
    _check_context_lens(context_lens)
    if tuple(context_lens.shape) != (batch, next_n):
        raise ValueError(f"context_lens must be [batch, next_n] = ({batch}, {next_n}), got "
                         f"context_lens.shape={tuple(context_lens.shape)}")
    _check_contiguous(context_lens, "context_lens")
    check_tensor(block_table, "block_table", torch.int32, 2)
    if block_table.shape[0] != batch or (block_table.shape[1] and block_table.stride(1) != 1):
        raise ValueError(f"block_table must be [batch, max_blocks] = ({batch}, *) with a unit last stride, got "
                         f"block_table.shape={tuple(block_table.shape)} stride={block_table.stride()}")
    check_tensor(schedule_meta, "schedule_meta", torch.int32, 2)
    from .utils import get_num_sms

    num_sms = get_num_sms()
    if tuple(schedule_meta.shape) != (num_sms + 1, 2):
        raise ValueError(f"schedule_meta must be [get_num_sms() + 1, 2] = ({num_sms + 1}, 2) (from "
                         "get_paged_mqa_logits_metadata with num_sms=get_num_sms()), got "
                         f"schedule_meta.shape={tuple(schedule_meta.shape)}")
    _check_contiguous(schedule_meta, "schedule_meta")
    _check_int(max_context_len, "max_context_len", 0)
    check_bool(clean_logits, "clean_logits")
    if clean_logits:
        raise ValueError("clean_logits must be False: the reference cleans paged logits only for 1-D context lengths, "
                         "and it takes 2-D ones only")
    _check_logits_dtype(logits_dtype)
    check_same_device(q.device, ((kv_cache, "kv_cache"), (weights, "weights"), (context_lens, "context_lens"),
                                 (block_table, "block_table"), (schedule_meta, "schedule_meta")), first="q")
    return batch, next_n, num_heads, head_dim


def _check_context_lens(context_lens) -> None:
    check_is_tensor(context_lens, "context_lens")
    if context_lens.dim() != 2:
        raise ValueError("context_lens must be 2-D [batch, next_n] (the reference supports only 2-D context lengths), "
                         f"got context_lens.shape={tuple(context_lens.shape)}")
    check_tensor(context_lens, "context_lens", torch.int32, 2)


def check_block_table_covers(context_lens: torch.Tensor, block_table: torch.Tensor) -> None:
    """The block table has an entry for every block of every row's context (CPU tensors: the values are read; on a GPU
    a short table makes the kernel read the next row's entries)."""
    if context_lens.numel() == 0:
        return
    need = (int(context_lens[:, -1].max().item()) + BLOCK_KV - 1) // BLOCK_KV
    if need > block_table.shape[1]:
        raise ValueError(f"block_table must have at least ceil(max(context_lens[:, -1]) / 64) = {need} columns, got "
                         f"block_table.shape={tuple(block_table.shape)}")


def paged_logits_layout(rows: int, max_context_len: int, logits_dtype: torch.dtype) -> tuple[int, int]:
    """``(rows, row_stride)`` of the paged logits' buffer: ``align(align(max_context_len, 256), 1024 B)``."""
    per_row = _ROW_ALIGN_BYTES // torch.empty((), dtype=logits_dtype).element_size()
    return rows, _align(_align(max_context_len, SPLIT_KV), per_row)


def paged_cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [num_blocks, 64, D] e4m3, scales [num_blocks, 64] float32)`` of a fused cache: each block's 64 x D
    value bytes, then its 64 scales (4 bytes each), blocks ``kv_cache.stride(0)`` bytes apart."""
    num_blocks, block_kv, _, row_bytes = kv_cache.shape
    head_dim = row_bytes - 4
    stride, offset = kv_cache.stride(0), kv_cache.storage_offset()
    values = torch.as_strided(kv_cache, (num_blocks, block_kv, head_dim), (stride, head_dim, 1), offset).view(FP8)
    scales = torch.as_strided(kv_cache, (num_blocks, block_kv * 4), (stride, 1), offset + block_kv * head_dim)
    return values, scales.contiguous().view(torch.float32)


def reference_paged_into(logits, q, kv_cache, weights, context_lens, block_table) -> None:
    """The exact paged reference into ``logits``: row ``b * next_n + t``, positions ``p < min(context_lens[b, t],
    context_lens[b, next_n - 1], width)`` through the block table (an entry outside ``[0, num_blocks)`` reads as
    zeros, as the kernel's TMA does), ``-inf`` elsewhere."""
    batch, next_n = q.shape[:2]
    values, scales = paged_cache_views(kv_cache)
    num_blocks, width = values.shape[0], logits.shape[1]
    logits.fill_(_NEG_INF)
    lens = context_lens.long().clamp_min(0).tolist()
    for b in range(batch):
        length = min(lens[b][-1], width)
        if length == 0:
            continue
        pos = torch.arange(length, device=q.device)
        entries = block_table[b, pos // BLOCK_KV].long()
        valid = (entries >= 0) & (entries < num_blocks)
        entries = entries.clamp(0, max(num_blocks - 1, 0))
        kv_b = values[entries, pos % BLOCK_KV]
        s_b = torch.where(valid, scales[entries, pos % BLOCK_KV].double(), 0.0)
        kv_b = torch.where(valid[:, None], kv_b.double(), 0.0)
        for t in range(next_n):
            n = min(lens[b][t], length)
            if n <= 0:
                continue
            v = dense_values_f64(q[b, t][None], kv_b[:n], s_b[:n], weights[b * next_n + t][None])
            logits[b * next_n + t, :n] = v[0]


def _paged_impl(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits,
                logits_dtype) -> torch.Tensor:
    batch, next_n, num_heads, head_dim = check_paged(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                                                     max_context_len, clean_logits, logits_dtype)
    shape = paged_logits_layout(batch * next_n, max_context_len, logits_dtype)
    logits = _empty_view(shape, batch * next_n, max_context_len, logits_dtype, q.device)
    if is_meta(q):
        return logits
    if q.device.type == "cpu":
        check_block_table_covers(context_lens, block_table)
    backend = target.backend_of(q.device, "attention")
    if backend is Backend.REFERENCE:
        reference_paged_into(logits, q, kv_cache, weights, context_lens, block_table)
        return logits
    if kv_cache.data_ptr() % 16:
        raise ValueError(f"kv_cache must start 16-byte aligned (TMA), got kv_cache.data_ptr()={kv_cache.data_ptr():#x}")
    config = kernels.paged_config(num_heads, head_dim, next_n, logits_dtype)
    kernels.launch_paged(config, _tma_ready(q), kv_cache, _tma_ready(weights), context_lens, block_table,
                         schedule_meta, logits, max_context_len, backend)
    return logits


def _paged_fake(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits,
                logits_dtype):
    batch, next_n, _, _ = check_paged(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                                      clean_logits, logits_dtype)
    rows, stride = paged_logits_layout(batch * next_n, max_context_len, logits_dtype)
    return torch.empty_strided((rows, max_context_len), (stride, 1), dtype=logits_dtype, device=q.device)


PAGED_OP = register_op(
    "fp8_paged_mqa_logits", "(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table, "
    "Tensor schedule_meta, int max_context_len, bool clean_logits, ScalarType logits_dtype) -> Tensor",
    _paged_impl, _paged_fake)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Indexer logits of ``batch`` decode rows (``next_n`` queries each, MTP) against a paged FP8 KV cache.

    Args:
        q: ``[batch, next_n, H, D]`` float8_e4m3fn contiguous; ``next_n`` 1 or 2, ``H`` 32 or 64, ``D`` 32/64/128.
        kv_cache: ``[num_blocks, 64, 1, D + 4]`` uint8, ``stride(1) == D + 4``, ``stride(3) == 1``, a block stride
            (``stride(0)``) of a multiple of 16 bytes: each block holds its 64 tokens' ``D`` e4m3 bytes back to back,
            then their 64 float32 scales.
        weights: ``[batch * next_n, H]`` float32 contiguous.
        context_lens: ``[batch, next_n]`` int32 contiguous: query ``t`` of row ``b`` sees tokens
            ``p < context_lens[b, t]`` (at most ``context_lens[b, next_n - 1]``, the row's scheduled work).
        block_table: ``[batch, max_blocks]`` int32, unit last stride (any row stride): token ``p`` of row ``b`` is
            slot ``p % 64`` of cache block ``block_table[b, p // 64]``.
        schedule_meta: ``get_paged_mqa_logits_metadata(context_lens, 64, get_num_sms())``.
        max_context_len: the logits' width (at least every context length for all of them to be written).
        clean_logits: must be False (the reference refuses True with 2-D context lengths).
        logits_dtype: torch.float32 or torch.bfloat16.

    Returns:
        ``[batch * next_n, max_context_len]`` of ``logits_dtype``, a view of a fresh buffer with row stride
        ``align(align(max_context_len, 256), 1024 B)`` elements; row ``b * next_n + t`` written at ``p <
        min(context_lens[b, t], context_lens[b, next_n - 1], max_context_len)`` only.

    Raises:
        TypeError / ValueError: the reference's refusals (heads, ``next_n > 2``, block size other than 64, 1-D
        context lengths, ``clean_logits=True``, metadata not of ``get_num_sms()`` rows, bfloat16 weights) and
        wrong shapes, dtypes, devices, contiguity.
    """
    return _paged_entry(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits,
                        logits_dtype)  # eager calls: the plans; else (tracing, ...) _paged_traced


def _paged_traced(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits,
                  logits_dtype) -> torch.Tensor:
    """:func:`fp8_paged_mqa_logits` through the custom op (tracing, a dispatch mode, a tensor subclass), or eagerly
    when ``eager()`` allows it."""
    args = (q, kv_cache, weights, context_lens, block_table, schedule_meta)
    if eager(*args):
        return _paged_impl(*args, max_context_len, clean_logits, logits_dtype)
    for t, name in zip(args, ("q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta")):
        check_is_tensor(t, name)
    return PAGED_OP(*args, _check_int(max_context_len, "max_context_len", 0), check_bool(clean_logits, "clean_logits"),
                    _check_logits_dtype(logits_dtype))


def fp8_paged_mqa_logits_reference(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                                   max_context_len: int, clean_logits: bool = False,
                                   logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The exact reference of :func:`fp8_paged_mqa_logits` (same signature, shape and strides), on any device:
    ``-inf`` wherever the kernel writes nothing."""
    batch, next_n, _, _ = check_paged(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                                      clean_logits, logits_dtype)
    check_block_table_covers(context_lens, block_table)
    shape = paged_logits_layout(batch * next_n, max_context_len, logits_dtype)
    logits = _empty_view(shape, batch * next_n, max_context_len, logits_dtype, q.device)
    reference_paged_into(logits, q, kv_cache, weights, context_lens, block_table)
    return logits


# The eager entries (ops.mqa_plans): built here, after the paths they fall back to.
_paged_entry = mqa_plans.paged_entry(check_paged, _paged_impl, paged_logits_layout, _paged_traced)
_dense_entry = mqa_plans.dense_entry(check_dense, _dense_impl, dense_logits_layout, _dense_general)
