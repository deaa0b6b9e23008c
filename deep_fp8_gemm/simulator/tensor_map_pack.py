"""Packs a :class:`~deep_fp8_gemm.runtime.tensor_map.TensorMapSpec` into the simulator's 128-byte tensor map.

On a GPU the driver encodes the spec into an opaque ``CUtensorMap``; the simulator instead reads the spec's
fields back from ``dfg::sim::SimTensorMap`` (``include/deep_fp8_gemm/hal/sim.hpp``), whose layout this
module mirrors::

    offset  type      field
    0       u32       magic 0x54474644 ("DFGT")
    4       u32       rank
    8       u32       dtype          (TmaDtype)
    12      u32       swizzle        (TmaSwizzle)
    16      u32       l2_promotion   (TmaL2Promotion)
    20      u32       oob_fill       (TmaOobFill)
    24      u64       global_address
    32      u64[5]    global_dims    (elements, innermost first; unused entries 0)
    72      u64[4]    global_strides (bytes of dimensions 1..rank-1; unused entries 0)
    104     u16[5]    box_dims       (elements, innermost first; unused entries 0)
    114     u16[7]    reserved (0)
"""

from __future__ import annotations

import struct

from ..runtime.tensor_map import TensorMapSpec

TENSOR_MAP_BYTES = 128
TENSOR_MAP_MAGIC = 0x54474644
_LAYOUT = struct.Struct("<6IQ5Q4Q5H7H")
assert _LAYOUT.size == TENSOR_MAP_BYTES


def pack_tensor_map(spec: TensorMapSpec) -> bytes:
    """The 128 bytes a simulated kernel receives where the GPU build receives the encoded ``CUtensorMap``.

    Raises:
        ValueError: the spec breaks a ``cuTensorMapEncodeTiled`` rule (:meth:`TensorMapSpec.validate`).
    """
    spec.validate()
    r = spec.rank
    dims = tuple(spec.global_dims) + (0,) * (5 - r)
    strides = tuple(spec.global_strides) + (0,) * (4 - (r - 1))
    box = tuple(spec.box_dims) + (0,) * (5 - r)
    return _LAYOUT.pack(
        TENSOR_MAP_MAGIC,
        r,
        int(spec.dtype),
        int(spec.swizzle),
        int(spec.l2_promotion),
        int(spec.oob_fill),
        spec.global_address,
        *dims,
        *strides,
        *box,
        *(0,) * 7,
    )
