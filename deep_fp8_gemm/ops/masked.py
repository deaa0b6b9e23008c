"""The M-grouped masked layout (``layout = "masked"`` of the kinds table): ``m_grouped_gemm_fp8_fp8_bf16_nt_masked``
(bf16 out), ``m_grouped_gemm_fp8_fp8_fp8_nt_masked`` (FP8 out) and ``m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu`` (the
MoE up-projection, SwiGLU·FP8 out).

MoE decode under CUDA graphs: a fixed-size buffer per expert, A ``[G, m_max, k]``, ``masked_m[g]`` valid rows of
group g, read by the kernel on the device only (never by the host: a graph replays with new counts);
``expected_m`` is a host hint of the typical count, used only to choose the kernel configuration. The kernels
write rows up to the end of the last BLOCK_M block of each group, never past ``m_max``, and do not touch groups
with ``masked_m[g] == 0`` (kind ``GroupedMasked`` of ``scheduler.cuh``). The families are built from
:class:`MaskedLayout` and the output policies (``ops.gemm_family``).

The layout rule: ``0 <= masked_m[g] <= m_max`` (the kernel clamps a count to ``[0, m_max]``, so another value
computes something other than the op's definition). Checked on every call of CPU tensors (the reference and
the simulator alike); on CUDA never read (CUDA graphs replay with new counts) unless ``DFG_CHECK_LAYOUTS=1``,
or explicitly with :func:`check_masked_layout` (both synchronise).
"""

from __future__ import annotations

import torch

from .._core.checks import (BLOCK128, FP8, INDEX_DTYPE, check_operand_b_blocks, check_same_device, check_shape, check_tensor)
from ..utils import ceil_div
from .gemm_family import GemmLayout, families_of


def check_masked_operands(a, sa, b, sb, gran=BLOCK128) -> tuple[int, int, int, int]:
    """The input half of the masked layout, for this family and the FP8-output / SwiGLU ones: A ``[G, m_max, k]``
    e4m3 + sA ``[G, m_max, ceil(k/128)]`` fp32, B ``[G, n, k]`` + sB ``[G, ceil(n/128), ceil(k/128)]``, one device;
    returns ``(m_max, n, k, G)``."""
    check_tensor(a, "lhs[0] (A)", FP8, 3)
    num_groups, m_max, k = a.shape
    if k <= 0 or num_groups < 1:
        raise ValueError(f"lhs[0] (A) must be [G, m_max, k] with G >= 1 and k >= 1, got shape={tuple(a.shape)}")
    kb = ceil_div(k, gran.k)
    check_tensor(sa, "lhs[1] (sA)", torch.float32, 3)
    check_shape(sa, "lhs[1] (sA)", (num_groups, m_max, kb), f"[G, m_max, {gran.dims('k')}]")
    n = check_operand_b_blocks(b, sb, k, kb, num_groups, gran)
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")))
    return m_max, n, k, num_groups


def check_masked_values(masked_m: torch.Tensor, m_max: int, num_groups: int | None = None,
                        name: str = "masked_m") -> None:
    """Every count of a checked ``masked_m`` in ``[0, m_max]`` (``ValueError`` naming the first bad group).
    Vectorised; reads three integers back (one synchronisation on a GPU)."""
    if masked_m.numel() == 0:
        return
    counts = masked_m.reshape(-1)
    if counts.device.type == "cpu":  # a handful of ints: the host reads them directly
        bad = [(g, c) for g, c in enumerate(counts.tolist()) if not 0 <= c <= m_max]
        if bad:
            raise ValueError(f"{name}[{bad[0][0]}] must be in [0, m_max={m_max}], got {bad[0][1]}")
        return
    any_bad, g, value = masked_layout_stats(counts, m_max)
    if any_bad:
        raise ValueError(f"{name}[{g}] must be in [0, m_max={m_max}], got {value}")


def masked_layout_stats(counts: torch.Tensor, m_max: int) -> list[int]:
    """``[any count outside [0, m_max], the first such group, its count]`` of a 1-D count tensor, computed on its
    device and read back with one synchronisation (the GPU side of :func:`check_masked_values`)."""
    bad = (counts < 0) | (counts > m_max)
    first = bad.to(torch.uint8).argmax()
    return torch.stack([bad.any().to(torch.int64), first.to(torch.int64), counts[first].to(torch.int64)]).tolist()


def check_masked_layout(masked_m: torch.Tensor, m_max: int) -> None:
    """Check masked counts before a GEMM on the GPU (the op checks CPU tensors itself; CUDA tensors only with
    ``DFG_CHECK_LAYOUTS=1``): ``masked_m`` 1-D int32, every count in ``[0, m_max]``. Reads the values, so it
    synchronises when ``masked_m`` is on a GPU. ``ValueError`` / ``TypeError`` naming ``masked_m``."""
    check_tensor(masked_m, "masked_m", INDEX_DTYPE, 1)
    if isinstance(m_max, bool) or not isinstance(m_max, int) or m_max < 0:
        raise ValueError(f"m_max must be a non-negative int (rows per group of lhs[0]), got {m_max!r}")
    check_masked_values(masked_m, m_max)


