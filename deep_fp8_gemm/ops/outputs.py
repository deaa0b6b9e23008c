"""The output policies of the 1D2D GEMM families: one per value of the kinds table's ``output`` axis
(``kinds.AXES``), composed with a layout family (``ops.gemm_family.make_family``) into an op family.

* :data:`BF16` — ``out`` bf16 ``[..., rows, n]`` row-major (TMA store).
* :data:`FP8` — ``out = (D, sD)``: D e4m3 ``[..., rows, n]`` row-major, sD ``[..., rows, ceil(n/128)]`` float32 in the
  M-major TMA-aligned layout :func:`deep_fp8_gemm.per_token_cast_to_fp8` returns (``utils.empty_m_major``; strides
  ``(1, aligned_rows)`` / ``(aligned_rows * g, 1, aligned_rows)``), so that ``(D, sD)`` is the ``lhs`` of the next
  GEMM without a copy. Quantised in the epilogue from the fp32 accumulators by
  :func:`deep_fp8_gemm.quant.per_token_cast_to_fp8_torch`'s rules with ``reciprocal=True`` — ``amax =
  max(max|x|, 1e-4)`` per row and 128 columns, ``scale = amax / 448`` (IEEE division; ``use_ue8m0``: rounded up to a
  power of two), ``D = e4m3(clamp(x * fl(1 / scale), ±448))`` (nearest even): one IEEE reciprocal per row and
  128 columns, then a multiply per value, as the reference design's ``x * (1.0 / sf)`` (issue 45; until then the
  epilogue divided, ``x / scale``; the two differ by one e4m3 step near rounding ties, about 5e-7 of the codes of
  random fp32 outputs, never with ``use_ue8m0``). The kernels quantise their own fp32 accumulators, which differ
  from the reference's float32 sums by the summation order only; with exact sums (the simulator's exact
  tensor-core mode and small integers) the bits are equal (tests/kernels/test_sim_fp8_output.py).
* :data:`SWIGLU_FP8` — the MoE up-projection: B the interleaved ``w13`` (:func:`interleave_swiglu_weights`), the
  output ``SiLU(gate) * up`` of the fp32 result quantised as :data:`FP8`, D ``[..., rows, n / 2]``.

A policy says what the output argument is (its tensors, their names in messages, its part of the op schema and
its options such as ``use_ue8m0``), checks it (shape level, layout level, pointer level: the levels of
``_core.checks``), computes the reference's last step from the float32 product (:meth:`OutputPolicy.store`) and
launches the kernel with its fields. :data:`POLICIES` maps the output values to them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._core.checks import (FP8, check_aligned_ptr, check_bool, check_no_overlap, check_not_self_overlapping,
                            check_row_major_tma, check_same_device, check_shape, check_tensor, unpack_pair)
from ..constants import GRAN_K, GRAN_MN_BLOCK
from ..kernels import gemm as gemm_host
from ..quant import per_token_cast_to_fp8_torch
from ..utils import ceil_div, empty_m_major, m_major_strides

OUT_NAMES = ("out[0] (D)", "out[1] (sD)")


class OutputPolicy:
    """What an output value of the kinds table needs on the host (see the module docstring).

    ``name``: the axis value; ``dtype_name`` / ``suffix``: its part of the op names
    (``gemm_fp8_fp8_{dtype_name}_nt{layout suffix}{suffix}``); ``names``: the output tensors' names in messages;
    ``args``: their names in the custom op's schema, ``schema`` that part of it; ``options``: ``(name, schema type, default)`` of its keyword
    options, which follow the layout's arguments."""

    name: str
    dtype_name: str
    suffix: str = ""
    names: tuple[str, ...]
    args: tuple[str, ...]
    schema: str
    options: tuple[tuple[str, str, object], ...] = ()
    #: The per-call plans serve this output as the pair ``(D, sD)`` with the one bool option ``use_ue8m0``
    #: (``_core.plans.pair_output_entry``, launched as ``kernels.gemm.launch_fp8_output`` launches it).
    pair_plan: bool = False

    @property
    def arity(self) -> int:
        return len(self.names)

    def unpack(self, out: object) -> tuple:
        """The output tensors of the public ``out`` argument (not yet type-checked)."""
        return (out,)

    def n_out(self, n: int) -> int:
        """Columns of D for ``n`` columns of B."""
        return n

    def check_options(self, options: tuple) -> tuple:
        """The options' types (``TypeError`` naming them); returns them."""
        return options

    def config_options(self, options: tuple) -> dict:
        """``get_config`` keywords the options select."""
        return {}

    def check(self, outs: tuple, lead: tuple[int, ...], rows: int, n: int, device: torch.device, rows_name: str
              ) -> None:
        raise NotImplementedError

    def check_layout(self, outs: tuple) -> None:
        raise NotImplementedError

    def check_pointers(self, outs: tuple, inputs: tuple[tuple[torch.Tensor, str], ...]) -> None:
        raise NotImplementedError

    def store(self, outs: tuple, sel, acc: torch.Tensor, options: tuple) -> None:
        """The reference's last step: rows ``sel`` of the outputs from ``acc``, their float32 product ``[r, n]``."""
        raise NotImplementedError

    def launch(self, cfg, a, sa, b, sb, outs: tuple, grouped_layout, backend) -> None:
        """The kernel of ``cfg`` on validated tensors (scales normalised)."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------- bf16
class Bf16Output(OutputPolicy):
    """``out`` bf16, row-major with 16-byte leading strides."""

    name, dtype_name, names, args, schema = "bf16", "bf16", ("out",), ("out",), "Tensor(a!) out"

    def check(self, outs, lead, rows, n, device, rows_name):
        (out,) = outs
        dims = "G, " if lead else ""
        check_tensor(out, "out", torch.bfloat16, len(lead) + 2)
        check_shape(out, "out", (*lead, rows, n), f"[{dims}{rows_name}, n]")
        check_same_device(device, ((out, "out"),))

    def check_layout(self, outs):
        check_row_major_tma(outs[0], "out")
        check_not_self_overlapping(outs[0], "out")

    def check_pointers(self, outs, inputs):
        check_aligned_ptr(outs[0], "out")
        check_no_overlap(outs[0], inputs, "out")

    def store(self, outs, sel, acc, options):
        outs[0][sel] = acc.to(torch.bfloat16)

    def launch(self, cfg, a, sa, b, sb, outs, grouped_layout, backend):
        gemm_host.launch_1d2d(cfg, a, sa, b, sb, outs[0], grouped_layout, backend)


# ---------------------------------------------------------------------------------------------- fp8
def check_out(out: object, lead: tuple[int, ...], rows: int, n_out: int, device: torch.device, rows_name: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``out = (D, sD)``: D e4m3 ``lead + [rows, n_out]``, sD float32 ``lead + [rows, ceil(n_out/128)]``, on
    ``device``; returns ``(D, sD)``. ``rows_name`` spells the row count in messages (``m``, ``m_sum``, ``m_max``)."""
    d, sd = unpack_pair(out, "out")
    rank = len(lead) + 2
    dims = "G, " if lead else ""
    check_tensor(d, OUT_NAMES[0], FP8, rank)
    check_shape(d, OUT_NAMES[0], (*lead, rows, n_out), f"[{dims}{rows_name}, n_out]")
    check_tensor(sd, OUT_NAMES[1], torch.float32, rank)
    check_shape(sd, OUT_NAMES[1], (*lead, rows, ceil_div(n_out, GRAN_K)), f"[{dims}{rows_name}, ceil(n_out/128)]")
    check_same_device(device, ((d, OUT_NAMES[0]), (sd, OUT_NAMES[1])))
    return d, sd


