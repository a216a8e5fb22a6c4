/*
 * Device operands against the CPU reference, bit for bit: qvc_prep (Q, K,
 * V codes and scales for sage8 / vc8 / fp8, with and without the
 * permutation, the Hadamard rotation and V demeaning, and the K-smoothing
 * LSE shift), qvc_prep4 (NVFP4 codes, scale codes, tensor scales, vc4
 * means and LSE shift of sage4 / vc4) and qvc_kmeans_perm (permutation
 * and centroids).  The CPU side is assembled from the same
 * internal pieces qvi_cpu_prepare_head() uses (src/cpu/head_ops.c), so a mismatch
 * points at the device kernels.  Needs a GPU; without one it prints SKIP
 * and exits 77, which CTest reports as skipped.
 */
#include <cuda_runtime.h>

#define TEST_RNG_SEED 0x6A09E667F3BCC908ull
#include "check.h"
#include "cuda_test_util.h"
#include "cuda_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ helpers */







/* A host tensor with its raw bytes, and the same bytes on the device. */
typedef struct host_dev {
    qva_tensor t; /* host descriptor (CPU loads) */
    void *dev;    /* device copy                 */
    qvc_view view;
} host_dev;

/* Random values: per-channel offset and gain (so smoothing matters), a few
 * outliers, rounded to the dtype and stored in the layout. */
static int make_tensor(host_dev *x, qva_dtype dt, int nhd, int B, int H, int N,
                       int D, float offset_scale) {
    const size_t count = (size_t)B * H * N * D, es = qva_dtype_size(dt);
    void *buf = malloc(count * es);
    float *off = malloc((size_t)D * sizeof *off), *gain = malloc((size_t)D * sizeof *gain);
    if (!buf || !off || !gain) {
        free(buf), free(off), free(gain);
        CHECK(0, "host allocation");
        return 0;
    }
    for (int c = 0; c < D; ++c) {
        off[c] = offset_scale * rng_normal();
        gain[c] = (float)(0.25 + 2.0 * rng_unit());
    }
    x->t = nhd ? qva_tensor_nhd(buf, dt, QVA_DEVICE_CPU, B, H, N, D)
               : qva_tensor_hnd(buf, dt, QVA_DEVICE_CPU, B, H, N, D);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int n = 0; n < N; ++n) {
                /* Tie rows: amax 127 * 2^e and the rest half-integers times
                 * 2^e (exact in every dtype), so with per-row scales x /
                 * delta lies on (e = 3: delta = 8 exactly) or within 2e-5
                 * of a rounding tie of the INT8 codes: the device's fast
                 * quotient must hand these to the exact path
                 * (common/quant_code.cuh). */
                const int tie_row = rng_unit() < 0.05;
                const float tie_scale = ldexpf(1.0f, (int)(rng_unit() * 7.0) - 3);
                for (int c = 0; c < D; ++c) {
                    float v = off[c] + gain[c] * rng_normal();
                    if (rng_unit() < 0.01) v *= 8.0f;
                    if (tie_row)
                        v = tie_scale * (c == 0 ? (rng_unit() < 0.5 ? -127.0f : 127.0f)
                                                : (float)((int)(rng_unit() * 253.0) - 126) + 0.5f);
                    /* A few tiny values: for f32 they defeat the device's
                     * exactness certificate for FP64 sums, so its
                     * sequential path runs too; in bf16 they put a wide
                     * exponent span in the column sums and the codes. */
                    if (dt != QVA_F16 && rng_unit() < 0.002) v = 1e-12f * rng_normal();
                    int64_t o = qvi_offset(&x->t, b, h, n, c);
                    if (dt == QVA_F32) ((float *)buf)[o] = v;
                    else if (dt == QVA_BF16) ((uint16_t *)buf)[o] = bf16_bits(qva_round_bf16(v));
                    else ((uint16_t *)buf)[o] = f16_bits(qva_round_f16(v));
                }
            }
    free(off), free(gain);
    x->dev = NULL;
    if (!cuda_ok(cudaMalloc(&x->dev, count * es), "cudaMalloc input") ||
        !cuda_ok(cudaMemcpy(x->dev, buf, count * es, cudaMemcpyHostToDevice), "H2D input")) {
        free(buf);
        if (x->dev) cudaFree(x->dev);
        return 0;
    }
    x->view.data = x->dev;
    x->view.dtype = (int)dt;
    x->view.B = B, x->view.H = H, x->view.N = N, x->view.D = D;
    x->view.sb = x->t.stride[0], x->view.sh = x->t.stride[1], x->view.sn = x->t.stride[2];
    x->view.hg = 1;
    return 1;
}

static void free_tensor(host_dev *x) {
    free(x->t.data);
    if (x->dev) cudaFree(x->dev);
    memset(x, 0, sizeof *x);
}

/* Counts mismatches of n bytes, printing the first few with their place. */
static long cmp_bytes(const char *what, const char *tag, int bh, const uint8_t *gpu,
                      const uint8_t *cpu, int n_rows, int d) {
    long bad = 0;
    for (int i = 0; i < n_rows; ++i)
        for (int c = 0; c < d; ++c) {
            size_t o = (size_t)i * d + c;
            if (gpu[o] == cpu[o]) continue;
            if (bad < 5)
                fprintf(stderr, "  [%s] %s bh %d row %d ch %d: gpu 0x%02x cpu 0x%02x\n", tag,
                        what, bh, i, c, gpu[o], cpu[o]);
            ++bad;
        }
    return bad;
}

static long cmp_floats(const char *what, const char *tag, int bh, const float *gpu,
                       const float *cpu, int n) {
    long bad = 0;
    for (int i = 0; i < n; ++i) {
        if (same_bits(gpu[i], cpu[i])) continue;
        if (bad < 5)
            fprintf(stderr, "  [%s] %s bh %d [%d]: gpu %.9g cpu %.9g\n", tag, what, bh, i,
                    (double)gpu[i], (double)cpu[i]);
        ++bad;
    }
    return bad;
}

/* ------------------------------------------------------------ qvc_prep */

typedef struct variant {
    const char *name;
    qvc_qk_format fmt;
    int smooth_k, hadamard, signs, use_perm, v_mode, demean;
    int q_rps; /* rows per Q scale: 1 or QVI_BLOCK */
    int v_sample; /* +vsample on a demeaning step (16-bit inputs only) */
} variant;

static const variant VARIANTS[] = {
    {"sage8", QVC_QK_INT8, 1, 0, 0, 0, 0, 0, 1, 0},
    {"sage8+qblock", QVC_QK_INT8, 1, 0, 0, 0, 0, 0, QVI_BLOCK, 0},
    {"sage8+had(signs)", QVC_QK_INT8, 1, 1, 1, 0, 0, 0, 1, 0},
    {"vc8", QVC_QK_INT8, 1, 0, 0, 1, 0, 1, 1, 0},
    {"vc8+had+qblock", QVC_QK_INT8, 1, 1, 0, 1, 0, 1, QVI_BLOCK, 0},
    {"vc8 plain step", QVC_QK_INT8, 1, 0, 0, 1, 0, 0, 1, 0},
    {"fp8", QVC_QK_E4M3, 0, 0, 0, 0, 1, 0, QVI_BLOCK, 0},
    {"fp8+had(signs)", QVC_QK_E4M3, 0, 1, 1, 0, 1, 0, QVI_BLOCK, 0},
    {"fp8 perm+smooth", QVC_QK_E4M3, 1, 0, 0, 1, 1, 0, QVI_BLOCK, 0},
    {"vc8+vsample", QVC_QK_INT8, 1, 0, 0, 1, 0, 1, 1, 1},
    {"vc8+had(signs)+qblock", QVC_QK_INT8, 1, 1, 1, 1, 0, 1, QVI_BLOCK, 0},
};
#define NVARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

