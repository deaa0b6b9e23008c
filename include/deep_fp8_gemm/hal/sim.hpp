// deep_fp8_gemm hardware layer, CPU simulator implementation (built with -DDFG_SIMULATOR).
//
// Same names, signatures and semantics as hal/ptx.cuh, emulated on the host so that the *same kernel
// source* runs on a machine without a GPU. The translation unit is compiled with g++ into a shared
// library (deep_fp8_gemm/simulator/build.py); DFG_DEFINE_KERNEL gives it one C entry point per kernel.
//
// Execution model
//   * Every thread of every CTA of the grid is a cooperative fiber (ucontext) on one OS thread. All CTAs
//     are co-resident, as on a GPU running a persistent grid of <= #SM CTAs, so the CTAs of a cluster
//     are co-scheduled. With seed 0 the scheduler resumes fibers round-robin in (cta, thread) order; a
//     fiber runs until it blocks in a hal operation (mbarrier wait, bar.sync, cluster barrier, wgmma wait,
//     a warp rendezvous, setmaxnreg, griddepcontrol.wait) or returns. Any other seed (LaunchConfig::seed,
//     DFG_SIM_SEED) gives a seeded adversarial schedule (sim/schedule.hpp). The interleaving is deterministic
//     for a seed.
//   * A run is a stream of launches (dfg_sim_run_stream; one for NAME_sim): each starts after the previous one
//     ended, a programmatic dependent launch (PDL) as soon as every CTA of the previous one executed
//     griddepcontrol.launch_dependents or exited, its fibers then scheduled together with the previous launch's.
//     Between dfg_sim_stream_open and _close, runs append to one stream (deep_fp8_gemm.simulator.stream(): the ops'
//     own launch sequence), of any kernel library: the emulation and its state live in one runtime library per set
//     of headers that every kernel library links (sim/api.hpp). Each run still ends with its launches; a PDL launch
//     of a later run is ordered after its predecessor only by griddepcontrol.wait (the race detector keeps the
//     stream's accesses across runs), though it no longer overlaps it in time.
//   * At most kMaxResidentThreads threads (fewer if vm.max_map_count requires) are resident at once: further CTAs
//     start as resident ones exit, as on a GPU's SMs (sim/state.hpp).
//   * A blocked fiber is resumed only once its wait condition holds; when a whole scheduling pass resumes
//     nothing, the launch is deadlocked and the report lists who waits on what (see deadlock_report).
//   * TMA loads are checked at issue and land (copy + complete-tx) at the end of the scheduling pass, so a
//     thread that reads a stage without waiting for its barrier sees stale or poisoned bytes. cp.async copies
//     land at the end of a pass too, and their cp.async.mbarrier.arrive fires once they all have (sim/cp_async.hpp).
//     TMA stores keep a copy of their source for tma_store_wait_* and write global memory when their bulk group
//     completes (a cp.async.bulk.wait_group without .read covering it, or the thread's exit). wgmma groups
//     execute lazily at wgmma_wait (all committed groups but the newest N), so reading accumulators before
//     the wait sees stale values, and a TMA write into shared memory that an unwaited wgmma still reads is
//     caught as an error.
//   * Shared memory is filled with 0xFF (NaN as e4m3, bf16 and f32) so reads of unwritten data show up.
//     Global memory is host memory: kernel parameters carry host pointers.
//   * wgmma arithmetic follows a model of the Hopper FP8 tensor core (sim/numerics.hpp, mma_fp8_k32:
//     13-bit truncating accumulator), and for BF16 / TF32 operands one of fp32 accumulation (mma_wide_slice);
//     kFlagExactMma (DFG_SIM_EXACT_MMA=1) accumulates in exact fp32.
//   * Checked beyond a sequentially consistent machine, each report naming its kind, thread and call site
//     (the hal functions take __builtin_FILE / __builtin_LINE default arguments; plain accesses are named by
//     their return address, symbolised with addr2line):
//       proxy        generic-proxy writes (stmatrix, plain stores) read by the async proxy (TMA store, wgmma)
//                    without the writer's fence.proxy.async and a barrier ordering it; mbarrier.init used by TMA
//                    complete_tx or a remote arrive before it was fenced and (across CTAs) cluster-synced
//                    (sim/proxy.hpp)
//       registers    setmaxnreg against the CTA's pool of launch_registers (ptxas) per thread
//                    (sim/registers.hpp): unsatisfiable inc = deadlock naming warpgroups and counts; a count
//                    below a wgmma accumulator fragment's needs
//       convergence  .aligned operations (bar.sync, barrier.cluster, wgmma.*, setmaxnreg, stmatrix) at the
//                    same call site in the same round by the whole warp / warpgroup (sim/convergence.hpp)
//       cluster lifetime  exit while a peer may still arrive / multicast into the CTA, remote operations
//                    into an exited CTA, TMA loads in flight at exit (sim/cluster.hpp)
//       race         wgmma operands changing between issue and the retiring wait; TMA into operands of an
//                    unwaited wgmma or landing under a wgmma issued before it. And memory ordering
//                    (sim/hb.hpp, sim/shadow.hpp): every plain load / store of shared and global memory, the
//                    atomics, cp.async, stmatrix and TMA's reads and writes, against the last conflicting
//                    access of another thread of any CTA or kernel of the stream, by vector clocks over the
//                    edges PTX's memory model gives (barriers, mbarrier arrive / wait, release / acquire at a
//                    scope, fences, kernel boundaries, griddepcontrol.wait). No happens-before path: `race`,
//                    with both threads and both call sites; only through a relaxed atomic: `relaxed`; only
//                    through a release / acquire whose scope does not include the other thread (or two atomics
//                    whose scopes do not include each other): `scope`
//       wgmma registers  a thread's access to the accumulator or register A fragment of its own wgmma between the
//                    issue and the wgmma.wait_group that retires it; a register a wgmma uses that the thread accessed
//                    after its last wgmma.fence; an accumulator touched after the retiring wait without the register
//                    fence (hal::fence_operand) (sim/wgmma_registers.hpp)
//       misaligned   a plain access the compiler emitted as naturally aligned (N-byte vector) at an address that is
//                    not (sim/instrument.hpp)
//       pdl          an access of a programmatic dependent launch, before its griddepcontrol.wait, that
//                    conflicts with one of the previous kernel (either way round); a CTA of one exiting with
//                    no thread having executed the wait (the next kernel's wait would no longer cover the one
//                    before)
//       tensormap    a TMA load through a tensor map outside the kernel parameters (one an earlier kernel or a
//                    host copy put in global memory) without the issuing thread's fence.proxy.tensormap::generic.acquire on it
//
// Instrumentation of plain accesses (sim/instrument.hpp). The kernels read and write shared and global memory
// through raw pointers, in source the sm_90a build shares, which this round's other issues are changing. The
// simulator build compiles the translation unit with GCC's -fsanitize=thread (no function entry / exit hooks) and
// links it without libtsan: GCC calls __tsan_readN / __tsan_writeN before every load and store it cannot prove
// thread-local, and sim/instrument.hpp defines those functions. Chosen over
//   * a wrapper type for shared-memory pointers handed out by hal::dynamic_smem: the kernels immediately hold
//     `u8*` / `float*` / `u64*`, pass them to helpers with raw-pointer parameters, and get global pointers from
//     the parameter struct, so the wrapper would decay at the first assignment unless every signature in the
//     kernel headers changed, and it could never see global memory;
//   * a source rewrite in simulator/build.py: finding every dereference (`sa[frag_row + w * 64]`, `*counter = 0`,
//     a Float4 store through reinterpret_cast, an accessor inlined from another header) needs a C++ parser; a
//     textual rewrite would miss some and break others.
// The compiler sees every access after inlining and optimisation (values in registers are not memory), in every
// kernel header present and future, with no change to them. The whole translation unit is instrumented, the
// simulator's own code included, so the hooks filter first on a flag that is set only while kernel code runs
// (every hal function clears it for its duration: DFG_SIM_HAL), then the thread's own fiber stack and the
// parameter struct. Costs: -g1 line tables (addr2line names a plain access's call site), a slower emulation
// (README, "CPU simulator"), ~24 bytes of shadow per byte a kernel touches with plain accesses; DFG_SIM_RACES=0
// (kFlagNoRaces) keeps the instrumentation but skips the checks.
//
// Not modelled (a kernel can still be wrong on the GPU in these ways and pass here):
//   * Values are those of a sequentially consistent machine: a load returns the latest store. A racy read that
//     the GPU may satisfy with an older value is reported, not exhibited; and only accesses the schedule
//     executes are checked (a racy read on a path this schedule did not take, e.g. a flag it did not see, is
//     not). Preemption happens only at hal operations, never between two plain loads or stores.
//   * Intra-warp ordering: PTX orders a warp's lanes only through bar.warp.sync (modelled) and barriers. The
//     model also orders, for a warpgroup-collective wgmma group, every thread's accesses before its
//     wgmma.commit_group before every thread's accesses after the wgmma.wait_group that retires the group (the
//     group executes once all 128 threads committed it); the kernels' one-lane-per-warp stage release after the
//     wait relies on it for reads made before the wgmma, as CUTLASS's consumer_release does. shfl / vote / elect
//     give no ordering.
//   * The async proxy at 16-byte granularity: TMA accesses keep the last async write and the last async read per
//     granule; async accesses to shared memory are checked against plain ones only (not against each other:
//     the wgmma-window and landing checks cover those); a TMA load's global read counts at its issue, a TMA
//     store's global write at its group's completion by the issuing thread's clock there; a TMA load's smem write is
//     ordered after its issuer's accesses before the issue, and before a waiter of the phase it completes
//     (also when a later release of the issuer reached the reader first).
//   * mbarrier arrive / wait always have their default .release.cta / .acquire.cta semantics (the hal has no
//     other forms); .sys is .gpu; all kernels of a stream are one GPU. A cp.async reads its source at the issue;
//     cp.async.wait_group is not in the hal (the kernels track copies with cp.async.mbarrier.arrive).
//     ld.global.nc is checked as a plain load (that nothing writes the data during the kernel is implied by
//     ordering, not checked on its own).
//   * Host work between two runs is ordered before and after both (also in an open stream, where on the GPU a
//     torch kernel between two of ours would break the PDL chain: the simulator does not see it).
//   * The register count of the code between setmaxnreg calls is not known: only wgmma accumulator
//     fragments count as live; registers of exited warps are not returned to the pool.
//   * wgmma operand registers are tracked from a thread's first wgmma of a fragment on (an access before it is not
//     attributed), and only accesses the compiler left in memory are seen (the fragments are locals whose address
//     the hal takes, so all of them are in the simulator build).
//   * The tensor-core model is ours (group of 16 products, 13 aligned bits, truncation), fitted to the
//     published facts, not proven bit-exact; bf16 (k16, K- or MN-major) and tf32 (k8, K-major) wgmma exist with
//     shared-memory operands (no register A for them); fp16 and other shapes do not exist here.
//   * Timing, bank conflicts, L2 promotion, TMA prefetch and the cost of anything are not modelled.
//   * Only rank-3 tensor maps, 1-D clusters of up to 8 CTAs, and the hal operations below exist.
//
// Errors (bounds, alignment, descriptors, barrier misuse, the checks above, trap()) abort the whole
// launch: the entry point returns nonzero and dfg_sim_last_error() gives the report.
//
// Sources: PTX ISA 8.x, sections cited by title per operation; layouts cross-checked against CuTe
// (cute/arch/mma_sm90_desc.hpp, cute/atom/mma_traits_sm90_gmma.hpp, cute/atom/copy_traits_sm90*.hpp)
// by tests/kernels/test_sim_groundtruth.py.
#pragma once
#include "../common.cuh"
#include "memory_order.cuh"

