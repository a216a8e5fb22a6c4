/* Built when nvcc is absent: the CUDA entry points say so instead of
 * failing to link. */
#include "internal.h"

#include <stdio.h>

int qva_cuda_available(void) { return 0; }

int qvi_cuda_supports(const qva_config *cfg, qva_dtype dt, int64_t d, int64_t kv_group,
                      char *why, size_t len) {
    (void)cfg, (void)dt, (void)d, (void)kv_group;
    snprintf(why, len, "library built without CUDA (nvcc not found)");
    return 0;
}

qva_status qvi_cuda_attention(qva_context_t *ctx, const qva_config *cfg,
                              const qva_tensor *q, const qva_tensor *k,
                              const qva_tensor *v, const qva_tensor *out,
                              const qva_tensor *lse) {
    (void)ctx, (void)cfg, (void)q, (void)k, (void)v, (void)out, (void)lse;
    return qvi_fail(QVA_ERR_UNSUPPORTED, "library built without CUDA");
}

qva_status qvi_cuda_layer_carried(qva_context_t *ctx, int layer, int BH, int D, int which,
                                  float *vals, int *valid) {
    (void)ctx, (void)layer, (void)BH, (void)D, (void)which, (void)vals, (void)valid;
    return qvi_fail(QVA_ERR_UNSUPPORTED, "library built without CUDA");
}

static qva_status no_cuda(void) {
    return qvi_fail(QVA_ERR_UNSUPPORTED, "library built without CUDA");
}
qva_status qva_device_malloc(void **p, size_t n) { (void)p, (void)n; return no_cuda(); }
qva_status qva_device_free(void *p) { return p ? no_cuda() : QVA_OK; /* free(NULL) */ }
qva_status qva_memcpy_to_device(void *d, const void *s, size_t n) { (void)d, (void)s, (void)n; return no_cuda(); }
qva_status qva_memcpy_to_host(void *d, const void *s, size_t n) { (void)d, (void)s, (void)n; return no_cuda(); }
qva_status qva_device_synchronize(void) { return no_cuda(); }
