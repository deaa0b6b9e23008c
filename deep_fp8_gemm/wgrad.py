"""Old path of the fp32-accumulating GEMM families, the weight gradients of DeepSeek-V3's FP8 recipe: the 1D1D
GEMM (:mod:`deep_fp8_gemm.ops.wgrad_1d1d`) and its k-grouped MoE variant (:mod:`deep_fp8_gemm.ops.k_grouped`),
where their code and documentation live."""

from .constants import K_GROUP_ALIGNMENT
from .ops.k_grouped import check as check_k_grouped
from .ops.k_grouped import k_grouped_gemm_fp8_fp8_fp32_nt
from .ops.wgrad_1d1d import check as check_1d1d
from .ops.wgrad_1d1d import gemm_fp8_fp8_fp32_nt_1d1d

__all__ = ["K_GROUP_ALIGNMENT", "check_1d1d", "check_k_grouped", "gemm_fp8_fp8_fp32_nt_1d1d",
           "k_grouped_gemm_fp8_fp8_fp32_nt"]
