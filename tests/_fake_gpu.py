"""A GPU faked on the CPU for the per-call plans' tests (``tests/ops/test_*_plans.py``): the driver is
tests/runtime/test_driver.py's FakeDriver (the real binding's types; it records every launch), tensor maps "encode"
to 128 bytes that name their spec, and after ``fake.on()`` ``runtime.target`` maps CPU tensors to GPU 0 (capability
9.0, the given current stream, not capturing), so a plan's parameter bytes can be compared with the op's own launch.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Callable, Iterator

from deep_fp8_gemm._core import plans
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime import target
from tests.runtime.test_driver import FakeDriver


def map_bytes(spec) -> bytes:
    """The 128 bytes a faked encode returns for ``spec``: one value per distinct spec."""
    return hashlib.sha512(repr(spec).encode()).digest() * 2


@contextlib.contextmanager
def fake_gpu(monkeypatch, param_size: int | None = None, *, caches: tuple[Callable[[], None], ...] = (),
             validate_maps: bool = False) -> Iterator[FakeDriver]:
    """The faked driver (``fake.launches``, ``fake.specs``: the encoded map specs in order; ``fake.on(stream=0x77)``
    turns CPU tensors into GPU 0's, call it after building the operands). ``param_size``: what the fake reports as
    the kernels' parameter size; ``caches``: the loaded-kernel caches to clear before and after (a kernel "loaded"
    into the fake must not serve a later test); ``validate_maps``: refuse a map spec as the real encoder does. Every
    plan is forgotten on exit: plans made against the fake GPU must not serve later CPU calls."""
    fake = FakeDriver()
    if param_size is not None:
        fake.param_sizes = [param_size]
    monkeypatch.setattr(drv, "driver", fake)
    drv._reset_for_tests()
    for clear in caches:
        clear()
    specs = []

    def encode(spec):
        if validate_maps:
            spec.validate()
        specs.append(spec)
        return map_bytes(spec)

    monkeypatch.setattr(drv, "encode_tensor_map", encode)

    def on(stream: int = 0x77) -> None:
        monkeypatch.setattr(target, "gpu_index", lambda device: None if device.type == "meta" else 0)
        monkeypatch.setattr(target, "capability", lambda index: (9, 0))
        monkeypatch.setattr(target, "current_stream", lambda index: stream)
        monkeypatch.setattr(target, "current_device", lambda: 0)
        monkeypatch.setattr(target, "is_capturing", lambda index: False)

    fake.on, fake.specs = on, specs
    try:
        yield fake
    finally:
        plans.clear()
        drv._reset_for_tests()
        for clear in caches:
            clear()
