// Test kernel that triggers ptxas warning C7508: setmaxnreg in a kernel without __launch_bounds__
// (ptxas ignores the instruction because it cannot bound the register budget).
#include <deep_fp8_gemm/hal.cuh>

extern "C" __global__ void {{KERNEL_NAME}}(float* out) {
    dfg::hal::setmaxnreg_inc<232>();
    __shared__ float buffer[256];
    buffer[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buffer[255 - threadIdx.x];
}
