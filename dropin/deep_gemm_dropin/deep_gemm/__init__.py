"""deep_gemm: DeepGEMM 2.6.1's SM90 FP8 GEMM API on deep_fp8_gemm (distribution ``deep-fp8-gemm-dropin``).

A re-export of :mod:`deep_fp8_gemm.compat`, the one place the 2.x surface is implemented (its API, the reference's
casts bit for bit, its runtime knobs): the same arguments, defaults and positional order, SM90 semantics, and the
CPU reference / ``DFG_SIMULATE=1`` simulator on CPU tensors. The DeepSeek-V3.2 / V4 indexer is here in both of the
reference's spellings: ``fp8_fp4_mqa_logits``, ``fp8_fp4_paged_mqa_logits``, the legacy ``fp8_mqa_logits`` /
``fp8_paged_mqa_logits``, and ``get_paged_mqa_logits_metadata`` (``deep_fp8_gemm.compat.attention``). Names outside
that scope (BF16 GEMMs, einsum, ``tf32_hc_prenorm_gemm``, cuBLASLt, the SM100 layouts) are absent, so ``hasattr`` /
``getattr`` probes see them missing; the few a loader insists on (Hugging Face transformers') exist and raise
``NotImplementedError``. docs/dropin.md lists every name.
"""

import deep_fp8_gemm as _dfg
from deep_fp8_gemm import compat as _compat

#: deep_fp8_gemm.compat's helpers that are not names of the reference (not re-exported).
_NOT_REFERENCE_NAMES = {"LOADER_REQUIRED_ENTRIES", "RUNTIME_KNOBS", "RuntimeKnobs", "check_compiled_dims",
                        "check_recipe", "unsupported_entry"}
globals().update({name: getattr(_compat, name) for name in _compat.__all__ if name not in _NOT_REFERENCE_NAMES})

from . import testing, utils
from .utils import *  # noqa: F401,F403 - the reference exports its utils at the top level
from .utils import __all__ as _utils_all

#: PEP 440: the reference's version with deep_fp8_gemm's as the local label (compares >= 2.6.1).
__version__ = f"2.6.1+dfg.{_dfg.__version__}"
#: This distribution's name (pip).
DISTRIBUTION = "deep-fp8-gemm-dropin"

# Names Hugging Face transformers requires before it uses the module: present, raising NotImplementedError.
for _name, _what in _compat.LOADER_REQUIRED_ENTRIES.items():
    globals()[_name] = _compat.unsupported_entry(_name, _what)


def _providers() -> list[str]:
    """``"name version"`` of every installed distribution that provides the top-level module ``deep_gemm``."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions():
        top = dist.read_text("top_level.txt")
        if top is not None:
            provides = "deep_gemm" in top.split()
        else:
            provides = any(f.parts and f.parts[0] == "deep_gemm" for f in dist.files or ())
        if provides:
            found.append(f"{dist.metadata['Name']} {dist.version}")
    return sorted(set(found))


def _warn_if_shadowing() -> None:
    providers = _providers()
    others = [p for p in providers if p.split()[0].lower().replace("_", "-") != DISTRIBUTION]
    if others:
        import warnings

        warnings.warn(
            f"deep_gemm is provided by more than one installed distribution: {', '.join(providers)}. This import "
            f"is {DISTRIBUTION} (deep_fp8_gemm's drop-in, {__file__}); two providers of one package directory can "
            "overwrite each other's files, so uninstall one of them (pip uninstall ...)",
            RuntimeWarning, stacklevel=3)


_warn_if_shadowing()

__all__ = sorted({"__version__", "testing", "utils", *_compat.__all__, *_compat.LOADER_REQUIRED_ENTRIES, *_utils_all}
                 - _NOT_REFERENCE_NAMES)
