/*
 * Seeded SYNTHETIC video-DiT attention workload.
 *
 * The real models (Wan2.2, LongCat-Video, HunyuanVideo) cannot be
 * downloaded here, so this generator stands in for their captured post-RoPE
 * Q, K, V.  It is not a model: it reproduces, with documented parameters,
 * the statistical phenomena the two papers build on (VC-Attention §3.1,
 * DraftAttention2 §3.1) and nothing more.  docs/SYNTHETIC.md describes each
 * parameter and what the generator does not capture.
 *
 * Determinism: the output depends only on the spec.  Random numbers and
 * the elementary functions come from det_math.h, which no libm can change.
 * Fusing a*b+c into an FMA would change bits, so contraction is switched
 * off for this file below (GCC's gnu11 mode and Clang contract by default
 * when the target has FMA).  The named specs are presets.c's.
 */
#include "internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stdlib.h>
#include <string.h>

#include "det_math.h"

#ifdef _OPENMP
#define SYN_OMP(x) _Pragma(x)
#else
#define SYN_OMP(x)
#endif

/* ------------------------------------------------------------ parameters */
/* The workload's parameters, in one place (docs/SYNTHETIC.md). */
typedef struct syn_params {
    int rff;              /* random Fourier features of the smooth field   */
    double len_t;         /* correlation length along time (frames)        */
    double len_hw;        /* correlation length along height/width (tokens)*/
    double qk_gain;       /* std of the smooth Q/K content per channel      */
    double qk_share;      /* correlation of K's feature mixing with Q's    */
    double qk_noise;      /* white-noise std of Q/K per channel             */
    double q_mean;        /* std of Q's common (all-token) component        */
    double k_bias;        /* std of K's common component, slow pairs        */
    double k_bias_fast;   /* its weight on fast-rotating pairs              */
    int outliers;         /* Q/K outlier channels per head                  */
    double out_q, out_k;  /* their common offset in Q and in K              */
    double out_gain;      /* gain on Q's token variation in those channels  */
    int v_groups;         /* G: value prototypes per head                   */
    int v_cell;           /* side of the coarse cells that pick prototypes  */
    double v_speed;       /* max motion of the cells, tokens per frame      */
    double layer_t;       /* std of the layer waves' frequency along t      */
    double layer_hw;      /* ... along y and x (radians per token)          */
    double v_proto;       /* prototype std per channel                      */
    double v_smooth;      /* smooth-field std added to V                    */
    double v_noise;       /* white-noise std of V                           */
    double v_mean;        /* std of V's common component                    */
    double v_out_frac;    /* fraction of video tokens with spikes          */
    int v_spikes;         /* spike channels per head                        */
    double v_spike;       /* spike magnitude                                */
    double pre_qk, pre_v; /* prefix token std (Q/K and V)                   */
    double rope_base;     /* RoPE frequency base                            */
    /* global heads (QVA_SYN_GLOBAL, family A) */
    int lat_rank;         /* rank of the per-token latent content           */
    double lat_gain;      /* its gain in Q and K (sets the logit scale)     */
    double q_row_sd;      /* std of ln(query row scale)                     */
    double q_hot_frac;    /* fraction of tokens with an outlier query row   */
    double q_hot;         /* their extra row scale                          */
    /* local heads with object-clustered values (QVA_SYN_LOCAL_CLUSTERED) */
    int objects;          /* moving objects per head                        */
    double obj_rmin, obj_rmax; /* ellipse radii, fraction of the grid side  */
    double horizon_lo, horizon_hi; /* background split row, fraction of H   */
    double obj_noise;     /* white-noise std of V inside a region           */
} syn_params;

static const syn_params SYN = {
    .rff = 48, .len_t = 1.5, .len_hw = 3.0,
    .qk_gain = 1.0, .qk_share = 0.9, .qk_noise = 0.3,
    .q_mean = 0.25, .k_bias = 3.5, .k_bias_fast = 0.1,
    .outliers = 3, .out_q = 2.5, .out_k = 6.0, .out_gain = 2.5,
    .v_groups = 16, .v_cell = 4, .v_speed = 0.5,
    .layer_t = 0.3, .layer_hw = 0.25,
    .v_proto = 1.0, .v_smooth = 0.5, .v_noise = 1.1, .v_mean = 0.15,
    .v_out_frac = 0.0075, .v_spikes = 3, .v_spike = 16.0,
    .pre_qk = 1.5, .pre_v = 1.5,
    .rope_base = 10000.0,
    .lat_rank = 16, .lat_gain = 0.6, .q_row_sd = 0.5,
    .q_hot_frac = 0.005, .q_hot = 6.0,
    .objects = 6, .obj_rmin = 0.12, .obj_rmax = 0.3,
    .horizon_lo = 0.3, .horizon_hi = 0.7, .obj_noise = 0.5,
};

