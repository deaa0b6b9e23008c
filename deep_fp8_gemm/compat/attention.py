"""The reference design's indexer names (DeepGEMM 2.6.1, ``csrc/apis/attention.hpp`` ``register_apis``), their
arguments, defaults and positional order, on :mod:`deep_fp8_gemm.attention`:

* ``fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
  logits_dtype=torch.float32)`` and ``fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
  schedule_meta, max_context_len, clean_logits=False, logits_dtype=torch.float32, indices=None)``: ``q`` is a
  ``(values, scales)`` pair whose scales must be None here (FP4 Q is the reference's SM100 path);
* the legacy ``fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
  max_seqlen_k=0)`` and ``fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
  max_context_len, clean_logits=False, indices=None)``: bare ``q``, float32 logits;
* ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None)``.

``indices`` (variable-length rows) is SM100-only in the reference: anything but None is refused.
"""

from __future__ import annotations

import torch

from .. import attention

__all__ = ["fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_mqa_logits", "fp8_paged_mqa_logits",
           "get_paged_mqa_logits_metadata"]


def _fp8_q(q: object) -> torch.Tensor:
    """The values of a ``(values, scales-or-None)`` q; FP4 (scales given) is refused on SM90."""
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        raise TypeError(f"q must be a (values, scales) pair with scales None for FP8, got {type(q).__name__}")
    if q[1] is not None:
        raise ValueError("q[1] (FP4 scales) must be None: FP4 Q is the reference's SM100 path; SM90 takes FP8 Q "
                         "(pass (q, None))")
    return q[0]


def _no_indices(indices: object) -> None:
    if indices is not None:
        raise ValueError("indices must be None: variable-length paged rows are the reference's SM100 path")


def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits: bool = True,
                       max_seqlen_k: int = 0, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`deep_fp8_gemm.attention.fp8_mqa_logits` with ``q = (values, None)``."""
    return attention.fp8_mqa_logits(_fp8_q(q), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                                    max_seqlen_k, logits_dtype)


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len: int,
                             clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32,
                             indices=None) -> torch.Tensor:
    """:func:`deep_fp8_gemm.attention.fp8_paged_mqa_logits` with ``q = (values, None)``."""
    if indices is not None:
        _no_indices(indices)
    # The common call (a (values, None) tuple) without _fp8_q's frame: this runs per layer per decode step.
    values = q[0] if type(q) is tuple and len(q) == 2 and q[1] is None else _fp8_q(q)
    return attention.fp8_paged_mqa_logits(values, kv_cache, weights, context_lens, block_table, schedule_meta,
                                          max_context_len, clean_logits, logits_dtype)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits: bool = True,
                   max_seqlen_k: int = 0) -> torch.Tensor:
    """The legacy spelling: :func:`fp8_fp4_mqa_logits` with a bare ``q`` and float32 logits."""
    return attention.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len: int,
                         clean_logits: bool = False, indices=None) -> torch.Tensor:
    """The legacy spelling: :func:`fp8_fp4_paged_mqa_logits` with a bare ``q`` and float32 logits."""
    _no_indices(indices)
    return attention.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                                          max_context_len, clean_logits)


def get_paged_mqa_logits_metadata(context_lens, block_kv: int, num_sms: int, indices=None) -> torch.Tensor:
    """:func:`deep_fp8_gemm.attention.get_paged_mqa_logits_metadata`; ``indices`` must be None."""
    _no_indices(indices)
    return attention.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)
