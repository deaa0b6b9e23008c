"""The dense FP8-output GEMM family (kind ``"dense_fp8out"``): ``gemm_fp8_fp8_fp8_nt``.

``(D, sD) = per_token_cast_to_fp8(dequant(A) · dequant(B)ᵀ)`` in one kernel: A ``[m, k]`` e4m3 with 1x128 scales, B
``[n, k]`` e4m3 with 128x128 block scales (both K-major, "NT"), D ``[m, n]`` e4m3 with 1x128 per-row scales sD
quantised in the epilogue from the fp32 accumulators (``ops.fp8_output``: the quantiser's rules, the layout
``per_token_cast_to_fp8`` returns), so ``(D, sD)`` is the ``lhs`` of the next GEMM. Tiles are one 128-column scale
group wide (``config.FP8_OUTPUT_BLOCK_N``); split-K serves decode shapes as for the bf16 kind. Same layers as
:mod:`.dense`: checks, reference, dispatch, plan, the custom op ``torch.ops.deep_fp8_gemm.gemm_fp8_fp8_fp8_nt``, the
public function (no per-call plan cache: eager calls go through :func:`impl`).
"""

from __future__ import annotations

import torch

from .._core.checks import Problem, check_bool
from .._core.dispatch import eager, normalise_scales
from .._core.family import GemmFamily, register_op
from ..config import GemmConfig, get_config
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend
from .fp8_output import check_layout_and_pointers, check_operands_2d, check_out, out_operands, reference_dense

KIND = "dense_fp8out"


def check(a, sa, b, sb, d, sd, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[m, k]`` e4m3, sA ``[m, ceil(k/128)]``, B ``[n, k]``, sB ``[ceil(n/128), ceil(k/128)]``, D ``[m, n]`` e4m3,
    sD ``[m, ceil(n/128)]`` fp32, one device (``_core.checks`` levels; ``layout`` adds ``n % 16 == 0`` and sD's
    M-major layout)."""
    m, n, k, _ = check_operands_2d(a, sa, b, sb, False, "m")
    check_out((d, sd), (), m, n, a.device, "m")
    check_layout_and_pointers(a, sa, b, sb, d, sd, n, k, (), layout, pointers)
    return Problem(m, n, k)


def reference_validated(a, sa, b, sb, d, sd, use_ue8m0: bool = False) -> None:
    """The reference on checked tensors: the float32 GEMM, quantised per row and 128 columns."""
    reference_dense(a, sa, b, sb, d, sd, use_ue8m0)


def reference(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
              out: tuple[torch.Tensor, torch.Tensor], use_ue8m0: bool = False) -> None:
    """Reference of :func:`gemm_fp8_fp8_fp8_nt`: ``per_token_cast_to_fp8_torch(A·Bᵀ)`` of the dequantised operands
    (float32 sums; any strides, any n)."""
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out)
    check(a, sa, b, sb, d, sd, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, d, sd, check_bool(use_ue8m0, "use_ue8m0"))


def plan(a, b, expected_m, num_sms: int, use_ue8m0: bool = False) -> GemmConfig:
    """The config: the heuristic for ``m`` rows of A."""
    return get_config(a.shape[0], b.shape[0], b.shape[1], 1, KIND, num_sms, ue8m0=use_ue8m0)


def dispatch(a, sa, b, sb, d, sd, grouped_layout=None, expected_m=None, use_ue8m0: bool = False) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, d, sd, use_ue8m0)
        return
    cfg = plan(a, b, None, gemm_host.num_sms_for(backend), use_ue8m0)
    gemm_host.launch_fp8_output(cfg, a, normalise_scales(sa), b, sb.contiguous(), d, sd, None, backend)


def impl(a, sa, b, sb, d, sd, use_ue8m0: bool = False) -> None:
    """Check and dispatch (the custom op's kernel for CPU and CUDA)."""
    if not check(a, sa, b, sb, d, sd).empty:
        FAMILY.dispatch(a, sa, b, sb, d, sd, None, None, use_ue8m0)


def _fake(a, sa, b, sb, d, sd, use_ue8m0: bool = False) -> None:
    check(a, sa, b, sb, d, sd, pointers=False)


OP = register_op("gemm_fp8_fp8_fp8_nt", "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) d, Tensor(b!) sd, "
                 "bool use_ue8m0=False) -> ()", impl, _fake)


def gemm_fp8_fp8_fp8_nt(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                        out: tuple[torch.Tensor, torch.Tensor], use_ue8m0: bool = False) -> None:
    """``out = per_token_cast_to_fp8(dequant(A) · dequant(B)ᵀ)``: an FP8 GEMM whose output is FP8 again.

    Args:
        lhs: ``(A, sA)`` as :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt` (A ``[m, k]`` e4m3 K-major, sA ``[m, ceil(k/128)]``
            fp32, any strides: converted to M-major TMA-aligned, a copy unless it already is).
        rhs: ``(B, sB)``: B ``[n, k]`` e4m3 K-major, sB ``[ceil(n/128), ceil(k/128)]`` fp32.
        out: ``(D, sD)``, written in place: D ``[m, n]`` float8_e4m3fn, row-major, 16-byte-aligned rows
            (``n % 16 == 0``); sD ``[m, ceil(n/128)]`` float32 in the M-major TMA-aligned layout that
            :func:`deep_fp8_gemm.per_token_cast_to_fp8` returns (strides ``(1, get_tma_aligned_size(m, 4))``; make it
            with ``deep_fp8_gemm.utils.empty_m_major``). Neither may overlap an input or the other.
        use_ue8m0: power-of-two scales (:func:`deep_fp8_gemm.quant.ceil_to_ue8m0`), as ``per_token_cast_to_fp8``'s.

    Per row r and 128-column group j of the fp32 product ``y``: ``sD[r, j] = max(max|y[r, group]|, 1e-4) / 448``
    and ``D[r, c] = e4m3(clamp(y[r, c] / sD[r, j], ±448))`` (nearest even): ``per_token_cast_to_fp8``'s rules on the
    fp32 accumulator (a partial last group as if zero-padded). CPU: the exact reference (float32 sums);
    ``DFG_SIMULATE=1``: the kernel in the simulator; CUDA: sm_90 only.

    Raises:
        TypeError / ValueError: as :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt`, naming ``out[0] (D)`` / ``out[1] (sD)``.
    """
    a, sa, b, sb, d, sd = out_operands(lhs, rhs, out)
    check_bool(use_ue8m0, "use_ue8m0")
    (impl if eager(a, sa, b, sb, d, sd) else OP)(a, sa, b, sb, d, sd, use_ue8m0)


FAMILY = GemmFamily(kind=KIND, public=gemm_fp8_fp8_fp8_nt, check=check, reference=reference, dispatch=dispatch,
                    plan=plan, op=OP)
