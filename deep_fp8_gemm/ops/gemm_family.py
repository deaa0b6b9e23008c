"""A 1D2D GEMM op family from its two axis values: a layout family and an output policy.

Every row of the kinds table (``kinds.TABLE``) with 1D2D accumulation is the product of

* a **layout** (:class:`GemmLayout`, one per value of the ``layout`` axis, in its module :mod:`.dense`,
  :mod:`.contiguous`, :mod:`.psum`, :mod:`.masked`): the operands' shapes, the grouped-layout argument and its value
  rules, the rows each group computes (so the reference computes exactly the kernels' rows), the problem the
  heuristic plans for;
* an **output policy** (:mod:`.outputs`, one per value of the ``output`` axis): the output argument, its checks, the
  reference's last step, the launch.

:func:`make_family` composes them into the family record (``_core.family.GemmFamily``): ``check``, ``reference``,
``dispatch``, ``plan``, the ``torch.ops.deep_fp8_gemm`` custom op (schema and fake kernel), and ``call``, the public
entry (bf16 outputs with the per-call fast path of ``_core.plans``). The layout modules build their kinds' families
with :func:`families_of` and wrap ``call`` in the documented public functions; a row the table gains is an op without
another line here.

Batch invariance (every family, every backend; docs/batch-invariance.md): output row r depends only on row r of A and
its scales and on B (a group's B), not on M, the other rows or groups, padding, the tile or PDL, and in the default
batch-invariant mode (``deep_fp8_gemm.set_batch_invariant``) not on the SM count: the plans pass the mode to
``get_config``, which then never splits K or swaps A and B; the references promote exact K-block partials in a fixed
order (``_core.reference_math``).

The flat argument order every generated function takes is the custom op's: ``a, sa, b, sb, *outputs,
*layout arguments, *output options`` (e.g. ``a, sa, b, sb, d, sd, masked_m, expected_m, use_ue8m0``).
"""

from __future__ import annotations

from typing import Callable

import torch

from .._core.checks import (BLOCK128, Granularity, Problem, check_aligned_ptr, check_divisibility, check_expected_m,
                            check_row_major_tma, is_meta, unpack_pair)
from .._core.dispatch import eager, normalise_scales, operands
from .._core.family import GemmFamily, register_op
from .._core.plans import GemmEntrySpec, gemm_entry, pair_output_entry
from .._core.reference_math import gemm_nt_promoted
from ..config import GemmConfig, get_config
from ..kernels import gemm as gemm_host
from ..kinds import TABLE, KindRow
from ..runtime import target
from ..utils import PROCESS_SETTINGS
from ..runtime.target import Backend, layout_values_checked
from .outputs import POLICIES, OutputPolicy


class GemmLayout:
    """What a value of the ``layout`` axis provides (subclassed once per layout module).

    ``name``: the axis value; ``grouped``: the name of its grouped-layout argument (None: none); ``expected_m``:
    ``"none"``, ``"optional"`` or ``"required"``; ``rows_name``: the row count in messages; ``batched``: outputs carry
    a leading group dimension (masked); ``op_template``: the op name with ``{}`` for the output dtype
    (``gemm_fp8_fp8_{}_nt``); ``schema``: its arguments' part of the op schema (after the outputs)."""

    name: str
    grouped: str | None = None
    expected_m: str = "none"
    rows_name: str = "m"
    batched: bool = False
    op_template: str
    schema: str = ""

    def check_inputs(self, a, sa, b, sb, gran: Granularity = BLOCK128) -> tuple[int, int, int, int]:
        """A, sA, B, sB (types, shapes, one device) with the scale blocks ``gran`` of the kind's granularity;
        returns ``(rows, n, k, groups)``."""
        raise NotImplementedError

    def check_grouped(self, gl, problem: Problem, device: torch.device) -> None:
        """The grouped-layout argument's type, shape and device (its values are not read)."""

    def check_rows(self, rows: int) -> None:
        """The layout level's rule on the row count (the contiguous alignment)."""

    def values_check(self, gl, rows: int, groups: int) -> None:
        """The grouped layout's values (on CPU tensors every call; on CUDA with ``DFG_CHECK_LAYOUTS=1``)."""

    def reference_check(self, gl, rows: int) -> None:
        """What the public reference checks of the values before computing (the psum ends)."""

    def reference_parts(self, a, gl, groups: int) -> list[tuple[int | None, object]]:
        """``(group, rows)`` of each matmul of the reference: rows an index into A's and the outputs' row
        dimension(s) (a slice, an index tensor or ``(g, slice)``), exactly the rows the kernels compute with the
        group (None: B is 2-D)."""
        raise NotImplementedError

    def plan_problem(self, a, b, expected_m) -> tuple[int, int, int, int, dict]:
        """``(m, n, k, groups, get_config keywords)``: the problem the heuristic plans for."""
        raise NotImplementedError

    @property
    def arguments(self) -> tuple[str, ...]:
        """The layout's arguments after the outputs, as the op takes them."""
        return ((self.grouped,) if self.grouped else ()) + (("expected_m",) if self.expected_m != "none" else ())


