"""Kernel configuration, in three layers (each module one concern):

* :mod:`.rules` — :class:`GemmConfig` (everything compiled into one kernel, frozen), the kind sets derived from the
  kinds table (``deep_fp8_gemm.kinds``) and every legality rule in one function, :func:`check_config`;
* :mod:`.cost` — the throughput model that ranks configs and predicts times (:func:`estimate_seconds`);
* :mod:`.heuristic` — :func:`get_config`, a pure function of the problem and the device's SM count.

The names below are the package's configuration API; import them from ``deep_fp8_gemm.config``.
"""

from .cost import (HBM_BYTES_PER_SECOND, KERNEL_LAUNCH_SECONDS, MODEL_CLOCK_HZ, epilogue_cycles, estimate_cycles,
                   estimate_seconds, issue_cycles_per_k_block, math_issue_per_k_block, num_m_blocks, output_bytes,
                   silu_mul_quant_bytes, silu_mul_quant_seconds)
from .heuristic import (FUSED_SWIGLU_MARGIN, K_GROUPED_NOMINAL_K, MAX_SPLIT_K, SPLIT_K_MARGIN, block_n_choices,
                        fused_swiglu_wins, get_config, k_grouped_config, up_projection_seconds)
from .rules import (BAND_BLOCKS, BLOCK32_BLOCK_M, BLOCK32_BLOCK_N, BLOCK32_KINDS, BLOCK_K, BLOCK_M_CHOICES,
                    BLOCK_N_CHOICES, CONTIGUOUS_ALIGNMENT, CONTIGUOUS_KINDS,
                    FP8_OUTPUT_BLOCK_N, FP8_OUTPUT_KINDS, FP32_ACCUMULATE_KINDS, FP32_ACCUMULATE_REGISTER_OVERHEAD,
                    K_GROUPED, KIND_IDS, KINDS, LAYOUT_OF, MATH_REGISTER_OVERHEAD, MAX_STAGES, MULTICAST_MIN_M,
                    PRODUCER_REGISTERS, REGISTER_FILE, SA_MAJOR_KINDS, SA_MAJORS, SMEM_LIMIT, SWAP_AB_BLOCK_M, SWAP_AB_BLOCK_N, SWAP_AB_KINDS,
                    SWAP_AB_MARGIN, SWAP_AB_MAX_M, SWIGLU_BLOCK_N, SWIGLU_KINDS, SWIGLU_MMA_N, GemmConfig, GemmKind,
                    block32_product_floats, block32_record_bytes, check_config, contiguous_block_m, math_registers_needed, max_stages, mma_n, num_math_warpgroups, sa_pitch,
                    output_columns, problem_rules, smem_bytes, split_k_workspace, waves_m)

__all__ = [name for name in dir() if not name.startswith("_") and name not in ("cost", "heuristic", "rules")]
