"""Deprecated old path of the fp32-accumulating GEMM families (one more release): ``gemm_fp8_fp8_fp32_nt_1d1d`` and
``k_grouped_gemm_fp8_fp8_fp32_nt`` are exported by :mod:`deep_fp8_gemm`; their checks are
``deep_fp8_gemm.ops.FAMILIES["1d1d" | "k_grouped"].check`` (modules :mod:`deep_fp8_gemm.ops.wgrad_1d1d`,
:mod:`deep_fp8_gemm.ops.k_grouped`)."""

import warnings

warnings.warn("deep_fp8_gemm.wgrad is deprecated and goes in the next release: import gemm_fp8_fp8_fp32_nt_1d1d and "
              "k_grouped_gemm_fp8_fp8_fp32_nt from deep_fp8_gemm (their checks: deep_fp8_gemm.ops.FAMILIES[kind].check)",
              DeprecationWarning, stacklevel=2)

from .constants import K_GROUP_ALIGNMENT  # noqa: E402
from .ops.k_grouped import check as check_k_grouped  # noqa: E402
from .ops.k_grouped import k_grouped_gemm_fp8_fp8_fp32_nt  # noqa: E402
from .ops.wgrad_1d1d import check as check_1d1d  # noqa: E402
from .ops.wgrad_1d1d import gemm_fp8_fp8_fp32_nt_1d1d  # noqa: E402

__all__ = ["K_GROUP_ALIGNMENT", "check_1d1d", "check_k_grouped", "gemm_fp8_fp8_fp32_nt_1d1d",
           "k_grouped_gemm_fp8_fp8_fp32_nt"]
