"""Leaving SMs to communication kernels that overlap the GEMMs.

The GEMMs are persistent: one CTA per SM for :func:`deep_fp8_gemm.get_num_sms` SMs (all of them by default),
each looping over tiles until the problem is done. A communication kernel launched on another stream
(NCCL's all-to-all / all-reduce, DeepEP's dispatch and combine) then finds no free SM and waits for the GEMM
to finish, so nothing overlaps. :func:`deep_fp8_gemm.set_num_sms` caps the GEMMs' grid: with ``132 - c`` SMs
for the GEMMs, the ``c`` others stay free for the communication kernel (NCCL uses one CTA per channel:
``NCCL_MAX_NCHANNELS`` / ``NCCL_MIN_NCHANNELS`` bound it, typically 16-32 on NVLink; DeepEP's ``Buffer``
takes its SM count as a setting, 20-24 in DeepSeek's configs). The heuristic then plans waves over the
smaller count (so the tile shape may change too) and caps the grid at it; configurations that differ only in
grid size share one compiled binary.

Without overlap (the collectives of this package run between the GEMMs, on the same stream) there is nothing
to reserve: the GEMMs should keep every SM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import utils

__all__ = ["reserve_sms"]


@contextlib.contextmanager
def reserve_sms(num_comm_sms: int) -> Iterator[int]:
    """Within the ``with`` block the GEMMs use ``get_num_sms() - num_comm_sms`` SMs (yielded); the previous
    setting (an explicit :func:`set_num_sms` value, or none) comes back afterwards.

    ``num_comm_sms`` must be an int in ``[0, get_num_sms() - 1]``. Process-wide (not per stream or thread),
    like :func:`set_num_sms`; a kernel launched inside the block keeps its grid when it runs later.
    """
    if isinstance(num_comm_sms, bool) or not isinstance(num_comm_sms, int):
        raise TypeError(f"num_comm_sms must be an int, got {type(num_comm_sms).__name__} ({num_comm_sms!r})")
    available = utils.get_num_sms()
    if not 0 <= num_comm_sms < available:
        raise ValueError(f"num_comm_sms must be in [0, {available - 1}] (get_num_sms()={available}), "
                         f"got {num_comm_sms=}")
    previous = utils.PROCESS_SETTINGS.num_sms_override
    utils.set_num_sms(available - num_comm_sms)
    try:
        yield available - num_comm_sms
    finally:
        if previous is None:
            utils.reset_num_sms()
        else:
            utils.set_num_sms(previous)
