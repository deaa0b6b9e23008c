// deep_fp8_gemm: basic types and qualifiers shared by every device header.
//
// The device library is header-only and includes nothing from the CUDA toolkit, so that
// (1) NVRTC compiles a kernel with no include path in ~0.3 s (no CCCL / CUTLASS parsing) and
// (2) the very same headers compile with the host C++ compiler for the CPU simulator
//     (DFG_SIMULATOR defined), where the hardware layer (hal/) is replaced by an emulation.
#pragma once

#if defined(DFG_SIMULATOR)
#include <cstdint>
#include <cstddef>
#define DFG_DEVICE inline
#define DFG_HOST_DEVICE inline
#define DFG_FORCEINLINE inline
#define DFG_UNROLL
#define DFG_NO_UNROLL
#define DFG_GRID_CONSTANT
#else
#define DFG_DEVICE __device__ __forceinline__
#define DFG_HOST_DEVICE __host__ __device__ __forceinline__
#define DFG_FORCEINLINE __forceinline__
#define DFG_UNROLL _Pragma("unroll")
#define DFG_NO_UNROLL _Pragma("unroll 1")
#define DFG_GRID_CONSTANT __grid_constant__
#endif

// offsetof for layout static_asserts: NVRTC 12.9 rejects __builtin_offsetof on these structs.
#if defined(__CUDACC_RTC__)
#define DFG_OFFSETOF(T, member) ((unsigned long long)__INTADDR__(&(((T*)0)->member)))
#else
#define DFG_OFFSETOF(T, member) __builtin_offsetof(T, member)
#endif

namespace dfg {

#if defined(DFG_SIMULATOR)
using u8 = std::uint8_t;
using u16 = std::uint16_t;
using u32 = std::uint32_t;
using u64 = std::uint64_t;
using i32 = std::int32_t;
using i64 = std::int64_t;
#else
// NVRTC without an include path has no <cstdint>; these widths are fixed by the CUDA ABI.
using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i32 = int;
using i64 = long long;
#endif
static_assert(sizeof(u8) == 1 && sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(u64) == 8, "integer widths");

template <typename T>
DFG_HOST_DEVICE constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

template <typename T>
DFG_HOST_DEVICE constexpr T round_up(T a, T b) { return ceil_div(a, b) * b; }

template <typename T>
DFG_HOST_DEVICE constexpr T gcd(T a, T b) { return b == 0 ? a : gcd(b, a % b); }

template <typename T>
DFG_HOST_DEVICE constexpr T min_of(T a, T b) { return a < b ? a : b; }

template <typename T>
DFG_HOST_DEVICE constexpr T max_of(T a, T b) { return a > b ? a : b; }

// std::conditional without <type_traits> (NVRTC builds have no standard headers): Select<c, T, F>::type.
template <bool kCond, typename T, typename F>
struct Select {
    using type = T;
};
template <typename T, typename F>
struct Select<false, T, F> {
    using type = F;
};

// Two adjacent floats moved as one 8-byte access (hal::ld_global_f32x2 / st_global_f32x2): ld/st.global.v2.f32.
struct alignas(8) F32x2 {
    float x, y;
};

// Which mbarrier a wait is on, for the watchdog build's message (hal/ptx.cuh) and the simulator's deadlock
// report (hal/sim/scheduler.hpp), which print it the same way: DFG_MBAR_WAIT_FORMAT with role, index, the
// barrier's shared-memory offset and the parity waited for, e.g. "mbar_wait(full[3] @smem+0x1c040, parity 1)".
// Kernels name their ring's barriers full_barrier(s) / empty_barrier(s); a bare hal::mbar_wait is "mbarrier[0]".
struct BarrierName {
    const char* role;  // "full", "empty", "scales" (policy_block32.cuh), "mbarrier"
    u32 index;         // stage
};
DFG_HOST_DEVICE constexpr BarrierName full_barrier(u32 stage) { return BarrierName{"full", stage}; }
DFG_HOST_DEVICE constexpr BarrierName empty_barrier(u32 stage) { return BarrierName{"empty", stage}; }
DFG_HOST_DEVICE constexpr BarrierName scales_barrier(u32 stage) { return BarrierName{"scales", stage}; }
#define DFG_MBAR_WAIT_FORMAT "mbar_wait(%s[%u] @smem+%#x, parity %u)"

}  // namespace dfg