typedef struct shape {
    int nq, nk, D, B, H;
    qva_dtype dt;
    int nhd;
    /* bf16: a residual past 448 times +vsample's scale, in a block its
     * sample misses, so that the head is coded with its own */
    int spike;
} shape;

/* Device operands copied back to the host. */
typedef struct host_ops {
    int8_t *q, *k;
    float *qs, *ks, *vchan, *vblk, *vmu;
    uint8_t *vt;
    uint16_t *vmut; /* ops.v_mu_tile, or NULL */
} host_ops;

static void host_ops_free(host_ops *h) {
    free(h->q), free(h->k), free(h->qs), free(h->ks);
    free(h->vchan), free(h->vblk), free(h->vmu), free(h->vt), free(h->vmut);
}

/* The restore tiles of one bh against its v_mu: every block's FP16 code
 * decodes to v_mu's value (already FP16-rounded), and the slots past the
 * last block of the last tile hold +0.  Returns the mismatches. */
/* The restore tiles hold 128 channels: at d 64 channels 64..127 are +0. */
static long check_mu_tile(const char *tag, int bh, int nblk, int d, const host_ops *g) {
    const size_t head = qvc_mu_head_bytes(nblk);
    const int nbatch = (int)(head / QVC_MU_TILE_BYTES);
    const uint16_t *t0 = g->vmut + (size_t)bh * (head / 2);
    long bad = 0;
    for (int j = 0; j < nbatch * QVC_MU_BATCH; ++j)
        for (int c = 0; c < 128; ++c) {
            const uint16_t h = t0[(size_t)(j / QVC_MU_BATCH) * (QVC_MU_TILE_BYTES / 2) +
                                  qvc_mu_tile_at(c, j % QVC_MU_BATCH) / 2];
            const int ok = j < nblk && c < d ? same_bits(qvi_f16_bits_to_float(h),
                                                         g->vmu[((size_t)bh * nblk + j) * d + c])
                                             : h == 0;
            if (ok) continue;
            if (bad < 5)
                fprintf(stderr, "  [%s] v_mu_tile bh %d blk %d ch %d: 0x%04x\n", tag, bh, j, c, h);
            ++bad;
        }
    return bad;
}

static int fetch_ops(const qvc_ops *o, host_ops *h) {
    const size_t bh = (size_t)o->BH, d = (size_t)o->D,
                 nqb = (size_t)o->nq_pad / (size_t)o->q_rows_per_scale, nkb = (size_t)o->nblk;
    memset(h, 0, sizeof *h);
    h->q = malloc(bh * o->nq_pad * d);
    h->k = malloc(bh * o->nk_pad * d);
    h->qs = malloc(bh * nqb * 4);
    h->ks = malloc(bh * nkb * 4);
    h->vchan = malloc(bh * d * 4);
    h->vblk = malloc(bh * nkb * 4);
    h->vt = malloc(bh * nkb * d * QVI_BLOCK);
    h->vmu = o->v_mu ? malloc(bh * nkb * d * 4) : NULL;
    const size_t tile_b = bh * qvc_mu_head_bytes(o->nblk);
    h->vmut = o->v_mu_tile ? malloc(tile_b) : NULL;
    if (!h->q || !h->k || !h->qs || !h->ks || !h->vchan || !h->vblk || !h->vt ||
        (o->v_mu && !h->vmu) || (o->v_mu_tile && !h->vmut)) {
        CHECK(0, "host allocation");
        return 0;
    }
    int ok = 1;
    ok &= cuda_ok(cudaMemcpy(h->q, o->q_i8, bh * o->nq_pad * d, cudaMemcpyDeviceToHost), "D2H q");
    ok &= cuda_ok(cudaMemcpy(h->k, o->k_i8, bh * o->nk_pad * d, cudaMemcpyDeviceToHost), "D2H k");
    ok &= cuda_ok(cudaMemcpy(h->qs, o->q_scale, bh * nqb * 4, cudaMemcpyDeviceToHost), "D2H qs");
    ok &= cuda_ok(cudaMemcpy(h->ks, o->k_scale, bh * nkb * 4, cudaMemcpyDeviceToHost), "D2H ks");
    ok &= cuda_ok(cudaMemcpy(h->vchan, o->v_chan, bh * d * 4, cudaMemcpyDeviceToHost), "D2H vchan");
    ok &= cuda_ok(cudaMemcpy(h->vblk, o->v_blk, bh * nkb * 4, cudaMemcpyDeviceToHost), "D2H vblk");
    ok &= cuda_ok(cudaMemcpy(h->vt, o->v_t, bh * nkb * d * QVI_BLOCK, cudaMemcpyDeviceToHost), "D2H vt");
    if (o->v_mu)
        ok &= cuda_ok(cudaMemcpy(h->vmu, o->v_mu, bh * nkb * d * 4, cudaMemcpyDeviceToHost), "D2H vmu");
    if (o->v_mu_tile)
        ok &= cuda_ok(cudaMemcpy(h->vmut, o->v_mu_tile, tile_b, cudaMemcpyDeviceToHost), "D2H vmut");
    return ok;
}

/* Q or K of one head through the CPU quantizer of the variant; codes as
 * bytes (int8 or E4M3), scales per rps rows (INT8) or per block. */
static void cpu_quant_qk(const variant *va, const float *x, int n_pad, int d, int rps,
                         uint8_t **codes, float **scale) {
    if (va->fmt == QVC_QK_INT8) {
        qvi_i8 r;
        qvi_quant_i8(x, n_pad, d, rps, &r);
        *codes = (uint8_t *)r.codes;
        *scale = r.scale;
    } else {
        qvi_f8 r;
        qvi_quant_e4m3_blocks(x, n_pad, d, &r);
        free(r.chan_scale);
        *codes = r.codes;
        *scale = r.block_scale;
    }
}

static void gather(const float *raw, int n, int d, const int32_t *perm, float *dst) {
    for (int i = 0; i < n; ++i)
        memcpy(dst + (size_t)i * d, raw + (size_t)(perm ? perm[i] : i) * d, (size_t)d * sizeof *dst);
}

/* smooth_k() of the CPU: (float)(FP64 dot(q_i, mean) * sm_scale). */
static float cpu_lse_shift(const float *q_row, const float *mean, int d, float sm_scale) {
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += (double)q_row[c] * mean[c];
    return (float)(dot * sm_scale);
}

/* Checks the device LSE shift of one head (gshift: the head's nq values). */
static void check_lse_shift(const char *tag, int bh, const float *q, const float *mean, int nq,
                            int d, float sm_scale, const float *gshift) {
    long bad = 0;
    for (int i = 0; i < nq; ++i) {
        const float want = cpu_lse_shift(q + (size_t)i * d, mean, d, sm_scale);
        if (same_bits(gshift[i], want)) continue;
        if (bad < 5)
            fprintf(stderr, "  [%s] lse_shift bh %d row %d: gpu %.9g cpu %.9g\n", tag, bh, i,
                    (double)gshift[i], (double)want);
        ++bad;
    }
    CHECK(bad == 0, "[%s] bh %d: %ld LSE shift mismatches", tag, bh, bad);
}

#define SHIFT_SM_SCALE 0.1f /* any float: the shift is linear in it */

