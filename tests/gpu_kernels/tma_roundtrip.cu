// GPU test kernel (tests/gpu/test_gpu_jit.py): validates encode_tensor_map against torch.
// Block b handles box b of a 3-D tensor (boxes enumerated innermost dimension first):
//   thread 0: mbarrier init (arrive count 1) -> arrive.expect_tx(box_bytes) -> TMA load of the box
//   all 128 threads: wait on the barrier (phase 0), copy the raw shared-memory image of the box to
//                    smem_dump[b * box_bytes ...] (shows the swizzle and the out-of-bounds fill)
//   thread 0: TMA store of the same shared memory through store_map, then waits for completion.
// Shared memory: the box at offset 0 (1024-byte aligned, as 128-byte swizzling needs), the mbarrier
// after it at the next 1024-byte boundary. A box reaching past the tensor edge loads zeros there
// (OOB fill NONE) and its out-of-bounds part is not stored.
// The parameter struct is mirrored by TmaParams in tests/gpu/test_gpu_jit.py.
#include <deep_fp8_gemm/hal.cuh>

namespace dfg_test {
using namespace dfg;

struct TmaParams {
    TensorMap load_map;   // offset 0
    TensorMap store_map;  // offset 128
    u8* smem_dump;        // offset 256
    u32 box_bytes;        // offset 264
    u32 boxes0;           // offset 268: boxes along dimension 0 (innermost)
    u32 boxes1;           // offset 272: boxes along dimension 1
    u32 box0;             // offset 276: box extents in elements
    u32 box1;             // offset 280
    u32 box2;             // offset 284
};  // 288 bytes of fields, padded to the 64-byte alignment of TensorMap
static_assert(sizeof(TmaParams) == 320, "mirrored by TmaParams in tests/gpu/test_gpu_jit.py");
static_assert(alignof(TmaParams) == 64, "TensorMap alignment");

DFG_DEVICE void tma_roundtrip_body(const TmaParams& params) {
    u8* smem = hal::dynamic_smem();
    u64* bar = reinterpret_cast<u64*>(smem + round_up(params.box_bytes, 1024u));
    const u32 b = hal::block_idx();
    const i32 c0 = static_cast<i32>((b % params.boxes0) * params.box0);
    const i32 c1 = static_cast<i32>((b / params.boxes0 % params.boxes1) * params.box1);
    const i32 c2 = static_cast<i32>((b / (params.boxes0 * params.boxes1)) * params.box2);

    if (hal::thread_idx() == 0) {
        hal::mbar_init(bar, 1);
        hal::fence_barrier_init();
    }
    hal::sync_threads();
    if (hal::thread_idx() == 0) {
        hal::tma_prefetch(&params.load_map);
        hal::mbar_arrive_expect_tx(bar, params.box_bytes);
        hal::tma_load_3d(smem, &params.load_map, bar, c0, c1, c2);
    }
    hal::mbar_wait(bar, 0);

    u8* dump = params.smem_dump + static_cast<u64>(b) * params.box_bytes;
    for (u32 i = hal::thread_idx(); i < params.box_bytes; i += 128) dump[i] = smem[i];

    if (hal::thread_idx() == 0) {
        hal::tma_store_3d(&params.store_map, smem, c0, c1, c2);
        hal::tma_store_commit();
        hal::tma_store_wait_all();
    }
}

}  // namespace dfg_test

DFG_DEFINE_KERNEL(dfg_test_tma_roundtrip, 128, dfg_test::TmaParams, dfg_test::tma_roundtrip_body)
