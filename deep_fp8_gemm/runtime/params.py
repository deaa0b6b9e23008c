"""Kernel parameter structs, packed by field name.

Every kernel takes one ``__grid_constant__`` struct. Its byte layout is mirrored by a ``ctypes.Structure``
next to the kernel's host code (offsets from ctypes; the C++ side ``static_assert``s its own offsets and size,
and the tests compare the two). Two ways to fill one, both by field name:

* :func:`pack` — the whole struct from keyword fields (every launch that is not on the per-call fast path);
* :class:`FieldPacker` — a ``struct.Struct`` over a run of named fields, gaps padded, so the per-call fast path
  writes only the fields that change, with one C call, into a parameter block it reuses. The order of
  ``pack_into``'s values is the order of the names the packer was built with, stated where it is built.
"""

from __future__ import annotations

import ctypes
import struct

_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def field_offsets(struct_type: type[ctypes.Structure]) -> dict[str, tuple[int, int]]:
    """Field name -> ``(offset, size)`` of every field of ``struct_type``, anonymous unions' members included."""
    out: dict[str, tuple[int, int]] = {}
    anonymous = set(getattr(struct_type, "_anonymous_", ()))
    for name, ctype, *_ in struct_type._fields_:
        descriptor = getattr(struct_type, name)
        if name in anonymous:
            for inner, _ctype, *_ in ctype._fields_:
                member = getattr(ctype, inner)
                out[inner] = (descriptor.offset + member.offset, member.size)
        else:
            out[name] = (descriptor.offset, descriptor.size)
    return out


def pack(struct_type: type[ctypes.Structure], **fields: int | bytes) -> bytes:
    """The bytes of a ``struct_type`` whose named fields are set (the rest zero). Integer fields take ints;
    array fields (tensor maps) take ``bytes`` of their exact size."""
    image = struct_type()
    offsets = field_offsets(struct_type)
    raw = (ctypes.c_ubyte * ctypes.sizeof(struct_type)).from_buffer(image)
    for name, value in fields.items():
        if name not in offsets:
            raise ValueError(f"{struct_type.__name__} has no field {name!r} (fields: {sorted(offsets)})")
        offset, size = offsets[name]
        if isinstance(value, (bytes, bytearray)):
            if len(value) != size:
                raise ValueError(f"{struct_type.__name__}.{name} takes {size} bytes, got {len(value)}")
            ctypes.memmove(ctypes.addressof(raw) + offset, bytes(value), size)
        else:
            setattr(image, name, value)
    return bytes(image)


class FieldPacker:
    """Packs a run of named integer fields of ``struct_type`` at their offsets: ``pack_into(buffer, *values)``
    with the values in the order of ``names`` (ascending offsets; the gaps are written as zeros)."""

    __slots__ = ("names", "start", "size", "struct", "_pack_into")

    def __init__(self, struct_type: type[ctypes.Structure], names: tuple[str, ...]):
        offsets = field_offsets(struct_type)
        fmt, position = "<", None
        for name in names:
            if name not in offsets:
                raise ValueError(f"{struct_type.__name__} has no field {name!r}")
            offset, size = offsets[name]
            if size not in _CODES:
                raise ValueError(f"{struct_type.__name__}.{name} is not an integer field ({size} bytes)")
            if position is None:
                position = self.start = offset
            elif offset < position:
                raise ValueError(f"{struct_type.__name__} fields must be named in ascending offsets: {names}")
            fmt += f"{offset - position}x" + _CODES[size]
            position = offset + size
        self.names = tuple(names)
        self.struct = struct.Struct(fmt)
        self.size = self.struct.size
        self._pack_into = self.struct.pack_into

    def pack_into(self, buffer, *values: int) -> None:
        """Write ``values`` (one per name) into ``buffer`` at the fields' offsets."""
        self._pack_into(buffer, self.start, *values)

    def bound(self):
        """``(struct.pack_into, start)``: for a hot loop that calls ``pack_into(buffer, start, *values)`` itself."""
        return self._pack_into, self.start
