/*
 * Error reporting, byte order and file access shared by the io readers and
 * writers.
 *
 * Every length read from a file is checked against the file size before it
 * is trusted, so a hostile or truncated file yields an error, never a read
 * past a buffer.  Byte order is decoded explicitly (both formats are
 * little-endian on disk) so the code does not depend on the host.
 */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/types.h>

/* ------------------------------------------------------------ errors */
qio_err fail(qio_error *e, qio_err code, const char *fmt, ...) {
    if (!e) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    /* Messages echo text from the file (a dtype, a descr) and go to a
     * terminal: an escaped or raw ESC, CR or newline there must not clear
     * the screen or forge a line, so every control character becomes '?'. */
    for (char *c = e->msg; *c; ++c)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    e->code = code;
    return code;
}

/* Prefixes the message with the file it concerns, once, at the top level,
 * so the inner parsers need not carry the path around. */
void prefix_path(qio_error *e, const char *path) {
    size_t cap = sizeof e->msg - 1, pl = strlen(path), ml = strlen(e->msg);
    if (pl > cap / 2) pl = cap / 2; /* keep room for the message itself */
    size_t keep = ml < cap - pl - 2 ? ml : cap - pl - 2;
    memmove(e->msg + pl + 2, e->msg, keep);
    memcpy(e->msg, path, pl);
    e->msg[pl] = ':';
    e->msg[pl + 1] = ' ';
    e->msg[pl + 2 + keep] = '\0';
}

void clear_error(qio_error *e) {
    if (!e) return;
    e->code = QIO_OK;
    e->msg[0] = '\0';
}

const char *qio_err_name(qio_err e) {
    static const char *const names[] = {
        "ok",      "argument", "open",   "truncated", "magic",
        "header",  "json",     "offsets", "dtype",    "rank",
        "missing", "shape",    "empty",  "head-dim",  "nonfinite",
        "order",   "nomem",    "write"};
    if ((unsigned)e >= sizeof names / sizeof names[0]) return "unknown";
    return names[e];
}

/* ------------------------------------------------------------ byte order */
uint64_t rd_le(const unsigned char *p, int nbytes) {
    uint64_t v = 0;
    for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void wr_le(unsigned char *p, uint64_t v, int nbytes) {
    for (int i = 0; i < nbytes; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

/* ------------------------------------------------------------ files */
/* Size of an open file, or -1. */
static int64_t file_size(FILE *f) {
    if (fseeko(f, 0, SEEK_END) != 0) return -1;
    off_t n = ftello(f);
    if (n < 0 || fseeko(f, 0, SEEK_SET) != 0) return -1;
    return (int64_t)n;
}

qio_err open_read(const char *path, FILE **f, int64_t *size, qio_error *err) {
    *f = fopen(path, "rb");
    if (!*f) return fail(err, QIO_E_OPEN, "cannot open: %s", strerror(errno));
    *size = file_size(*f);
    if (*size < 0) {
        fclose(*f);
        *f = NULL;
        return fail(err, QIO_E_OPEN, "cannot determine the file size");
    }
    return QIO_OK;
}

/* Reads exactly n bytes at pos; a short read means the file shrank or lied. */
qio_err read_at(FILE *f, int64_t pos, void *buf, size_t n, qio_error *err) {
    if (fseeko(f, (off_t)pos, SEEK_SET) != 0 || fread(buf, 1, n, f) != n)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: cannot read %zu bytes at offset %lld", n,
                    (long long)pos);
    return QIO_OK;
}

