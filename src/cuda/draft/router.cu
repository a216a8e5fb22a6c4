/*
 * DraftAttention2 router on the device (DA2 §3.1 Eq. 1-2, Algorithm 1,
 * C.1-C.2): region pooling of Q and K, the draft map, the per-head ranking
 * with quotas and the per-(head, query region) key lists of each phase.
 * All B*H heads at once, on the caller's stream.  This file holds the
 * host side (buffers, checks, the order of the stages); the kernels are
 * in router_map.cu (pooling, map), router_select.cu and router_mass.cu
 * (ranking: the count and weighted selects) and router_lists.cu
 * (precision matrix, lists), what they share in router_internal.cuh.
 *
 * The results equal the CPU reference (src/cpu/draft.c, docs/DRAFT.md §3)
 * bit for bit:
 *   - pooling: one thread per (region, channel, Q or K) adds the region's
 *     valid tokens in path order (the packed order of the CPU) in FP64 with
 *     explicit _rn adds, divides once and rounds to f32; the max is the
 *     same sequential `v > m ? v : m` scan, started at the first token;
 *   - draft map: the logits are FP64 dot products in channel order, times
 *     sm; max; exp(x - max); the sum in warp order (32 lane partials of
 *     keys b = l mod 32, then a butterfly; qvi_draft_map); one IEEE
 *     division per entry; the FP64 mixture (1 - lambda) p + lambda p'
 *     rounded to f32.  The CPU chain is s = s + (double)q * (double)k,
 *     rounded after the product and after the sum (no contraction).  The
 *     product of two f32 values is exact in FP64 (24 + 24 <= 53
 *     significand bits; a nonzero |q k| lies in [2^-298, 2^256], inside
 *     FP64's normal range), so rounding it is the identity and
 *     __fma_rn(q, k, s) == __dadd_rn(s, __dmul_rn(q, k)) bit for bit,
 *     signed zeros and infinities included (only NaN payloads could
 *     differ, and every NaN ranks alike).  The device therefore runs one
 *     DFMA per channel instead of a DMUL and a DADD.  exp() is CUDA's FP64
 *     exp (<= 1 ulp), libm's may differ by an ulp; the f32 rounding absorbs
 *     that except on a rounding boundary (docs/DRAFT.md §3).
 *     The logits run on the FP64 tensor cores: mma.sync m16n8k16 .f64
 *     computes each output as the chain fma(a[k], b[k], c) for k in order
 *     (measured on the H200, bit for bit on 7.3 M outputs: bench/NOTES.md),
 *     so 16 channels per instruction are the same chain.
 *     The divisions of the mixture go through RN(1/s) and one residual
 *     FMA (Markstein's theorem; the probe also checks 1.3e10 quotients
 *     against the IEEE division).  Both live in router_fp64.cuh, which
 *     tests/cuda_test_fp64.cu checks on the GPU at hand.
 *     Speed (dr_map_kernel): a cluster of two CTAs takes up to 16 query
 *     regions of one head, a branch each, their descriptors converted once
 *     to FP64 in shared memory (the mma's B operand); a warp's work item
 *     is 16 key regions (the A operand), all of its key values requested
 *     from L2 at once and converted once.  K's descriptors are kept with
 *     each 16 channels in the order a lane takes them (qvc_dr_kslot), so
 *     those requests are two 16-byte loads a lane and k16 step instead of
 *     eight 4-byte ones, each of which touched 8 cache lines for 16 bytes
 *     apiece.  The logits stay in shared memory for the softmax (16 x R
 *     doubles a CTA: 93 KB at R = 609, two CTAs an SM; 8 rows when R is
 *     larger), and the mixture reads the partner's over distributed shared
 *     memory;
 *   - ranking: no sort.  Each entry gets the 64-bit key
 *         comp = orderable(A) << 32 | (M - 1 - pair index),   M = R*R,
 *     whose descending order is exactly the CPU's stable descending argsort
 *     (ties by ascending pair index; NaN last; -0 == +0), and all keys are
 *     distinct.  A radix select (most significant digit first: the value
 *     word in digits of 12, 8, 8 and 4 bits, then only as many 8-bit index
 *     digits as M - 1 needs) finds, per head, the keys
 *     tau_j of the pairs at ranks e_j - 1 for the three cumulative quotas
 *     e_0 = T16, e_1 = T16 + T8, e_2 = T16 + T8 + T4.  A pair's precision
 *     is then 16 if comp >= tau_0, else 8 if comp >= tau_1, else 4 if
 *     comp >= tau_2, else 0: the CPU's assignment of sorted positions.
 *     One launch does every digit of every head (dr_count_select_kernel:
 *     a cluster of CTAs per head, the bins added over distributed shared
 *     memory, the later digits read from a shared-memory list of the keys
 *     still in play).
 *     A boundary whose pair is the last of the keys that share its digits
 *     so far keeps all of them, so its search ends there with zeros below
 *     (c >= tau selects the same pairs); the index digits are then only
 *     read when a quota splits a group of equal A values;
 *   - lists: a warp per (head, query region) row writes each phase's key
 *     regions in ascending order with ballots; a per-head scan of the row
 *     counts gives the CSR offsets (layout in cuda_internal.h).
 * QUOTA budget: the quotas come from the CPU function (qvi_draft_quotas)
 * on the host, the same e_j for every head (dr_route_quota).
 * MASS budget (docs/DRAFT.md, "Adaptive budget"; dr_route_mass): each
 * head's K comes from the device, with no host synchronisation, by the
 * integer rule of src/draft/budget.h (the CPU's, tested against it on the
 * host):
 *   - weighted select: w = floor(A * 2^40) depends only on the value half
 *     of the key and grows with it.  Four passes over the value digits
 *     (dr_mass_select_kernel: per digit bucket the count and the uint64
 *     w-sum of the candidate keys, integer atomics, so order-free; then one
 *     walk per head).  The first pass also gives S = sum(w) and the
 *     target T = ceil(mass_ppm * S / 10^6).  From bucket 255 down, the
 *     bucket whose w-sum reaches what is left of T holds the boundary; the
 *     ones above are kept whole (their count added, their weight taken
 *     off).  After the last value digit the candidates share one A, ranked
 *     by pair index, each of weight w(A) > 0, so K_mass = keys above +
 *     ceil(left / w(A)): no index digit is needed;
 *   - the same kernel clamps K to [keep_min, keep_max], splits it with
 *     qvi_draft_quotas's largest remainders (qvi_budget_split, on the
 *     fractions in ppm from the host), writes the head's quotas
 *     (head_quota) and sets the head's count-select state for its own
 *     e_0..e_2 (a boundary of 0 or M settled at once, tau above every key
 *     or 0, so the assignment compares all three as thresholds);
 *   - then the count select, precision matrix and lists above, unchanged
 *     but for the list starts: head bh starts at the kept counts of the
 *     heads before it (dr_head_base_kernel, one CTA), so the lists stay
 *     contiguous and a row's end is the next row's start, as the phased
 *     kernels read them.
 *   Extra work per call: the weighted select's launch (a cluster of CTAs
 *   per head, as the count select, dr_mass_select_kernel) and one
 *   list-start launch more than QUOTA; memory per head: 40 B of select
 *   state and list start, 32 B of quotas.
 */