def check_out_layout(d: torch.Tensor, sd: torch.Tensor) -> None:
    """The kernels' layout of the pair: D row-major with 16-byte leading strides (``n_out % 16 == 0``: TMA stores
    whole 16-byte rows), sD exactly M-major TMA-aligned (``utils.m_major_strides``; the kernel writes scale
    ``(g, r, j)`` at ``(g * ceil(n_out/128) + j) * aligned_rows + r``)."""
    n_out = d.shape[-1]
    if n_out % 16:
        raise ValueError(f"{OUT_NAMES[0]} needs 16-byte rows (n_out % 16 == 0 e4m3 columns), got "
                         f"{OUT_NAMES[0]}.shape={tuple(d.shape)}")
    check_row_major_tma(d, OUT_NAMES[0])
    check_not_self_overlapping(d, OUT_NAMES[0])
    check_not_self_overlapping(sd, OUT_NAMES[1])
    want = m_major_strides(tuple(sd.shape))
    if sd.numel() and sd.stride() != want:
        raise ValueError(f"{OUT_NAMES[1]} must be M-major and TMA-aligned (as per_token_cast_to_fp8 returns, "
                         f"deep_fp8_gemm.utils.empty_m_major): stride {want}, got {OUT_NAMES[1]}.stride()="
                         f"{sd.stride()}")