/* ------------------------------------------------------------ geometry */
typedef struct syn_geom {
    int B, H, D, T, Y, X, P; /* batch, heads, dim, grid, prefix tokens  */
    int64_t N;               /* P + T*Y*X                               */
    int pairs, pt, ph;       /* rotary pairs: total, time, height        */
    double *freq;            /* pairs: angular frequency of each pair    */
    int *axis;               /* pairs: 0 time, 1 height, 2 width         */
    double *max_angle;       /* pairs: largest rotation over the grid    */
    int *slow_order;         /* pairs sorted by max_angle, stable        */
    double *rc, *rs;         /* [axis extent][pairs] cos/sin tables      */
} syn_geom;

/*
 * RoPE split of Wan: height and width get 2*floor(D/6) channels each and
 * time the rest (D=128: 44/42/42 channels = 22/21/21 pairs).  Pairs are
 * adjacent channels (2p, 2p+1); within an axis group of g channels, local
 * pair j turns at base^(-2j/g) radians per position.
 */
static void rope_split(int D, int *pt, int *ph) {
    int hw = 2 * (D / 6);
    *ph = hw / 2;
    *pt = (D - 2 * hw) / 2;
}

static void geom_free(syn_geom *g) {
    free(g->freq);
    free(g->axis);
    free(g->max_angle);
    free(g->slow_order);
    free(g->rc);
    free(g->rs);
}

/* Insertion sort of the pairs by max_angle (stable: ties keep pair order). */
static void sort_slow(syn_geom *g) {
    for (int p = 0; p < g->pairs; ++p) {
        int j = p;
        while (j > 0 && g->max_angle[g->slow_order[j - 1]] > g->max_angle[p]) {
            g->slow_order[j] = g->slow_order[j - 1];
            --j;
        }
        g->slow_order[j] = p;
    }
}

static qva_status geom_init(const qva_synthetic_spec *sp, syn_geom *g) {
    memset(g, 0, sizeof *g);
    g->B = sp->B; g->H = sp->H; g->D = sp->D;
    g->T = sp->grid_t; g->Y = sp->grid_h; g->X = sp->grid_w;
    g->P = sp->prefix_tokens;
    g->N = (int64_t)g->P + (int64_t)g->T * g->Y * g->X;
    g->pairs = g->D / 2;
    rope_split(g->D, &g->pt, &g->ph);
    int extent = g->T > g->Y ? g->T : g->Y;
    extent = extent > g->X ? extent : g->X;
    g->freq = malloc(sizeof(double) * (size_t)g->pairs);
    g->axis = malloc(sizeof(int) * (size_t)g->pairs);
    g->max_angle = malloc(sizeof(double) * (size_t)g->pairs);
    g->slow_order = malloc(sizeof(int) * (size_t)g->pairs);
    g->rc = malloc(sizeof(double) * (size_t)extent * (size_t)g->pairs);
    g->rs = malloc(sizeof(double) * (size_t)extent * (size_t)g->pairs);
    if (!g->freq || !g->axis || !g->max_angle || !g->slow_order || !g->rc ||
        !g->rs) {
        geom_free(g);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "synthetic: rope tables");
    }
    const int len[3] = {g->T, g->Y, g->X};
    for (int p = 0; p < g->pairs; ++p) {
        int ax = p < g->pt ? 0 : (p < g->pt + g->ph ? 1 : 2);
        int j = ax == 0 ? p : (ax == 1 ? p - g->pt : p - g->pt - g->ph);
        int ch = 2 * (ax == 0 ? g->pt : g->ph); /* channels in the group */
        g->axis[p] = ax;
        g->freq[p] = det_exp(-(2.0 * j / ch) * det_log(SYN.rope_base));
        g->max_angle[p] = g->freq[p] * (double)(len[ax] - 1);
        for (int pos = 0; pos < extent; ++pos)
            det_sincos(g->freq[p] * pos, &g->rs[(size_t)pos * g->pairs + p],
                       &g->rc[(size_t)pos * g->pairs + p]);
    }
    sort_slow(g);
    return QVA_OK;
}

/* Rotates the pairs of x[D] by the RoPE angles of grid position (t,y,x). */
static void apply_rope(const syn_geom *g, int t, int y, int x, float *row) {
    const int pos3[3] = {t, y, x};
    for (int p = 0; p < g->pairs; ++p) {
        size_t at = (size_t)pos3[g->axis[p]] * g->pairs + p;
        double c = g->rc[at], s = g->rs[at];
        double a = row[2 * p], b = row[2 * p + 1];
        row[2 * p] = (float)(a * c - b * s);
        row[2 * p + 1] = (float)(a * s + b * c);
    }
}

/* ------------------------------------------------------------ one head */
/*
 * Per-head parameters.  The smooth field is a random Fourier feature map
 * f(p) = sqrt(2/L) cos(w_l . p + phi_l) with Gaussian w, so f(p).f(p') is
 * close to a Gaussian kernel of the grid distance: Q and K built from it
 * make nearby tokens score high against each other (local attention).
 */