/* One head: the CPU reference of qvi_cpu_prepare_head, compared with the device. */
static void check_head(const variant *va, const shape *sh, const char *tag, const host_dev *Q,
                       const host_dev *K, const host_dev *V, const int32_t *perm_all,
                       const float *signs, const qvc_ops *o, const host_ops *g,
                       const float *gshift, int bh) {
    const int d = sh->D, nq = sh->nq, nk = sh->nk, nq_pad = o->nq_pad, nk_pad = o->nk_pad,
              nblk = o->nblk;
    const int b = bh / sh->H, h = bh % sh->H;
    const int32_t *perm = va->use_perm ? perm_all + (size_t)bh * nk : NULL;
    float *q = calloc((size_t)nq_pad * d, 4), *k = calloc((size_t)nk_pad * d, 4),
          *v = calloc((size_t)nk_pad * d, 4), *raw_v = malloc((size_t)nk * d * 4),
          *raw = malloc((size_t)nk * d * 4);
    if (!q || !k || !v || !raw || !raw_v) {
        CHECK(0, "host allocation");
        goto done;
    }
    qvi_load_head(&Q->t, b, h, q);
    qvi_load_head(&V->t, b, h, raw_v);
    gather(raw_v, nk, d, perm, v);
    qvi_load_head(&K->t, b, h, raw);
    gather(raw, nk, d, perm, k);
    if (va->smooth_k) {
        float mean[128];
        qvi_channel_mean(k, nk, d, mean);
        for (int i = 0; i < nk; ++i)
            for (int c = 0; c < d; ++c) k[(size_t)i * d + c] -= mean[c];
        if (gshift)
            check_lse_shift(tag, bh, q, mean, nq, d, SHIFT_SM_SCALE, gshift + (size_t)bh * nq);
    }
    if (va->hadamard) {
        for (int i = 0; i < nq; ++i) qva_hadamard(q + (size_t)i * d, d, signs);
        for (int i = 0; i < nk; ++i) qva_hadamard(k + (size_t)i * d, d, signs);
    }

    /* Q and K codes and block scales. */
    uint8_t *qc = NULL, *kc = NULL;
    float *qsc = NULL, *ksc = NULL;
    cpu_quant_qk(va, q, nq_pad, d, va->q_rps, &qc, &qsc);
    cpu_quant_qk(va, k, nk_pad, d, QVI_BLOCK, &kc, &ksc);
    if (qc && kc && qsc && ksc) {
        long bq = cmp_bytes("Q code", tag, bh, (const uint8_t *)g->q + (size_t)bh * nq_pad * d, qc,
                            nq_pad, d);
        const int nqs = nq_pad / va->q_rps;
        CHECK(o->q_rows_per_scale == va->q_rps, "[%s] ops.q_rows_per_scale %d, want %d", tag,
              o->q_rows_per_scale, va->q_rps);
        long bqs = cmp_floats("Q scale", tag, bh, g->qs + (size_t)bh * nqs, qsc, nqs);
        long bk = cmp_bytes("K code", tag, bh, (const uint8_t *)g->k + (size_t)bh * nk_pad * d, kc,
                            nk_pad, d);
        long bks = cmp_floats("K scale", tag, bh, g->ks + (size_t)bh * nblk, ksc, nblk);
        CHECK(bq == 0 && bqs == 0, "[%s] bh %d: %ld Q code and %ld Q scale mismatches", tag, bh, bq,
              bqs);
        /* The K channel mean is summed in the CPU's order on the device, so
         * even a last-bit difference there would be a bug: expect 0. */
        CHECK(bk == 0 && bks == 0, "[%s] bh %d: %ld K code and %ld K scale mismatches", tag, bh, bk,
              bks);
    } else {
        CHECK(0, "CPU quantizer allocation");
    }
    free(qc), free(kc), free(qsc), free(ksc);

    /* V: the CPU codes row-major [nk_pad][d]; the device's transposed per
     * block with the PV slot order inside each 32-key chunk. */
    uint8_t *vc = NULL;
    float *chan = NULL, *blk = NULL, *mu = NULL;
    qvi_v8 v8;
    qvi_f8 f8;
    memset(&v8, 0, sizeof v8);
    memset(&f8, 0, sizeof f8);
    if (va->v_mode == 0) {
        if (qvi_v8_prepare_carried(raw_v, nk, d, perm, va->demean, QVA_V_E4M3, NULL, va->v_sample,
                                   NULL, &v8) != QVA_OK) {
            CHECK(0, "qvi_v8_prepare failed");
            goto done;
        }
        vc = v8.codes;
        chan = v8.chan_scale;
        mu = v8.mu_hat;
    } else {
        qvi_quant_e4m3_blocks(v, nk_pad, d, &f8);
        if (!f8.codes) {
            CHECK(0, "qvi_quant_e4m3_blocks failed");
            goto done;
        }
        vc = f8.codes;
        chan = f8.chan_scale;
        blk = f8.block_scale;
    }
    long bv = 0;
    for (int j = 0; j < nblk; ++j)
        for (int c = 0; c < d; ++c)
            for (int s = 0; s < QVI_BLOCK; ++s) {
                int key = j * QVI_BLOCK + (s & ~31) + qvc_pv_slot_key(s & 31);
                uint8_t gv = g->vt[(((size_t)bh * nblk + j) * d + c) * QVI_BLOCK + s];
                uint8_t cv = vc[(size_t)key * d + c];
                if (gv == cv) continue;
                if (bv < 5)
                    fprintf(stderr, "  [%s] V code bh %d key %d ch %d (slot %d): gpu 0x%02x cpu 0x%02x\n",
                            tag, bh, key, c, s, gv, cv);
                ++bv;
            }
    CHECK(bv == 0, "[%s] bh %d: %ld V code mismatches", tag, bh, bv);
    long bc = cmp_floats("v_chan", tag, bh, g->vchan + (size_t)bh * d, chan, d);
    CHECK(bc == 0, "[%s] bh %d: %ld v_chan mismatches", tag, bh, bc);
    long bb = 0;
    for (int j = 0; j < nblk; ++j) {
        float want = blk ? blk[j] : 1.0f;
        if (!same_bits(g->vblk[(size_t)bh * nblk + j], want)) {
            if (bb < 5)
                fprintf(stderr, "  [%s] v_blk bh %d blk %d: gpu %.9g cpu %.9g\n", tag, bh, j,
                        (double)g->vblk[(size_t)bh * nblk + j], (double)want);
            ++bb;
        }
    }
    CHECK(bb == 0, "[%s] bh %d: %ld v_blk mismatches", tag, bh, bb);
    if (g->vmu) {
        long bm = 0;
        for (int i = 0; i < nblk * d; ++i) {
            float want = mu ? mu[i] : 0.0f, got = g->vmu[(size_t)bh * nblk * d + i];
            if (same_bits(got, want)) continue;
            if (bm < 5)
                fprintf(stderr, "  [%s] v_mu bh %d blk %d ch %d: gpu %.9g cpu %.9g\n", tag, bh,
                        i / d, i % d, (double)got, (double)want);
            ++bm;
        }
        CHECK(bm == 0, "[%s] bh %d: %ld v_mu mismatches", tag, bh, bm);
        CHECK(g->vmut != NULL, "[%s] v_mu_tile missing at D=%d", tag, d);
        if (g->vmut) CHECK(check_mu_tile(tag, bh, nblk, d, g) == 0, "[%s] bh %d: v_mu_tile", tag, bh);
    } else {
        CHECK(!va->demean, "[%s] demean without v_mu", tag);
    }
    qvi_v8_free(&v8);
    free(f8.codes), free(f8.block_scale), free(f8.chan_scale);
done:
    free(q), free(k), free(v), free(raw), free(raw_v);
}

/* shape.spike: in each head, 2^20 at channel 9 of row 5 of the first
 * block that QVA_STAT_BLOCK misses (in the permuted order), on the host
 * and the device. */