def check_out_pointers(d: torch.Tensor, sd: torch.Tensor, inputs: tuple[tuple[torch.Tensor, str], ...]) -> None:
    """D 16-byte aligned (TMA); D and sD overlapping neither each other nor any input."""
    check_aligned_ptr(d, OUT_NAMES[0])
    check_aligned_ptr(sd, OUT_NAMES[1], 4)
    check_no_overlap(d, inputs + ((sd, OUT_NAMES[1]),), OUT_NAMES[0])
    check_no_overlap(sd, inputs, OUT_NAMES[1])


def empty_out(lead: tuple[int, ...], rows: int, n_out: int, device: torch.device | str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """An uninitialised output pair in the kernels' layout: D e4m3 ``lead + [rows, n_out]``, sD
    ``lead + [rows, ceil(n_out/128)]`` M-major TMA-aligned."""
    d = torch.empty((*lead, rows, n_out), dtype=FP8, device=device)
    return d, empty_m_major((*lead, rows, ceil_div(n_out, GRAN_K)), device)


def quantise_into(values: torch.Tensor, d: torch.Tensor, sd: torch.Tensor, use_ue8m0: bool) -> None:
    """``(d, sd) = per_token_cast_to_fp8_torch(values, reciprocal=True)`` (the epilogue's rule): ``values`` float32
    ``[r, n_out]``, ``d`` / ``sd`` views of the same rows (any strides)."""
    if values.shape[0] == 0:
        return
    q, s = per_token_cast_to_fp8_torch(values, use_ue8m0, reciprocal=True)
    d.copy_(q)
    sd.copy_(s)


class Fp8Output(OutputPolicy):
    """``out = (D, sD)``, D e4m3 quantised per row and 128 columns in the epilogue; option ``use_ue8m0``."""

    name, dtype_name, names, args = "fp8", "fp8", OUT_NAMES, ("d", "sd")
    schema = "Tensor(a!) d, Tensor(b!) sd"
    options = (("use_ue8m0", "bool", False),)
    pair_plan = True

    def unpack(self, out):
        return unpack_pair(out, "out")

    def check_options(self, options):
        return (check_bool(options[0], "use_ue8m0"),)

    def config_options(self, options):
        return {"ue8m0": bool(options[0])}

    def check(self, outs, lead, rows, n, device, rows_name):
        check_out(outs, lead, rows, self.n_out(n), device, rows_name)

    def check_layout(self, outs):
        check_out_layout(*outs)

    def check_pointers(self, outs, inputs):
        check_out_pointers(*outs, inputs)

    def values(self, acc: torch.Tensor) -> torch.Tensor:
        """The float32 values the epilogue quantises."""
        return acc

    def store(self, outs, sel, acc, options):
        if acc.shape[0] == 0:
            return
        q, s = per_token_cast_to_fp8_torch(self.values(acc), bool(options[0]), reciprocal=True)
        d, sd = outs
        d.view(torch.uint8)[sel] = q.view(torch.uint8)  # no index_put for float8 on every device
        sd[sel] = s

    def launch(self, cfg, a, sa, b, sb, outs, grouped_layout, backend):
        gemm_host.launch_fp8_output(cfg, a, sa, b, sb, *outs, grouped_layout, backend)


# ---------------------------------------------------------------------------------------------- SwiGLU
def swiglu_values(gate_up: torch.Tensor) -> torch.Tensor:
    """``SiLU(gate) * up`` in float32 of ``gate_up`` ``[r, 2I]`` in the checkpoint order (gate ``[0, I)``, up
    ``[I, 2I)``): the values ``silu_mul_quant`` quantises (``quant.silu_mul_quant_torch``)."""
    half = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :half].float()) * gate_up[..., half:].float()


def check_swiglu_inter(n: int, name: str = "rhs[0] (B)") -> int:
    """``n = 2I`` with ``I`` a positive multiple of 128 (the SwiGLU kinds' tiles are one gate block and one up
    block); returns I."""
    if n <= 0 or n % (2 * GRAN_MN_BLOCK):
        raise ValueError(f"{name}: the SwiGLU GEMM needs n = 2I (gate | up) with I a multiple of {GRAN_MN_BLOCK}, got "
                         f"n={n}")
    return n // 2


