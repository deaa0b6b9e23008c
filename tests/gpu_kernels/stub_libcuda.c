// A stand-in libcuda.so.1 for CPU tests (tests/runtime/test_driver.py, not a GPU kernel): it lets the REAL
// cuda.bindings marshal deep_fp8_gemm.runtime.driver's calls into C, and records what arrives, so the
// argument passing (kernelParams void**, CUlaunchConfig, cluster attribute, tensor-map arrays) is
// checked without a GPU. cuda.bindings resolves every entry point through cuGetProcAddress_v2.
// STUB_CUDA_STRICT_ALIGN=1 makes cuTensorMapEncodeTiled reject a tensorMap not 64-byte aligned.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
struct LaunchAttr { int id; int pad; union { char raw[64]; struct { unsigned x, y, z; } cluster; } value; };
struct LaunchConfig {
    unsigned grid[3], block[3], smem;
    uintptr_t stream;
    struct LaunchAttr* attrs;
    unsigned num_attrs;
};

size_t g_param_size = 384;
unsigned char g_params[4096];
uintptr_t g_params_ptr, g_function, g_extra, g_stream, g_ctx, g_tm_out, g_tm_address;
unsigned g_grid[3], g_block[3], g_smem, g_num_attrs, g_cluster[3];
int g_attr_id, g_launches;
int g_tm_dtype, g_tm_rank, g_tm_interleave, g_tm_swizzle, g_tm_l2, g_tm_oob, g_tm_calls;
uint64_t g_tm_dims[5], g_tm_strides[4];
unsigned g_tm_box[5], g_tm_elem_strides[5];
char g_kernel_name[256];
unsigned char g_code_head[8];
int g_smem_attr, g_smem_value, g_smem_device;

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
CUresult cuDeviceGet(int* dev, int ordinal) { *dev = ordinal; return 0; }
CUresult cuDevicePrimaryCtxRetain(uintptr_t* ctx, int dev) { *ctx = 0x1000 + dev; return 0; }
CUresult cuCtxGetCurrent(uintptr_t* ctx) { *ctx = g_ctx; return 0; }
CUresult cuCtxSetCurrent(uintptr_t ctx) { g_ctx = ctx; return 0; }
CUresult cuDeviceGetAttribute(int* value, int attrib, int dev) { *value = attrib == 16 ? 132 : 1; return 0; }
CUresult cuDeviceGetName(char* name, int len, int dev) { strncpy(name, "Stub H200", len); return 0; }
CUresult cuLibraryLoadData(uintptr_t* lib, const void* code, void* o1, void* v1, unsigned n1, void* o2, void* v2,
                           unsigned n2) {
    memcpy(g_code_head, code, 8);
    *lib = 0x2000;
    return 0;
}
CUresult cuLibraryGetKernel(uintptr_t* kernel, uintptr_t lib, const char* name) {
    strncpy(g_kernel_name, name, sizeof(g_kernel_name) - 1);
    *kernel = 0x3000;
    return 0;
}
CUresult cuKernelGetParamInfo(uintptr_t kernel, size_t index, size_t* offset, size_t* size) {
    if (index > 0) return 1;  // CUDA_ERROR_INVALID_VALUE: one parameter
    *offset = 0;
    if (size) *size = g_param_size;
    return 0;
}
CUresult cuKernelSetAttribute(int attrib, int value, uintptr_t kernel, int dev) {
    g_smem_attr = attrib, g_smem_value = value, g_smem_device = dev;
    return 0;
}
CUresult cuLaunchKernelEx(const struct LaunchConfig* config, uintptr_t f, void** params, void** extra) {
    memcpy(g_grid, config->grid, sizeof g_grid);
    memcpy(g_block, config->block, sizeof g_block);
    g_smem = config->smem, g_stream = config->stream, g_num_attrs = config->num_attrs;
    if (config->num_attrs) {
        g_attr_id = config->attrs[0].id;
        memcpy(g_cluster, &config->attrs[0].value.cluster, sizeof g_cluster);
    }
    g_params_ptr = (uintptr_t)params[0];
    memcpy(g_params, params[0], g_param_size);
    g_function = f, g_extra = (uintptr_t)extra;
    g_launches++;
    return 0;
}
CUresult cuTensorMapEncodeTiled(uint64_t* out, int dtype, unsigned rank, void* address, const uint64_t* dims,
                                const uint64_t* strides, const unsigned* box, const unsigned* elem_strides,
                                int interleave, int swizzle, int l2, int oob) {
    g_tm_calls++;
    g_tm_out = (uintptr_t)out;
    const char* strict = getenv("STUB_CUDA_STRICT_ALIGN");
    if (strict && strict[0] == '1' && (uintptr_t)out % 64) return 1;
    g_tm_dtype = dtype, g_tm_rank = rank, g_tm_address = (uintptr_t)address;
    for (unsigned i = 0; i < rank; i++) g_tm_dims[i] = dims[i], g_tm_box[i] = box[i], g_tm_elem_strides[i] = elem_strides[i];
    for (unsigned i = 0; i + 1 < rank; i++) g_tm_strides[i] = strides[i];
    g_tm_interleave = interleave, g_tm_swizzle = swizzle, g_tm_l2 = l2, g_tm_oob = oob;
    for (int i = 0; i < 16; i++) out[i] = 0x0101010101010101ull * (i + 1);
    return 0;
}
CUresult cuGetErrorName(CUresult e, const char** s) { *s = e == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_UNKNOWN"; return 0; }
CUresult cuGetErrorString(CUresult e, const char** s) { *s = "stub"; return 0; }

struct Entry { const char* name; void* fn; };
static const struct Entry kEntries[] = {
    {"cuInit", (void*)cuInit}, {"cuDriverGetVersion", (void*)cuDriverGetVersion}, {"cuDeviceGet", (void*)cuDeviceGet},
    {"cuDevicePrimaryCtxRetain", (void*)cuDevicePrimaryCtxRetain}, {"cuCtxGetCurrent", (void*)cuCtxGetCurrent},
    {"cuCtxSetCurrent", (void*)cuCtxSetCurrent}, {"cuDeviceGetAttribute", (void*)cuDeviceGetAttribute},
    {"cuDeviceGetName", (void*)cuDeviceGetName}, {"cuLibraryLoadData", (void*)cuLibraryLoadData},
    {"cuLibraryGetKernel", (void*)cuLibraryGetKernel}, {"cuKernelGetParamInfo", (void*)cuKernelGetParamInfo},
    {"cuKernelSetAttribute", (void*)cuKernelSetAttribute}, {"cuLaunchKernelEx", (void*)cuLaunchKernelEx},
    {"cuTensorMapEncodeTiled", (void*)cuTensorMapEncodeTiled}, {"cuGetErrorName", (void*)cuGetErrorName},
    {"cuGetErrorString", (void*)cuGetErrorString}, {0, 0}};

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status) {
    for (const struct Entry* e = kEntries; e->name; e++) {
        if (strcmp(e->name, symbol) == 0) {
            *pfn = e->fn;
            if (status) *status = 0;
            return 0;
        }
    }
    *pfn = 0;
    if (status) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    return 500;               // CUDA_ERROR_NOT_FOUND
}
