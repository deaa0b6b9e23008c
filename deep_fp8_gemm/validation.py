"""Old path of the GEMM argument checks: the primitives live in :mod:`deep_fp8_gemm._core.checks`, each family's
``check`` in its module of :mod:`deep_fp8_gemm.ops` (these names re-export them)."""

from ._core.checks import FP8, Problem, check_expected_m, check_pointers, check_tma_layout, unpack_pair
from .ops import FAMILIES
from .ops.contiguous import check_contiguous_layout, check_m_grouped_operands
from .ops.masked import check_masked_layout
from .ops.psum import check_psum_layout, check_psum_values

check_dense = FAMILIES["dense"].check
check_contiguous = FAMILIES["contiguous"].check
check_masked = FAMILIES["masked"].check

__all__ = ["FP8", "Problem", "check_contiguous", "check_contiguous_layout", "check_dense", "check_expected_m",
           "check_m_grouped_operands", "check_masked", "check_masked_layout", "check_pointers", "check_psum_layout",
           "check_psum_values", "check_tma_layout", "unpack_pair"]
