// deep_fp8_gemm hardware layer, CPU simulator implementation (built with -DDFG_SIMULATOR).
//
// Same names, signatures and semantics as hal/ptx.cuh, emulated on the host so that the *same kernel
// source* runs on a machine without a GPU. The translation unit is compiled with g++ into a shared
// library (deep_fp8_gemm/simulator/build.py); DFG_DEFINE_KERNEL gives it one C entry point per kernel.
//
// Execution model
//   * Every thread of every CTA of the grid is a cooperative fiber (ucontext) on one OS thread. All CTAs
//     are co-resident, as on a GPU running a persistent grid of <= #SM CTAs, so the CTAs of a cluster
//     are co-scheduled. The scheduler resumes fibers round-robin in (cta, thread) order; a fiber runs
//     until it blocks in a hal operation (mbarrier wait, bar.sync, cluster barrier, wgmma wait, a warp
//     rendezvous) or returns. The interleaving is deterministic.
//   * A blocked fiber is resumed only once its wait condition holds; when a whole scheduling pass resumes
//     nothing, the launch is deadlocked and the report lists who waits on what (see deadlock_report).
//   * TMA loads are checked at issue and land (copy + complete-tx) at the end of the scheduling pass, so a
//     thread that reads a stage without waiting for its barrier sees stale or poisoned bytes. TMA stores
//     write global memory at issue and keep a copy of their source for tma_store_wait_*. wgmma groups
//     execute lazily at wgmma_wait (all committed groups but the newest N), so reading accumulators before
//     the wait sees stale values, and a TMA write into shared memory that an unwaited wgmma still reads is
//     caught as an error.
//   * Shared memory is filled with 0xFF (NaN as e4m3, bf16 and f32) so reads of unwritten data show up.
//     Global memory is host memory: kernel parameters carry host pointers.
//
// Errors (bounds, alignment, descriptors, barrier misuse, races the model can see, trap()) abort the whole
// launch: the entry point returns nonzero and dfg_sim_last_error() gives the report.
//
// Sources: PTX ISA 8.x, sections cited by title per operation; layouts cross-checked against CuTe
// (cute/arch/mma_sm90_desc.hpp, cute/atom/mma_traits_sm90_gmma.hpp, cute/atom/copy_traits_sm90*.hpp)
// by tests/test_sim_groundtruth.py.
#pragma once
#include "../common.cuh"

#if !defined(DFG_SIMULATOR)
#error "hal/sim.hpp is the CPU simulator implementation; it needs -DDFG_SIMULATOR"
#endif

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#define DFG_SIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace dfg {

