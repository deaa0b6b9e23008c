// deep_fp8_gemm CPU simulator: the emulation's functions that the hal (hal/sim.hpp) calls, declared.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// The emulation (the other sim/*.hpp files) is compiled once per set of headers into a shared library, the runtime,
// that every kernel library links dynamically (deep_fp8_gemm/simulator/build.py): a kernel's translation unit, compiled
// with -DDFG_SIM_LINKED_RUNTIME, sees only these declarations, the state types (clocks.hpp, state.hpp) and the hal's
// inline wrappers, so it compiles its kernel and not the whole simulator again, and the emulation runs without the
// kernel code's instrumentation. These functions and the state the inline wrappers read (g_stream, g_launch) are
// DFG_SIM_API: exported by the runtime, whose build hides everything else, so that every kernel library of a process
// binds to the one copy of the emulation and its state, and one stream can run kernels of several libraries. Without
// that macro hal/sim.hpp defines everything in the one translation unit (the runtime's).
#pragma once

namespace dfg::sim::detail {

// hal::MemOrder / hal::MemScope as the emulation names them.
enum class Order : u8 { Relaxed, Acquire, Release, AcqRel, SeqCst };
inline Order order_of(hal::MemOrder o) { return static_cast<Order>(static_cast<int>(o)); }
inline Scope scope_of(hal::MemScope s) { return static_cast<Scope>(static_cast<int>(s)); }

// Instrumentation (instrument.hpp): a hal function's guard (tracking off for its duration, then restored).
DFG_SIM_API bool hal_guard_enter();
DFG_SIM_API void hal_guard_leave(bool saved);
struct HalGuard {
    bool saved;
    HalGuard() : saved(hal_guard_enter()) {}
    ~HalGuard() { hal_guard_leave(saved); }
    HalGuard(const HalGuard&) = delete;
    HalGuard& operator=(const HalGuard&) = delete;
};

DFG_SIM_API void enter(const char* file, int line);                                  // schedule.hpp
DFG_SIM_API void aligned(const char* op, bool warpgroup_wide = false);               // convergence.hpp
DFG_SIM_API u32 smem_offset(const void* ptr, const char* what);                      // access.hpp
DFG_SIM_API u8 float_to_e4m3(float x);                                               // numerics.hpp
DFG_SIM_API u16 float_to_bf16(float x);
DFG_SIM_API void fence_proxy_async();                                                // proxy.hpp
DFG_SIM_API void fence_mbarrier_inits();
DFG_SIM_API void setmaxnreg(u32 regs, bool increase);                                // registers.hpp
DFG_SIM_API u32 mbarrier_offset(const u64* bar, const char* what);                   // barriers.hpp
DFG_SIM_API void mbarrier_arrive(u32 cta, u32 offset, u32 tx_bytes, const char* what);
DFG_SIM_API const char* op_name(const char* op, hal::MemOrder o, hal::MemScope s);   // memory.hpp
DFG_SIM_API u32 atomic_add_global(u32* ptr, u32 value, Order order, Scope scope, const char* what);
DFG_SIM_API u32 atomic_load_global(const u32* ptr, Order order, Scope scope, const char* what);
DFG_SIM_API void atomic_store_global(u32* ptr, u32 value, Order order, Scope scope, const char* what);
DFG_SIM_API void fence(Order order, Scope scope, const char* what);
DFG_SIM_API void hal_access(const void* ptr, u32 bytes, bool write, const char* what);
DFG_SIM_API void check_aligned(const void* ptr, u32 alignment, const char* what);
DFG_SIM_API void cp_async_copy(void* smem_dst, const void* gmem_src, u32 bytes);        // cp_async.hpp
DFG_SIM_API void cp_async_arrive(u64* bar);
DFG_SIM_API void grid_dependency_wait();
DFG_SIM_API void launch_dependents();
DFG_SIM_API const SimTensorMap& tensor_map(const TensorMap* map, const char* what);  // tma.hpp
DFG_SIM_API void tensormap_acquire(const TensorMap* map);
DFG_SIM_API void tensormap_replace_address(TensorMap* smem_map, u64 address);
DFG_SIM_API void tensormap_replace_dim(TensorMap* smem_map, u32 ordinal, u32 extent);
DFG_SIM_API void tensormap_replace_stride(TensorMap* smem_map, u32 ordinal, u64 bytes);
DFG_SIM_API void tensormap_copy_out(TensorMap* gmem_map, const TensorMap* smem_map);
DFG_SIM_API void tma_load(void* dst, const TensorMap* map, u64* bar, u32 cta_mask, bool multicast, i32 c0, i32 c1,
                          i32 c2, const char* what);
DFG_SIM_API void sync_threads();                                                     // threads.hpp
DFG_SIM_API void named_barrier_sync(u32 id, u32 num_threads);
DFG_SIM_API bool named_barrier_sync_or(u32 id, u32 num_threads, bool pred);
DFG_SIM_API void cluster_sync();
DFG_SIM_API void mbar_init(u64* bar, u32 arrive_count);
DFG_SIM_API void mbar_arrive_cluster(u64* bar, u32 cta_rank);
DFG_SIM_API u32 cluster_smem_address(const void* ptr, u32 cta_rank);
DFG_SIM_API void mbar_arrive_cluster_address(u32 address);
DFG_SIM_API void mbar_wait(u64* bar, u32 parity, BarrierName name);
DFG_SIM_API void tma_store(const TensorMap* map, const void* src, i32 c0, i32 c1, i32 c2);
DFG_SIM_API void tma_store_commit();
DFG_SIM_API void tma_store_wait(u32 n, bool complete);
DFG_SIM_API void wgmma_issue(u32 n, u64 desc_a, u64 desc_b, float* d, bool scale_d);
DFG_SIM_API void wgmma_issue_rs(u32 n, const u32* a, u64 desc_b, float* d, bool scale_d);
DFG_SIM_API void wgmma_issue_typed(u32 type, u32 n, u64 desc_a, u64 desc_b, float* d, bool scale_d, bool trans_a,
                                   bool trans_b);
DFG_SIM_API void register_fence(const void* reg);                                    // wgmma_registers.hpp
DFG_SIM_API void wgmma_fence();
DFG_SIM_API void wgmma_commit();
DFG_SIM_API void wgmma_wait(u32 n);
DFG_SIM_API void warp_sync();
DFG_SIM_API void stmatrix_x4(void* row_ptr, const u32 (&regs)[4]);
DFG_SIM_API float shfl_xor(float value, u32 lane_mask);
DFG_SIM_API int run_stream(const StreamItem* items, u32 count);                      // scheduler.hpp
DFG_SIM_API int open_stream();
DFG_SIM_API void close_stream();

}  // namespace dfg::sim::detail
