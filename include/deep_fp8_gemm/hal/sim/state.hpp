// deep_fp8_gemm CPU simulator: simulator state (launch, CTAs, threads, waits).
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

constexpr u32 kWarpgroupThreads = 128;
constexpr u32 kMaxSmemBytes = 232448;  // sm_90 opt-in maximum dynamic shared memory per CTA (227 KiB)
constexpr size_t kFiberStackBytes = 256 * 1024;
// PTX ISA "Contents of the mbarrier object": tx-count range is [-(2^20 - 1), 2^20 - 1], arrival counts < 2^20.
constexpr i64 kMaxTxCount = (1 << 20) - 1;
// Written into an mbarrier's 8 bytes at init: ordinary stores or TMA writes over a live barrier are caught
// when the barrier is next used.
constexpr u64 kMbarrierTag = 0xDF8BA5A1DF8BA5A1ull;

enum class WaitKind : u8 {
    Mbarrier,
    NamedBarrier,
    ClusterBarrier,
    WgmmaGroup,
    StmatrixWarp,
    SetmaxnregWarpgroup,  // the other threads of a warpgroup while one performs its setmaxnreg
    RegisterPool,         // setmaxnreg.inc waiting for registers in the CTA's pool
    Yield,                // preempted by an adversarial schedule: always ready
};

// The call site of a hal operation in the kernel source (captured by default arguments of the hal
// functions, so the kernel source is the same in both builds).
struct Site {
    const char* file = nullptr;
    int line = 0;
};

// "fp8_gemm.cuh:240": the path below the last "deep_fp8_gemm/" of the include directory.
inline std::string site_str(const Site& s) {
    if (!s.file) return "?";
    const char* f = s.file;
    for (const char* p = s.file; (p = std::strstr(p, "deep_fp8_gemm/")) != nullptr; ++p) f = p + 14;
    std::string path(f);
    for (size_t up; (up = path.find("/../")) != std::string::npos;) {  // "kernels/../tma.cuh" -> "tma.cuh"
        const size_t slash = up == 0 ? std::string::npos : path.rfind('/', up - 1);
        const size_t from = slash == std::string::npos ? 0 : slash + 1;
        path.erase(from, up + 4 - from);
    }
    return s.line ? path + ":" + std::to_string(s.line) : path;
}

// What a blocked fiber waits for; the scheduler evaluates it (ready()) without resuming the fiber.
struct Wait {
    WaitKind kind;
    u32 cta;     // CTA whose object is waited on (cluster index for ClusterBarrier)
    u32 key;     // mbarrier smem offset | named barrier id | warpgroup | warp
    u32 parity;  // mbarrier parity
    u64 target;  // generation seen at arrival | wgmma group count that must be committed
    BarrierName name{"mbarrier", 0};  // mbarrier: the kernel's name for it (full/empty + stage)
};

// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier".
struct Mbarrier {
    u32 expected;  // arrival count set by mbarrier.init
    u32 pending;   // arrivals still missing in the current phase
    i64 tx;        // transaction bytes still missing in the current phase (may go negative transiently)
    u64 phase;     // number of completed phases; the current phase's parity is phase & 1
    // Proxy / cluster visibility of the initialisation (proxy.hpp): mbarrier.init is a generic-proxy write
    // that TMA complete_tx (async proxy) and remote arrivals may only see once the initialising thread has
    // fenced it (fence.mbarrier_init.release.cluster / fence.proxy.async) and a barrier ordered the fence.
    u32 init_tid = 0;
    Site init_site{};
    u32 fenced_clock = 0;        // init thread's clock at its fence (0: not fenced)
    u64 fence_cluster_gen = 0;   // cluster-barrier generation at that fence
};

// bar.sync barriers (PTX ISA "bar, barrier") and the cluster barrier (PTX ISA "barrier.cluster").
// The forms without a thread count wait for every thread that has not exited (PTX ISA "exit": an
// exiting thread releases a barrier it alone was holding up); a count form waits for exactly that many.
constexpr u32 kAllThreads = ~0u;
struct ThreadBarrier {
    u32 expected = 0;  // thread count of the current round, kAllThreads, or 0 when idle
    u32 arrived = 0;
    u64 generation = 0;
    // Happens-before (proxy.hpp): the arrivals' vector clocks of the current round and of the last
    // completed one, per CTA of the barrier (one for a CTA's barriers, cluster_x for the cluster's).
    std::vector<std::vector<u32>> join, released;
    // bar.red.or (named_barrier_sync_or): the round's kind (0 idle, 1 bar.sync, 2 bar.red.or), the OR of the
    // current round's predicates, and the result of the last completed round.
    u32 red_kind = 0;
    bool red_or = false, red_result = false;
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
    std::vector<u8> snapshot;         // operand bytes at issue (A then B): the read window lasts to the wait
    Site issue_site{};
    u32 issue_tid = 0;
};