#include <math.h>
#include <string.h>

#include "router_internal.cuh"

/* ------------------------------------------------------------ host side */

extern "C" qva_status qvc_draft_layout_upload(const struct qvi_partition *part, int t,
                                              int prefix, int prefix_at_end,
                                              qvc_draft_layout *out) {
    if (!out) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_layout_upload: out is NULL");
    memset(out, 0, sizeof *out);
    if (!part) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_layout_upload: no partition");
    qvi_draft_layout lay;
    qva_status s = qvi_draft_layout_build(part, t, prefix, prefix_at_end, &lay);
    if (s != QVA_OK) return s;
    if (lay.regions > 46340 || lay.c > QVI_BLOCK) { /* R^2 pairs must fit int32 */
        s = qvi_fail(QVA_ERR_UNSUPPORTED,
                     "qvc_draft_layout_upload: %lld regions of capacity %d (at most 46340 of %d)",
                     (long long)lay.regions, lay.c, QVI_BLOCK);
        qvi_draft_layout_free(&lay);
        return s;
    }
    struct { void **p; const void *src; size_t bytes; } req[] = {
        {(void **)&out->pack_to_orig, lay.pack_to_orig, (size_t)lay.n_pack * sizeof(int32_t)},
        {(void **)&out->orig_to_pack, lay.orig_to_pack, (size_t)lay.n * sizeof(int32_t)},
        {(void **)&out->count, lay.count, (size_t)lay.regions * sizeof(int32_t)},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0] && s == QVA_OK; ++i) {
        cudaError_t e = cudaMalloc(req[i].p, req[i].bytes ? req[i].bytes : 4);
        if (e != cudaSuccess) {
            *req[i].p = NULL;
            s = qvc_cuda_fail(e, "qvc_draft_layout_upload: cudaMalloc");
        } else if (req[i].bytes &&
                   (e = cudaMemcpy(*req[i].p, req[i].src, req[i].bytes, cudaMemcpyHostToDevice)) !=
                       cudaSuccess) {
            s = qvc_cuda_fail(e, "qvc_draft_layout_upload: cudaMemcpy");
        }
    }
    if (s == QVA_OK) {
        out->n = lay.n;
        out->n_pack = lay.n_pack;
        out->prefix_pad = lay.prefix_pad;
        out->prefix = lay.prefix;
        out->prefix_at_end = lay.prefix_at_end;
        out->t = lay.t;
        out->h = lay.h;
        out->w = lay.w;
        out->c = lay.c;
        out->rf = lay.rf;
        out->regions = (int)lay.regions;
    } else {
        qvc_draft_layout_free(out);
    }
    qvi_draft_layout_free(&lay);
    return s;
}