static int put_spike(host_dev *V, const shape *sh, const int32_t *perm) {
    const int nblk = (sh->nk + QVI_BLOCK - 1) / QVI_BLOCK;
    int missed = -1;
    for (int j = 0; j < nblk && missed < 0; ++j) {
        int hit = 0;
        for (int64_t i = 0; i < QVA_STAT_BLOCKS(nblk); ++i) hit |= QVA_STAT_BLOCK(i, nblk) == j;
        if (!hit) missed = j;
    }
    CHECK(missed >= 0 && sh->dt == QVA_BF16, "spike: an unsampled block of bf16 V");
    if (missed < 0 || sh->dt != QVA_BF16) return 0;
    for (int b = 0; b < sh->B; ++b)
        for (int h = 0; h < sh->H; ++h) {
            const int row = perm[(size_t)(b * sh->H + h) * sh->nk + missed * QVI_BLOCK + 5];
            ((uint16_t *)V->t.data)[qvi_offset(&V->t, b, h, row, 9)] = bf16_bits(0x1p20f);
        }
    const size_t bytes = (size_t)sh->B * sh->H * sh->nk * sh->D * 2;
    return cuda_ok(cudaMemcpy(V->dev, V->t.data, bytes, cudaMemcpyHostToDevice), "H2D spike");
}

/* The side streams of the preparation (qvc_prep with a fork: Q, K and V
 * side by side), used by every other variant; the rest run on st alone. */
static qvc_fork g_fork;

static void test_prep_shape(const shape *sh, cudaStream_t st) {
    host_dev Q, K, V;
    memset(&Q, 0, sizeof Q), memset(&K, 0, sizeof K), memset(&V, 0, sizeof V);
    const int BH = sh->B * sh->H, d = sh->D;
    if (!make_tensor(&Q, sh->dt, sh->nhd, sh->B, sh->H, sh->nq, d, 0.5f) ||
        !make_tensor(&K, sh->dt, sh->nhd, sh->B, sh->H, sh->nk, d, 3.0f) ||
        !make_tensor(&V, sh->dt, sh->nhd, sh->B, sh->H, sh->nk, d, 1.5f)) {
        free_tensor(&Q), free_tensor(&K), free_tensor(&V);
        return;
    }
    /* A random permutation per head (Fisher-Yates). */
    int32_t *perm = malloc((size_t)BH * sh->nk * sizeof *perm), *dperm = NULL;
    float signs[128], *dsigns = NULL;
    qva_config cfg;
    qva_config_default(&cfg);
    cfg.hadamard_signs = 1;
    cfg.hadamard_seed = 1234567 + (uint64_t)sh->nk;
    qvi_hadamard_signs(&cfg, d, signs);
    if (!perm) {
        CHECK(0, "host allocation");
        goto out;
    }
    for (int bh = 0; bh < BH; ++bh) {
        int32_t *p = perm + (size_t)bh * sh->nk;
        for (int i = 0; i < sh->nk; ++i) p[i] = i;
        for (int i = sh->nk - 1; i > 0; --i) {
            int j = (int)(rng_u64() % (uint64_t)(i + 1));
            int32_t t = p[i];
            p[i] = p[j], p[j] = t;
        }
    }
    if (sh->spike && !put_spike(&V, sh, perm)) goto out;
    if (!cuda_ok(cudaMalloc((void **)&dperm, (size_t)BH * sh->nk * 4), "cudaMalloc perm") ||
        !cuda_ok(cudaMemcpy(dperm, perm, (size_t)BH * sh->nk * 4, cudaMemcpyHostToDevice), "H2D perm") ||
        !cuda_ok(cudaMalloc((void **)&dsigns, (size_t)d * 4), "cudaMalloc signs") ||
        !cuda_ok(cudaMemcpy(dsigns, signs, (size_t)d * 4, cudaMemcpyHostToDevice), "H2D signs"))
        goto out;

    for (int vi = 0; vi < NVARIANTS; ++vi) {
        const variant *va = &VARIANTS[vi];
        if (va->v_sample && sh->dt == QVA_F32) continue; /* 16-bit inputs (qvc_prep) */
        char tag[160];
        snprintf(tag, sizeof tag, "%s nq=%d nk=%d D=%d B=%d H=%d %s %s", va->name, sh->nq, sh->nk,
                 d, sh->B, sh->H, dtype_name(sh->dt), sh->nhd ? "NHD" : "HND");
        qvc_ops ops;
        qva_status s = qvc_ops_alloc(&ops, BH, sh->nq, sh->nk, d, va->v_mode == 0, 0);
        CHECK(s == QVA_OK, "[%s] qvc_ops_alloc: %s", tag, qva_last_error());
        if (s != QVA_OK) continue;
        /* Poison everything so an entry the kernels forget shows up. */
        cuda_ok(cudaMemset(ops.q_i8, 0xA5, (size_t)BH * ops.nq_pad * d), "poison");
        cuda_ok(cudaMemset(ops.k_i8, 0xA5, (size_t)BH * ops.nk_pad * d), "poison");
        cuda_ok(cudaMemset(ops.v_t, 0xA5, (size_t)BH * ops.nblk * d * QVI_BLOCK), "poison");
        cuda_ok(cudaMemset(ops.v_chan, 0xFF, (size_t)BH * d * 4), "poison");
        cuda_ok(cudaMemset(ops.v_blk, 0xFF, (size_t)BH * ops.nblk * 4), "poison");
        cuda_ok(cudaMemset(ops.q_scale, 0xFF, (size_t)BH * ops.nq_pad * 4), "poison");
        cuda_ok(cudaMemset(ops.k_scale, 0xFF, (size_t)BH * ops.nblk * 4), "poison");
        if (ops.v_mu) cuda_ok(cudaMemset(ops.v_mu, 0xFF, (size_t)BH * ops.nblk * d * 4), "poison");
        if (ops.v_mu_tile)
            cuda_ok(cudaMemset(ops.v_mu_tile, 0xFF, (size_t)BH * qvc_mu_head_bytes(ops.nblk)),
                    "poison");

        qvc_prep_args a;
        memset(&a, 0, sizeof a);
        a.qk_format = va->fmt;
        a.q_rows_per_scale = va->q_rps;
        a.smooth_k = va->smooth_k;
        a.hadamard = va->hadamard;
        a.had_signs = va->signs ? dsigns : NULL;
        a.perm = va->use_perm ? dperm : NULL;
        a.v_mode = va->v_mode;
        a.demean = va->demean;
        a.v_sample = va->v_sample;
        /* The LSE shift comes with K smoothing (poisoned first). */
        const size_t nshift = (size_t)BH * sh->nq;
        float *dshift = NULL, *gshift = NULL;
        if (va->smooth_k && cuda_ok(cudaMalloc((void **)&dshift, nshift * 4), "cudaMalloc shift") &&
            cuda_ok(cudaMemset(dshift, 0xFF, nshift * 4), "poison")) {
            a.lse_shift = dshift;
            a.sm_scale = SHIFT_SM_SCALE;
            gshift = malloc(nshift * 4);
        }
        s = qvc_prep(&Q.view, &K.view, &V.view, &a, &ops, vi % 2 ? &g_fork : NULL, st);
        CHECK(s == QVA_OK, "[%s] qvc_prep: %s", tag, qva_last_error());
        if (s == QVA_OK && cuda_ok(cudaStreamSynchronize(st), "qvc_prep sync")) {
            host_ops g;
            if (gshift && !cuda_ok(cudaMemcpy(gshift, dshift, nshift * 4, cudaMemcpyDeviceToHost),
                                   "D2H shift")) {
                free(gshift);
                gshift = NULL;
            }
            if (fetch_ops(&ops, &g))
                for (int bh = 0; bh < BH; ++bh)
                    check_head(va, sh, tag, &Q, &K, &V, perm, va->signs ? signs : NULL, &ops, &g,
                               gshift, bh);
            host_ops_free(&g);
        }
        free(gshift);
        if (dshift) cudaFree(dshift);
        qvc_ops_free(&ops);
    }
out:
    free(perm);
    if (dperm) cudaFree(dperm);
    if (dsigns) cudaFree(dsigns);
    free_tensor(&Q), free_tensor(&K), free_tensor(&V);
}