class SwigluWeights(NamedTuple):
    """The SwiGLU kinds' B: ``w13`` and its block scales with the gate / up 128-row blocks interleaved, as
    :func:`interleave_swiglu_weights` makes it. A pair of its own type, so that the MoE layers can refuse a plain
    ``(w13, w13_scale)`` pair in the checkpoint's layout (same shapes, other columns) instead of computing the
    wrong columns; the layout is in the type, not in a tensor attribute that ``.to()`` or ``load_state_dict``
    would drop. Unpacks as ``(weight, scale)``."""

    weight: torch.Tensor
    scale: torch.Tensor

    def to(self, device: torch.device | str) -> SwigluWeights:
        """The same pair on ``device`` (the layout kept)."""
        return SwigluWeights(self.weight.to(device), self.scale.to(device))

    def experts(self, index: slice) -> SwigluWeights:
        """The pair of the experts ``index`` selects (an expert-parallel rank's share)."""
        return SwigluWeights(self.weight[index], self.scale[index])


def interleave_swiglu_weights(w13: torch.Tensor, w13_scale: torch.Tensor) -> SwigluWeights:
    """The SwiGLU kinds' B layout of a gate/up weight (include/deep_fp8_gemm/policy_swiglu.cuh): exact, a copy.

    Args:
        w13: ``[E, 2I, H]`` float8_e4m3fn in the checkpoint layout (rows ``[0, I)`` gate W1, ``[I, 2I)`` up W3),
            ``I % 128 == 0``.
        w13_scale: ``[E, 2I/128, ceil(H/128)]`` float32, its 128x128 block scales.

    Returns:
        :class:`SwigluWeights` ``(w, s)`` of the same shapes, contiguous: 128-row blocks reordered gate block c,
        up block c, ...
        (``w[e, 256c + r] = w13[e, 128c + r]``, ``w[e, 256c + 128 + r] = w13[e, I + 128c + r]``), the block
        scales moved with their blocks.
    """
    for t, name, dtype in ((w13, "w13", FP8), (w13_scale, "w13_scale", torch.float32)):
        check_tensor(t, name, dtype, 3)
    num_experts, two_i, hidden = w13.shape
    inter = check_swiglu_inter(two_i, "w13")
    blocks = inter // GRAN_MN_BLOCK
    check_shape(w13_scale, "w13_scale", (num_experts, 2 * blocks, ceil_div(hidden, GRAN_K)),
                "[E, 2I/128, ceil(H/128)]")
    w = (w13.view(torch.uint8).view(num_experts, 2, blocks, GRAN_MN_BLOCK, hidden).transpose(1, 2).contiguous()
         .view(num_experts, two_i, hidden).view(FP8))
    s = w13_scale.view(num_experts, 2, blocks, -1).transpose(1, 2).contiguous().view(num_experts, 2 * blocks, -1)
    return SwigluWeights(w, s)


def deinterleave_swiglu_columns(x: torch.Tensor) -> torch.Tensor:
    """Columns of ``x [..., 2I]`` in the interleaved order (gate block c, up block c, ...) back to the checkpoint
    order (gate ``[0, I)``, up ``[I, 2I)``): what a GEMM with the interleaved B computes, as the unfused path sees it."""
    two_i = x.shape[-1]
    blocks = two_i // (2 * GRAN_MN_BLOCK)
    return x.reshape(*x.shape[:-1], blocks, 2, GRAN_MN_BLOCK).transpose(-3, -2).reshape(*x.shape[:-1], two_i)


class SwigluFp8Output(Fp8Output):
    """The MoE up-projection's output: ``SiLU(gate) * up`` of the interleaved B's fp32 result, quantised as
    :class:`Fp8Output`; D has ``n / 2`` columns (``n = 2I``, ``I % 128 == 0``)."""

    name, suffix = "swiglu_fp8", "_swiglu"

    def n_out(self, n):
        return check_swiglu_inter(n)

    def values(self, acc):
        return swiglu_values(deinterleave_swiglu_columns(acc))


BF16, FP8_OUT, SWIGLU_FP8 = Bf16Output(), Fp8Output(), SwigluFp8Output()
#: Output value of the kinds table -> its policy (the 1D2D families'; the fp32 accumulation of the 1D1D kinds is
#: their own families').
POLICIES: dict[str, OutputPolicy] = {p.name: p for p in (BF16, FP8_OUT, SWIGLU_FP8)}