#if !defined(DFG_SIMULATOR)
#error "hal/sim.hpp is the CPU simulator implementation; it needs -DDFG_SIMULATOR"
#endif

#include <dlfcn.h>
#include <unistd.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#define DFG_SIM_EXPORT extern "C" __attribute__((visibility("default")))
// The emulation's functions and state: exported by the runtime library (simulator/build.py) and bound by every
// kernel library that links it (sim/api.hpp).
#define DFG_SIM_API __attribute__((visibility("default")))

// The emulation, one concern per file (each opens the namespaces it needs): the state and what the hal calls
// always; the rest only where it is compiled (sim/api.hpp: once per set of headers, into the runtime library every
// kernel library links; or here, without DFG_SIM_LINKED_RUNTIME). The runtime's cache key covers common.cuh and hal/
// only (deep_fp8_gemm/simulator/build.py): nothing here may include another header of the library.
#include "sim/abi.hpp"
#include "sim/clocks.hpp"
#include "sim/state.hpp"
#include "sim/api.hpp"
#if !defined(DFG_SIM_LINKED_RUNTIME)
#include "sim/access.hpp"
#include "sim/numerics.hpp"
#include "sim/schedule.hpp"
#include "sim/convergence.hpp"
#include "sim/hb.hpp"
#include "sim/shadow.hpp"
#include "sim/proxy.hpp"
#include "sim/registers.hpp"
#include "sim/cluster.hpp"
#include "sim/barriers.hpp"
#include "sim/memory.hpp"
#include "sim/cp_async.hpp"
#include "sim/tma.hpp"
#include "sim/wgmma.hpp"
#include "sim/wgmma_registers.hpp"
#include "sim/threads.hpp"
#include "sim/instrument.hpp"
#include "sim/scheduler.hpp"
#endif

