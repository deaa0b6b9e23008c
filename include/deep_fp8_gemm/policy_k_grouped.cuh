// The k-grouped kind of the 1D1D family (GemmKind::KGrouped1D1D, MoE weight gradients): for G = kNumGroups
// groups with K_g = ks[g] (a multiple of 128, 0 allowed) stored back to back,
//     D[g] (fp32 [rows][N]) = C[g] + A_g . B_g^T,   A_g [rows, K_g], B_g [N, K_g] e4m3 K-major,
// with the 1D1D policies of policy_1d1d.cuh (per-row sB TMA-loaded per stage, fp32-accumulate epilogue), in one
// launch: a persistent scheduler walks groups x tiles, and the K-loop trip count is the tile's group's K_g / 128,
// a run-time value.
//
// Operands. A_g starts at element rows * k_off_g of the flat A (k_off_g = sum(ks[:g])) and has row stride K_g,
// so no fixed-stride tensor map covers all groups. One rank-3 map per group and operand -- A_g dims (K_g, rows,
// 1), B_g dims (K_g, N, 1), box (128, BLOCK_M|N, 1), SW128 -- sits in a global-memory array
// (GemmParams::group_maps: A_g at [2g], B_g at [2g + 1]; an empty group's are not written, never used), built on
// the device from ks by the map builder launched just before this kernel (kernels/group_maps.cuh: template maps
// from the host, tensormap.replace + tensormap.cp_fenceproxy...release), so the host never reads ks_tensor and a
// CUDA graph replays with new sizes. A map written to global memory must be made visible to the tensormap proxy
// before a thread uses it: fence.proxy.tensormap::generic.acquire on the map's address (PTX ISA "membar /
// fence", .proxy.tensormap::generic), issued by the thread that issues the copies (the producer), once per CTA
// per map: each CTA visits groups in increasing order, so it fences a group's two maps when it first meets the
// group. The scales need no per-group maps: sA [rows, sum(ks)/128]
// and sB [N, sum(ks)/128] (M-major, TMA-aligned) are single maps (tma_sa, and tma_sb as in Dense1D1D); a
// group's K block kb is column k_off_g / 128 + kb of both. D / C: [G][rows][N] at params.d_f32 / c_f32,
// group g at g * rows * ld floats.
//
// Tiles: tile t of the t = 0 .. G * tiles_per_group - 1 numbering belongs to group t / tiles_per_group (the
// same m-block x n-block grid per group, banded as the dense kinds). CTA b takes t = b, b + grid, ..., so its
// groups are non-decreasing and the prefix sum k_off_g is a running sum (no O(G) scan per tile). A tile of a
// group with K_g = 0 has no loads and no MMAs; its epilogue still writes D_g = C_g + 0 (every element of D is
// written by the kernel). Producer and math warps walk the same tiles, hence the same run-time trip counts,
// so the stage ring (pipeline.cuh) stays in step across tiles and groups of different lengths: a tile's
// K blocks start where the previous tile's ended in the ring (PipelineState::for_each_use).
#pragma once
#include "common.cuh"
#include "kinds.cuh"
#include "hal.cuh"
#include "pipeline.cuh"
#include "scheduler.cuh"

namespace dfg {

// Persistent scheduler of the k-grouped kind (same interface as TileScheduler; no clusters). `ks` is the
// device array of the kNumGroups K_g values (ks_tensor). Fills TileInfo::num_k_blocks (K_g / 128) and
// TileInfo::k_block0 (k_off_g / 128, the group's first column of sA / sB). kChecksK: the producer's walk checks
// each K_g (and traps); the math warps walk the same tiles without the check (the producer's trap ends the
// launch for them too).
// NOTES: a trap reachable from the math warps makes ptxas allocate their registers to the launch bound (168 with
// two math warpgroups) instead of setmaxnreg's 232: the 128x128 K loop then had no room for the wave's combined
// scales under the wgmma (policy_1d1d.cuh) and ptxas moved their FMULs after the wait (drain 146 instead of 83).
template <u32 SHAPE_N, u32 BLOCK_M, u32 BLOCK_N, u32 kNumGroups, u32 kBandWidth, bool kChecksK>
struct KGroupedScheduler {
    static constexpr u32 kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);
    static_assert(kBandWidth >= 1, "band width");

    const i32* ks;
    u32 num_rows;
    u32 next_tile;
    u32 stride;
    u32 cur_group;     // the running prefix sum covers groups [0, cur_group)
    u32 cur_k_block0;  // sum(ks[:cur_group]) / 128

    DFG_HOST_DEVICE KGroupedScheduler(u32 num_rows_, const i32* ks_, u32 block_idx, u32 grid_size)
        : ks(ks_), num_rows(num_rows_), next_tile(block_idx), stride(grid_size), cur_group(0), cur_k_block0(0) {}

    // K blocks of group g; with kChecksK, a value that is negative or not a multiple of 128 traps (it cannot
    // match the device-built maps, whose builder traps on it too).
    DFG_HOST_DEVICE u32 k_blocks_of(u32 group) const {
        const i32 k = ks[group];
        if (kChecksK && (k < 0 || k % 128 != 0))
            hal::trap("ks_tensor holds a K that is negative or not a multiple of 128");
        return static_cast<u32>(k) / 128u;
    }

    DFG_HOST_DEVICE bool next(TileInfo& info) {
        const u32 m_blocks = ceil_div(num_rows, BLOCK_M);
        const u32 tiles_per_group = m_blocks * kNumNBlocks;
        if (next_tile >= tiles_per_group * kNumGroups)
            return false;
        const u32 tile = next_tile;
        next_tile += stride;
        const u32 group = tile / tiles_per_group;
        while (cur_group < group) {
            cur_k_block0 += k_blocks_of(cur_group);
            ++cur_group;
        }
        // Band order inside the group (as TileScheduler::rasterize with 1x1 clusters).
        const u32 in_group = tile - group * tiles_per_group;
        const u32 band_tiles = m_blocks * kBandWidth;
        const u32 band = in_group / band_tiles;
        const u32 first_col = band * kBandWidth;
        const u32 cols_in_band = min_of(kBandWidth, kNumNBlocks - first_col);
        const u32 in_band = in_group - band * band_tiles;
        info.m_block = in_band / cols_in_band;
        info.n_block = first_col + in_band % cols_in_band;
        info.group = group;
        info.multicast = false;
        info.num_k_blocks = k_blocks_of(group);
        info.k_block0 = cur_k_block0;
        return true;
    }
};

}  // namespace dfg
