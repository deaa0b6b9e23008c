"""The reference design's 2.x GEMM and layout names (DeepGEMM 2.6, SM90 semantics): the API part of
:mod:`deep_fp8_gemm.compat`, the 2.x surface the ``deep_gemm`` drop-in re-exports (vLLM's ``vllm/utils/deep_gemm.py``,
SGLang's ``deep_gemm_wrapper``, torchao call it).

Every entry point validates the 2.x-only arguments here and then calls the op of its family in
:mod:`deep_fp8_gemm.ops`, so the numerics, dispatch (CPU reference / ``DFG_SIMULATE=1`` simulator /
sm_90 kernel) and tensor checks are exactly those of the 1.x names, which stay.

Argument semantics, as the reference applies them on SM90 (``csrc/apis/gemm.hpp``, ``csrc/apis/layout.hpp``):

* operands are ``(data, scales)`` pairs, both K-major ("NT"); scales are float32 (sA one per row per 128 K,
  sB one per 128x128 block; per 32 / 32x32 with recipe (1, 32, 32)); power-of-two (UE8M0) fp32 scales are
  ordinary scales here.
* ``recipe`` ``(gran_m_of_A, gran_n_of_B, gran_k)``, or the pair ``recipe_a=(gran_m, gran_k)``,
  ``recipe_b=(gran_n, gran_k)``; ``None`` = ``(1, 128, 128)``, the 1D2D kernel this library implements.
  ``(1, 1, 128)`` (per-row B scales: the 1D1D weight-gradient kernel, fp32 ``D = C + A·Bᵀ``) is accepted by
  :func:`fp8_gemm_nt` and is the only recipe of :func:`k_grouped_fp8_gemm_nt_contiguous` (``NotImplementedError``
  for the M-grouped GEMMs, which have no 1D1D kernel);
  ``(1, 32, 32)`` (DeepSeek-V4.1's 1x32 / 32x32 recipe, as SGLang calls the ``sgl-deep-gemm`` fork) is accepted by
  :func:`fp8_gemm_nt` (the dense block32 kernel); the other ``gran_k == 32`` recipes (MXFP8) are SM100-only
  (``NotImplementedError``); any other recipe is a ``ValueError``.
* ``compiled_dims``: which of m / n / k the reference bakes into the binary. Validated (a string of distinct
  letters from ``"mnk"``) and otherwise a hint: this library always compiles N and K and keeps M a run-time
  value, the reference's default ``"nk"``.
* ``disable_ue8m0_cast``: the reference casts fp32 scales to packed UE8M0 only on SM100; on SM90 fp32 scales are
  used as given either way. Validated as a bool, no effect.
* ``c``: the reference's SM90 1D2D kernel has no C input (bf16 D only), so ``c is not None`` raises
  ``ValueError`` (decided here rather than computing D = C + A·Bᵀ in a second pass: the reference rejects it
  and a silent extra pass would differ from it in both rounding and cost). ``alpha`` (SM100) raises
  ``NotImplementedError`` unless None.
* SM100-only inputs raise ``NotImplementedError`` naming the option: FP4 operands (packed ``int8`` /
  ``uint8`` / ``float4_e2m1fn_x2`` data), packed UE8M0 ``int32`` scales, ``gran_k`` 32 but in (1, 32, 32).

The NN / TN / TT layouts (SM100-only in the reference) are deliberately *not* defined: consumers probe
``hasattr(deep_gemm, name)`` to choose a code path, and a name that always raises would steer them wrong.
:data:`LOADER_REQUIRED_ENTRIES` lists the few names a loader insists on (Hugging Face transformers' list); the
``deep_gemm`` facade (:mod:`deep_fp8_gemm.compat.deep_gemm`) serves them from the forwarded provider when it has them
and as :func:`unsupported_entry` raisers otherwise.

Runtime knobs are :mod:`.knobs`, the reference's casts :mod:`.casts`.

The 1.x weight-gradient names :func:`wgrad_gemm_fp8_fp8_fp32_nt` and :func:`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt`
keep their 1.x argument layouts (``out`` accumulated, scales ``[mn, kb]`` or K-block-major ``[kb, mn]``).
"""

