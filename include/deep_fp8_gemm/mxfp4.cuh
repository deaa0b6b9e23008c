// MXFP4 weights on the FP8 tensor cores (issue 42): the in-register e2m1 -> e4m3 conversion of a thread's wgmma A
// fragment, its per-row metadata and the per-row promotion. The Python model of every bit is ops/mxfp4.py
// (PreparedMxfp4, lookup_table, convert_u32, fragment_a_words / fragment_a_registers); tests/kernels/test_sim_mxfp4.py
// checks the kernel against it.
//
// Shared memory the conversion reads, per 64-row wave and 128-K block (the prepared weights' stored form, loaded by
// TMA unchanged; kernels/mxfp4_gemm.cuh):
//   packed tile  4096 bytes in fragment order: byte h 2048 + 16 t + 4 j of thread t = 32 warp + lane is its word j of
//                half h: sub-block 2h + j / 2, row r0 + 8 (j % 2) (r0 = 16 warp + lane / 4), low 16 bits the codes of
//                K 4q..4q+3 of that sub-block, high 16 bits those of K 16+4q.. (q = lane % 4). A thread's eight
//                words are two 16-byte loads, a warp's 512 contiguous bytes each (no bank conflict).
//   metadata     272 bytes: 64 x u32 in pair order (pair p = 8 warp + lane / 4 holds rows r0, r0 + 8: one 8-byte
//                load per thread, a broadcast within the quad), then the wave's per-32 flag (u32) and 12 zero bytes.
//                A folded row's word: bits 0-7 the pair-table index 15 (d_0 + 8) + (d_1 + 8) of sub-blocks 0 and 1,
//                bits 8-15 that of sub-blocks 2 and 3, bits 23-30 E + 127 (the float bits of 2^E under 0x7F800000).
//                A per-32 wave (some row of it spans more than 14 binades in this 128-K block): byte s of every
//                row's word is the biased exponent e_s + 127 of sub-block s (operand e2m1 x 1).
//   pair tables  kNumShifts^2 x 16 bytes: entry 15 (d_a + 8) + (d_b + 8) = {table(d_a), table(d_b)}, table(d) the
//                e4m3 bytes of E2M1_VALUES[c] x 2^d (kE4m3Tables, ops/mxfp4.py lookup_table): one 16-byte load gives
//                a row the tables of two sub-blocks.
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "mma.cuh"
#include "policy_swap_ab.cuh"