static void test_prep(cudaStream_t st) {
    const int ns[] = {77, 200, 384}, ds[] = {64, 128};
    const qva_dtype dts[] = {QVA_F32, QVA_BF16, QVA_F16};
    int idx = 0;
    for (int ni = 0; ni < 3; ++ni)
        for (int di = 0; di < 2; ++di)
            for (int ti = 0; ti < 3; ++ti)
                for (int nhd = 0; nhd < 2; ++nhd, ++idx) {
                    if (dts[ti] == QVA_F16 && nhd) continue; /* f16: one layout is enough */
                    shape sh;
                    sh.nk = ns[ni];
                    /* Mostly self-attention; every third shape has nq != nk. */
                    sh.nq = idx % 3 == 2 ? ns[ni] + 53 : ns[ni];
                    sh.D = ds[di];
                    sh.B = idx % 2 ? 3 : 1;
                    sh.H = idx % 2 ? 1 : 3;
                    sh.dt = dts[ti];
                    sh.nhd = nhd;
                    sh.spike = 0;
                    test_prep_shape(&sh, st);
                }
    /* more key blocks than +vsample's demeaning step samples */
    const shape more[] = {{1500, 1500, 128, 1, 2, QVA_BF16, 0, 0},
                          {1500, 1500, 128, 1, 2, QVA_BF16, 1, 1},
                          {1300, 1300, 64, 2, 1, QVA_F16, 0, 0}};
    for (size_t i = 0; i < sizeof more / sizeof *more; ++i) test_prep_shape(&more[i], st);
}

/* ------------------------------------------------------------ qvc_prep4 */

typedef struct variant4 {
    const char *name;
    int hadamard, signs, use_perm, demean;
} variant4;

static const variant4 VARIANTS4[] = {
    {"sage4", 0, 0, 0, 0},
    {"sage4+had(signs)", 1, 1, 0, 0},
    {"vc4", 0, 0, 1, 1},
    {"vc4+had", 1, 0, 1, 1},
    {"vc4 plain step", 0, 0, 1, 0},
};
#define NVARIANTS4 ((int)(sizeof VARIANTS4 / sizeof VARIANTS4[0]))

/* Device NVFP4 operands copied back to the host. */
typedef struct host_ops4 {
    uint8_t *q, *q_sc, *k, *k_sc, *v, *v_sc;
    float *g, *mu, *shift;
} host_ops4;

static void host_ops4_free(host_ops4 *h) {
    free(h->q), free(h->q_sc), free(h->k), free(h->k_sc), free(h->v), free(h->v_sc);
    free(h->g), free(h->mu), free(h->shift);
}

static int fetch_ops4(const qvc_ops4 *o, const float *dshift, host_ops4 *h) {
    const size_t bh = (size_t)o->BH, d = (size_t)o->D, nqp = (size_t)o->nq_pad,
                 nkp = (size_t)o->nk_pad;
    const size_t bytes[] = {bh * nqp * d / 2, bh * nqp * d / 16, bh * nkp * d / 2,
                            bh * nkp * d / 16, bh * nkp * d / 2, bh * (nkp / 16) * d};
    uint8_t **dst[] = {&h->q, &h->q_sc, &h->k, &h->k_sc, &h->v, &h->v_sc};
    const uint8_t *src[] = {o->q, o->q_sc, o->k, o->k_sc, o->v, o->v_sc};
    memset(h, 0, sizeof *h);
    int ok = 1;
    for (int i = 0; i < 6 && ok; ++i) {
        *dst[i] = malloc(bytes[i]);
        ok = *dst[i] && cuda_ok(cudaMemcpy(*dst[i], src[i], bytes[i], cudaMemcpyDeviceToHost), "D2H ops4");
    }
    h->g = malloc(bh * 3 * 4);
    ok = ok && h->g && cuda_ok(cudaMemcpy(h->g, o->g, bh * 3 * 4, cudaMemcpyDeviceToHost), "D2H g");
    if (ok && o->mu) {
        const size_t n = bh * (size_t)o->nblk * d * 4;
        h->mu = malloc(n);
        ok = h->mu && cuda_ok(cudaMemcpy(h->mu, o->mu, n, cudaMemcpyDeviceToHost), "D2H mu");
    }
    if (ok && dshift) {
        h->shift = malloc(bh * (size_t)o->nq * 4);
        ok = h->shift &&
             cuda_ok(cudaMemcpy(h->shift, dshift, bh * (size_t)o->nq * 4, cudaMemcpyDeviceToHost),
                     "D2H shift");
    }
    CHECK(ok, "fetch_ops4");
    return ok;
}

/* Nibble c of a row of packed E2M1 codes (channel 2i low, 2i+1 high). */
static uint8_t nib(const uint8_t *row, int c) { return (uint8_t)((row[c >> 1] >> (4 * (c & 1))) & 15u); }

/* Q or K of one head (x: [n_pad][d], prepared as the CPU has it) against
 * the device: g, codes and scale codes of qva_nvfp4_quantize, and the
 * device codes decoded as sigma * e2m1 against qvi_quant_nvfp4_rows. */
static void check_nvfp4_rows(const char *what, const char *tag, int bh, const float *x, int n_pad,
                             int d, const uint8_t *gcodes, const uint8_t *gsc, float gg) {
    float *recon = malloc((size_t)n_pad * d * 4);
    if (!recon) {
        CHECK(0, "host allocation");
        return;
    }
    const float g = qvi_quant_nvfp4_rows(x, n_pad, d, recon);
    CHECK(same_bits(gg, g), "[%s] %s bh %d: tensor scale gpu %.9g cpu %.9g", tag, what, bh,
          (double)gg, (double)g);
    long bc = 0, bs = 0, br = 0;
    for (int r = 0; r < n_pad; ++r) {
        uint8_t codes[128], sc[8];
        qva_nvfp4_quantize(x + (size_t)r * d, (size_t)d, g, codes, sc);
        const uint8_t *grow = gcodes + (size_t)r * (d / 2), *gs = gsc + (size_t)r * (d / 16);
        for (int c = 0; c < d; ++c) {
            const uint8_t gc = nib(grow, c);
            if (gc != codes[c] && bc++ < 5)
                fprintf(stderr, "  [%s] %s code bh %d row %d ch %d: gpu 0x%x cpu 0x%x\n", tag, what,
                        bh, r, c, gc, codes[c]);
            const float dec = qva_e4m3_decode(gs[c / 16]) * qva_e2m1_decode(gc);
            if (!same_bits(dec, recon[(size_t)r * d + c]) && br++ < 5)
                fprintf(stderr, "  [%s] %s value bh %d row %d ch %d: gpu %.9g cpu %.9g\n", tag,
                        what, bh, r, c, (double)dec, (double)recon[(size_t)r * d + c]);
        }
        for (int t = 0; t < d / 16; ++t)
            if (gs[t] != sc[t] && bs++ < 5)
                fprintf(stderr, "  [%s] %s scale bh %d row %d group %d: gpu 0x%02x cpu 0x%02x\n",
                        tag, what, bh, r, t, gs[t], sc[t]);
    }
    CHECK(bc == 0 && bs == 0 && br == 0, "[%s] %s bh %d: %ld code, %ld scale, %ld value mismatches",
          tag, what, bh, bc, bs, br);
    free(recon);
}

/* V of one head (x: [n_pad][d]; groups of 16 keys per channel) against
 * qva_nvfp4_quantize of each column and qvi_quant_nvfp4_cols. */
