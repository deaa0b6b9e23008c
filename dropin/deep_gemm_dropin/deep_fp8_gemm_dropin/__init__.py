"""deep-fp8-gemm-dropin's import hook: with ``DFG_AS_DEEP_GEMM=1`` in the environment, ``import deep_gemm`` is served
by deep_fp8_gemm (``deep_fp8_gemm.compat.deep_gemm``), every name it does not implement forwarded to the other
installed DeepGEMM (sgl-deep-gemm, upstream DeepGEMM, vLLM's vendored copy). Without the variable it does nothing.

Run at interpreter start by ``deep_fp8_gemm_dropin.pth`` (site-packages), so it imports only ``os`` and ``sys``: the
stand-in finder it installs imports deep_fp8_gemm (and torch) on the first ``deep_gemm`` import, never before. This
distribution owns no ``deep_gemm/`` files, so it cannot overwrite, shadow or delete another DeepGEMM's.
"""

import os
import sys

#: The switch: ``1`` on; ``0``, empty or unset off (deep_fp8_gemm.env.as_deep_gemm is the same rule).
VARIABLE = "DFG_AS_DEEP_GEMM"


def enabled_by_environment() -> bool:
    """``DFG_AS_DEEP_GEMM`` is ``1``. Another value is reported on stderr and counts as off (raising here would stop
    every Python program of the environment at start-up)."""
    value = os.environ.get(VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        sys.stderr.write(f"deep_fp8_gemm_dropin: {VARIABLE} must be 1 (on) or 0 / empty / unset (off), got "
                         f"{VARIABLE}={value!r}; deep_gemm is not served by deep_fp8_gemm\n")
    return value == "1"


class StandInFinder:
    """First on ``sys.meta_path`` until the first ``deep_gemm`` import: then it removes itself, enables
    ``deep_fp8_gemm.compat.dropin`` and answers with its finder. If deep_fp8_gemm cannot be imported it says so on
    stderr and steps aside (any other ``deep_gemm`` is then found as usual)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "deep_gemm" and not fullname.startswith("deep_gemm."):
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        try:
            from deep_fp8_gemm.compat import dropin
        except Exception as error:
            sys.stderr.write(f"deep_fp8_gemm_dropin: {VARIABLE}=1 but deep_fp8_gemm failed to import ({error!r}); "
                             "deep_gemm is not served by it\n")
            return None
        dropin.enable()
        return dropin.FINDER.find_spec(fullname, path, target)


def install_from_environment() -> None:
    """The ``.pth`` line: put a :class:`StandInFinder` first on ``sys.meta_path`` when :func:`enabled_by_environment`
    (once)."""
    if enabled_by_environment() and not any(isinstance(f, StandInFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StandInFinder())
