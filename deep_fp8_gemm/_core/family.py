"""What every GEMM op family provides, and the one way custom ops are registered.

A family is one kind of ``config.KINDS`` (a row of the kinds table, ``deep_fp8_gemm.kinds``). The 1D2D families are
composed from their layout and output policy (``ops.gemm_family.make_family``: a layout module of
:mod:`deep_fp8_gemm.ops` builds its kinds' families), the fp32-accumulating ones (1d1d, k_grouped) are modules of their
own; each is a :class:`GemmFamily` record, collected in ``ops.FAMILIES``:

* ``check(*op tensors, layout=True, pointers=True) -> Problem``: every argument rule (``_core.checks`` levels);
* ``reference``: the exact reference, same signature as the public op;
* ``dispatch(*validated tensors)``: run a validated, non-empty call on its backend
  (``runtime.target.backend_of(device, "gemm")``: the reference, the simulator or the sm_90 kernel);
* ``plan(...) -> GemmConfig``: the family's config rule (which problem the heuristic plans for), the one step the
  general path and the per-call fast path share before packing (``kernels.gemm``);
* ``op``: the ``torch.ops.deep_fp8_gemm`` custom op (schema, impl, fake kernel), made by :func:`register_op`.

* ``call``: the public entry (the 1D2D families: ``call(lhs, rhs, out, grouped_layout=None, expected_m=None,
  *options)``; ``public`` the documented function that wraps it).

``tests/ops/test_kinds.py`` checks that every kind of the table has exactly one such record.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

NAMESPACE = "deep_fp8_gemm"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")


@dataclasses.dataclass(eq=False)
class GemmFamily:
    """A GEMM family's record (see the module docstring). ``public`` is the public function. Every call of the
    family's dispatch goes through this record (the op's impl and the per-call plans alike), so it is also the one
    seam where a test records a family's calls (``monkeypatch.setattr(ops.FAMILIES[kind], "dispatch", ...)``)."""

    kind: str
    public: Callable | None
    check: Callable
    reference: Callable
    dispatch: Callable
    plan: Callable
    op: object
    call: Callable | None = None
    layout: object = None  # the 1D2D families' layout (ops.gemm_family.GemmLayout) and output policy (ops.outputs)
    output: object = None


def register_op(name: str, schema: str, impl: Callable, fake: Callable, keys: tuple[str, ...] = ("CPU", "CUDA")):
    """Define ``torch.ops.deep_fp8_gemm.<name>`` with ``schema`` (the part after the name), ``impl`` for every
    dispatch key of ``keys`` and ``fake`` as its meta kernel; returns the op's default overload."""
    _lib.define(name + schema)
    for key in keys:
        _lib.impl(name, impl, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_lib)
    return getattr(getattr(torch.ops, NAMESPACE), name).default