// Same size and alignment as the device TensorMap / CUtensorMap; the simulator's content is SimTensorMap.
struct alignas(64) TensorMap {
    u64 opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

namespace sim {

// ================================================================ host-visible ABI (mirrored in Python)

// One launch. Mirrored by deep_fp8_gemm/simulator/runner.py (ctypes LaunchConfig).
struct LaunchConfig {
    u32 grid_x;              // CTAs in the grid (a multiple of cluster_x)
    u32 block_x;             // threads per CTA (<= the kernel's NUM_THREADS)
    u32 cluster_x;           // CTAs per cluster (1, 2, ..., 8)
    u32 dynamic_smem_bytes;  // shared memory per CTA
    u64 max_steps;           // fiber resumptions before the launch is aborted; 0 = unlimited
    double timeout_s;        // wall-clock limit; 0 = none
    u32 flags;               // kFlag* bits
    u32 reserved;            // must be 0
};
static_assert(sizeof(LaunchConfig) == 40, "LaunchConfig layout is mirrored in Python");
static_assert(offsetof(LaunchConfig, max_steps) == 16 && offsetof(LaunchConfig, timeout_s) == 24 &&
                  offsetof(LaunchConfig, flags) == 32,
              "LaunchConfig layout is mirrored in Python");

// Fill shared memory with zeros instead of the 0xFF poison (to tell uninitialised reads from other bugs).
constexpr u32 kFlagZeroSmem = 1u;

// The simulator's content of a TensorMap: the cuTensorMapEncodeTiled arguments of a TensorMapSpec
// (deep_fp8_gemm/runtime/tensor_map.py), packed by deep_fp8_gemm/simulator/tensor_map_pack.py.
// Interleave is NONE and element strides are 1, as in TensorMapSpec.
struct SimTensorMap {
    u32 magic;             // kTensorMapMagic: tells a packed map from garbage or a GPU-encoded one
    u32 rank;              // 1..5
    u32 dtype;             // TmaDtype (CUtensorMapDataType)
    u32 swizzle;           // TmaSwizzle: 0 none, 1 32B, 2 64B, 3 128B
    u32 l2_promotion;      // TmaL2Promotion (no effect here)
    u32 oob_fill;          // TmaOobFill: 0 zeros, 1 NaN
    u64 global_address;    // host address of element (0, 0, ...)
    u64 global_dims[5];    // elements, innermost first
    u64 global_strides[4]; // bytes, dimensions 1..rank-1
    u16 box_dims[5];       // elements, innermost first
    u16 reserved[7];
};
static_assert(sizeof(SimTensorMap) == sizeof(TensorMap), "SimTensorMap fills a TensorMap exactly");
static_assert(offsetof(SimTensorMap, global_address) == 24 && offsetof(SimTensorMap, global_dims) == 32 &&
                  offsetof(SimTensorMap, global_strides) == 72 && offsetof(SimTensorMap, box_dims) == 104,
              "SimTensorMap layout is mirrored in Python");
constexpr u32 kTensorMapMagic = 0x54474644u;  // "DFGT"

// ================================================================ simulator state

namespace detail {

constexpr u32 kWarpgroupThreads = 128;
constexpr u32 kMaxSmemBytes = 232448;  // sm_90 opt-in maximum dynamic shared memory per CTA (227 KiB)
constexpr size_t kFiberStackBytes = 256 * 1024;
// PTX ISA "Contents of the mbarrier object": tx-count range is [-(2^20 - 1), 2^20 - 1], arrival counts < 2^20.
constexpr i64 kMaxTxCount = (1 << 20) - 1;
// Written into an mbarrier's 8 bytes at init: ordinary stores or TMA writes over a live barrier are caught
// when the barrier is next used.
constexpr u64 kMbarrierTag = 0xDF8BA5A1DF8BA5A1ull;

enum class WaitKind : u8 { Mbarrier, NamedBarrier, ClusterBarrier, WgmmaGroup, StmatrixWarp };

// What a blocked fiber waits for; the scheduler evaluates it (ready()) without resuming the fiber.
struct Wait {
    WaitKind kind;
    u32 cta;     // CTA whose object is waited on (cluster index for ClusterBarrier)
    u32 key;     // mbarrier smem offset | named barrier id | warpgroup | warp
    u32 parity;  // mbarrier parity
    u64 target;  // generation seen at arrival | wgmma group count that must be committed
};

// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier".
struct Mbarrier {
    u32 expected;  // arrival count set by mbarrier.init
    u32 pending;   // arrivals still missing in the current phase
    i64 tx;        // transaction bytes still missing in the current phase (may go negative transiently)
    u64 phase;     // number of completed phases; the current phase's parity is phase & 1
};

// bar.sync barriers (PTX ISA "bar, barrier") and the cluster barrier (PTX ISA "barrier.cluster").
// The forms without a thread count wait for every thread that has not exited (PTX ISA "exit": an
// exiting thread releases a barrier it alone was holding up); a count form waits for exactly that many.
constexpr u32 kAllThreads = ~0u;
struct ThreadBarrier {
    u32 expected = 0;  // thread count of the current round, kAllThreads, or 0 when idle
    u32 arrived = 0;
    u64 generation = 0;
};

// stmatrix is warp-collective (.sync.aligned): the 32 lanes' addresses and registers meet here.
struct WarpRendezvous {
    u32 arrived = 0;
    u64 generation = 0;
    u32 row_offset[32];
    u32 regs[32][4];
};

// One wgmma.mma_async of a warpgroup: identical descriptors from all 128 threads, one fragment each.
struct WgmmaOp {
    u64 desc_a, desc_b;
    u32 n;
    bool scale_d;
    u32 issued = 0;
    float* frag[kWarpgroupThreads] = {};
    std::vector<u32> addr_a, addr_b;  // decoded operand byte offsets, [row * 32 + k]
    u32 lo_a, hi_a, lo_b, hi_b;       // smem byte ranges [lo, hi) the operands read
};

struct WgmmaGroup {
    std::vector<WgmmaOp> ops;
    u32 committed = 0;  // threads that have committed this group
};

struct Warpgroup {
    std::deque<WgmmaGroup> groups;  // issued but not yet executed; groups.front() has index `executed`
    u64 executed = 0;               // groups executed so far
    u64 complete = 0;               // groups committed by all 128 threads
};

struct StoreRecord {
    u32 offset;                // smem source offset
    std::vector<u8> snapshot;  // the source bytes at issue
};

struct Thread {
    ucontext_t ctx;
    void* stack = nullptr;
    u32 cta = 0, tid = 0;
    bool done = false, blocked = false;
    Wait wait{};
    const char* wait_op = "";
    // wgmma bookkeeping (PTX ISA "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group")
    u64 wgmma_commits = 0;
    u32 wgmma_ops_in_open_group = 0;
    bool wgmma_fenced = false;
    // bulk async-groups of TMA stores (PTX ISA "cp.async.bulk.commit_group", "cp.async.bulk.wait_group")
    std::vector<StoreRecord> open_stores;
    std::deque<std::vector<StoreRecord>> committed_stores;
    std::vector<i32> setmaxnreg_log;  // +regs for inc, -regs for dec
};

struct Cta {
    u8* smem = nullptr;
    std::unordered_map<u32, Mbarrier> mbarriers;  // keyed by smem offset
    ThreadBarrier named[16];
    u32 live = 0;  // threads not exited
    std::vector<WarpRendezvous> warps;
    std::vector<Warpgroup> warpgroups;
};

// A TMA load between issue and landing (see land_tma_loads).
struct PendingLoad {
    SimTensorMap map;  // a copy: the kernel may reuse the memory of its TensorMap
    i32 c[3];
    u32 first_cta, cta_mask, offset, bar_offset;
};

struct Launch {
    LaunchConfig cfg{};
    void (*entry)(const void*) = nullptr;
    const void* params = nullptr;
    size_t smem_alloc = 0;
    std::vector<Cta> ctas;
    struct Cluster {
        ThreadBarrier barrier;
        u32 live = 0;  // threads of the cluster not exited
    };
    std::vector<Cluster> clusters;
    std::vector<std::unique_ptr<Thread>> threads;
    ucontext_t scheduler;
    Thread* current = nullptr;
    bool failed = false;
    std::string error;
    std::vector<PendingLoad> pending_loads;
    std::vector<float> scratch;  // decoded wgmma operands
    bool in_fiber = false;       // a fiber is running (the fault handler may abandon it)
    int fault_signal = 0;
    void* fault_address = nullptr;
};

inline Launch* g_launch = nullptr;
inline std::string g_last_error;

inline Launch& L() { return *g_launch; }
inline Thread& me() { return *g_launch->current; }
inline Cta& my_cta() { return g_launch->ctas[me().cta]; }

inline std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// Records the error for the current thread and abandons the launch: control returns to the scheduler and
// this fiber is never resumed (its stack is unmapped with the others).
[[noreturn]] inline void fail(const std::string& what) {
    Launch& l = L();
    Thread& t = me();
    l.failed = true;
    l.error = format("cta %u thread %u (warp %u lane %u): ", t.cta, t.tid, t.tid / 32, t.tid % 32) + what;
    swapcontext(&t.ctx, &l.scheduler);
    __builtin_unreachable();
}

inline void block(const Wait& w, const char* op) {
    Thread& t = me();
    t.wait = w;
    t.wait_op = op;
    t.blocked = true;
    swapcontext(&t.ctx, &L().scheduler);  // resumed only once ready(w) holds
}

// ---------------------------------------------------------------- shared memory access checks

inline u32 smem_offset(const void* ptr, const char* what) {
    const Launch& l = L();
    const u8* p = static_cast<const u8*>(ptr);
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        const u8* base = l.ctas[c].smem;
        if (p >= base && p < base + l.cfg.dynamic_smem_bytes) {
            if (c != me().cta)
                fail(format("%s: pointer into the shared memory of cta %u, not this CTA's", what, c));
            return static_cast<u32>(p - base);
        }
    }
    fail(format("%s: %p is not a pointer into this CTA's shared memory (%u bytes)", what, ptr,
                l.cfg.dynamic_smem_bytes));
}

inline void check_smem_range(u32 offset, u64 bytes, const char* what) {
    if (offset + bytes > L().cfg.dynamic_smem_bytes)
        fail(format("%s: shared-memory access [%#x, %#llx) out of bounds (dynamic smem is %#x bytes)", what, offset,
                    static_cast<unsigned long long>(offset + bytes), L().cfg.dynamic_smem_bytes));
}

// A bulk write into [offset, offset+bytes) of `cta` must not clobber an initialised mbarrier.
inline void check_no_mbarrier_overlap(u32 cta, u32 offset, u64 bytes, const char* what) {
    for (const auto& [bar, state] : L().ctas[cta].mbarriers) {
        (void)state;
        if (bar + 8 > offset && bar < offset + bytes)
            fail(format("%s: write into [%#x, %#llx) of cta %u overlaps the mbarrier at smem+%#x", what, offset,
                        static_cast<unsigned long long>(offset + bytes), cta, bar));
    }
}

// PTX ISA "Tensor copy swizzling modes": the 16-byte chunk index (address bits [4, 4+B)) is XORed with
// address bits [7, 7+B): B = 3 / 2 / 1 for the 128 / 64 / 32-byte swizzle = CuTe Swizzle<B,4,3> on byte
// addresses. The same function governs wgmma's view of swizzled operands.
inline u32 swizzle(u32 addr, u32 bits) { return addr ^ ((addr >> 3) & (((1u << bits) - 1) << 4)); }

// ---------------------------------------------------------------- numerics

// e4m3 (OCP FP8 "E4M3FN"): bias 7, no infinities, S.1111.111 is NaN.
struct E4m3Table {
    float value[256];
    E4m3Table() {
        for (int code = 0; code < 256; ++code) {
            const int exp = (code >> 3) & 15, man = code & 7;
            float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                                 : std::ldexp(static_cast<float>(8 + man), exp - 10);
            if ((code & 0x7F) == 0x7F) mag = NAN;
            value[code] = (code & 0x80) ? -mag : mag;
        }
    }
};
inline const E4m3Table g_e4m3;

// cvt.rn.satfinite.e4m3x2.f32 (PTX ISA "cvt"): round to nearest even, finite results saturate to
// +-448, NaN -> 0x7F.
inline u8 float_to_e4m3(float x) {
    if (std::isnan(x)) return 0x7F;
    const u8 sign = std::signbit(x) ? 0x80 : 0;
    const float a = std::fabs(x);
    if (a >= 448.f) return sign | 0x7E;
    // Quantum of a's binade (subnormal quantum 2^-9 below 2^-6); a / q is exact, nearbyint rounds to even.
    const int e = a < 0x1p-6f ? -6 : std::ilogb(a);
    const float q = std::ldexp(1.f, e - 3);
    const float r = std::nearbyint(a / q) * q;
    if (r >= 448.f) return sign | 0x7E;
    if (r < 0x1p-6f) return sign | static_cast<u8>(r * 512.f);  // subnormal: code = r / 2^-9
    const int re = std::ilogb(r);
    const int man = static_cast<int>(std::ldexp(r, 3 - re)) - 8;
    return sign | static_cast<u8>(((re + 7) << 3) | man);
}

// cvt.rn.bf16x2.f32: round to nearest even; NaN -> canonical NaN 0x7FFF.
inline u16 float_to_bf16(float x) {
    if (std::isnan(x)) return 0x7FFF;
    u32 bits;
    std::memcpy(&bits, &x, 4);
    return static_cast<u16>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------- mbarrier

inline Mbarrier& mbarrier_at(u32 cta, u32 offset, const char* what) {
    Cta& c = L().ctas[cta];
    auto it = c.mbarriers.find(offset);
    if (it == c.mbarriers.end())
        fail(format("%s: mbarrier at smem+%#x of cta %u is not initialised (no mbar_init)", what, offset, cta));
    u64 tag;
    std::memcpy(&tag, c.smem + offset, 8);
    if (tag != kMbarrierTag)
        fail(format("%s: the 8 bytes of the mbarrier at smem+%#x of cta %u were overwritten by a store", what,
                    offset, cta));
    return it->second;
}

inline u32 mbarrier_offset(const u64* bar, const char* what) {
    const u32 offset = smem_offset(bar, what);
    if (offset % 8) fail(format("%s: mbarrier address smem+%#x is not 8-byte aligned", what, offset));
    check_smem_range(offset, 8, what);
    return offset;
}

// The phase completes when all expected arrivals and all expected transaction bytes are in; the pending
// count is then reloaded (PTX ISA "Phase completion of the mbarrier object").
inline void mbarrier_maybe_complete(Mbarrier& mb) {
    if (mb.pending == 0 && mb.tx == 0) {
        ++mb.phase;
        mb.pending = mb.expected;
    }
}

inline void mbarrier_arrive(u32 cta, u32 offset, u32 tx_bytes, const char* what) {
    Mbarrier& mb = mbarrier_at(cta, offset, what);
    if (mb.pending == 0)  // only possible while tx bytes are outstanding: an arrival beyond the count
        fail(format("%s: arrival beyond the expected count %u on the mbarrier at smem+%#x of cta %u (phase %llu "
                    "already has all arrivals, %lld tx bytes outstanding)",
                    what, mb.expected, offset, cta, static_cast<unsigned long long>(mb.phase),
                    static_cast<long long>(mb.tx)));
    mb.tx += tx_bytes;  // expect-tx precedes the arrive (PTX ISA "mbarrier.arrive", .expect_tx)
    if (mb.tx > kMaxTxCount)
        fail(format("%s: tx-count %lld of the mbarrier at smem+%#x exceeds 2^20-1", what,
                    static_cast<long long>(mb.tx), offset));
    --mb.pending;
    mbarrier_maybe_complete(mb);
}

// complete-tx from a landing TMA load (PTX ISA "tx-count": may precede the expect-tx). Runs in
// the scheduler, so it returns an error message instead of failing a thread.
inline std::string mbarrier_complete_tx(u32 cta, u32 offset, u32 bytes) {
    Mbarrier& mb = L().ctas[cta].mbarriers.at(offset);
    mb.tx -= bytes;
    if (mb.tx < -kMaxTxCount)
        return format("tx-count of the mbarrier at smem+%#x of cta %u underflows (%lld): more TMA bytes than expected",
                      offset, cta, static_cast<long long>(mb.tx));
    mbarrier_maybe_complete(mb);
    return "";
}

// ---------------------------------------------------------------- thread barriers

// Opens the next generation once everybody expected has arrived; `live` is the number of threads not exited.
inline void thread_barrier_release(ThreadBarrier& b, u32 live) {
    if (b.arrived == 0 || b.arrived < (b.expected == kAllThreads ? live : b.expected)) return;
    b.arrived = 0;
    b.expected = 0;
    ++b.generation;
}

inline void thread_barrier_sync(ThreadBarrier& b, u32 count, u32 live, WaitKind kind, u32 cta, u32 key,
                                const char* op) {
    if (b.expected == 0) {
        b.expected = count;
    } else if (b.expected != count) {
        const auto show = [](u32 n) { return n == kAllThreads ? std::string("all") : std::to_string(n); };
        fail(format("%s: barrier %u used with thread counts %s and %s in the same round", op, key,
                    show(b.expected).c_str(), show(count).c_str()));
    }
    const u64 generation = b.generation;
    ++b.arrived;
    thread_barrier_release(b, live);
    if (b.generation == generation) block(Wait{kind, cta, key, 0, generation}, op);
}

// ---------------------------------------------------------------- tensor maps / TMA

inline const SimTensorMap& tensor_map(const TensorMap* map, const char* what) {
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
                    fail(format("%s: TMA write into a stage still read by wgmma: box [%#x, %#x) of cta %u overlaps "
                                "operand %s [%#x, %#x) of a wgmma of warpgroup %u (group %llu, not yet waited)",
                                what, offset, offset + bytes, cta, a ? "A" : "B", a ? op.lo_a : op.lo_b,
                                a ? op.hi_a : op.hi_b, w,
                                static_cast<unsigned long long>(wgs[w].executed + g)));
            }
}

// cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes[.multicast::cluster]
// (PTX ISA "cp.async.bulk.tensor"): the whole box is written (out-of-bounds elements filled) and its full
// byte count is signalled as complete-tx on the barrier at the same offset in each destination CTA. Checked
// here, at issue; the copy lands at the end of the scheduling pass (land_tma_loads), so a thread that reads
// the stage without waiting for its barrier reads stale or poisoned bytes, as it may on the hardware.
inline void tma_load(void* dst, const TensorMap* map, u64* bar, u32 cta_mask, bool multicast, i32 c0, i32 c1,
                     i32 c2, const char* what) {
    const Box box(tensor_map(map, what), c0, c1, c2);
    const u32 offset = smem_offset(dst, what);
    const u32 bar_offset = mbarrier_offset(bar, what);
    box.check_smem(offset, what);
    const u32 cluster_x = L().cfg.cluster_x;
    if (multicast && (cta_mask == 0 || cta_mask >> cluster_x))
        fail(format("%s: cta mask %#x is empty or names CTAs outside the cluster of %u", what, cta_mask, cluster_x));
    if (box.map.oob_fill == 1 && box.map.dtype != 7 && box.map.dtype != 9)
        fail(format("%s: NaN out-of-bounds fill needs a floating-point dtype, got %u", what, box.map.dtype));
    const u32 first = me().cta / cluster_x * cluster_x;
    for (u32 rank = 0; rank < cluster_x; ++rank) {
        if (!(cta_mask >> rank & 1)) continue;
        mbarrier_at(first + rank, bar_offset, what);
        check_no_wgmma_reader(first + rank, offset, box.footprint, what);
        check_no_mbarrier_overlap(first + rank, offset, box.footprint, what);
    }
    L().pending_loads.push_back(PendingLoad{box.map, {c0, c1, c2}, first, cta_mask, offset, bar_offset});
}

// Lands every issued TMA load: copy, then complete-tx. A wgmma not yet executed that reads the box was issued
// before the data arrived (a missing or wrong full-barrier wait). Returns an error message or "".
inline std::string land_tma_loads() {
    Launch& l = L();
    for (const PendingLoad& load : l.pending_loads) {
        const Box box(load.map, load.c[0], load.c[1], load.c[2]);
        const u32 fill = load.map.oob_fill == 0 ? 0u : load.map.dtype == 7 ? 0x7FFFFFFFu : 0x7FFFu;
        for (u32 rank = 0; rank < l.cfg.cluster_x; ++rank) {
            if (!(load.cta_mask >> rank & 1)) continue;
            const u32 cta = load.first_cta + rank;
            const auto& wgs = l.ctas[cta].warpgroups;
            for (u32 w = 0; w < wgs.size(); ++w)
                for (const WgmmaGroup& group : wgs[w].groups)
                    for (const WgmmaOp& op : group.ops)
                        if ((op.lo_a < load.offset + box.footprint && load.offset < op.hi_a) ||
                            (op.lo_b < load.offset + box.footprint && load.offset < op.hi_b))
                            return format("cta %u: a wgmma of warpgroup %u reads smem [%#x, %#x) before the TMA load "
                                          "writing it has landed (missing or wrong full-barrier wait?)",
                                          cta, w, load.offset, load.offset + box.footprint);
            u8* smem = l.ctas[cta].smem;
            for (u32 row = 0; row < box.rows; ++row) {
                const u8* g = box.row_global(row);
                for (u32 x = 0; x < load.map.box_dims[0]; ++x) {
                    u8* s = smem + swizzle(load.offset + row * box.row_bytes + x * box.eb, box.swz);
                    if (g && box.x_in_bounds(x)) std::memcpy(s, g + (i64(load.c[0]) + x) * box.eb, box.eb);
                    else std::memcpy(s, &fill, box.eb);
                }
            }
            const std::string error = mbarrier_complete_tx(cta, load.bar_offset, box.bytes);
            if (!error.empty()) return error;
        }
    }
    l.pending_loads.clear();
    return "";
}

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
inline void decode_operand(u64 desc, u32 rows, std::vector<u32>& addr, u32& lo, u32& hi, const char* which) {
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
            u32 a = start + (r / 8) * sbo;
            a += layout == 0 ? (r % 8) * 16 + (k / 16) * lbo + k % 16 : (r % 8) * row_pitch + k;
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

inline void execute(const WgmmaOp& op, const u8* smem) {
    const u32 n = op.n;
    std::vector<float>& s = L().scratch;
    s.resize(size_t(64 + n) * 32);
    float* a = s.data();
    float* b = a + 64 * 32;
    for (u32 i = 0; i < 64 * 32; ++i) a[i] = g_e4m3.value[smem[op.addr_a[i]]];
    for (u32 i = 0; i < n * 32; ++i) b[i] = g_e4m3.value[smem[op.addr_b[i]]];
    for (u32 t = 0; t < kWarpgroupThreads; ++t) {
        float* d = op.frag[t];
        for (u32 i = 0; i < n / 2; ++i) {
            const float* ar = a + frag_row(t, i) * 32;
            const float* br = b + frag_col(t, i) * 32;
            float dot = 0.f;
            for (u32 k = 0; k < 32; ++k) dot += ar[k] * br[k];
            d[i] = op.scale_d ? d[i] + dot : dot;
        }
    }
}

inline Warpgroup& my_warpgroup(const char* what) {
    const u32 wg = me().tid / kWarpgroupThreads;
    if ((wg + 1) * kWarpgroupThreads > L().cfg.block_x)
        fail(format("%s: thread is in an incomplete warpgroup (block has %u threads)", what, L().cfg.block_x));
    return my_cta().warpgroups[wg];
}

// ---------------------------------------------------------------- thread-facing operations (hal wraps them)

inline void sync_threads() {
    Cta& c = my_cta();
    thread_barrier_sync(c.named[0], kAllThreads, c.live, WaitKind::NamedBarrier, me().cta, 0, "sync_threads");
}

inline void named_barrier_sync(u32 id, u32 num_threads) {
    const char* what = "named_barrier_sync";
    if (id >= 16) fail(format("%s: barrier id %u is not in 0..15", what, id));
    if (num_threads == 0 || num_threads % 32 || num_threads > L().cfg.block_x)
        fail(format("%s(%u): thread count %u must be a positive multiple of 32 <= %u", what, id, num_threads,
                    L().cfg.block_x));
    Cta& c = my_cta();
    thread_barrier_sync(c.named[id], num_threads, c.live, WaitKind::NamedBarrier, me().cta, id, what);
}

inline void cluster_sync() {
    const u32 index = me().cta / L().cfg.cluster_x;
    Launch::Cluster& cluster = L().clusters[index];
    thread_barrier_sync(cluster.barrier, kAllThreads, cluster.live, WaitKind::ClusterBarrier, index, 0,
                        "cluster_sync");
}

inline void mbar_init(u64* bar, u32 arrive_count) {
    const u32 offset = mbarrier_offset(bar, "mbar_init");
    if (arrive_count == 0 || arrive_count > u32(kMaxTxCount))
        fail(format("mbar_init: arrive count %u must be in [1, 2^20-1]", arrive_count));
    my_cta().mbarriers[offset] = Mbarrier{arrive_count, arrive_count, 0, 0};
    std::memcpy(bar, &kMbarrierTag, 8);
}

inline void mbar_arrive_cluster(u64* bar, u32 cta_rank) {
    const u32 cluster_x = L().cfg.cluster_x;
    if (cta_rank >= cluster_x)
        fail(format("mbar_arrive_cluster: cta rank %u outside the cluster of %u CTAs", cta_rank, cluster_x));
    const u32 target = me().cta / cluster_x * cluster_x + cta_rank;
    mbarrier_arrive(target, mbarrier_offset(bar, "mbar_arrive_cluster"), 0, "mbar_arrive_cluster");
}

inline void mbar_wait(u64* bar, u32 parity) {
    const u32 offset = mbarrier_offset(bar, "mbar_wait");
    const Mbarrier& mb = mbarrier_at(me().cta, offset, "mbar_wait");
    if ((mb.phase & 1) != (parity & 1)) return;
    block(Wait{WaitKind::Mbarrier, me().cta, offset, parity & 1, 0}, "mbar_wait");
}

inline void tma_store(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2) {
    const char* what = "tma_store_3d";
    const Box box(tensor_map(map, what), c0, c1, c2);
    const u32 offset = smem_offset(src, what);
    box.check_smem(offset, what);
    const u8* smem = my_cta().smem;
    for (u32 row = 0; row < box.rows; ++row) {
        u8* g = const_cast<u8*>(box.row_global(row));
        if (!g) continue;
        for (u32 x = 0; x < box.map.box_dims[0]; ++x) {
            if (!box.x_in_bounds(x)) continue;
            const u32 s = swizzle(offset + row * box.row_bytes + x * box.eb, box.swz);
            std::memcpy(g + (i64(c0) + x) * box.eb, smem + s, box.eb);
        }
    }
    me().open_stores.push_back(StoreRecord{offset, std::vector<u8>(smem + offset, smem + offset + box.footprint)});
}

inline void tma_store_commit() {
    Thread& t = me();
    t.committed_stores.push_back(std::move(t.open_stores));
    t.open_stores.clear();
}

inline void tma_store_wait_read(u32 n) {
    Thread& t = me();
    while (t.committed_stores.size() > n) {
        for (const StoreRecord& r : t.committed_stores.front())
            if (std::memcmp(my_cta().smem + r.offset, r.snapshot.data(), r.snapshot.size()) != 0)
                fail(format("shared-memory source [%#x, %#zx) of a TMA store was overwritten before "
                            "tma_store_wait_read / tma_store_wait_all released it",
                            r.offset, r.offset + r.snapshot.size()));
        t.committed_stores.pop_front();
    }
}

inline WgmmaGroup& wgmma_open_group(Warpgroup& wg, u64 g) {
    while (wg.executed + wg.groups.size() <= g) wg.groups.emplace_back();
    return wg.groups[g - wg.executed];
}

inline void wgmma_issue(u32 n, u64 desc_a, u64 desc_b, float* d, bool scale_d) {
    Thread& t = me();
    Warpgroup& wg = my_warpgroup("wgmma");
    if (!t.wgmma_fenced) fail("wgmma issued without wgmma_fence since the last wgmma_wait (PTX ISA wgmma.fence)");
    const u64 g = t.wgmma_commits;
    WgmmaGroup& group = wgmma_open_group(wg, g);
    const u32 k = t.wgmma_ops_in_open_group++;
    if (k == group.ops.size()) {
        WgmmaOp op;
        op.desc_a = desc_a;
        op.desc_b = desc_b;
        op.n = n;
        op.scale_d = scale_d;
        decode_operand(desc_a, 64, op.addr_a, op.lo_a, op.hi_a, "A");
        decode_operand(desc_b, n, op.addr_b, op.lo_b, op.hi_b, "B");
        group.ops.push_back(std::move(op));
    }
    WgmmaOp& op = group.ops[k];
    if (op.desc_a != desc_a || op.desc_b != desc_b || op.n != n || op.scale_d != scale_d)
        fail(format("wgmma is warpgroup-collective but this thread's operands differ from its warpgroup's: "
                    "(desc_a %#llx, desc_b %#llx, N %u, scale_d %d) vs (%#llx, %#llx, %u, %d) in wgmma %u of group "
                    "%llu",
                    static_cast<unsigned long long>(desc_a), static_cast<unsigned long long>(desc_b), n, scale_d,
                    static_cast<unsigned long long>(op.desc_a), static_cast<unsigned long long>(op.desc_b), op.n,
                    op.scale_d, k, static_cast<unsigned long long>(g)));
    op.frag[t.tid % kWarpgroupThreads] = d;
    ++op.issued;
}

inline void wgmma_commit() {
    Thread& t = me();
    Warpgroup& wg = my_warpgroup("wgmma_commit");
    const u64 g = t.wgmma_commits;
    WgmmaGroup& group = wgmma_open_group(wg, g);
    if (t.wgmma_ops_in_open_group != group.ops.size())
        fail(format("wgmma_commit: this thread issued %u wgmma in group %llu, its warpgroup issued %zu",
                    t.wgmma_ops_in_open_group, static_cast<unsigned long long>(g), group.ops.size()));
    ++t.wgmma_commits;
    t.wgmma_ops_in_open_group = 0;
    if (++group.committed < kWarpgroupThreads) return;
    for (u32 k = 0; k < group.ops.size(); ++k)  // a thread may have committed before others issued more
        if (group.ops[k].issued != kWarpgroupThreads)
            fail(format("wgmma_commit: only %u of 128 threads issued wgmma %u of group %llu", group.ops[k].issued, k,
                        static_cast<unsigned long long>(g)));
    wg.complete = g + 1;
}

inline void wgmma_wait(u32 n) {
    Thread& t = me();
    Warpgroup& wg = my_warpgroup("wgmma_wait");
    t.wgmma_fenced = false;
    if (t.wgmma_commits <= n) return;
    const u64 target = t.wgmma_commits - n;  // groups [0, target) must be complete
    if (wg.complete < target)
        block(Wait{WaitKind::WgmmaGroup, t.cta, t.tid / kWarpgroupThreads, 0, target}, "wgmma_wait");
    while (wg.executed < target) {
        for (const WgmmaOp& op : wg.groups.front().ops) execute(op, my_cta().smem);
        wg.groups.pop_front();
        ++wg.executed;
    }
}

inline void stmatrix_x4(void* row_ptr, const u32 (&regs)[4]) {
    const char* what = "stmatrix_x4";
    const u32 offset = smem_offset(row_ptr, what);
    if (offset % 16) fail(format("%s: row address smem+%#x is not 16-byte aligned", what, offset));
    check_smem_range(offset, 16, what);
    Thread& t = me();
    WarpRendezvous& w = my_cta().warps[t.tid / 32];
    const u32 lane = t.tid % 32;
    w.row_offset[lane] = offset;
    std::memcpy(w.regs[lane], regs, sizeof regs);
    const u64 generation = w.generation;
    if (++w.arrived < 32) {
        block(Wait{WaitKind::StmatrixWarp, t.cta, t.tid / 32, 0, generation}, what);
        return;
    }
    u8* smem = my_cta().smem;
    for (u32 l = 0; l < 32; ++l) {
        const u32 matrix = l / 8, row = l % 8;
        check_no_mbarrier_overlap(t.cta, w.row_offset[l], 16, what);
        for (u32 c = 0; c < 4; ++c) std::memcpy(smem + w.row_offset[l] + 4 * c, &w.regs[row * 4 + c][matrix], 4);
    }
    w.arrived = 0;
    ++w.generation;
}

}  // namespace detail

}  // namespace sim

// ================================================================ the hal interface (see hal/ptx.cuh)
namespace hal {
namespace sd = ::dfg::sim::detail;  // the emulation; kernels use only the hal names below

// ---------------------------------------------------------------- indices
inline u32 thread_idx() { return sd::me().tid; }
inline u32 block_idx() { return sd::me().cta; }
inline u32 grid_dim() { return sd::L().cfg.grid_x; }
inline u32 warp_idx() { return sd::me().tid / 32; }
inline u32 lane_idx() { return sd::me().tid % 32; }
// %cluster_ctarank (PTX ISA "Special Registers"): 1-D clusters are runs of cluster_x consecutive CTAs.
inline u32 cluster_cta_rank() { return sd::me().cta % sd::L().cfg.cluster_x; }
// %cluster_nctarank: CTAs per cluster.
inline u32 cluster_num_ctas() { return sd::L().cfg.cluster_x; }

// ---------------------------------------------------------------- shared memory
// Page-aligned (so 1024-byte aligned, as on the device) and poisoned with 0xFF at launch.
inline u8* dynamic_smem() { return sd::my_cta().smem; }
// A CTA's shared window starts at 0 here: these offsets are what descriptors and TMA addresses see.
inline u32 smem_addr(const void* ptr) { return sd::smem_offset(ptr, "smem_addr"); }

// ---------------------------------------------------------------- CTA / cluster synchronisation
// bar.sync 0 (PTX ISA "bar, barrier") without a count: every thread of the CTA that has not exited.
inline void sync_threads() { sd::sync_threads(); }
// bar.sync id, n: n a positive multiple of 32; arrivals are counted per thread.
inline void named_barrier_sync(u32 id, u32 num_threads) { sd::named_barrier_sync(id, num_threads); }
// barrier.cluster.arrive + wait (PTX ISA "barrier.cluster"): every thread of every CTA of the cluster.
inline void cluster_sync() { sd::cluster_sync(); }

// The emulation is sequentially consistent and copies synchronously: fences order nothing further.
inline void fence_barrier_init() {}
inline void fence_view_async_shared() {}

// ---------------------------------------------------------------- mbarrier (PTX ISA "mbarrier")
// mbarrier.init: phase 0, pending = expected = arrive_count, tx-count 0.
inline void mbar_init(u64* bar, u32 arrive_count) { sd::mbar_init(bar, arrive_count); }
inline void mbar_arrive(u64* bar) {
    sd::mbarrier_arrive(sd::me().cta, sd::mbarrier_offset(bar, "mbar_arrive"), 0, "mbar_arrive");
}
// mapa + mbarrier.arrive.shared::cluster: the barrier at the same offset in CTA `cta_rank` of the cluster.
inline void mbar_arrive_cluster(u64* bar, u32 cta_rank) { sd::mbar_arrive_cluster(bar, cta_rank); }
inline void mbar_arrive_expect_tx(u64* bar, u32 tx_bytes) {
    sd::mbarrier_arrive(sd::me().cta, sd::mbarrier_offset(bar, "mbar_arrive_expect_tx"), tx_bytes,
                        "mbar_arrive_expect_tx");
}
// mbarrier.try_wait.parity (PTX ISA "mbarrier.test_wait / mbarrier.try_wait"): returns once the phase with
// parity `phase` has completed, i.e. while the current phase's parity differs from `phase`.
inline void mbar_wait(u64* bar, u32 phase) { sd::mbar_wait(bar, phase); }

// ---------------------------------------------------------------- TMA (PTX ISA "cp.async.bulk.tensor"), rank 3
inline void tma_prefetch(const TensorMap* map) { sd::tensor_map(map, "tma_prefetch"); }

inline void tma_load_3d(void* dst, const TensorMap* map, u64* bar, i32 c0, i32 c1, i32 c2) {
    sd::tma_load(dst, map, bar, 1u << cluster_cta_rank(), false, c0, c1, c2, "tma_load_3d");
}

inline void tma_load_3d_multicast(void* dst, const TensorMap* map, u64* bar, u16 cta_mask, i32 c0, i32 c1,
                                  i32 c2) {
    sd::tma_load(dst, map, bar, cta_mask, true, c0, c1, c2, "tma_load_3d_multicast");
}

// Writes global memory at issue (in-bounds elements only) and keeps a copy of the smem source, which
// tma_store_wait_read / _all compare against: overwriting the source before the wait is reported.
inline void tma_store_3d(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2) {
    sd::tma_store(map, src, c0, c1, c2);
}
// PTX ISA "cp.async.bulk.commit_group" / "cp.async.bulk.wait_group" [.read] N: bulk groups are per thread.
inline void tma_store_commit() { sd::tma_store_commit(); }
template <int N>
inline void tma_store_wait_read() {
    sd::tma_store_wait_read(N);
}
inline void tma_store_wait_all() { sd::tma_store_wait_read(0); }

// ---------------------------------------------------------------- wgmma (PTX ISA "wgmma", warpgroup-collective)
// PTX ISA "wgmma.fence" is required before a wgmma that touches registers accessed since the last one;
// the simulator requires it between each wgmma_wait and the next wgmma.
inline void wgmma_fence() { sd::me().wgmma_fenced = true; }
// wgmma.commit_group: this thread's wgmmas since its last commit form its next group.
inline void wgmma_commit() { sd::wgmma_commit(); }
// PTX ISA "wgmma.wait_group" N: at most N of this thread's committed groups stay pending. The groups that
// must finish execute here, once all 128 threads have committed them, in commit order.
template <int N>
inline void wgmma_wait() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
    sd::wgmma_wait(N);
}
inline void fence_operand(float&) {}

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T, e4m3 from shared memory through descriptors, f32 accumulators;
// `d` is this thread's fragment of N/2 floats (PTX ISA "Register Fragments", D of .m64nNk32). The operands
// are decoded at issue and the product computed at the wgmma_wait that retires its group.
template <int N>
struct WgmmaFp8 {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma .m64nNk32 needs N in 8..256, a multiple of 8");
    static void mma(u64 desc_a, u64 desc_b, float* d, bool scale_d) { sd::wgmma_issue(N, desc_a, desc_b, d, scale_d); }
};

// ---------------------------------------------------------------- stmatrix / setmaxnreg
// stmatrix.sync.aligned.x4.m8n8.shared.b16 (PTX ISA "stmatrix"): lane l gives the address of row l%8 of
// matrix l/8 (16-byte aligned); register q of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix q.
// A warp rendezvous: the last of the 32 lanes to arrive performs the store.
inline void stmatrix_x4(void* row_ptr, u32 r0, u32 r1, u32 r2, u32 r3) {
    const u32 regs[4] = {r0, r1, r2, r3};
    sd::stmatrix_x4(row_ptr, regs);
}

// setmaxnreg (PTX ISA "setmaxnreg") changes nothing here; at the end of the launch every thread of a warpgroup
// must have made the same sequence of calls (.sync.aligned over the warpgroup).
template <u32 kRegisters>
inline void setmaxnreg_inc() {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
    sd::me().setmaxnreg_log.push_back(i32(kRegisters));
}

template <u32 kRegisters>
inline void setmaxnreg_dec() {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
    sd::me().setmaxnreg_log.push_back(-i32(kRegisters));
}

// ---------------------------------------------------------------- conversions, loads, errors
// cvt.rn.bf16x2.f32 / cvt.rn.satfinite.e4m3x2.f32 (PTX ISA "cvt"): lo in the low half.
inline u32 pack_bf16x2(float lo, float hi) { return u32(sd::float_to_bf16(lo)) | (u32(sd::float_to_bf16(hi)) << 16); }
inline u16 pack_e4m3x2(float lo, float hi) { return u16(sd::float_to_e4m3(lo) | (sd::float_to_e4m3(hi) << 8)); }

inline float ld_global_nc(const float* ptr) { return *ptr; }
inline i32 ld_global_nc(const i32* ptr) { return *ptr; }

// Aborts the launch; the report carries `what`.
inline void trap(const char* what) { sd::fail(std::string("trap: ") + (what ? what : "")); }

}  // namespace hal