static void check_nvfp4_cols(const char *tag, int bh, const float *x, int n_pad, int d,
                             const uint8_t *gcodes, const uint8_t *gsc, float gg) {
    float *recon = malloc((size_t)n_pad * d * 4), *col = malloc((size_t)n_pad * 4);
    uint8_t *codes = malloc((size_t)n_pad), *sc = malloc((size_t)n_pad / 16);
    if (!recon || !col || !codes || !sc) {
        CHECK(0, "host allocation");
        free(recon), free(col), free(codes), free(sc);
        return;
    }
    const float g = qvi_quant_nvfp4_cols(x, n_pad, d, recon);
    CHECK(same_bits(gg, g), "[%s] V bh %d: tensor scale gpu %.9g cpu %.9g", tag, bh, (double)gg,
          (double)g);
    long bc = 0, bs = 0, br = 0;
    for (int c = 0; c < d; ++c) {
        for (int r = 0; r < n_pad; ++r) col[r] = x[(size_t)r * d + c];
        qva_nvfp4_quantize(col, (size_t)n_pad, g, codes, sc);
        for (int r = 0; r < n_pad; ++r) {
            const uint8_t gc = nib(gcodes + (size_t)r * (d / 2), c);
            if (gc != codes[r] && bc++ < 5)
                fprintf(stderr, "  [%s] V code bh %d key %d ch %d: gpu 0x%x cpu 0x%x\n", tag, bh, r,
                        c, gc, codes[r]);
            const float dec = qva_e4m3_decode(gsc[(size_t)(r / 16) * d + c]) * qva_e2m1_decode(gc);
            if (!same_bits(dec, recon[(size_t)r * d + c]) && br++ < 5)
                fprintf(stderr, "  [%s] V value bh %d key %d ch %d: gpu %.9g cpu %.9g\n", tag, bh,
                        r, c, (double)dec, (double)recon[(size_t)r * d + c]);
        }
        for (int t = 0; t < n_pad / 16; ++t)
            if (gsc[(size_t)t * d + c] != sc[t] && bs++ < 5)
                fprintf(stderr, "  [%s] V scale bh %d group %d ch %d: gpu 0x%02x cpu 0x%02x\n", tag,
                        bh, t, c, gsc[(size_t)t * d + c], sc[t]);
    }
    CHECK(bc == 0 && bs == 0 && br == 0, "[%s] V bh %d: %ld code, %ld scale, %ld value mismatches",
          tag, bh, bc, bs, br);
    free(recon), free(col), free(codes), free(sc);
}

/* One head through the CPU's qvi_cpu_prepare_head / quantize_fp4, against the device. */
static void check_head4(const variant4 *va, const shape *sh, const char *tag, const host_dev *Q,
                        const host_dev *K, const host_dev *V, const int32_t *perm_all,
                        const float *signs, const qvc_ops4 *o, const host_ops4 *g, int bh) {
    const int d = sh->D, nq = sh->nq, nk = sh->nk, nq_pad = o->nq_pad, nk_pad = o->nk_pad,
              nblk = o->nblk;
    const int b = bh / sh->H, h = bh % sh->H;
    const int32_t *perm = va->use_perm ? perm_all + (size_t)bh * nk : NULL;
    float *q = calloc((size_t)nq_pad * d, 4), *k = calloc((size_t)nk_pad * d, 4),
          *v = calloc((size_t)nk_pad * d, 4), *raw = malloc((size_t)nk * d * 4);
    if (!q || !k || !v || !raw) {
        CHECK(0, "host allocation");
        free(q), free(k), free(v), free(raw);
        return;
    }
    qvi_load_head(&Q->t, b, h, q);
    qvi_load_head(&V->t, b, h, raw);
    gather(raw, nk, d, perm, v);
    qvi_load_head(&K->t, b, h, raw);
    gather(raw, nk, d, perm, k);
    float mean[128];
    qvi_channel_mean(k, nk, d, mean);
    for (int i = 0; i < nk; ++i)
        for (int c = 0; c < d; ++c) k[(size_t)i * d + c] -= mean[c];
    check_lse_shift(tag, bh, q, mean, nq, d, SHIFT_SM_SCALE, g->shift + (size_t)bh * nq);
    if (va->hadamard) {
        for (int i = 0; i < nq; ++i) qva_hadamard(q + (size_t)i * d, d, signs);
        for (int i = 0; i < nk; ++i) qva_hadamard(k + (size_t)i * d, d, signs);
    }
    if (va->demean) { /* qvi_block_demean of the CPU; means stored fp16(mu), unscaled */
        long bm = 0;
        for (int j = 0; j < nblk; ++j) {
            const int r0 = j * QVI_BLOCK, r1 = r0 + QVI_BLOCK < nk ? r0 + QVI_BLOCK : nk;
            for (int c = 0; c < d; ++c) {
                const float m = qvi_block_mean(v, nk, d, r0, c);
                for (int i = r0; i < r1; ++i) v[(size_t)i * d + c] -= m;
                const float want = qva_round_f16(m), got = g->mu[((size_t)bh * nblk + j) * d + c];
                if (!same_bits(got, want) && bm++ < 5)
                    fprintf(stderr, "  [%s] mu bh %d blk %d ch %d: gpu %.9g cpu %.9g\n", tag, bh, j,
                            c, (double)got, (double)want);
            }
        }
        CHECK(bm == 0, "[%s] bh %d: %ld vc4 mean mismatches", tag, bh, bm);
    }
    check_nvfp4_rows("Q", tag, bh, q, nq_pad, d, g->q + (size_t)bh * nq_pad * (d / 2),
                     g->q_sc + (size_t)bh * nq_pad * (d / 16), g->g[bh * 3 + 0]);
    check_nvfp4_rows("K", tag, bh, k, nk_pad, d, g->k + (size_t)bh * nk_pad * (d / 2),
                     g->k_sc + (size_t)bh * nk_pad * (d / 16), g->g[bh * 3 + 1]);
    check_nvfp4_cols(tag, bh, v, nk_pad, d, g->v + (size_t)bh * nk_pad * (d / 2),
                     g->v_sc + (size_t)bh * (nk_pad / 16) * d, g->g[bh * 3 + 2]);
    free(q), free(k), free(v), free(raw);
}