namespace dfg {

// ================================================================ the hal interface (see hal/ptx.cuh)
namespace hal {
namespace sd = ::dfg::sim::detail;  // the emulation; kernels use only the hal names below

// Every operation that can block or fail takes the caller's file and line as default arguments (the kernel
// source stays identical to the device build's): reports name the call site in the kernel source. Entering
// an operation is also where an adversarial schedule may preempt the thread.
// Every hal function also clears the instrumentation's tracking for its duration (DFG_SIM_HAL, sim/instrument.hpp):
// the emulation's own memory accesses are not the kernel's.
#define DFG_SIM_SITE const char *dfg_file = __builtin_FILE(), int dfg_line = __builtin_LINE()
#define DFG_SIM_HAL const sd::HalGuard dfg_hal_guard
#define DFG_SIM_ENTER \
    DFG_SIM_HAL;      \
    sd::enter(dfg_file, dfg_line)

// ---------------------------------------------------------------- indices
inline u32 thread_idx() {
    DFG_SIM_HAL;
    return sd::me().tid;
}
inline u32 block_idx() {
    DFG_SIM_HAL;
    return sd::me().cta;
}
inline u32 grid_dim() {
    DFG_SIM_HAL;
    return sd::L().cfg.grid_x;
}
inline u32 warp_idx() {
    DFG_SIM_HAL;
    return sd::me().tid / 32;
}
inline u32 lane_idx() {
    DFG_SIM_HAL;
    return sd::me().tid % 32;
}
// __shfl_sync(full mask, value, 0). Simulated threads do not exchange registers: the kernel broadcasts only
// values every lane computed identically (scheduler state), for which lane 0's value is the caller's own.
// A full-mask shfl.sync must be reached by all 32 lanes: checked like the .aligned operations.
inline u32 warp_broadcast(u32 value, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::aligned("shfl.sync");
    return value;
}
// shfl.sync.idx from the calling lane: `value` itself (only a compiler barrier on the device). Checked like .aligned.
inline u32 pin(u32 value, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::aligned("shfl.sync");
    return value;
}
// shfl.sync.bfly.b32 with the full mask (PTX ISA "shfl.sync"): lane l gets lane (l ^ lane_mask)'s `value`. Unlike
// warp_broadcast the lanes' values differ, so this one is a real exchange: a warp rendezvous (as stmatrix's) where
// each lane leaves its value and, once all 32 arrived, reads its partner's (sim/threads.hpp). No memory ordering.
inline float shfl_xor(float value, u32 lane_mask, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    return sd::shfl_xor(value, lane_mask);
}
// vote.sync.all with the full mask. As for warp_broadcast, kernels vote only on values every lane computed
// identically (the scheduler's "more tiles"), so the caller's own value is the vote. Checked like .aligned.
inline bool warp_all(bool pred, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::aligned("vote.sync");
    return pred;
}
// bar.warp.sync with the full mask: the warp's lanes meet; accesses before it are ordered before those after it.
inline void warp_sync(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::warp_sync();
}
// elect.sync with the full mask (PTX ISA "elect.sync"): true in exactly one lane of the warp, here lane 0
// (kernels must not depend on which lane the hardware picks). All 32 lanes must reach it together: checked
// like the .aligned operations.
inline bool elect_one_sync(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::aligned("elect.sync");
    return lane_idx() == 0;
}
// %cluster_ctarank (PTX ISA "Special Registers"): 1-D clusters are runs of cluster_x consecutive CTAs.
inline u32 cluster_cta_rank() {
    DFG_SIM_HAL;
    return sd::me().cta % sd::L().cfg.cluster_x;
}
// %cluster_nctarank: CTAs per cluster.
inline u32 cluster_num_ctas() {
    DFG_SIM_HAL;
    return sd::L().cfg.cluster_x;
}

// ---------------------------------------------------------------- shared memory
// Page-aligned (so 1024-byte aligned, as on the device) and poisoned with 0xFF at launch.
inline u8* dynamic_smem() {
    DFG_SIM_HAL;
    return sd::my_cta().smem;
}
// A CTA's shared window starts at 0 here: these offsets are what descriptors and TMA addresses see.
inline u32 smem_addr(const void* ptr) {
    DFG_SIM_HAL;
    return sd::smem_offset(ptr, "smem_addr");
}

// ---------------------------------------------------------------- CTA / cluster synchronisation
// bar.sync 0 (PTX ISA "bar, barrier") without a count: every thread of the CTA that has not exited.
inline void sync_threads(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::sync_threads();
}
// bar.sync id, n: n a positive multiple of 32; arrivals are counted per thread.
inline void named_barrier_sync(u32 id, u32 num_threads, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::named_barrier_sync(id, num_threads);
}
// bar.red.or.pred id, n, pred (PTX ISA "bar, barrier"): as named_barrier_sync, and every participant gets the OR
// of the round's predicates. Mixing bar.sync and bar.red in one round of a barrier is reported.
inline bool named_barrier_sync_or(u32 id, u32 num_threads, bool pred, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    return sd::named_barrier_sync_or(id, num_threads, pred);
}
// barrier.cluster.arrive + wait (PTX ISA "barrier.cluster"): every thread of every CTA of the cluster.
inline void cluster_sync(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::cluster_sync();
}

// fence.mbarrier_init.release.cluster: this thread's mbarrier.inits become visible to the cluster and the
// async proxy once a barrier orders the fence (sim/proxy.hpp).
inline void fence_barrier_init(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::fence_mbarrier_inits();
}
// fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory writes (stmatrix, mbarrier.init)
// become visible to later async-proxy accesses ordered after the fence (sim/proxy.hpp).
inline void fence_view_async_shared(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::fence_proxy_async();
    sd::fence_mbarrier_inits();
}

// ---------------------------------------------------------------- mbarrier (PTX ISA "mbarrier")
// mbarrier.init: phase 0, pending = expected = arrive_count, tx-count 0.
inline void mbar_init(u64* bar, u32 arrive_count, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::mbar_init(bar, arrive_count);
}
inline void mbar_arrive(u64* bar, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::mbarrier_arrive(sd::me().cta, sd::mbarrier_offset(bar, "mbar_arrive"), 0, "mbar_arrive");
}
// mapa + mbarrier.arrive.shared::cluster: the barrier at the same offset in CTA `cta_rank` of the cluster.
inline void mbar_arrive_cluster(u64* bar, u32 cta_rank, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::mbar_arrive_cluster(bar, cta_rank);
}
// mapa.shared::cluster: the emulation's shared::cluster address is the CTA rank << 24 | the smem offset (sim/threads.hpp);
// mbarrier.arrive.shared::cluster at such an address.
inline u32 cluster_smem_address(const void* smem_ptr, u32 cta_rank, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    return sd::cluster_smem_address(smem_ptr, cta_rank);
}
inline void mbar_arrive_cluster_address(u32 remote_bar, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::mbar_arrive_cluster_address(remote_bar);
}
inline void mbar_arrive_expect_tx(u64* bar, u32 tx_bytes, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::mbarrier_arrive(sd::me().cta, sd::mbarrier_offset(bar, "mbar_arrive_expect_tx"), tx_bytes,
                        "mbar_arrive_expect_tx");
}
// mbarrier.try_wait.parity (PTX ISA "mbarrier.test_wait / mbarrier.try_wait"): returns once the phase with
// parity `phase` has completed, i.e. while the current phase's parity differs from `phase`.
// `name` labels the barrier in deadlock reports, as the watchdog build's message on the GPU.
inline void mbar_wait(u64* bar, u32 phase, BarrierName name = BarrierName{"mbarrier", 0}, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::mbar_wait(bar, phase, name);
}

// ---------------------------------------------------------------- memory model: atomics, fences (sim/memory.hpp)
// Global memory only (4-byte aligned host memory, not shared memory). The value is that of a sequentially
// consistent machine; what the operation orders is what PTX says for its order and scope (sim/hb.hpp).
// Entering one is a preemption point of adversarial schedules, so other CTAs can run between a thread's plain
// stores and its atomic.
// atom{.sem}{.scope}.global.add.u32 (PTX ISA "atom"): *ptr += value, returns the old value.
template <MemOrder kOrder, MemScope kScope>
inline u32 atomic_add(u32* ptr, u32 value, DFG_SIM_SITE) {
    static_assert(kOrder != MemOrder::SeqCst, "atom has no .sc semantics: use fence.sc and a relaxed atom");
    DFG_SIM_ENTER;
    return sd::atomic_add_global(ptr, value, sd::order_of(kOrder), sd::scope_of(kScope), sd::op_name("atomic_add", kOrder, kScope));
}
// ld{.relaxed|.acquire}{.scope}.global.u32 (PTX ISA "ld").
template <MemOrder kOrder, MemScope kScope>
inline u32 atomic_load(const u32* ptr, DFG_SIM_SITE) {
    static_assert(kOrder == MemOrder::Relaxed || kOrder == MemOrder::Acquire, "ld is .relaxed or .acquire");
    DFG_SIM_ENTER;
    return sd::atomic_load_global(ptr, sd::order_of(kOrder), sd::scope_of(kScope), sd::op_name("atomic_load", kOrder, kScope));
}
// st{.relaxed|.release}{.scope}.global.u32 (PTX ISA "st").
template <MemOrder kOrder, MemScope kScope>
inline void atomic_store(u32* ptr, u32 value, DFG_SIM_SITE) {
    static_assert(kOrder == MemOrder::Relaxed || kOrder == MemOrder::Release, "st is .relaxed or .release");
    DFG_SIM_ENTER;
    sd::atomic_store_global(ptr, value, sd::order_of(kOrder), sd::scope_of(kScope), sd::op_name("atomic_store", kOrder, kScope));
}
// fence{.acq_rel|.sc}{.scope} (PTX ISA "membar / fence").
template <MemOrder kOrder, MemScope kScope>
inline void fence(DFG_SIM_SITE) {
    static_assert(kOrder == MemOrder::AcqRel || kOrder == MemOrder::SeqCst, "fence is .acq_rel or .sc");
    DFG_SIM_ENTER;
    sd::fence(sd::order_of(kOrder), sd::scope_of(kScope), sd::op_name("fence", kOrder, kScope));
}
// atom.acq_rel.gpu.global.add.u32: split-K's tile counters (split_k.cuh).
inline u32 atomic_add_acq_rel_gpu(u32* ptr, u32 value, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    return sd::atomic_add_global(ptr, value, sd::Order::AcqRel, sd::Scope::Gpu, "atomic_add_acq_rel_gpu");
}

// ---------------------------------------------------------------- programmatic dependent launch (PTX ISA "griddepcontrol")
// griddepcontrol.wait: waits until the previous launch of the stream (deep_fp8_gemm.simulator.launch_stream) has
// completed and its memory operations are visible; orders everything this thread does next after all of it. In a
// programmatic dependent launch every CTA must execute it (or the next launch's wait would not cover the previous
// kernel); without one the previous launch has ended and it returns at once.
inline void grid_dependency_wait(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::grid_dependency_wait();
}
// griddepcontrol.launch_dependents: the next launch, if programmatic, may start once every CTA executed it or
// exited. No memory ordering (the dependent's wait gives it): where it sits is a performance question.
inline void launch_dependents(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::launch_dependents();
}

// ---------------------------------------------------------------- cp.async (PTX ISA "cp.async")
// The copy completes later, on its own (sim/cp_async.hpp): its bytes land in shared memory at the end of a
// scheduling pass, and only cp_async_mbar_arrive's arrive-on, which fires once every earlier copy of this thread
// landed, orders them before a waiter of the barrier.
inline void cp_async_4(void* smem_dst, const void* gmem_src, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::cp_async_copy(smem_dst, gmem_src, 4);
}
inline void cp_async_mbar_arrive(u64* bar, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::cp_async_arrive(bar);
}

// ---------------------------------------------------------------- TMA (PTX ISA "cp.async.bulk.tensor"), rank 3
inline void tma_prefetch(const TensorMap* map) {
    DFG_SIM_HAL;
    sd::tensor_map(map, "tma_prefetch");
}
// tensormap.replace.tile.{global_address, global_dim, global_stride}.shared::cta (PTX ISA "tensormap.replace") on a
// packed map in this CTA's shared memory (sim/tma.hpp, tensormap_replace: where it is, what may be replaced).
inline void tensormap_replace_global_address(TensorMap* smem_map, u64 address, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tensormap_replace_address(smem_map, address);
}
template <u32 kOrdinal>
inline void tensormap_replace_global_dim(TensorMap* smem_map, u32 extent, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tensormap_replace_dim(smem_map, kOrdinal, extent);
}
template <u32 kOrdinal>
inline void tensormap_replace_global_stride(TensorMap* smem_map, u64 bytes, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tensormap_replace_stride(smem_map, kOrdinal, bytes);
}
// tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned: warp-collective copy of
// the 128-byte map to global memory (checked like the other .aligned operations).
inline void tensormap_cp_fenceproxy(TensorMap* gmem_map, const TensorMap* smem_map, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::aligned("tensormap.cp_fenceproxy");
    sd::tensormap_copy_out(gmem_map, smem_map);
}

// fence.proxy.tensormap::generic.acquire.sys [map], 128: this thread may use a tensor map that an earlier kernel
// (or a host copy) put in global memory (checked by every TMA load through a map outside the kernel parameters, sim/tma.hpp).
inline void tensormap_fence_acquire(const TensorMap* map, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tensormap_acquire(map);
}

inline void tma_load_3d(void* dst, const TensorMap* map, u64* bar, i32 c0, i32 c1, i32 c2, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tma_load(dst, map, bar, 1u << cluster_cta_rank(), false, c0, c1, c2, "tma_load_3d");
}

inline void tma_load_3d_multicast(void* dst, const TensorMap* map, u64* bar, u16 cta_mask, i32 c0, i32 c1,
                                  i32 c2, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tma_load(dst, map, bar, cta_mask, true, c0, c1, c2, "tma_load_3d_multicast");
}

// Keeps a copy of the smem source, which tma_store_wait_read / _all compare against (overwriting the source before
// the wait is reported), and writes global memory (in-bounds elements only) when its bulk group completes: at a
// tma_store_wait_all covering it, or at the thread's exit (sim/threads.hpp).
inline void tma_store_3d(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tma_store(map, src, c0, c1, c2);
}
// PTX ISA "cp.async.bulk.commit_group" / "cp.async.bulk.wait_group" [.read] N: bulk groups are per thread.
inline void tma_store_commit(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tma_store_commit();
}
// .read: the sources of all but the newest N groups have been read (their global writes may still be pending).
template <int N>
inline void tma_store_wait_read(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tma_store_wait(N, false);
}
// Without .read: every committed group is complete, its writes made and visible to this thread.
inline void tma_store_wait_all(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::tma_store_wait(0, true);
}

// ---------------------------------------------------------------- wgmma (PTX ISA "wgmma", warpgroup-collective)
// PTX ISA "wgmma.fence" is required before a wgmma that touches registers accessed since the last one;
// the simulator requires it between each wgmma_wait and the next wgmma.
inline void wgmma_fence(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::wgmma_fence();
}
// wgmma.commit_group: this thread's wgmmas since its last commit form its next group.
inline void wgmma_commit(DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    sd::wgmma_commit();
}
// PTX ISA "wgmma.wait_group" N: at most N of this thread's committed groups stay pending. The groups that
// must finish execute here, once all 128 threads have committed them, in commit order.
template <int N>
inline void wgmma_wait(DFG_SIM_SITE) {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
    DFG_SIM_ENTER;
    sd::wgmma_wait(N);
}
// The register fence of ptx.cuh (an empty asm with `reg` as "+f" / "+r" operand): a compiler-ordering point for one
// register. Recorded for the wgmma registers' rule (sim/wgmma_registers.hpp): after the wgmma.wait_group that
// retires a wgmma, the thread must pass each accumulator register through it before touching it.
// NOTES: no DFG_SIM_HAL guard: the wrapper itself touches no memory (it passes an address), and the runtime it calls
// is not instrumented, so the guard's two calls would only add to a call the K loops make per accumulator register.
inline void fence_operand(float& reg) { sd::register_fence(&reg); }
inline void fence_operand(u32& reg) { sd::register_fence(&reg); }

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T, e4m3 from shared memory through descriptors, f32 accumulators;
// `d` is this thread's fragment of N/2 floats (PTX ISA "Register Fragments", D of .m64nNk32). The operands
// are decoded at issue and the product computed at the wgmma_wait that retires its group.
template <int N>
struct WgmmaFp8 {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma .m64nNk32 needs N in 8..256, a multiple of 8");
    static void mma(u64 desc_a, u64 desc_b, float* d, bool scale_d, DFG_SIM_SITE) {
        DFG_SIM_ENTER;
        sd::wgmma_issue(N, desc_a, desc_b, d, scale_d);
    }
};

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T with A from registers: `a` is this thread's A fragment, four .b32 registers
// of four e4m3 each in the layout of WgmmaFragmentA (mma.cuh; PTX ISA figure "WGMMA .m64nNk32 register fragment
// layout for matrix A"), B from shared memory through its descriptor, `d` as for WgmmaFp8. The fragments are read
// at issue and must stay unchanged, as the accumulators, until the wgmma_wait that retires the group
// (sim/wgmma_registers.hpp); the product goes through the same tensor-core model as WgmmaFp8's.
template <int N>
struct WgmmaFp8RegA {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma .m64nNk32 needs N in 8..256, a multiple of 8");
    static void mma(const u32 (&a)[4], u64 desc_b, float* d, bool scale_d, DFG_SIM_SITE) {
        DFG_SIM_ENTER;
        sd::wgmma_issue_rs(N, a, desc_b, d, scale_d);
    }
};

// D[64 x N] (+)= A[64 x 16] . B[N x 16]^T in bf16 (wgmma .m64nNk16.f32.bf16.bf16; CuTe
// MMA_64xNx16_F32BF16BF16_SS), or A[64 x 8] . B[N x 8]^T in tf32 (.m64nNk8.f32.tf32.tf32), both from shared memory
// through descriptors, f32 accumulators in the fragment of WgmmaFp8; the product follows the BF16 / TF32
// tensor-core model (sim/numerics.hpp, mma_wide_slice). A k-slice is 32 bytes of K per row, as for e4m3, so the
// descriptors of a K-major tile advance the same way. kTransA / kTransB (PTX imm-trans-a / -b, bf16 only): the
// operand is MN-major, decoded with make_gmma_desc<Major::MN>'s canonical layouts (sim/wgmma.hpp).
template <int N, int kTransA = 0, int kTransB = 0>
struct WgmmaBf16 {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma .m64nNk16 needs N in 8..256, a multiple of 8");
    static_assert((kTransA == 0 || kTransA == 1) && (kTransB == 0 || kTransB == 1), "imm-trans is 0 or 1");
    static void mma(u64 desc_a, u64 desc_b, float* d, bool scale_d, DFG_SIM_SITE) {
        DFG_SIM_ENTER;
        sd::wgmma_issue_typed(sd::kWgmmaBf16, N, desc_a, desc_b, d, scale_d, kTransA != 0, kTransB != 0);
    }
};

template <int N>
struct WgmmaTf32 {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma .m64nNk8 needs N in 8..256, a multiple of 8");
    static void mma(u64 desc_a, u64 desc_b, float* d, bool scale_d, DFG_SIM_SITE) {
        DFG_SIM_ENTER;
        sd::wgmma_issue_typed(sd::kWgmmaTf32, N, desc_a, desc_b, d, scale_d, false, false);
    }
};

// ---------------------------------------------------------------- stmatrix / setmaxnreg
// stmatrix.sync.aligned.x4.m8n8.shared.b16 (PTX ISA "stmatrix"): lane l gives the address of row l%8 of
// matrix l/8 (16-byte aligned); register q of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix q.
// A warp rendezvous: the last of the 32 lanes to arrive performs the store.
inline void stmatrix_x4(void* row_ptr, u32 r0, u32 r1, u32 r2, u32 r3, DFG_SIM_SITE) {
    DFG_SIM_ENTER;
    const u32 regs[4] = {r0, r1, r2, r3};
    sd::stmatrix_x4(row_ptr, regs);
}

// setmaxnreg (PTX ISA "setmaxnreg", .sync.aligned over the warpgroup): accounted against the CTA's register
// pool of launch_registers per thread (sim/registers.hpp); an inc waits for registers other warpgroups freed.
template <u32 kRegisters>
inline void setmaxnreg_inc(DFG_SIM_SITE) {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
    DFG_SIM_ENTER;
    sd::aligned("setmaxnreg.inc", true);
    sd::setmaxnreg(kRegisters, true);
}

template <u32 kRegisters>
inline void setmaxnreg_dec(DFG_SIM_SITE) {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
    DFG_SIM_ENTER;
    sd::aligned("setmaxnreg.dec", true);
    sd::setmaxnreg(kRegisters, false);
}

// ---------------------------------------------------------------- conversions, loads, errors
// fma.rn.f32 (ptx.cuh): one rounding, as the GPU's FFMA; std::fma is correctly rounded (glibc picks the CPU's FMA
// instruction where it has one). Registers only: no guard needed.
inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
// lop3 of the two floats' bits under `mask` (ptx.cuh): `second`'s bits where mask is 1.
inline float select_bits(float first, float second, u32 mask) {
    DFG_SIM_HAL;
    u32 a, b;
    std::memcpy(&a, &first, 4);
    std::memcpy(&b, &second, 4);
    const u32 bits = (a & ~mask) | (b & mask);
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}
// prmt.b32 default mode (ptx.cuh): byte i of the result is byte selector[4i+2:4i] of {b, a}, its sign replicated
// when selector bit 4i+3 is set (PTX ISA "prmt"). Registers only.
inline u32 prmt(u32 a, u32 b, u32 selector) {
    const u64 pool = u64(a) | (u64(b) << 32);
    u32 out = 0;
    for (u32 i = 0; i < 4; ++i) {
        const u32 s = (selector >> (4 * i)) & 0xFu;
        u32 byte = u32(pool >> (8 * (s & 7u))) & 0xFFu;
        if (s & 8u)
            byte = (byte & 0x80u) ? 0xFFu : 0u;
        out |= byte << (8 * i);
    }
    return out;
}
// cvt.rn.bf16x2.f32 / cvt.rn.satfinite.e4m3x2.f32 (PTX ISA "cvt"): lo in the low half.
inline u32 pack_bf16x2(float lo, float hi) {
    DFG_SIM_HAL;
    return u32(sd::float_to_bf16(lo)) | (u32(sd::float_to_bf16(hi)) << 16);
}
inline u16 pack_e4m3x2(float lo, float hi) {
    DFG_SIM_HAL;
    return u16(sd::float_to_e4m3(lo) | (sd::float_to_e4m3(hi) << 8));
}

// A plain read as far as the race checks go (the device's non-coherent path needs data nobody writes during
// the kernel, which ordering before the read implies here).
// These plain loads and stores are not preemption points (as the C++ accesses they stand for).
inline float ld_global_nc(const float* ptr, DFG_SIM_SITE) {
    DFG_SIM_HAL;
    sd::at(dfg_file, dfg_line);
    sd::hal_access(ptr, 4, false, "ld.global.nc");
    return *ptr;
}
inline i32 ld_global_nc(const i32* ptr, DFG_SIM_SITE) {
    DFG_SIM_HAL;
    sd::at(dfg_file, dfg_line);
    sd::hal_access(ptr, 4, false, "ld.global.nc");
    return *ptr;
}

// ld.global.v2.f32 / st.global.v2.f32: a misaligned vector access faults on the GPU, so the simulator fails the
// launch on one (the hosts check d / c alignment; this catches a kernel-side address that breaks it).
inline F32x2 ld_global_f32x2(const float* ptr, DFG_SIM_SITE) {
    DFG_SIM_HAL;
    sd::at(dfg_file, dfg_line);
    sd::check_aligned(ptr, 8, "ld.global.v2.f32");
    sd::hal_access(ptr, 8, false, "a plain read (ld.global.v2.f32)");
    F32x2 v;
    std::memcpy(&v, ptr, sizeof v);
    return v;
}
inline void st_global_f32x2(float* ptr, F32x2 v, DFG_SIM_SITE) {
    DFG_SIM_HAL;
    sd::at(dfg_file, dfg_line);
    sd::check_aligned(ptr, 8, "st.global.v2.f32");
    sd::hal_access(ptr, 8, true, "a plain write (st.global.v2.f32)");
    std::memcpy(ptr, &v, sizeof v);
}

// Aborts the launch; the report carries `what`.
inline void trap(const char* what, DFG_SIM_SITE) {
    DFG_SIM_HAL;
    sd::at(dfg_file, dfg_line);
    sd::fail(std::string("trap: ") + (what ? what : ""));
}

}  // namespace hal

}  // namespace dfg

