"""The M-grouped masked GEMM family (kind ``"masked"``): ``m_grouped_gemm_fp8_fp8_bf16_nt_masked``.

MoE decode under CUDA graphs: a fixed-size buffer per expert, A ``[G, m_max, k]``, ``masked_m[g]`` valid rows of
group g, read by the kernel on the device only (never by the host: a graph replays with new counts);
``expected_m`` is a host hint of the typical count, used only to choose the kernel configuration. The kernels
write rows up to the end of the last BLOCK_M block of each group, never past ``m_max``, and do not touch groups
with ``masked_m[g] == 0`` (kind ``GroupedMasked`` of ``scheduler.cuh``). Same layers as :mod:`.dense`.

The layout rule: ``0 <= masked_m[g] <= m_max`` (the kernel clamps a count to ``[0, m_max]``, so another value
computes something other than the op's definition). Checked on every call of CPU tensors (the reference and
the simulator alike); on CUDA never read (CUDA graphs replay with new counts) unless ``DFG_CHECK_LAYOUTS=1``,
or explicitly with :func:`check_masked_layout` (both synchronise).
"""

from __future__ import annotations

import torch

from .._core.checks import (FP8, INDEX_DTYPE, Problem, check_expected_m, check_operand_b_blocks, check_pointers,
                            check_same_device, check_shape, check_tensor, check_tma_layout, layout_values_checked,
                            unpack_pair)
from .._core.dispatch import eager, normalise_scales, operands
from .._core.family import GemmFamily, register_op
from .._core.plans import GemmEntrySpec, gemm_entry
from .._core.reference_math import dequantize_per_token, matmul_nt_bf16
from ..config import GemmConfig, get_config
from ..constants import GRAN_K
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from ..utils import ceil_div


def check_masked_operands(a, sa, b, sb) -> tuple[int, int, int, int]:
    """The input half of the masked layout, for this family and the FP8-output / SwiGLU ones: A ``[G, m_max, k]``
    e4m3 + sA ``[G, m_max, ceil(k/128)]`` fp32, B ``[G, n, k]`` + sB ``[G, ceil(n/128), ceil(k/128)]``, one device;
    returns ``(m_max, n, k, G)``."""
    check_tensor(a, "lhs[0] (A)", FP8, 3)
    num_groups, m_max, k = a.shape
    if k <= 0 or num_groups < 1:
        raise ValueError(f"lhs[0] (A) must be [G, m_max, k] with G >= 1 and k >= 1, got shape={tuple(a.shape)}")
    kb = ceil_div(k, GRAN_K)
    check_tensor(sa, "lhs[1] (sA)", torch.float32, 3)
    check_shape(sa, "lhs[1] (sA)", (num_groups, m_max, kb), "[G, m_max, ceil(k/128)]")
    n = check_operand_b_blocks(b, sb, k, kb, num_groups)
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")))
    return m_max, n, k, num_groups


