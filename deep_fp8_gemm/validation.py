"""Deprecated old path of the GEMM argument checks (one more release): each family's check is
``deep_fp8_gemm.ops.FAMILIES[kind].check``; the layouts' value checks (``check_contiguous_layout``,
``check_masked_layout``, ``check_psum_layout``) are exported by :mod:`deep_fp8_gemm`; the primitives live in
``deep_fp8_gemm._core.checks``."""

import warnings

warnings.warn("deep_fp8_gemm.validation is deprecated and goes in the next release: a family's checks are "
              "deep_fp8_gemm.ops.FAMILIES[kind].check; check_contiguous_layout / check_masked_layout / "
              "check_psum_layout are exported by deep_fp8_gemm", DeprecationWarning, stacklevel=2)

from ._core.checks import FP8, Problem, check_expected_m, check_pointers, check_tma_layout, unpack_pair  # noqa: E402
from .ops import FAMILIES  # noqa: E402
from .ops.contiguous import check_contiguous_layout, check_m_grouped_operands  # noqa: E402
from .ops.masked import check_masked_layout  # noqa: E402
from .ops.psum import check_psum_layout, check_psum_values  # noqa: E402

check_dense = FAMILIES["dense"].check
check_contiguous = FAMILIES["contiguous"].check
check_masked = FAMILIES["masked"].check

__all__ = ["FP8", "Problem", "check_contiguous", "check_contiguous_layout", "check_dense", "check_expected_m",
           "check_m_grouped_operands", "check_masked", "check_masked_layout", "check_pointers", "check_psum_layout",
           "check_psum_values", "check_tma_layout", "unpack_pair"]