typedef struct syn_head {
    int L, D, G;
    double *wt, *wy, *wx, *phi; /* L frequencies per axis, phases         */
    float *aq, *ak, *av;        /* [L][D] feature mixing of Q, K, V       */
    float *q_mean, *k_bias, *v_mean; /* D common components             */
    float *q_out, *k_out, *gain; /* D outlier offsets / gains           */
    float *proto;               /* [G][D] value prototypes                 */
    float *pre_kb, *pre_vm;     /* D prefix key bias / value mean          */
    int spike_ch[8];            /* value spike channels (at most 8)        */
    float spike_sign[8];
    double vel_y, vel_x;        /* motion of the prototype cells           */
    double sw[2][3], sphi[2];   /* two low-frequency waves choosing layers */
    uint64_t key;               /* hash key of the head                    */
    /* local clustered heads: object ellipses {y0, x0, vy, vx, ry, rx} at
     * t = 0, drawn in order (later on top), and the background split row */
    double obj[8][6];
    int n_obj;
    double horizon;
} syn_head;

static void head_free(syn_head *h) {
    free(h->wt);
    free(h->aq);
    free(h->q_mean);
    free(h->proto);
}

/* One allocation per element type keeps the cleanup short. */
static int head_alloc(syn_head *h, int L, int D, int G) {
    memset(h, 0, sizeof *h);
    h->L = L; h->D = D; h->G = G;
    h->wt = malloc(sizeof(double) * 4 * (size_t)L);
    h->aq = malloc(sizeof(float) * 3 * (size_t)L * D);
    h->q_mean = malloc(sizeof(float) * 8 * (size_t)D);
    h->proto = malloc(sizeof(float) * (size_t)G * D);
    if (!h->wt || !h->aq || !h->q_mean || !h->proto) {
        head_free(h);
        return 0;
    }
    h->wy = h->wt + L; h->wx = h->wy + L; h->phi = h->wx + L;
    h->ak = h->aq + (size_t)L * D; h->av = h->ak + (size_t)L * D;
    h->k_bias = h->q_mean + D; h->v_mean = h->k_bias + D;
    h->q_out = h->v_mean + D; h->k_out = h->q_out + D;
    h->gain = h->k_out + D; h->pre_kb = h->gain + D;
    h->pre_vm = h->pre_kb + D;
    return 1;
}

static void fill_normal(syn_rng *r, float *x, size_t n, double std) {
    for (size_t i = 0; i < n; ++i) x[i] = (float)(std * rng_normal(r));
}

/* Smooth-field frequencies and the Q/K/V mixing (content scale folded in:
 * a channel of A f has variance ~1, times the gain). */
static void head_field(syn_head *h, syn_rng *r, double qk_gain) {
    const int L = h->L, D = h->D;
    for (int l = 0; l < L; ++l) {
        h->wt[l] = rng_normal(r) / SYN.len_t;
        h->wy[l] = rng_normal(r) / SYN.len_hw;
        h->wx[l] = rng_normal(r) / SYN.len_hw;
        h->phi[l] = TWO_PI * rng_uniform(r);
    }
    double rho = SYN.qk_share, orth = sqrt(1.0 - rho * rho);
    for (size_t i = 0; i < (size_t)L * D; ++i) {
        double a = rng_normal(r), b = rng_normal(r);
        h->aq[i] = (float)(qk_gain * a);
        h->ak[i] = (float)(qk_gain * (rho * a + orth * b));
        h->av[i] = (float)(SYN.v_smooth * rng_normal(r));
    }
}

/*
 * Common components.  K's bias sits mostly on pairs RoPE barely turns over
 * the grid, so it stays a channel mean after RoPE (SageAttention's K
 * smoothing removes it); the outlier channels are drawn from the slowest
 * quarter of the pairs for the same reason.
 */
static void head_common(syn_head *h, syn_rng *r, const syn_geom *g) {
    const int D = h->D;
    for (int c = 0; c < D; ++c) {
        double slow = g->max_angle[c / 2] < 1.0 ? 1.0 : SYN.k_bias_fast;
        h->q_mean[c] = (float)(SYN.q_mean * rng_normal(r));
        h->k_bias[c] = (float)(SYN.k_bias * slow * rng_normal(r));
        h->v_mean[c] = (float)(SYN.v_mean * rng_normal(r));
        h->pre_kb[c] = (float)(0.5 * h->k_bias[c] + rng_normal(r));
        h->pre_vm[c] = (float)(0.5 * rng_normal(r));
        h->q_out[c] = h->k_out[c] = 0.0f;
        h->gain[c] = 1.0f;
    }
    /* outliers on distinct pairs among the slowest quarter */
    int pairs = g->pairs, n_out = SYN.outliers, taken[8];
    int cand = pairs / 4 > n_out ? pairs / 4 : n_out;
    if (cand > pairs) cand = pairs;
    if (n_out > cand) n_out = cand;
    if (n_out > 8) n_out = 8;
    for (int k = 0; k < n_out; ++k) {
        int rank, dup;
        do {
            rank = (int)(rng_uniform(r) * cand);
            dup = 0;
            for (int j = 0; j < k; ++j) dup |= taken[j] == rank;
        } while (dup);
        taken[k] = rank;
        int c = 2 * g->slow_order[rank] + (rng_uniform(r) < 0.5 ? 0 : 1);
        double sgn = rng_uniform(r) < 0.5 ? -1.0 : 1.0;
        h->q_out[c] = (float)(sgn * SYN.out_q);
        h->k_out[c] = (float)(sgn * SYN.out_k);
        h->gain[c] = (float)SYN.out_gain;
    }
}