from __future__ import annotations

import torch

from .._core.checks import check_bool, check_expected_m, unpack_pair
from .._core.plans import cached_call
from .arguments import (RECIPE_1D1D, RECIPE_BLOCK32, check_bf16_output, check_compiled_dims, check_recipe,
                        check_sm100_operands, common_checks, int_tuple, is_1d1d_recipe, is_block32_recipe,
                        plain_arguments)
from ..ops.contiguous import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from ..ops.dense import gemm_fp8_fp8_bf16_nt, gemm_fp8_fp8_bf16_nt_block32
from ..ops.k_grouped import k_grouped_gemm_fp8_fp8_fp32_nt
from ..ops.masked import m_grouped_gemm_fp8_fp8_bf16_nt_masked
from ..ops.mxfp4 import m_grouped_gemm_fp8_fp4_bf16_nt_contiguous, m_grouped_gemm_fp8_fp4_bf16_nt_masked
from ..ops.psum import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum
from ..ops.wgrad_1d1d import ENTRY as _1D1D_ENTRY, gemm_fp8_fp8_fp32_nt_1d1d
from ..utils import get_col_major_tma_aligned_tensor

# The bf16-output families' known-signature calls (_core.plans.cached_call): the names below try them first when the
# arguments are the defaults whose checks depend only on the tensors' signature. A plan exists only for tensors that
# passed every check of the op: FP8 data with fp32 scales (so no SM100 dtype) and a bf16 d (so the 1D2D recipe).
# recipe=(1, 32, 32) (SGLang's DeepSeek-V4.1 call) tries the block32 kind's: its plans exist only for 1x32 / 32x32
# scale shapes and a bf16 d, which is what that recipe requires. recipe=(1, 1, 128) with a c tries the 1D1D plans
# (ops.wgrad_plans): they exist only for FP8 data, fp32 per-row scales and an fp32 d, which is what that recipe requires
# once c is given.
_DENSE_HIT, _CONTIGUOUS_HIT, _PSUM_HIT, _MASKED_HIT, _BLOCK32_HIT = (
    cached_call(k) for k in ("dense", "contiguous", "psum", "masked", "dense_block32"))
_1D1D_HIT = _1D1D_ENTRY.hit


def _no_hit(*args) -> bool:
    return False


