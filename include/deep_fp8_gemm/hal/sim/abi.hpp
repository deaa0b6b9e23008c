// deep_fp8_gemm CPU simulator: host-visible ABI (launch configuration, tensor-map packing).
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
#pragma once

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
    u32 launch_registers;    // registers per thread ptxas reports for the sm_90a build; 0 = unknown (the
                             // register pool is then not accounted)
    u64 seed;                // schedule: 0 = round-robin in (cta, thread) order; else seeded adversarial
};
static_assert(sizeof(LaunchConfig) == 48, "LaunchConfig layout is mirrored in Python");
static_assert(offsetof(LaunchConfig, max_steps) == 16 && offsetof(LaunchConfig, timeout_s) == 24 &&
                  offsetof(LaunchConfig, flags) == 32 && offsetof(LaunchConfig, launch_registers) == 36 &&
                  offsetof(LaunchConfig, seed) == 40,
              "LaunchConfig layout is mirrored in Python");

// Fill shared memory with zeros instead of the 0xFF poison (to tell uninitialised reads from other bugs).
constexpr u32 kFlagZeroSmem = 1u;
// wgmma accumulates in exact fp32 instead of the model of the Hopper FP8 tensor-core inner product
// (numerics.hpp, mma_fp8_dot).
constexpr u32 kFlagExactMma = 2u;
// No race detection (hb.hpp, shadow.hpp): plain and atomic accesses are not checked (DFG_SIM_RACES=0). The
// happens-before edges are still tracked (the proxy checks use them). Stream-wide: the first launch's flag.
constexpr u32 kFlagNoRaces = 4u;

// A kernel of the library: NAME_sim_kernel() returns it (DFG_DEFINE_KERNEL, hal/sim.hpp).
struct KernelInfo {
    void (*body)(const void*);  // BODY(params) of one simulated thread
    u32 max_threads;            // NUM_THREADS (__launch_bounds__)
    u32 reserved;
    u64 params_bytes;           // sizeof the parameter struct
};

// One launch of a stream (dfg_sim_run_stream). Mirrored by deep_fp8_gemm/simulator/runner.py.
struct StreamItem {
    const KernelInfo* kernel;
    const void* params;
    LaunchConfig cfg;
    u32 programmatic;  // 1: a programmatic dependent launch (PDL): may start once every CTA of the previous launch
                       // executed griddepcontrol.launch_dependents or exited; ordered after it only by
                       // griddepcontrol.wait
    u32 reserved;
};
static_assert(sizeof(StreamItem) == 72 && offsetof(StreamItem, cfg) == 16 && offsetof(StreamItem, programmatic) == 64,
              "StreamItem layout is mirrored in Python");

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

}  // namespace sim
}  // namespace dfg
