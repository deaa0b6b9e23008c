// deep_fp8_gemm CPU simulator: tensor maps and TMA loads (with multicast).
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

// ---------------------------------------------------------------- tensor maps / TMA

DFG_SIM_API const SimTensorMap& tensor_map(const TensorMap* map, const char* what) {
    const auto* m = reinterpret_cast<const SimTensorMap*>(map);
    if (m->magic != kTensorMapMagic)
        fail(format("%s: tensor map at %p was not packed by deep_fp8_gemm.simulator.pack_tensor_map (magic %#x)",
                    what, static_cast<const void*>(map), m->magic));
    if (m->rank != 3)
        fail(format("%s: a 3-D TMA instruction needs a rank-3 tensor map, this one has rank %u", what, m->rank));
    return *m;
}

inline u32 element_bytes(const SimTensorMap& m) {
    switch (m.dtype) {
        case 0: return 1;  // UINT8
        case 1: return 2;  // UINT16
        case 7: return 4;  // FLOAT32
        case 9: return 2;  // BFLOAT16
        default: fail(format("tensor map dtype %u is not supported by the simulator", m.dtype));
    }
}

// The box of a tensor map as it lies in shared memory. CuTe's TMA construction (copy_traits_sm90_tma.hpp,
// make_tma_copy_desc: right_inverse(get_nonswizzle_portion(smem layout))) enumerates the box in shared
// memory densely, innermost dimension first, and hands the layout's swizzle to the tensor map
// (get_tma_swizzle_bits): box element (x, y, z) sits at un-swizzled byte offset
// ((z * box1 + y) * box0 + x) * element_bytes from the destination, and the swizzle is applied to the
// resulting shared-memory address. (CuTe's swizzle atoms make a swizzled box exactly one span wide; a
// narrower inner box is assumed to be packed the same way.)
struct Box {
    const SimTensorMap& map;
    u32 eb, row_bytes, rows, bytes, swz;
    u32 footprint;  // smem bytes the box may touch: the swizzle permutes 16-byte chunks within 16 << swz bytes
    i32 c[3];

    Box(const SimTensorMap& m, i32 c0, i32 c1, i32 c2)
        : map(m), eb(element_bytes(m)), row_bytes(m.box_dims[0] * eb), rows(u32(m.box_dims[1]) * m.box_dims[2]),
          bytes(row_bytes * rows), swz(m.swizzle),  // the TmaSwizzle value is B of Swizzle<B,4,3>
          footprint(swz ? (bytes + (16u << swz) - 1) / (16u << swz) * (16u << swz) : bytes), c{c0, c1, c2} {}

    // Global address of row (y, z) of the box, or nullptr when that row is out of bounds.
    const u8* row_global(u32 row) const {
        const i64 y = i64(c[1]) + row % map.box_dims[1], z = i64(c[2]) + row / map.box_dims[1];
        if (y < 0 || y >= i64(map.global_dims[1]) || z < 0 || z >= i64(map.global_dims[2])) return nullptr;
        return reinterpret_cast<const u8*>(map.global_address) + u64(y) * map.global_strides[0] +
               u64(z) * map.global_strides[1];
    }
    bool x_in_bounds(u32 x) const { return i64(c[0]) + x >= 0 && i64(c[0]) + x < i64(map.global_dims[0]); }
    // The in-bounds elements of a row: global x indices [lo, hi) (lo >= hi: none).
    std::pair<i64, i64> x_range() const {
        const i64 lo = c[0] > 0 ? c[0] : 0;
        const i64 end = i64(c[0]) + map.box_dims[0], dim = i64(map.global_dims[0]);
        return {lo, end < dim ? end : dim};
    }

    // PTX ISA "cp.async.bulk.tensor": the smem address must be 128-byte aligned; with a swizzle the pattern
    // is a function of address bits, so tiles are aligned to its repeat (256 / 512 / 1024 bytes) for the
    // layout CuTe and the kernels assume.
    void check_smem(u32 offset, const char* what) const {
        const u32 align = swz ? (128u << swz) : 128u;
        if (offset % align)
            fail(format("%s: shared-memory address smem+%#x is not %u-byte aligned (128 B for TMA%s)", what, offset,
                        align, swz ? ", swizzle repeat" : ""));
        if (swz && row_bytes > (16u << swz))
            fail(format("%s: inner box extent %u B exceeds the %u B swizzle span", what, row_bytes, 16u << swz));
        check_smem_range(offset, footprint, what);
    }
};

