/*
 * Ragged 2D partition of a video frame (DraftAttention2 C.2, Eq. 20-21),
 * token packing, and the per-context partition cache.
 *
 * Construction (docs/DRAFT.md §1): a candidate is a Hamiltonian path
 * through the frame that snakes through horizontal bands (or, transposed,
 * vertical bands); cutting the path into R_f runs of the balanced counts
 * gives connected regions because consecutive path cells are grid
 * neighbours.  Among all candidates the least total perimeter wins.
 */
#include "draft/partition.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ candidates */

/* Nearest integer to num/den (den > 0), ties to the lower one. */
static int nearest_quotient(int num, int den) {
    int q = num / den, r = num % den;
    return (2 * r > den) ? q + 1 : q;
}

/* Of the odd neighbours h-1, h+1 of an even h, the one nearer num/den
 * (ties to h-1). */
static int nearest_odd(int h, int num, int den) {
    long lo = labs((long)(h - 1) * den - num);
    long hi = labs((long)(h + 1) * den - num);
    return (hi < lo) ? h + 1 : h - 1;
}

/*
 * Near-equal band heights over `rows` rows, greedily from the first band:
 * each takes the nearest integer to rows_left/bands_left.  With odd_inner
 * every band but the last has an odd height: when the band width is even,
 * only an odd height lets the band's snake end in the corner above the
 * next band (see band_path).  Returns 0 when infeasible.
 */
static int band_heights(int rows, int bands, int odd_inner, int *hts) {
    int left = rows;
    for (int i = 0; i < bands; ++i) {
        int bl = bands - i;
        if (bl == 1) {
            hts[i] = left;
            return left >= 1;
        }
        int h = nearest_quotient(left, bl);
        if (odd_inner && h % 2 == 0)
            h = nearest_odd(h, left, bl);
        int cap = left - (bl - 1); /* leave one row per remaining band */
        if (h > cap)
            h = (odd_inner && cap % 2 == 0) ? cap - 1 : cap;
        if (h < 1)
            return 0;
        hts[i] = h;
        left -= h;
    }
    return 0;
}

/* Frame cell id of (r, c) in the candidate grid; the column family works
 * on the transposed grid (its rows are frame columns). */
static int32_t cell_of(int family, int frame_w, int r, int c) {
    return family == QVI_PART_ROW_BANDS ? (int32_t)(r * frame_w + c)
                                        : (int32_t)(c * frame_w + r);
}

/*
 * The snake through one band of rows [r0, r0+hb) of a gh x gw grid.
 * Local column j runs left to right for even bands and right to left for
 * odd ones.  Columns are walked vertically (down, up, down, ...), so the
 * band is entered at the top of local column 0.  With an odd column count
 * the walk ends at the bottom of the last column, right above where the
 * next band starts.  With an even count it would end at the top; then the
 * last two columns are walked as a two-wide horizontal snake instead,
 * which ends at the bottom corner when hb is odd (band_heights makes it
 * so).  The last band needs no exit and always uses plain columns.
 */
static int32_t *band_path(int family, int frame_w, int gw, int r0, int hb,
                          int band, int last, int32_t *out) {
    int pair = (gw % 2 == 0) && !last;
    int vcols = pair ? gw - 2 : gw;
    for (int j = 0; j < gw; ++j) {
        int col = (band % 2 == 0) ? j : gw - 1 - j;
        if (j < vcols) {
            for (int i = 0; i < hb; ++i) {
                int r = (j % 2 == 0) ? r0 + i : r0 + hb - 1 - i;
                *out++ = cell_of(family, frame_w, r, col);
            }
        }
    }
    if (pair) {
        int ca = (band % 2 == 0) ? gw - 2 : 1; /* local column gw-2 */
        int cb = (band % 2 == 0) ? gw - 1 : 0; /* local column gw-1 */
        for (int i = 0; i < hb; ++i) {
            int first = (i % 2 == 0) ? ca : cb;
            int second = (i % 2 == 0) ? cb : ca;
            *out++ = cell_of(family, frame_w, r0 + i, first);
            *out++ = cell_of(family, frame_w, r0 + i, second);
        }
    }
    return out;
}

/* 1 if consecutive cells of path[n] are 4-neighbours in an h x w frame. */
static int path_is_contiguous(const int32_t *path, int64_t n, int w) {
    for (int64_t i = 1; i < n; ++i) {
        int ya = path[i - 1] / w, xa = path[i - 1] % w;
        int yb = path[i] / w, xb = path[i] % w;
        if (abs(ya - yb) + abs(xa - xb) != 1)
            return 0;
    }
    return 1;
}

int qvi_partition_path(int h, int w, int family, int bands, int32_t *path) {
    int gh = family == QVI_PART_ROW_BANDS ? h : w; /* rows split in bands */
    int gw = family == QVI_PART_ROW_BANDS ? w : h; /* band width          */
    if (bands < 1 || bands > gh)
        return 0;
    int *hts = malloc(sizeof(int) * (size_t)bands);
    if (!hts)
        return 0;
    int ok = band_heights(gh, bands, gw % 2 == 0, hts);
    int32_t *out = path;
    for (int i = 0, r0 = 0; ok && i < bands; r0 += hts[i], ++i)
        out = band_path(family, w, gw, r0, hts[i], i, i == bands - 1, out);
    free(hts);
    /* Defensive: a candidate whose path broke is never used. */
    return ok && path_is_contiguous(path, (int64_t)h * w, w);
}

