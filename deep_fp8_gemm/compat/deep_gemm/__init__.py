"""``deep_gemm``, the module, served by deep_fp8_gemm: DeepGEMM 2.6.1's SM90 FP8 GEMM API on this library's kernels,
with every name it does not implement forwarded to the other installed DeepGEMM.

Reached as ``deep_gemm`` once the import hook is on (``DFG_AS_DEEP_GEMM=1`` with the ``deep-fp8-gemm-dropin``
distribution installed, or ``deep_fp8_gemm.compat.dropin.enable()``: docs/dropin-install.md), or directly as
``import deep_fp8_gemm.compat.deep_gemm as deep_gemm``.

* This library's names: :mod:`deep_fp8_gemm.compat` (the GEMMs, recipes, scale layouts, the reference's casts,
  the knobs; the DeepSeek-V3.2 / V4 indexer's ``fp8_fp4_mqa_logits``, ``fp8_fp4_paged_mqa_logits``, the legacy
  ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits`` and ``get_paged_mqa_logits_metadata``), the same arguments,
  defaults and positional order, SM90 semantics, and the CPU reference / ``DFG_SIMULATE=1`` simulator on CPU
  tensors; the BF16 / TF32 names (``bf16_gemm_*``, ``m_grouped_bf16_gemm_*``, ``einsum``, ``fp8_einsum``,
  ``tf32_hc_prenorm_gemm``: :mod:`deep_fp8_gemm.compat.bf16`); the submodules ``utils`` (``layout``, ``math``) and ``testing``.
* Every other name (cuBLASLt, the k-grouped BF16 GEMM, Mega MoE, the SM100 layouts, ``deep_gemm._C`` ...) comes from the forwarded provider, a site-packages ``deep_gemm``
  (``sgl-deep-gemm``, upstream DeepGEMM) or vLLM's vendored ``vllm.third_party.deep_gemm``
  (:mod:`deep_fp8_gemm.compat.provider`), so ``hasattr`` tells the truth: ``AttributeError`` when neither has it.
  The names a loader insists on (Hugging Face transformers') that neither has raise ``NotImplementedError``.
* The global knobs set here apply to both providers; a GEMM call this library refuses (an SM100 recipe, FP4) goes
  to the provider (:mod:`deep_fp8_gemm.compat.facade`).
* :func:`provider_of` says who serves a name; ``DFG_DEEP_GEMM_DEBUG=1`` logs it.
"""

import sys as _sys

from .. import api as _api
from .. import facade as _facade
from .. import provider as _provider
from . import testing, utils
from .utils import *  # noqa: F401,F403 - the reference exports its utils at the top level
from .utils import __all__ as _utils_all

globals().update(_facade.REFERENCE)
globals().update(_facade.KNOB_SETTERS)
globals().update(_facade.GEMMS)

#: The reference's names this module serves itself (:func:`provider_of` says ``"deep_fp8_gemm"`` for them).
__all__ = sorted({"__version__", "testing", "utils", *_facade.REFERENCE, *_utils_all})
_SERVED = frozenset([*__all__, *(f"utils.{n}" for n in _utils_all), *(f"testing.{n}" for n in testing.__all__),
                     *(f"utils.layout.{n}" for n in utils.layout.__all__),
                     *(f"utils.math.{n}" for n in utils.math.__all__)]) - {"__version__"}
#: The distribution whose import hook serves this module as ``deep_gemm`` (pip).
DISTRIBUTION = "deep-fp8-gemm-dropin"


def provider_of(name: str):
    """Who serves ``deep_gemm.<name>``: ``"deep_fp8_gemm"``, the forwarded provider's label (``"sgl-deep-gemm
    0.2.3.post2 (site-packages deep_gemm)"``, ``"vllm.third_party.deep_gemm 2.8.1"``), ``"deep_fp8_gemm (stub)"``
    for a loader-required name nobody implements, or None. Submodule names as ``"utils.layout.<name>"``."""
    return _facade.provider_of(name, _SERVED)


_forward = _provider.forwarder("")


def __getattr__(name: str):
    if name == "__version__":  # PEP 440: the reference's version with deep_fp8_gemm's as the local label
        return f"2.6.1+dfg.{_sys.modules['deep_fp8_gemm'].__version__}"
    try:
        return _forward(name)
    except AttributeError:
        if name in _api.LOADER_REQUIRED_ENTRIES:  # a loader insists on these; neither provider has them
            return _api.unsupported_entry(name, _api.LOADER_REQUIRED_ENTRIES[name])
        raise


def __dir__():
    names = set(globals()) | {"__version__"} | set(_api.LOADER_REQUIRED_ENTRIES)
    other = _provider.current()
    if other is not None:
        names |= {n for n in dir(other.module) if not n.startswith("_")}
    return sorted(names)