// A tensor map outside the kernel's parameter struct lives in global memory, where an earlier kernel put it; the
// tensormap proxy may use it only after the using thread's fence.proxy.tensormap::generic.acquire on its address
// (CUDA programming guide, TMA: a tensor map passed through global memory needs that fence in the kernel).
DFG_SIM_API void tensormap_acquire(const TensorMap* map) {
    tensor_map(map, "tensormap_fence_acquire");
    if (reinterpret_cast<uintptr_t>(map) % 64)
        fail(format("tensormap_fence_acquire: tensor map at %p is not 64-byte aligned", static_cast<const void*>(map)));
    me().tensormaps_acquired.push_back(map);
}

// A map edited by tensormap.replace: a packed map (magic) in this CTA's shared memory, 64-byte aligned.
inline SimTensorMap& tensormap_replace(TensorMap* map, const char* what) {
    const u32 offset = smem_offset(map, what);
    check_smem_range(offset, sizeof(TensorMap), what);
    if (offset % 64)
        fail(format("%s: the tensor map at smem+%#x is not 64-byte aligned", what, offset));
    auto* m = reinterpret_cast<SimTensorMap*>(map);
    if (m->magic != kTensorMapMagic)
        fail(format("%s: the shared-memory bytes at smem+%#x are not a tensor map (magic %#x): copy one in first",
                    what, offset, m->magic));
    return *m;
}

// cuTensorMapEncodeTiled's rules hold for the replaced fields too: a dimension in [1, 2^32], a stride a multiple of
// 16 below 2^40; global_dim ordinal < rank, global_stride ordinal < rank - 1 (dimension ordinal + 1's stride).
DFG_SIM_API void tensormap_replace_address(TensorMap* map, u64 address) {
    tensormap_replace(map, "tensormap.replace.global_address").global_address = address;
}
DFG_SIM_API void tensormap_replace_dim(TensorMap* map, u32 ordinal, u32 extent) {
    SimTensorMap& m = tensormap_replace(map, "tensormap.replace.global_dim");
    if (ordinal >= m.rank || extent == 0)
        fail(format("tensormap.replace.global_dim: ordinal %u extent %u (rank %u; extents are non-zero)", ordinal,
                    extent, m.rank));
    m.global_dims[ordinal] = extent;
}
DFG_SIM_API void tensormap_replace_stride(TensorMap* map, u32 ordinal, u64 bytes) {
    SimTensorMap& m = tensormap_replace(map, "tensormap.replace.global_stride");
    if (ordinal + 1 >= m.rank || bytes % 16 != 0 || bytes >= (u64(1) << 40))
        fail(format("tensormap.replace.global_stride: ordinal %u stride %llu B (rank %u; strides are multiples of "
                    "16 below 2^40)", ordinal, static_cast<unsigned long long>(bytes), m.rank));
    m.global_strides[ordinal] = bytes;
}

// tensormap.cp_fenceproxy: the shared-memory map to a 64-byte-aligned global slot (each lane copies the same bytes).
// The global write is a plain one for the race detector (a reader of those bytes needs a happens-before path),
// recorded once, for lane 0: the lanes write the same bytes as one warp-collective operation.
DFG_SIM_API void tensormap_copy_out(TensorMap* gmem_map, const TensorMap* smem_map) {
    const char* what = "tensormap.cp_fenceproxy";
    const u32 offset = smem_offset(smem_map, what);
    check_smem_range(offset, sizeof(TensorMap), what);
    if (reinterpret_cast<uintptr_t>(gmem_map) % 64)
        fail(format("%s: global tensor map at %p is not 64-byte aligned", what, static_cast<const void*>(gmem_map)));
    if (me().tid % 32 == 0) hal_access(gmem_map, sizeof(TensorMap), true, what);
    std::memcpy(gmem_map, smem_map, sizeof(TensorMap));
}