static int spike_count(int D) {
    int n = SYN.v_spikes < D ? SYN.v_spikes : D;
    return n < 8 ? n : 8;
}

/* Value prototypes, spike channels, cell motion and the layer waves. */
static void head_values(syn_head *h, syn_rng *r) {
    const int D = h->D;
    fill_normal(r, h->proto, (size_t)h->G * D, SYN.v_proto);
    for (int k = 0; k < spike_count(D); ++k) {
        int c, dup;
        do { /* distinct channels; the head's stream decides which */
            c = (int)(rng_uniform(r) * D);
            dup = 0;
            for (int j = 0; j < k; ++j) dup |= h->spike_ch[j] == c;
        } while (dup);
        h->spike_ch[k] = c;
        h->spike_sign[k] = rng_uniform(r) < 0.5 ? -1.0f : 1.0f;
    }
    h->vel_y = SYN.v_speed * (2.0 * rng_uniform(r) - 1.0);
    h->vel_x = SYN.v_speed * (2.0 * rng_uniform(r) - 1.0);
    for (int w = 0; w < 2; ++w) {
        h->sw[w][0] = SYN.layer_t * rng_normal(r);
        h->sw[w][1] = SYN.layer_hw * rng_normal(r);
        h->sw[w][2] = SYN.layer_hw * rng_normal(r);
        h->sphi[w] = TWO_PI * rng_uniform(r);
    }
}

/* ------------------------------------------------------------ tokens */
/* Scratch for one token: feature values and per-axis phasors. */
typedef struct syn_scratch {
    double *f;          /* L feature values                              */
    double *ct, *st;    /* [T][L] cos/sin of w_t * t                     */
    double *cy, *sy;    /* [Y][L]                                        */
    double *cx, *sx;    /* [X][L] (phase phi folded in)                  */
    float *acc;         /* D accumulator                                 */
    double *noise;      /* D normals                                     */
} syn_scratch;

/* Per-axis phasor tables of the head's features: the token's feature is
 * then a product of three complex numbers instead of a cosine. */
static void scratch_tables(syn_scratch *s, const syn_head *h,
                           const syn_geom *g) {
    const int L = h->L;
    for (int t = 0; t < g->T; ++t)
        for (int l = 0; l < L; ++l)
            det_sincos(h->wt[l] * t, &s->st[t * L + l], &s->ct[t * L + l]);
    for (int y = 0; y < g->Y; ++y)
        for (int l = 0; l < L; ++l)
            det_sincos(h->wy[l] * y, &s->sy[y * L + l], &s->cy[y * L + l]);
    for (int x = 0; x < g->X; ++x)
        for (int l = 0; l < L; ++l)
            det_sincos(h->wx[l] * x + h->phi[l], &s->sx[x * L + l],
                       &s->cx[x * L + l]);
}

/* f_l(p) = sqrt(2/L) cos(w_t t + w_y y + w_x x + phi). */
static void token_features(syn_scratch *s, int L, int t, int y, int x) {
    double norm = sqrt(2.0 / L);
    for (int l = 0; l < L; ++l) {
        double ar = s->ct[t * L + l], ai = s->st[t * L + l];
        double br = s->cy[y * L + l], bi = s->sy[y * L + l];
        double abr = ar * br - ai * bi, abi = ar * bi + ai * br;
        double cr = s->cx[x * L + l], ci = s->sx[x * L + l];
        s->f[l] = norm * (abr * cr - abi * ci);
    }
}

/* out[c] = sum_l f_l A[l][c]; loop order keeps each channel's sum in l
 * order so vectorising across channels does not change the result. */
static void mix(const syn_scratch *s, const float *A, int L, int D,
                float *acc) {
    enum { CHUNK = 16 }; /* a chunk of sums stays in registers over l */
    int c0 = 0;
    for (; c0 + CHUNK <= D; c0 += CHUNK) {
        float part[CHUNK] = {0};
        for (int l = 0; l < L; ++l) {
            const float *a = A + (size_t)l * D + c0;
            float fl = (float)s->f[l];
            for (int j = 0; j < CHUNK; ++j) part[j] += fl * a[j];
        }
        memcpy(acc + c0, part, sizeof part);
    }
    for (int c = c0; c < D; ++c) {
        float sum = 0.0f;
        for (int l = 0; l < L; ++l) sum += (float)s->f[l] * A[(size_t)l * D + c];
        acc[c] = sum;
    }
}

