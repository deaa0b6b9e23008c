// deep_fp8_gemm hardware layer, sm_90a implementation (inline PTX).
//
// Every hardware-specific operation a kernel uses lives behind this interface. hal/sim.hpp
// implements the same functions, with the same signatures and semantics, for the CPU simulator;
// kernel logic above this layer is identical in both builds. When adding an operation, add it to
// both files; tests/kernels/test_hal_parity.py checks that they declare the same operations.
//
// Sources: PTX ISA 8.x, sections "mbarrier", "cp.async.bulk.tensor", "wgmma", "stmatrix",
// "setmaxnreg", "fence.proxy.async"; the PTX strings match CUTLASS/CuTe's cute/arch/*.hpp and
// cutlass/arch/barrier.h (shipped in the nvidia-cutlass wheel).
#pragma once
#include "../common.cuh"
#include "memory_order.cuh"

#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__)
#error "hal/ptx.cuh is the device implementation; build the simulator with -DDFG_SIMULATOR"
#endif

namespace dfg {

// Same size and alignment as the driver's CUtensorMap (cuda.h: alignas(64) cuuint64_t opaque[16]).
// Encoded on the host by cuTensorMapEncodeTiled; the kernel passes its address to TMA instructions.
struct alignas(64) TensorMap {
    u64 opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

// ---------------------------------------------------------------- watchdog build (DFG_WATCHDOG_NS > 0)
// Set by the JIT from DFG_WATCHDOG_SECONDS (deep_fp8_gemm/env.py): every mbarrier wait gives up after
// DFG_WATCHDOG_NS nanoseconds of %globaltimer, prints who waited on what and traps, so a hang becomes
// CUDA_ERROR_LAUNCH_FAILED with a message in the process's stdout instead of a silent stall. Without the
// macro (or with 0) none of this is compiled and the kernels are the plain build (tests/kernels/test_watchdog.py).
// printf goes through the device runtime's vprintf (NVRTC has no <cstdio>): format + packed argument buffer.
#if defined(DFG_WATCHDOG_NS) && DFG_WATCHDOG_NS > 0
#define DFG_WATCHDOG 1
extern "C" __device__ int vprintf(const char* format, const char* args);
// Defined by DFG_DEFINE_KERNEL (one kernel per translation unit): the entry symbol, for the message.
extern "C" __device__ const char dfg_watchdog_kernel_name[];

namespace watchdog {
// %globaltimer in units of 2^20 ns (~1.05 ms), 32 bits (wraps after ~52 days): two registers fewer per wait
// than the 64-bit count, which matters in the producer's 40 registers.
DFG_DEVICE u32 now_ticks() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return static_cast<u32>(t >> 20);
}
constexpr u32 kLimitTicks = static_cast<u32>((static_cast<u64>(DFG_WATCHDOG_NS) + (1ull << 20) - 1) >> 20);

// Inlined: an out-of-line call makes ptxas ignore setmaxnreg (C7507). The vprintf call itself still makes
// ptxas serialise the wgmmas (C7510) and gives the kernel a small stack frame (the argument buffer): the
// watchdog build is a debug build, slower than the plain one, which is unchanged.
DFG_DEVICE void expired(BarrierName name, u32 smem_offset, u32 parity) {
    struct {  // vprintf's argument buffer: each argument at its natural alignment, in order
        const char* kernel;
        u32 block, thread;
        unsigned long long limit_ns;
        const char* role;
        u32 index, smem_offset, parity;
    } args = {dfg_watchdog_kernel_name, blockIdx.x, threadIdx.x, static_cast<unsigned long long>(DFG_WATCHDOG_NS),
              name.role, name.index, smem_offset, parity};
    vprintf("deep_fp8_gemm watchdog: kernel %s block %u thread %u waited more than %llu ns in "
            DFG_MBAR_WAIT_FORMAT "; trap\n",
            reinterpret_cast<const char*>(&args));
    asm volatile("trap;");
}
}  // namespace watchdog
#define DFG_WATCHDOG_KERNEL_NAME(NAME) extern "C" __device__ const char dfg_watchdog_kernel_name[] = #NAME;
#else
#define DFG_WATCHDOG_KERNEL_NAME(NAME)
#endif

namespace hal {

// ---------------------------------------------------------------- indices
DFG_DEVICE u32 thread_idx() { return threadIdx.x; }
DFG_DEVICE u32 block_idx() { return blockIdx.x; }
DFG_DEVICE u32 grid_dim() { return gridDim.x; }
// Warp index made warp-uniform so that role branches compile to uniform control flow.
DFG_DEVICE u32 warp_idx() { return __shfl_sync(0xffffffffu, threadIdx.x / 32, 0); }
DFG_DEVICE u32 lane_idx() { return threadIdx.x % 32; }
// Lane 0's `value` in every lane; all 32 lanes must call it. The result is provably warp-uniform, so
// branches and addresses derived from it stay on the uniform datapath (values read from global memory,
// e.g. a grouped layout, are not, even when every lane reads the same address).
DFG_DEVICE u32 warp_broadcast(u32 value) { return __shfl_sync(0xffffffffu, value, 0); }

// `value`, through a shfl.sync.idx from the calling lane itself; all 32 lanes must call it.
// NOTES: ptxas cannot see through it, so it keeps the value in a register instead of re-deriving it from
// its inputs inside a loop (it re-materialises cheap chains such as the thread's fragment row each iteration).
DFG_DEVICE u32 pin(u32 value) { return __shfl_sync(0xffffffffu, value, threadIdx.x % 32); }

// shfl.sync.bfly.b32 with the full mask: the `value` of lane (this lane ^ lane_mask); all 32 lanes must call it
// (PTX ISA "shfl.sync"). The quad reductions of kernels/mqa_logits.cuh exchange partial sums through it. No
// memory ordering.
DFG_DEVICE float shfl_xor(float value, u32 lane_mask) { return __shfl_xor_sync(0xffffffffu, value, lane_mask); }

// vote.sync.all with the full mask: whether `pred` holds in every lane; all 32 lanes must call it.
// NOTES: ptxas treats the result as warp-uniform, so a loop whose exit tests it is not divergent, and the
// loop-carried values of loops nested in it (the stage ring's cursor) stay on the uniform datapath.
DFG_DEVICE bool warp_all(bool pred) { return __all_sync(0xffffffffu, pred) != 0; }

// elect.sync with the full mask (PTX ISA "elect.sync"): true in exactly one lane of the warp, which all 32
// lanes must reach together. NOTES: ptxas knows that only the elected lane runs what it guards, so a TMA,
// barrier arrive or cp.async issued there needs no ELECT / BRA.U.ANY waterfall over the active lanes (a
// thread picked by `thread == t` gets one around every such instruction: ~6 instructions each).
DFG_DEVICE bool elect_one_sync() {
    u32 elected = 0;
    asm volatile(
        "{\n"
        ".reg .pred P;\n"
        "elect.sync _|P, 0xffffffff;\n"
        "selp.u32 %0, 1, 0, P;\n"
        "}\n"
        : "=r"(elected));
    return elected != 0;
}

DFG_DEVICE u32 cluster_cta_rank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// CTAs in this CTA's cluster (1 when launched without a cluster).
DFG_DEVICE u32 cluster_num_ctas() {
    u32 n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}

// ---------------------------------------------------------------- shared memory
DFG_DEVICE u8* dynamic_smem() {
    // 1024-byte alignment: the 128-byte swizzle pattern repeats every 1024 bytes and TMA / wgmma
    // compute it from address bits, so every swizzled tile must start on a 1024-byte boundary.
    extern __shared__ __align__(1024) u8 dfg_dynamic_smem[];
    return dfg_dynamic_smem;
}

// 32-bit shared-window address of a generic pointer into shared memory.
// NOTES: the compiler builtin (an address-space cast), not inline asm: the compiler then folds
// `smem_addr(smem + constant)` into the shared symbol's address + constant, instead of re-forming the
// generic pointer (S2UR SR_SWINHI / SR_CgaCtaId) and converting it back at every use in the K loops.
DFG_DEVICE u32 smem_addr(const void* ptr) { return static_cast<u32>(__cvta_generic_to_shared(ptr)); }

// ---------------------------------------------------------------- CTA / cluster synchronisation
DFG_DEVICE void sync_threads() { __syncthreads(); }

// bar.sync on hardware barrier `id` (1..15; 0 is __syncthreads) for `num_threads` threads (multiple of 32).
DFG_DEVICE void named_barrier_sync(u32 id, u32 num_threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

// bar.red.or.pred on barrier `id` for `num_threads` threads: as named_barrier_sync, and returns in every
// participating thread whether any of them passed pred = true (PTX ISA "bar, barrier": barrier.red).
DFG_DEVICE bool named_barrier_sync_or(u32 id, u32 num_threads, bool pred) {
    u32 any;
    asm volatile(
        "{\n\t.reg .pred p, q;\n\t"
        "setp.ne.u32 p, %1, 0;\n\t"
        "bar.red.or.pred q, %2, %3, p;\n\t"
        "selp.u32 %0, 1, 0, q;\n\t}"
        : "=r"(any)
        : "r"(pred ? 1u : 0u), "r"(id), "r"(num_threads)
        : "memory");
    return any != 0;
}

// Every thread of every CTA of the cluster arrives and waits (barrier.cluster, PTX ISA 9.7.13.1).
DFG_DEVICE void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Makes mbarrier.init visible to the other CTAs of the cluster and to the async proxy (TMA).
DFG_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory writes (st.shared, stmatrix) before later
// async-proxy accesses (TMA store, wgmma operand reads).
DFG_DEVICE void fence_view_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---------------------------------------------------------------- mbarrier (u64 in shared memory)
DFG_DEVICE void mbar_init(u64* bar, u32 arrive_count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrive_count) : "memory");
}

DFG_DEVICE void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrive on the barrier at the same shared-memory offset in CTA `cta_rank` of this cluster.
// Default semantics (.release.cta), as CUTLASS's ClusterBarrier::arrive(cta_id): the .release.cluster
// form compiles to MEMBAR.ALL.GPU before every arrive, and the waiting producer's try_wait is .acquire.cta
// anyway, so the wider scope would buy nothing but a stall on every K block.
DFG_DEVICE void mbar_arrive_cluster(u64* bar, u32 cta_rank) {
    asm volatile(
        "{\n\t.reg .b32 remote;\n\t"
        "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t}" ::"r"(smem_addr(bar)),
        "r"(cta_rank)
        : "memory");
}

// mapa.shared::cluster.u32: the shared::cluster address of `smem_ptr`'s location in CTA `cta_rank` of this cluster.
// A shared array has the same layout in every CTA (PTX's `mapa d, sh + imm, b` form maps an element as its array
// plus the offset), so a loop over an array's elements maps its base once and adds element offsets. Not volatile:
// a pure function of its operands, which ptxas may hoist.
DFG_DEVICE u32 cluster_smem_address(const void* smem_ptr, u32 cta_rank) {
    u32 remote;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(smem_ptr)), "r"(cta_rank));
    return remote;
}

