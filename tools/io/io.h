/*
 * Attention-input files for the qvattn CLI: safetensors and .npy readers
 * that yield f32 [B,H,N,D] q/k/v, and writers for both formats (tests and
 * captures use them to make inputs).
 *
 * The readers treat every file as hostile: each length, offset and count is
 * bounds-checked before it is used, and every malformed input is reported
 * as a qio_err code plus a message naming the problem.  Nothing here calls
 * the qvattn library, so the code can be tested on its own.
 *
 * safetensors.c and npy.c hold one format each, load.c picks between
 * them, and common.c, tensor.c and json.c hold what both share
 * (internal.h declares it).
 */
#ifndef QVA_TOOLS_IO_H
#define QVA_TOOLS_IO_H

#include <stddef.h>
#include <stdint.h>

#include "qvattn.h"

typedef enum qio_err {
    QIO_OK = 0,
    QIO_E_ARG,       /* bad argument to the reader/writer itself         */
    QIO_E_OPEN,      /* file missing or unreadable                       */
    QIO_E_TRUNCATED, /* file ends inside the header or the data          */
    QIO_E_MAGIC,     /* not a .npy file                                  */
    QIO_E_HEADER,    /* header length absurd, npy header malformed       */
    QIO_E_JSON,      /* safetensors header is not the JSON it must be    */
    QIO_E_OFFSETS,   /* data_offsets out of range or not dtype x shape   */
    QIO_E_DTYPE,     /* unknown or unsupported dtype                     */
    QIO_E_RANK,      /* not [H,N,D] or [B,H,N,D]                         */
    QIO_E_MISSING,   /* q, k or v absent                                 */
    QIO_E_SHAPE,     /* q/k/v disagree, zero or oversized dimension      */
    QIO_E_EMPTY,     /* N = 0                                            */
    QIO_E_HEAD_DIM,  /* D not 64 or 128                                  */
    QIO_E_NONFINITE, /* NaN or Inf in the data                           */
    QIO_E_ORDER,     /* npy fortran_order True                           */
    QIO_E_NOMEM,
    QIO_E_WRITE
} qio_err;

/* The outcome of one call: a code and a message that names the problem. */
typedef struct qio_error {
    qio_err code;
    char msg[512];
} qio_error;

/* Short stable name of a code ("truncated", "nonfinite", ...). */
const char *qio_err_name(qio_err e);

/* q, k, v as contiguous f32 [B,H,N,D].  q may have its own row count Nq;
 * k and v share N.  file_dtype records what was on disk. */
typedef struct qio_qkv {
    float *q, *k, *v;
    int64_t B, H, Nq, N, D;
    qva_dtype file_dtype[3];
    const char *format; /* "safetensors" or "npy" (static string) */
} qio_qkv;

/*
 * Loads q,k,v from `input`, which is one of:
 *   FILE              a safetensors file with tensors q, k, v
 *   DIR               a directory holding q.npy, k.npy, v.npy
 *   Q.npy,K.npy,V.npy three .npy paths, comma-separated
 * Tensors are [H,N,D] (B = 1) or [B,H,N,D] in F32/BF16/F16 (npy: <f4/<f2).
 * On failure out is zeroed and err describes the problem.
 */
qio_err qio_load_qkv(const char *input, qio_qkv *out, qio_error *err);
qio_err qio_load_safetensors(const char *path, qio_qkv *out, qio_error *err);
qio_err qio_load_npy_trio(const char *const paths[3], qio_qkv *out,
                          qio_error *err);
void qio_qkv_free(qio_qkv *x);

/* One tensor to write: f32 data converted (RNE) to dtype on the way out. */
typedef struct qio_tensor_desc {
    const char *name;
    qva_dtype dtype;
    int rank;          /* 0..8 */
    int64_t shape[8];
    const float *data; /* prod(shape) values, row-major */
} qio_tensor_desc;

/* Writes a safetensors file.  meta (may be NULL) holds n_meta key/value
 * string pairs for "__metadata__": meta[2i] = key, meta[2i+1] = value. */
qio_err qio_write_safetensors(const char *path, const qio_tensor_desc *t,
                              int count, const char *const *meta, int n_meta,
                              qio_error *err);
/* Writes a v1 .npy file (dtype F32 or F16; BF16 has no numpy dtype). */
qio_err qio_write_npy(const char *path, const qio_tensor_desc *t,
                      qio_error *err);

/* Bit conversions, exposed for tests: round to nearest even. */
float qio_bf16_to_f32(uint16_t h);
float qio_f16_to_f32(uint16_t h);
uint16_t qio_f32_to_bf16(float x);
uint16_t qio_f32_to_f16(float x);

#endif /* QVA_TOOLS_IO_H */