/* Q and K rows of one video token, before RoPE. */
static void video_qk(const syn_head *h, syn_scratch *s, syn_rng *rq,
                     syn_rng *rk, float *q, float *k) {
    const int D = h->D;
    mix(s, h->aq, h->L, D, s->acc);
    normal_row(rq, s->noise, D);
    for (int c = 0; c < D; ++c) {
        double var = s->acc[c] + SYN.qk_noise * s->noise[c];
        q[c] = (float)(h->gain[c] * var + h->q_mean[c] + h->q_out[c]);
    }
    mix(s, h->ak, h->L, D, s->acc);
    normal_row(rk, s->noise, D);
    for (int c = 0; c < D; ++c) {
        double var = s->acc[c] + SYN.qk_noise * s->noise[c];
        k[c] = (float)(var + h->k_bias[c] + h->k_out[c]);
    }
}

/*
 * Which prototype a video token carries.  Two label layers of coarse
 * cells v_cell tokens on a side, each cell's label hashed: one layer moves
 * with the head's velocity (objects), the other is static (background); a
 * smooth low-frequency wave picks the layer.  Label regions are spatially
 * coherent, but a 128-token block in raster order crosses many cells, so
 * tokens of one prototype are scattered through the sequence.
 */
static int token_proto(const syn_head *h, int t, int y, int x) {
    double wave = 0.0;
    for (int w = 0; w < 2; ++w) {
        double s, c;
        det_sincos(h->sw[w][0] * t + h->sw[w][1] * y + h->sw[w][2] * x +
                       h->sphi[w], &s, &c);
        wave += c;
    }
    int cell = SYN.v_cell;
    uint64_t key;
    if (wave >= 0.0) {
        int64_t cy = (int64_t)floor((y + h->vel_y * t) / cell);
        int64_t cx = (int64_t)floor((x + h->vel_x * t) / cell);
        key = hash2(h->key ^ 0xA1, (uint64_t)(cy * 65537 + cx));
    } else { /* static cells, offset by half a cell from the grid */
        int64_t cy = (y + cell / 2) / cell, cx = (x + cell / 2) / cell;
        key = hash2(h->key ^ 0xB2, (uint64_t)(cy * 65537 + cx));
    }
    return (int)(key % (uint64_t)h->G);
}

/* Value outlier tokens: position hashed per head, channels fixed per head
 * (VC §3.1: a few tokens, in channels that shift across heads). */
static void add_spikes(const syn_head *h, int64_t tok, float *v) {
    uint64_t u = hash2(h->key ^ 0x5B1CE, (uint64_t)tok);
    if ((double)(u >> 11) * 0x1p-53 < SYN.v_out_frac) {
        double jitter = 1.0 + 0.25 * ((double)(u & 0xFF) / 255.0);
        for (int k = 0; k < spike_count(h->D); ++k)
            v[h->spike_ch[k]] += (float)(h->spike_sign[k] * SYN.v_spike *
                                         jitter);
    }
}

/* V row of one video token: prototype + smooth field + noise (+ spikes). */
static void video_v(const syn_head *h, syn_scratch *s, syn_rng *rv,
                    int64_t tok, int t, int y, int x, float *v) {
    const int D = h->D;
    const float *pr = h->proto + (size_t)token_proto(h, t, y, x) * D;
    mix(s, h->av, h->L, D, s->acc);
    normal_row(rv, s->noise, D);
    for (int c = 0; c < D; ++c)
        v[c] = (float)(pr[c] + s->acc[c] + h->v_mean[c] +
                       SYN.v_noise * s->noise[c]);
    add_spikes(h, tok, v);
}

/* Text prefix token: independent Gaussian rows with their own scale and
 * means; no RoPE (HunyuanVideo rotates only the video tokens). */
static void prefix_row(const syn_head *h, syn_scratch *s, syn_rng *rq,
                       syn_rng *rk, syn_rng *rv, float *q, float *k,
                       float *v) {
    const int D = h->D;
    normal_row(rq, s->noise, D);
    for (int c = 0; c < D; ++c) q[c] = (float)(SYN.pre_qk * s->noise[c]);
    normal_row(rk, s->noise, D);
    for (int c = 0; c < D; ++c)
        k[c] = (float)(SYN.pre_qk * s->noise[c] + h->pre_kb[c]);
    normal_row(rv, s->noise, D);
    for (int c = 0; c < D; ++c)
        v[c] = (float)(SYN.pre_v * s->noise[c] + h->pre_vm[c]);
}

/* ------------------------------------------------------------ recipes */
/*
 * Issue 15's two situations.  Captured video-DiT tensors showed two
 * families: (A) global, diffuse heads whose values do not cluster and whose
 * query rows differ a lot in magnitude inside a 128-token block, where the
 * per-block Q scale was the largest error term; (B) local heads whose
 * values cluster by object, where V-Smooth pays.  A GLOBAL head models A,
 * a LOCAL_CLUSTERED head B; the VIDEO recipe is the original workload.
 */