inline void check_tensormap_acquired(const TensorMap* map, const char* what) {
    const u8* p = static_cast<const u8*>(L().params);
    const u8* m = reinterpret_cast<const u8*>(map);
    if (L().params_bytes == 0 || (m >= p && m < p + L().params_bytes))
        return;  // a kernel parameter (.param space, __grid_constant__)
    for (const void* acquired : me().tensormaps_acquired)
        if (acquired == map)
            return;
    fail(format("%s: TMA through the tensor map at %p in global memory without this thread's "
                "fence.proxy.tensormap::generic.acquire on it (hal::tensormap_fence_acquire)",
                what, static_cast<const void*>(map)));
}

// ================================================================ emulation of the collective operations
// ---------------------------------------------------------------- TMA load (+ multicast)
// A wgmma issued but not yet waited may still read its operands (PTX ISA "wgmma.wait_group"):
// a TMA write over them is the "stage released too early" race.
inline void check_no_wgmma_reader(u32 cta, u32 offset, u32 bytes, const char* what) {
    const auto& wgs = L().ctas[cta].warpgroups;
    for (u32 w = 0; w < wgs.size(); ++w)
        for (size_t g = 0; g < wgs[w].groups.size(); ++g)
            for (const WgmmaOp& op : wgs[w].groups[g].ops) {
                const bool a = op.lo_a < offset + bytes && offset < op.hi_a;
                const bool b = op.lo_b < offset + bytes && offset < op.hi_b;
                if (a || b)
                    fail(format("race: %s: TMA write into a stage still read by wgmma: box [%#x, %#x) of cta %u "
                                "overlaps operand %s [%#x, %#x) of a wgmma of warpgroup %u (group %llu, not yet waited; "
                                "issued by thread %u at %s)",
                                what, offset, offset + bytes, cta, a ? "A" : "B", a ? op.lo_a : op.lo_b,
                                a ? op.hi_a : op.hi_b, w, static_cast<unsigned long long>(wgs[w].executed + g),
                                op.issue_tid, site_str(op.issue_site).c_str()));
            }
}

// Global bytes the TMA loads of this process have read (their boxes' in-bounds elements, once per load however many
// CTAs a multicast writes): the memory traffic a kernel's operands cost, for the tests' byte budgets
// (dfg_sim_tma_load_bytes; deep_fp8_gemm.simulator.tma_load_bytes).
inline u64 g_tma_load_bytes = 0;

// cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes[.multicast::cluster]
// (PTX ISA "cp.async.bulk.tensor"): the whole box is written (out-of-bounds elements filled) and its full
// byte count is signalled as complete-tx on the barrier at the same offset in each destination CTA. Checked
// here, at issue; the copy lands at the end of the scheduling pass (land_tma_loads), so a thread that reads
// the stage without waiting for its barrier reads stale or poisoned bytes, as it may on the hardware.
DFG_SIM_API void tma_load(void* dst, const TensorMap* map, u64* bar, u32 cta_mask, bool multicast, i32 c0, i32 c1,
                     i32 c2, const char* what) {
    const Box box(tensor_map(map, what), c0, c1, c2);
    check_tensormap_acquired(map, what);
    const u32 offset = smem_offset(dst, what);
    const u32 bar_offset = mbarrier_offset(bar, what);
    box.check_smem(offset, what);
    const u32 cluster_x = L().cfg.cluster_x;
    if (multicast && (cta_mask == 0 || cta_mask >> cluster_x))
        fail(format("%s: cta mask %#x is empty or names CTAs outside the cluster of %u", what, cta_mask, cluster_x));
    if (box.map.oob_fill == 1 && box.map.dtype != 7 && box.map.dtype != 9)
        fail(format("%s: NaN out-of-bounds fill needs a floating-point dtype, got %u", what, box.map.dtype));
    const u32 first = me().cta / cluster_x * cluster_x;
    Thread& t = me();
    const u32 site = site_id(t.site);
    for (u32 rank = 0; rank < cluster_x; ++rank) {
        if (!(cta_mask >> rank & 1)) continue;
        remote_access(first + rank, multicast ? "a TMA multicast" : "a TMA load");
        check_mbarrier_visible(mbarrier_at(first + rank, bar_offset, what), first + rank, bar_offset,
                               "TMA complete_tx (async proxy)");
        check_no_wgmma_reader(first + rank, offset, box.footprint, what);
        check_no_mbarrier_overlap(first + rank, offset, box.footprint, what);
        // Plain accesses to the destination must be ordered before the issue: the copy may land any time after.
        if (S().races)
            async_access(t, uintptr_t(L().ctas[first + rank].smem + offset), box.footprint, true, false, site,
                         multicast ? "a TMA multicast's write" : "a TMA load's write");
    }
    if (S().races) {  // the global source, read by the async proxy between the issue and the landing
        const auto [lo, hi] = box.x_range();
        for (u32 row = 0; row < box.rows && hi > lo; ++row)
            if (const u8* g = box.row_global(row))
                async_access(t, uintptr_t(g + lo * box.eb), u32(hi - lo) * box.eb, false, true, site,
                             "a TMA load's read");
    }
    {
        const auto [lo, hi] = box.x_range();
        for (u32 row = 0; row < box.rows && hi > lo; ++row)
            if (box.row_global(row) != nullptr)
                g_tma_load_bytes += u64(hi - lo) * box.eb;
    }
    PendingLoad load{box.map, {c0, c1, c2}, first, cta_mask, offset, bar_offset};
    load.issuer = t.clocks;
    load.epoch = epoch_of(t);
    load.site = site;
    tick(t);  // what the issuing thread does next is not ordered before the landing
    L().pending_loads.push_back(std::move(load));
}

