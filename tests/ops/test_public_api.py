"""The public API of 0614473 stays importable from its old paths after the restructure (issue 22): every name
of the package's and its submodules' ``__all__`` then, the documented module paths, and the old import
paths the issue names (``deep_fp8_gemm.ops.*``, ``.wgrad.*``, ``.psum.*``, ``.compat.*``, ``.reference.*``,
``.validation.*``, ``.prepared.*``). The list is pinned here, not derived, so a removal fails."""

from __future__ import annotations

import importlib

import pytest

PUBLIC_API = (
    ('deep_fp8_gemm', 'PreparedGemm'),
    ('deep_fp8_gemm', '__version__'),
    ('deep_fp8_gemm', 'autograd'),
    ('deep_fp8_gemm', 'calc_diff'),
    ('deep_fp8_gemm', 'cast_transpose'),
    ('deep_fp8_gemm', 'ceil_div'),
    ('deep_fp8_gemm', 'compat'),
    ('deep_fp8_gemm', 'fp8_fp4_gemm_nt'),
    ('deep_fp8_gemm', 'fp8_gemm_nt'),
    ('deep_fp8_gemm', 'fp8_m_grouped_gemm_nt_masked'),
    ('deep_fp8_gemm', 'gemm_fp8_fp8_bf16_nt'),
    ('deep_fp8_gemm', 'get_col_major_tma_aligned_tensor'),
    ('deep_fp8_gemm', 'get_k_alignment_for_contiguous_layout'),
    ('deep_fp8_gemm', 'get_m_alignment_for_contiguous_layout'),
    ('deep_fp8_gemm', 'get_mk_alignment_for_contiguous_layout'),
    ('deep_fp8_gemm', 'get_mn_major_tma_aligned_tensor'),
    ('deep_fp8_gemm', 'get_num_sms'),
    ('deep_fp8_gemm', 'get_tma_aligned_size'),
    ('deep_fp8_gemm', 'k_grouped_fp8_gemm_nt_contiguous'),
    ('deep_fp8_gemm', 'layout'),
    ('deep_fp8_gemm', 'm_grouped_fp8_fp4_gemm_nt_contiguous'),
    ('deep_fp8_gemm', 'm_grouped_fp8_fp4_gemm_nt_masked'),
    ('deep_fp8_gemm', 'm_grouped_fp8_gemm_nt_contiguous'),
    ('deep_fp8_gemm', 'm_grouped_fp8_gemm_nt_masked'),
    ('deep_fp8_gemm', 'm_grouped_gemm_fp8_fp8_bf16_nt_contiguous'),
    ('deep_fp8_gemm', 'm_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum'),
    ('deep_fp8_gemm', 'm_grouped_gemm_fp8_fp8_bf16_nt_masked'),
    ('deep_fp8_gemm', 'moe'),
    ('deep_fp8_gemm', 'nn'),
    ('deep_fp8_gemm', 'per_block_cast_to_fp8'),
    ('deep_fp8_gemm', 'per_channel_cast_to_fp8'),
    ('deep_fp8_gemm', 'per_token_cast_to_fp8'),
    ('deep_fp8_gemm', 'per_token_cast_to_fp8_and_transpose'),
    ('deep_fp8_gemm', 'prepare_gemm'),
    ('deep_fp8_gemm', 'psum'),
    ('deep_fp8_gemm', 'reference'),
    ('deep_fp8_gemm', 'set_num_sms'),
    ('deep_fp8_gemm', 'transform_sf_into_required_layout'),
    ('deep_fp8_gemm', 'transpose_cast_to_fp8_k_grouped'),
    ('deep_fp8_gemm', 'transpose_per_block_fp8'),
    ('deep_fp8_gemm.autograd', 'fp8_linear'),
    ('deep_fp8_gemm.autograd', 'fp8_linear_frozen'),
    ('deep_fp8_gemm.autograd', 'fp8_moe'),
    ('deep_fp8_gemm.autograd', 'fp8_moe_frozen'),
    ('deep_fp8_gemm.cast_transpose', 'per_token_cast_to_fp8_and_transpose'),
    ('deep_fp8_gemm.cast_transpose', 'transpose_cast_to_fp8_k_grouped'),
    ('deep_fp8_gemm.cast_transpose', 'transpose_per_block_fp8'),
    ('deep_fp8_gemm.compat', 'check_compiled_dims'),
    ('deep_fp8_gemm.compat', 'check_recipe'),
    ('deep_fp8_gemm.compat', 'fp8_fp4_gemm_nt'),
    ('deep_fp8_gemm.compat', 'fp8_gemm_nt'),
    ('deep_fp8_gemm.compat', 'fp8_m_grouped_gemm_nt_masked'),
    ('deep_fp8_gemm.compat', 'get_k_alignment_for_contiguous_layout'),
    ('deep_fp8_gemm.compat', 'get_mk_alignment_for_contiguous_layout'),
    ('deep_fp8_gemm.compat', 'get_mn_major_tma_aligned_tensor'),
    ('deep_fp8_gemm.compat', 'k_grouped_fp8_gemm_nt_contiguous'),
    ('deep_fp8_gemm.compat', 'm_grouped_fp8_fp4_gemm_nt_contiguous'),
    ('deep_fp8_gemm.compat', 'm_grouped_fp8_fp4_gemm_nt_masked'),
    ('deep_fp8_gemm.compat', 'm_grouped_fp8_gemm_nt_contiguous'),
    ('deep_fp8_gemm.compat', 'm_grouped_fp8_gemm_nt_masked'),
    ('deep_fp8_gemm.compat', 'transform_sf_into_required_layout'),
    ('deep_fp8_gemm.distributed', 'ColumnParallelFP8Linear'),
    ('deep_fp8_gemm.distributed', 'EPDecodeBuffers'),
    ('deep_fp8_gemm.distributed', 'EPMoE'),
    ('deep_fp8_gemm.distributed', 'RowParallelFP8Linear'),
    ('deep_fp8_gemm.distributed', 'ep_moe_forward'),
    ('deep_fp8_gemm.distributed', 'ep_moe_forward_decode'),
    ('deep_fp8_gemm.distributed', 'reserve_sms'),
    ('deep_fp8_gemm.distributed.comm', 'all_gather_dim0'),
    ('deep_fp8_gemm.distributed.comm', 'all_to_all_rows'),
    ('deep_fp8_gemm.distributed.comm', 'group_rank'),
    ('deep_fp8_gemm.distributed.comm', 'group_size'),
    ('deep_fp8_gemm.distributed.comm', 'reduce_scatter_dim0'),
    ('deep_fp8_gemm.distributed.ep_decode', 'EPDecodeBuffers'),
    ('deep_fp8_gemm.distributed.ep_decode', 'ep_moe_forward_decode'),
    ('deep_fp8_gemm.distributed.ep_moe', 'ep_moe_forward'),
    ('deep_fp8_gemm.distributed.module', 'EPMoE'),
    ('deep_fp8_gemm.distributed.sms', 'reserve_sms'),
    ('deep_fp8_gemm.distributed.tensor_parallel', 'ColumnParallelFP8Linear'),
    ('deep_fp8_gemm.distributed.tensor_parallel', 'RowParallelFP8Linear'),
    ('deep_fp8_gemm.distributed.wire', 'pack_rows'),
    ('deep_fp8_gemm.distributed.wire', 'row_bytes'),
    ('deep_fp8_gemm.distributed.wire', 'unpack_rows'),
    ('deep_fp8_gemm.layout', 'ContiguousLayout'),
    ('deep_fp8_gemm.layout', 'RoutedLayout'),
    ('deep_fp8_gemm.layout', 'build_contiguous_layout'),
    ('deep_fp8_gemm.layout', 'max_m_sum_bound'),
    ('deep_fp8_gemm.layout', 'route_topk'),
    ('deep_fp8_gemm.moe', 'FP8MoE'),
    ('deep_fp8_gemm.moe', 'fp8_moe_forward'),
    ('deep_fp8_gemm.moe', 'fp8_moe_forward_masked'),
    ('deep_fp8_gemm.moe', 'silu_mul_quant'),
    ('deep_fp8_gemm.nn', 'FP8Linear'),
    ('deep_fp8_gemm.ops', 'gemm_fp8_fp8_bf16_nt'),
    ('deep_fp8_gemm.ops', 'm_grouped_gemm_fp8_fp8_bf16_nt_contiguous'),
    ('deep_fp8_gemm.ops', 'm_grouped_gemm_fp8_fp8_bf16_nt_masked'),
    ('deep_fp8_gemm.prepared', 'PreparedGemm'),
    ('deep_fp8_gemm.prepared', 'prepare_gemm'),
    ('deep_fp8_gemm.psum', 'check_contiguous_psum'),
    ('deep_fp8_gemm.psum', 'check_psum_layout'),
    ('deep_fp8_gemm.psum', 'm_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum'),
    ('deep_fp8_gemm.quant', 'AMAX_FLOOR'),
    ('deep_fp8_gemm.quant', 'FP8_E4M3_MAX'),
    ('deep_fp8_gemm.quant', 'ceil_to_ue8m0'),
    ('deep_fp8_gemm.quant', 'per_block_cast_to_fp8'),
    ('deep_fp8_gemm.quant', 'per_block_cast_to_fp8_torch'),
    ('deep_fp8_gemm.quant', 'per_channel_cast_to_fp8'),
    ('deep_fp8_gemm.quant', 'per_token_cast_to_fp8'),
    ('deep_fp8_gemm.quant', 'per_token_cast_to_fp8_torch'),
    ('deep_fp8_gemm.reference', 'check_psum_values'),
    ('deep_fp8_gemm.reference', 'dequantize_per_block'),
    ('deep_fp8_gemm.reference', 'dequantize_per_token'),
    ('deep_fp8_gemm.reference', 'gemm_fp8_fp8_bf16_nt'),
    ('deep_fp8_gemm.reference', 'gemm_fp8_fp8_fp32_nt_1d1d'),
    ('deep_fp8_gemm.reference', 'k_grouped_gemm_fp8_fp8_fp32_nt'),
    ('deep_fp8_gemm.reference', 'm_grouped_gemm_fp8_fp8_bf16_nt_contiguous'),
    ('deep_fp8_gemm.reference', 'm_grouped_gemm_fp8_fp8_bf16_nt_masked'),
    ('deep_fp8_gemm.reference', 'psum_group_rows'),
    ('deep_fp8_gemm.simulator', 'FLAG_EXACT_MMA'),
    ('deep_fp8_gemm.simulator', 'FLAG_ZERO_SMEM'),
    ('deep_fp8_gemm.simulator', 'LaunchConfig'),
    ('deep_fp8_gemm.simulator', 'SimBuildError'),
    ('deep_fp8_gemm.simulator', 'SimulationError'),
    ('deep_fp8_gemm.simulator', 'TENSOR_MAP_BYTES'),
    ('deep_fp8_gemm.simulator', 'build_library'),
    ('deep_fp8_gemm.simulator', 'launch'),
    ('deep_fp8_gemm.simulator', 'pack_tensor_map'),
    ('deep_fp8_gemm.simulator', 'ptxas_registers'),
    ('deep_fp8_gemm.utils', 'calc_diff'),
    ('deep_fp8_gemm.utils', 'ceil_div'),
    ('deep_fp8_gemm.utils', 'empty_m_major'),
    ('deep_fp8_gemm.utils', 'get_col_major_tma_aligned_tensor'),
    ('deep_fp8_gemm.utils', 'get_m_alignment_for_contiguous_layout'),
    ('deep_fp8_gemm.utils', 'get_num_sms'),
    ('deep_fp8_gemm.utils', 'get_tma_aligned_size'),
    ('deep_fp8_gemm.utils', 'set_num_sms'),
    ('deep_fp8_gemm.validation', 'check_contiguous'),
    ('deep_fp8_gemm.validation', 'check_dense'),
    ('deep_fp8_gemm.validation', 'check_expected_m'),
    ('deep_fp8_gemm.validation', 'check_masked'),
    ('deep_fp8_gemm.validation', 'unpack_pair'),
    ('deep_fp8_gemm.wgrad', 'K_GROUP_ALIGNMENT'),
    ('deep_fp8_gemm.wgrad', 'check_1d1d'),
    ('deep_fp8_gemm.wgrad', 'check_k_grouped'),
    ('deep_fp8_gemm.wgrad', 'gemm_fp8_fp8_fp32_nt_1d1d'),
    ('deep_fp8_gemm.wgrad', 'k_grouped_gemm_fp8_fp8_fp32_nt'),
)


