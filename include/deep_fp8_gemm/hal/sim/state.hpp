// deep_fp8_gemm CPU simulator: simulator state (launch, CTAs, threads, waits).
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

namespace dfg::sim::detail {

constexpr u32 kWarpgroupThreads = 128;
// wgmma operand types (WgmmaOp::type; api.hpp wgmma_issue_typed).
constexpr u32 kWgmmaE4m3 = 0, kWgmmaBf16 = 1, kWgmmaTf32 = 2;
constexpr u32 kMaxSmemBytes = 232448;  // sm_90 opt-in maximum dynamic shared memory per CTA (227 KiB)
constexpr size_t kFiberStackBytes = 256 * 1024;
// Each fiber stack is its own mapping with a PROT_NONE guard page below it: two entries of the process's memory
// map (the guard cannot merge with a neighbouring read-write stack). Linux caps a process at vm.max_map_count
// mappings (65530 by default), so a stream keeps at most this many threads resident (their CTAs running, as the
// SMs of a GPU hold only so many CTAs at once) and starts further CTAs as resident ones exit, reusing their
// stacks: any grid size runs in a bounded number of mappings (scheduler.hpp, admit_ctas). 16384 threads (32768
// mappings) leave room for the process's own; fewer when /proc/sys/vm/max_map_count says so.
constexpr u32 kMaxResidentThreads = 16384;
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
    GridDependency,       // griddepcontrol.wait: the preceding launch of the stream has not completed
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
    // Happens-before (hb.hpp): arrivals (release) and TMA complete_tx of the current phase; what the last
    // completed phase of each parity released, for its waiters (acquire).
    SyncVar arrivals, released[2];
};

// bar.sync barriers (PTX ISA "bar, barrier") and the cluster barrier (PTX ISA "barrier.cluster").
// The forms without a thread count wait for every thread that has not exited (PTX ISA "exit": an
// exiting thread releases a barrier it alone was holding up); a count form waits for exactly that many.
constexpr u32 kAllThreads = ~0u;
struct ThreadBarrier {
    u32 expected = 0;  // thread count of the current round, kAllThreads, or 0 when idle
    u32 arrived = 0;
    u64 generation = 0;
    // Happens-before (hb.hpp): the join of the arrivals of the current round, and of the last completed one.
    Clocks join, released;
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
    // shfl.sync.bfly (shfl_xor): the lanes' values, one bank per generation parity. A lane reads its partner's
    // value after the rendezvous completed; the bank is written again two rendezvous later at the earliest, which
    // needs this lane's arrival at the next one first, i.e. after its read.
    float shfl[2][32];
    Clocks join, released;  // bar.warp.sync orders the lanes' accesses (hb.hpp)
};

// One wgmma.mma_async of a warpgroup: identical descriptors from all 128 threads, one fragment each.
struct WgmmaOp {
    u64 desc_a, desc_b;  // desc_a: 0 when A comes from registers (reg_a)
    u32 n;
    bool scale_d;
    bool reg_a = false;  // A from registers (wgmma.mma_async with a register A fragment, hal::WgmmaFp8RegA)
    bool trans_a = false, trans_b = false;  // MN-major A / B (bf16 only: PTX imm-trans-a / -b)
    u32 type = 0;        // operand type: kWgmmaE4m3 (k32), kWgmmaBf16 (k16), kWgmmaTf32 (k8); 32 bytes of K per row
    u32 issued = 0;
    float* frag[kWarpgroupThreads] = {};
    std::vector<u8> a_codes;          // reg_a: the 64 x 32 e4m3 codes of A gathered from the threads' fragments
    std::vector<u32> addr_a, addr_b;  // decoded operand byte offsets, [row * 32 + k] (addr_a empty for reg_a)
    u32 lo_a = 0, hi_a = 0, lo_b, hi_b;  // smem byte ranges [lo, hi) the operands read
    std::vector<u8> snapshot;         // operand bytes at issue (A then B): the read window lasts to the wait
    Site issue_site{};
    u32 issue_tid = 0;
};

