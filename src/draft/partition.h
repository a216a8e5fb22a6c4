/*
 * DraftAttention2 geometry, shared by the CPU reference, the CUDA backend
 * and the tests: the ragged 2D partition of a frame, the token packing
 * into region blocks, and the per-context partition cache
 * (src/draft/partition.c).  Pure and deterministic apart from the cache;
 * docs/DRAFT.md §1 gives the construction.
 */
#ifndef QVATTN_DRAFT_PARTITION_H
#define QVATTN_DRAFT_PARTITION_H

#include "internal.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ partition */
/* Candidate families of the ragged 2D partition (docs/DRAFT.md §1). */
enum { QVI_PART_ROW_BANDS = 0, QVI_PART_COL_BANDS = 1 };

/*
 * A ragged partition of one h x w frame into R_f = ceil(h*w/c) connected
 * regions (DA2 C.2, Eq. 20-21).  Region k holds floor(h*w/R_f) cells plus
 * one for k < (h*w mod R_f).  Cells are numbered y*w + x.
 */
typedef struct qvi_partition {
    int h, w, c;
    int regions;         /* R_f                                        */
    int family;          /* QVI_PART_ROW_BANDS or QVI_PART_COL_BANDS   */
    int bands;           /* band count of the winning candidate        */
    int64_t e_cut;       /* neighbour pairs in different regions       */
    int64_t perimeter;   /* 2(h+w) + 2 e_cut (Eq. 21)                  */
    int32_t *label;      /* h*w: region of each cell                    */
    int32_t *cells;      /* h*w: cells grouped by region, path order    */
    int32_t *start;      /* regions+1: region k is cells[start[k]..)    */
} qvi_partition;

/* Builds the least-perimeter candidate; p is zeroed first. */
qva_status qvi_partition_build(int h, int w, int c, qvi_partition *p);
void qvi_partition_free(qvi_partition *p);
/* Horizontal and vertical neighbour pairs with different labels. */
int64_t qvi_partition_ecut(const int32_t *label, int h, int w);
/*
 * One candidate: the snake path of `bands` bands of the given family
 * (docs/DRAFT.md §1).  path receives h*w cell ids.  Returns 0 if the band
 * count is infeasible for this family (then path is unspecified).
 */
int qvi_partition_path(int h, int w, int family, int bands, int32_t *path);

/* ------------------------------------------------------------ packing */
/*
 * Token packing (DA2 C.2): packed slots = prefix (padded up to a multiple
 * of c) followed by one block of c slots per video region, frame by frame,
 * valid tokens first in path order, padding after.
 */
typedef struct qvi_draft_layout {
    int64_t n;              /* sequence length P + T*H*W                  */
    int prefix;             /* P                                           */
    int prefix_at_end;
    int t, h, w, c;
    int rf;                 /* regions per frame                           */
    int64_t regions;        /* R = T * R_f                                 */
    int64_t prefix_pad;     /* slots before the first video block          */
    int64_t n_pack;         /* prefix_pad + R * c                          */
    int32_t *pack_to_orig;  /* n_pack: sequence index, -1 for padding      */
    int32_t *orig_to_pack;  /* n: packed slot of each sequence index       */
    int32_t *count;         /* R: valid tokens of each video region        */
} qvi_draft_layout;

qva_status qvi_draft_layout_build(const qvi_partition *part, int t,
                                  int prefix, int prefix_at_end,
                                  qvi_draft_layout *lay);
void qvi_draft_layout_free(qvi_draft_layout *lay);
/* dst[n_pack*d] = rows of src[n*d] in packed order, padding rows zero. */
void qvi_draft_pack(const qvi_draft_layout *lay, const float *src, int d,
                    float *dst);

/* ------------------------------------------------------------ cache */
/* Context cache: the partition of (h, w, c), built on first use and kept
 * in QVI_SLOT_DRAFT (ctx may be NULL: *owned receives a fresh partition
 * the caller frees). */
qva_status qvi_draft_partition_get(qva_context_t *ctx, int h, int w, int c,
                                   const qvi_partition **part,
                                   qvi_partition **owned);
/* Frees a partition that qvi_draft_partition_get returned in *owned. */
void qvi_draft_partition_release(qvi_partition *owned);

#ifdef __cplusplus
}
#endif
#endif