class MaskedLayout(GemmLayout):
    """A ``[G, m_max, k]``, B ``[G, n, k]``, outputs ``[G, m_max, ...]``, ``masked_m [G]`` int32, ``expected_m`` a
    positive int (the heuristic's rows per group); rows ``< masked_m[g]`` of each group computed."""

    name, grouped, expected_m, rows_name, batched = "masked", "masked_m", "required", "m_max", True
    op_template, schema = "m_grouped_gemm_fp8_fp8_{}_nt_masked", ", Tensor masked_m, int expected_m"

    def check_inputs(self, a, sa, b, sb, gran=BLOCK128):
        return check_masked_operands(a, sa, b, sb, gran)

    def check_grouped(self, gl, problem, device):
        check_tensor(gl, "masked_m", INDEX_DTYPE, 1)
        check_shape(gl, "masked_m", (problem.groups,), "[G]")
        check_same_device(device, ((gl, "masked_m"),))

    def values_check(self, gl, rows, groups):
        check_masked_values(gl, rows)

    def reference_parts(self, a, gl, groups):
        """One matmul per group over its valid rows (read on the host: ``ValueError`` for a count outside
        ``[0, m_max]``); the other rows are left untouched."""
        check_masked_values(gl, a.size(1))
        return [(g, (g, slice(0, count))) for g, count in enumerate(gl.tolist()) if count]

    def plan_problem(self, a, b, expected_m):
        """The heuristic for ``expected_m`` rows per group (the counts live on the device)."""
        return int(expected_m), b.shape[-2], b.shape[-1], b.shape[0], {}


#: The layout, and kind -> family of every masked 1D2D kind of the kinds table.
LAYOUT = MaskedLayout()
FAMILIES = families_of(LAYOUT)
_BF16, _FP8, _SWIGLU = (FAMILIES[k].call for k in ("masked", "masked_fp8out", "masked_swiglu"))


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                                          out: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    """Grouped GEMM over a fixed-size buffer per expert (MoE decode, CUDA-graph friendly).

    ``out[g, r] = bf16(dequant(A[g, r]) · dequant(B[g])ᵀ)`` for ``r < masked_m[g]``.

    Args:
        lhs: ``(A, sA)``: A ``[G, m_max, k]`` float8_e4m3fn, K-major (all leading strides multiples of 16
            bytes); sA ``[G, m_max, ceil(k/128)]`` float32.
        rhs: ``(B, sB)``: B ``[G, n, k]`` float8_e4m3fn, K-major; sB ``[G, ceil(n/128), ceil(k/128)]`` float32.
        out: ``[G, m_max, n]`` bfloat16, row-major; rows ``>= masked_m[g]`` are unspecified.
        masked_m: ``[G]`` int32 on the same device, valid rows per group in ``[0, m_max]``; checked on every
            call of CPU tensors (``ValueError``), never read on the host by the CUDA path (so a CUDA graph can
            replay the call with new counts) unless ``DFG_CHECK_LAYOUTS=1`` (:func:`check_masked_layout`).
        expected_m: positive Python int, a hint of the typical ``masked_m`` used only to choose the kernel
            configuration.

    Same alignment rules, errors and dispatch as :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt`.
    """
    _BF16(lhs, rhs, out, masked_m, expected_m)


def m_grouped_gemm_fp8_fp8_fp8_nt_masked(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                                         out: tuple[torch.Tensor, torch.Tensor], masked_m: torch.Tensor,
                                         expected_m: int, use_ue8m0: bool = False) -> None:
    """Masked grouped GEMM (MoE decode, CUDA-graph friendly), FP8 output.

    ``out[g, r] = per_token_cast_to_fp8(dequant(A[g, r]) · dequant(B[g])ᵀ)`` for ``r < masked_m[g]``.

    Args:
        lhs, rhs, masked_m, expected_m: as :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`.
        out: ``(D, sD)``: D ``[G, m_max, n]`` float8_e4m3fn row-major (``n % 16 == 0``), sD ``[G, m_max, ceil(n/128)]``
            float32 M-major TMA-aligned per group (``deep_fp8_gemm.utils.empty_m_major``); rows ``>= masked_m[g]``
            unspecified.
        use_ue8m0: power-of-two scales.
    """
    _FP8(lhs, rhs, out, masked_m, expected_m, use_ue8m0)


def m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu(lhs: tuple[torch.Tensor, torch.Tensor],
                                                rhs: tuple[torch.Tensor, torch.Tensor],
                                                out: tuple[torch.Tensor, torch.Tensor], masked_m: torch.Tensor,
                                                expected_m: int, use_ue8m0: bool = False) -> None:
    """The SwiGLU up-projection on per-expert buffers: ``out[g, r] = per_token_cast_to_fp8(SiLU(gate) * up)`` of
    ``dequant(A[g, r]) · dequant(W13[g])ᵀ`` in fp32, for ``r < masked_m[g]``.

    Args:
        lhs, masked_m, expected_m: as :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`.
        rhs: the interleaved ``(W, sW)`` of :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_fp8_nt_contiguous_swiglu`.
        out: ``(D, sD)``: D ``[G, m_max, I]`` float8_e4m3fn, sD ``[G, m_max, I/128]`` float32 M-major TMA-aligned per
            group; rows ``>= masked_m[g]`` unspecified.
        use_ue8m0: power-of-two scales.
    """
    _SWIGLU(lhs, rhs, out, masked_m, expected_m, use_ue8m0)


for _kind, _public in (("masked", m_grouped_gemm_fp8_fp8_bf16_nt_masked),
                       ("masked_fp8out", m_grouped_gemm_fp8_fp8_fp8_nt_masked),
                       ("masked_swiglu", m_grouped_gemm_fp8_fp8_fp8_nt_masked_swiglu)):
    FAMILIES[_kind].public = _public
