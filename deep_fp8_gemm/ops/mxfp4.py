"""MXFP4 experts (issues 42, 43): the GEMM names on the register-A kernel (kernels/mxfp4_gemm.py), masked and
contiguous, bf16 or FP8 / SwiGLU·FP8 out, and the MoE expert pipelines on them. The stored form, its preparation, the
exact references and the bit models are :mod:`deep_fp8_gemm.ops.mxfp4_format` (re-exported here)."""

from __future__ import annotations

import torch

from .._core.checks import check_expected_m, check_no_overlap
from ..constants import GRAN_K
from ..env import simulate
from ..runtime import target
from ..runtime.target import layout_values_checked
from .mxfp4_plans import masked_entry
from .mxfp4_format import (  # noqa: F401 (re-exported: the format's public names)
    CONVERT_OPS_PER_U32,
    E2M1_VALUES,
    EXP_BIAS,
    MAX_FOLD_SPAN,
    META_BYTES,
    META_WORD_BYTES,
    MIN_EXP,
    MX_GRAN_K,
    NUM_SHIFTS,
    PreparedMxfp4,
    SHIFT_MAX,
    SHIFT_MIN,
    SIGN_SELECTORS,
    SUBBLOCKS,
    TILE_BYTES,
    WAVE_ROWS,
    check_mxfp4_weights,
    contiguous_row_groups,
    conversion_exact_shifts,
    convert_rows,
    convert_u32,
    decode_e2m1,
    dequantize_prepared,
    fragment_a_k,
    fragment_a_registers,
    fragment_a_row,
    fragment_a_words,
    interleave_swiglu_mxfp4,
    lookup_table,
    masked_gemm_reference,
    prepare_mxfp4_weights,
    prmt,
    unpack_nibbles,
)

__all__ = [
    "CONVERT_OPS_PER_U32",
    "E2M1_VALUES",
    "EXP_BIAS",
    "MAX_FOLD_SPAN",
    "META_BYTES",
    "META_WORD_BYTES",
    "MIN_EXP",
    "MX_GRAN_K",
    "NUM_SHIFTS",
    "PreparedMxfp4",
    "SHIFT_MAX",
    "SHIFT_MIN",
    "SIGN_SELECTORS",
    "SUBBLOCKS",
    "TILE_BYTES",
    "WAVE_ROWS",
    "check_mxfp4_experts",
    "check_mxfp4_weights",
    "contiguous_row_groups",
    "conversion_exact_shifts",
    "convert_rows",
    "convert_u32",
    "decode_e2m1",
    "dequantize_prepared",
    "experts_contiguous_mxfp4",
    "experts_masked_mxfp4",
    "fragment_a_k",
    "fragment_a_registers",
    "fragment_a_row",
    "fragment_a_words",
    "interleave_swiglu_mxfp4",
    "lookup_table",
    "m_grouped_gemm_fp8_fp4_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp4_bf16_nt_masked",
    "m_grouped_gemm_fp8_fp4_fp8_nt_contiguous",
    "m_grouped_gemm_fp8_fp4_fp8_nt_masked",
    "masked_gemm_reference",
    "prepare_mxfp4_weights",
    "prmt",
    "unpack_nibbles",
]


