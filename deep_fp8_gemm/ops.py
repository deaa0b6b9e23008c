"""The public FP8 GEMM ops: validate, then dispatch by device.

Each op is a ``torch.library`` custom op (``torch.ops.deep_fp8_gemm.<name>``, schema below) that mutates
``out``; the public functions unpack the ``(tensor, scales)`` pairs and call it whenever torch is tracing or
a dispatch mode is active, so compiled model code sees one node per GEMM and
``torch.compile(fullgraph=True)`` traces through them (the fake kernels check shapes, dtypes and strides at
trace time). Plain eager calls skip the dispatcher's ~5 µs and go through :mod:`.prepared`: the same checks
and dispatch, run once per tensor signature (a plan), so a repeated call only checks its data pointers and
launches.

Dispatch (inside the op, after :mod:`.validation`):

* ``m == 0`` (or ``n == 0``): nothing to do, ``out`` is untouched.
* CPU tensors: the exact reference of :mod:`.reference` — or, with ``DFG_SIMULATE=1``, the real kernel
  source run by the CPU simulator (``kernels.gemm.launch(..., backend="sim")``).
* CUDA tensors: ``RuntimeError`` unless the device is sm_90; otherwise the JIT kernel
  (``kernels.gemm.launch(..., backend="cuda")``).

Before dispatch sA is converted to the M-major TMA-aligned layout with
:func:`~deep_fp8_gemm.utils.get_col_major_tma_aligned_tensor` (a copy unless it already is; produce it
with :func:`~deep_fp8_gemm.per_token_cast_to_fp8` to avoid that), and sB, m_indices and masked_m are made
contiguous (no copy when they already are).
"""

from __future__ import annotations

import torch

from . import env, prepared, reference
from .runtime import target
from .utils import empty_m_major, get_col_major_tma_aligned_tensor
from .validation import check_contiguous, check_dense, check_expected_m, check_masked, unpack_pair

_NAMESPACE = "deep_fp8_gemm"


def _normalise_sa(sa: torch.Tensor) -> torch.Tensor:
    """sA in the M-major TMA-aligned layout, at a 16-byte-aligned address."""
    sa = get_col_major_tma_aligned_tensor(sa)
    if sa.numel() > 0 and sa.data_ptr() % 16 != 0:
        aligned = empty_m_major(tuple(sa.shape), sa.device)
        aligned.copy_(sa)
        sa = aligned
    return sa


def _launch(kind: str, a, sa, b, sb, out, grouped_layout, expected_m, backend: str) -> None:
    from .kernels.gemm import launch

    launch(kind, a, sa, b, sb, out, grouped_layout=grouped_layout, expected_m=expected_m, backend=backend)


def _require_sm90(device: torch.device, index: int) -> None:
    capability = target.capability(index)
    if capability != (9, 0):
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"deep_fp8_gemm's CUDA kernels need an sm_90 (Hopper) device; {device} ({name}) is "
            f"sm_{capability[0]}{capability[1]}. Use CPU tensors for the reference implementation."
        )


def backend_of(device: torch.device) -> str | None:
    """Where an op on ``device``'s tensors runs: ``"cuda"`` (an sm_90 GPU; any other GPU raises), ``"sim"``
    (CPU tensors under ``DFG_SIMULATE``: the real kernel in the CPU simulator) or None (the CPU reference)."""
    index = target.gpu_index(device)
    if index is not None:
        _require_sm90(device, index)
        return "cuda"
    return "sim" if env.simulate() else None


def _dispatch(kind: str, a, sa, b, sb, out, grouped_layout=None, expected_m=None) -> None:
    """Run a validated, non-empty GEMM of ``kind`` ("dense" | "contiguous" | "masked" | "psum") on a's device."""
    backend = backend_of(a.device)
    sa = _normalise_sa(sa)
    sb = sb.contiguous()
    if grouped_layout is not None:
        grouped_layout = grouped_layout.contiguous()
    if backend is not None:
        _launch(kind, a, sa, b, sb, out, grouped_layout, expected_m, backend)
    elif kind == "dense":
        reference._dense(a, sa, b, sb, out)
    elif kind == "contiguous":
        reference._contiguous(a, sa, b, sb, out, grouped_layout)
    elif kind == "psum":
        reference._contiguous_psum(a, sa, b, sb, out, grouped_layout)
    else:
        reference._masked(a, sa, b, sb, out, grouped_layout)


# --- kernels of the custom ops (registered for CPU and CUDA) and their fake (meta) versions -----------


def _dense_impl(a, sa, b, sb, out) -> None:
    m, n, _ = check_dense(a, sa, b, sb, out)
    if m and n:
        _dispatch("dense", a, sa, b, sb, out)


def _dense_fake(a, sa, b, sb, out) -> None:
    check_dense(a, sa, b, sb, out, pointers=False)


def _contiguous_impl(a, sa, b, sb, out, m_indices) -> None:
    m_sum, n, _, _ = check_contiguous(a, sa, b, sb, out, m_indices)
    if m_sum and n:
        _dispatch("contiguous", a, sa, b, sb, out, grouped_layout=m_indices)


def _contiguous_fake(a, sa, b, sb, out, m_indices) -> None:
    check_contiguous(a, sa, b, sb, out, m_indices, pointers=False)


def _masked_impl(a, sa, b, sb, out, masked_m, expected_m) -> None:
    _, m_max, n, _ = check_masked(a, sa, b, sb, out, masked_m, expected_m)
    if m_max and n:
        _dispatch("masked", a, sa, b, sb, out, grouped_layout=masked_m, expected_m=expected_m)