# ---------------------------------------------------------------------------------------------- GEMMs
def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    alpha: float | None = None,
) -> None:
    """``d = bf16(dequant(A) · dequant(B)ᵀ)`` (recipe (1, 128, 128), the default, or (1, 32, 32)) or ``d = c +
    dequant(A) · dequant(B)ᵀ`` in fp32 (recipe (1, 1, 128)): the reference's ``fp8_gemm_nt`` with SM90 semantics.

    1D2D: ``a = (A [m, k] e4m3 K-major, sA [m, ceil(k/128)] fp32)``, ``b = (B [n, k] e4m3 K-major,
    sB [ceil(n/128), ceil(k/128)] fp32)``, ``d`` ``[m, n]`` bf16 written in place. ``c`` must be None
    (``ValueError``: the SM90 1D2D kernel has no C). Everything else is :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt`.
    1D1D (``recipe=(1, 1, 128)`` or ``recipe_a=(1, 128), recipe_b=(1, 128)``): sB ``[n, ceil(k/128)]`` per-row,
    ``d`` and ``c`` fp32 ``[m, n]``; ``c`` is required (``c=d`` accumulates in place into a main-grad buffer;
    another tensor is read and d only written). Everything else is
    :func:`deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d`.
    1x32 / 32x32 (``recipe=(1, 32, 32)`` or ``recipe_a=(1, 32), recipe_b=(32, 32)``: DeepSeek-V4.1's dense layers,
    as SGLang calls the ``sgl-deep-gemm`` fork): sA ``[m, ceil(k/32)]`` fp32 in any layout (M-major TMA-aligned as
    SGLang's quantiser writes it, or row-major, e.g. a UE8M0 checkpoint's power-of-two values: re-laid out on the
    host, one small copy), sB ``[ceil(n/32), ceil(k/32)]`` fp32, bf16 ``d``, no ``c``; the fork's N % 8 / K % 32
    rules are this library's N % 8 / K % 16. Everything else is :func:`deep_fp8_gemm.gemm_fp8_fp8_bf16_nt_block32`.
    The other 2.x arguments as in the module docstring.
    """
    if c is None and alpha is None and \
            plain_arguments(a, b, None, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast) and \
            (_DENSE_HIT if recipe is None else _BLOCK32_HIT if is_block32_recipe(recipe) else _no_hit)(
                a[0], a[1], b[0], b[1], d):
        return  # a known signature: every check below passed for it (the module's _DENSE_HIT note)
    if c is not None and alpha is None and is_1d1d_recipe(recipe) and \
            plain_arguments(a, b, None, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast) and \
            _1D1D_HIT(a[0], a[1], b[0], b[1], d, c):
        return  # likewise, for the 1D1D recipe (the module's _DENSE_HIT note)
    selected = common_checks(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, dense=True)
    if alpha is not None:
        raise NotImplementedError(f"alpha={alpha!r}: the output scale exists only on the reference's SM100 kernels")
    if selected == RECIPE_1D1D:
        if c is None:
            raise ValueError("c is required with recipe (1, 1, 128): the 1D1D kernel computes D = C + A·Bᵀ; pass "
                             "c=d to accumulate into d in place (zero d first for a plain product)")
        if isinstance(d, torch.Tensor) and d.dtype != torch.float32:
            raise TypeError(f"d must be torch.float32 with recipe (1, 1, 128) (fp32 accumulation), got "
                            f"d.dtype={d.dtype}")
        gemm_fp8_fp8_fp32_nt_1d1d(a, b, d, c)
        return
    named = "(1, 32, 32)" if selected == RECIPE_BLOCK32 else "(1, 128, 128)"
    if isinstance(d, torch.Tensor) and d.dtype == torch.float32:
        raise TypeError(f"d.dtype=torch.float32 needs recipe=(1, 1, 128) (the 1D1D kernel, per-row B scales, "
                        f"D = C + A·Bᵀ); recipe {named} writes a bfloat16 d")
    if c is not None:
        raise ValueError(f"c (D = C + A·Bᵀ) is not supported with recipe {named} and a bfloat16 d: the SM90 "
                         "kernel has no C input (as in the reference); add C yourself, e.g. d += c")
    (gemm_fp8_fp8_bf16_nt_block32 if selected == RECIPE_BLOCK32 else gemm_fp8_fp8_bf16_nt)(a, b, d)


def m_grouped_fp8_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    grouped_layout: torch.Tensor,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    expected_m_for_psum_layout: int | None = None,
) -> None:
    """Grouped GEMM over expert rows concatenated in ``a`` (``[m, k]``), B ``[G, n, k]``, d ``[m, n]`` bf16.

    ``use_psum_layout=False``: ``grouped_layout`` is ``m_indices`` ``[m]`` int32 (expert per row, -1 padding;
    :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`); ``expected_m_for_psum_layout`` must then
    be None (``ValueError``, as the reference).
    ``use_psum_layout=True``: ``grouped_layout`` is ``[G]`` int32 group ends (group g = rows
    ``[round_up(grouped_layout[g-1], 128), grouped_layout[g])``, the first from row 0; see
    :mod:`deep_fp8_gemm.ops.psum` for what is checked where), read on the device only; ``expected_m_for_psum_layout``
    (rows per group, optional) picks the kernel configuration.
    Positional order as the reference's: ``..., disable_ue8m0_cast, use_psum_layout, ensure_zero_padding,
    expected_m_for_psum_layout``. ``ensure_zero_padding`` (the reference passes it to its SM100 kernels only) is
    validated and has no effect, as on the reference's SM90 kernel: padding rows that share a BLOCK_M block with
    a group's rows are computed with that group (zeros where A's padding rows are zero), padding-only blocks are
    left untouched, on every backend.
    """
    if type(ensure_zero_padding) is bool and \
            plain_arguments(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast) and \
            ((_PSUM_HIT(a[0], a[1], b[0], b[1], d, grouped_layout, expected_m_for_psum_layout)
              if use_psum_layout else expected_m_for_psum_layout is None and
              _CONTIGUOUS_HIT(a[0], a[1], b[0], b[1], d, grouped_layout)) if type(use_psum_layout) is bool else False):
        return  # a known signature (the module's _DENSE_HIT note)
    common_checks(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)
    check_bool(use_psum_layout, "use_psum_layout")
    check_bool(ensure_zero_padding, "ensure_zero_padding")
    check_bf16_output(d)
    if use_psum_layout:
        if expected_m_for_psum_layout is not None:  # checked under its own name (the op calls it expected_m)
            check_expected_m(expected_m_for_psum_layout, "expected_m_for_psum_layout")
        m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum(a, b, d, grouped_layout, expected_m_for_psum_layout)
        return
    if expected_m_for_psum_layout is not None:
        raise ValueError(f"expected_m_for_psum_layout={expected_m_for_psum_layout!r} is only meaningful with "
                         "use_psum_layout=True (grouped_layout is per-row m_indices otherwise)")
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, b, d, grouped_layout)


