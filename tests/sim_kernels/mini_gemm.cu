// A warp-specialized FP8 GEMM tile loop in miniature, for the simulator tests: the same structure as the
// library's kernel (TMA producer warpgroup, two math warpgroups, a two-stage full/empty mbarrier ring).
//   CTA b computes the 128 x BLOCK_N tile (b / n_blocks, b % n_blocks) of D = A . B^T, A [m, k], B [n, k] e4m3.
//   warpgroups 0, 1 (threads 0..255): math; warpgroup w owns rows 64 w .. 64 w + 63 of the tile
//   warpgroup 2 (threads 256..383): producer; thread 256 issues the TMA loads
//   full[s]:  arrive count 1 (producer's arrive.expect_tx) + A and B box bytes
//   empty[s]: arrive count 2 (thread 0 of each math warpgroup, after its wgmma_wait)
//   smem: barriers at 0; A stages (128 x 128, 128B swizzle) at 1024 + 16 KiB s; B stages (BLOCK_N x 128) after
// `operand`: 0 e4m3 (k32), 1 bf16 (k16, WgmmaBf16), 2 fp32 read as tf32 (k8, WgmmaTf32); a K block is 128 bytes of
// K per row in every case (128, 64 or 32 elements), each wgmma one 32-byte slice of it.
// Output: each thread's raw accumulator fragment, out[b][warpgroup][thread][BLOCK_N / 2], so the test reads
// it back through CuTe's CLayout_64xN instead of trusting the simulator's fragment layout.
#include <deep_fp8_gemm/hal.cuh>

namespace sim_test {
using namespace dfg;

constexpr u32 kNumThreads = 384;
constexpr u32 kStages = 2;
constexpr u32 kBlockM = 128, kBlockK = 128;
constexpr u32 kTileABytes = kBlockM * kBlockK;

struct Params {
    TensorMap map_a;  // [k, m, 1], box (128, 128, 1), 128B swizzle
    TensorMap map_b;  // [k, n, 1], box (128, BLOCK_N, 1), 128B swizzle
    float* out;
    u32 n_blocks;
    u32 k_blocks;
    u32 block_n;  // one of the instantiated N
    u32 operand;  // 0 e4m3, 1 bf16, 2 tf32
};

// K-major, 128B-swizzled operand (cute/arch/mma_sm90_desc.hpp): 8-row groups 1024 B apart.
DFG_DEVICE u64 make_desc(const void* smem_ptr) {
    const u64 start = (hal::smem_addr(smem_ptr) & 0x3FFFFu) >> 4;
    return start | (u64(1024 >> 4) << 32) | (u64(1) << 62);
}

template <u32 kBlockN>
DFG_DEVICE void run(const Params& p) {
    constexpr u32 kTileBBytes = kBlockN * kBlockK;
    u8* smem = hal::dynamic_smem();
    u64* full = reinterpret_cast<u64*>(smem);
    u64* empty = full + kStages;
    u8* tile_a = smem + 1024;
    u8* tile_b = tile_a + kStages * kTileABytes;
    const u32 m_block = hal::block_idx() / p.n_blocks, n_block = hal::block_idx() % p.n_blocks;

    if (hal::thread_idx() == 0) {
        for (u32 s = 0; s < kStages; ++s) {
            hal::mbar_init(full + s, 1);
            hal::mbar_init(empty + s, 2);
        }
        hal::fence_barrier_init();
    }
    hal::sync_threads();

    if (hal::warp_idx() >= 8) {
        hal::setmaxnreg_dec<40>();
        if (hal::thread_idx() == 256) {
            for (u32 kb = 0; kb < p.k_blocks; ++kb) {
                const u32 s = kb % kStages, phase = (kb / kStages) & 1;
                hal::mbar_wait(empty + s, phase ^ 1);
                hal::mbar_arrive_expect_tx(full + s, kTileABytes + kTileBBytes);
                hal::tma_load_3d(tile_a + s * kTileABytes, &p.map_a, full + s, kb * kBlockK, m_block * kBlockM, 0);
                hal::tma_load_3d(tile_b + s * kTileBBytes, &p.map_b, full + s, kb * kBlockK, n_block * kBlockN, 0);
            }
        }
    } else {
        hal::setmaxnreg_inc<232>();
        const u32 wg = hal::warp_idx() / 4;
        float acc[kBlockN / 2];
        for (u32 kb = 0; kb < p.k_blocks; ++kb) {
            const u32 s = kb % kStages, phase = (kb / kStages) & 1;
            hal::mbar_wait(full + s, phase);
            hal::wgmma_fence();
            for (u32 k = 0; k < kBlockK / 32; ++k) {
                const u64 desc_a = make_desc(tile_a + s * kTileABytes + wg * 64 * kBlockK + k * 32);
                const u64 desc_b = make_desc(tile_b + s * kTileBBytes + k * 32);
                if (p.operand == 1)
                    hal::WgmmaBf16<kBlockN>::mma(desc_a, desc_b, acc, kb > 0 || k > 0);
                else if (p.operand == 2)
                    hal::WgmmaTf32<kBlockN>::mma(desc_a, desc_b, acc, kb > 0 || k > 0);
                else
                    hal::WgmmaFp8<kBlockN>::mma(desc_a, desc_b, acc, kb > 0 || k > 0);
            }
            hal::wgmma_commit();
            hal::wgmma_wait<0>();
            if (hal::thread_idx() % 128 == 0) hal::mbar_arrive(empty + s);
        }
        float* out = p.out + ((hal::block_idx() * 2 + wg) * 128 + hal::thread_idx() % 128) * (kBlockN / 2);
        for (u32 i = 0; i < kBlockN / 2; ++i) hal::fence_operand(acc[i]);  // the register fence after the wait
        for (u32 i = 0; i < kBlockN / 2; ++i) out[i] = acc[i];
    }
}

DFG_DEVICE void body(const Params& p) {
    switch (p.block_n) {
        case 8: return run<8>(p);
        case 24: return run<24>(p);
        case 64: return run<64>(p);
        case 128: return run<128>(p);
        case 256: return run<256>(p);
        default: hal::trap("mini_gemm: block_n not instantiated");
    }
}

}  // namespace sim_test

DFG_DEFINE_KERNEL({{KERNEL_NAME}}, sim_test::kNumThreads, sim_test::Params, sim_test::body)