// Lands every issued TMA load: copy, then complete-tx. A wgmma not yet executed that reads the box was issued
// before the data arrived (a missing or wrong full-barrier wait). Returns an error message or "".
inline std::string land_tma_loads(bool all = true) {
    Launch& l = L();
    std::vector<PendingLoad> later;  // adversarial schedules hold some loads back for another pass
    for (const PendingLoad& load : l.pending_loads) {
        if (!all && g_schedule.chance(2)) {
            later.push_back(load);
            continue;
        }
        const Box box(load.map, load.c[0], load.c[1], load.c[2]);
        const u32 fill = load.map.oob_fill == 0 ? 0u : load.map.dtype == 7 ? 0x7FFFFFFFu : 0x7FFFu;
        for (u32 rank = 0; rank < l.cfg.cluster_x; ++rank) {
            if (!(load.cta_mask >> rank & 1)) continue;
            const u32 cta = load.first_cta + rank;
            if (l.ctas[cta].exited)
                return format("cluster lifetime: a TMA load lands in cta %u (smem+%#x), which has already exited",
                              cta, load.offset);
            const auto& wgs = l.ctas[cta].warpgroups;
            for (u32 w = 0; w < wgs.size(); ++w)
                for (const WgmmaGroup& group : wgs[w].groups)
                    for (const WgmmaOp& op : group.ops)
                        if ((op.lo_a < load.offset + box.footprint && load.offset < op.hi_a) ||
                            (op.lo_b < load.offset + box.footprint && load.offset < op.hi_b))
                            return format("race: cta %u: a wgmma of warpgroup %u (issued by thread %u at %s) reads smem "
                                          "[%#x, %#x) before the TMA load writing it has landed (missing or wrong "
                                          "full-barrier wait?)",
                                          cta, w, op.issue_tid, site_str(op.issue_site).c_str(), load.offset,
                                          load.offset + box.footprint);
            u8* smem = l.ctas[cta].smem;
            for (u32 row = 0; row < box.rows; ++row) {
                const u8* g = box.row_global(row);
                for (u32 x = 0; x < load.map.box_dims[0]; ++x) {
                    u8* s = smem + swizzle(load.offset + row * box.row_bytes + x * box.eb, box.swz);
                    if (g && box.x_in_bounds(x)) std::memcpy(s, g + (i64(load.c[0]) + x) * box.eb, box.eb);
                    else std::memcpy(s, &fill, box.eb);
                }
            }
            async_write(cta, load.offset, box.footprint);
            if (S().races) async_landed(uintptr_t(smem + load.offset), box.footprint, load.epoch, load.site);
            const std::string error = mbarrier_complete_tx(cta, load.bar_offset, box.bytes, load);
            if (!error.empty()) return error;
        }
    }
    l.pending_loads.swap(later);
    return "";
}

}  // namespace dfg::sim::detail