def m_grouped_fp8_gemm_nt_masked(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
) -> None:
    """Grouped GEMM over a fixed-size buffer per group: A ``[G, m_max, k]``, B ``[G, n, k]``, d ``[G, m_max, n]``
    bf16, ``masked_m`` ``[G]`` int32 valid rows per group (device-side), ``expected_m`` a positive int hint.
    Everything else is :func:`deep_fp8_gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked`."""
    if plain_arguments(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast) and \
            _MASKED_HIT(a[0], a[1], b[0], b[1], d, masked_m, expected_m):
        return  # a known signature (the module's _DENSE_HIT note)
    common_checks(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)
    check_bf16_output(d)
    m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, b, d, masked_m, expected_m)


def k_grouped_fp8_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    ks_cpu: list[int],
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe: tuple[int, int, int] = (1, 1, 128),
    compiled_dims: str = "mn",
    use_psum_layout: bool = False,
) -> None:
    """The k-grouped weight-gradient GEMM (MoE experts' dW in one launch): for each group g,
    ``d[g] = c[g] + dequant(A_g) · dequant(B_g)ᵀ`` in fp32, the reference's SM90 convention.

    ``a = (flat e4m3 [m·sum(ks)], sA fp32 [m, sum(ks)/128])``: A_g ``[m, ks[g]]`` K-major stored back to back;
    ``b = (flat e4m3 [n·sum(ks)], sB fp32 [n, sum(ks)/128])`` likewise; ``d`` fp32 ``[G, m, n]``; ``ks`` the
    Python ints K_g (multiples of 128, 0 allowed: ``d[g] = c[g]``), ``ks_tensor`` the same values as int32 ``[G]``
    on d's device; ``c`` None, ``d`` (accumulate in place) or another fp32 ``[G, m, n]``. ``recipe`` must be
    ``(1, 1, 128)`` (1x128 scales on both operands); ``compiled_dims`` is validated, a hint only.
    ``use_psum_layout`` must be False (``NotImplementedError`` for True: the reference's SM90 NT form has no psum
    layout either; its SM100 TN form does). The reference's argument names: ``ks_cpu`` (the Python ints K_g) and
    ``grouped_layout`` (the same values as an int32 tensor). Everything else is
    :func:`deep_fp8_gemm.k_grouped_gemm_fp8_fp8_fp32_nt`. The K alignment is 128 whatever
    ``set_mk_alignment_for_contiguous_layout`` says (as the reference's SM90 NT form)."""
    ks, ks_tensor = ks_cpu, grouped_layout
    if check_bool(use_psum_layout, "use_psum_layout"):
        raise NotImplementedError("use_psum_layout=True: the k-grouped NT GEMM takes per-group K sizes (ks_cpu); "
                                  "the psum layout of the reference's k-grouped GEMM exists only in its SM100 TN form")
    check_sm100_operands(a, b)
    if recipe is None:
        recipe = (1, 1, 128)
    if check_recipe(recipe, allow_1d1d=True) != RECIPE_1D1D:
        raise ValueError(f"recipe={tuple(recipe)}: the k-grouped GEMM exists only with recipe (1, 1, 128) "
                         "(1x128 scales on A and B, fp32 D = C + A·Bᵀ)")
    check_compiled_dims(compiled_dims)
    if ks_tensor is None:
        raise TypeError("grouped_layout: ks_tensor must be an int32 [G] tensor on d's device holding the values of "
                        "ks_cpu, got None")
    k_grouped_gemm_fp8_fp8_fp32_nt(a, b, d, ks, ks_tensor, c)


