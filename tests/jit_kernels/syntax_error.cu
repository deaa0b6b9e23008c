// Test kernel with a deliberate syntax error: the compile error must surface NVRTC's log.
#include <deep_fp8_gemm/common.cuh>

extern "C" __global__ void {{KERNEL_NAME}}(float* out) {
    out[0] = 1.0f  // missing semicolon
}
