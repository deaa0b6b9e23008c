"""Test-filtering helpers with the reference's contracts."""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch


def get_arch_major() -> int:
    """The current CUDA device's compute-capability major; 9 (the architecture deep_fp8_gemm's kernels, CPU
    reference and simulator implement) when no CUDA device is visible, so the reference's SM90 test paths run
    on CPU tensors."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_capability()[0]
    return 9


def test_filter(condition: Callable[[], bool]):
    """Decorator: run the function only when ``condition()`` holds, else print that it was filtered."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if condition():
                return func(*args, **kwargs)
            print(f"{func.__name__}:\n > Filtered by {condition}\n")
            return None
        return wrapper
    return decorator


test_filter.__test__ = False  # a helper, not a test, for pytest's collection


def ignore_env(name: str, condition: Callable[[], bool]):
    """Decorator: when ``condition()`` holds, run the function with environment variable ``name`` removed (and
    put it back afterwards)."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not condition():
                return func(*args, **kwargs)
            saved = os.environ.pop(name, None)
            try:
                return func(*args, **kwargs)
            finally:
                if saved is not None:
                    os.environ[name] = saved
        return wrapper
    return decorator


__all__ = ["get_arch_major", "ignore_env", "test_filter"]