// Arrive on the barrier at a shared::cluster address (cluster_smem_address), with mbar_arrive_cluster's semantics.
DFG_DEVICE void mbar_arrive_cluster_address(u32 remote_bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}

// Arrive once and add `tx_bytes` to the transaction count the current phase waits for.
DFG_DEVICE void mbar_arrive_expect_tx(u64* bar, u32 tx_bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(tx_bytes)
                 : "memory");
}

// Blocks until the phase with parity `phase` has completed. `name` is only for the watchdog's message.
DFG_DEVICE void mbar_wait(u64* bar, u32 phase, BarrierName name = BarrierName{"mbarrier", 0}) {
    const u32 addr = smem_addr(bar);
    u32 done = 0;
#if defined(DFG_WATCHDOG)
    u32 start = 0, started = 0;
#endif
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(addr), "r"(phase)
            : "memory");
#if defined(DFG_WATCHDOG)
        if (!done) {  // try_wait has already suspended for a while: reading the timer costs nothing here
            const u32 now = watchdog::now_ticks();
            if (!started) {
                start = now;
                started = 1;
            } else if (now - start > watchdog::kLimitTicks) {
                watchdog::expired(name, addr, phase);
            }
        }
#else
        (void)name;
#endif
    } while (!done);
}

// ---------------------------------------------------------------- global atomics (PTX ISA "atom", "Memory Consistency Model")
// *ptr += value; returns the old value. .acq_rel at .gpu scope: this thread's earlier writes, and those ordered
// before it by a barrier (release is cumulative), are visible to any thread of the GPU that acquires a later
// value of *ptr; writes released by the earlier updates of *ptr are visible to this thread afterwards, and to
// the threads a barrier orders after it. Split-K's tile counters (split_k.cuh).
DFG_DEVICE u32 atomic_add_acq_rel_gpu(u32* ptr, u32 value) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(ptr), "r"(value) : "memory");
    return old;
}

