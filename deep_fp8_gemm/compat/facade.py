"""The ``deep_gemm`` facade's own versions of this library's 2.x names (:mod:`deep_fp8_gemm.compat.deep_gemm`
exports them): the global knobs applied to both providers, the GEMMs that hand a call this library refuses to the
forwarded provider, and :func:`provider_of`.

* **Knobs** (:data:`.provider.KNOBS`): ours first (its checks, its ``ValueError``), then the forwarded provider's
  setter of the same name when it has one; if that raises, ours is put back and the error propagates, so the two
  never disagree. Each value is recorded and replayed on a provider found later (vLLM's vendored copy appears only
  once vLLM is imported). A knob set here reads back from either provider's getter.
* **Hand-over**: a GEMM call that this library refuses with ``NotImplementedError`` (an option outside the SM90 FP8
  kernels it implements: gran_k 32 other than the ``(1, 32, 32)`` recipe, FP4 operands, packed UE8M0 scales, ``alpha``) or
  whose arguments do not fit its signature (a provider's extra keywords, SGLang's ``enable_overlap``) goes to the
  forwarded provider's function of the same name, unchanged: a capability the other provider has is never lost.
  Without a provider the error propagates. The layout helpers are never handed over (an alignment from one
  provider with the other's kernels would pad wrongly).
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from ..utils import get_num_sms, get_pdl, is_batch_invariant, set_batch_invariant
from . import api, attention, bf16, casts, knobs, provider

#: compat's helpers that are not names of the reference (the facade does not export them).
NOT_REFERENCE_NAMES = {"LOADER_REQUIRED_ENTRIES", "RUNTIME_KNOBS", "RuntimeKnobs", "check_compiled_dims",
                       "check_recipe", "unsupported_entry"}
#: The reference's names this library implements, name -> this library's object (before the facade's versions).
REFERENCE = {name: getattr(module, name) for module in (api, attention, bf16, casts, knobs) for name in module.__all__
             if name not in NOT_REFERENCE_NAMES}


def _knob(name: str, ours: Callable, save: Callable, restore: Callable) -> Callable:
    @functools.wraps(ours)
    def setter(*args, **kwargs):
        before = save()
        ours(*args, **kwargs)
        try:
            provider.set_knob(name, args, kwargs)
        except BaseException:
            restore(before)
            raise

    setter.__doc__ = (f"{ours.__doc__}\n\nThrough ``deep_gemm``: also applied to the forwarded provider (its own "
                      "``{name}``), now or when it is found.").replace("{name}", name)
    return setter


def _held(field: str):
    return (lambda: getattr(knobs.RUNTIME_KNOBS, field)), (lambda v: setattr(knobs.RUNTIME_KNOBS, field, v))


set_pdl = _knob("set_pdl", knobs.set_pdl, get_pdl, knobs.set_pdl)
set_num_sms = _knob("set_num_sms", knobs.set_num_sms, get_num_sms, knobs.set_num_sms)
set_tc_util = _knob("set_tc_util", knobs.set_tc_util, *_held("tc_util"))
set_ignore_compile_dims = _knob("set_ignore_compile_dims", knobs.set_ignore_compile_dims, *_held("ignore_compile_dims"))
set_block_size_multiple_of = _knob("set_block_size_multiple_of", knobs.set_block_size_multiple_of,
                                   *_held("block_size_multiple_of"))
set_mk_alignment_for_contiguous_layout = _knob("set_mk_alignment_for_contiguous_layout",
                                               knobs.set_mk_alignment_for_contiguous_layout,
                                               knobs.get_mk_alignment_for_contiguous_layout,
                                               knobs.set_mk_alignment_for_contiguous_layout)
use_deterministic_algorithms = _knob("use_deterministic_algorithms", knobs.use_deterministic_algorithms,
                                     is_batch_invariant, set_batch_invariant)
KNOB_SETTERS = {f.__name__: f for f in (set_pdl, set_num_sms, set_tc_util, set_ignore_compile_dims,
                                        set_block_size_multiple_of, set_mk_alignment_for_contiguous_layout,
                                        use_deterministic_algorithms)}
assert set(KNOB_SETTERS) == set(provider.KNOBS)


def _binds(signature: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    try:
        signature.bind(*args, **kwargs)
        return True
    except TypeError:
        return False


def _handing_over(name: str, ours: Callable) -> Callable:
    signature = inspect.signature(ours)

    @functools.wraps(ours)
    def call(*args, **kwargs):
        try:
            return ours(*args, **kwargs)
        except NotImplementedError:
            other = provider.fallback(name)
            if other is None:
                raise
        except TypeError:
            if _binds(signature, args, kwargs):
                raise  # our own argument check, not a signature this library lacks
            other = provider.fallback(name)
            if other is None:
                raise
        return other(*args, **kwargs)

    return call


#: The entry points a refused call is handed over from (module docstring).
HANDED_OVER = ("fp8_gemm_nt", "fp8_fp4_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous",
               "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
               "m_grouped_fp8_fp4_gemm_nt_masked", "k_grouped_fp8_gemm_nt_contiguous",
               "transform_sf_into_required_layout")
GEMMS = {name: _handing_over(name, getattr(api, name)) for name in HANDED_OVER}


def provider_of(name: str, served: frozenset[str] = frozenset()) -> str | None:
    """Who serves ``deep_gemm.<name>`` (``"utils.layout.x"`` for a submodule's): ``"deep_fp8_gemm"`` for this
    library's names (in ``served``), the forwarded provider's label for a name only it has, ``"deep_fp8_gemm
    (stub)"`` for a name a loader requires that nobody implements (it raises ``NotImplementedError``), None when
    neither has it. Loads the forwarded provider if it was not yet."""
    if name in served:
        return provider.OURS
    path, _, leaf = name.rpartition(".")
    try:
        provider.lookup(path, leaf)
        return provider.current().label
    except AttributeError:
        pass
    if name in api.LOADER_REQUIRED_ENTRIES:
        return f"{provider.OURS} (stub)"
    return None