#: vLLM resolves the masked GEMM under this name (``vllm/utils/deep_gemm.py``).
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
#: The reference's newest spellings of the same entry points (they also take FP4 on SM100).
fp8_fp4_gemm_nt = fp8_gemm_nt


def _mxfp4_b(b: object, recipe, recipe_a, recipe_b, compiled_dims: str, disable_ue8m0_cast: bool) -> bool:
    """Whether the ``fp8_fp4`` grouped names' ``b`` is MXFP4 (int8 / uint8 codes): then the recipes must be MXFP4's
    (``recipe_a=(1, 128)``, ``recipe_b=(1, 32)``, no ``recipe``; ``ValueError`` naming them otherwise) and the common
    knobs are checked here. False: FP8 ``b``, for the FP8 names (which check everything themselves)."""
    data = b[0] if isinstance(b, (tuple, list)) and len(b) == 2 else None
    if not (isinstance(data, torch.Tensor) and data.dtype in (torch.int8, torch.uint8)):
        return False
    if recipe is not None or recipe_a is None or recipe_b is None or (tuple(recipe_a), tuple(recipe_b)) != (
            (1, 128), (1, 32)):
        raise ValueError(f"MXFP4 b (b[0].dtype={data.dtype}) takes recipe_a=(1, 128), recipe_b=(1, 32) and no recipe, "
                         f"got recipe={recipe}, recipe_a={recipe_a}, recipe_b={recipe_b}")
    check_compiled_dims(compiled_dims)
    check_bool(disable_ue8m0_cast, "disable_ue8m0_cast")
    return True


def m_grouped_fp8_fp4_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    grouped_layout: torch.Tensor,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    expected_m_for_psum_layout: int | None = None,
) -> None:
    """:func:`m_grouped_fp8_gemm_nt_contiguous` for FP8 ``b``; for MXFP4 experts (``b = (int8 / uint8 [G, N, K/2]`` two
    e2m1 codes per byte low nibble first, ``fp32 UE8M0 [G, N, K/32])``, ``recipe_a=(1, 128)``, ``recipe_b=(1, 32)``,
    no ``recipe``: vLLM's ``DeepGemmFP4Experts`` call) :func:`deep_fp8_gemm.ops.mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous`
    (the MXFP4 register-A kernel on sm_90 and under DFG_SIMULATE, the float64 reference of its path on CPU), with
    the same layouts and padding-row rule as the FP8 kernel."""
    if not _mxfp4_b(b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast):
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                                         disable_ue8m0_cast, use_psum_layout, ensure_zero_padding,
                                         expected_m_for_psum_layout)
        return
    check_bool(ensure_zero_padding, "ensure_zero_padding")
    check_bool(use_psum_layout, "use_psum_layout")
    if expected_m_for_psum_layout is not None and not use_psum_layout:
        raise ValueError("expected_m_for_psum_layout is for use_psum_layout=True only, got "
                         f"expected_m_for_psum_layout={expected_m_for_psum_layout!r}")
    check_sm100_operands(a, (None, b[1]))
    m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(a, b, d, grouped_layout, use_psum_layout=use_psum_layout)