/* Cuts the path into R runs of the balanced counts of Eq. 20: the first
 * (n mod R) regions get ceil(n/R) cells, the rest floor(n/R). */
static void label_path(const int32_t *path, int64_t n, int R, int32_t *label) {
    int64_t q = n / R, rem = n % R, pos = 0;
    for (int k = 0; k < R; ++k) {
        int64_t cnt = q + (k < rem ? 1 : 0);
        for (int64_t i = 0; i < cnt; ++i)
            label[path[pos++]] = k;
    }
}

int64_t qvi_partition_ecut(const int32_t *label, int h, int w) {
    int64_t e = 0;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            int32_t a = label[y * w + x];
            if (x + 1 < w && label[y * w + x + 1] != a)
                ++e;
            if (y + 1 < h && label[(y + 1) * w + x] != a)
                ++e;
        }
    return e;
}

void qvi_partition_free(qvi_partition *p) {
    if (!p)
        return;
    free(p->label);
    free(p->cells);
    free(p->start);
    memset(p, 0, sizeof(*p));
}

/* Fills start[] from the balanced counts (path order = region order). */
static void fill_starts(int64_t n, int R, int32_t *start) {
    int64_t q = n / R, rem = n % R, pos = 0;
    for (int k = 0; k < R; ++k) {
        start[k] = (int32_t)pos;
        pos += q + (k < rem ? 1 : 0);
    }
    start[R] = (int32_t)pos;
}

/*
 * Tries every candidate in the documented order (row bands b = 1..
 * min(h, R_f), then column bands b = 1..min(w, R_f)) and keeps the first
 * one with the least E_cut, i.e. the least total perimeter of Eq. 21.
 */
static void search_candidates(qvi_partition *p, int64_t n, int32_t *path,
                              int32_t *lab) {
    int64_t best = -1;
    for (int fam = QVI_PART_ROW_BANDS; fam <= QVI_PART_COL_BANDS; ++fam) {
        int gh = fam == QVI_PART_ROW_BANDS ? p->h : p->w;
        int bmax = gh < p->regions ? gh : p->regions;
        for (int b = 1; b <= bmax; ++b) {
            if (!qvi_partition_path(p->h, p->w, fam, b, path))
                continue;
            label_path(path, n, p->regions, lab);
            int64_t e = qvi_partition_ecut(lab, p->h, p->w);
            if (best < 0 || e < best) {
                best = e;
                p->family = fam;
                p->bands = b;
                memcpy(p->cells, path, sizeof(int32_t) * (size_t)n);
                memcpy(p->label, lab, sizeof(int32_t) * (size_t)n);
            }
        }
    }
    p->e_cut = best;
    p->perimeter = 2 * ((int64_t)p->h + p->w) + 2 * best;
}

qva_status qvi_partition_build(int h, int w, int c, qvi_partition *p) {
    if (!p)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "draft: partition is NULL");
    memset(p, 0, sizeof(*p));
    if (h < 1 || w < 1 || c < 1)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: partition needs h, w, c >= 1 (got %d, %d, %d)",
                        h, w, c);
    int64_t n = (int64_t)h * w;
    if (n > INT32_MAX / 2)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "draft: frame %dx%d too large", h, w);
    p->h = h;
    p->w = w;
    p->c = c;
    p->regions = (int)((n + c - 1) / c);
    p->label = malloc(sizeof(int32_t) * (size_t)n);
    p->cells = malloc(sizeof(int32_t) * (size_t)n);
    p->start = malloc(sizeof(int32_t) * ((size_t)p->regions + 1));
    int32_t *path = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
    if (!p->label || !p->cells || !p->start || !path || !lab) {
        free(path);
        free(lab);
        qvi_partition_free(p);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: partition %dx%d", h, w);
    }
    /* Row bands with b = 1 always succeed, so a best candidate exists. */
    search_candidates(p, n, path, lab);
    fill_starts(n, p->regions, p->start);
    free(path);
    free(lab);
    return QVA_OK;
}

/* ------------------------------------------------------------ packing */

void qvi_draft_layout_free(qvi_draft_layout *lay) {
    if (!lay)
        return;
    free(lay->pack_to_orig);
    free(lay->orig_to_pack);
    free(lay->count);
    memset(lay, 0, sizeof(*lay));
}

/* Packed slots of the prefix: sequence order, padding after. */
static void pack_prefix(qvi_draft_layout *lay, int64_t video) {
    int64_t first = lay->prefix_at_end ? video : 0;
    for (int64_t j = 0; j < lay->prefix_pad; ++j) {
        int32_t o = j < lay->prefix ? (int32_t)(first + j) : -1;
        lay->pack_to_orig[j] = o;
        if (o >= 0)
            lay->orig_to_pack[o] = (int32_t)j;
    }
}

