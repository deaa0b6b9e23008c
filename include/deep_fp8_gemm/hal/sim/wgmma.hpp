// deep_fp8_gemm CPU simulator: wgmma descriptor decoding and execution.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- wgmma descriptors
// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"; CuTe GmmaDescriptor in
// cute/arch/mma_sm90_desc.hpp): start address >> 4 in bits [0,14), leading byte offset >> 4 in [16,30),
// stride byte offset >> 4 in [32,46), base offset in [49,52), layout type in [62,64) (0 interleave,
// 1 128B, 2 64B, 3 32B swizzle); the other bits are reserved.
constexpr u64 kDescReservedBits = (3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52);

// Byte offsets of the `rows` x 32 e4m3 operand, K-major (FP8 wgmma reads both operands K-major). Following
// make_gmma_desc<Major::K>'s canonical layouts (mma_traits_sm90_gmma.hpp) in bytes (T = 16 fp8):
//   INTERLEAVE: ((8,m),(16,2)):((16,SBO),(1,LBO))       core matrices 8 rows x 16 B
//   SW32/64/128: ((8,m),(16,2)):((W*16,SBO),(1,16))      rows of W*16 B, 8-row groups SBO apart
// then the swizzle Swizzle<log2 W,4,3> is applied to the shared-memory address itself, so a k32 slice at
// start + 32*j of a 128-byte swizzled row reads what TMA wrote for those K elements.
// MN-major (bf16 only; PTX imm-trans-a / -b = 1), make_gmma_desc<Major::MN>'s canonical layouts in 16-bit elements
// (T = 8 per 16 bytes), W = 1 (INTERLEAVE), 2, 4, 8 (SW32/64/128):
//   INTERLEAVE: ((T,1,m),(8,k)):((1,T,SBO),(T,LBO))   SWxx: ((T,W,m),(8,k)):((1,T,LBO),(W T,SBO))
// i.e. element (mn, kk) of the slice at byte 2 (mn % 8W) + 16 W (kk % 8) + (mn / 8W) * (LBO, or SBO for INTERLEAVE)
// + (kk / 8) * (SBO, or LBO), then the same swizzle. The addresses come out in the K-major order below (row * 32 +
// byte of the 32-byte k-slice), so execution does not care which major the operand had.
inline void decode_operand(u64 desc, u32 rows, std::vector<u32>& addr, u32& lo, u32& hi, const char* which,
                           bool mn_major = false) {
    if (desc & kDescReservedBits)
        fail(format("wgmma: descriptor %s %#llx sets reserved bits %#llx", which, static_cast<unsigned long long>(desc),
                    static_cast<unsigned long long>(desc & kDescReservedBits)));
    const u32 start = u32(desc & 0x3FFF) << 4;
    const u32 lbo = u32((desc >> 16) & 0x3FFF) << 4;
    const u32 sbo = u32((desc >> 32) & 0x3FFF) << 4;
    const u32 base_offset = u32((desc >> 49) & 7);
    const u32 layout = u32(desc >> 62);
    if (base_offset != 0)
        fail(format("wgmma: descriptor %s %#llx has base offset %u; only 0 (pattern-aligned tiles) is modelled",
                    which, static_cast<unsigned long long>(desc), base_offset));
    const u32 bits = layout == 0 ? 0 : 4 - layout;  // 1 -> 3 (128B), 2 -> 2 (64B), 3 -> 1 (32B)
    const u32 row_pitch = 16u << bits;
    const u32 smem_bytes = L().cfg.dynamic_smem_bytes;
    addr.resize(size_t(rows) * 32);
    lo = ~0u;
    hi = 0;
    for (u32 r = 0; r < rows; ++r)
        for (u32 k = 0; k < 32; ++k) {
            u32 a = start;
            if (mn_major) {  // 16-bit elements: byte k of the slice is byte k % 2 of element k / 2
                const u32 w = 1u << bits, e = k / 2, mn_block = r / (8 * w), k_block = e / 8;
                a += 2 * (r % (8 * w)) + 16 * w * (e % 8) + k % 2;
                a += layout == 0 ? mn_block * sbo + k_block * lbo : mn_block * lbo + k_block * sbo;
            } else {
                a += (r / 8) * sbo;
                a += layout == 0 ? (r % 8) * 16 + (k / 16) * lbo + k % 16 : (r % 8) * row_pitch + k;
            }
            a = swizzle(a, bits);
            if (a >= smem_bytes)
                fail(format("wgmma: descriptor %s %#llx reads element (row %u, k %u) at smem+%#x, outside the %#x "
                            "bytes of shared memory",
                            which, static_cast<unsigned long long>(desc), r, k, a, smem_bytes));
            addr[r * 32 + k] = a;
            lo = a < lo ? a : lo;
            hi = a + 1 > hi ? a + 1 : hi;
        }
}