extern "C" void qvc_draft_layout_free(qvc_draft_layout *l) {
    if (!l) return;
    void *ptrs[] = {l->pack_to_orig, l->orig_to_pack, l->count};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(l, 0, sizeof *l);
}

static size_t dr_align(size_t x) { return (x + 255) & ~(size_t)255; }

/* Scratch sizes, in the order of dr_scratch (router_internal.cuh). */
static size_t dr_scratch_sel(int BH) { return dr_align((size_t)BH * sizeof(dr_sel)); }
static size_t dr_scratch_cnt(int BH, int R) { return dr_align((size_t)BH * R * 3 * sizeof(int32_t)); }
static size_t dr_scratch_base(int BH) { return dr_align((size_t)BH * sizeof(int64_t)); }

static size_t dr_scratch_bytes(int BH, int R) {
    return dr_scratch_sel(BH) + dr_scratch_cnt(BH, R) + dr_scratch_base(BH);
}

static dr_scratch dr_scratch_of(void *scratch, int BH, int R) {
    char *p = (char *)scratch;
    dr_scratch x;
    x.sel = (dr_sel *)p;
    p += dr_scratch_sel(BH);
    x.cnt = (int32_t *)p;
    p += dr_scratch_cnt(BH, R);
    x.base = (int64_t *)p;
    return x;
}

extern "C" qva_status qvc_draft_route_alloc(qvc_draft_route_buf *b, int BH, int R, int D) {
    if (!b) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_route_alloc: buf is NULL");
    memset(b, 0, sizeof *b);
    if (BH < 1 || R < 1 || D < 1 || D > DR_MAX_D)
        return qvi_fail(QVA_ERR_SHAPE, "qvc_draft_route_alloc: bad shape BH=%d R=%d D=%d", BH, R, D);
    const size_t bh = (size_t)BH, r = (size_t)R, d = (size_t)D, M = r * r;
    if ((double)bh * (double)M * 3.0 + 1.0 > 2147483647.0)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_draft_route_alloc: B*H*R^2 = %d*%d^2 pairs exceed the int32 lists",
                        BH, R);
    b->BH = BH;
    b->R = R;
    b->D = D;
    const size_t scratch = dr_scratch_bytes(BH, R);
    const qvc_alloc req[] = {
        {(void **)&b->qavg, bh * r * d * sizeof(float)},
        {(void **)&b->qmax, bh * r * d * sizeof(float)},
        {(void **)&b->kavg, bh * r * d * sizeof(float)},
        {(void **)&b->kmax, bh * r * d * sizeof(float)},
        {(void **)&b->A, bh * M * sizeof(float)},
        {(void **)&b->prec, bh * M},
        {(void **)&b->offsets, (bh * r * 3 + 1) * sizeof(int32_t)},
        {(void **)&b->cols, bh * M * sizeof(int32_t)},
        {(void **)&b->head_quota, bh * 4 * sizeof(int64_t)},
        {&b->scratch, scratch},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_draft_route_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_draft_route_free(b);
    return st;
}

extern "C" void qvc_draft_route_free(qvc_draft_route_buf *b) {
    if (!b) return;
    void *ptrs[] = {b->qavg, b->qmax, b->kavg, b->kmax, b->A,
                    b->prec, b->offsets, b->cols, b->head_quota, b->scratch};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(b, 0, sizeof *b);
}

static qva_status dr_check_view(const qvc_view *x, const char *name) {
    if (!x || !x->data)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_route: %s is NULL", name);
    if (x->dtype != QVA_F32 && x->dtype != QVA_BF16 && x->dtype != QVA_F16)
        return qvi_fail(QVA_ERR_DTYPE, "qvc_draft_route: %s has dtype %d", name, x->dtype);
    return QVA_OK;
}

/* The MASS integers of a call: the bounds of the plan (validated there)
 * and the split fractions in parts per million, exactly as
 * qvi_draft_quotas rounds them. */