enum { HEAD_VIDEO, HEAD_GLOBAL, HEAD_LOCAL };

/* MIXED alternates by head index (not b*H + h), so a head keeps its kind
 * across the batch. */
static int head_kind(int recipe, int head) {
    switch (recipe) {
    case QVA_SYN_GLOBAL: return HEAD_GLOBAL;
    case QVA_SYN_LOCAL_CLUSTERED: return HEAD_LOCAL;
    case QVA_SYN_MIXED: return head % 2 ? HEAD_LOCAL : HEAD_GLOBAL;
    default: return HEAD_VIDEO;
    }
}

/* Uniform in [lo, hi): one draw per call, so the order of draws is fixed
 * by the statements (two draws in one expression would be unsequenced). */
static double rng_range(syn_rng *r, double lo, double hi) {
    return lo + (hi - lo) * rng_uniform(r);
}

/* Objects of a local clustered head: ellipses with random centres, sizes
 * and straight-line motion (spatially coherent, moving like VIDEO's
 * cells), over two background regions split at a horizon row.  Region j's
 * value centroid is prototype j, so objects + 2 <= v_groups. */
static void head_objects(syn_head *h, syn_rng *r, const syn_geom *g) {
    h->n_obj = SYN.objects < 8 ? SYN.objects : 8;
    for (int o = 0; o < h->n_obj; ++o) {
        double *e = h->obj[o];
        e[0] = rng_range(r, 0.0, g->Y);
        e[1] = rng_range(r, 0.0, g->X);
        e[2] = rng_range(r, -SYN.v_speed, SYN.v_speed);
        e[3] = rng_range(r, -SYN.v_speed, SYN.v_speed);
        e[4] = g->Y * rng_range(r, SYN.obj_rmin, SYN.obj_rmax);
        e[5] = g->X * rng_range(r, SYN.obj_rmin, SYN.obj_rmax);
        e[4] = e[4] < 1.0 ? 1.0 : e[4]; /* at least a token across */
        e[5] = e[5] < 1.0 ? 1.0 : e[5];
    }
    h->horizon = g->Y * rng_range(r, SYN.horizon_lo, SYN.horizon_hi);
}

/* Region of a token: the last-drawn object that covers it, else the
 * background above or below the horizon. */
static int token_region(const syn_head *h, int t, int y, int x) {
    for (int o = h->n_obj - 1; o >= 0; --o) {
        const double *e = h->obj[o];
        double dy = (y - (e[0] + e[2] * t)) / e[4];
        double dx = (x - (e[1] + e[3] * t)) / e[5];
        if (dy * dy + dx * dx <= 1.0) return o;
    }
    return h->n_obj + (y >= h->horizon);
}

/* V of a local clustered head: region centroid + smooth texture + noise
 * tighter than VIDEO's, so tokens of one object are alike wherever the
 * raster order puts them. */
static void object_v(const syn_head *h, syn_scratch *s, syn_rng *rv,
                     int64_t tok, int t, int y, int x, float *v) {
    const int D = h->D;
    const float *pr = h->proto + (size_t)token_region(h, t, y, x) * D;
    mix(s, h->av, h->L, D, s->acc);
    normal_row(rv, s->noise, D);
    for (int c = 0; c < D; ++c)
        v[c] = (float)(pr[c] + s->acc[c] + h->v_mean[c] +
                       SYN.obj_noise * s->noise[c]);
    add_spikes(h, tok, v);
}

/* Rank of a global head's latent: even (normal_row draws pairs) and two
 * below L, since the two normals after it come from the same draw. */
static int latent_rank(const syn_head *h) {
    int r = SYN.lat_rank < h->L - 2 ? SYN.lat_rank : h->L - 2;
    return r - r % 2;
}

/*
 * Content of a global-head token: a latent of iid normals with no spatial
 * structure (so a query meets keys of similar content anywhere in the
 * video), scaled to f.f ~ 1 like the Fourier features.  Returns the query
 * row's scale: log-normal per token, times q_hot on a few hashed tokens,
 * so row magnitudes vary strongly inside every 128-token block.
 */
static double token_latent(const syn_head *h, syn_scratch *s, syn_rng *rz,
                           int64_t tok) {
    const int r = latent_rank(h);
    normal_row(rz, s->f, r + 2);
    double scale = det_exp(SYN.q_row_sd * s->f[r]);
    uint64_t u = hash2(h->key ^ 0x0A7E5, (uint64_t)tok);
    if ((double)(u >> 11) * 0x1p-53 < SYN.q_hot_frac) scale *= SYN.q_hot;
    double unit = 1.0 / sqrt((double)r);
    for (int l = 0; l < r; ++l) s->f[l] *= unit;
    return scale;
}

/* V of a global head: the token's latent content, noise and the common
 * mean, with no prototypes: nothing for k-means to gather but the
 * Gaussian's own spread. */