def m_grouped_fp8_fp4_gemm_nt_masked(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
) -> None:
    """:func:`m_grouped_fp8_gemm_nt_masked` for FP8 ``b``; for MXFP4 experts (``b = (int8 [G, N, K/2] two e2m1
    codes per byte low nibble first, fp32 UE8M0 [G, N, K/32])``, ``recipe_a=(1, 128)``, ``recipe_b=(1, 32)``,
    no ``recipe``) :func:`deep_fp8_gemm.ops.mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked` (the MXFP4 decode kernel on
    sm_90 and under DFG_SIMULATE, the float64 reference of its path on CPU)."""
    if not _mxfp4_b(b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast):
        m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe, recipe_a, recipe_b, compiled_dims,
                                     disable_ue8m0_cast)
        return
    check_sm100_operands(a, (None, b[1]))
    m_grouped_gemm_fp8_fp4_bf16_nt_masked(a, b, d, masked_m, expected_m)


# ---------------------------------------------------------------------------------------------- 1.x wgrad names
def _scales_1x(scales: torch.Tensor, mn: int, k: int, name: str) -> torch.Tensor:
    """1.x scale layouts: ``[mn, kb]``, or K-block-major ``[kb, mn]`` (checked first, as 1.x did, so a square
    tensor is read K-block-major); returned as ``[mn, kb]`` (a view of the K-block-major form)."""
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scales).__name__}")
    kb = (k + 127) // 128
    if scales.dim() == 2 and tuple(scales.shape) == (kb, mn):
        return scales.t()
    if scales.dim() == 2 and tuple(scales.shape) == (mn, kb):
        return scales
    raise ValueError(f"{name} must be [{mn}, {kb}] or K-block-major [{kb}, {mn}] for {mn=} {k=}, got "
                     f"{name}.shape={tuple(scales.shape)}")