# ---------------------------------------------------------------------------------------------- the op (CPU path)
def m_grouped_gemm_fp8_fp4_bf16_nt_masked(a: tuple[torch.Tensor, torch.Tensor],
                                           b: tuple[torch.Tensor, torch.Tensor] | PreparedMxfp4,
                                           d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    """``d[g, :masked_m[g]] = (a[g] * sa[g]) . W_g^T`` in bf16 for MXFP4 experts.

    ``a = (e4m3 [G, m_max, K], sa fp32 [G, m_max, K/128])`` (1x128 per-token scales, row-major); ``b`` a
    checkpoint's ``(int8 [G, N, K/2], fp32 UE8M0 [G, N, K/32])`` (prepared on every call) or a
    :class:`PreparedMxfp4`; ``d`` bf16 ``[G, m_max, N]`` written in place (rows past ``masked_m[g]`` untouched);
    ``masked_m`` int32 ``[G]``; ``expected_m`` a positive int hint. CPU tensors run the float64 reference of the
    path the prepared weights record; on an sm_90 GPU, or CPU tensors under ``DFG_SIMULATE=1``, the MXFP4 kernel
    (include/deep_fp8_gemm/kernels/mxfp4_gemm.cuh: swap-AB, the weights converted to e4m3 in registers), which needs
    N a multiple of 64 and ``d`` contiguous. Eager calls with a :class:`PreparedMxfp4` go through a per-call plan of
    their tensor signature (``ops.mxfp4_plans``): same checks, same errors, same launch."""
    if type(b) is PreparedMxfp4:
        _masked_entry(a, b, d, masked_m, expected_m)
        return
    _masked(a, b, d, masked_m, expected_m)


def check_outputs_apart(outs: tuple[tuple[torch.Tensor, str], ...], x: torch.Tensor, sa: torch.Tensor,
                        p: PreparedMxfp4, layout: torch.Tensor, layout_name: str) -> None:
    """Every output's bytes overlap none of the inputs the kernel reads while it writes them (``a``, ``b``'s stored
    form, the grouped layout): ``ValueError`` naming both, on every backend (the CPU path would compute before it
    writes; the kernel could not), as the FP8 GEMMs' ``out``. Tensors on another device than the output's are
    apart by definition (their addresses are another space)."""
    named = ((x, "a[0]"), (sa, "a[1]"), (layout, layout_name), (p.tiles, "b (tiles)"), (p.meta, "b (meta)"),
             (p.wave_per32, "b (wave_per32)"))
    for out, name in outs:
        check_no_overlap(out, tuple((t, n) for t, n in named if t.device == out.device), name)


def _masked_checks(a, p: PreparedMxfp4, d, masked_m, expected_m) -> tuple[torch.Tensor, torch.Tensor]:
    """Every check of the masked bf16 GEMM on prepared weights ``p``, in its order: ``(x, sa)``."""
    g, n, k = p.shape
    if not isinstance(a, (tuple, list)) or len(a) != 2 or not all(isinstance(t, torch.Tensor) for t in a):
        raise TypeError(f"a must be a pair of tensors (e4m3 [G, m_max, K], fp32 [G, m_max, K/128]), got {a!r:.80}")
    x, sa = a
    m_max = x.shape[1] if x.dim() == 3 else 0
    _check_masked_args(x, sa, masked_m, expected_m, g, k)
    if not isinstance(d, torch.Tensor) or d.dtype != torch.bfloat16 or tuple(d.shape) != (g, m_max, n):
        raise ValueError(f"d must be bfloat16 [G, m_max, N] = {(g, m_max, n)}, got "
                         f"{getattr(d, 'dtype', type(d).__name__)} {tuple(getattr(d, 'shape', ()))}")
    check_outputs_apart(((d, "d"),), x, sa, p, masked_m, "masked_m")
    return x, sa


def _masked(a, b, d, masked_m, expected_m) -> None:
    """The op without a plan (a checkpoint pair is prepared here, on every call)."""
    p = b if isinstance(b, PreparedMxfp4) else prepare_mxfp4_weights(*b)
    x, sa = _masked_checks(a, p, d, masked_m, expected_m)
    g, m_max = p.shape[0], x.shape[1]
    if target.gpu_index(x.device) is not None or simulate():  # runtime.target: the one device seam
        _run_kernel(x, sa, p, d, masked_m, expected_m)
        return
    ref = masked_gemm_reference(x, sa, p, masked_m).to(torch.bfloat16)
    rows = torch.arange(m_max).view(1, m_max, 1) < masked_m.view(g, 1, 1)
    d.copy_(torch.where(rows, ref, d))


def _run_kernel(x: torch.Tensor, sa: torch.Tensor, p: PreparedMxfp4, d: torch.Tensor, masked_m: torch.Tensor,
                expected_m: int) -> None:
    """The MXFP4 kernel on checked tensors (CUDA on an sm_90 GPU, the simulator for CPU tensors)."""
    from ..kernels import mxfp4_gemm
    from ..runtime.target import backend_of

    g, n, k = p.shape
    if not d.is_contiguous() or not x.is_contiguous():
        raise ValueError(f"the MXFP4 kernel needs contiguous a[0] and d, got a[0] contiguous {x.is_contiguous()}, "
                         f"d contiguous {d.is_contiguous()}")
    backend = backend_of(x.device, "gemm")
    config = mxfp4_gemm.pick_config(n, k, g, expected_m, mxfp4_gemm.num_ctas(backend))
    mxfp4_gemm.launch(config, x, sa, p, d, masked_m.to(x.device), backend)


# ---------------------------------------------------------------------------------------------- MoE experts
def check_mxfp4_experts(w13: object, w2: object) -> tuple[int, int, int]:
    """Two prepared expert weights of one SwiGLU layer: ``w13`` ``[E, 2I, H]`` and ``w2`` ``[E, H, I]`` (shapes of
    :class:`PreparedMxfp4`); returns ``(E, H, I)``."""
    for t, name in ((w13, "w13"), (w2, "w2")):
        if not isinstance(t, PreparedMxfp4):
            raise TypeError(f"{name} must be a PreparedMxfp4 (prepare_mxfp4_weights of a checkpoint's pair), got "
                            f"{type(t).__name__}")
    (e, two_i, h), (e2, h2, i) = w13.shape, w2.shape
    if e2 != e or h2 != h or two_i != 2 * i:
        raise ValueError(f"w13 must be [E, 2I, H] and w2 [E, H, I], got w13 {w13.shape} and w2 {w2.shape}")
    if w13.tiles.device != w2.tiles.device:
        raise ValueError(f"w13 and w2 must be on one device, got {w13.tiles.device} and {w2.tiles.device}")
    return e, h, i


def experts_masked_mxfp4(a: torch.Tensor, a_scales: torch.Tensor, counts: torch.Tensor, w13: PreparedMxfp4,
                         w2: PreparedMxfp4, expected_m: int) -> torch.Tensor:
    """The MoE experts on the masked layout with MXFP4 weights (the decode path of ``ops.moe.experts_masked``):
    ``a`` ``[E, m_max, H]`` e4m3 with ``a_scales`` ``[E, m_max, H/128]`` fp32 (1x128 per token), ``counts`` ``[E]``
    int32 -> ``[E, m_max, H]`` bf16 (rows ``>= counts[e]`` unspecified): the up-projection
    (:func:`m_grouped_gemm_fp8_fp4_bf16_nt_masked`, bf16 ``gate | up``), ``silu_mul_quant``, the down-projection."""
    from ..quant import silu_mul_quant

    num_experts, m_max, hidden = a.shape
    gate_up = torch.zeros((num_experts, m_max, w13.shape[1]), dtype=torch.bfloat16, device=a.device)
    m_grouped_gemm_fp8_fp4_bf16_nt_masked((a, a_scales), w13, gate_up, counts, expected_m)
    h_fp8, h_scales = silu_mul_quant(gate_up)
    out = torch.zeros((num_experts, m_max, hidden), dtype=torch.bfloat16, device=a.device)
    m_grouped_gemm_fp8_fp4_bf16_nt_masked((h_fp8, h_scales.contiguous()), w2, out, counts, expected_m)
    return out


# ---------------------------------------------------------------------------------------------- contiguous layouts
def m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(a: tuple[torch.Tensor, torch.Tensor],
                                               b: tuple[torch.Tensor, torch.Tensor] | PreparedMxfp4,
                                               d: torch.Tensor, grouped_layout: torch.Tensor, *,
                                               use_psum_layout: bool = False, kernel: str | None = None) -> None:
    """``d[r] = (a[r] * sa[r]) . W_g(r)^T`` in bf16 for MXFP4 experts on the contiguous layouts (issue 43; vLLM's
    ``DeepGemmFP4Experts`` call).

    ``a = (e4m3 [M_sum, K], sa fp32 [M_sum, K/128])`` (any strides); ``b`` a checkpoint's ``(int8 [G, N, K/2], fp32
    UE8M0 [G, N, K/32])`` (prepared on every call) or a :class:`PreparedMxfp4`; ``d`` bf16 ``[M_sum, N]`` written in
    place; ``grouped_layout`` int32: ``m_indices [M_sum]`` (expert per row, -1 padding) or, with
    ``use_psum_layout=True``, the groups' ends ``[G]`` (group g owns rows ``[round_up(ends[g-1], alignment),
    ends[g])``). ``alignment`` = ``get_m_alignment_for_contiguous_layout()`` (64 or 128). Rows are computed as the
    FP8 contiguous kernels compute them (:func:`contiguous_row_groups`): padding rows sharing an alignment block with
    a group's rows take that group, padding-only blocks are left untouched. CPU tensors run the float64 reference of
    the recorded path (their layout values checked); an sm_90 GPU or ``DFG_SIMULATE=1`` an MXFP4 kernel: ``kernel``
    ``None`` picks by the cost model (:func:`deep_fp8_gemm.kernels.mxfp4_gemm.pick_contiguous_path`), ``"register_a"``
    the register-A kernel, ``"convert"`` the kernel with the shared-memory conversion stage (prefill tiles: the
    alignment's tokens x 128 weight rows). Both give a row the same bits (docs/mxfp4.md, "The bit contract")."""
    from ..utils import get_m_alignment_for_contiguous_layout

    if kernel not in (None, "register_a", "convert"):
        raise ValueError(f"kernel must be None, 'register_a' or 'convert', got {kernel!r}")
    p = b if isinstance(b, PreparedMxfp4) else prepare_mxfp4_weights(*b)
    g, n, k = p.shape
    x, sa, m_sum = _check_contiguous_args(a, g, k, grouped_layout, use_psum_layout)
    if not isinstance(d, torch.Tensor) or d.dtype != torch.bfloat16 or tuple(d.shape) != (m_sum, n):
        raise ValueError(f"d must be bfloat16 [M_sum, N] = {(m_sum, n)}, got {getattr(d, 'dtype', type(d).__name__)} "
                         f"{tuple(getattr(d, 'shape', ()))}")
    devices = {t.device for t in (x, sa, d, grouped_layout, p.tiles)}
    if len(devices) != 1:
        raise ValueError(f"a, b, d and grouped_layout must be on one device, got {sorted(map(str, devices))}")
    check_outputs_apart(((d, "d"),), x, sa, p, grouped_layout, "grouped_layout")
    alignment = get_m_alignment_for_contiguous_layout()
    if m_sum == 0:
        return
    if target.gpu_index(x.device) is not None or simulate():  # runtime.target: the one device seam
        from ..kernels import mxfp4_gemm
        from ..runtime.target import backend_of

        if not d.is_contiguous() or not x.is_contiguous():
            raise ValueError(f"the MXFP4 kernel needs contiguous a[0] and d, got a[0] contiguous "
                             f"{x.is_contiguous()}, d contiguous {d.is_contiguous()}")
        backend = backend_of(x.device, "gemm")
        layout, sms = "psum" if use_psum_layout else "contiguous", mxfp4_gemm.num_ctas(backend)
        if kernel == "convert":
            config = mxfp4_gemm.pick_convert_config(n, k, g, layout, alignment)
        elif kernel == "register_a":
            config = mxfp4_gemm.pick_config(n, k, g, min(32, max(1, m_sum // max(g, 1))), sms, layout, alignment)
        else:
            config = mxfp4_gemm.pick_contiguous_path(n, k, g, m_sum, sms, layout, alignment)
        mxfp4_gemm.launch(config, x, sa, p, d, grouped_layout, backend)
        return
    rows = contiguous_row_groups(grouped_layout, m_sum, g, use_psum_layout, alignment)
    for e in rows.unique().tolist():
        if e < 0:
            continue
        r = (rows == e).nonzero().view(-1)
        one = PreparedMxfp4(p.tiles[e:e + 1], p.meta[e:e + 1], p.wave_per32[e:e + 1])
        ref = masked_gemm_reference(x[r].unsqueeze(0), sa[r].unsqueeze(0), one,
                                    torch.tensor([len(r)], dtype=torch.int32))
        d[r] = ref[0].to(torch.bfloat16)


def experts_contiguous_mxfp4(a: torch.Tensor, a_scales: torch.Tensor, m_indices: torch.Tensor, w13: PreparedMxfp4,
                             w2: PreparedMxfp4) -> torch.Tensor:
    """The MoE experts on the contiguous layout with MXFP4 weights (the prefill path): ``a`` ``[m_sum, H]`` e4m3 with
    ``a_scales`` ``[m_sum, H/128]`` fp32, ``m_indices`` ``[m_sum]`` int32 -> ``[m_sum + 1, H]`` bf16 whose last row is
    zeros (``ops.moe.combine``'s convention); the up-projection, ``silu_mul_quant``, the down-projection."""
    from ..quant import silu_mul_quant

    m_sum, hidden = a.shape
    gate_up = torch.zeros((m_sum, w13.shape[1]), dtype=torch.bfloat16, device=a.device)
    m_grouped_gemm_fp8_fp4_bf16_nt_contiguous((a, a_scales), w13, gate_up, m_indices)
    h_fp8, h_scales = silu_mul_quant(gate_up)
    down = torch.zeros((m_sum + 1, hidden), dtype=torch.bfloat16, device=a.device)
    m_grouped_gemm_fp8_fp4_bf16_nt_contiguous((h_fp8, h_scales), w2, down[:m_sum], m_indices)
    return down


# ---------------------------------------------------------------------------------------------- FP8 outputs
def _fp8_output(output: str, x: torch.Tensor, sa: torch.Tensor, p: PreparedMxfp4, out: object,
                grouped_layout: torch.Tensor, layout: str, expected_m: int, use_ue8m0: bool,
                kernel: str | None = "register_a") -> None:
    """The FP8 outputs (``output`` "fp8" or "swiglu_fp8") of the masked / contiguous MXFP4 GEMM on checked operands:
    ``out = (d e4m3 [.., rows, N_out], sd fp32 [.., rows, N_out/128] M-major TMA-aligned)``. ``kernel``: "register_a"
    at ``expected_m`` tokens, "convert" (contiguous layouts, fp8), or None (contiguous: the cost model's pick)."""
    from ..kernels import mxfp4_gemm
    from .outputs import FP8_OUT, OUT_NAMES, SWIGLU_FP8, check_out, check_out_layout

    mxfp4_gemm.kind_of(layout, output)  # a row of the kinds table, on every backend
    policy = SWIGLU_FP8 if output == "swiglu_fp8" else FP8_OUT
    g, n, k = p.shape
    masked = layout == "masked"
    lead = (g,) if masked else ()
    rows = x.shape[-2]
    check_out(out, lead, rows, policy.n_out(n), x.device, "m_max" if masked else "m_sum")
    d, sd = out
    check_no_overlap(d, ((sd, OUT_NAMES[1]),), OUT_NAMES[0])
    check_outputs_apart(((d, OUT_NAMES[0]), (sd, OUT_NAMES[1])), x, sa, p, grouped_layout,
                        "masked_m" if masked else "grouped_layout")
    if not isinstance(use_ue8m0, bool):
        raise TypeError(f"use_ue8m0 must be a bool, got {type(use_ue8m0).__name__}")
    if target.gpu_index(x.device) is not None or simulate():  # runtime.target: the one device seam
        from ..runtime.target import backend_of
        from ..utils import get_m_alignment_for_contiguous_layout

        check_out_layout(d, sd)
        backend = backend_of(x.device, "gemm")
        alignment = 128 if masked else get_m_alignment_for_contiguous_layout()
        sms = mxfp4_gemm.num_ctas(backend)
        if kernel == "convert":
            config = mxfp4_gemm.pick_convert_config(n, k, g, layout, alignment, output, use_ue8m0)
        elif kernel is None:  # the contiguous layouts: the cost model's pick
            config = mxfp4_gemm.pick_contiguous_path(n, k, g, rows, sms, layout, alignment, output, use_ue8m0)
        else:
            config = mxfp4_gemm.pick_config(n, k, g, expected_m, sms, layout, alignment, output, use_ue8m0)
        mxfp4_gemm.launch(config, x, sa, p, d, grouped_layout, backend, sd)
        return
    if masked:
        acc = masked_gemm_reference(x, sa, p, grouped_layout).float()
        for e in range(g):
            c = int(grouped_layout[e])
            if c:
                policy.store((d[e], sd[e]), slice(0, c), acc[e, :c], (use_ue8m0,))
        return
    from ..utils import get_m_alignment_for_contiguous_layout
    row_groups = contiguous_row_groups(grouped_layout, rows, g, layout == "psum", get_m_alignment_for_contiguous_layout())
    for e in row_groups.unique().tolist():
        if e < 0:
            continue
        r = (row_groups == e).nonzero().view(-1)
        one = PreparedMxfp4(p.tiles[e:e + 1], p.meta[e:e + 1], p.wave_per32[e:e + 1])
        acc = masked_gemm_reference(x[r].unsqueeze(0), sa[r].unsqueeze(0), one,
                                    torch.tensor([len(r)], dtype=torch.int32))[0].float()
        policy.store((d, sd), r, acc, (use_ue8m0,))


def m_grouped_gemm_fp8_fp4_fp8_nt_masked(a: tuple[torch.Tensor, torch.Tensor], b: PreparedMxfp4,
                                          out: tuple[torch.Tensor, torch.Tensor], masked_m: torch.Tensor,
                                          expected_m: int, *, use_ue8m0: bool = False, swiglu: bool = False) -> None:
    """:func:`m_grouped_gemm_fp8_fp4_bf16_nt_masked` with an FP8 output: ``out = (d e4m3 [G, m_max, N_out], sd fp32
    [G, m_max, N_out/128] M-major TMA-aligned)``, ``d = e4m3(x * fl(1 / sd))`` per row and 128 columns
    (``per_token_cast_to_fp8_torch(values, use_ue8m0, reciprocal=True)``, the FP8-output kinds' rule). With
    ``swiglu=True``, ``b`` is :func:`interleave_swiglu_mxfp4` of ``w13`` and the values are ``SiLU(gate) * up``
    (``N_out = I``: the MoE up-projection). The kernel needs whole 128-column groups per tile (BLOCK_N 128; SwiGLU
    256 rows, so at most 16 tokens per tile: decode)."""
    if not isinstance(b, PreparedMxfp4):
        raise TypeError(f"b must be a PreparedMxfp4 (prepare_mxfp4_weights; SwiGLU: interleave_swiglu_mxfp4), got "
                        f"{type(b).__name__}")
    x, sa = a
    g, n, k = b.shape
    _check_masked_args(x, sa, masked_m, expected_m, g, k)
    _fp8_output("swiglu_fp8" if swiglu else "fp8", x, sa, b, out, masked_m.to(x.device), "masked", expected_m,
                use_ue8m0)


def m_grouped_gemm_fp8_fp4_fp8_nt_contiguous(a: tuple[torch.Tensor, torch.Tensor], b: PreparedMxfp4,
                                              out: tuple[torch.Tensor, torch.Tensor], grouped_layout: torch.Tensor,
                                              *, use_psum_layout: bool = False, use_ue8m0: bool = False,
                                              swiglu: bool = False, kernel: str | None = None) -> None:
    """:func:`m_grouped_gemm_fp8_fp4_bf16_nt_contiguous` with the FP8 output of
    :func:`m_grouped_gemm_fp8_fp4_fp8_nt_masked` (``out`` rows ``M_sum``; the same rows computed). ``kernel`` as
    there: ``None`` the cost model's pick, ``"register_a"`` (at most 32 tokens per tile: BLOCK_N 128 / SwiGLU 256),
    ``"convert"`` the shared-memory conversion kernel (FP8 only: SwiGLU is register-A's)."""
    if kernel not in (None, "register_a", "convert") or (kernel == "convert" and swiglu):
        raise ValueError(f"kernel must be None, 'register_a' or 'convert' ('convert' without swiglu), got "
                         f"{kernel!r} with {swiglu=}")
    if swiglu and use_psum_layout:
        raise ValueError("swiglu=True takes the m_indices layout (use_psum_layout=False): the SwiGLU kinds are "
                         "contiguous and masked (mxfp4_contiguous_swiglu, mxfp4_masked_swiglu), as the FP8 ones")

    if not isinstance(b, PreparedMxfp4):
        raise TypeError(f"b must be a PreparedMxfp4 (prepare_mxfp4_weights; SwiGLU: interleave_swiglu_mxfp4), got "
                        f"{type(b).__name__}")
    g, n, k = b.shape
    x, sa, m_sum = _check_contiguous_args(a, g, k, grouped_layout, use_psum_layout)
    if m_sum == 0:
        return
    _fp8_output("swiglu_fp8" if swiglu else "fp8", x, sa, b, out, grouped_layout,
                "psum" if use_psum_layout else "contiguous", min(32, max(1, m_sum // max(g, 1))), use_ue8m0, kernel)


def _check_contiguous_args(a, g: int, k: int, grouped_layout, use_psum_layout) -> tuple:
    """The contiguous layouts' operand checks (shared by the bf16 and FP8 outputs): ``a = (e4m3 [M_sum, K], fp32
    [M_sum, K/128])``, ``grouped_layout`` int32 ``m_indices [M_sum]`` or psum ends ``[G]``, its values where the
    layouts are checked (``layout_values_checked``: CPU tensors, or ``DFG_CHECK_LAYOUTS=1``). Returns
    ``(x, sa, m_sum)``."""
    from .contiguous import check_contiguous_values
    from .psum import check_psum_layout_values

    if not isinstance(a, (tuple, list)) or len(a) != 2 or not all(isinstance(t, torch.Tensor) for t in a):
        raise TypeError(f"a must be a pair of tensors (e4m3 [M_sum, K], fp32 [M_sum, K/128]), got {a!r:.80}")
    x, sa = a
    if x.dtype != torch.float8_e4m3fn or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"a[0] must be float8_e4m3fn [M_sum, K] with K={k}, got {x.dtype} {tuple(x.shape)}")
    m_sum = x.shape[0]
    if sa.dtype != torch.float32 or tuple(sa.shape) != (m_sum, k // GRAN_K):
        raise ValueError(f"a[1] must be float32 [M_sum, K/128] = {(m_sum, k // GRAN_K)}, got {sa.dtype} "
                         f"{tuple(sa.shape)}")
    if not isinstance(use_psum_layout, bool):
        raise TypeError(f"use_psum_layout must be a bool, got {type(use_psum_layout).__name__}")
    want = (g,) if use_psum_layout else (m_sum,)
    if not isinstance(grouped_layout, torch.Tensor) or grouped_layout.dtype != torch.int32 or (
            tuple(grouped_layout.shape) != want):
        raise ValueError(f"grouped_layout must be int32 {'group ends [G]' if use_psum_layout else 'm_indices [M_sum]'}"
                         f" = {list(want)}, got {getattr(grouped_layout, 'dtype', type(grouped_layout).__name__)} "
                         f"{tuple(getattr(grouped_layout, 'shape', ()))}")
    if layout_values_checked(grouped_layout.device):
        if use_psum_layout:
            check_psum_layout_values(grouped_layout, m_sum)
        else:
            check_contiguous_values(grouped_layout, m_sum, g)
    return x, sa, m_sum


def _check_masked_args(x, sa, masked_m, expected_m, g: int, k: int) -> None:
    """The masked layout's operand checks (shared by the bf16 and FP8 outputs)."""
    if x.dtype != torch.float8_e4m3fn or x.dim() != 3 or x.shape[0] != g or x.shape[2] != k:
        raise ValueError(f"a[0] must be float8_e4m3fn [G, m_max, K] with G={g}, K={k}, got {x.dtype} "
                         f"{tuple(x.shape)}")
    m_max = x.shape[1]
    if sa.dtype != torch.float32 or tuple(sa.shape) != (g, m_max, k // GRAN_K):
        raise ValueError(f"a[1] must be float32 [G, m_max, K/128] = {(g, m_max, k // GRAN_K)}, got {sa.dtype} "
                         f"{tuple(sa.shape)}")
    if not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (g,):
        raise ValueError(f"masked_m must be int32 [G] = [{g}], got {getattr(masked_m, 'dtype', type(masked_m))} "
                         f"{tuple(getattr(masked_m, 'shape', ()))}")
    check_expected_m(expected_m)
    if not layout_values_checked(masked_m.device):  # CUDA: never read on the host (CUDA-graph capture)
        return
    bad = (masked_m < 0) | (masked_m > m_max)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"masked_m[{i}]={int(masked_m[i])} must be in [0, m_max={m_max}]")


_masked_entry = masked_entry(_masked_checks, _masked)