_REQUIRED = object()


def _split(output: OutputPolicy, lay: GemmLayout, rest: tuple, kwargs: dict) -> tuple[tuple, object, object, tuple]:
    """``(outs, grouped_layout, expected_m, options)`` of the flat arguments after ``a, sa, b, sb``: positional, or by
    their schema names; trailing defaults may be left out (the dispatcher leaves them out)."""
    names = (*output.args, *lay.arguments, *(name for name, _, _ in output.options))
    defaults = ((_REQUIRED,) * len(output.args) + (None,) * len(lay.arguments)
                + tuple(default for _, _, default in output.options))
    if len(rest) > len(names):
        raise TypeError(f"expected at most {4 + len(names)} arguments, got {4 + len(rest)}")
    values = list(rest) + [kwargs.pop(name, default) for name, default in zip(names[len(rest):], defaults[len(rest):])]
    # `is`, not `in`: `in` would call Tensor.__eq__(_REQUIRED) on every tensor (~30 µs each: torch raises and
    # catches a TypeError inside).
    if kwargs or any(value is _REQUIRED for value in values):
        raise TypeError(f"arguments (a, sa, b, sb, {', '.join(names)}) expected, got {len(rest)} more positional and "
                        f"{sorted(kwargs)} by name")
    outs, n_lay = tuple(values[: output.arity]), len(lay.arguments)
    args = dict(zip(lay.arguments, values[output.arity: output.arity + n_lay]))
    return outs, args.get(lay.grouped), args.get("expected_m"), tuple(values[output.arity + n_lay:])


def _uniform(output: OutputPolicy, rest: tuple, kwargs: dict) -> tuple[tuple, object, object, tuple]:
    """The same of the uniform form ``dispatch`` and ``reference_validated`` take whatever the layout:
    ``*outs, grouped_layout=None, expected_m=None, *options`` (what the per-call plans and test recorders pass)."""
    arity = output.arity
    outs = tuple(rest[:arity])
    gl = rest[arity] if len(rest) > arity else kwargs.pop("grouped_layout", None)
    expected_m = rest[arity + 1] if len(rest) > arity + 1 else kwargs.pop("expected_m", None)
    options = tuple(rest[arity + 2:]) + tuple(kwargs.pop(name, default) for name, _, default in
                                              output.options[max(len(rest) - arity - 2, 0):])
    if kwargs or len(outs) != arity:
        raise TypeError(f"arguments (a, sa, b, sb, {', '.join(output.args)}, grouped_layout, expected_m, options) "
                        f"expected, got {sorted(kwargs)} by name")
    return outs, gl, expected_m, options


