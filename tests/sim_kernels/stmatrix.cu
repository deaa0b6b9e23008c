// stmatrix.x4 probe: lane l stores registers regs[l][0..3] with the row address smem + row_offset[l]; the
// shared memory is dumped. The test derives the expected bytes from CuTe's SM90_U32x4_STSM_N layouts.
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 32;

struct Params {
    u8* dump;
    u32 regs[32][4];
    u32 row_offset[32];
    u32 dump_bytes;
};

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();
    const u32 l = hal::lane_idx();
    hal::stmatrix_x4(smem + p.row_offset[l], p.regs[l][0], p.regs[l][1], p.regs[l][2], p.regs[l][3]);
    hal::sync_threads();
    for (u32 i = l; i < p.dump_bytes; i += kNumThreads) p.dump[i] = smem[i];
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
