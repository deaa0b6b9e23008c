// Entry of the k-grouped GEMM's map builder (rendered by deep_fp8_gemm/kernels/group_maps.py): one binary for
// every config, the box and swizzle come with the host-encoded template maps (kernels/group_maps.cuh).
#include <deep_fp8_gemm/kernels/group_maps.cuh>

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, dfg::group_maps::kNumThreads, dfg::group_maps::Params, dfg::group_maps::body)
