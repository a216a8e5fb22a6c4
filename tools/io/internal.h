/*
 * What the io files share and the public header does not expose: error
 * reporting, byte order and file access (common.c), shapes and element data
 * of q/k/v (tensor.c), the JSON cursor and string builder (json.c).
 *
 * Every io file includes this header first: the feature macros below must
 * come before any system header.
 */
#ifndef QVA_TOOLS_IO_INTERNAL_H
#define QVA_TOOLS_IO_INTERNAL_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* fseeko, ftello, stat */
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io.h"

/* Nesting limit of the JSON and Python-literal skippers: a fuzzer's
 * [[[[... must not blow the stack. */
#define QIO_JSON_MAX_DEPTH 64

#if defined(__GNUC__)
#define QIO_PRINTF(fmt_arg, first_arg) \
    __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define QIO_PRINTF(fmt_arg, first_arg)
#endif

/* ------------------------------------------------------------ common.c */
/* Fills e (when not NULL) and returns code. */
qio_err fail(qio_error *e, qio_err code, const char *fmt, ...) QIO_PRINTF(3, 4);
/* Prefixes the message with the file it concerns. */
void prefix_path(qio_error *e, const char *path);
void clear_error(qio_error *e);
/* Little-endian integers of nbytes bytes. */
uint64_t rd_le(const unsigned char *p, int nbytes);
void wr_le(unsigned char *p, uint64_t v, int nbytes);
/* Opens path for reading and measures it. */
qio_err open_read(const char *path, FILE **f, int64_t *size, qio_error *err);
/* Reads exactly n bytes at pos. */
qio_err read_at(FILE *f, int64_t pos, void *buf, size_t n, qio_error *err);

/* ------------------------------------------------------------ tensor.c */
typedef struct dims4 {
    int64_t B, H, N, D;
} dims4;

extern const char *const QKV_NAMES[3]; /* "q", "k", "v" */

void fmt_shape(char *buf, size_t len, int rank, const int64_t *shape);
/* Elements of a shape, or -1 if a dimension is negative or the product is
 * too large. */
int64_t shape_elems(int rank, const int64_t *shape);
/* Maps an on-disk [H,N,D] or [B,H,N,D] shape to dims, checking what the
 * library can run. */
qio_err shape_to_dims(const char *name, int rank, const int64_t *shape,
                      dims4 *d, qio_error *err);
/* k and v must agree exactly; q must agree with them on B, H and D. */
qio_err check_trio(const dims4 d[3], qio_error *err);
size_t elem_size(qva_dtype dt);
/* Allocates and fills out's three f32 buffers from their file positions. */
qio_err read_trio(FILE *const f[3], const int64_t pos[3],
                  const qva_dtype dt[3], const dims4 d[3], qio_qkv *out,
                  qio_error *err);
/* Validates a tensor descriptor given to a writer; elems gets its size. */
qio_err check_desc(const qio_tensor_desc *t, int64_t *elems, qio_error *err);
/* Writes header bytes then every tensor's data; closes f. */
qio_err write_file(FILE *f, const char *path, const void *head,
                   size_t head_len, const qio_tensor_desc *t,
                   const int64_t *elems, int count, qio_error *err);

/* ------------------------------------------------------------ json.c */
/* A minimal parser for the safetensors header: enough JSON to walk any
 * valid document (so unknown keys and "__metadata__" can be skipped) plus
 * the few typed readers the tensor entries need. */
typedef struct jp {
    const char *s;
    size_t n, i;
    qio_error *err;
} jp;

qio_err jp_fail(jp *p, const char *what);
void jp_ws(jp *p);
/* The next non-space character, or -1 at the end. */
int jp_peek(jp *p);
/* Consumes the character c, after white space. */
qio_err jp_lit(jp *p, char c);
/* After an element of an object or array: 1 on ',', 0 on the closer. */
qio_err jp_next(jp *p, char closer, int *more);
/* Reads a string into buf (cap >= 1), truncating long ones. */
qio_err jp_string(jp *p, char *buf, size_t cap);
/* A non-negative integer no larger than 2^53. */
qio_err jp_uint(jp *p, uint64_t *out);
/* Skips any JSON value. */
qio_err jp_skip(jp *p, int depth);

/* A growable string for the header text. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

void sb_str(sbuf *b, const char *s);
void sb_fmt(sbuf *b, const char *fmt, ...) QIO_PRINTF(2, 3);
/* s as a quoted, escaped JSON string. */
void sb_json_str(sbuf *b, const char *s);

#endif /* QVA_TOOLS_IO_INTERNAL_H */