namespace sim {

// ================================================================ scheduler
namespace detail {

inline bool ready(const Wait& w) {
    Launch& l = L();
    switch (w.kind) {
        case WaitKind::Mbarrier: {
            auto it = l.ctas[w.cta].mbarriers.find(w.key);
            return it == l.ctas[w.cta].mbarriers.end() || (it->second.phase & 1) != w.parity;
        }
        case WaitKind::NamedBarrier: return l.ctas[w.cta].named[w.key].generation != w.target;
        case WaitKind::ClusterBarrier: return l.clusters[w.cta].barrier.generation != w.target;
        case WaitKind::WgmmaGroup: return l.ctas[w.cta].warpgroups[w.key].complete >= w.target;
        case WaitKind::StmatrixWarp: return l.ctas[w.cta].warps[w.key].generation != w.target;
    }
    return true;
}

inline std::string describe_wait(const Thread& t) {
    const Wait& w = t.wait;
    Launch& l = L();
    switch (w.kind) {
        case WaitKind::Mbarrier: {
            const Mbarrier& mb = l.ctas[w.cta].mbarriers.at(w.key);
            return format("mbar_wait(bar@smem+%#x, parity %u) - barrier in phase %llu (parity %u), %u of %u arrivals "
                          "pending, tx-count %lld",
                          w.key, w.parity, static_cast<unsigned long long>(mb.phase), unsigned(mb.phase & 1),
                          mb.pending, mb.expected, static_cast<long long>(mb.tx));
        }
        case WaitKind::NamedBarrier: {
            const ThreadBarrier& b = l.ctas[w.cta].named[w.key];
            if (b.expected == kAllThreads)
                return format("%s(barrier %u) - %u of the %u threads not exited arrived", t.wait_op, w.key, b.arrived,
                              l.ctas[w.cta].live);
            return format("%s(barrier %u) - %u of %u threads arrived", t.wait_op, w.key, b.arrived, b.expected);
        }
        case WaitKind::ClusterBarrier: {
            const Launch::Cluster& c = l.clusters[w.cta];
            return format("cluster_sync(cluster %u) - %u of the %u threads not exited arrived", w.cta,
                          c.barrier.arrived, c.live);
        }
        case WaitKind::WgmmaGroup: {
            const Warpgroup& wg = l.ctas[w.cta].warpgroups[w.key];
            const u64 g = w.target - 1;
            const u32 committed = g - wg.executed < wg.groups.size() ? wg.groups[g - wg.executed].committed : 0;
            return format("wgmma_wait - group %llu of warpgroup %u committed by %u of 128 threads",
                          static_cast<unsigned long long>(g), w.key, committed);
        }
        case WaitKind::StmatrixWarp:
            return format("stmatrix_x4 - %u of 32 lanes of warp %u arrived", l.ctas[w.cta].warps[w.key].arrived, w.key);
    }
    return "";
}

inline std::string thread_range(u32 first, u32 last) {
    std::string s = first == last ? format("thread %u", first) : format("threads %u-%u", first, last);
    if (first / 32 == last / 32) return s + format(" (warp %u)", first / 32);
    return s + format(" (warps %u-%u)", first / 32, last / 32);
}

// One line per run of consecutive threads of a CTA in the same state.
inline std::string deadlock_report() {
    Launch& l = L();
    std::string out = "deadlock: no thread can make progress\n";
    const u32 block = l.cfg.block_x;
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        u32 first = 0;
        std::string state;
        for (u32 tid = 0; tid <= block; ++tid) {
            std::string s;
            if (tid < block) {
                const Thread& t = *l.threads[size_t(c) * block + tid];
                s = t.done ? std::string("exited") : t.blocked ? describe_wait(t) : std::string("runnable");
            }
            if (tid == block || s != state) {
                if (tid > 0) out += format("  cta %u %s: ", c, thread_range(first, tid - 1).c_str()) + state + "\n";
                first = tid;
                state = s;
            }
        }
    }
    return out;
}

// Checks that only make sense once every thread has returned.
inline void final_checks() {
    Launch& l = L();
    const u32 block = l.cfg.block_x;
    for (u32 c = 0; c < l.ctas.size(); ++c) {
        for (u32 w = 0; w < l.ctas[c].warpgroups.size(); ++w)
            if (!l.ctas[c].warpgroups[w].groups.empty()) {
                l.failed = true;
                l.error = format("cta %u warpgroup %u: wgmma issued but never waited for (missing wgmma_wait)", c, w);
                return;
            }
        for (u32 tid = 0; tid < block; ++tid) {
            const Thread& t = *l.threads[size_t(c) * block + tid];
            const Thread& leader = *l.threads[size_t(c) * block + tid / kWarpgroupThreads * kWarpgroupThreads];
            if (t.setmaxnreg_log != leader.setmaxnreg_log) {
                l.failed = true;
                l.error = format("cta %u: setmaxnreg calls differ between thread %u and thread %u of the same "
                                 "warpgroup (.sync.aligned: the whole warpgroup must execute them)",
                                 c, leader.tid, tid);
                return;
            }
            if (!t.open_stores.empty() || !t.committed_stores.empty()) {
                l.failed = true;
                l.error = format("cta %u thread %u: exited with TMA stores not waited for (tma_store_wait_*)", c, tid);
                return;
            }
        }
    }
}

inline void fiber_main() {
    Launch& l = L();
    l.entry(l.params);
    Thread& t = *l.current;
    t.done = true;
    Cta& cta = l.ctas[t.cta];
    thread_barrier_release(cta.named[0], --cta.live);
    Launch::Cluster& cluster = l.clusters[t.cta / l.cfg.cluster_x];
    thread_barrier_release(cluster.barrier, --cluster.live);
}  // uc_link returns to the scheduler

inline std::string validate_config(const LaunchConfig& cfg, u32 max_threads) {
    if (cfg.grid_x == 0 || cfg.block_x == 0) return "grid_x and block_x must be positive";
    if (cfg.block_x > max_threads)
        return format("block_x=%u exceeds the kernel's NUM_THREADS=%u (__launch_bounds__)", cfg.block_x, max_threads);
    if (cfg.cluster_x == 0 || cfg.cluster_x > 8 || cfg.grid_x % cfg.cluster_x)
        return format("cluster_x=%u must be in 1..8 and divide grid_x=%u", cfg.cluster_x, cfg.grid_x);
    if (cfg.dynamic_smem_bytes > kMaxSmemBytes)
        return format("dynamic_smem_bytes=%u exceeds the sm_90 limit of %u", cfg.dynamic_smem_bytes, kMaxSmemBytes);
    if (cfg.reserved != 0 || (cfg.flags & ~kFlagZeroSmem)) return "unknown LaunchConfig flags";
    return "";
}

inline void release(Launch& l) {
    for (auto& t : l.threads)
        if (t->stack) munmap(t->stack, kFiberStackBytes + 4096);
    for (Cta& c : l.ctas)
        if (c.smem) munmap(c.smem, l.smem_alloc);
}

// A fiber for thread `tid` of CTA `cta`, with a guard page below its stack (an overflow faults instead of
// corrupting a neighbour). Kept out of run(): getcontext returns twice, which would pin run()'s locals.
__attribute__((noinline)) inline void add_fiber(Launch& l, u32 cta, u32 tid) {
    void* p = mmap(nullptr, kFiberStackBytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        l.failed = true;
        l.error = "out of memory for fiber stacks";
        return;
    }
    mprotect(p, 4096, PROT_NONE);
    auto t = std::make_unique<Thread>();
    t->cta = cta;
    t->tid = tid;
    t->stack = p;
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = static_cast<u8*>(p) + 4096;
    t->ctx.uc_stack.ss_size = kFiberStackBytes;
    t->ctx.uc_link = &l.scheduler;
    makecontext(&t->ctx, fiber_main, 0);
    l.threads.push_back(std::move(t));
}

// Synchronous faults inside a fiber (a wild pointer in the kernel, a fiber stack overflowing into its guard
// page) abandon that fiber and fail the launch instead of killing the process. The handler runs on an
// alternate stack (the fiber's may be exhausted). Outside a fiber it reinstalls the previous handler and
// returns: the fault recurs and that handler (e.g. Python's faulthandler) sees it.
struct FaultGuard {
    static constexpr size_t kAltStackBytes = 64 * 1024;
    struct sigaction previous_segv, previous_bus;
    stack_t previous_stack;
    std::unique_ptr<u8[]> alt_stack{new u8[kAltStackBytes]};

