// TMA round trip for the simulator tests: a 3-D box is loaded (optionally multicast over the cluster), every
// CTA dumps its raw (swizzled) shared memory, then CTA 0 stores the box back through a second tensor map.
//   barrier `full` at smem+0: arrive count 1 (thread 0's arrive.expect_tx) + the box's transaction bytes
//   box at smem+dst_offset
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 128;

struct Params {
    TensorMap load_map;
    TensorMap store_map;
    u8* smem_dump;  // [grid][dump_bytes]
    i32 load_coord[3];
    i32 store_coord[3];
    u32 dst_offset;
    u32 box_bytes;
    u32 dump_bytes;
    u32 multicast_mask;  // 0: each CTA loads for itself; else CTA rank 0 multicasts to these CTAs
    u32 store;           // 1: CTA 0 stores the box back
};

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();
    u64* full = reinterpret_cast<u64*>(smem);
    if (hal::thread_idx() == 0) {
        hal::mbar_init(full, 1);
        hal::fence_barrier_init();
    }
    hal::cluster_sync();  // peers' barriers exist before a multicast signals them

    const i32* c = p.load_coord;
    if (hal::thread_idx() == 0) {
        hal::tma_prefetch(&p.load_map);
        hal::mbar_arrive_expect_tx(full, p.box_bytes);
        if (p.multicast_mask == 0) {
            hal::tma_load_3d(smem + p.dst_offset, &p.load_map, full, c[0], c[1], c[2]);
        } else if (hal::cluster_cta_rank() == 0) {
            hal::tma_load_3d_multicast(smem + p.dst_offset, &p.load_map, full, static_cast<u16>(p.multicast_mask),
                                       c[0], c[1], c[2]);
        }
    }
    hal::mbar_wait(full, 0);
    for (u32 i = hal::thread_idx(); i < p.dump_bytes; i += kNumThreads)
        p.smem_dump[hal::block_idx() * p.dump_bytes + i] = smem[p.dst_offset + i];

    if (p.store && hal::block_idx() == 0 && hal::thread_idx() == 0) {
        const i32* s = p.store_coord;
        hal::fence_view_async_shared();
        hal::tma_store_3d(&p.store_map, smem + p.dst_offset, s[0], s[1], s[2]);
        hal::tma_store_commit();
        hal::tma_store_wait_all();
    }
    hal::cluster_sync();  // no CTA leaves while a peer may still signal it
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