#if !defined(DFG_SIM_LINKED_RUNTIME)
// The detailed report of the last failed launch of this library ("" after a successful one). Defined here,
// not inline: hal/sim.hpp is included by exactly one translation unit per simulator library.
DFG_SIM_EXPORT const char* dfg_sim_last_error() { return dfg::sim::detail::g_last_error.c_str(); }

// Runs `count` launches of this library's kernels as one stream (in order; a programmatic one may overlap its
// predecessor); returns 0 on success, nonzero on error (dfg_sim_last_error).
DFG_SIM_EXPORT int dfg_sim_run_stream(const dfg::sim::StreamItem* items, dfg::u32 count) {
    return dfg::sim::detail::run_stream(items, count);
}

// Opens a stream that later dfg_sim_run_stream calls append their launches to, of any kernel library that links this
// runtime (a quantiser, then a GEMM), until dfg_sim_stream_close; returns nonzero (dfg_sim_last_error) when one is
// already open. A launch appended with `programmatic` set is a programmatic dependent launch of the stream's previous
// launch, also when that one ran in an earlier call (deep_fp8_gemm.simulator.stream()).
DFG_SIM_EXPORT int dfg_sim_stream_open() { return dfg::sim::detail::open_stream(); }
DFG_SIM_EXPORT void dfg_sim_stream_close() { dfg::sim::detail::close_stream(); }