/* Packed slots of the video regions: frame by frame, region by region,
 * each a block of c slots holding its cells in path order. */
static void pack_video(qvi_draft_layout *lay, const qvi_partition *part) {
    int64_t hw = (int64_t)lay->h * lay->w;
    int64_t base = lay->prefix_at_end ? 0 : lay->prefix;
    for (int t = 0; t < lay->t; ++t)
        for (int a = 0; a < lay->rf; ++a) {
            int64_t r = (int64_t)t * lay->rf + a;
            int64_t slot0 = lay->prefix_pad + r * lay->c;
            int32_t cnt = part->start[a + 1] - part->start[a];
            lay->count[r] = cnt;
            for (int i = 0; i < lay->c; ++i) {
                int32_t o = -1;
                if (i < cnt)
                    o = (int32_t)(base + t * hw + part->cells[part->start[a] + i]);
                lay->pack_to_orig[slot0 + i] = o;
                if (o >= 0)
                    lay->orig_to_pack[o] = (int32_t)(slot0 + i);
            }
        }
}

qva_status qvi_draft_layout_build(const qvi_partition *part, int t,
                                  int prefix, int prefix_at_end,
                                  qvi_draft_layout *lay) {
    memset(lay, 0, sizeof(*lay));
    if (!part || t < 1 || prefix < 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: layout needs a partition, T >= 1, P >= 0");
    int64_t video = (int64_t)t * part->h * part->w;
    int64_t regions = (int64_t)t * part->regions;
    int64_t prefix_pad = ((int64_t)prefix + part->c - 1) / part->c * part->c;
    int64_t n_pack = prefix_pad + regions * part->c;
    if (video + prefix > INT32_MAX || n_pack > INT32_MAX)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "draft: sequence of %lld packed slots exceeds int32",
                        (long long)n_pack);
    lay->n = video + prefix;
    lay->prefix = prefix;
    lay->prefix_at_end = prefix_at_end ? 1 : 0;
    lay->t = t;
    lay->h = part->h;
    lay->w = part->w;
    lay->c = part->c;
    lay->rf = part->regions;
    lay->regions = regions;
    lay->prefix_pad = prefix_pad;
    lay->n_pack = n_pack;
    lay->pack_to_orig = malloc(sizeof(int32_t) * (size_t)n_pack);
    lay->orig_to_pack = malloc(sizeof(int32_t) * (size_t)lay->n);
    lay->count = malloc(sizeof(int32_t) * (size_t)regions);
    if (!lay->pack_to_orig || !lay->orig_to_pack || !lay->count) {
        qvi_draft_layout_free(lay);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: layout of %lld slots",
                        (long long)n_pack);
    }
    pack_prefix(lay, video);
    pack_video(lay, part);
    return QVA_OK;
}

void qvi_draft_pack(const qvi_draft_layout *lay, const float *src, int d,
                    float *dst) {
    for (int64_t s = 0; s < lay->n_pack; ++s) {
        int32_t o = lay->pack_to_orig[s];
        float *row = dst + s * d;
        if (o < 0)
            memset(row, 0, sizeof(float) * (size_t)d);
        else
            memcpy(row, src + (int64_t)o * d, sizeof(float) * (size_t)d);
    }
}

/* ------------------------------------------------------------ cache */

/* The partitions built in one context, one per (h, w, c). */
typedef struct draft_cache_node {
    qvi_partition part;
    struct draft_cache_node *next;
} draft_cache_node;

static void draft_cache_free(void *p) {
    draft_cache_node *n = p;
    while (n) {
        draft_cache_node *next = n->next;
        qvi_partition_free(&n->part);
        free(n);
        n = next;
    }
}

qva_status qvi_draft_partition_get(qva_context_t *ctx, int h, int w, int c,
                                   const qvi_partition **part,
                                   qvi_partition **owned) {
    *part = NULL;
    *owned = NULL;
    void (*dtor)(void *) = draft_cache_free;
    void **slot = ctx ? qvi_context_slot(ctx, QVI_SLOT_DRAFT, &dtor) : NULL;
    if (slot) {
        for (draft_cache_node *n = *slot; n; n = n->next)
            if (n->part.h == h && n->part.w == w && n->part.c == c) {
                *part = &n->part;
                return QVA_OK;
            }
    }
    draft_cache_node *node = calloc(1, sizeof(*node));
    if (!node)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: partition cache");
    qva_status st = qvi_partition_build(h, w, c, &node->part);
    if (st != QVA_OK) {
        free(node);
        return st;
    }
    if (slot) {
        node->next = *slot;
        *slot = node;
        *part = &node->part;
        return QVA_OK;
    }
    /* No context slot: the caller owns the node and gives it back through
     * qvi_draft_partition_release (the partition is its first member). */
    *owned = &node->part;
    *part = &node->part;
    return QVA_OK;
}

void qvi_draft_partition_release(qvi_partition *owned) {
    draft_cache_free((draft_cache_node *)owned);
}