static void global_v(const syn_head *h, syn_scratch *s, syn_rng *rv,
                     int64_t tok, float *v) {
    const int D = h->D;
    mix(s, h->av, latent_rank(h), D, s->acc);
    normal_row(rv, s->noise, D);
    for (int c = 0; c < D; ++c)
        v[c] = (float)(s->acc[c] + h->v_mean[c] + SYN.v_noise * s->noise[c]);
    add_spikes(h, tok, v);
}

/* Q and K of a global head, before RoPE.  The latent gain sets a diffuse
 * logit scale; the outlier channels' gain applies to K too (channel
 * outliers that K smoothing does not remove); the row scale multiplies
 * the whole query row. */
static void global_qk(const syn_head *h, syn_scratch *s, syn_rng *rq,
                      syn_rng *rk, double scale, float *q, float *k) {
    const int D = h->D, r = latent_rank(h);
    for (int l = 0; l < r; ++l) s->f[l] *= SYN.lat_gain;
    mix(s, h->aq, r, D, s->acc);
    normal_row(rq, s->noise, D);
    for (int c = 0; c < D; ++c) {
        double var = s->acc[c] + SYN.qk_noise * s->noise[c];
        q[c] = (float)(scale *
                       (h->gain[c] * var + h->q_mean[c] + h->q_out[c]));
    }
    mix(s, h->ak, r, D, s->acc);
    normal_row(rk, s->noise, D);
    for (int c = 0; c < D; ++c) {
        double var = s->acc[c] + SYN.qk_noise * s->noise[c];
        k[c] = (float)(h->gain[c] * var + h->k_bias[c] + h->k_out[c]);
    }
}

static int scratch_alloc(syn_scratch *s, const syn_geom *g, int L) {
    size_t n = (size_t)L * (1 + 2 * ((size_t)g->T + g->Y + g->X)) + 2 * g->D;
    s->f = malloc(sizeof(double) * n);
    if (!s->f) return 0;
    s->ct = s->f + L;
    s->st = s->ct + (size_t)g->T * L;
    s->cy = s->st + (size_t)g->T * L;
    s->sy = s->cy + (size_t)g->Y * L;
    s->cx = s->sy + (size_t)g->Y * L;
    s->sx = s->cx + (size_t)g->X * L;
    s->noise = s->sx + (size_t)g->X * L;
    s->acc = (float *)(s->noise + g->D); /* D floats fit in D doubles */
    return 1;
}

/* The random streams of one head. */
typedef struct syn_streams {
    syn_rng par, q, k, v; /* the head's parameters; Q, K, V noise     */
    syn_rng z;            /* global heads: latent content, row scales */
} syn_streams;

/* Seeds: one key per (b, h) from the spec seed, then one stream for the
 * head's parameters and one per tensor, so heads are independent of the
 * order they are generated in.  z is drawn only by global heads, so the
 * VIDEO streams are those of the original generator. */
static void head_streams(uint64_t seed, int64_t bh, syn_head *h,
                         syn_streams *st) {
    h->key = hash2(seed, (uint64_t)bh + 1);
    rng_seed(&st->par, hash2(h->key, 1));
    rng_seed(&st->q, hash2(h->key, 2));
    rng_seed(&st->k, hash2(h->key, 3));
    rng_seed(&st->v, hash2(h->key, 4));
    rng_seed(&st->z, hash2(h->key, 5));
}

/* Everything one head's generation reads or writes. */
typedef struct syn_job {
    const syn_geom *g;
    syn_head *h;
    syn_scratch *s;
    syn_streams st;
    int kind;         /* HEAD_* */
    float *q, *k, *v; /* the head's [N][D] slices */
} syn_job;

/* One video token at grid position (t, y, x). */
static void gen_token(syn_job *j, int t, int y, int x) {
    const syn_geom *g = j->g;
    const int64_t i = g->P + ((int64_t)t * g->Y + y) * g->X + x;
    float *qi = j->q + i * g->D, *ki = j->k + i * g->D;
    float *vi = j->v + i * g->D;
    if (j->kind == HEAD_GLOBAL) {
        double scale = token_latent(j->h, j->s, &j->st.z, i);
        global_v(j->h, j->s, &j->st.v, i, vi);
        global_qk(j->h, j->s, &j->st.q, &j->st.k, scale, qi, ki);
    } else {
        token_features(j->s, j->h->L, t, y, x);
        video_qk(j->h, j->s, &j->st.q, &j->st.k, qi, ki);
        if (j->kind == HEAD_LOCAL)
            object_v(j->h, j->s, &j->st.v, i, t, y, x, vi);
        else
            video_v(j->h, j->s, &j->st.v, i, t, y, x, vi);
    }
    apply_rope(g, t, y, x, qi);
    apply_rope(g, t, y, x, ki);
}

/* The head's parameters: every kind draws the same ones from `par` (a
 * local clustered head adds its objects after), so a LOCAL head's Q and K
 * are those a VIDEO head with the same key would have. */