struct WgmmaGroup {
    std::vector<WgmmaOp> ops;
    u32 committed = 0;  // threads that have committed this group
};

struct Warpgroup {
    std::deque<WgmmaGroup> groups;  // issued but not yet executed; groups.front() has index `executed`
    u64 executed = 0;               // groups executed so far
    u64 complete = 0;               // groups committed by all 128 threads
    // Register allocation (registers.hpp): registers per thread now, and the setmaxnreg rendezvous.
    u32 regs = 0;
    Site regs_site{};  // the setmaxnreg that set `regs` (none: the launch allocation)
    u32 setmaxnreg_arrived = 0;
    u64 setmaxnreg_generation = 0;
};

// Convergence of .aligned operations (convergence.hpp): the sequence of .aligned operations of a warp (or
// warpgroup), as far as its slowest lane; every lane must execute the same operation at the same call site
// as its n-th .aligned operation.
struct AlignedEntry {
    const char* op;
    Site site;
    u32 tid;  // the first thread that executed it
};
struct AlignedLog {
    std::deque<AlignedEntry> entries;  // entries[i] is operation number base + i
    u64 base = 0;
    std::vector<u64> count;  // per lane: .aligned operations executed
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
    Site site{};  // call site of the hal operation in progress
    std::vector<const void*> tensormaps_acquired;  // fence.proxy.tensormap::generic.acquire'd maps (tma.hpp)
    // Happens-before among the threads of this CTA (proxy.hpp): vc[t] = the last event of thread t this
    // thread is ordered after; vc[tid] is this thread's own clock. fence_clocks: own clock at each
    // fence.proxy.async. cluster_gen: cluster-barrier generation this thread last left.
    std::vector<u32> vc;
    std::vector<u32> fence_clocks;
    u64 cluster_gen = 0;
    Site generic_write_site{};  // its last generic-proxy shared-memory store (stmatrix)
    // wgmma bookkeeping (PTX ISA "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group")
    u64 wgmma_commits = 0;
    u32 wgmma_ops_in_open_group = 0;
    bool wgmma_fenced = false;
    // bulk async-groups of TMA stores (PTX ISA "cp.async.bulk.commit_group", "cp.async.bulk.wait_group")
    std::vector<StoreRecord> open_stores;
    std::deque<std::vector<StoreRecord>> committed_stores;
};

struct Cta {
    u8* smem = nullptr;
    std::unordered_map<u32, Mbarrier> mbarriers;  // keyed by smem offset
    ThreadBarrier named[16];
    u32 live = 0;  // threads not exited
    bool exited = false;
    std::vector<WarpRendezvous> warps;
    std::vector<Warpgroup> warpgroups;
    std::vector<AlignedLog> warp_aligned, warpgroup_aligned;
    i64 reg_free = 0;   // registers in the CTA's pool not held by a warpgroup
    u64 reg_total = 0;  // launch_registers * block_x
    // Generic-proxy writes not yet read by the async proxy (proxy.hpp), per shared-memory byte: writer
    // thread + 1 (0: none) and the writer's clock at the write.
    std::vector<u16> generic_writer;
    std::vector<u32> generic_clock;
    // Cluster lifetime (cluster.hpp), per source rank of the cluster: the cluster-barrier generation of the
    // last remote operation (multicast or remote arrive) into this CTA (-1: none), its thread and site.
    std::vector<i64> remote_gen;
    std::vector<u32> remote_tid;
    std::vector<Site> remote_site;
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
    size_t params_bytes = 0;  // sizeof the parameter struct: tensor maps outside it are in global memory (tma.hpp)
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
    std::vector<u32> scratch_mag, scratch_neg;  // the same as magnitude / sign integers (tensor-core model)
    std::vector<u8> scratch_nan;     // operand rows holding a NaN code
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
    l.error = format("cta %u thread %u (warp %u lane %u) at %s: ", t.cta, t.tid, t.tid / 32, t.tid % 32,
                     site_str(t.site).c_str()) + what;
    swapcontext(&t.ctx, &l.scheduler);
    __builtin_unreachable();
}

// Records the call site of the hal operation the current thread is executing.
inline void at(const char* file, int line) { g_launch->current->site = Site{file, line}; }

inline void block(const Wait& w, const char* op) {
    Thread& t = me();
    t.wait = w;
    t.wait_op = op;
    t.blocked = true;
    swapcontext(&t.ctx, &L().scheduler);  // resumed only once ready(w) holds
}

}  // namespace dfg::sim::detail
