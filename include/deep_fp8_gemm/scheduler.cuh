// Persistent tile scheduler for the dense and grouped GEMM kinds.
//
// Plain C++ over integers (plus reads of the grouped layout), so the same code runs on the GPU, in
// the CPU simulator and in the host-side tests that check every output tile is visited exactly once.
//
// Vocabulary
//   block        BLOCK_M x BLOCK_N output tile, computed by one CTA.
//   cluster tile kClusterM x kClusterN blocks computed by the kClusterM * kClusterN (1 or 2) CTAs of a
//                cluster. kClusterN == 2: the two CTAs share the m-block, so A is multicast;
//                kClusterM == 2: they share the n-block, so B is multicast.
//   band         kBandWidth consecutive cluster-tile columns; tiles are numbered band by band and,
//                inside a band, row-major, so the CTAs of one wave touch few distinct A rows and B
//                columns at a time (L2 reuse). Same idea as the reference design's 16-block groups.
//
// Every CTA of a cluster walks the same sequence of cluster tiles (cluster c takes c, c + C, c + 2C,
// ... for C clusters), so both CTAs always agree on which stages they fill and release.
//
// Kinds
//   Dense              rows = m. With kClusterM == 2 and an odd number of m-blocks, the last m-block row
//                      is the "tail": it has no partner row to share B with, so its tiles are not
//                      multicast (TileInfo::multicast false, each CTA loads its whole B tile itself) and
//                      the pair takes two n-blocks of it at a time (tail cluster tile j: n-blocks 2j and
//                      2j + 1), numbered after all full cluster tiles. Only when the n-block count is odd
//                      as well, the second CTA of the last tail tile gets n-block kNumNBlocks, past N
//                      (B zero-filled, stores skipped): one phantom tile instead of a whole row of them.
//                      The CTAs of a cluster still walk the same number of tiles, hence of stage uses,
//                      which the cluster's empty barriers need (every math warp arrives on both CTAs).
//   GroupedContiguous  rows = m_sum, grouped_layout = m_indices[m_sum]. Expert segments are padded to
//                      128 rows (>= BLOCK_M), so a block belongs to one expert; its expert is read
//                      from its first and last rows. A block whose first and last rows are both
//                      padding (-1) is skipped: no loads, no MMAs, no store (rows left untouched).
//                      Multicast only on A (kClusterM == 1): both CTAs share the m-block, so they
//                      agree on skipping.
//   GroupedMasked      rows per group = min(masked_m[g], m_max), grouped_layout = masked_m[G] on the
//                      device. Groups are walked in order; a group with no rows has no tiles.
//   GroupedContiguousPsum
//                      rows = m_sum, grouped_layout = ends[G] (the "psum" layout DeepEP hands over):
//                      group g owns rows [start_g, ends[g]) with start_0 = 0 and
//                      start_g = round_up(ends[g-1], kGroupAlignment) (the layout's alignment, 64 or
//                      128); rows outside every group are padding. Tiles
//                      are enumerated as for GroupedContiguous; a block's group is the first g with
//                      ends[g] > its first row (binary search over the kNumGroups ends, ends
//                      non-decreasing), and the block is padding-only, hence skipped, when that g does
//                      not exist or starts after the block's first row (possible only when BLOCK_M <
//                      kGroupAlignment). Group starts are multiples of kGroupAlignment, a multiple of
//                      BLOCK_M, so a block never straddles two groups. Nothing is read on the host.
#pragma once
#include "common.cuh"
#include "kinds.cuh"