def _masked_fake(a, sa, b, sb, out, masked_m, expected_m) -> None:
    check_masked(a, sa, b, sb, out, masked_m, expected_m, pointers=False)


_lib = torch.library.Library(_NAMESPACE, "FRAGMENT")
_OPS = {
    "gemm_fp8_fp8_bf16_nt": (
        "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out) -> ()",
        _dense_impl,
        _dense_fake,
    ),
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous": (
        "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, Tensor m_indices) -> ()",
        _contiguous_impl,
        _contiguous_fake,
    ),
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked": (
        "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, Tensor masked_m, int expected_m) -> ()",
        _masked_impl,
        _masked_fake,
    ),
}
for _name, (_schema, _impl, _fake) in _OPS.items():
    _lib.define(_name + _schema)
    for _key in ("CPU", "CUDA"):
        _lib.impl(_name, _impl, _key)
    torch.library.register_fake(f"{_NAMESPACE}::{_name}", _fake, lib=_lib)

_dense_op = torch.ops.deep_fp8_gemm.gemm_fp8_fp8_bf16_nt.default
_contiguous_op = torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous.default
_masked_op = torch.ops.deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked.default


_OPERAND_NAMES = ("lhs[0] (A)", "lhs[1] (sA)", "rhs[0] (B)", "rhs[1] (sB)", "out")


def _eager(*tensors: torch.Tensor) -> bool:
    """True when the call can skip the torch.library dispatcher (~5 µs of the per-call host time that a
    ~10 µs decode GEMM cannot afford): not tracing, no dispatch mode active (fake / meta / functional
    modes), plain tensors only. Otherwise the custom op runs, so compiled and exported code still sees one
    node per GEMM."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    return all(type(t) is torch.Tensor for t in tensors)


def _operands(lhs, rhs, out, *extra: tuple[object, str]) -> tuple[torch.Tensor, ...]:
    """Unpack ``lhs`` / ``rhs`` into ``(A, sA, B, sB)`` and require tensors everywhere.

    The dispatcher would reject a non-tensor with a RuntimeError; users get a TypeError naming it.
    """
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    for t, name in (*zip((a, sa, b, sb, out), _OPERAND_NAMES), *extra):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return a, sa, b, sb


# --- public API ----------------------------------------------------------------------------------------


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
    if prepared.dense(a, sa, b, sb, out):  # eager: checks cached per tensor signature (deep_fp8_gemm.prepared)
        return
    a, sa, b, sb = _operands(lhs, rhs, out)
    (_dense_impl if _eager(a, sa, b, sb, out) else _dense_op)(a, sa, b, sb, out)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
    lhs: tuple[torch.Tensor, torch.Tensor],
    rhs: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    m_indices: torch.Tensor,
) -> None:
    """Grouped GEMM over experts whose rows are concatenated (MoE prefill / training).

    ``out[r] = bf16(dequant(A[r]) · dequant(B[m_indices[r]])ᵀ)`` for every row with ``m_indices[r] >= 0``.

    Args:
        lhs: ``(A, sA)``: A ``[m_sum, k]`` float8_e4m3fn, K-major; sA ``[m_sum, ceil(k/128)]`` float32.
            Rows are grouped by expert, each expert's segment padded to
            ``get_m_alignment_for_contiguous_layout()`` (128) rows, so ``m_sum % 128 == 0``.
        rhs: ``(B, sB)``: B ``[G, n, k]`` float8_e4m3fn, K-major; sB ``[G, ceil(n/128), ceil(k/128)]`` float32.
        out: ``[m_sum, n]`` bfloat16, row-major, written in place.
        m_indices: ``[m_sum]`` int32 on the same device, expert of each row in ``[0, G)``, or -1 for a padding
            row whose output is unspecified. Never read on the host by the CUDA path: there an expert id
            ``>= G`` makes the kernel trap (the launch fails; the CUDA context is lost), and the CPU path raises
            ``ValueError``.

    Same alignment rules, errors and dispatch as :func:`gemm_fp8_fp8_bf16_nt`.
    """
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    if prepared.contiguous(a, sa, b, sb, out, m_indices):
        return
    a, sa, b, sb = _operands(lhs, rhs, out, (m_indices, "m_indices"))
    impl = _contiguous_impl if _eager(a, sa, b, sb, out, m_indices) else _contiguous_op
    impl(a, sa, b, sb, out, m_indices)


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
        masked_m: ``[G]`` int32 on the same device, valid rows per group in ``[0, m_max]``; never read on
            the host by the CUDA path (so a CUDA graph can replay the call with new counts).
        expected_m: positive Python int, a hint of the typical ``masked_m`` used only to choose the kernel
            configuration.

    Same alignment rules, errors and dispatch as :func:`gemm_fp8_fp8_bf16_nt`.
    """
    a, sa = lhs if type(lhs) is tuple and len(lhs) == 2 else unpack_pair(lhs, "lhs")
    b, sb = rhs if type(rhs) is tuple and len(rhs) == 2 else unpack_pair(rhs, "rhs")
    if prepared.masked(a, sa, b, sb, out, masked_m, expected_m):
        return
    a, sa, b, sb = _operands(lhs, rhs, out, (masked_m, "masked_m"))
    check_expected_m(expected_m)
    impl = _masked_impl if _eager(a, sa, b, sb, out, masked_m) else _masked_op
    impl(a, sa, b, sb, out, masked_m, expected_m)