static qva_status dr_mass_setup(const qva_draft_params *dp, long long M, dr_mass_params *mp) {
    int64_t ppm, lo, hi;
    const qva_status s = qvi_draft_mass_bounds(dp, M, &ppm, &lo, &hi);
    if (s != QVA_OK) return s;
    mp->M = M, mp->mass_ppm = ppm, mp->keep_min = lo, mp->keep_max = hi;
    const float f[4] = {dp->frac_skip, dp->frac4, dp->frac8, dp->frac16}; /* QVI_Q_* order */
    for (int i = 0; i < 4; ++i) mp->u[i] = llround((double)f[i] * 1e6);
    return QVA_OK;
}

/* The router; pooled: b's pooled descriptors are already there. */
static qva_status dr_route(const qvc_view *q, const qvc_view *k, const qva_config *cfg,
                           const qvc_draft_layout *lay, qvc_draft_route_buf *b, int pooled,
                           cudaStream_t st) {
    qva_status s;
    if ((s = dr_check_view(q, "q")) != QVA_OK || (s = dr_check_view(k, "k")) != QVA_OK) return s;
    if (!cfg || !lay || !lay->pack_to_orig || !lay->count || !b || !b->A)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qvc_draft_route: NULL config, layout or unallocated buffers");
    const int D = (int)q->D, R = lay->regions;
    const int64_t BH64 = q->B * q->H;
    if (k->B != q->B || k->H != q->H || k->D != q->D || q->N != lay->n || k->N != lay->n ||
        D < 1 || D > DR_MAX_D)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_draft_route: q [%lld,%lld,%lld,%lld] / k [%lld,%lld,%lld,%lld] "
                        "do not match the layout (N = %lld) or D > %d",
                        (long long)q->B, (long long)q->H, (long long)q->N, (long long)q->D,
                        (long long)k->B, (long long)k->H, (long long)k->N, (long long)k->D,
                        (long long)lay->n, DR_MAX_D);
    if (BH64 != b->BH || R != b->R || D != b->D)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_draft_route: buffers for BH=%d R=%d D=%d, call has BH=%lld R=%d D=%d",
                        b->BH, b->R, b->D, (long long)BH64, R, D);
    if (BH64 > 65535)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_draft_route: B*H = %lld exceeds 65535",
                        (long long)BH64);
    if (lay->c < 1 || lay->c > QVI_BLOCK)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_draft_route: region capacity %d (1..%d)",
                        lay->c, QVI_BLOCK);
    const float lambda = cfg->draft.lambda;
    if (!(lambda >= 0.0f && lambda <= 1.0f))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "draft: lambda = %g is outside [0, 1]",
                        (double)lambda);
    const int BH = (int)BH64;
    const long long M = (long long)R * R;
    const int mass = cfg->draft.budget == QVA_DRAFT_BUDGET_MASS;
    int64_t quota[4] = {0, 0, 0, 0};
    dr_mass_params mpar;
    if (mass) {
        if ((s = dr_mass_setup(&cfg->draft, M, &mpar)) != QVA_OK) return s;
        b->retained = -1; /* per head, on the device (head_quota) */
    } else {
        if ((s = qvi_draft_quotas(&cfg->draft, M, quota)) != QVA_OK) return s;
        b->retained = quota[QVI_Q_16] + quota[QVI_Q_8] + quota[QVI_Q_4];
    }
    memcpy(b->quota, quota, sizeof quota);
    b->mass = mass;
    const dr_scratch sc = dr_scratch_of(b->scratch, BH, R);

    /* a.-b. pooling and the draft map (router_map.cu) */
    if ((s = qvc_dr_pool_map(q, k, lay, b, pooled, (double)qvi_sm_scale(cfg, D), (double)lambda,
                             st)) != QVA_OK)
        return s;

    /* c. the thresholds (router_select.cu), d. the lists (router_lists.cu) */
    dr_bounds bd;
    if (mass) {
        s = qvc_dr_select_mass(b, &mpar, &sc, &bd, st);
    } else {
        const long long e[3] = {quota[QVI_Q_16], quota[QVI_Q_16] + quota[QVI_Q_8],
                                quota[QVI_Q_16] + quota[QVI_Q_8] + quota[QVI_Q_4]};
        s = qvc_dr_select_quota(b, e, &sc, &bd, st);
    }
    return s == QVA_OK ? qvc_dr_lists(b, &bd, &sc, b->retained, st) : s;
}

extern "C" qva_status qvc_draft_route(const qvc_view *q, const qvc_view *k,
                                      const qva_config *cfg, const qvc_draft_layout *lay,
                                      qvc_draft_route_buf *b, cudaStream_t st) {
    return dr_route(q, k, cfg, lay, b, 0, st);
}

extern "C" qva_status qvc_draft_route_pooled(const qvc_view *q, const qvc_view *k,
                                             const qva_config *cfg, const qvc_draft_layout *lay,
                                             qvc_draft_route_buf *b, cudaStream_t st) {
    return dr_route(q, k, cfg, lay, b, 1, st);
}
