// Planted bugs, one per `mode`, for tests/kernels/test_sim_failures.py (one warpgroup; tensor map: a 64 x 128 e4m3
// tile, box (128, 64, 1), 128B swizzle). Each mode must make the launch fail with a specific report.
//   barrier `bar` at smem+0 (arrive count 1 unless the mode says otherwise), tile at smem+1024
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;
constexpr u32 kTileBytes = 64 * 128;

enum Mode : u32 {
    kDeadlock = 0,         // arrive count 2, one arrival
    kWgmmaRace = 1,        // TMA reloads the tile while a wgmma reading it is not yet waited for
    kSmemOutOfBounds = 2,  // TMA box past the end of shared memory
    kTrap = 3,             // trap("planted trap 42")
    kDescMismatch = 4,     // one thread's descriptor differs from its warpgroup's
    kOverArrival = 5,      // a second arrival while the phase waits only for transaction bytes
    kUninitialised = 6,    // wait on a barrier nobody initialised
    kStoreOverwrite = 7,   // TMA store source overwritten before tma_store_wait_read
    kMisaligned = 8,       // 128B-swizzled box at an address that is not 1024-byte aligned
    kNoFence = 9,          // wgmma without wgmma_fence
    kPartialWarp = 10,     // stmatrix from half a warp
    kNoFullWait = 11,      // wgmma on a freshly loaded stage without waiting for the load's barrier
    kWildPointer = 12,     // store through a bad global pointer
    kSetmaxnregOneWarp = 13,  // setmaxnreg from one warp of the warpgroup only
};

struct Params {
    TensorMap map;
    u32 mode;
    u32 smem_bytes;
    float* bad_pointer;
};

DFG_DEVICE u64 make_desc(const void* smem_ptr) {
    return ((hal::smem_addr(smem_ptr) & 0x3FFFFu) >> 4) | (u64(1024 >> 4) << 32) | (u64(1) << 62);
}

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();
    u64* bar = reinterpret_cast<u64*>(smem);
    u8* tile = smem + 1024;
    const u32 t = hal::thread_idx();
    if (t == 0) {
        hal::mbar_init(bar, p.mode == kDeadlock ? 2 : 1);
        hal::fence_barrier_init();
    }
    hal::sync_threads();

    switch (p.mode) {
        case kDeadlock:
            if (t == 0) hal::mbar_arrive(bar);
            hal::mbar_wait(bar, 0);
            break;
        case kSmemOutOfBounds:
            if (t == 0) {
                hal::mbar_arrive_expect_tx(bar, kTileBytes);
                hal::tma_load_3d(smem + p.smem_bytes - 4096, &p.map, bar, 0, 0, 0);
            }
            break;
        case kTrap:
            if (t == 7) hal::trap("planted trap 42");
            break;
        case kOverArrival:
            if (t == 0) hal::mbar_arrive_expect_tx(bar, 64);
            if (t == 1) hal::mbar_arrive(bar);
            break;
        case kUninitialised:
            hal::mbar_wait(bar + 1, 0);
            break;
        case kStoreOverwrite:
            if (t == 0) {
                hal::tma_store_3d(&p.map, tile, 0, 0, 0);
                hal::tma_store_commit();
                tile[5] = 1;
                hal::tma_store_wait_read<0>();
            }
            break;
        case kMisaligned:
            if (t == 0) {
                hal::mbar_arrive_expect_tx(bar, kTileBytes);
                hal::tma_load_3d(tile + 128, &p.map, bar, 0, 0, 0);
            }
            break;
        case kPartialWarp:
            if (hal::lane_idx() < 16) hal::stmatrix_x4(tile + 16 * hal::lane_idx(), 0, 0, 0, 0);
            break;
        case kWildPointer:
            if (t == 3) p.bad_pointer[0] = 1.f;
            break;
        case kSetmaxnregOneWarp:
            if (hal::warp_idx() == 1) hal::setmaxnreg_inc<232>();
            break;
        default: {  // the wgmma modes
            if (t == 0) {
                hal::mbar_arrive_expect_tx(bar, kTileBytes);
                hal::tma_load_3d(tile, &p.map, bar, 0, 0, 0);
            }
            if (p.mode == kNoFullWait) hal::sync_threads();  // orders the issue, not the landing
            else hal::mbar_wait(bar, 0);
            float acc[4];
            if (p.mode != kNoFence) hal::wgmma_fence();
            const u64 desc = make_desc(tile) + (p.mode == kDescMismatch && t == 5 ? 2 : 0);
            hal::WgmmaFp8<8>::mma(desc, make_desc(tile), acc, false);
            hal::wgmma_commit();
            if (p.mode == kWgmmaRace && t == 0) {
                hal::mbar_arrive_expect_tx(bar, kTileBytes);
                hal::tma_load_3d(tile, &p.map, bar, 0, 0, 0);
            }
            hal::wgmma_wait<0>();
        }
    }
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