static void head_setup(syn_job *j, double qk_gain) {
    head_field(j->h, &j->st.par, qk_gain);
    head_common(j->h, &j->st.par, j->g);
    head_values(j->h, &j->st.par);
    if (j->kind == HEAD_LOCAL) head_objects(j->h, &j->st.par, j->g);
    scratch_tables(j->s, j->h, j->g);
}

static void gen_head(syn_job *j, uint64_t seed, int64_t bh, double qk_gain) {
    const syn_geom *g = j->g;
    const int D = g->D;
    head_streams(seed, bh, j->h, &j->st);
    head_setup(j, qk_gain);
    for (int64_t i = 0; i < g->P; ++i)
        prefix_row(j->h, j->s, &j->st.q, &j->st.k, &j->st.v, j->q + i * D,
                   j->k + i * D, j->v + i * D);
    for (int t = 0; t < g->T; ++t)
        for (int y = 0; y < g->Y; ++y)
            for (int x = 0; x < g->X; ++x) gen_token(j, t, y, x);
}

static qva_status check_spec(const qva_synthetic_spec *sp) {
    if (sp->B < 1 || sp->H < 1 || sp->grid_t < 1 || sp->grid_h < 1 ||
        sp->grid_w < 1 || sp->prefix_tokens < 0)
        return qvi_fail(QVA_ERR_SHAPE,
                        "synthetic spec '%.32s': B, H and the grid must be "
                        ">= 1 and prefix >= 0", sp->name);
    if (sp->D < 6 || sp->D % 2 || sp->D > 4096)
        return qvi_fail(QVA_ERR_SHAPE,
                        "synthetic spec '%.32s': D = %d must be even and in "
                        "[6, 4096] (three RoPE axis groups)", sp->name, sp->D);
    if (sp->grid_t > 100000 || sp->grid_h > 100000 || sp->grid_w > 100000)
        return qvi_fail(QVA_ERR_SHAPE, "synthetic spec: grid too large");
    double n = (double)sp->prefix_tokens +
               (double)sp->grid_t * sp->grid_h * sp->grid_w;
    double total = (double)sp->B * sp->H * n * sp->D;
    if (n > 2147483647.0 || total * sizeof(float) > (double)SIZE_MAX / 2)
        return qvi_fail(QVA_ERR_SHAPE, "synthetic spec: tensor too large");
    if (sp->recipe < QVA_SYN_VIDEO || sp->recipe > QVA_SYN_MIXED)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "synthetic spec '%.32s': unknown recipe %d",
                        sp->name, sp->recipe);
    return QVA_OK;
}

/* One head per iteration; under OpenMP the heads run in parallel, each
 * thread with its own parameters and scratch.  Heads draw from their own
 * streams, so the bytes do not depend on the thread count. */
static int gen_all(const syn_geom *g, const qva_synthetic_spec *sp,
                   double qk_gain, float *q, float *k, float *v) {
    const int64_t heads = (int64_t)g->B * g->H;
    const size_t head = (size_t)g->N * g->D;
    int failed = 0;
    SYN_OMP("omp parallel")
    {
        syn_head h;
        syn_scratch s;
        memset(&s, 0, sizeof s);
        int ok = head_alloc(&h, SYN.rff, g->D, SYN.v_groups);
        if (ok && !scratch_alloc(&s, g, SYN.rff)) {
            head_free(&h);
            ok = 0;
        }
        if (!ok) {
            SYN_OMP("omp atomic write")
            failed = 1;
        }
        SYN_OMP("omp for schedule(dynamic, 1)")
        for (int64_t bh = 0; bh < heads; ++bh) {
            if (!ok) continue;
            syn_job j = {.g = g, .h = &h, .s = &s,
                         .kind = head_kind(sp->recipe, (int)(bh % g->H)),
                         .q = q + bh * head, .k = k + bh * head,
                         .v = v + bh * head};
            gen_head(&j, sp->seed, bh, qk_gain);
        }
        if (ok) {
            free(s.f);
            head_free(&h);
        }
    }
    return !failed;
}

qva_status qva_synthetic_generate(const qva_synthetic_spec *spec, float *q,
                                  float *k, float *v) {
    if (!spec || !q || !k || !v)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_synthetic_generate: NULL argument");
    qva_status st = check_spec(spec);
    if (st != QVA_OK) return st;
    syn_geom g;
    if ((st = geom_init(spec, &g)) != QVA_OK) return st;
    /* keep the logit scale of D = 128 at other head dims: q.k/sqrt(D)
     * grows like sqrt(D) times the squared gain */
    double qk_gain = SYN.qk_gain * det_exp(0.25 * det_log(128.0 / g.D));
    int ok = gen_all(&g, spec, qk_gain, q, k, v);
    geom_free(&g);
    return ok ? QVA_OK
              : qvi_fail(QVA_ERR_OUT_OF_MEMORY, "synthetic: head scratch");
}
