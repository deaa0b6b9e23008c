"""The dense GEMM family (kind ``"dense"``): ``gemm_fp8_fp8_bf16_nt``, with split-K for decode shapes.

``out = bf16(dequant(A) · dequant(B)ᵀ)``: A ``[m, k]`` e4m3 with 1x128 per-token scales, B ``[n, k]`` e4m3 with
128x128 block scales, both K-major ("NT"), out ``[m, n]`` bf16. Everything the family is lives here: the
checks, the exact reference, the dispatch, the config rule (``plan``), the custom op and the public function.

Dispatch (after the checks): ``m == 0`` (or ``n == 0``) is a no-op; otherwise ``runtime.target.backend_of``: CPU
tensors run :func:`reference_validated` (or, with ``DFG_SIMULATE=1``, the real kernel in the CPU simulator),
sm_90 tensors the JIT kernel, any other GPU raises ``RuntimeError``. Before a kernel launch sA is converted to the
M-major TMA-aligned layout (a copy unless it already is; ``per_token_cast_to_fp8`` returns it so) and sB made
contiguous (no copy when it is). Split-K (``kernels/split_k.py``) is the heuristic's choice for problems with
fewer output tiles than SMs.

Eager calls (plain tensors, not tracing) go through the per-call fast path (``_core.plans``: the same checks and
dispatch, run once per tensor signature); traced calls and dispatch modes run the custom op
``torch.ops.deep_fp8_gemm.gemm_fp8_fp8_bf16_nt(a, sa, b, sb, out)`` (fake kernel: the layout checks at trace
time), so compiled model code sees one node per GEMM.
"""

from __future__ import annotations

import torch

from .._core.checks import (Problem, check_operand_a_2d, check_operand_b_blocks, check_pointers, check_same_device,
                            check_shape, check_tensor, check_tma_layout, unpack_pair)
from .._core.dispatch import eager, normalise_scales, operands
from .._core.family import GemmFamily, register_op
from .._core.plans import GemmEntrySpec, gemm_entry
from .._core.reference_math import dequantize_per_token, matmul_nt_bf16
from ..config import GemmConfig, get_config
from ..kernels import gemm as gemm_host
from ..runtime import target
from ..runtime.target import Backend


def check(a, sa, b, sb, out, *, layout: bool = True, pointers: bool = True) -> Problem:
    """A ``[m, k]`` e4m3, sA ``[m, ceil(k/128)]`` fp32, B ``[n, k]`` e4m3, sB ``[ceil(n/128), ceil(k/128)]`` fp32,
    out ``[m, n]`` bf16, one device (``_core.checks``: the levels ``layout`` and ``pointers``)."""
    m, k, kb = check_operand_a_2d(a, sa, "m")
    n = check_operand_b_blocks(b, sb, k, kb, None)
    check_tensor(out, "out", torch.bfloat16, 2)
    check_shape(out, "out", (m, n), "[m, n]")
    check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)"), (out, "out")))
    if layout:
        check_tma_layout(a, b, out, n, k)
    if pointers:
        check_pointers(a, sa, b, sb, out)
    return Problem(m, n, k)


def reference_validated(a, sa, b, sb, out) -> None:
    """The reference on checked tensors (what the op runs on CPU tensors): one float32 matmul."""
    out.copy_(matmul_nt_bf16(dequantize_per_token(a, sa), b, sb))


def reference(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
              ) -> None:
    """Reference of :func:`gemm_fp8_fp8_bf16_nt`: ``out = A·Bᵀ`` of the dequantised operands (float32
    accumulation, one rounding to bf16; any strides, any n / k).

    Args:
        lhs: ``(A [m, k] float8_e4m3fn, sA [m, ceil(k/128)] float32)``.
        rhs: ``(B [n, k] float8_e4m3fn, sB [ceil(n/128), ceil(k/128)] float32)``.
        out: ``[m, n]`` bfloat16, written in place.
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    check(a, sa, b, sb, out, layout=False, pointers=False)
    reference_validated(a, sa, b, sb, out)


def plan(a, b, expected_m, num_sms: int) -> GemmConfig:
    """The config: the heuristic for ``m`` rows of A (dense takes no ``expected_m``)."""
    return get_config(a.shape[0], b.shape[0], b.shape[1], 1, "dense", num_sms)


def dispatch(a, sa, b, sb, out, grouped_layout=None, expected_m=None) -> None:
    """Run a checked, non-empty call on its backend (the reference, the simulator or the sm_90 kernel)."""
    backend = target.backend_of(a.device, "gemm")
    if backend is Backend.REFERENCE:
        reference_validated(a, sa, b, sb, out)
        return
    cfg = plan(a, b, None, gemm_host.num_sms_for(backend))
    gemm_host.launch_1d2d(cfg, a, normalise_scales(sa), b, sb.contiguous(), out, None, backend)


def impl(a, sa, b, sb, out) -> None:
    """Check and dispatch (the custom op's kernel for CPU and CUDA)."""
    if not check(a, sa, b, sb, out).empty:
        FAMILY.dispatch(a, sa, b, sb, out)


def _fake(a, sa, b, sb, out) -> None:
    check(a, sa, b, sb, out, pointers=False)


OP = register_op("gemm_fp8_fp8_bf16_nt", "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out) -> ()",
                 impl, _fake)


def gemm_fp8_fp8_bf16_nt(
    lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
) -> None:
    """``out = bf16(dequant(A) · dequant(B)ᵀ)`` with fine-grained FP8 scales; both operands K-major ("NT").

    Args:
        lhs: ``(A, sA)``: A ``[m, k]`` float8_e4m3fn, K-major (``stride(-1) == 1``, ``stride(0)`` a multiple of
            16 bytes, 16-byte-aligned address); sA ``[m, ceil(k/128)]`` float32, one scale per row per 128
            K-elements, any strides (converted to M-major TMA-aligned, which copies unless it already is).
        rhs: ``(B, sB)``: B ``[n, k]`` float8_e4m3fn, K-major like A; sB ``[ceil(n/128), ceil(k/128)]`` float32,
            one scale per 128x128 block.
        out: ``[m, n]`` bfloat16, row-major (``stride(-1) == 1``, 16-byte-aligned rows), written in place;
            must not overlap any input.

    Requires ``n % 8 == 0``, ``k % 16 == 0``, ``k >= 16``; every tensor on one device. ``m == 0`` is a no-op.
    CPU: exact reference (float32 accumulation of dequantised products, one rounding to bf16).
    CUDA: sm_90 only (``RuntimeError`` otherwise).

    Raises:
        TypeError: a non-tensor argument or a wrong dtype. ValueError: a wrong rank, shape, stride, alignment
        or device.
    """
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    if _entry(a, sa, b, sb, out):  # eager: checks cached per tensor signature (_core.plans)
        return
    a, sa, b, sb = operands(lhs, rhs, out)
    (impl if eager(a, sa, b, sb, out) else OP)(a, sa, b, sb, out)


FAMILY = GemmFamily(kind="dense", public=gemm_fp8_fp8_bf16_nt, check=check, reference=reference, dispatch=dispatch,
                    plan=plan, op=OP)
_entry = gemm_entry(GemmEntrySpec(FAMILY, lambda a, sa, b, sb, out, gl, em: check(a, sa, b, sb, out), None, "none"))