struct WgmmaGroup {
    std::vector<WgmmaOp> ops;
    u32 committed = 0;  // threads that have committed this group
    Clocks join;        // the committing threads' clocks (hb.hpp)
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
    // Happens-before (hb.hpp): the commit joins of executed groups [retired_base, retired_base + size), kept
    // until every thread of the warpgroup has acquired them at its wgmma_wait.
    std::deque<Clocks> retired;
    u64 retired_base = 0;
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

// A TMA store of a bulk async-group (threads.hpp): its source is read from the issue to the group's
// cp.async.bulk.wait_group.read, its global writes are made at the group's completion (threads.hpp, tma_store_flush).
struct StoreRecord {
    u32 offset;                // smem source offset
    std::vector<u8> snapshot;  // the source bytes at issue
    u32 site = 0;              // the store's call site id (hb.hpp)
    SimTensorMap map;          // where it writes: a copy of the map, the box coordinates
    i32 c[3];
};
struct StoreGroup {
    std::vector<StoreRecord> stores;
    bool read_done = false;  // a wait_group.read covered it: its sources may be reused; its writes may be pending
};

// The registers of one thread that its wgmmas use as accumulator (D) or A fragment (wgmma_registers.hpp): a window
// of the fiber stack that covers every fragment array the thread passed to a wgmma (the kernels' fragment arrays are
// locals, so the instrumentation sees the thread's own accesses), with per 4-byte register what the rules need of
// each access, and the fragments themselves as ranges of it, whose state changes per wgmma in O(1).
enum class RegRole : u8 { Accumulator, A };
struct OperandRange {
    u32 first, count;          // registers [first, first + count) of the window, as a wgmma took them
    RegRole role;
    u16 n = 0;                 // the latest wgmma's N (for reports)
    bool in_flight = false;
    u64 group = 0;             // in flight: the group of the latest wgmma using it
    Site issue_site{}, retire_site{};  // that wgmma's call site; the wgmma.wait_group that retired it last
    u32 touched_fence = ~0u;   // the thread's wgmma.fence count at its latest access of one of its registers
    u32 touched_index = 0;     // that register (relative to first), the access's site id and kind
    u32 touched_site = 0;
    bool touched_write = false;
};
struct OperandRegisters {
    uintptr_t lo = 0, hi = 0;     // the window [lo, hi) of the stack, 4-byte registers
    std::vector<u8> unfenced;     // per register: retired as an accumulator, not through hal::fence_operand since
    std::vector<OperandRange> ranges;
    u32 in_flight = 0;            // ranges in flight
    u32 fences = 0;               // wgmma.fence executed by the thread
    Site fence_site{};            // the last one's call site
};

struct Thread {
    std::unique_ptr<ucontext_t> ctx;  // allocated while the thread's CTA is resident (scheduler.hpp, admit_cta)
    void* stack = nullptr;            // its fiber stack (guard page first), from the stream's pool
    u32 cta = 0, tid = 0;
    u32 gcta = 0, gtid = 0;  // CTA and thread numbered across the launches of the stream (hb.hpp)
    u32 kernel = 0;          // index of its launch in the stream
    bool done = false, blocked = false;
    Wait wait{};
    const char* wait_op = "";
    Site site{};  // call site of the hal operation in progress
    std::vector<const void*> tensormaps_acquired;  // fence.proxy.tensormap::generic.acquire'd maps (tma.hpp)
    // Happens-before (hb.hpp): what this thread is ordered after; clocks.strong.own[tid] is its own clock,
    // which a release ticks. fence_clocks: own clock at each fence.proxy.async (proxy.hpp). cluster_gen:
    // cluster-barrier generation this thread last left.
    Clocks clocks;
    std::vector<u32> fence_clocks;
    u64 cluster_gen = 0;
    u32 generic_write_site = 0;  // site id (hb.hpp) of its last generic-proxy smem store (stmatrix, plain store)
    // Fences (hb.hpp): the clocks at this thread's last fence.acq_rel / fence.sc (a later relaxed atomic write
    // releases them), and what its relaxed atomic reads observed since (a later fence acquires it).
    std::unique_ptr<Clocks> fence_release;
    Scope fence_release_scope = Scope::Cta;
    std::vector<Observed> observed;
    u64 wgmma_acquired = 0;  // wgmma groups whose commit join this thread has acquired
    // wgmma bookkeeping (PTX ISA "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group")
    u64 wgmma_commits = 0;
    u32 wgmma_ops_in_open_group = 0;
    bool wgmma_fenced = false;
    OperandRegisters wgmma_registers;  // accumulator / A registers its wgmmas used (wgmma_registers.hpp)
    // cp.async (cp_async.hpp): copies issued and completed so far; copy_unit: this Thread stands for a CTA's
    // cp.async completions (no fiber, tid = block_x), not a thread of the kernel
    u64 copies_issued = 0, copies_done = 0;
    bool copy_unit = false;
    // bulk async-groups of TMA stores (PTX ISA "cp.async.bulk.commit_group", "cp.async.bulk.wait_group")
    std::vector<StoreRecord> open_stores;
    std::deque<StoreGroup> committed_stores;  // committed, not yet complete, oldest first
};

struct Cta {
    u8* smem = nullptr;
    u32 gcta = 0;
    // Programmatic dependent launch (memory.hpp): a thread executed griddepcontrol.launch_dependents / .wait;
    // the kernels wholly ordered before this CTA when it triggered or exited (what a dependent starts with).
    bool triggered = false, dependency_waited = false;
    u32 done_for_dependents = 0;
    std::unordered_map<u32, Mbarrier> mbarriers;  // keyed by smem offset
    ThreadBarrier named[16];
    u32 live = 0;  // threads not exited
    bool exited = false;
    std::vector<WarpRendezvous> warps;
    std::vector<Warpgroup> warpgroups;
    std::vector<AlignedLog> warp_aligned, warpgroup_aligned;
    i64 reg_free = 0;   // registers in the CTA's pool not held by a warpgroup
    u64 reg_total = 0;  // launch_registers * block_x
    // The CTA's cp.async completion mechanism, as a thread of the happens-before model (cp_async.hpp): its own clock
    // counts completions; created at the CTA's first cp.async.
    std::unique_ptr<Thread> copy_unit;
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
    Clocks issuer;          // the issuing thread's clocks at the issue: complete_tx releases them (hb.hpp)
    u64 epoch = 0;          // the issue, as an access epoch (shadow.hpp)
    u32 site = 0;           // its call site id
};

// A cp.async between issue and completion (cp_async.hpp): the bytes it copies (read at the issue), where to, who.
struct PendingCopy {
    u32 cta, offset, bytes;
    u8 data[16];
    u32 tid;        // the issuing thread (its CTA's)
    Clocks issuer;  // its clocks at the issue: the completion is ordered after what it did before
    u32 site = 0;
};
// A cp.async.mbarrier.arrive.noinc: its arrive-on fires once the issuing thread's cp.asyncs [0, upto) completed.
struct PendingCopyArrive {
    u32 cta, bar_offset, tid;
    u64 upto;
    u32 site = 0;
};

struct Launch {
    LaunchConfig cfg{};
    void (*entry)(const void*) = nullptr;
    const void* params = nullptr;
    size_t params_bytes = 0;  // sizeof the parameter struct: tensor maps outside it are in global memory (tma.hpp)
    size_t smem_alloc = 0;    // bytes per CTA of the one mapping `smem_base` that holds every CTA's shared memory
    u8* smem_base = nullptr;
    // Place in the stream (scheduler.hpp): index, first global CTA / thread number, programmatic dependent
    // launch (may start before the previous launch ends), started / finished.
    u32 index = 0, cta_base = 0, thread_base = 0;
    bool programmatic = false, started = false, finished = false;
    u32 start_done = 0;  // kernels of the stream wholly ordered before its threads start (hb.hpp)
    // The kernel's library (hb.hpp, register_library): its base address and its number in pc site ids.
    uintptr_t lib_base = 0;
    u32 lib_bits = 0;
    // Residency (scheduler.hpp, admit_ctas): CTAs [0, admitted) have been made resident (threads created, in
    // cluster units), exited_ctas of them have exited; threads[cta * block_x + tid] is null before its CTA is.
    u32 admitted = 0, exited_ctas = 0;
    std::vector<Cta> ctas;
    struct Cluster {
        ThreadBarrier barrier;
        u32 live = 0;  // threads of the cluster not exited
    };
    std::vector<Cluster> clusters;
    std::vector<std::unique_ptr<Thread>> threads;
    std::vector<PendingLoad> pending_loads;
    std::deque<PendingCopy> pending_copies;          // in issue order (cp_async.hpp)
    std::vector<PendingCopyArrive> pending_copy_arrives;
    std::vector<float> scratch;  // decoded wgmma operands
    std::vector<u32> scratch_mag, scratch_neg;  // the same as magnitude / sign integers (tensor-core model)
    std::vector<u8> scratch_nan;     // operand rows holding a NaN code
};

struct Shadow;  // shadow.hpp

// The launches of one run, in stream order (one for a plain launch). Fibers of every started launch are
// scheduled together; what a failure, the scheduler and the happens-before model need is here.
struct Stream {
    std::vector<std::unique_ptr<Launch>> launches;
    u32 next_launch = 0;  // the first launch not yet started
    ucontext_t scheduler;
    Thread* current = nullptr;
    bool failed = false;
    std::string error;
    bool in_fiber = false;  // a fiber is running (the fault handler may abandon it)
    int fault_signal = 0;
    void* fault_address = nullptr;
    std::vector<Thread*> threads;   // by global thread index (gtid)
    std::vector<Launch*> cta_launch;  // by global CTA index (gcta)
    bool races = true;              // the happens-before checks of plain and atomic accesses (kFlagNoRaces)
    std::unique_ptr<Shadow> shadow;
    // Fiber stacks (scheduler.hpp): every stack mapped for the stream, those free for the next resident CTA, the
    // threads resident now and the most there may be (kMaxResidentThreads, or what vm.max_map_count leaves; 0 until
    // the stream first needs to know).
    std::vector<void*> stacks, free_stacks;
    u32 resident_threads = 0, max_resident_threads = 0;
};

// The emulation's state is one per process, in the runtime library every kernel library links (api.hpp): the
// kernels' translation units (DFG_SIM_LINKED_RUNTIME) see these as external symbols of it, so a stream may run
// kernels of several libraries (a quantiser, then a GEMM).
#if defined(DFG_SIM_LINKED_RUNTIME)
extern DFG_SIM_API Stream* g_stream;
extern DFG_SIM_API Launch* g_launch;
#else
DFG_SIM_API Stream* g_stream = nullptr;
DFG_SIM_API Launch* g_launch = nullptr;  // the launch of the thread running (or of the work the scheduler does)
#endif
inline std::string g_last_error;

inline Stream& S() { return *g_stream; }
inline Launch& L() { return *g_launch; }
inline Thread& me() { return *g_stream->current; }
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
// "cta 1 thread 37 (warp 1 lane 5)", with "kernel k " first when the stream has several launches.
inline std::string thread_name(const Thread& t) {
    const std::string kernel = S().launches.size() > 1 ? format("kernel %u ", t.kernel) : std::string();
    if (t.copy_unit) return kernel + format("cta %u's cp.async completion", t.cta);
    return kernel + format("cta %u thread %u (warp %u lane %u)", t.cta, t.tid, t.tid / 32, t.tid % 32);
}

// Thrown by fail() outside a fiber: the scheduler's own work on behalf of a thread (a cp.async completing) reports
// through the same checks, and catches it (the error is in the stream).
struct SchedulerFailure {};

[[noreturn]] inline void fail(const std::string& what) {
    Stream& s = S();
    Thread& t = me();
    s.failed = true;
    s.error = thread_name(t) + " at " + site_str(t.site) + ": " + what;
    if (!s.in_fiber) throw SchedulerFailure{};
    swapcontext(t.ctx.get(), &s.scheduler);
    __builtin_unreachable();
}

// Records the call site of the hal operation the current thread is executing.
inline void at(const char* file, int line) { g_stream->current->site = Site{file, line}; }

inline void block(const Wait& w, const char* op) {
    Thread& t = me();
    t.wait = w;
    t.wait_op = op;
    t.blocked = true;
    swapcontext(t.ctx.get(), &S().scheduler);  // resumed only once ready(w) holds
}

}  // namespace dfg::sim::detail
