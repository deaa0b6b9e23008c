// MXFP4 weights on the FP8 tensor cores (issue 42): the in-register e2m1 -> e4m3 conversion of a thread's wgmma A
// fragment, its per-row metadata and the per-row promotion. The Python model of every bit is ops/mxfp4.py
// (lookup_table, convert_u32, fragment_a_words / fragment_a_registers); tests/kernels/test_sim_mxfp4.py checks the
// kernel against it.
//
// Shared memory the conversion reads (kernels/mxfp4_gemm.cuh fills it):
//   packed tile  [rows][64] bytes: one 128-K block of a row's e2m1 codes (low nibble first), written by TMA with the
//                64-byte swizzle: the 16-byte chunk c of row r (sub-block c: 32 codes) sits at chunk c ^ ((r / 2) % 4).
//                A thread's loads of one sub-block (rows r and r + 8, four bytes at 4 (q / 2) and 8 + 4 (q / 2)) then
//                hit 16 distinct banks per warp (rows r / 2 differ in their chunk, r % 2 in the bank half).
//   metadata     [rows] x {word0, word1} (u32): word0 byte i = sub-block i's table offset 8 (d_i + 8) (a folded row)
//                or its raw shift d_i (int8, a per-32 row); word1 bits 0-15 = E (int16), bit 16 = the row is per-32,
//                bit 17 = some row of its 64-row wave is (set on all 64 rows, so that the wave's path is uniform over
//                the warpgroup). kernels/mxfp4_gemm.py kernel_metadata writes it.
//   tables       kE4m3Tables: 15 x 8 bytes, e4m3 of E2M1_VALUES[c] x 2^d for d = -8..6 (ops/mxfp4.py lookup_table).
#pragma once
#include "common.cuh"
#include "hal.cuh"
#include "mma.cuh"
#include "policy_swap_ab.cuh"

namespace dfg {
namespace mxfp4 {

constexpr u32 kPackedRowBytes = 64;  // 128 K of e2m1 codes
constexpr u32 kSubBlocks = 4;        // 32-K scale blocks per 128-K block (one k32 wgmma each)
constexpr u32 kNumTables = 15;       // shifts -8..6
constexpr u32 kFoldedShift0Offset = 8 * 8;  // the table offset of shift 0 (a per-32 row's operand)
constexpr u32 kRowPer32 = 1u << 16;
constexpr u32 kWavePer32 = 1u << 17;

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
constexpr u32 kTableBytes = 128;  // kNumTables x 8, rounded

// Two adjacent u32 read as one 8-byte shared load (a row's metadata, a table).
struct alignas(8) U32x2 {
    u32 x, y;
};

// The low `bits` bits of `value` as a signed integer.
DFG_DEVICE i32 sign_extend(u32 value, u32 bits) { return static_cast<i32>(value << (32 - bits)) >> (32 - bits); }

// 2^e as a float for e in [-127, 127] (2^-127 is subnormal; the folded rows' E is >= -126 by construction).
DFG_DEVICE float exp2_int(i32 e) {
    const u32 bits = e >= -126 ? static_cast<u32>(e + 127) << 23 : 0x00400000u;
    union {
        u32 u;
        float f;
    } v{bits};
    return v.f;
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

// One thread's view of a packed tile: the byte offsets of its words (rows r0 = 16 warp + lane / 4 and r0 + 8 of a
// 64-row wave; within sub-block s the four bytes at 4 (q / 2) and 8 + 4 (q / 2), q = lane % 4, swizzled), and the
// prmt selector that keeps the 16-bit half q % 2 of each (ops/mxfp4.py fragment_a_words: K 4q.. and 16 + 4q..).
struct FragmentLoader {
    u32 offset[kSubBlocks];  // row r0's word of sub-block s in wave 0; +8 bytes the high half, +512 row r0 + 8
    u32 selector;

    DFG_DEVICE static FragmentLoader of(u32 warp_in_wg, u32 lane) {
        FragmentLoader f;
        const u32 r0 = 16 * warp_in_wg + lane / 4;
        const u32 swizzle = (r0 / 2) % 4;  // the same for r0 + 8 and r0 + 64
        DFG_UNROLL
        for (u32 s = 0; s < kSubBlocks; ++s)
            f.offset[s] = hal::pin(r0 * kPackedRowBytes + ((s ^ swizzle) * 16) + 4 * ((lane % 4) / 2));
        f.selector = hal::pin(lane % 2 ? 0x7632u : 0x5410u);
        return f;
    }

    // The u32 of packed codes of row r0 (+8: `second`) for sub-block s: the halves at K 4q and 16 + 4q.
    DFG_DEVICE u32 word(const u8* wave_tile, u32 s, bool second) const {
        const u8* p = wave_tile + offset[s] + (second ? 8 * kPackedRowBytes : 0u);
        const u32 lo = *reinterpret_cast<const u32*>(p);
        const u32 hi = *reinterpret_cast<const u32*>(p + 8);
        return hal::prmt(lo, hi, selector);
    }
};

// A row's metadata for one 128-K block (see the top of this file).
struct RowMeta {
    u32 offsets;  // four table offsets (a per-32 row: all the offset of shift 0)
    u32 word0;    // as stored (a per-32 row: its raw shifts)
    u32 word1;
    DFG_DEVICE static RowMeta load(const u8* meta, u32 row) {
        const U32x2 w = *reinterpret_cast<const U32x2*>(meta + 8 * row);
        const bool per32 = (w.y & kRowPer32) != 0;
        return RowMeta{per32 ? kFoldedShift0Offset * 0x01010101u : w.x, w.x, w.y};
    }
    DFG_DEVICE i32 block_exp() const { return sign_extend(word1 & 0xFFFFu, 16); }
    DFG_DEVICE bool wave_per32() const { return (word1 & kWavePer32) != 0; }
    // The scale of the 128-K block's sum (a folded row): 2^E.
    DFG_DEVICE float block_scale() const { return exp2_int(block_exp()); }
    // The scale of sub-block s's 32-K sum: 2^(E + d_s) for a per-32 row, 2^E for a folded one (its operand holds d_s).
    DFG_DEVICE float sub_block_scale(u32 s) const {
        if (word1 & kRowPer32)
            return exp2_int(block_exp() + sign_extend((word0 >> (8 * s)) & 0xFFu, 8));
        return block_scale();
    }
    // The table {t0, t1} of sub-block s.
    DFG_DEVICE void table(const u8* tables, u32 s, u32& t0, u32& t1) const {
        const U32x2 t = *reinterpret_cast<const U32x2*>(tables + ((offsets >> (8 * s)) & 0xFFu));
        t0 = t.x;
        t1 = t.y;
    }
};

// This thread's A fragments of one 64-row wave and 128-K block: a[s] for the k32 wgmma of sub-block s, in the layout
// of WgmmaFragmentA (a[s][0] / a[s][2]: row r0's K 4q.. / 16 + 4q..; a[s][1] / a[s][3]: row r0 + 8's).
DFG_DEVICE void convert_wave(const FragmentLoader& f, const u8* wave_tile, const u8* tables, const RowMeta& m0,
                             const RowMeta& m1, u32 (&a)[kSubBlocks][WgmmaFragmentA::kRegisters]) {
    DFG_UNROLL
    for (u32 s = 0; s < kSubBlocks; ++s) {
        u32 t0, t1;
        m0.table(tables, s, t0, t1);
        convert_word(f.word(wave_tile, s, false), t0, t1, a[s][0], a[s][2]);
        m1.table(tables, s, t0, t1);
        convert_word(f.word(wave_tile, s, true), t0, t1, a[s][1], a[s][3]);
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