// ---------------------------------------------------------------- memory model: atomics and fences on u32 global memory
// PTX ISA "Memory Consistency Model": a release (or a fence.acq_rel / fence.sc before a relaxed write) and an
// acquire (or a relaxed read before such a fence) synchronise when each one's scope includes the other's thread;
// relaxed operations order nothing else. The simulator checks exactly that (hal/sim/hb.hpp).
#define DFG_PTX_SCOPES(M, SEM)                   \
    if constexpr (kScope == MemScope::Cta)       \
        M(SEM, ".cta");                          \
    else if constexpr (kScope == MemScope::Cluster) \
        M(SEM, ".cluster");                      \
    else                                         \
        M(SEM, ".gpu");
#define DFG_PTX_ORDERS_AND_SCOPES(M)                 \
    if constexpr (kOrder == MemOrder::Relaxed) {     \
        DFG_PTX_SCOPES(M, ".relaxed")                \
    } else if constexpr (kOrder == MemOrder::Acquire) { \
        DFG_PTX_SCOPES(M, ".acquire")                \
    } else if constexpr (kOrder == MemOrder::Release) { \
        DFG_PTX_SCOPES(M, ".release")                \
    } else if constexpr (kOrder == MemOrder::AcqRel) { \
        DFG_PTX_SCOPES(M, ".acq_rel")                \
    } else {                                         \
        DFG_PTX_SCOPES(M, ".sc")                     \
    }

