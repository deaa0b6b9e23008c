// The k-grouped GEMM's per-group tensor maps, built on the device from ks_tensor (policy_k_grouped.cuh), so the
// host never needs the group sizes' values and a CUDA graph replays correctly with new ks_tensor contents.
//
// A_g [rows, K_g] starts at byte rows * k_off_g of the flat A (k_off_g = sum(ks[:g])) with row stride K_g; B_g
// [N, K_g] at byte N * k_off_g. The host encodes one template map per operand (cuTensorMapEncodeTiled, or the
// simulator's packing): rank 3, dims (any K, rows | N, 1), box (128, BLOCK_M | BLOCK_N, 1), SW128. This kernel
// writes 2G maps (a 128-byte-aligned buffer), A_g at maps[2g] and B_g at maps[2g + 1], each the template with four
// fields replaced:
//     global_address = A | B + (rows | N) * k_off_g,  global_dim[0] = K_g,
//     global_stride[0] = K_g (bytes: e4m3),            global_stride[1] = (rows | N) * K_g (dim 2, extent 1).
// An empty group's maps (K_g = 0) are not written: the GEMM never fences or uses them.
//
// Grid: ceil(2G / kWarps) CTAs of kWarps warps; warp w of CTA c builds map c * kWarps + w. Every CTA first scans
// all of ks (chunks of kNumThreads, an inclusive Hillis-Steele scan in shared memory) for its groups' offsets and
// checks every value: a K that is negative or not a multiple of 128, or a sum past capacity_k (the K the operand
// buffers hold, from the host's ks), traps -- a map past the buffers would make the TMA read other memory.
//
// Proxies (PTX ISA "tensormap.replace", "tensormap.cp_fenceproxy"; CUDA programming guide, TMA, "modifying a
// tensor map on the device"): the warp copies the template into its 128-byte shared-memory slot with generic
// stores, one elected lane replaces the fields there, and the whole warp copies the slot to global memory with
// tensormap.cp_fenceproxy...release.gpu (warp-collective, .sync.aligned). The GEMM launched after this kernel
// issues fence.proxy.tensormap::generic.acquire on each map before its first TMA through it.
#pragma once
#include "../common.cuh"
#include "../hal.cuh"

namespace dfg::group_maps {

constexpr u32 kWarps = 8;
constexpr u32 kNumThreads = kWarps * 32;
constexpr u32 kStagingBytes = kWarps * 128;                // one 128-byte map slot per warp (first: 1024-aligned)
constexpr u32 kSmemBytes = kStagingBytes + 2 * kNumThreads * 8;  // + the scan's two u64 buffers

// Byte layout mirrored by deep_fp8_gemm/kernels/group_maps.py (GroupMapParams).
struct Params {
    TensorMap a_template;  // A_g's map but for address, K extent and strides
    TensorMap b_template;  // B_g's
    u64 a;                 // flat A (e4m3), rows * capacity_k bytes
    u64 b;                 // flat B (e4m3), n * capacity_k bytes
    const i32* ks;         // [num_groups] K_g (ks_tensor)
    TensorMap* maps;       // [2 * num_groups] out, 128-byte aligned
    u32 num_groups;
    u32 rows;              // m: A_g's rows
    u32 n;                 // B_g's rows
    u32 capacity_k;        // sum of the host's ks: K the operand buffers hold
};
static_assert(DFG_OFFSETOF(Params, a) == 256 && DFG_OFFSETOF(Params, ks) == 272 && DFG_OFFSETOF(Params, maps) == 280 &&
                  DFG_OFFSETOF(Params, num_groups) == 288 && DFG_OFFSETOF(Params, capacity_k) == 300 &&
                  sizeof(Params) == 320,
              "GroupMapParams layout is mirrored in deep_fp8_gemm/kernels/group_maps.py");

DFG_DEVICE void body(const Params& p) {
    u8* smem = hal::dynamic_smem();
    TensorMap* staging = reinterpret_cast<TensorMap*>(smem);
    u64* scan = reinterpret_cast<u64*>(smem + kStagingBytes);  // [2][kNumThreads]
    const u32 tid = hal::thread_idx(), warp = hal::warp_idx(), lane = hal::lane_idx();
    const u32 map = hal::block_idx() * kWarps + warp;  // 2g: A_g, 2g + 1: B_g
    const u32 group = map / 2;
    if (tid == 0 && hal::smem_addr(staging) % 128 != 0)  // the PTX ISA's tensormap examples align maps to 128
        hal::trap("the map builder's shared memory is not 128-byte aligned");
    // PDL (deep_fp8_gemm.set_pdl): ks_tensor may come from the previous kernel, and the map buffer may be memory
    // it still reads: wait before either. The GEMM after this kernel may launch now: it waits for this grid (and so
    // for the maps) before its producer's acquire fence and first TMA.
    hal::grid_dependency_wait();
    hal::launch_dependents();

    u64 carry = 0, k_off = 0, k_group = 0;
    for (u32 base = 0; base < p.num_groups; base += kNumThreads) {
        const u32 g = base + tid;
        const i32 k = g < p.num_groups ? p.ks[g] : 0;
        if (k < 0 || k % 128 != 0)
            hal::trap("ks_tensor holds a K that is negative or not a multiple of 128");
        u32 cur = 0;
        scan[tid] = static_cast<u64>(k);
        hal::sync_threads();
        for (u32 step = 1; step < kNumThreads; step *= 2) {  // inclusive scan, ping-pong between the buffers
            const u64* in = scan + cur * kNumThreads;
            const u64 v = in[tid] + (tid >= step ? in[tid - step] : 0u);
            cur ^= 1u;
            scan[cur * kNumThreads + tid] = v;
            hal::sync_threads();
        }
        const u64* inclusive = scan + cur * kNumThreads;
        if (group >= base && group < base + kNumThreads && group < p.num_groups) {
            const u32 i = group - base;
            k_group = inclusive[i] - (i > 0 ? inclusive[i - 1] : 0u);  // the K this chunk's scan read for it
            k_off = carry + inclusive[i] - k_group;
        }
        carry += inclusive[kNumThreads - 1];
        hal::sync_threads();  // every thread has read the buffers before the next chunk overwrites them
    }
    if (carry > p.capacity_k)
        hal::trap("ks_tensor sums to more K than ks: past the end of the operand buffers");
    if (group >= p.num_groups || k_group == 0)
        return;  // the whole warp: no map here (past 2G, or an empty group's, never used)

    const bool is_a = map % 2 == 0;
    TensorMap* slot = staging + warp;
    reinterpret_cast<u32*>(slot)[lane] = reinterpret_cast<const u32*>(is_a ? &p.a_template : &p.b_template)[lane];
    hal::warp_sync();
    if (hal::elect_one_sync()) {
        const u64 width = is_a ? p.rows : p.n;
        hal::tensormap_replace_global_address(slot, (is_a ? p.a : p.b) + width * k_off);
        hal::tensormap_replace_global_dim<0>(slot, static_cast<u32>(k_group));
        hal::tensormap_replace_global_stride<0>(slot, k_group);
        hal::tensormap_replace_global_stride<1>(slot, width * k_group);
    }
    hal::warp_sync();
    hal::tensormap_cp_fenceproxy(p.maps + map, slot);
}

}  // namespace dfg::group_maps