namespace dfg {

struct TileInfo {
    u32 m_block;     // block row within the group (masked) or within the whole A (dense/contiguous)
    u32 n_block;     // block column
    u32 group;       // expert / group index: selects B, sB and (masked) the A / D batch; 0 for dense
    bool multicast;  // the cluster shares (multicasts) this tile's A or B; false in the 2-CTA tail (above)
    u32 split = 0;   // split-K: which kKBlocksPerSplit-block slice of K (0 without split-K)
    u32 num_k_blocks;  // k-grouped kind only (policy_k_grouped.cuh): K blocks of the group, K_g / 128
    u32 k_block0;      // k-grouped kind only: the group's first K block of the concatenated K axis
};

// kGroupAlignment (the psum kind only): the layout's group-start alignment, 64 or 128 rows (the contiguous
// alignment the caller set; config.GemmConfig.psum_alignment), a multiple of BLOCK_M.
template <GemmKind kKind, u32 SHAPE_N, u32 BLOCK_M, u32 BLOCK_N, u32 kNumGroups, u32 kClusterM, u32 kClusterN,
          u32 kBandWidth, u32 kSplitK = 1, u32 kGroupAlignment = 128>
struct TileScheduler {
    static constexpr u32 kClusterSize = kClusterM * kClusterN;
    static constexpr u32 kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);
    static_assert(kClusterSize == 1 || kClusterSize == 2, "clusters of 1 or 2 CTAs");
    static_assert(kNumNBlocks % kClusterN == 0, "multicast on A pairs n-blocks: the n-block count must be even");
    static_assert(kKind == GemmKind::Dense || kClusterM == 1,
                  "grouped kinds multicast only on A, so a cluster never straddles two experts");
    static_assert(kBandWidth >= 1, "band width");
    // Split-K (dense, no clusters): work item w is split w % kSplitK of tile w / kSplitK, so the splits of a
    // tile run on consecutive CTAs, at the same time (split_k.cuh).
    static_assert(kSplitK == 1 || (kKind == GemmKind::Dense && kClusterSize == 1), "split-K: dense, 1-CTA clusters");
    static constexpr u32 kNumClusterCols = kNumNBlocks / kClusterN;
    static_assert(kKind != GemmKind::GroupedContiguousPsum ||
                      ((kGroupAlignment == 64 || kGroupAlignment == 128) && kGroupAlignment % BLOCK_M == 0),
                  "psum group starts: 64 or 128 rows, a multiple of BLOCK_M (so no block straddles two groups)");

    const i32* grouped_layout;
    u32 num_rows;           // dense: m; contiguous: m_sum; masked: m_max
    u32 cluster_rank;       // this CTA's rank in its cluster
    u32 next_cluster_tile;  // next cluster-tile index this cluster takes
    u32 cluster_stride;     // number of clusters in the grid

    // Masked kind: the group the cursor is in, the index of its first cluster tile, its tile rows.
    u32 cur_group;
    u32 cur_group_first_tile;
    u32 cur_group_rows;

    DFG_HOST_DEVICE TileScheduler(u32 num_rows_, const i32* grouped_layout_, u32 block_idx, u32 grid_size)
        : grouped_layout(grouped_layout_),
          num_rows(num_rows_),
          cluster_rank(block_idx % kClusterSize),
          next_cluster_tile(block_idx / kClusterSize),
          cluster_stride(grid_size / kClusterSize),
          cur_group(0),
          cur_group_first_tile(0),
          cur_group_rows(0) {
        if constexpr (kKind == GemmKind::GroupedMasked)
            cur_group_rows = cluster_rows_of_group(0);
    }

    // Cluster-tile rows of a row extent (m-blocks rounded up to whole cluster rows).
    static DFG_HOST_DEVICE u32 cluster_rows(u32 rows) { return ceil_div(ceil_div(rows, BLOCK_M), kClusterM); }

    DFG_HOST_DEVICE u32 cluster_rows_of_group(u32 group) const {
        const i32 valid = grouped_layout[group];
        const u32 rows = valid <= 0 ? 0u : min_of(static_cast<u32>(valid), num_rows);
        return cluster_rows(rows);
    }

    // Maps a cluster-tile index inside a (rows x kNumClusterCols) grid to this CTA's block.
    DFG_HOST_DEVICE void rasterize(u32 tile, u32 rows, TileInfo& info) const {
        const u32 band_tiles = rows * kBandWidth;
        const u32 band = tile / band_tiles;
        const u32 first_col = band * kBandWidth;
        const u32 cols_in_band = min_of(kBandWidth, kNumClusterCols - first_col);
        const u32 in_band = tile - band * band_tiles;
        const u32 cluster_row = in_band / cols_in_band;
        const u32 cluster_col = first_col + in_band % cols_in_band;
        info.m_block = cluster_row * kClusterM + (kClusterM == 2 ? cluster_rank : 0u);
        info.n_block = cluster_col * kClusterN + (kClusterN == 2 ? cluster_rank : 0u);
        info.multicast = kClusterSize > 1;
    }

