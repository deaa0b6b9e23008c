"""The dense layout (``layout = "dense"`` of the kinds table): ``gemm_fp8_fp8_bf16_nt`` (bf16 out, split-K and
swap-AB for decode shapes), ``gemm_fp8_fp8_fp8_nt`` (FP8 out) and ``gemm_fp8_fp8_bf16_nt_block32`` (the 1x32 / 32x32
scale recipe, bf16 out).

``D = dequant(A) · dequant(B)ᵀ``: A ``[m, k]`` e4m3 with 1x128 per-token scales, B ``[n, k]`` e4m3 with 128x128 block
scales, both K-major ("NT"); D as the output policy says (``ops.outputs``: bf16 ``[m, n]``, or e4m3 ``[m, n]`` with
1x128 scales). The layout (:class:`DenseLayout`) checks the operands and plans for ``m`` rows; the families are built
from it and the output policies (``ops.gemm_family``).

Dispatch (after the checks): ``m == 0`` (or ``n == 0``) is a no-op; otherwise ``runtime.target.backend_of``: CPU
tensors run the exact reference (or, with ``DFG_SIMULATE=1``, the real kernel in the CPU simulator), sm_90 tensors
the JIT kernel, any other GPU raises ``RuntimeError``. Before a kernel launch sA is converted to the M-major
TMA-aligned layout (a copy unless it already is; ``per_token_cast_to_fp8`` returns it so) and sB made contiguous (no
copy when it is). Split-K (``kernels/split_k.py``) and swap-AB are the heuristic's choices for problems with fewer
output tiles than SMs.

Eager bf16 calls go through the per-call fast path (``_core.plans``: the same checks and dispatch, run once per tensor
signature); traced calls and dispatch modes run the custom ops ``torch.ops.deep_fp8_gemm.gemm_fp8_fp8_bf16_nt(a, sa,
b, sb, out)`` / ``gemm_fp8_fp8_fp8_nt(a, sa, b, sb, d, sd, use_ue8m0=False)`` (fake kernels: the layout checks at
trace time), so compiled model code sees one node per GEMM.
"""

from __future__ import annotations

import torch

from .._core.checks import BLOCK128, check_operand_a_2d, check_operand_b_blocks, check_same_device
from .gemm_family import GemmLayout, families_of


class DenseLayout(GemmLayout):
    """A ``[m, k]``, sA ``[m, ceil(k/128)]``, B ``[n, k]``, sB ``[ceil(n/128), ceil(k/128)]``; every row computed."""

    name, op_template = "dense", "gemm_fp8_fp8_{}_nt"

    def check_inputs(self, a, sa, b, sb, gran=BLOCK128):
        m, k, kb = check_operand_a_2d(a, sa, "m", gran)
        n = check_operand_b_blocks(b, sb, k, kb, None, gran)
        check_same_device(a.device, ((sa, "lhs[1] (sA)"), (b, "rhs[0] (B)"), (sb, "rhs[1] (sB)")))
        return m, n, k, 1

    def reference_parts(self, a, gl, groups):
        return [(None, slice(None))]  # one matmul over all rows

    def plan_problem(self, a, b, expected_m):
        return a.shape[0], b.shape[0], b.shape[1], 1, {}


#: The layout, and kind -> family of every dense 1D2D kind of the kinds table.
LAYOUT = DenseLayout()
FAMILIES = families_of(LAYOUT)
_BF16, _FP8, _BLOCK32 = FAMILIES["dense"].call, FAMILIES["dense_fp8out"].call, FAMILIES["dense_block32"].call


def gemm_fp8_fp8_bf16_nt(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                         out: torch.Tensor) -> None:
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
    CPU: the exact reference (K-block partials of the e4m3 products exact in float64, promoted in fp32 in K-block
    order, one rounding to bf16). CUDA: sm_90 only (``RuntimeError`` otherwise).

    Batch-invariant: row r of out depends only on row r of A (and sA) and on B, never on m, the other rows or the
    kernel the heuristic picks (by default: ``deep_fp8_gemm.set_batch_invariant``, docs/batch-invariance.md).

    Raises:
        TypeError: a non-tensor argument or a wrong dtype. ValueError: a wrong rank, shape, stride, alignment
        or device.
    """
    _BF16(lhs, rhs, out)


def gemm_fp8_fp8_fp8_nt(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                        out: tuple[torch.Tensor, torch.Tensor], use_ue8m0: bool = False) -> None:
    """``out = per_token_cast_to_fp8(dequant(A) · dequant(B)ᵀ)``: an FP8 GEMM whose output is FP8 again.

    Args:
        lhs: ``(A, sA)`` as :func:`gemm_fp8_fp8_bf16_nt` (A ``[m, k]`` e4m3 K-major, sA ``[m, ceil(k/128)]`` fp32, any
            strides: converted to M-major TMA-aligned, a copy unless it already is).
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
        TypeError / ValueError: as :func:`gemm_fp8_fp8_bf16_nt`, naming ``out[0] (D)`` / ``out[1] (sD)``.
    """
    _FP8(lhs, rhs, out, None, None, use_ue8m0)


def gemm_fp8_fp8_bf16_nt_block32(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                                 out: torch.Tensor) -> None:
    """``out = bf16(dequant(A) · dequant(B)ᵀ)`` with the 1x32 / 32x32 recipe (DeepSeek-V4.1's dense FP8 checkpoints,
    ``weight_block_size [32, 32]``): the reference design's ``recipe=(1, 32, 32)``.

    Args:
        lhs: ``(A, sA)``: A ``[m, k]`` float8_e4m3fn, K-major (as :func:`gemm_fp8_fp8_bf16_nt`); sA ``[m, ceil(k/32)]``
            float32, one scale per row per 32 K-elements, any strides (converted to M-major TMA-aligned, a copy
            unless it already is: ``per_token_cast_to_fp8(x, gran_k=32)`` returns it so). Power-of-two (UE8M0)
            values are ordinary fp32 scales here.
        rhs: ``(B, sB)``: B ``[n, k]`` float8_e4m3fn, K-major; sB ``[ceil(n/32), ceil(k/32)]`` float32, one scale
            per 32x32 block (``per_block_cast_to_fp8(w, gran_k=32)``).
        out: ``[m, n]`` bfloat16, row-major, 16-byte-aligned rows, written in place; must not overlap any input.

    Requires ``n % 8 == 0``, ``k % 16 == 0`` (TMA's 16-byte rows; a partial last 32-group reads as zero-padded);
    every tensor on one device; ``m == 0`` is a no-op. The products of each 32-wide K group are promoted into the
    fp32 accumulator with ``sA[r, j] · sB[c / 32, j]`` in K order (the kernel: policy_block32.cuh; the CPU
    reference: the same order with exact group partials, ``_core.reference_math.gemm_nt_promoted``); within 1e-3
    ``calc_diff`` of float64. Batch-invariant as every GEMM here (docs/batch-invariance.md). CUDA: sm_90 only.

    Raises:
        TypeError / ValueError: as :func:`gemm_fp8_fp8_bf16_nt`, with the 1x32 / 32x32 scale shapes.
    """
    _BLOCK32(lhs, rhs, out)


FAMILIES["dense"].public, FAMILIES["dense_fp8out"].public = gemm_fp8_fp8_bf16_nt, gemm_fp8_fp8_fp8_nt
FAMILIES["dense_block32"].public = gemm_fp8_fp8_bf16_nt_block32
