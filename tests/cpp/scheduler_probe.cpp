// Host build of the kernel's index math (scheduler + scale-column selection), driven by tests/kernels/test_scheduler.py.
// Template constants come from -DP_<NAME> flags; stdin: rows grid num_layout layout...; stdout: one line per
// (CTA, iteration): "tile <cta> <iter> <m_block> <n_block> <group> <multicast>", then "scale <n_block> <block per 8-col group...>".
#include <deep_fp8_gemm/scales.cuh>
#include <deep_fp8_gemm/scheduler.cuh>

#include <cstdio>
#include <vector>

using namespace dfg;

#ifndef P_SPLIT_K
#define P_SPLIT_K 1u
#endif
#ifndef P_PSUM_ALIGNMENT
#define P_PSUM_ALIGNMENT 128u
#endif

int main() {
    unsigned rows = 0, grid = 0, num_layout = 0;
    if (std::scanf("%u %u %u", &rows, &grid, &num_layout) != 3)
        return 2;
    std::vector<i32> layout(num_layout + 1, 0);
    for (unsigned i = 0; i < num_layout; ++i)
        if (std::scanf("%d", &layout[i]) != 1)
            return 2;
    using Scheduler = TileScheduler<static_cast<GemmKind>(P_KIND), P_SHAPE_N, P_BLOCK_M, P_BLOCK_N, P_NUM_GROUPS,
                                    P_CLUSTER_M, P_CLUSTER_N, P_BAND_WIDTH, P_SPLIT_K, P_PSUM_ALIGNMENT>;
    for (unsigned cta = 0; cta < grid; ++cta) {
        Scheduler scheduler(rows, layout.data(), cta, grid);
        TileInfo tile;
        for (unsigned iter = 0; scheduler.next(tile); ++iter)
            if (P_SPLIT_K > 1)  // split-K: "split <cta> <iter> <m_block> <n_block> <split>" instead
                std::printf("split %u %u %u %u %u\n", cta, iter, tile.m_block, tile.n_block, tile.split);
            else
                std::printf("tile %u %u %u %u %u %d\n", cta, iter, tile.m_block, tile.n_block, tile.group,
                            tile.multicast ? 1 : 0);
    }
    constexpr u32 kScaleBlocks = ceil_div(P_SHAPE_N, 128u);
    for (u32 nb = 0; nb < Scheduler::kNumNBlocks; ++nb) {
        const auto cols = ScaleColumns<P_BLOCK_N, kScaleBlocks>::of(nb * P_BLOCK_N);
        std::printf("scale %u", nb);
        for (u32 j = 0; j < P_BLOCK_N / 8; ++j)
            std::printf(" %u", cols.block_of_group(j));
        std::printf("\n");
    }
    return 0;
}
