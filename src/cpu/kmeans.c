/* V-Smooth grouping (VC §3.2): Lloyd k-means over the value tokens of one
 * head and the stable argsort of its labels.  Deterministic by design, so
 * the GPU version can reproduce labels and permutations exactly: distances
 * are FP32 sums in channel order, ties go to the lower cluster index, and
 * centroid sums are FP64. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static float sq_dist(const float *a, const float *b, int d) {
    float acc = 0.0f;
    for (int c = 0; c < d; ++c) {
        float t = a[c] - b[c];
        acc += t * t;
    }
    return acc;
}

static void assign_labels(const float *v, int n, int d, int k,
                          const float *cent, int32_t *labels) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
        int best = 0;
        float bd = sq_dist(v + (size_t)i * d, cent, d);
        for (int c = 1; c < k; ++c) {
            float dd = sq_dist(v + (size_t)i * d, cent + (size_t)c * d, d);
            if (dd < bd) { /* strict: ties keep the lower index */
                bd = dd;
                best = c;
            }
        }
        labels[i] = best;
    }
}

/* Returns 0 on allocation failure (centroids then stay as they were). */
static int update_centroids(const float *v, int n, int d, int k,
                            const int32_t *labels, float *cent) {
    double *sum = calloc((size_t)k * d, sizeof *sum);
    int64_t *cnt = calloc((size_t)k, sizeof *cnt);
    if (!sum || !cnt) {
        free(sum);
        free(cnt);
        return 0;
    }
    for (int i = 0; i < n; ++i) {
        double *s = sum + (size_t)labels[i] * d;
        const float *x = v + (size_t)i * d;
        for (int c = 0; c < d; ++c) s[c] += x[c];
        cnt[labels[i]]++;
    }
    for (int j = 0; j < k; ++j) {
        if (!cnt[j]) continue; /* empty cluster keeps its centroid */
        for (int c = 0; c < d; ++c)
            cent[(size_t)j * d + c] = (float)(sum[(size_t)j * d + c] / (double)cnt[j]);
    }
    free(sum);
    free(cnt);
    return 1;
}

void qvi_kmeans(const float *v, int n, int d, int k, int iters, int warm,
                float *centroids, int32_t *labels) {
    if (!warm)
        for (int j = 0; j < k; ++j)
            memcpy(centroids + (size_t)j * d,
                   v + (size_t)((int64_t)j * n / k) * d, (size_t)d * sizeof(float));
    for (int it = 0; it < iters; ++it) {
        assign_labels(v, n, d, k, centroids, labels);
        if (!update_centroids(v, n, d, k, labels, centroids)) break;
    }
    assign_labels(v, n, d, k, centroids, labels);
}

void qvi_stable_argsort_labels(const int32_t *labels, int n, int k,
                               int32_t *perm) {
    int64_t *start = calloc((size_t)k + 1, sizeof *start);
    if (!start) { /* identity is a valid (if unhelpful) permutation */
        for (int i = 0; i < n; ++i) perm[i] = i;
        return;
    }
    for (int i = 0; i < n; ++i) start[labels[i] + 1]++;
    for (int j = 0; j < k; ++j) start[j + 1] += start[j];
    for (int i = 0; i < n; ++i) perm[start[labels[i]]++] = i;
    free(start);
}

qva_status qva_vsmooth_permutation(const float *v, int n, int d, int clusters,
                                   int iters, int32_t *perm) {
    if (!v || !perm || n <= 0 || d <= 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_vsmooth_permutation: NULL pointer or n, d <= 0");
    if (clusters < 1 || clusters > QVA_VSMOOTH_MAX_CLUSTERS)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_vsmooth_permutation: clusters = %d must be in [1, %d]",
                        clusters, QVA_VSMOOTH_MAX_CLUSTERS);
    if (iters < 0 || iters > QVA_VSMOOTH_MAX_ITERS)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_vsmooth_permutation: iters = %d must be in [0, %d]",
                        iters, QVA_VSMOOTH_MAX_ITERS);
    float *cent = malloc((size_t)clusters * d * sizeof *cent);
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    if (!cent || !labels) {
        free(cent);
        free(labels);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "k-means buffers");
    }
    qvi_kmeans(v, n, d, clusters, iters, 0, cent, labels);
    qvi_stable_argsort_labels(labels, n, clusters, perm);
    free(cent);
    free(labels);
    return QVA_OK;
}
