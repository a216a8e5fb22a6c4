/* CUDA runtime glue of the CUDA backend: device discovery, memory helpers,
 * the capability query and the dispatch entry.  The attention kernels are
 * the subject of the GPU issue; until they land, supports() answers no for
 * every method, so callers are told (never silently served by the CPU). */
#include <cuda_runtime.h>
#include <stdio.h>

#include "internal.h"

static qva_status cuda_fail(cudaError_t e, const char *what) {
    return qvi_fail(QVA_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" int qva_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n > 0;
}

extern "C" int qvi_cuda_supports(const qva_config *cfg, qva_dtype dt, int64_t d,
                                 char *why, size_t len) {
    (void)cfg, (void)dt, (void)d;
    if (!qva_cuda_available()) {
        snprintf(why, len, "no CUDA device present");
        return 0;
    }
    snprintf(why, len, "no CUDA kernel for this method yet (CPU reference only)");
    return 0;
}

extern "C" qva_status qvi_cuda_attention(qva_context_t *ctx, const qva_config *cfg,
                                         const qva_tensor *q, const qva_tensor *k,
                                         const qva_tensor *v, const qva_tensor *out,
                                         const qva_tensor *lse) {
    (void)ctx, (void)cfg, (void)q, (void)k, (void)v, (void)out, (void)lse;
    return qvi_fail(QVA_ERR_UNSUPPORTED, "no CUDA kernel for this method yet");
}

extern "C" qva_status qva_device_malloc(void **p, size_t n) {
    if (!p) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL pointer");
    cudaError_t e = cudaMalloc(p, n);
    return e == cudaSuccess ? QVA_OK : cuda_fail(e, "cudaMalloc");
}
extern "C" qva_status qva_device_free(void *p) {
    cudaError_t e = cudaFree(p);
    return e == cudaSuccess ? QVA_OK : cuda_fail(e, "cudaFree");
}
extern "C" qva_status qva_memcpy_to_device(void *d, const void *s, size_t n) {
    cudaError_t e = cudaMemcpy(d, s, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? QVA_OK : cuda_fail(e, "cudaMemcpy H2D");
}
extern "C" qva_status qva_memcpy_to_host(void *d, const void *s, size_t n) {
    cudaError_t e = cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? QVA_OK : cuda_fail(e, "cudaMemcpy D2H");
}
extern "C" qva_status qva_device_synchronize(void) {
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? QVA_OK : cuda_fail(e, "cudaDeviceSynchronize");
}
