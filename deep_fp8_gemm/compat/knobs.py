"""The reference design's runtime knobs (process-wide, SM90 semantics), the knobs part of :mod:`deep_fp8_gemm.compat`.

* ``set_num_sms`` / ``get_num_sms``: as the reference's (``device_runtime.hpp``): ``num_sms`` in ``[0, device SM
  count]`` (with no CUDA device: ``[0, 132]``), 0 meaning every SM of the device. The package's own
  :func:`deep_fp8_gemm.set_num_sms` is this function.
* ``set_mk_alignment_for_contiguous_layout`` / ``get_mk_alignment_for_contiguous_layout`` (64 or 128: the contiguous
  kernels' BLOCK_M, :func:`deep_fp8_gemm.utils.set_mk_alignment_for_contiguous_layout`), and the theoretical
  alignment, which the reference keeps at 128 on SM90 whatever the setting.
* ``set_pdl`` / ``get_pdl``: programmatic dependent launch of every GEMM, quantiser and map-builder launch (each
  kernel waits on its predecessor with ``griddepcontrol.wait`` either way).
* ``use_deterministic_algorithms`` (DeepGEMM 2.8's setter): ``True`` turns the batch-invariant mode on
  (:func:`deep_fp8_gemm.set_batch_invariant`, the default); ``False`` is accepted and changes nothing.
* ``set_tc_util`` / ``get_tc_util``, ``set_ignore_compile_dims``, ``set_block_size_multiple_of``: validated as the
  reference does and held in :data:`RUNTIME_KNOBS` without effect on this library's heuristic (it has its own
  cost model).
"""

from __future__ import annotations

import dataclasses

from .._core.checks import check_bool
from ..constants import DEFAULT_CONTIGUOUS_ALIGNMENT
from ..utils import (get_m_alignment_for_contiguous_layout, get_num_sms, get_pdl, get_tma_aligned_size,
                     set_batch_invariant, set_mk_alignment_for_contiguous_layout, set_num_sms, set_pdl)
from .arguments import int_tuple


# ---------------------------------------------------------------------------------------------- layout helpers
def get_mk_alignment_for_contiguous_layout() -> int:
    """Rows (M-grouped) each group of a contiguous layout is aligned to: 128, or 64 after
    ``set_mk_alignment_for_contiguous_layout(64)`` (the contiguous kernels' BLOCK_M)."""
    return get_m_alignment_for_contiguous_layout()


#: The K-grouped spelling of the same alignment (the reference's 2.0 name).
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """The alignment the reference recommends for ``expected_m`` rows per group: on SM90 always 128 (its value
    there; the SM100 kernels shrink it with ``expected_m``). ``set_mk_alignment_for_contiguous_layout(64)``
    is still available here and halves the worst-case padding per expert. One optional argument, as in
    DeepGEMM 2.6.1 (vLLM passes ``num_groups`` too and falls back on the ``TypeError``)."""
    if expected_m is not None and (isinstance(expected_m, bool) or not isinstance(expected_m, int)):
        raise TypeError(f"expected_m must be an int or None, got {type(expected_m).__name__} ({expected_m!r})")
    return DEFAULT_CONTIGUOUS_ALIGNMENT


# ---------------------------------------------------------------------------------------------- runtime knobs
@dataclasses.dataclass
class RuntimeKnobs:
    """The reference's runtime knobs that change nothing here, validated and held (process-wide)."""

    tc_util: int = 0
    ignore_compile_dims: bool = False
    block_size_multiple_of: tuple[int, int] = (1, 1)


#: The one instance.
RUNTIME_KNOBS = RuntimeKnobs()


def use_deterministic_algorithms(enabled: bool = True) -> None:
    """DeepGEMM 2.8's setter (its 2.8.1 exports only this, no getter). ``True``: the batch-invariant mode
    (:func:`deep_fp8_gemm.set_batch_invariant`; on by default here): no split-K, no swap-AB, so results are
    deterministic and a row does not depend on its batch. ``False`` is validated and changes nothing: the reference's
    documented meaning for it could not be cited (2.8 made ``False`` its default and sent BF16 GEMMs to cuBLASLt),
    so this library's fast mode is only ``deep_fp8_gemm.set_batch_invariant(False)``."""
    if check_bool(enabled, "enabled"):
        set_batch_invariant(True)


def set_tc_util(tc_util: int) -> None:
    """The reference's tensor-core utilisation hint, an int in ``[0, 100]``; held, no effect here."""
    if isinstance(tc_util, bool) or not isinstance(tc_util, int):
        raise TypeError(f"tc_util must be an int, got {type(tc_util).__name__} ({tc_util!r})")
    if not 0 <= tc_util <= 100:
        raise ValueError(f"tc_util must be in [0, 100], got {tc_util}")
    RUNTIME_KNOBS.tc_util = tc_util


def get_tc_util() -> int:
    """The value :func:`set_tc_util` holds (0 by default)."""
    return RUNTIME_KNOBS.tc_util


def set_ignore_compile_dims(value: bool) -> None:
    """The reference's switch to compile no dims into its kernels; held, no effect here (N and K are always
    compiled in, M never: ``compiled_dims`` is a hint in this library)."""
    RUNTIME_KNOBS.ignore_compile_dims = check_bool(value, "value")


def set_block_size_multiple_of(value: int | tuple[int, int]) -> None:
    """The reference's constraint on its heuristic's BLOCK_M / BLOCK_N (an int for both, or a pair); validated
    (positive ints) and held, no effect on this library's heuristic."""
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    pair = int_tuple(pair, 2, "value")
    if min(pair) < 1:
        raise ValueError(f"block size multiples must be positive, got {value!r}")
    RUNTIME_KNOBS.block_size_multiple_of = pair


__all__ = ["RUNTIME_KNOBS", "RuntimeKnobs", "get_k_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout",
           "get_tma_aligned_size",
           "get_mk_alignment_for_contiguous_layout", "get_num_sms", "get_pdl", "get_tc_util",
           "get_theoretical_mk_alignment_for_contiguous_layout", "set_block_size_multiple_of", "set_ignore_compile_dims",
           "set_mk_alignment_for_contiguous_layout", "set_num_sms", "set_pdl", "set_tc_util",
           "use_deterministic_algorithms"]
