"""Old path of the per-call fast path's public face (:mod:`deep_fp8_gemm._core.plans`, where the plans and their
documentation live): :func:`prepare_gemm`, :class:`PreparedGemm`, and :func:`clear` / :func:`stats` for tests."""

from ._core.plans import PreparedGemm, clear, prepare_gemm, stats

__all__ = ["PreparedGemm", "clear", "prepare_gemm", "stats"]
