"""The reference design's 2.x argument rules (DeepGEMM 2.6, SM90 semantics), shared by the 2.x names of
:mod:`deep_fp8_gemm.compat`: recipes, ``compiled_dims``, the SM100-only dtypes, and which argument kinds let a GEMM
try its cached plan first (:func:`plain_arguments`). :mod:`.api`'s docstring states what each argument means."""

from __future__ import annotations

from itertools import permutations

import torch

from .._core.checks import check_bool

_DEFAULT_RECIPE = (1, 128, 128)
#: Every valid ``compiled_dims`` (distinct letters of "mnk", any order, "" included): what check_compiled_dims accepts.
COMPILED_DIMS = frozenset("".join(p) for r in range(4) for p in permutations("mnk", r))
_ONE_D_ONE_D = "the 1D1D weight-gradient kernel (per-channel B scales, fp32 D accumulated into C)"
_FP4_DTYPES = tuple(getattr(torch, name) for name in ("float4_e2m1fn_x2",) if hasattr(torch, name)) + (
    torch.int8, torch.uint8)


# ---------------------------------------------------------------------------------------------- argument checks
def int_tuple(value: object, length: int, name: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) != length or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"{name} must be a tuple of {length} ints, got {value!r}")
    return tuple(value)


#: The recipes :func:`check_recipe` tells apart: the 1D2D kernel (1, 128, 128), the 1D1D one (1, 1, 128) and the
#: 1x32 / 32x32 one (1, 32, 32) of DeepSeek-V4.1's dense layers (``gemm_fp8_fp8_bf16_nt_block32``).
RECIPE_1D2D, RECIPE_1D1D, RECIPE_BLOCK32 = "1d2d", "1d1d", "block32"
_BLOCK32_RECIPE, _1D1D_RECIPE = (1, 32, 32), (1, 1, 128)


def _check_granularity(gran_mn_a: int, gran_mn_b: int, gran_k: int, what: str, allow_1d1d: bool,
                       allow_block32: bool) -> str:
    """The recipe a granularity selects (:data:`RECIPE_1D2D`, or where allowed :data:`RECIPE_1D1D` /
    :data:`RECIPE_BLOCK32`); name what the others are."""
    if (gran_mn_a, gran_mn_b, gran_k) == _BLOCK32_RECIPE:
        if allow_block32:
            return RECIPE_BLOCK32
        raise NotImplementedError(f"{what} (the 1x32 / 32x32 recipe) exists only as fp8_gemm_nt (dense) on Hopper; "
                                  "the M-grouped GEMMs use recipe (1, 128, 128)")
    if gran_k == 32:
        raise NotImplementedError(f"{what}: gran_k 32 with these block sizes (MXFP8 scale groups) exists only on the "
                                  "reference's SM100 kernels; Hopper kernels take (1, 128, 128), (1, 1, 128) or "
                                  "(1, 32, 32)")
    if (gran_mn_a, gran_k) == (1, 128) and gran_mn_b == 1:
        if allow_1d1d:
            return RECIPE_1D1D
        raise NotImplementedError(f"{what} selects {_ONE_D_ONE_D}, which exists only as fp8_gemm_nt (dense); "
                                  "the M-grouped GEMMs use recipe (1, 128, 128) with 128x128 B scales")
    if (gran_mn_a, gran_mn_b, gran_k) != _DEFAULT_RECIPE:
        raise ValueError(f"{what} is not a recipe of the Hopper kernels: supported (1, 128, 128) (1x128 A scales, "
                         "128x128 B scales); (1, 1, 128) is the 1D1D kernel, (1, 32, 32) the 1x32 / 32x32 one")
    return RECIPE_1D2D


def check_recipe(recipe: object = None, recipe_a: object = None, recipe_b: object = None, *,
                 allow_1d1d: bool = False, allow_block32: bool = False) -> str:
    """Validate the reference's ``recipe`` / ``recipe_a`` + ``recipe_b`` arguments (see the module docstring);
    returns the recipe they select: :data:`RECIPE_1D2D` (the default), :data:`RECIPE_1D1D` (only with
    ``allow_1d1d``) or :data:`RECIPE_BLOCK32` (only with ``allow_block32``)."""
    if recipe is not None and (recipe_a is not None or recipe_b is not None):
        raise ValueError(f"pass either recipe or the recipe_a / recipe_b pair, not both: {recipe=} {recipe_a=} "
                         f"{recipe_b=}")
    if (recipe_a is None) != (recipe_b is None):
        raise ValueError(f"recipe_a and recipe_b go together, got {recipe_a=} {recipe_b=}")
    if recipe is not None:
        gm, gn, gk = int_tuple(recipe, 3, "recipe")
        return _check_granularity(gm, gn, gk, f"recipe={tuple(recipe)}", allow_1d1d, allow_block32)
    elif recipe_a is not None:
        gm, gka = int_tuple(recipe_a, 2, "recipe_a")
        gn, gkb = int_tuple(recipe_b, 2, "recipe_b")
        if gka != gkb:
            raise ValueError(f"recipe_a and recipe_b must share gran_k, got {recipe_a=} {recipe_b=}")
        return _check_granularity(gm, gn, gka, f"recipe_a={tuple(recipe_a)}, recipe_b={tuple(recipe_b)}",
                                  allow_1d1d, allow_block32)
    return RECIPE_1D2D