    // kClusterM == 2 with an odd m-block count: full cluster-tile rows (pairs of m-blocks) and tail cluster
    // tiles (two n-blocks of the last m-block each, see "Dense" above); otherwise no tail.
    DFG_HOST_DEVICE u32 full_cluster_rows() const {
        return kClusterM == 2 ? ceil_div(num_rows, BLOCK_M) / 2 : cluster_rows(num_rows);
    }
    DFG_HOST_DEVICE u32 tail_cluster_tiles() const {
        return kClusterM == 2 && ceil_div(num_rows, BLOCK_M) % 2 ? ceil_div(kNumNBlocks, 2u) : 0u;
    }

    // Expert of a contiguous-layout block, or -1 when the block holds only padding rows.
    DFG_HOST_DEVICE i32 contiguous_block_expert(u32 m_block) const {
        const u32 first = m_block * BLOCK_M;
        const u32 last = min_of(first + BLOCK_M, num_rows) - 1;
        const i32 a = grouped_layout[first];
        const i32 b = grouped_layout[last];
        return a > b ? a : b;
    }

    // Group of a psum-layout block, or -1 when the block holds only padding rows (see "Kinds").
    DFG_HOST_DEVICE i32 psum_block_group(u32 m_block) const {
        const i32 first = static_cast<i32>(m_block * BLOCK_M);
        u32 lo = 0, hi = kNumGroups;  // smallest g with ends[g] > first, in [lo, hi]
        while (lo < hi) {
            const u32 mid = (lo + hi) / 2;
            if (grouped_layout[mid] > first)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo == kNumGroups)
            return -1;  // past the last group's end
        const i32 start = lo == 0 ? 0 : static_cast<i32>(round_up(static_cast<u32>(max_of(grouped_layout[lo - 1], 0)),
                                                                    kGroupAlignment));
        return start <= first ? static_cast<i32>(lo) : -1;
    }

    // Next block of this CTA; false when the CTA's share of the work is done.
    DFG_HOST_DEVICE bool next(TileInfo& info) {
        if constexpr (kKind == GemmKind::GroupedMasked) {
            while (true) {
                const u32 tile = next_cluster_tile;
                while (cur_group < kNumGroups && tile >= cur_group_first_tile + cur_group_rows * kNumClusterCols) {
                    cur_group_first_tile += cur_group_rows * kNumClusterCols;
                    ++cur_group;
                    cur_group_rows = cur_group < kNumGroups ? cluster_rows_of_group(cur_group) : 0u;
                }
                if (cur_group >= kNumGroups)
                    return false;
                next_cluster_tile += cluster_stride;
                rasterize(tile - cur_group_first_tile, cur_group_rows, info);
                info.group = cur_group;
                return true;
            }
        } else {
            const u32 rows = full_cluster_rows();
            const u32 full_tiles = rows * kNumClusterCols;
            const u32 num_tiles = (full_tiles + tail_cluster_tiles()) * kSplitK;
            while (next_cluster_tile < num_tiles) {
                const u32 tile = next_cluster_tile / kSplitK;
                info.split = next_cluster_tile % kSplitK;
                next_cluster_tile += cluster_stride;
                if (tile < full_tiles) {
                    rasterize(tile, rows, info);
                } else {  // the tail: no multicast, two n-blocks of the last m-block per cluster tile
                    info.m_block = 2 * rows;
                    info.n_block = 2 * (tile - full_tiles) + cluster_rank;
                    info.multicast = false;
                }
                info.group = 0;
                if constexpr (kKind == GemmKind::GroupedContiguous) {
                    const i32 expert = contiguous_block_expert(info.m_block);
                    if (expert < 0)
                        continue;  // padding-only block: no loads, no MMAs
                    info.group = static_cast<u32>(expert);
                }
                if constexpr (kKind == GemmKind::GroupedContiguousPsum) {
                    const i32 group = psum_block_group(info.m_block);
                    if (group < 0)
                        continue;  // padding-only block: no loads, no MMAs
                    info.group = static_cast<u32>(group);
                }
                return true;
            }
            return false;
        }
    }
};

}  // namespace dfg
