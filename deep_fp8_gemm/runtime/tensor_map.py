"""TMA tensor-map parameters: one description, two encoders.

A :class:`TensorMapSpec` holds exactly the arguments of ``cuTensorMapEncodeTiled`` (CUDA driver API,
"Tensor Map Object Management"). The GPU launcher encodes it with the driver into the opaque 128-byte
``CUtensorMap``; the CPU simulator packs the same fields into its own 128-byte struct
(``dfg::sim::SimTensorMap`` in ``include/deep_fp8_gemm/hal/sim.hpp``). Both consume the *same* spec, so
the simulator is driven by the parameters the GPU path encodes.

Dimension order is the driver's: index 0 is the innermost (contiguous) dimension.
``global_strides`` are in bytes for dimensions 1..rank-1 (dimension 0 is contiguous by definition).
"""

from __future__ import annotations

import dataclasses
import enum


class TmaDtype(enum.IntEnum):
    """``CUtensorMapDataType`` values used by this library."""

    UINT8 = 0  # fp8 e4m3 / e5m2 are moved as raw bytes
    UINT16 = 1
    FLOAT32 = 7
    BFLOAT16 = 9


class TmaSwizzle(enum.IntEnum):
    """``CUtensorMapSwizzle`` values."""

    NONE = 0
    B32 = 1
    B64 = 2
    B128 = 3

    @property
    def span_bytes(self) -> int:
        """Bytes of one swizzled row (the inner box extent may not exceed it); 0 for NONE."""
        return {0: 0, 1: 32, 2: 64, 3: 128}[int(self)]


class TmaL2Promotion(enum.IntEnum):
    NONE = 0
    B64 = 1
    B128 = 2
    B256 = 3


class TmaOobFill(enum.IntEnum):
    ZERO = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read as zero
    NAN = 1  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA


ELEMENT_BYTES = {TmaDtype.UINT8: 1, TmaDtype.UINT16: 2, TmaDtype.FLOAT32: 4, TmaDtype.BFLOAT16: 2}


@dataclasses.dataclass(frozen=True)
class TensorMapSpec:
    """Arguments of ``cuTensorMapEncodeTiled`` (interleave is always NONE, element strides all 1)."""

    dtype: TmaDtype
    global_address: int
    global_dims: tuple[int, ...]  # innermost first, elements
    global_strides: tuple[int, ...]  # bytes, for dims 1..rank-1
    box_dims: tuple[int, ...]  # innermost first, elements
    swizzle: TmaSwizzle = TmaSwizzle.NONE
    l2_promotion: TmaL2Promotion = TmaL2Promotion.B256
    oob_fill: TmaOobFill = TmaOobFill.ZERO

    @property
    def rank(self) -> int:
        return len(self.global_dims)

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def box_bytes(self) -> int:
        """Bytes one load of a box writes to shared memory (= transaction bytes, even when out of bounds)."""
        n = self.element_bytes
        for b in self.box_dims:
            n *= b
        return n

    def validate(self) -> None:
        """Raise ``ValueError`` for anything ``cuTensorMapEncodeTiled`` would reject (driver API rules)."""
        r = self.rank
        if not 1 <= r <= 5:
            raise ValueError(f"tensor map rank must be 1..5, got {r}")
        if len(self.global_strides) != r - 1 or len(self.box_dims) != r:
            raise ValueError(
                f"tensor map needs rank-1 strides and rank box dims: {self.global_dims=} "
                f"{self.global_strides=} {self.box_dims=}"
            )
        if self.global_address % 16 != 0:
            raise ValueError(f"tensor map global address must be 16-byte aligned, got {self.global_address:#x}")
        for i, d in enumerate(self.global_dims):
            if not 1 <= d <= 2**32:
                raise ValueError(f"tensor map global_dims[{i}]={d} must be in [1, 2^32]")
        for i, s in enumerate(self.global_strides):
            if s % 16 != 0 or not 0 < s < 2**40:
                raise ValueError(f"tensor map global_strides[{i}]={s} must be a positive multiple of 16 below 2^40")
        for i, b in enumerate(self.box_dims):
            if not 1 <= b <= 256:
                raise ValueError(f"tensor map box_dims[{i}]={b} must be in [1, 256]")
        inner_bytes = self.box_dims[0] * self.element_bytes
        if inner_bytes % 16 != 0:
            raise ValueError(f"tensor map inner box extent must be a multiple of 16 bytes, got {inner_bytes}")
        span = self.swizzle.span_bytes
        if span and inner_bytes > span:
            raise ValueError(f"tensor map inner box extent {inner_bytes} B exceeds the {span} B swizzle span")