@pytest.mark.parametrize("module,name", PUBLIC_API, ids=[f"{m}.{n}" for m, n in PUBLIC_API])
def test_public_name_is_importable_from_its_old_path(module, name):
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"


def test_package_all_keeps_every_old_name():
    import deep_fp8_gemm

    old = {n for m, n in PUBLIC_API if m == "deep_fp8_gemm"} - set(DEPRECATED_PATHS)  # those: attributes only
    assert old <= set(deep_fp8_gemm.__all__), sorted(old - set(deep_fp8_gemm.__all__))


#: The old paths kept one more release, and the new path each one's warning must name.
DEPRECATED_PATHS = {"psum": "from deep_fp8_gemm", "validation": "deep_fp8_gemm.ops.FAMILIES[kind].check",
                    "wgrad": "from deep_fp8_gemm", "prepared": "from deep_fp8_gemm"}


def test_old_paths_warn_exactly_once_naming_the_new_path():
    """``import deep_fp8_gemm`` warns about nothing; each old path warns once per process (however it is reached:
    an import statement, ``importlib``, an attribute of the package), with a DeprecationWarning naming the new
    path; ``deep_fp8_gemm.reference`` (the references' public module) does not warn."""
    import json
    import subprocess
    import sys

    script = f"""
import importlib, json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import deep_fp8_gemm
    import deep_fp8_gemm.reference
    at_import = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    counts = {{}}
    for name in {sorted(DEPRECATED_PATHS)!r}:
        before = len(caught)
        importlib.import_module("deep_fp8_gemm." + name)
        getattr(deep_fp8_gemm, name)
        exec("import deep_fp8_gemm." + name)
        counts[name] = [str(w.message) for w in caught[before:] if issubclass(w.category, DeprecationWarning)]
print(json.dumps({{"at_import": at_import, "counts": counts}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["at_import"] == [], got["at_import"]
    for name, new_path in DEPRECATED_PATHS.items():
        messages = got["counts"][name]
        assert len(messages) == 1, (name, messages)
        assert f"deep_fp8_gemm.{name} is deprecated" in messages[0] and new_path in messages[0], messages[0]