def check(a, sa, b, sb, out, masked_m, expected_m, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[G, m_max, k]``, sA ``[G, m_max, ceil(k/128)]``, B ``[G, n, k]``, sB ``[G, ceil(n/128), ceil(k/128)]``,
    out ``[G, m_max, n]`` bf16, masked_m ``[G]`` int32, expected_m a positive int. Returns ``Problem(m_max, n, k,
    G)``. The values of masked_m are not read."""
    check_expected_m(expected_m)
    m_max, n, k, num_groups = check_masked_operands(a, sa, b, sb)
    check_tensor(out, "out", torch.bfloat16, 3)
    check_shape(out, "out", (num_groups, m_max, n), "[G, m_max, n]")
    check_tensor(masked_m, "masked_m", INDEX_DTYPE, 1)
    check_shape(masked_m, "masked_m", (num_groups,), "[G]")
    check_same_device(a.device, ((out, "out"), (masked_m, "masked_m")))
    if layout:
        check_tma_layout(a, b, out, n, k)
    if pointers:
        check_pointers(a, sa, b, sb, out, ((masked_m, "masked_m"),))
    return Problem(m_max, n, k, num_groups)


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


def reference_validated(a, sa, b, sb, out, masked_m) -> None:
    """The reference on checked tensors: one matmul per group over its valid rows; reads ``masked_m`` on the host
    (``ValueError`` for a count outside ``[0, m_max]``); the other rows are left untouched."""
    m_max = a.size(1)
    counts = masked_m.tolist()
    for g, count in enumerate(counts):
        if not 0 <= count <= m_max:
            raise ValueError(f"masked_m[{g}] must be in [0, m_max={m_max}], got {count}")
        if count:
            out[g, :count] = matmul_nt_bf16(dequantize_per_token(a[g, :count], sa[g, :count]), b[g], sb[g])


def reference(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
              masked_m: torch.Tensor, expected_m: int) -> None:
    """Reference of the masked grouped GEMM: ``out[g, :masked_m[g]] = A[g, :masked_m[g]]·B[g]ᵀ`` (dequantised).

    Args:
        lhs: ``(A [G, m_max, k] float8_e4m3fn, sA [G, m_max, ceil(k/128)] float32)``.
        rhs: ``(B [G, n, k] float8_e4m3fn, sB [G, ceil(n/128), ceil(k/128)] float32)``.
        out: ``[G, m_max, n]`` bfloat16; rows ``>= masked_m[g]`` are unspecified by the op (this reference
            leaves them untouched).
        masked_m: ``[G]`` int32, values in ``[0, m_max]``.
        expected_m: positive int, a performance hint only (unused here).
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check(a, sa, b, sb, out, masked_m, expected_m, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, out, masked_m)


def plan(a, b, expected_m: int, num_sms: int) -> GemmConfig:
    """The config: the heuristic for ``expected_m`` rows per group (the counts live on the device)."""
    return get_config(int(expected_m), b.shape[-2], b.shape[-1], b.shape[0], "masked", num_sms)


def dispatch(a, sa, b, sb, out, masked_m, expected_m) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, out, masked_m)
        return
    cfg = plan(a, b, expected_m, gemm_host.num_sms_for(backend))
    gemm_host.launch_1d2d(cfg, a, normalise_scales(sa), b, sb.contiguous(), out, masked_m.contiguous(), backend)


def impl(a, sa, b, sb, out, masked_m, expected_m) -> None:
    """Check (the counts too on CPU tensors, and on CUDA with ``DFG_CHECK_LAYOUTS=1``) and dispatch (the custom
    op's kernel for CPU and CUDA)."""
    problem = check(a, sa, b, sb, out, masked_m, expected_m)
    if layout_values_checked(a.device):
        check_masked_values(masked_m, problem.m)
    if not problem.empty:
        FAMILY.dispatch(a, sa, b, sb, out, masked_m, expected_m)


def _fake(a, sa, b, sb, out, masked_m, expected_m) -> None:
    check(a, sa, b, sb, out, masked_m, expected_m, pointers=False)


OP = register_op("m_grouped_gemm_fp8_fp8_bf16_nt_masked",
                 "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, Tensor masked_m, int expected_m) -> ()",
                 impl, _fake)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(
    lhs: tuple[torch.Tensor, torch.Tensor],
    rhs: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
) -> None:
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
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    if _entry(a, sa, b, sb, out, masked_m, expected_m):  # eager: checks cached per tensor signature (_core.plans)
        return
    a, sa, b, sb = operands(lhs, rhs, out, (masked_m, "masked_m"))
    check_expected_m(expected_m)
    (impl if eager(a, sa, b, sb, out, masked_m) else OP)(a, sa, b, sb, out, masked_m, expected_m)


FAMILY = GemmFamily(kind="masked", public=m_grouped_gemm_fp8_fp8_bf16_nt_masked, check=check, reference=reference,
                    dispatch=dispatch, plan=plan, op=OP)
_entry = gemm_entry(GemmEntrySpec(FAMILY, lambda a, sa, b, sb, out, gl, em: check(a, sa, b, sb, out, gl, em),
                                  "masked_m", "required", check_masked_values))