    static void on_fault(int sig, siginfo_t* info, void*);
    FaultGuard();
    ~FaultGuard();
};
inline FaultGuard* g_fault_guard = nullptr;

inline void FaultGuard::on_fault(int sig, siginfo_t* info, void*) {
    Launch* l = g_launch;
    if (!l || !l->in_fiber) {
        sigaction(sig, sig == SIGSEGV ? &g_fault_guard->previous_segv : &g_fault_guard->previous_bus, nullptr);
        return;
    }
    l->fault_signal = sig;
    l->fault_address = info->si_addr;
    setcontext(&l->scheduler);  // back into run(), as if the fiber had yielded
}

inline FaultGuard::FaultGuard() {
    stack_t ss{};
    ss.ss_sp = alt_stack.get();
    ss.ss_size = kAltStackBytes;
    sigaltstack(&ss, &previous_stack);
    struct sigaction sa{};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
    sigaction(SIGBUS, &sa, &previous_bus);
    g_fault_guard = this;
}

inline FaultGuard::~FaultGuard() {
    sigaction(SIGSEGV, &previous_segv, nullptr);
    sigaction(SIGBUS, &previous_bus, nullptr);
    sigaltstack(&previous_stack, nullptr);
    g_fault_guard = nullptr;
}

inline void report_fault(Launch& l) {
    const Thread& t = *l.current;
    l.failed = true;
    const char* kind = l.fault_signal == SIGBUS ? "bus error" : "segmentation fault";
    l.error = format("cta %u thread %u (warp %u lane %u): %s at address %p (a bad pointer, or more than %zu KiB of "
                     "fiber stack)",
                     t.cta, t.tid, t.tid / 32, t.tid % 32, kind, l.fault_address, kFiberStackBytes / 1024);
}

// Runs one launch to completion; returns 0 or 1 (error in g_last_error).
inline int run(const LaunchConfig& cfg, u32 max_threads, void (*entry)(const void*), const void* params) {
    g_last_error.clear();
    if (g_launch) {
        g_last_error = "a simulated launch is already running (launches are not reentrant)";
        return 1;
    }
    const std::string bad = validate_config(cfg, max_threads);
    if (!bad.empty()) {
        g_last_error = "invalid launch: " + bad;
        return 1;
    }
    Launch l;
    l.cfg = cfg;
    l.entry = entry;
    l.params = params;
    l.smem_alloc = (size_t(cfg.dynamic_smem_bytes) + 4095) / 4096 * 4096 + 4096;
    l.ctas.resize(cfg.grid_x);
    l.clusters.resize(cfg.grid_x / cfg.cluster_x);
    for (Launch::Cluster& c : l.clusters) c.live = cfg.cluster_x * cfg.block_x;
    g_launch = &l;
    for (Cta& c : l.ctas) {
        // Page-aligned (so 1024-byte aligned, as the device's dynamic smem), poisoned.
        void* p = mmap(nullptr, l.smem_alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            l.failed = true;
            l.error = "out of memory for shared memory";
            break;
        }
        c.smem = static_cast<u8*>(p);
        std::memset(c.smem, (cfg.flags & kFlagZeroSmem) ? 0x00 : 0xFF, l.smem_alloc);
        c.live = cfg.block_x;
        c.warps.resize((cfg.block_x + 31) / 32);
        c.warpgroups.resize((cfg.block_x + kWarpgroupThreads - 1) / kWarpgroupThreads);
    }
    for (u32 c = 0; c < cfg.grid_x && !l.failed; ++c)
        for (u32 tid = 0; tid < cfg.block_x && !l.failed; ++tid) add_fiber(l, c, tid);

    const FaultGuard fault_guard;
    const auto start = std::chrono::steady_clock::now();
    u64 steps = 0;
    while (!l.failed) {
        bool resumed = false, all_done = true;
        for (auto& tp : l.threads) {
            Thread& t = *tp;
            if (t.done) continue;
            all_done = false;
            if (t.blocked) {
                if (!ready(t.wait)) continue;
                t.blocked = false;
            }
            l.current = &t;
            l.in_fiber = true;
            swapcontext(&l.scheduler, &t.ctx);
            l.in_fiber = false;
            if (l.fault_signal) report_fault(l);
            resumed = true;
            ++steps;
            if (l.failed) break;
        }
        if (l.failed) break;
        const bool landed = !l.pending_loads.empty();
        const std::string error = land_tma_loads();
        if (!error.empty()) {
            l.failed = true;
            l.error = error;
            break;
        }
        if (all_done) {
            final_checks();
            break;
        }
        if (!resumed && !landed) {
            l.failed = true;
            l.error = deadlock_report();
            break;
        }
        if (cfg.max_steps && steps > cfg.max_steps) {
            l.failed = true;
            l.error = format("step limit: %llu fiber resumptions without finishing\n",
                             static_cast<unsigned long long>(cfg.max_steps)) + deadlock_report();
            break;
        }
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (cfg.timeout_s > 0 && elapsed > cfg.timeout_s) {
            l.failed = true;
            l.error = format("timeout: launch still running after %.1f s\n", elapsed) + deadlock_report();
            break;
        }
    }
    if (l.failed) g_last_error = l.error;
    release(l);
    g_launch = nullptr;
    return l.failed ? 1 : 0;
}

}  // namespace detail
}  // namespace sim
}  // namespace dfg

// The detailed report of the last failed launch of this library ("" after a successful one). Defined here,
// not inline: hal/sim.hpp is included by exactly one translation unit per simulator library.
DFG_SIM_EXPORT const char* dfg_sim_last_error() { return dfg::sim::detail::g_last_error.c_str(); }

// Kernel entry: `extern "C" int NAME_sim(const PARAMS_T* params, const dfg::sim::LaunchConfig* cfg)` runs
// the whole launch, BODY(*params) on every simulated thread; returns 0 on success, nonzero on error.
#define DFG_DEFINE_KERNEL(NAME, NUM_THREADS, PARAMS_T, BODY)                                               \
    DFG_SIM_EXPORT int NAME##_sim(const PARAMS_T* params, const dfg::sim::LaunchConfig* cfg) {            \
        return dfg::sim::detail::run(*cfg, (NUM_THREADS),                                                  \
                                     [](const void* p) { BODY(*static_cast<const PARAMS_T*>(p)); }, params); \
    }