def make_family(row: KindRow, lay: GemmLayout, output: OutputPolicy) -> GemmFamily:
    """The op family of ``row`` (a 1D2D kind of the layout ``lay`` and ``output``), its custom op registered."""
    kind = row.name
    traits = TABLE.traits(kind, "granularity")
    gran = Granularity(traits["gran_k"], traits["gran_n"])
    lead_of = (lambda problem: (problem.groups,)) if lay.batched else (lambda problem: ())
    grouped_name = lay.grouped

    def layout_args(gl, expected_m) -> tuple:
        """The layout's arguments as the op takes them (none, the grouped layout, expected_m, or both)."""
        return (*((gl,) if grouped_name else ()), *((expected_m,) if lay.expected_m != "none" else ()))

    def check(a, sa, b, sb, *rest, layout: bool = True, pointers: bool = True, **kwargs) -> Problem:
        outs, gl, expected_m, _ = _split(output, lay, rest, kwargs)
        if lay.expected_m == "required":
            check_expected_m(expected_m)
        rows, n, k, groups = lay.check_inputs(a, sa, b, sb, gran)
        problem = Problem(rows, n, k, groups)
        output.check(outs, lead_of(problem), rows, n, a.device, lay.rows_name)
        lay.check_grouped(gl, problem, a.device)
        if lay.expected_m == "optional" and expected_m is not None:
            check_expected_m(expected_m)
        if layout:
            lay.check_rows(rows)
            check_divisibility(n, k)
            check_row_major_tma(a, "lhs[0] (A)")
            check_row_major_tma(b, "rhs[0] (B)")
            output.check_layout(outs)
        if pointers and not is_meta(a):  # meta tensors: no pointers (the shape-only path)
            check_aligned_ptr(a, "lhs[0] (A)")
            check_aligned_ptr(b, "rhs[0] (B)")
            inputs = ((a, "lhs[0] (A)"), (sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"))
            output.check_pointers(outs, inputs + (((gl, grouped_name),) if grouped_name else ()))
        return problem

    def reference_validated(a, sa, b, sb, *rest) -> None:
        """The reference on checked tensors: the float32 result (``_core.reference_math.gemm_nt_promoted``: exact
        partials of each scale group of K promoted in a fixed order, batch-invariant) of each part of the layout's
        :meth:`GemmLayout.reference_parts`, finished by the output policy."""
        outs, gl, _, options = _uniform(output, rest, {})
        for g, rows in lay.reference_parts(a, gl, b.size(0) if b.dim() == 3 else 1):
            acc = gemm_nt_promoted(a[rows], sa[rows], b if g is None else b[g], sb if g is None else sb[g], gran)
            output.store(outs, rows, acc, options)

    def reference(lhs, rhs, out, *args, **kwargs) -> None:
        a, sa = unpack_pair(lhs, "lhs")
        b, sb = unpack_pair(rhs, "rhs")
        outs, gl, expected_m, options = _split(output, lay, (*output.unpack(out), *args), kwargs)
        options = output.check_options(options)
        flat = (*outs, *layout_args(gl, expected_m))
        problem = check(a, sa, b, sb, *flat, layout=False, pointers=False)
        lay.reference_check(gl, problem.m)
        reference_validated(a, sa, b, sb, *outs, gl, expected_m, *options)

    def plan(a, b, expected_m, num_sms: int, *options, sa_major: str = "m") -> GemmConfig:
        """The config rule: ``get_config`` of the problem (``sa_major``: sA's global layout, "m" but for
        fp8_einsum's sx read where it lies, ``ops.einsum``)."""
        m, n, k, groups, extra = lay.plan_problem(a, b, expected_m)
        options = options or tuple(o[2] for o in output.options)
        return get_config(m, n, k, groups, kind, num_sms, **extra, **output.config_options(options),
                          batch_invariant=PROCESS_SETTINGS.batch_invariant, sa_major=sa_major)

    def dispatch(a, sa, b, sb, *rest, **kwargs) -> None:
        """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel); the
        uniform arguments ``*outs, grouped_layout, expected_m, *options``."""
        outs, gl, expected_m, options = _uniform(output, rest, kwargs)
        backend = target.backend_of(a.device, "gemm")
        if backend is Backend.REFERENCE:
            reference_validated(a, sa, b, sb, *outs, gl, expected_m, *options)
            return
        cfg = family.plan(a, b, expected_m, gemm_host.num_sms_for(backend), *options)
        output.launch(cfg, a, normalise_scales(sa), b, sb.contiguous(), outs, None if gl is None else gl.contiguous(),
                      backend)

    def impl(a, sa, b, sb, *rest, **kwargs) -> None:
        """Check (the grouped layout's values too where ``layout_values_checked``) and dispatch: the custom op's
        kernel for CPU and CUDA, and the eager path of the public entry."""
        outs, gl, expected_m, options = _split(output, lay, rest, kwargs)
        flat = (*outs, *layout_args(gl, expected_m))
        problem = check(a, sa, b, sb, *flat)
        if grouped_name and layout_values_checked(a.device):
            lay.values_check(gl, problem.m, problem.groups)
        if not problem.empty and not is_meta(a):
            family.dispatch(a, sa, b, sb, *outs, gl, expected_m, *options)

    def fake(a, sa, b, sb, *rest, **kwargs) -> None:
        outs, gl, expected_m, _ = _split(output, lay, rest, kwargs)
        flat = (*outs, *layout_args(gl, expected_m))
        check(a, sa, b, sb, *flat, pointers=False)

    options_schema = "".join(f", {t} {name}={'False' if d is False else d}" for name, t, d in output.options)
    op_name = lay.op_template.format(output.dtype_name) + traits["op_suffix"] + output.suffix
    op = register_op(op_name, f"(Tensor a, Tensor sa, Tensor b, Tensor sb, {output.schema}{lay.schema}"
                              f"{options_schema}) -> ()", impl, fake)
    family = GemmFamily(kind=kind, public=None, check=check, reference=reference, dispatch=dispatch, plan=plan,
                        op=op, layout=lay, output=output)
    family.call = family.public = _entry_point(family, lay, output, impl, op)
    # Named as the op until its layout module wraps it in the documented public function.
    family.call.__name__ = family.call.__qualname__ = op_name
    return family


def _entry_point(family: GemmFamily, lay: GemmLayout, output: OutputPolicy, impl: Callable, op) -> Callable:
    """``call(lhs, rhs, out, grouped_layout=None, expected_m=None, *options)``: the public op. Eager calls of the bf16
    and the FP8-output families (``OutputPolicy.pair_plan``) go through the per-call fast path
    (``_core.plans.gemm_entry`` / ``pair_output_entry``: checks cached per tensor signature); traced calls and
    dispatch modes run the custom op, so compiled model code sees one node per GEMM."""
    grouped_name = lay.grouped
    has_expected = lay.expected_m != "none"
    required = lay.expected_m == "required"

    def flat_layout_args(gl, expected_m) -> tuple:
        return (*((gl,) if grouped_name else ()), *((expected_m,) if has_expected else ()))

    if output.name == "bf16":
        values_check = lay.values_check if grouped_name else None
        entry = gemm_entry(GemmEntrySpec(
            family, lambda a, sa, b, sb, out, gl, em: family.check(a, sa, b, sb, out, *flat_layout_args(gl, em)),
            grouped_name, lay.expected_m, values_check))

        def call(lhs, rhs, out, gl=None, expected_m=None) -> None:
            a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
            b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
            if entry(a, sa, b, sb, out, gl, expected_m):  # eager: checks cached per tensor signature (_core.plans)
                return
            a, sa, b, sb = operands(lhs, rhs, out, *(((gl, grouped_name),) if grouped_name else ()))
            if required:
                check_expected_m(expected_m)
            (impl if eager(a, sa, b, sb, out, gl) else op)(a, sa, b, sb, out, *flat_layout_args(gl, expected_m))
        return call

    def general(lhs, rhs, out, gl, expected_m, options) -> None:
        """Any output policy's call: its checks, then the custom op or (eager) its implementation."""
        outs = output.unpack(out)
        a, sa, b, sb = operands(lhs, rhs, outs[0], *zip(outs[1:], output.names[1:]),
                                *(((gl, grouped_name),) if grouped_name else ()), out_name=output.names[0])
        if required:
            check_expected_m(expected_m)
        options = output.check_options(options or tuple(o[2] for o in output.options))
        (impl if eager(a, sa, b, sb, *outs, gl) else op)(a, sa, b, sb, *outs, *flat_layout_args(gl, expected_m),
                                                          *options)

    if not output.pair_plan:  # an output the per-call plans do not know (a new value of the table): the general path
        return lambda lhs, rhs, out, gl=None, expected_m=None, *options: general(lhs, rhs, out, gl, expected_m,
                                                                                  options)

    arity = output.arity
    entry = pair_output_entry(GemmEntrySpec(
        family, lambda a, sa, b, sb, *rest: family.check(a, sa, b, sb, *rest[:arity], *flat_layout_args(*rest[arity:])),
        grouped_name, lay.expected_m, lay.values_check if grouped_name else None, pair_output=True))
    default_option = output.options[0][2]

    def call(lhs, rhs, out, gl=None, expected_m=None, *options) -> None:
        d, sd = out if type(out) is tuple and len(out) == 2 else output.unpack(out)  # the op's order: out first
        a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
        b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
        if len(options) <= 1 and entry(a, sa, b, sb, d, sd, gl, expected_m, options[0] if options else default_option):
            return  # eager: checks cached per tensor signature (_core.plans)
        general(lhs, rhs, out, gl, expected_m, options)
    return call


def families_of(layout: GemmLayout, table=None) -> dict[str, GemmFamily]:
    """The families of every 1D2D row of the kinds table on ``layout`` (kind -> family), in table order."""
    table = TABLE if table is None else table
    return {row.name: make_family(row, layout, POLICIES[row.output]) for row in table.rows
            if row.layout == layout.name and row.accumulation == "1d2d"}