// Accumulator fragment of .m64nNk32 with f32 D (PTX ISA "Register Fragments", figure "WGMMA .m64nNk32
// register fragment layout for accumulator matrix D"; CuTe CLayout_64xN): thread t = 32 w + l holds in
// value i row 16 w + l/4 + 8 ((i/2) % 2), column 8 (i/4) + 2 (l%4) + i%2.
inline u32 frag_row(u32 t, u32 i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
inline u32 frag_col(u32 t, u32 i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }

// Register A fragment of .m64nNk32 with e4m3 A (PTX ISA "Register Fragments", figure "WGMMA .m64nNk32 register
// fragment layout for matrix A"; CuTe ALayout_64x32 in cute/atom/mma_traits_sm90_gmma.hpp, "Register source layout
// for 8-bit value types": ((4,8,4),(4,2,2)):((256,1,16),(64,8,1024)) over the column-major 64 x 32 tile): thread
// t = 32 w + l holds four .b32 registers a0..a3 of four e4m3 each, byte b of register j (value 4 j + b) being
// row 16 w + l/4 + 8 (j % 2), k 4 (l % 4) + b + 16 (j / 2). tests/test_sim_register_a.py evaluates CuTe's layout
// with pycute against these and against dfg::WgmmaFragmentA (mma.cuh), which kernels write their fragments with.
inline u32 a_frag_row(u32 t, u32 j) { return 16 * (t / 32) + (t % 32) / 4 + 8 * (j % 2); }
inline u32 a_frag_k(u32 t, u32 j, u32 b) { return 4 * (t % 4) + b + 16 * (j / 2); }

// PTX ISA "wgmma.mma_async": the operands in shared memory are read asynchronously any time between the issue
// and the wgmma.wait_group that retires the group; they must not change in that window.
inline void check_read_window(const WgmmaOp& op, const u8* smem) {
    const size_t na = op.addr_a.size();
    for (size_t i = 0; i < op.snapshot.size(); ++i) {
        const u32 a = i < na ? op.addr_a[i] : op.addr_b[i - na];
        if (smem[a] != op.snapshot[i])
            fail(format("race: shared memory smem+%#x (operand %s) of a wgmma issued by thread %u at %s changed before "
                        "the wgmma.wait_group that retires it (the operands are read anywhere in that window)",
                        a, i < na ? "A" : "B", op.issue_tid, site_str(op.issue_site).c_str()));
    }
}

// A BF16 (k16) or TF32 (k8) wgmma: the 32 bytes of K per row that decode_operand found, read as 16 bf16 or 8 tf32
// (little-endian, element k at bytes [w k, w k + w)), through mma_wide_slice (numerics.hpp) or, with the exact
// flag, a plain fp32 dot product.
inline void execute_wide(const WgmmaOp& op, const u8* smem) {
    const u32 n = op.n, width = op.type == kWgmmaBf16 ? 2 : 4, k = 32 / width;
    const u32 group = op.type == kWgmmaBf16 ? kBf16Group : kTf32Group;
    std::vector<float>& s = L().scratch;
    s.resize(size_t(64 + n) * k);
    for (u32 row = 0; row < 64 + n; ++row)
        for (u32 e = 0; e < k; ++e) {
            u32 bits = 0;
            for (u32 byte = 0; byte < width; ++byte) {
                const u32 i = row * 32 + e * width + byte;
                bits |= u32(row < 64 ? smem[op.addr_a[i]] : smem[op.addr_b[i - 64 * 32]]) << (8 * byte);
            }
            s[row * k + e] = width == 2 ? bf16_bits_to_float(u16(bits)) : tf32_bits_to_float(bits);
        }
    const bool exact = L().cfg.flags & kFlagExactMma;
    for (u32 t = 0; t < kWarpgroupThreads; ++t) {
        float* d = op.frag[t];
        for (u32 i = 0; i < n / 2; ++i) {
            const float* ar = &s[frag_row(t, i) * k];
            const float* br = &s[(64 + frag_col(t, i)) * k];
            const float c = op.scale_d ? d[i] : 0.f;
            if (exact) {
                float dot = 0.f;
                for (u32 e = 0; e < k; ++e) dot += ar[e] * br[e];
                d[i] = c + dot;
            } else {
                d[i] = mma_wide_slice(ar, br, k, group, c);
            }
        }
    }
}

inline void execute(const WgmmaOp& op, const u8* smem) {
    if (op.type != kWgmmaE4m3) return execute_wide(op, smem);
    const u32 n = op.n;
    std::vector<float>& s = L().scratch;
    s.resize(size_t(64 + n) * 32);
    float* a = s.data();
    float* b = a + 64 * 32;
    const bool exact = L().cfg.flags & kFlagExactMma;
    // A's codes: from shared memory through the descriptor, or gathered from the threads' register fragments. Both
    // then go through exactly the same arithmetic (numerics.hpp: the model's assumption that the source of A does
    // not change the per-k-group accumulation).
    const auto code_a = [&](u32 i) { return op.reg_a ? op.a_codes[i] : smem[op.addr_a[i]]; };
    for (u32 i = 0; i < 64 * 32; ++i) a[i] = g_e4m3.value[code_a(i)];
    for (u32 i = 0; i < n * 32; ++i) b[i] = g_e4m3.value[smem[op.addr_b[i]]];
    // The tensor-core model works on the e4m3 values as integers; rows with a NaN code take the float path.
    std::vector<u32>& mag = L().scratch_mag;
    std::vector<u32>& neg = L().scratch_neg;
    std::vector<u8>& nan_row = L().scratch_nan;
    if (!exact) {
        mag.resize(size_t(64 + n) * 32);
        neg.resize(size_t(64 + n) * 32);
        nan_row.assign(64 + n, 0);
        for (u32 i = 0; i < (64 + n) * 32; ++i) {
            const u8 code = i < 64 * 32 ? code_a(i) : smem[op.addr_b[i - 64 * 32]];
            mag[i] = g_e4m3_fixed.mag[code];
            neg[i] = g_e4m3_fixed.neg[code];
            nan_row[i / 32] |= g_e4m3_fixed.nan[code];
        }
    }
    for (u32 t = 0; t < kWarpgroupThreads; ++t) {
        float* d = op.frag[t];
        for (u32 i = 0; i < n / 2; ++i) {
            const u32 row = frag_row(t, i), col = frag_col(t, i);
            if (exact || nan_row[row] || nan_row[64 + col]) {
                const float* ar = a + row * 32;
                const float* br = b + col * 32;
                float dot = 0.f;
                for (u32 k = 0; k < 32; ++k) dot += ar[k] * br[k];
                d[i] = op.scale_d ? d[i] + dot : dot;
            } else {
                const size_t ra = size_t(row) * 32, rb = size_t(64 + col) * 32;
                d[i] = mma_fp8_k32(&mag[ra], &neg[ra], &mag[rb], &neg[rb], op.scale_d ? d[i] : 0.f);
            }
        }
    }
}

inline Warpgroup& my_warpgroup(const char* what) {
    const u32 wg = me().tid / kWarpgroupThreads;
    if ((wg + 1) * kWarpgroupThreads > L().cfg.block_x)
        fail(format("%s: thread is in an incomplete warpgroup (block has %u threads)", what, L().cfg.block_x));
    return my_cta().warpgroups[wg];
}

}  // namespace dfg::sim::detail