// atom{.sem}{.scope}.global.add.u32 (PTX ISA "atom"): *ptr += value, returns the old value.
template <MemOrder kOrder, MemScope kScope>
DFG_DEVICE u32 atomic_add(u32* ptr, u32 value) {
    static_assert(kOrder != MemOrder::SeqCst, "atom has no .sc semantics: use fence.sc and a relaxed atom");
    u32 old;
#define DFG_PTX_ATOM_ADD(SEM, SCOPE) \
    asm volatile("atom" SEM SCOPE ".global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(ptr), "r"(value) : "memory")
    DFG_PTX_ORDERS_AND_SCOPES(DFG_PTX_ATOM_ADD)
#undef DFG_PTX_ATOM_ADD
    return old;
}

// ld{.relaxed|.acquire}{.scope}.global.u32 (PTX ISA "ld").
template <MemOrder kOrder, MemScope kScope>
DFG_DEVICE u32 atomic_load(const u32* ptr) {
    static_assert(kOrder == MemOrder::Relaxed || kOrder == MemOrder::Acquire, "ld is .relaxed or .acquire");
    u32 value;
#define DFG_PTX_LD(SEM, SCOPE) asm volatile("ld" SEM SCOPE ".global.u32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory")
    DFG_PTX_ORDERS_AND_SCOPES(DFG_PTX_LD)
#undef DFG_PTX_LD
    return value;
}

// st{.relaxed|.release}{.scope}.global.u32 (PTX ISA "st").
template <MemOrder kOrder, MemScope kScope>
DFG_DEVICE void atomic_store(u32* ptr, u32 value) {
    static_assert(kOrder == MemOrder::Relaxed || kOrder == MemOrder::Release, "st is .relaxed or .release");
#define DFG_PTX_ST(SEM, SCOPE) asm volatile("st" SEM SCOPE ".global.u32 [%0], %1;" ::"l"(ptr), "r"(value) : "memory")
    DFG_PTX_ORDERS_AND_SCOPES(DFG_PTX_ST)
#undef DFG_PTX_ST
}

// fence{.acq_rel|.sc}{.scope} (PTX ISA "membar / fence").
template <MemOrder kOrder, MemScope kScope>
DFG_DEVICE void fence() {
    static_assert(kOrder == MemOrder::AcqRel || kOrder == MemOrder::SeqCst, "fence is .acq_rel or .sc");
#define DFG_PTX_FENCE(SEM, SCOPE) asm volatile("fence" SEM SCOPE ";" ::: "memory")
    DFG_PTX_ORDERS_AND_SCOPES(DFG_PTX_FENCE)
#undef DFG_PTX_FENCE
}
#undef DFG_PTX_ORDERS_AND_SCOPES
#undef DFG_PTX_SCOPES

// ---------------------------------------------------------------- programmatic dependent launch (PTX ISA "griddepcontrol")
// griddepcontrol.wait: waits until the prerequisite grids (the preceding kernel of a programmatic dependent
// launch) have completed and their memory operations are performed and visible to this grid. Without a
// programmatic dependent launch there is nothing in flight and it returns at once (one binary serves both:
// deep_fp8_gemm.set_pdl). A dependent kernel must
// execute it before touching memory of the preceding kernel, and in every CTA (else a kernel depending on this
// one would not be ordered after the preceding one); the simulator checks both.
DFG_DEVICE void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// griddepcontrol.launch_dependents: the dependent grid may be scheduled once every CTA of this grid executed it
// (one thread per CTA suffices) or exited. No memory ordering: the dependent's wait still waits for the whole grid.
DFG_DEVICE void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// ---------------------------------------------------------------- cp.async (non-bulk) with mbarrier completion
// Asynchronous 4-byte copy global -> shared (PTX ISA "cp.async"); does not stall the issuing thread.
DFG_DEVICE void cp_async_4(void* smem_dst, const void* gmem_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem_dst)), "l"(gmem_src) : "memory");
}