def check_compiled_dims(compiled_dims: object) -> None:
    """A string of distinct letters from ``"mnk"`` (the reference's compile-time dims hint)."""
    if type(compiled_dims) is str and compiled_dims in COMPILED_DIMS:  # the common call: one set lookup
        return
    if not isinstance(compiled_dims, str):
        raise TypeError(f"compiled_dims must be a str, got {type(compiled_dims).__name__} ({compiled_dims!r})")
    if set(compiled_dims) - set("mnk") or len(set(compiled_dims)) != len(compiled_dims):
        raise ValueError(f"compiled_dims must be distinct letters of 'mnk', got {compiled_dims!r}")


def check_sm100_operands(a: object, b: object) -> None:
    """FP4 data and packed-UE8M0 int scales name the SM100-only feature instead of a dtype error."""
    for pair, name in ((a, "a"), (b, "b")):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            continue  # the 1.x checks raise the TypeError for a malformed pair
        data, scales = pair
        if isinstance(data, torch.Tensor) and data.dtype in _FP4_DTYPES:
            raise NotImplementedError(f"{name}[0].dtype={data.dtype}: FP4 operands exist only on the reference's "
                                      "SM100 kernels; Hopper kernels take float8_e4m3fn")
        if isinstance(scales, torch.Tensor) and scales.dtype == torch.int32:
            raise NotImplementedError(f"{name}[1].dtype=torch.int32: packed UE8M0 scales exist only on the "
                                      "reference's SM100 kernels; pass float32 scales (power-of-two fp32 scales "
                                      "from per_token_cast_to_fp8(x, use_ue8m0=True) are fine)")


def common_checks(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, dense=False) -> str:
    """The 2.x arguments every GEMM checks; returns the recipe (``dense``: fp8_gemm_nt's 1D1D and 1x32 ones too)."""
    check_sm100_operands(a, b)
    selected = check_recipe(recipe, recipe_a, recipe_b, allow_1d1d=dense, allow_block32=dense)
    check_compiled_dims(compiled_dims)
    check_bool(disable_ue8m0_cast, "disable_ue8m0_cast")
    return selected


def plain_arguments(a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast) -> bool:
    """The 2.x arguments are the kinds whose checks depend only on the tensors' signature (no recipe, a valid
    ``compiled_dims`` str, a bool, two pairs): the GEMMs then try the cached plan first (``_DENSE_HIT``)."""
    return (recipe is None and recipe_a is None and recipe_b is None and type(disable_ue8m0_cast) is bool and
            type(compiled_dims) is str and compiled_dims in COMPILED_DIMS and type(a) is tuple and len(a) == 2 and
            type(b) is tuple and len(b) == 2)


def is_block32_recipe(recipe: object) -> bool:
    """``recipe`` is exactly ``(1, 32, 32)``, a tuple of ints (bools excluded, as :func:`int_tuple` excludes them)."""
    return _is_exactly(recipe, _BLOCK32_RECIPE)


def is_1d1d_recipe(recipe: object) -> bool:
    """``recipe`` is exactly ``(1, 1, 128)``, a tuple of ints (bools excluded, as :func:`int_tuple` excludes them)."""
    return _is_exactly(recipe, _1D1D_RECIPE)


def _is_exactly(recipe: object, value: tuple[int, int, int]) -> bool:
    return (type(recipe) is tuple and len(recipe) == 3 and type(recipe[0]) is int and type(recipe[1]) is int and
            type(recipe[2]) is int and recipe == value)


def check_bf16_output(d: object) -> None:
    if isinstance(d, torch.Tensor) and d.dtype == torch.float32:
        raise NotImplementedError(f"d.dtype=torch.float32: an fp32 D is written only by {_ONE_D_ONE_D}, which "
                                  "exists only as fp8_gemm_nt(..., recipe=(1, 1, 128)); the 1D2D kernels write "
                                  "bfloat16")
