"""Deprecated old path of the per-call fast path's public face (one more release): :func:`prepare_gemm` and
:class:`PreparedGemm` are exported by :mod:`deep_fp8_gemm`; ``clear`` / ``stats`` (for tests) live in
``deep_fp8_gemm._core.plans``."""

import warnings

warnings.warn("deep_fp8_gemm.prepared is deprecated and goes in the next release: import prepare_gemm and PreparedGemm "
              "from deep_fp8_gemm", DeprecationWarning, stacklevel=2)

from ._core.plans import PreparedGemm, clear, prepare_gemm, stats  # noqa: E402

__all__ = ["PreparedGemm", "clear", "prepare_gemm", "stats"]
