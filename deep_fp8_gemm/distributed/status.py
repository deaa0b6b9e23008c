"""How the distributed layers make every rank fail the same way.

A rank whose arguments fail their checks, or whose experts overflow the decode buffers, must not leave its peers
waiting in a collective (until the timeout), crashed (gloo aborts the process when two ranks' message sizes
differ) or with a silently wrong result. Two mechanisms, both fixed-size so that no disagreement can change a
message's size:

* :func:`agree`, when a layer or its decode buffers are made: one ``all_gather`` of a fixed-size record per rank
  (the sizes that every later collective depends on, plus the rank's own argument error, if any). Every rank then
  raises the same ``ValueError`` when the sizes differ, or the failing rank's error (its own exception on that
  rank; the same type naming the rank everywhere else).
* a **status record** (:data:`STATUS_BYTES`: code, a detail integer, the start of an error message) carried with
  data the ranks exchange anyway on every call: in the prefill's count exchange and in each decode return row
  block. A rank that rejected its arguments still takes part in the call's collectives with an error status and
  raises afterwards; its peers read the status and raise too (on CPU / gloo), or, on CUDA in the decode path
  (which never synchronises with the host), fail a ``torch._assert_async`` on the device and keep the codes in
  ``EPDecodeBuffers.status`` — so no rank ever returns a result that another rank knows to be wrong.

Checks that cannot run before a rank knows its group (``torch.distributed`` not initialised, buffers of another
group or not buffers at all) still raise on that rank only: there is no collective it could take part in.
"""

from __future__ import annotations

import struct

import torch
import torch.distributed as dist

__all__ = ["OK", "OVERFLOW", "STATUS_BYTES", "agree", "code_of", "collective_device", "decode", "encode",
           "raise_peer_errors"]

#: Bytes of one status record: int32 code, int32 detail, int32 message length, the message (cut to fit).
STATUS_BYTES = 256
_HEADER = struct.Struct("<iii")
OK, TYPE_ERROR, VALUE_ERROR, RUNTIME_ERROR, OVERFLOW = 0, 1, 2, 3, 4
_ERROR_TYPES = {TYPE_ERROR: TypeError, VALUE_ERROR: ValueError, RUNTIME_ERROR: RuntimeError}


def code_of(exc: BaseException) -> int:
    """The status code of an argument error (``TypeError`` / ``ValueError``; anything else: RuntimeError)."""
    if isinstance(exc, TypeError):
        return TYPE_ERROR
    return VALUE_ERROR if isinstance(exc, ValueError) else RUNTIME_ERROR


def encode(code: int, detail: int = 0, message: str = "", size: int = STATUS_BYTES) -> bytes:
    """A status record of exactly ``size`` bytes (>= 12); the message is cut to fit."""
    text = message.encode("utf-8", "replace")[: max(size - _HEADER.size, 0)]
    return _HEADER.pack(code, detail, len(text)) + text + bytes(size - _HEADER.size - len(text))


def decode(raw: bytes) -> tuple[int, int, str]:
    """``(code, detail, message)`` of a record made by :func:`encode`."""
    code, detail, length = _HEADER.unpack_from(raw)
    length = max(0, min(length, len(raw) - _HEADER.size))
    return code, detail, raw[_HEADER.size:_HEADER.size + length].decode("utf-8", "replace")


def raise_peer_errors(records: list[tuple[int, int, str]], own: BaseException | None, what: str) -> None:
    """``records[s]``: rank s's status. If this rank failed its checks (``own``), raise that; else if a peer did,
    raise the same exception type naming it. Overflow codes are left to the caller."""
    if own is not None:
        raise own
    for source, (code, _, message) in enumerate(records):
        if code in _ERROR_TYPES:
            raise _ERROR_TYPES[code](f"{what}: rank {source} of the group rejected its arguments, so every rank "
                                     f"raises ({message})")


def collective_device(group: dist.ProcessGroup | None, device: torch.device | str | None = None) -> torch.device:
    """Where a small control tensor of ``group``'s collectives lives: a CUDA device when the group's backend is NCCL
    alone (``device`` if it is a CUDA device, else the current one), the CPU otherwise (gloo)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        if device is not None and torch.device(device).type == "cuda":
            return torch.device(device)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(what: str, fields: dict[str, object], group: dist.ProcessGroup | None, device: torch.device,
          error: BaseException | None = None) -> None:
    """Every rank of ``group`` contributes ``fields`` (the same names on every rank, integer values; ignored when
    ``error`` is set) and its argument error; one ``all_gather`` of a fixed-size record. Then every rank raises the
    same way: a failing rank's error (:func:`raise_peer_errors`), or — when the ranks' values differ — one
    ``ValueError`` listing every rank's values, the same text on every rank."""
    names = list(fields)
    values = [0] * len(names)
    if error is None:
        try:
            values = [int(fields[name]) for name in names]
        except (TypeError, ValueError) as exc:  # a value the rank's own checks should have refused
            error = exc
    record = struct.pack(f"<{len(names)}q", *values) + encode(OK if error is None else code_of(error), 0,
                                                              "" if error is None else str(error))
    mine = torch.frombuffer(bytearray(record), dtype=torch.uint8).to(device)
    world = dist.get_world_size(group)
    gathered = mine.new_empty(world * mine.numel())
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered, mine, group=group)
    rows = [bytes(row) for row in gathered.view(world, -1).cpu().tolist()]
    raise_peer_errors([decode(row[8 * len(names):]) for row in rows], error, what)
    per_rank = [struct.unpack_from(f"<{len(names)}q", row) for row in rows]
    if any(v != per_rank[0] for v in per_rank):
        listing = "; ".join(f"rank {r}: " + ", ".join(f"{n}={v}" for n, v in zip(names, vals))
                            for r, vals in enumerate(per_rank))
        raise ValueError(f"{what}: the ranks of the group disagree on {', '.join(names)} ({listing}); every rank "
                         f"must pass the same values")