// One arrive on `bar` once every cp.async this thread issued so far has landed (PTX ISA
// "cp.async.mbarrier.arrive", .noinc: the arrive counts against the barrier's expected arrivals).
DFG_DEVICE void cp_async_mbar_arrive(u64* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// ---------------------------------------------------------------- TMA (cp.async.bulk.tensor), rank 3
DFG_DEVICE void tma_prefetch(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// bar.warp.sync 0xffffffff (__syncwarp): the warp's lanes meet, and each lane's memory accesses before it are
// ordered before every lane's accesses after it (PTX ISA "bar.warp.sync").
DFG_DEVICE void warp_sync() { asm volatile("bar.warp.sync -1;" ::: "memory"); }

// Makes a tensor map in global memory (written by an earlier kernel's tensormap.cp_fenceproxy release, or by a
// host copy) usable by this thread's TMA instructions (PTX ISA "membar / fence": fence.proxy.tensormap::generic,
// acquire; .sys covers a host-initiated writer as well as the gpu-scope release of kernels/group_maps.cuh; CUDA
// programming guide, TMA, "a tensor map passed through global memory"). Kernel parameters need none.
DFG_DEVICE void tensormap_fence_acquire(const TensorMap* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// Device-side tensor-map edits (PTX ISA "tensormap.replace", .tile mode, on a map in this CTA's shared memory;
// sm_90a, PTX ISA 8.3): one field of the 128-byte map at `smem_map`. global_stride takes bytes from CUDA 12.5 on
// (before, bytes >> 4: CuTe's copy_sm90_desc.hpp branches on the compiler version the same way); ordinal i of
// global_stride is dimension i + 1's stride. The ordinals are immediates.
#if defined(__CUDACC_VER_MAJOR__)
static_assert(__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 5),
              "tensormap.replace global_stride in bytes needs CUDA >= 12.5");
#endif
DFG_DEVICE void tensormap_replace_global_address(TensorMap* smem_map, u64 address) {
    asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(smem_addr(smem_map)),
                 "l"(address)
                 : "memory");
}
template <u32 kOrdinal>
DFG_DEVICE void tensormap_replace_global_dim(TensorMap* smem_map, u32 extent) {
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;" ::"r"(smem_addr(smem_map)),
                 "n"(kOrdinal), "r"(extent)
                 : "memory");
}
template <u32 kOrdinal>
DFG_DEVICE void tensormap_replace_global_stride(TensorMap* smem_map, u64 bytes) {
    asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], %1, %2;" ::"r"(smem_addr(smem_map)),
                 "n"(kOrdinal), "l"(bytes)
                 : "memory");
}
// The 128-byte map at `smem_map` -> `gmem_map`, then a release fence of the tensormap proxy at gpu scope (PTX ISA
// "tensormap.cp_fenceproxy"): a thread that issues fence.proxy.tensormap::generic.acquire on `gmem_map` after
// this (a later kernel) may use it. Warp-collective (.sync.aligned): all 32 lanes, the same operands; both
// addresses in their state spaces (global: __cvta_generic_to_global), both maps 128-byte aligned.
DFG_DEVICE void tensormap_cp_fenceproxy(TensorMap* gmem_map, const TensorMap* smem_map) {
    asm volatile(
        "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;" ::"l"(
            static_cast<u64>(__cvta_generic_to_global(gmem_map))),
        "r"(smem_addr(smem_map))
        : "memory");
}

