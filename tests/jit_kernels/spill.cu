// Test kernel that spills: 64 live accumulators under --maxrregcount=32 (the test passes that option).
// Its ptxas report has non-zero "spill stores/loads", its SASS has STL/LDL.
#include <deep_fp8_gemm/common.cuh>

extern "C" __global__ void {{KERNEL_NAME}}(const float* __restrict__ in, float* __restrict__ out, int n) {
    float acc[64];
    DFG_UNROLL
    for (int j = 0; j < 64; ++j) acc[j] = in[threadIdx.x * 64 + j];  // per-thread values: no uniform registers
#pragma unroll 1
    for (int i = 0; i < n; ++i) {
        const float x = in[threadIdx.x + i];
        DFG_UNROLL
        for (int j = 0; j < 64; ++j) {
            acc[j] = acc[j] * x + acc[(j * 7 + 1) & 63];
            asm volatile("" : "+f"(acc[j]));  // keeps every accumulator live in a register
        }
    }
    DFG_UNROLL
    for (int j = 0; j < 64; ++j) out[threadIdx.x * 64 + j] = acc[j];
}