static void test_prep4_shape(const shape *sh, cudaStream_t st) {
    host_dev Q, K, V;
    memset(&Q, 0, sizeof Q), memset(&K, 0, sizeof K), memset(&V, 0, sizeof V);
    const int BH = sh->B * sh->H, d = sh->D;
    if (!make_tensor(&Q, sh->dt, sh->nhd, sh->B, sh->H, sh->nq, d, 0.5f) ||
        !make_tensor(&K, sh->dt, sh->nhd, sh->B, sh->H, sh->nk, d, 3.0f) ||
        !make_tensor(&V, sh->dt, sh->nhd, sh->B, sh->H, sh->nk, d, 1.5f)) {
        free_tensor(&Q), free_tensor(&K), free_tensor(&V);
        return;
    }
    int32_t *perm = malloc((size_t)BH * sh->nk * sizeof *perm), *dperm = NULL;
    float signs[128], *dsigns = NULL, *dshift = NULL;
    qva_config cfg;
    qva_config_default(&cfg);
    cfg.hadamard_signs = 1;
    cfg.hadamard_seed = 7654321 + (uint64_t)sh->nk;
    qvi_hadamard_signs(&cfg, d, signs);
    if (!perm) {
        CHECK(0, "host allocation");
        goto out;
    }
    for (int bh = 0; bh < BH; ++bh) {
        int32_t *p = perm + (size_t)bh * sh->nk;
        for (int i = 0; i < sh->nk; ++i) p[i] = i;
        for (int i = sh->nk - 1; i > 0; --i) {
            int j = (int)(rng_u64() % (uint64_t)(i + 1));
            int32_t t = p[i];
            p[i] = p[j], p[j] = t;
        }
    }
    const size_t nshift = (size_t)BH * sh->nq;
    if (sh->spike && !put_spike(&V, sh, perm)) goto out;
    if (!cuda_ok(cudaMalloc((void **)&dperm, (size_t)BH * sh->nk * 4), "cudaMalloc perm") ||
        !cuda_ok(cudaMemcpy(dperm, perm, (size_t)BH * sh->nk * 4, cudaMemcpyHostToDevice), "H2D perm") ||
        !cuda_ok(cudaMalloc((void **)&dsigns, (size_t)d * 4), "cudaMalloc signs") ||
        !cuda_ok(cudaMemcpy(dsigns, signs, (size_t)d * 4, cudaMemcpyHostToDevice), "H2D signs") ||
        !cuda_ok(cudaMalloc((void **)&dshift, nshift * 4), "cudaMalloc shift"))
        goto out;

    for (int vi = 0; vi < NVARIANTS4; ++vi) {
        const variant4 *va = &VARIANTS4[vi];
        char tag[160];
        snprintf(tag, sizeof tag, "%s nq=%d nk=%d D=%d B=%d H=%d %s %s", va->name, sh->nq, sh->nk,
                 d, sh->B, sh->H, dtype_name(sh->dt), sh->nhd ? "NHD" : "HND");
        qvc_ops4 ops;
        qva_status s = qvc_ops4_alloc(&ops, BH, sh->nq, sh->nk, d, 1);
        CHECK(s == QVA_OK, "[%s] qvc_ops4_alloc: %s", tag, qva_last_error());
        if (s != QVA_OK) continue;
        /* Poison everything so an entry the kernels forget shows up. */
        const size_t nqp = (size_t)ops.nq_pad, nkp = (size_t)ops.nk_pad;
        cuda_ok(cudaMemset(ops.q, 0xA5, (size_t)BH * nqp * d / 2), "poison");
        cuda_ok(cudaMemset(ops.q_sc, 0xA5, (size_t)BH * nqp * d / 16), "poison");
        cuda_ok(cudaMemset(ops.k, 0xA5, (size_t)BH * nkp * d / 2), "poison");
        cuda_ok(cudaMemset(ops.k_sc, 0xA5, (size_t)BH * nkp * d / 16), "poison");
        cuda_ok(cudaMemset(ops.v, 0xA5, (size_t)BH * nkp * d / 2), "poison");
        cuda_ok(cudaMemset(ops.v_sc, 0xA5, (size_t)BH * (nkp / 16) * d), "poison");
        cuda_ok(cudaMemset(ops.g, 0xFF, (size_t)BH * 3 * 4), "poison");
        cuda_ok(cudaMemset(ops.mu, 0xFF, (size_t)BH * ops.nblk * d * 4), "poison");
        cuda_ok(cudaMemset(dshift, 0xFF, nshift * 4), "poison");

        qvc_prep_args a;
        memset(&a, 0, sizeof a);
        a.smooth_k = 1;
        a.hadamard = va->hadamard;
        a.had_signs = va->signs ? dsigns : NULL;
        a.perm = va->use_perm ? dperm : NULL;
        a.demean = va->demean;
        a.lse_shift = dshift;
        a.sm_scale = SHIFT_SM_SCALE;
        qvc_ops4 call = ops;
        if (!va->demean) call.mu = NULL;
        s = qvc_prep4(&Q.view, &K.view, &V.view, &a, &call, st);
        CHECK(s == QVA_OK, "[%s] qvc_prep4: %s", tag, qva_last_error());
        if (s == QVA_OK && cuda_ok(cudaStreamSynchronize(st), "qvc_prep4 sync")) {
            host_ops4 g;
            if (fetch_ops4(&call, dshift, &g))
                for (int bh = 0; bh < BH; ++bh)
                    check_head4(va, sh, tag, &Q, &K, &V, perm, va->signs ? signs : NULL, &call, &g,
                                bh);
            host_ops4_free(&g);
        }
        qvc_ops4_free(&ops);
    }
out:
    free(perm);
    if (dperm) cudaFree(dperm);
    if (dsigns) cudaFree(dsigns);
    if (dshift) cudaFree(dshift);
    free_tensor(&Q), free_tensor(&K), free_tensor(&V);
}

static void test_prep4(cudaStream_t st) {
    const int ns[] = {77, 200, 384}, ds[] = {64, 128};
    const qva_dtype dts[] = {QVA_F32, QVA_BF16, QVA_F16};
    int idx = 0;
    for (int ni = 0; ni < 3; ++ni)
        for (int di = 0; di < 2; ++di)
            for (int ti = 0; ti < 3; ++ti, ++idx) {
                shape sh;
                sh.nk = ns[ni];
                sh.nq = idx % 3 == 2 ? ns[ni] + 53 : ns[ni];
                sh.D = ds[di];
                sh.B = idx % 2 ? 2 : 1;
                sh.H = idx % 2 ? 1 : 2;
                sh.dt = dts[ti];
                sh.nhd = idx % 2;
                test_prep4_shape(&sh, st);
            }
}

/* ------------------------------------------------------------ k-means */

/* GPU qvc_kmeans_perm against qvi_kmeans + qvi_stable_argsort_labels on
 * every head; the CPU sees exactly the values the device view holds. */