// The global bytes TMA loads have read since the runtime was loaded (sim/tma.hpp g_tma_load_bytes).
DFG_SIM_EXPORT unsigned long long dfg_sim_tma_load_bytes() { return dfg::sim::detail::g_tma_load_bytes; }
#endif

// Kernel entry: `extern "C" int NAME_sim(const PARAMS_T* params, const dfg::sim::LaunchConfig* cfg)` runs
// the whole launch, BODY(*params) on every simulated thread; returns 0 on success, nonzero on error.
// `NAME_sim_kernel()` describes the kernel for dfg_sim_run_stream.
#define DFG_DEFINE_KERNEL(NAME, NUM_THREADS, PARAMS_T, BODY)                                                   \
    DFG_SIM_EXPORT const dfg::sim::KernelInfo* NAME##_sim_kernel() {                                          \
        static const dfg::sim::KernelInfo info{+[](const void* p) { BODY(*static_cast<const PARAMS_T*>(p)); }, \
                                               (NUM_THREADS), 0, sizeof(PARAMS_T)};                            \
        return &info;                                                                                          \
    }                                                                                                          \
    DFG_SIM_EXPORT int NAME##_sim(const PARAMS_T* params, const dfg::sim::LaunchConfig* cfg) {                \
        const dfg::sim::StreamItem item{NAME##_sim_kernel(), params, *cfg, 0, 0};                               \
        return dfg::sim::detail::run_stream(&item, 1);                                                         \
    }