// Box at coordinates (c0 innermost, c1, c2) -> dst; completes `bytes-of-box` transactions on `bar`.
DFG_DEVICE void tma_load_3d(void* dst, const TensorMap* map, u64* bar, i32 c0, i32 c1, i32 c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// As tma_load_3d, but the box lands at the same offset in every CTA of `cta_mask` and each of
// their barriers (same offset as `bar`) receives the transaction bytes.
DFG_DEVICE void tma_load_3d_multicast(void* dst, const TensorMap* map, u64* bar, u16 cta_mask, i32 c0, i32 c1,
                                      i32 c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5, %6}], [%2], %3;" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Box from src -> global at (c0, c1, c2); out-of-bounds parts of the box are not written.
DFG_DEVICE void tma_store_3d(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<u64>(map)),
                 "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

DFG_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until at most N committed store groups are still reading their shared-memory source.
template <int N>
DFG_DEVICE void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until every committed store group has completed (writes visible in global memory).
DFG_DEVICE void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// ---------------------------------------------------------------- wgmma (warpgroup-collective)
DFG_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
DFG_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int N>
DFG_DEVICE void wgmma_wait() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across wgmma fence/commit/wait (the register fence: the
// wait's asm names no registers). The u32 form is for register A fragments (WgmmaFp8RegA).
DFG_DEVICE void fence_operand(float& reg) { asm volatile("" : "+f"(reg)::"memory"); }
DFG_DEVICE void fence_operand(u32& reg) { asm volatile("" : "+r"(reg)::"memory"); }

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T, e4m3 inputs from shared memory, f32 accumulators.
// `d` is this thread's fragment (N/2 floats, PTX ISA "wgmma .m64nNk32 register fragment D").
// The specialisation for each N a kernel uses is generated by the JIT (deep_fp8_gemm/jit_gen.py)
// into the translation unit, because inline asm needs the N/2 register operands spelled out.
template <int N>
struct WgmmaFp8;

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T with A from registers (wgmma.mma_async ... .f32.e4m3.e4m3 with a register
// A operand, CuTe MMA_64xNx32_F32E4M3E4M3_RS_TN): `a` is this thread's A fragment, four .b32 registers of four e4m3
// each in the layout of WgmmaFragmentA (mma.cuh), B from shared memory through `desc_b`, `d` as for WgmmaFp8.
// mma(const u32 (&a)[4], u64 desc_b, float* d, bool scale_d); the specialisation for an N is generated by the JIT
// (deep_fp8_gemm/kernels/wgmma_gen.py, wgmma_fp8_rs_wrapper). A's registers, like the accumulators, must not be
// touched between the issue and the wgmma_wait that retires the group.
template <int N>
struct WgmmaFp8RegA;

// D[64 x N] (+)= A[64 x 16] . B[N x 16]^T in bf16 (wgmma.mma_async ... m64nNk16.f32.bf16.bf16, CuTe
// MMA_64xNx16_F32BF16BF16_SS), A and B from shared memory through descriptors, `d` as for WgmmaFp8. kTransA / kTransB
// are the PTX imm-trans-a / imm-trans-b (1: the operand is MN-major; allowed for 16-bit types only). A k16 slice is
// 32 bytes of K per row, as e4m3's k32. Specialisations generated by the JIT (wgmma_gen.py, wgmma_bf16_wrapper).
template <int N, int kTransA = 0, int kTransB = 0>
struct WgmmaBf16;

// D[64 x N] (+)= A[64 x 8] . B[N x 8]^T in tf32 (wgmma.mma_async ... m64nNk8.f32.tf32.tf32, CuTe
// MMA_64xNx8_F32TF32TF32_SS_TN): K-major operands only (no transpose for 32-bit types); the tensor core ignores the
// low 13 mantissa bits of each fp32 operand. Generated by the JIT (wgmma_gen.py, wgmma_tf32_wrapper).
template <int N>
struct WgmmaTf32;

// ---------------------------------------------------------------- stmatrix / setmaxnreg
// Stores four 8x8 b16 matrices; lane l supplies the row address of row (l % 8) of matrix (l / 8);
// register q of lane l holds row l/4, columns 2*(l%4)..+1 of matrix q.
DFG_DEVICE void stmatrix_x4(void* row_ptr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(row_ptr)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

template <u32 kRegisters>
DFG_DEVICE void setmaxnreg_inc() {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <u32 kRegisters>
DFG_DEVICE void setmaxnreg_dec() {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// ---------------------------------------------------------------- conversions, loads, errors
// a * b + c rounded once (fma.rn.f32, SASS FFMA): what `acc += x * s` compiles to under NVRTC's default
// --fmad=true, spelled out so that the simulator's host compiler, which contracts nothing in ISO C++ mode,
// computes the same bits (the promotions: promotion.cuh, policy_1d1d.cuh, policy_swap_ab.cuh).
DFG_DEVICE float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
// Bitwise select: the bits of `second` where `mask` is 1, of `first` elsewhere (one LOP3). With a mask of all
// zeros or all ones it picks one float exactly, and needs no predicate register (promotion.cuh SegmentMasks).
DFG_DEVICE float select_bits(float first, float second, u32 mask) {
    return __uint_as_float((__float_as_uint(first) & ~mask) | (__float_as_uint(second) & mask));
}
// Byte permute (prmt.b32, default mode; SASS PRMT): byte i of the result is byte selector[4i+2:4i] of {b, a} (a bytes
// 0-3, b bytes 4-7), replaced by its sign bit replicated when selector bit 4i+3 is set. The MXFP4 kernel's e2m1 ->
// e4m3 lookup (mxfp4.cuh).
DFG_DEVICE u32 prmt(u32 a, u32 b, u32 selector) {
    u32 out;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(selector));
    return out;
}
// Two floats -> two bf16 (round to nearest even) packed as {lo in bits 0..15, hi in bits 16..31}.
DFG_DEVICE u32 pack_bf16x2(float lo, float hi) {
    u32 packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Two floats -> two e4m3 (round to nearest even, saturate to +-448) packed as {lo byte, hi byte}.
DFG_DEVICE u16 pack_e4m3x2(float lo, float hi) {
    u16 packed;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Read-only global load (through the non-coherent texture path).
DFG_DEVICE float ld_global_nc(const float* ptr) { return __ldg(ptr); }
DFG_DEVICE i32 ld_global_nc(const i32* ptr) { return __ldg(ptr); }

// Plain (coherent) 8-byte global load / store of two adjacent floats: ld.global.v2.f32 / st.global.v2.f32 (LDG.E.64 /
// STG.E.64). `ptr` must be 8-byte aligned (a misaligned vector access faults); the callers' hosts check it. Plain
// C++ accesses, not asm, so ptxas may schedule them with the surrounding code; not .nc: C may alias D.
DFG_DEVICE F32x2 ld_global_f32x2(const float* ptr) { return *reinterpret_cast<const F32x2*>(ptr); }
DFG_DEVICE void st_global_f32x2(float* ptr, F32x2 v) { *reinterpret_cast<F32x2*>(ptr) = v; }

// Aborts the launch: the host sees CUDA_ERROR_LAUNCH_FAILED (the simulator reports `what`).
DFG_DEVICE void trap(const char* /*what*/) { asm volatile("trap;"); }

}  // namespace hal
}  // namespace dfg

// Kernel entry: one extern "C" symbol per translation unit, so the runtime finds it by name.
#define DFG_DEFINE_KERNEL(NAME, NUM_THREADS, PARAMS_T, BODY)                                       \
    DFG_WATCHDOG_KERNEL_NAME(NAME)                                                                  \
    extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1) NAME(const __grid_constant__ PARAMS_T params) { \
        BODY(params);                                                                               \
    }