static void kmeans_case_d(const char *preset, int dim, qva_dtype dt, int nhd, int discrete,
                          int spice, int k, int iters, cudaStream_t st) {
    qva_synthetic_spec spec;
    if (qva_synthetic_preset(preset, &spec) != QVA_OK) {
        CHECK(0, "preset %s: %s", preset, qva_last_error());
        return;
    }
    if (dim > 0) spec.D = dim; /* head dims off the 32-channel chunks and vector loads */
    const int B = spec.B, H = spec.H, D = spec.D, BH = B * H;
    const int N = spec.prefix_tokens + spec.grid_t * spec.grid_h * spec.grid_w;
    const size_t count = (size_t)BH * N * D;
    float *q = malloc(count * 4), *kk = malloc(count * 4), *v = malloc(count * 4);
    float *cent_c = malloc((size_t)BH * k * D * 4), *cent_g = malloc((size_t)BH * k * D * 4);
    int32_t *labels = malloc((size_t)N * 4), *perm_c = malloc((size_t)BH * N * 4),
            *perm_g = malloc((size_t)BH * N * 4);
    void *hbuf = malloc(count * qva_dtype_size(dt));
    void *dv = NULL;
    float *dcent = NULL;
    int32_t *dperm = NULL;
    char tag[128];
    snprintf(tag, sizeof tag, "kmeans %s D=%d%s%s %s %s k=%d iters=%d", preset, D,
             discrete ? " (discrete)" : "",
             spice == 1 ? " (tiny values)" : spice == 2 ? " (huge values)" : "", dtype_name(dt),
             nhd ? "NHD" : "HND", k, iters);
    if (!q || !kk || !v || !cent_c || !cent_g || !labels || !perm_c || !perm_g || !hbuf) {
        CHECK(0, "host allocation");
        goto out;
    }
    if (qva_synthetic_generate(&spec, q, kk, v) != QVA_OK) {
        CHECK(0, "synthetic: %s", qva_last_error());
        goto out;
    }
    /* v (HND f32) -> the tested dtype and layout; v keeps the widened
     * values the CPU sees. */
    qva_tensor t = nhd ? qva_tensor_nhd(hbuf, dt, QVA_DEVICE_CPU, B, H, N, D)
                       : qva_tensor_hnd(hbuf, dt, QVA_DEVICE_CPU, B, H, N, D);
    for (int bh = 0; bh < BH; ++bh)
        for (int n = 0; n < N; ++n)
            for (int c = 0; c < D; ++c) {
                float *x = &v[((size_t)bh * N + n) * D + c];
                /* discrete: a few exactly representable levels, so equal
                 * distances (ties) are common and the tie rule is tested */
                if (discrete) *x = fminf(2.0f, fmaxf(-2.0f, 0.5f * rintf(*x / (0.5f * 0.5f))));
                /* tiny values: centroid sums the device cannot certify as
                 * exact, so they take its sequential path */
                if (spice == 1 && rng_unit() < 0.01) *x *= 1e-9f;
                /* huge values: FP32 distances that overflow, so the
                 * tensor-core assignment must leave them to the exact path */
                if (spice == 2 && rng_unit() < 0.05) *x *= 3e18f;
                int64_t o = qvi_offset(&t, bh / H, bh % H, n, c);
                if (dt == QVA_BF16) {
                    *x = qva_round_bf16(*x);
                    ((uint16_t *)hbuf)[o] = bf16_bits(*x);
                } else {
                    ((float *)hbuf)[o] = *x;
                }
            }
    if (!cuda_ok(cudaMalloc(&dv, count * qva_dtype_size(dt)), "cudaMalloc v") ||
        !cuda_ok(cudaMemcpy(dv, hbuf, count * qva_dtype_size(dt), cudaMemcpyHostToDevice), "H2D v") ||
        !cuda_ok(cudaMalloc((void **)&dcent, (size_t)BH * k * D * 4), "cudaMalloc centroids") ||
        !cuda_ok(cudaMalloc((void **)&dperm, (size_t)BH * N * 4), "cudaMalloc perm"))
        goto out;
    qvc_view view;
    view.data = dv;
    view.dtype = (int)dt;
    view.B = B, view.H = H, view.N = N, view.D = D;
    view.sb = t.stride[0], view.sh = t.stride[1], view.sn = t.stride[2];
    view.hg = 1;

    /* Round 0 cold, round 1 warm from round 0's centroids. */
    for (int round = 0; round < 2; ++round) {
        const int warm = round == 1;
        for (int bh = 0; bh < BH; ++bh) {
            qvi_kmeans(v + (size_t)bh * N * D, N, D, k, iters, warm, cent_c + (size_t)bh * k * D,
                       labels);
            qvi_stable_argsort_labels(labels, N, k, perm_c + (size_t)bh * N);
        }
        if (warm && !cuda_ok(cudaMemcpy(dcent, cent_g, (size_t)BH * k * D * 4, cudaMemcpyHostToDevice),
                             "H2D centroids"))
            break;
        cuda_ok(cudaMemset(dperm, 0xFF, (size_t)BH * N * 4), "poison perm");
        qva_status s = qvc_kmeans_perm(&view, k, iters, warm, dcent, dperm, st);
        CHECK(s == QVA_OK, "[%s] qvc_kmeans_perm: %s", tag, qva_last_error());
        if (s != QVA_OK || !cuda_ok(cudaStreamSynchronize(st), "kmeans sync") ||
            !cuda_ok(cudaMemcpy(perm_g, dperm, (size_t)BH * N * 4, cudaMemcpyDeviceToHost), "D2H perm") ||
            !cuda_ok(cudaMemcpy(cent_g, dcent, (size_t)BH * k * D * 4, cudaMemcpyDeviceToHost), "D2H cent"))
            break;
        for (int bh = 0; bh < BH; ++bh) {
            long bad = 0;
            for (int i = 0; i < N; ++i) {
                int32_t a = perm_g[(size_t)bh * N + i], b = perm_c[(size_t)bh * N + i];
                if (a == b) continue;
                if (bad < 8)
                    fprintf(stderr, "  [%s%s] perm bh %d pos %d: gpu %d cpu %d\n", tag,
                            warm ? " warm" : "", bh, i, a, b);
                ++bad;
            }
            CHECK(bad == 0, "[%s%s] bh %d: permutations differ at %ld of %d positions", tag,
                  warm ? " warm" : "", bh, bad, N);
            long bc = cmp_floats("centroid", tag, bh, cent_g + (size_t)bh * k * D,
                                 cent_c + (size_t)bh * k * D, k * D);
            CHECK(bc == 0, "[%s%s] bh %d: %ld centroid values differ", tag, warm ? " warm" : "",
                  bh, bc);
        }
    }
out:
    free(q), free(kk), free(v), free(cent_c), free(cent_g), free(labels), free(perm_c),
        free(perm_g), free(hbuf);
    if (dv) cudaFree(dv);
    if (dcent) cudaFree(dcent);
    if (dperm) cudaFree(dperm);
}

static void kmeans_case(const char *preset, qva_dtype dt, int nhd, int discrete, int spice,
                        int k, int iters, cudaStream_t st) {
    kmeans_case_d(preset, 0, dt, nhd, discrete, spice, k, iters, st);
}

static void test_kmeans(cudaStream_t st) {
    kmeans_case("small", QVA_F32, 0, 0, 0, 16, 2, st);
    kmeans_case("small", QVA_F32, 0, 0, 1, 16, 2, st);
    kmeans_case("small", QVA_F32, 0, 0, 0, 8, 5, st);
    kmeans_case("small", QVA_BF16, 1, 0, 0, 16, 3, st);
    kmeans_case("small", QVA_F32, 1, 0, 1, 37, 4, st);
    kmeans_case("small", QVA_F32, 0, 0, 0, 16, 0, st); /* init + one assignment */
    kmeans_case("small", QVA_F32, 0, 1, 0, 16, 2, st); /* many exact ties */
    /* bf16 with k <= 32: the tensor-core assignment (kmeans_tc.cu), its
     * certificate failing on exact ties (discrete), subnormal squares (tiny
     * values) and overflowing sums (huge values) */
    kmeans_case("small", QVA_BF16, 0, 0, 0, 32, 2, st);
    kmeans_case("small", QVA_BF16, 0, 1, 0, 32, 2, st);
    kmeans_case("small", QVA_BF16, 1, 0, 1, 32, 2, st);
    kmeans_case("small", QVA_BF16, 0, 0, 2, 32, 2, st);
    kmeans_case("wan-small", QVA_BF16, 1, 0, 0, 32, 3, st);
    kmeans_case("tiny", QVA_BF16, 0, 0, 0, 1, 2, st); /* k = 1 */
    kmeans_case("tiny", QVA_F32, 0, 0, 0, 16, 3, st);
    kmeans_case("tiny", QVA_BF16, 0, 1, 0, 12, 3, st);
    kmeans_case("tiny", QVA_BF16, 0, 0, 0, 200, 2, st); /* k > N: duplicate centroids */
    kmeans_case("tiny", QVA_F32, 0, 0, 0, 300, 2, st);  /* centroids do not fit in shared memory */
    kmeans_case("tiny", QVA_BF16, 0, 0, 0, 260, 2, st); /* past the chunked sort's k: serial sort */
    /* D = 80: a last chunk of 16 channels (vector loads, then zeros);
     * D = 60: rows of 60 elements, so no vector loads at all */
    kmeans_case_d("small", 80, QVA_BF16, 1, 0, 0, 16, 2, st);
    kmeans_case_d("small", 80, QVA_F32, 0, 0, 1, 24, 2, st);
    kmeans_case_d("small", 60, QVA_BF16, 0, 1, 0, 16, 2, st);
    kmeans_case_d("small", 60, QVA_F32, 1, 0, 0, 33, 3, st);
}

/* ------------------------------------------------------------ main */

int main(void) {
    if (!qva_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return 77; /* CTest's SKIP_RETURN_CODE: reported as skipped */
    }
    cudaStream_t st;
    if (!cuda_ok(cudaStreamCreate(&st), "cudaStreamCreate")) return check_summary("cuda_test_ops");
    CHECK(qvc_fork_ensure(&g_fork) == QVA_OK, "side streams: %s", qva_last_error());
    test_prep(st);
    test_prep4(st);
    test_kmeans(st);
    qvc_fork_free(&g_fork);
    cudaStreamDestroy(st);
    return check_summary("cuda_test_ops");
}
