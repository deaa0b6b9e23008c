"""deep_gemm.utils.math: ``ceil_div``, ``align``, ``ceil_to_ue8m0`` and the FP8 casts with the reference's bits on
each device (:mod:`deep_fp8_gemm.compat.casts`). ``per_token_cast_to_fp4`` (MXFP4, issue 42) is ours; ``cast_back_from_fp4`` and the packed-UE8M0 helpers (SM100 recipes) come
from the forwarded provider when there is one."""

from ... import provider as _provider
from ...casts import (__all__, align, ceil_div, ceil_to_ue8m0, per_block_cast_to_fp8,  # noqa: F401
                      per_channel_cast_to_fp8, per_custom_dims_cast_to_fp8, per_token_cast_to_fp4,
                      per_token_cast_to_fp8)

__getattr__ = _provider.forwarder("utils.math")
