// FP8 wgmma operands: shared-memory matrix descriptors for K-major tiles with the 128-byte swizzle.
//
// Tile layout (what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and a 128-byte inner box): row r of a
// tile occupies bytes [128 r, 128 r + 128) before swizzling, 16-byte chunk c of that row is stored at
// chunk c ^ (r % 8). One row holds BLOCK_K = 128 e4m3 values of K. Eight rows form a 1024-byte
// "core matrix group", the unit of the descriptor's stride byte offset.
//
// Descriptor bits (PTX ISA "Matrix Descriptor Format"; cute/arch/mma_sm90_desc.hpp GmmaDescriptor):
//   [0,14)  start address >> 4        [16,30) leading byte offset >> 4 (unused for swizzled K-major)
//   [32,46) stride byte offset >> 4   [49,52) base offset (0: tiles are 1024-byte aligned)
//   [62,64) layout type: 1 = SWIZZLE_128B
// A k32 slice (32 bytes of each row) is selected by advancing the start address by 32 bytes: the
// hardware applies the swizzle to the computed address, as CuTe's DescriptorIterator does.
#pragma once
#include "common.cuh"
#include "hal.cuh"

namespace dfg {

constexpr u32 kSwizzle128BAtomBytes = 1024;  // 8 rows x 128 bytes
constexpr u32 kWgmmaK = 32;                  // K of one e4m3 wgmma

DFG_HOST_DEVICE constexpr u64 make_k_major_sw128_desc(u32 smem_byte_addr) {
    return static_cast<u64>((smem_byte_addr >> 4) & 0x3FFFu)                 // start address
           | (static_cast<u64>(1u) << 16)                                     // LBO: ignored, CuTe writes 1
           | (static_cast<u64>(kSwizzle128BAtomBytes >> 4) << 32)             // SBO: next 8-row group
           | (static_cast<u64>(1u) << 62);                                    // SWIZZLE_128B
}

// K-major tiles whose rows are kRowBytes = 32, 64 or 128 bytes (an e4m3 row of head_dim 32 / 64 / 128: the MQA logits
// kernels), written by TMA with the swizzle of that span (CU_TENSOR_MAP_SWIZZLE_32B / 64B / 128B): Swizzle<log2(kRowBytes
// / 16), 4, 3> on the shared-memory byte address (CuTe's Layout_K_SW32/64/128_Atom), eight rows per core matrix group
// (SBO = 8 * kRowBytes), layout type 3 / 2 / 1 (cute/arch/mma_sm90_desc.hpp: SW32 = 3, SW64 = 2, SW128 = 1).
// kRowBytes = 128 is make_k_major_sw128_desc. The tile must start on an 8 * kRowBytes boundary (base offset 0).
template <u32 kRowBytes>
DFG_HOST_DEVICE constexpr u64 make_k_major_desc(u32 smem_byte_addr) {
    static_assert(kRowBytes == 32 || kRowBytes == 64 || kRowBytes == 128, "swizzled K-major rows: 32, 64 or 128 bytes");
    constexpr u64 kLayoutType = kRowBytes == 128 ? 1u : kRowBytes == 64 ? 2u : 3u;
    return static_cast<u64>((smem_byte_addr >> 4) & 0x3FFFu)    // start address
           | (static_cast<u64>(1u) << 16)                        // LBO: ignored for swizzled K-major
           | (static_cast<u64>((8 * kRowBytes) >> 4) << 32)      // SBO: next 8-row group
           | (kLayoutType << 62);
}

// Descriptor of the k32 slice `k_slice` (0..3) of a K-major SW128 tile that starts at `tile`.
DFG_DEVICE u64 k_slice_desc(const void* tile, u32 k_slice) {
    return make_k_major_sw128_desc(hal::smem_addr(tile) + k_slice * kWgmmaK);
}

// The descriptor of the address `bytes` (a multiple of 16) past `desc`'s start address: only the low word
// changes, by one add. The 14-bit start-address field cannot carry into the next field because a CTA's
// shared window is below 2^18 bytes (228 KB); kernels static_assert their map against kMaxSmemWindow.
constexpr u32 kMaxSmemWindow = 1u << 18;
DFG_HOST_DEVICE constexpr u64 desc_advance(u64 desc, u32 bytes) {
    return (desc & 0xFFFFFFFF00000000ull) | static_cast<u32>(static_cast<u32>(desc) + (bytes >> 4));
}

// `desc` with its low word (start address, leading byte offset) replaced by `lo`.
DFG_HOST_DEVICE constexpr u64 desc_with_low_word(u64 desc, u32 lo) { return (desc & 0xFFFFFFFF00000000ull) | lo; }

// Accumulator fragment of wgmma m64nNk32 (PTX ISA "Register Fragment D", CuTe CLayout_64xN):
// value i of thread t (warp w = t / 32 in the warpgroup, lane l) sits at
//   row = 16 w + l / 4 + 8 ((i / 2) % 2),   col = 8 (i / 4) + 2 (l % 4) + i % 2.
template <u32 N>
struct WgmmaFragment {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "e4m3 wgmma N: a multiple of 8 in [8, 256] (swap-AB: 8, 24)");
    static constexpr u32 kValues = N / 2;   // floats per thread
    static constexpr u32 kColGroups = N / 8;
    DFG_HOST_DEVICE static constexpr u32 row(u32 warp, u32 lane, u32 i) { return 16 * warp + lane / 4 + 8 * ((i / 2) % 2); }
    DFG_HOST_DEVICE static constexpr u32 col(u32 lane, u32 i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }
};

// Register A fragment of wgmma m64nNk32 with e4m3 A (PTX ISA figure "WGMMA .m64nNk32 register fragment layout for
// matrix A"; CuTe ALayout_64x32, "Register source layout for 8-bit value types"): thread t (warp w = t / 32 in the
// warpgroup, lane l) holds four .b32 registers a[0..3] of four e4m3 each; byte b (bits 8b..8b+7) of a[j] is
//   row = 16 w + l / 4 + 8 (j % 2),   k = 4 (l % 4) + b + 16 (j / 2).
// What a kernel that forms A in registers (WgmmaFp8RegA: weights converted to e4m3 on the CUDA cores) must write;
// tests/test_sim_register_a.py checks it against CuTe's layout and the simulator's.
struct WgmmaFragmentA {
    static constexpr u32 kRegisters = 4;
    static constexpr u32 kBytesPerRegister = 4;
    DFG_HOST_DEVICE static constexpr u32 row(u32 warp, u32 lane, u32 j) { return 16 * warp + lane / 4 + 8 * (j % 2); }
    DFG_HOST_DEVICE static constexpr u32 k(u32 lane, u32 j, u32 b) { return 4 * (lane % 4) + b + 16 * (j / 2); }
};

}  // namespace dfg