def wgrad_gemm_fp8_fp8_fp32_nt(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                               out: torch.Tensor) -> None:
    """The reference's 1.x weight-gradient GEMM: ``out += dequant(lhs) · dequant(rhs)ᵀ`` in fp32 (accumulated).

    ``lhs = (A [m, k] e4m3 K-major, sA)``, ``rhs = (B [n, k] e4m3 K-major, sB)`` with 1x128 scales in either 1.x
    layout, ``[m, ceil(k/128)]`` or K-block-major ``[ceil(k/128), m]`` (likewise for B); ``out`` fp32 ``[m, n]``.
    ``k == 0`` leaves ``out`` unchanged. The 1D1D kernel (:func:`deep_fp8_gemm.gemm_fp8_fp8_fp32_nt_1d1d` with
    ``c=out``)."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    for t, name in ((a, "lhs[0]"), (b, "rhs[0]"), (out, "out")):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
    m, k = a.shape
    n = b.shape[0]
    sa, sb = _scales_1x(sa, m, k, "lhs[1]"), _scales_1x(sb, n, k, "rhs[1]")
    if k == 0:
        return
    gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), out, out)


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs: tuple[torch.Tensor, torch.Tensor], rhs: tuple[torch.Tensor, torch.Tensor],
                                         out: torch.Tensor, batch_sizes: list[int]) -> None:
    """The reference's 1.x k-grouped weight-gradient GEMM: ``out[g] += dequant(A_g) · dequant(B_g)ᵀ`` for each group.

    ``lhs = (flat e4m3 [sum(m·k_g)], sA fp32 [sum(ceil(k_g/128)), m])`` (K-block-major, group after group),
    ``rhs`` likewise with n; ``out`` fp32 ``[G, m, n]``; ``batch_sizes`` the Python ints k_g. With every k_g a
    multiple of 128 this is one launch of the k-grouped kernel (:func:`k_grouped_fp8_gemm_nt_contiguous` with
    ``c=out``); otherwise (1.x allowed any k_g) one 1D1D launch per group, as 1.x did."""
    a, sa = unpack_pair(lhs, "lhs")
    b, sb = unpack_pair(rhs, "rhs")
    if not isinstance(out, torch.Tensor) or out.dim() != 3:
        raise ValueError(f"out must be a 3-D [G, m, n] tensor, got {getattr(out, 'shape', type(out).__name__)}")
    num_groups, m, n = out.shape
    if not isinstance(batch_sizes, (list, tuple)) or not all(type(k) is int for k in batch_sizes):
        raise TypeError(f"batch_sizes must be a list of Python ints (K of each group; not floats, bools or tensors), "
                        f"got {batch_sizes!r}")
    ks = list(batch_sizes)
    if len(ks) != num_groups or any(k < 0 for k in ks):
        raise ValueError(f"batch_sizes must be {num_groups} non-negative ints (one K per group of out), got "
                         f"{batch_sizes!r}")
    a, b = a.reshape(-1), b.reshape(-1)
    if all(k % 128 == 0 for k in ks):
        total_kb = sum(ks) // 128
        sa, sb = _scales_1x(sa, m, total_kb * 128, "lhs[1]"), _scales_1x(sb, n, total_kb * 128, "rhs[1]")
        ks_tensor = torch.tensor(ks, dtype=torch.int32, device=out.device)
        k_grouped_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out, ks, ks_tensor, out)
        return
    a_offset = b_offset = kb_offset = 0
    for g, k in enumerate(ks):
        kb = (k + 127) // 128
        wgrad_gemm_fp8_fp8_fp32_nt((a[a_offset:a_offset + m * k].view(m, k), sa[kb_offset:kb_offset + kb]),
                                   (b[b_offset:b_offset + n * k].view(n, k), sb[kb_offset:kb_offset + kb]), out[g])
        a_offset, b_offset, kb_offset = a_offset + m * k, b_offset + n * k, kb_offset + kb


# ---------------------------------------------------------------------------------------------- absent names
#: Names Hugging Face transformers' DeepGEMM loader requires to exist before it uses the module
#: (``integrations/finegrained_fp8.py``), with what they are; none is provided by this library.
LOADER_REQUIRED_ENTRIES = {
    "m_grouped_fp8_fp4_gemm_nn_contiguous": "the M-grouped FP8 GEMM with an N-major (NN) B, SM100-only in the "
                                            "reference (the Hopper kernels read K-major B)",
    "transform_weights_for_mega_moe": "the Mega MoE weight transform (the fused dispatch + MoE + combine kernel "
                                      "is not part of this library)",
    "get_symm_buffer_for_mega_moe": "the Mega MoE symmetric-memory buffer (not part of this library)",
    "fp8_fp4_mega_moe": "the Mega MoE kernel (not part of this library)",
}


def unsupported_entry(name: str, what: str):
    """A function named ``name`` that raises ``NotImplementedError`` saying what it is and that it is not
    provided: for the names a loader insists on (:data:`LOADER_REQUIRED_ENTRIES`)."""
    def entry(*args, **kwargs):
        raise NotImplementedError(f"deep_gemm.{name}: {what}; deep_fp8_gemm does not provide it (the name exists "
                                  "only because a loader requires it)")

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"Not provided: {what}. Raises NotImplementedError."
    return entry


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """The reference's name of :func:`deep_fp8_gemm.get_col_major_tma_aligned_tensor`: ``sf`` float32
    ``[mn, g]`` / ``[G, mn, g]`` in the MN-major layout with TMA-aligned (16-byte) columns; ``sf`` itself when
    it already is (no copy), else one strided copy."""
    return get_col_major_tma_aligned_tensor(sf)


def transform_sf_into_required_layout(
    sf: torch.Tensor,
    mn: int,
    k: int,
    recipe: tuple[int, ...],
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scales ``sf`` in the layout the SM90 kernels read (the reference's helper, SM90 branch).

    Args:
        sf: float32 scales, ``[ceil(mn/gran_mn), ceil(k/gran_k)]``, or ``[num_groups, ...]`` when
            ``num_groups`` is given.
        mn, k: the operand's rows (m for A, n for B) and K.
        recipe: ``(gran_m, gran_n, gran_k)`` together with ``is_sfa`` (True: A's scales use gran_m, False: B's
            use gran_n), or ``(gran_mn, gran_k)`` with ``is_sfa=None``.
        disable_ue8m0_cast: validated; fp32 scales are used as given on SM90.
        psum_layout: accepted for signature compatibility (the reference uses it only to pack SM100 scales).

    Returns:
        gran ``(1, 128)`` or ``(1, 32)`` (per-token A scales, or the 1D1D recipe's per-row B scales):
        :func:`get_mn_major_tma_aligned_tensor` of ``sf`` (M-major, TMA-aligned; no copy when it already is). gran
        ``(128, 128)`` or ``(32, 32)`` (block B scales): ``sf`` contiguous (no copy when it already is).
        Power-of-two (UE8M0) fp32 values pass through unchanged.

    Raises:
        NotImplementedError: int32 (packed UE8M0) scales, gran_k 32 with other block sizes (SM100 MXFP8).
        TypeError / ValueError: wrong types, shapes, or an is_sfa that does not fit the recipe's form.
    """
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf must be a torch.Tensor, got {type(sf).__name__}")
    if sf.dtype == torch.int32:
        raise NotImplementedError("sf.dtype=torch.int32: packed UE8M0 scales exist only on the reference's SM100 "
                                  "kernels")
    if sf.dtype != torch.float32:
        raise TypeError(f"sf must be float32, got sf.dtype={sf.dtype}")
    for value, name in ((mn, "mn"), (k, "k")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{name} must be a non-negative int, got {value!r}")
    check_bool(disable_ue8m0_cast, "disable_ue8m0_cast")
    if psum_layout is not None and not isinstance(psum_layout, torch.Tensor):
        raise TypeError(f"psum_layout must be a torch.Tensor or None, got {type(psum_layout).__name__}")
    if isinstance(recipe, (tuple, list)) and len(recipe) == 3:
        if not isinstance(is_sfa, bool):
            raise ValueError(f"a 3-element recipe needs is_sfa=True (A's scales) or False (B's), got {is_sfa=}")
        gran_m, gran_n, gran_k = int_tuple(recipe, 3, "recipe")
        gran_mn = gran_m if is_sfa else gran_n
    else:
        if is_sfa is not None:
            raise ValueError(f"a 2-element recipe (gran_mn, gran_k) takes is_sfa=None, got {is_sfa=}")
        gran_mn, gran_k = int_tuple(recipe, 2, "recipe")
    if (gran_mn, gran_k) not in ((1, 128), (128, 128), (1, 32), (32, 32)):
        if gran_k == 32:
            raise NotImplementedError(f"scale granularity ({gran_mn}, 32) (MXFP8 scale groups) exists only on the "
                                      "reference's SM100 kernels; Hopper's 1x32 recipe reads (1, 32) and (32, 32)")
        raise ValueError(f"recipe {tuple(recipe)} gives scale granularity ({gran_mn}, {gran_k}); the Hopper kernels "
                         "read (1, 128) A scales and (128, 128) B scales, or (1, 32) and (32, 32)")
    lead = () if num_groups is None else (num_groups,)
    if num_groups is not None and (isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1):
        raise TypeError(f"num_groups must be a positive int or None, got {num_groups!r}")
    expected = lead + ((mn + gran_mn - 1) // gran_mn, (k + gran_k - 1) // gran_k)
    if tuple(sf.shape) != expected:
        raise ValueError(f"sf must have shape {expected} for {mn=} {k=} granularity ({gran_mn}, {gran_k}) "
                         f"{num_groups=}, got sf.shape={tuple(sf.shape)}")
    if gran_mn == 1:  # A's 1x128 / 1x32 scales, or B's per-row scales of the 1D1D recipe: the same layout
        return get_mn_major_tma_aligned_tensor(sf)
    return sf if sf.is_contiguous() else sf.contiguous()


__all__ = [
    "LOADER_REQUIRED_ENTRIES",
    "check_compiled_dims",
    "check_recipe",
    "fp8_fp4_gemm_nt",
    "fp8_gemm_nt",
    "fp8_m_grouped_gemm_nt_masked",
    "get_mn_major_tma_aligned_tensor",
    "k_grouped_fp8_gemm_nt_contiguous",
    "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "transform_sf_into_required_layout",
    "unsupported_entry",
    "wgrad_gemm_fp8_fp8_fp32_nt",
]