namespace dfg {
namespace mxfp4 {

constexpr u32 kWaveTileBytes = 4096;  // 64 rows x 128 K of e2m1 codes
constexpr u32 kWaveMetaBytes = 272;   // 64 x u32 + the per-32 flag + padding
constexpr u32 kMetaFlagOffset = 256;
constexpr u32 kSubBlocks = 4;         // 32-K scale blocks per 128-K block (one k32 wgmma each)
constexpr u32 kNumTables = 15;        // shifts -8..6
constexpr u32 kShift0 = 8;            // the table of shift 0 (a per-32 wave's operand)

// e4m3 bytes of the e2m1 magnitudes (0, 0.5, 1, 1.5 | 2, 3, 4, 6) x 2^d, d = -8..6, as the two prmt sources: the
// subnormal rows (d <= -6) are why the fold is a lookup, not an exponent add. Equal to ops/mxfp4.py lookup_table(d)
// (tests/kernels/test_sim_mxfp4.py reads this table from the header and compares).
constexpr u32 kE4m3Tables[kNumTables][2] = {
    {0x03020100u, 0x0c080604u},  // d = -8
    {0x06040200u, 0x14100c08u},  // d = -7
    {0x0c080400u, 0x1c181410u},  // d = -6
    {0x14100800u, 0x24201c18u},  // d = -5
    {0x1c181000u, 0x2c282420u},  // d = -4
    {0x24201800u, 0x34302c28u},  // d = -3
    {0x2c282000u, 0x3c383430u},  // d = -2
    {0x34302800u, 0x44403c38u},  // d = -1
    {0x3c383000u, 0x4c484440u},  // d = 0
    {0x44403800u, 0x54504c48u},  // d = 1
    {0x4c484000u, 0x5c585450u},  // d = 2
    {0x54504800u, 0x64605c58u},  // d = 3
    {0x5c585000u, 0x6c686460u},  // d = 4
    {0x64605800u, 0x74706c68u},  // d = 5
    {0x6c686000u, 0x7c787470u},  // d = 6
};
constexpr u32 kPairTableBytes = kNumTables * kNumTables * 16;  // 3600

// Word i (0..3) of pair-table entry `entry` (what the kernel's threads store into shared memory at start).
DFG_HOST_DEVICE constexpr u32 pair_table_word(u32 entry, u32 i) {
    return kE4m3Tables[i < 2 ? entry / kNumTables : entry % kNumTables][i % 2];
}

// Two / four adjacent u32 read as one 8- / 16-byte shared load.
struct alignas(8) U32x2 {
    u32 x, y;
};
struct alignas(16) U32x4 {
    u32 x, y, z, w;
};

// The float with bit pattern `bits`.
DFG_DEVICE float bits_float(u32 bits) {
    union {
        u32 u;
        float f;
    } v{bits};
    return v.f;
}

// 2^(e - 127) for the biased exponent in byte `byte` of `word` (1..254: a normal float): the byte moved to bits
// 23..30 by a prmt to byte 3 and a shift (2 ALU).
DFG_DEVICE float exp2_biased_byte(u32 word, u32 byte) {
    return bits_float(hal::prmt(word, 0u, 0x0444u | (byte << 12)) >> 1);
}

// Eight e2m1 codes (a u32 of packed nibbles, low nibble first) -> eight e4m3 bytes in K order, through the table
// {t0, t1} of the row's sub-block: lo gets the low half's four codes, hi the high half's. 9 ALU instructions
// (ops/mxfp4.py CONVERT_OPS_PER_U32): magnitudes by a prmt over the codes' low three bits; each code's sign (bit 3
// of its nibble) to bit 7 of its byte by a prmt over {raw, raw << 4}, OR'd into the magnitude (whose bit 7 is 0).
DFG_DEVICE void convert_word(u32 raw, u32 t0, u32 t1, u32& lo, u32& hi) {
    const u32 mags = raw & 0x77777777u;
    const u32 shifted = raw << 4;
    lo = hal::prmt(t0, t1, mags) | (hal::prmt(raw, shifted, 0x1504u) & 0x80808080u);
    hi = hal::prmt(t0, t1, mags >> 16) | (hal::prmt(raw, shifted, 0x3726u) & 0x80808080u);
}

// This thread's eight words of one wave's packed tile (two 16-byte loads): w[2 s + j] = sub-block s, row r0 + 8 j.
DFG_DEVICE void load_fragment(const u8* wave_tile, u32 thread, u32 (&w)[2 * kSubBlocks]) {
    const U32x4 lo = *reinterpret_cast<const U32x4*>(wave_tile + 16 * thread);
    const U32x4 hi = *reinterpret_cast<const U32x4*>(wave_tile + 2048 + 16 * thread);
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w;
    w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
}

// A thread's two rows' metadata for one wave and 128-K block (see the top of this file).
struct WaveMeta {
    u32 row[2];  // rows r0, r0 + 8
    DFG_DEVICE static WaveMeta load(const u8* wave_meta, u32 warp, u32 lane) {
        const U32x2 w = *reinterpret_cast<const U32x2*>(wave_meta + 8 * (8 * warp + lane / 4));
        return WaveMeta{{w.x, w.y}};
    }
    // The wave's path: uniform over its 64 rows, so over the warpgroup (one broadcast load).
    DFG_DEVICE static bool per32(const u8* wave_meta) {
        return *reinterpret_cast<const u32*>(wave_meta + kMetaFlagOffset) != 0;
    }
    // A folded row's block scale 2^E: its word's bits 23-30 are the float's exponent field (1 LOP).
    DFG_DEVICE float block_scale(u32 j) const { return bits_float(row[j] & 0x7F800000u); }
    // A per-32 row's sub-block scale 2^e_s.
    DFG_DEVICE float sub_block_scale(u32 j, u32 s) const { return exp2_biased_byte(row[j], s); }
    // A folded row's tables of sub-blocks 2h and 2h + 1: pair-table entry (byte h of its word), one 16-byte load.
    DFG_DEVICE U32x4 tables(const u8* pair_tables, u32 j, u32 h) const {
        const u32 entry = hal::prmt(row[j], 0u, 0x4440u | h);  // byte h, zero-extended (1 ALU)
        return *reinterpret_cast<const U32x4*>(pair_tables + 16 * entry);
    }
};

// This thread's A fragments of one 64-row wave and 128-K block: a[s] for the k32 wgmma of sub-block s, in the layout
// of WgmmaFragmentA (a[s][0] / a[s][2]: row r0's K 4q.. / 16 + 4q..; a[s][1] / a[s][3]: row r0 + 8's). Folded: each
// (row, sub-block) through its own table; per-32 (`unscaled`): every word through the shift-0 table, compile-time.
DFG_DEVICE void convert_wave(const u32 (&w)[2 * kSubBlocks], const u8* pair_tables, const WaveMeta& m, bool unscaled,
                             u32 (&a)[kSubBlocks][WgmmaFragmentA::kRegisters]) {
    DFG_UNROLL
    for (u32 h = 0; h < 2; ++h)
        DFG_UNROLL
        for (u32 j = 0; j < 2; ++j) {
            U32x4 t{kE4m3Tables[kShift0][0], kE4m3Tables[kShift0][1], kE4m3Tables[kShift0][0],
                    kE4m3Tables[kShift0][1]};
            if (!unscaled)
                t = m.tables(pair_tables, j, h);
            convert_word(w[4 * h + j], t.x, t.y, a[2 * h][j], a[2 * h][j + 2]);
            convert_word(w[4 * h + 2 + j], t.z, t.w, a[2 * h + 1][j], a[2 * h + 1][j + 2]);
        }
}

// acc += scratch * row_scale * sA[column] for one m64 wave of the transposed tile (fragment of m64nBLOCK_M: values
// 4j + {0, 1} are row r0, 4j + {2, 3} row r0 + 8, columns 8j + 2 (lane % 4) + {0, 1}; sA as policy_swap_ab.cuh's).
// BLOCK_M / 2 FMUL and BLOCK_M / 2 FFMA.
template <u32 BLOCK_M, u32 kValues>
DFG_DEVICE void promote_rows(float (&acc)[kValues], const float (&scratch)[kValues], float row0, float row1,
                             const SwapAbColumnScales<BLOCK_M>& sa) {
    static_assert(kValues == BLOCK_M / 2, "fragment of m64nBLOCK_M");
    DFG_UNROLL
    for (u32 j = 0; j < BLOCK_M / 8; ++j) {
        acc[4 * j + 0] = hal::fma_rn(scratch[4 * j + 0], row0 * sa.pair[j].x, acc[4 * j + 0]);
        acc[4 * j + 1] = hal::fma_rn(scratch[4 * j + 1], row0 * sa.pair[j].y, acc[4 * j + 1]);
        acc[4 * j + 2] = hal::fma_rn(scratch[4 * j + 2], row1 * sa.pair[j].x, acc[4 * j + 2]);
        acc[4 * j + 3] = hal::fma_rn(scratch[4 * j + 3], row1 * sa.pair[j].y, acc[4 * j + 3]);
    }
}

}  // namespace mxfp4
}  // namespace dfg
