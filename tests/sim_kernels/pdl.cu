// Programmatic dependent launch, for tests/kernels/test_sim_races.py: `primary` writes `buffer`, `dependent` (the next
// launch of the stream, programmatic) reads it; `mode` says where the dependent waits (griddepcontrol.wait),
// `trigger` where the primary executes griddepcontrol.launch_dependents (0 first, 1 between its writes, 2 never:
// its CTAs' exits let the dependent start). 128 threads, one float of each buffer per thread of the grid.
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;

enum Mode : u32 {
    kWaitThenRead = 0,         // ok
    kReadBeforeWait = 1,       // bug: reads what the primary writes before the wait
    kWriteBeforeWait = 2,      // bug: writes what the primary writes before the wait
    kNoWait = 3,               // bug: touches nothing of the primary, but its CTAs exit without the wait
    kUnrelatedBeforeWait = 4,  // ok: touches only memory the primary does not before the wait
};

struct Params {
    u32 mode;
    u32 trigger;
    float* buffer;
    float* other;
    float* out;
};

DFG_DEVICE void primary(const Params& p) {
    const u32 t = hal::thread_idx(), i = hal::block_idx() * kNumThreads + t;
    if (p.trigger == 0 && t == 0) hal::launch_dependents();
    hal::sync_threads();  // the dependent may start here (a simulated thread runs until it blocks)
    p.buffer[i] = float(i);
    hal::sync_threads();
    if (p.trigger == 1 && t == 0) hal::launch_dependents();
    hal::sync_threads();
    p.buffer[i] += 1.f;
}

DFG_DEVICE void dependent(const Params& p) {
    const u32 t = hal::thread_idx(), i = hal::block_idx() * kNumThreads + t;
    switch (p.mode) {
        case kWaitThenRead:
            hal::grid_dependency_wait();
            p.out[i] = p.buffer[i];
            break;
        case kReadBeforeWait:
            p.out[i] = p.buffer[i];
            hal::grid_dependency_wait();
            break;
        case kWriteBeforeWait:
            p.buffer[i] = 0.f;
            hal::grid_dependency_wait();
            break;
        case kNoWait:
            p.other[i] = 1.f;
            break;
        case kUnrelatedBeforeWait:
            p.other[i] = 2.f;
            hal::grid_dependency_wait();
            p.out[i] = p.buffer[i];
            break;
    }
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}_primary, sim_test::kNumThreads, sim_test::Params, sim_test::primary)
DFG_DEFINE_KERNEL({{KERNEL_NAME}}_dependent, sim_test::kNumThreads, sim_test::Params, sim_test::dependent)
