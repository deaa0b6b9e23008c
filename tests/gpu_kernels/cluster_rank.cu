// GPU test kernel (tests/gpu/test_gpu_jit.py): checks the cluster launch attribute.
// Thread 0 of block b writes out[2b] = %cluster_ctarank and out[2b + 1] = %cluster_nctarank.
// Launched with cluster = 2: ranks 0,1,0,1,... and 2 CTAs per cluster; cluster = 1: 0 and 1.
// The parameter struct is mirrored by ClusterParams in tests/gpu/test_gpu_jit.py.
#include <deep_fp8_gemm/hal.cuh>

namespace dfg_test {
using namespace dfg;

struct ClusterParams {
    u32* out;  // offset 0, 2 * gridDim.x entries
};
static_assert(sizeof(ClusterParams) == 8, "mirrored by ClusterParams in tests/gpu/test_gpu_jit.py");

DFG_DEVICE u32 cluster_num_ctas() {
    u32 n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}

DFG_DEVICE void cluster_rank_body(const ClusterParams& params) {
    if (hal::thread_idx() == 0) {
        params.out[2 * hal::block_idx()] = hal::cluster_cta_rank();
        params.out[2 * hal::block_idx() + 1] = cluster_num_ctas();
    }
}

}  // namespace dfg_test

DFG_DEFINE_KERNEL(dfg_test_cluster_rank, 128, dfg_test::ClusterParams, dfg_test::cluster_rank_body)
