// Tile loads through TMA, with optional 2-CTA multicast.
//
// A multicast tile is split by rows: CTA r of the pair loads rows [r * kRows / 2, (r + 1) * kRows / 2)
// and the copy engine writes them into the same shared-memory offset of both CTAs and signals both
// CTAs' barriers (PTX ISA, cp.async.bulk.tensor .multicast::cluster). Each CTA therefore receives the
// whole tile and expects the same transaction bytes as without multicast. The tensor map's box must
// hold kRows / 2 rows in that case (set by deep_fp8_gemm/kernels/gemm.py).
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "mma.cuh"

namespace dfg {

// `multicast` false (the 2-CTA tail of the scheduler, where the pair computes different tiles): a kMulticast
// tile is loaded whole by this CTA alone, as its two half boxes.
template <u32 kRows, u32 kRowBytes, bool kMulticast>
DFG_DEVICE void tma_load_tile(u8* dst, const TensorMap* map, u64* full_barrier, i32 inner, i32 row0, i32 batch,
                              u32 cluster_rank, bool multicast = true) {
    if constexpr (kMulticast) {
        constexpr u32 kHalfRows = kRows / 2;
        static_assert(kRows % 2 == 0 && (kHalfRows * kRowBytes) % kSwizzle128BAtomBytes == 0,
                      "each multicast half must start on a 1024-byte swizzle-atom boundary");
        if (multicast) {
            hal::tma_load_3d_multicast(dst + cluster_rank * kHalfRows * kRowBytes, map, full_barrier, u16(0x3),
                                       inner, row0 + static_cast<i32>(cluster_rank * kHalfRows), batch);
        } else {
            hal::tma_load_3d(dst, map, full_barrier, inner, row0, batch);
            hal::tma_load_3d(dst + kHalfRows * kRowBytes, map, full_barrier, inner, row0 + static_cast<i32>(kHalfRows),
                             batch);
        }
    } else {
        hal::tma_load_3d(dst, map, full_barrier, inner, row0, batch);
    }
}

}  // namespace dfg
