"""GPU test helpers: ``requires_sm90`` skips a test (with the reason) unless an sm_90 device is visible."""

from __future__ import annotations

import functools

import pytest
import torch


@functools.lru_cache(maxsize=None)
def sm90_skip_reason() -> str | None:
    """None when the current CUDA device is sm_90, else why GPU tests cannot run here."""
    if not torch.cuda.is_available():
        return "no CUDA driver/device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"device is sm_{major}{minor}, need sm_90"
    return None


def has_sm90() -> bool:
    return sm90_skip_reason() is None


requires_sm90 = pytest.mark.skipif(not has_sm90(), reason=sm90_skip_reason() or "")
