/*
 * safetensors: an 8-byte little-endian header length, a JSON header naming
 * each tensor's dtype, shape and data_offsets, then the data.  The reader
 * yields q, k and v; the writer makes files for tests and captures.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* safetensors' own reference limit; a larger header is corrupt or hostile */
#define QIO_ST_MAX_HEADER 100000000ull

/* ------------------------------------------------------------ reading */
typedef struct st_entry {
    int present, have_dtype, have_shape, have_off;
    char dtype[24];
    int rank;          /* entries in "shape"; only the first 8 are kept */
    int64_t shape[8];
    uint64_t off[2];
} st_entry;

/* [a, b, ...] of non-negative integers; count gets the full length. */
static qio_err st_uint_array(jp *p, uint64_t *vals, int cap, int *count) {
    int more = 1;
    qio_err e = jp_lit(p, '[');
    *count = 0;
    if (e) return e;
    if (jp_peek(p) == ']') {
        ++p->i;
        return QIO_OK;
    }
    while (more) {
        uint64_t v = 0;
        if ((e = jp_uint(p, &v))) return e;
        if (*count < cap) vals[*count] = v;
        ++*count;
        if ((e = jp_next(p, ']', &more))) return e;
    }
    return QIO_OK;
}

static qio_err st_entry_field(jp *p, const char *key, st_entry *t) {
    uint64_t vals[8];
    int count;
    qio_err e;
    if (!strcmp(key, "dtype")) {
        t->have_dtype = 1;
        return jp_string(p, t->dtype, sizeof t->dtype);
    }
    if (!strcmp(key, "shape")) {
        if ((e = st_uint_array(p, vals, 8, &count))) return e;
        t->have_shape = 1;
        t->rank = count;
        for (int i = 0; i < count && i < 8; ++i) t->shape[i] = (int64_t)vals[i];
        return QIO_OK;
    }
    if (!strcmp(key, "data_offsets")) {
        if ((e = st_uint_array(p, vals, 2, &count))) return e;
        if (count != 2) return jp_fail(p, "data_offsets must hold 2 integers");
        t->have_off = 1;
        t->off[0] = vals[0];
        t->off[1] = vals[1];
        return QIO_OK;
    }
    return jp_skip(p, 2);
}

static qio_err st_entry_parse(jp *p, const char *name, st_entry *t) {
    char key[32];
    int more = 1;
    qio_err e = jp_lit(p, '{');
    if (e) return e;
    if (jp_peek(p) == '}') {
        ++p->i;
        more = 0;
    }
    while (more) {
        if ((e = jp_string(p, key, sizeof key)) || (e = jp_lit(p, ':')) ||
            (e = st_entry_field(p, key, t)) || (e = jp_next(p, '}', &more)))
            return e;
    }
    const char *lack = !t->have_dtype ? "dtype"
                       : !t->have_shape ? "shape"
                       : !t->have_off  ? "data_offsets" : NULL;
    if (lack)
        return fail(p->err, QIO_E_JSON, "header JSON: tensor '%s' lacks \"%s\"",
                    name, lack);
    t->present = 1;
    return QIO_OK;
}

static int qkv_index(const char *name) {
    for (int i = 0; i < 3; ++i)
        if (!strcmp(name, QKV_NAMES[i])) return i;
    return -1;
}

static qio_err st_top_member(jp *p, st_entry ent[3]) {
    char key[128];
    qio_err e;
    if ((e = jp_string(p, key, sizeof key)) || (e = jp_lit(p, ':'))) return e;
    int idx = qkv_index(key);
    if (idx >= 0) {
        if (ent[idx].present)
            return fail(p->err, QIO_E_JSON,
                        "header JSON: tensor '%s' appears twice", key);
        return st_entry_parse(p, key, &ent[idx]);
    }
    if (!strcmp(key, "__metadata__") && jp_peek(p) != '{')
        return jp_fail(p, "__metadata__ must be an object");
    return jp_skip(p, 1); /* metadata or a tensor we do not use */
}

static qio_err st_parse_header(const char *s, size_t n, st_entry ent[3],
                               qio_error *err) {
    jp p = {s, n, 0, err};
    int more = 1;
    memset(ent, 0, 3 * sizeof *ent);
    qio_err e = jp_lit(&p, '{');
    if (e) return e;
    if (jp_peek(&p) == '}') {
        ++p.i;
        more = 0;
    }
    while (more)
        if ((e = st_top_member(&p, ent)) || (e = jp_next(&p, '}', &more)))
            return e;
    if (jp_peek(&p) != -1) return jp_fail(&p, "trailing characters after the header object");
    return QIO_OK;
}

static qio_err st_dtype(const char *name, const char *s, qva_dtype *dt,
                        qio_error *err) {
    static const char *const known[] = {
        "F64", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8",
        "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
        "F6_E3M2", "C64"};
    if (!strcmp(s, "F32")) *dt = QVA_F32;
    else if (!strcmp(s, "BF16")) *dt = QVA_BF16;
    else if (!strcmp(s, "F16")) *dt = QVA_F16;
    else {
        for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i)
            if (!strcmp(s, known[i]))
                return fail(err, QIO_E_DTYPE,
                            "tensor '%s': dtype %s not supported (F32, BF16 "
                            "or F16)",
                            name, s);
        return fail(err, QIO_E_DTYPE, "tensor '%s': unknown dtype '%s'", name,
                    s);
    }
    return QIO_OK;
}

static const char *dtype_name(qva_dtype dt) {
    return dt == QVA_F32 ? "F32" : dt == QVA_BF16 ? "BF16" : "F16";
}

/* The entry's byte range must be exactly dtype x shape and lie inside the
 * data section; a consistent range past the end means a truncated file. */
static qio_err st_check_offsets(const char *name, const st_entry *t,
                                qva_dtype dt, uint64_t data_len,
                                qio_error *err) {
    char s[160];
    fmt_shape(s, sizeof s, t->rank, t->shape);
    uint64_t need = (uint64_t)shape_elems(t->rank, t->shape) * elem_size(dt);
    if (t->off[1] < t->off[0])
        return fail(err, QIO_E_OFFSETS,
                    "tensor '%s': data_offsets [%llu,%llu] end before they "
                    "begin",
                    name, (unsigned long long)t->off[0],
                    (unsigned long long)t->off[1]);
    if (t->off[1] - t->off[0] != need)
        return fail(err, QIO_E_OFFSETS,
                    "tensor '%s': data_offsets [%llu,%llu] hold %llu bytes but "
                    "%s %s needs %llu",
                    name, (unsigned long long)t->off[0],
                    (unsigned long long)t->off[1],
                    (unsigned long long)(t->off[1] - t->off[0]),
                    dtype_name(dt), s, (unsigned long long)need);
    if (t->off[1] > data_len)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: tensor '%s' needs data bytes [%llu,%llu) "
                    "but the data section has %llu",
                    name, (unsigned long long)t->off[0],
                    (unsigned long long)t->off[1],
                    (unsigned long long)data_len);
    return QIO_OK;
}

/* Validates the three entries: presence, dtype, shape, offsets, then the
 * shapes against each other. */
static qio_err st_validate(const st_entry ent[3], uint64_t data_len,
                           qva_dtype dt[3], dims4 d[3], qio_error *err) {
    for (int i = 0; i < 3; ++i)
        if (!ent[i].present)
            return fail(err, QIO_E_MISSING,
                        "no tensor named '%s' (the file needs q, k and v)",
                        QKV_NAMES[i]);
    for (int i = 0; i < 3; ++i) {
        qio_err e;
        if ((e = st_dtype(QKV_NAMES[i], ent[i].dtype, &dt[i], err)) ||
            (e = shape_to_dims(QKV_NAMES[i], ent[i].rank, ent[i].shape, &d[i],
                               err)) ||
            (e = st_check_offsets(QKV_NAMES[i], &ent[i], dt[i], data_len, err)))
            return e;
    }
    return check_trio(d, err);
}

/* Reads the length field and the header text (caller frees *hdr). */
static qio_err st_read_header(FILE *f, int64_t fsize, char **hdr,
                              uint64_t *hlen, qio_error *err) {
    unsigned char lenbuf[8];
    if (fsize < 8)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: %lld bytes, less than the 8-byte header "
                    "length",
                    (long long)fsize);
    qio_err e = read_at(f, 0, lenbuf, 8, err);
    if (e) return e;
    *hlen = rd_le(lenbuf, 8);
    if (*hlen > QIO_ST_MAX_HEADER)
        return fail(err, QIO_E_HEADER,
                    "header length %llu is absurd (limit %llu): not a "
                    "safetensors file?",
                    (unsigned long long)*hlen, QIO_ST_MAX_HEADER);
    if (*hlen < 2)
        return fail(err, QIO_E_HEADER,
                    "header length %llu is too small for a JSON object",
                    (unsigned long long)*hlen);
    if (*hlen > (uint64_t)(fsize - 8))
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: header length %llu but only %lld bytes "
                    "follow",
                    (unsigned long long)*hlen, (long long)(fsize - 8));
    *hdr = malloc((size_t)*hlen);
    if (!*hdr) return fail(err, QIO_E_NOMEM, "out of memory for the header");
    return read_at(f, 8, *hdr, (size_t)*hlen, err);
}

static qio_err st_load(FILE *f, int64_t fsize, qio_qkv *out, qio_error *err) {
    char *hdr = NULL;
    uint64_t hlen = 0;
    st_entry ent[3];
    qva_dtype dt[3];
    dims4 d[3];
    qio_err e = st_read_header(f, fsize, &hdr, &hlen, err);
    if (!e) e = st_parse_header(hdr, (size_t)hlen, ent, err);
    free(hdr);
    if (e) return e;
    uint64_t data_start = 8 + hlen, data_len = (uint64_t)fsize - data_start;
    if ((e = st_validate(ent, data_len, dt, d, err))) return e;
    FILE *fs[3] = {f, f, f};
    int64_t pos[3];
    for (int i = 0; i < 3; ++i) pos[i] = (int64_t)(data_start + ent[i].off[0]);
    out->format = "safetensors";
    return read_trio(fs, pos, dt, d, out, err);
}

qio_err qio_load_safetensors(const char *path, qio_qkv *out, qio_error *err) {
    FILE *f = NULL;
    int64_t fsize = 0;
    clear_error(err);
    if (!path || !out) return fail(err, QIO_E_ARG, "NULL argument");
    memset(out, 0, sizeof *out);
    qio_err e = open_read(path, &f, &fsize, err);
    if (!e) {
        e = st_load(f, fsize, out, err);
        fclose(f);
    }
    if (e) {
        qio_qkv_free(out);
        prefix_path(err, path);
    }
    return e;
}

/* ------------------------------------------------------------ writing */
static void st_header_text(sbuf *b, const qio_tensor_desc *t, int count,
                           const int64_t *elems, const char *const *meta,
                           int n_meta) {
    uint64_t off = 0;
    sb_str(b, "{");
    if (n_meta > 0) {
        sb_str(b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; ++i) {
            if (i) sb_str(b, ",");
            sb_json_str(b, meta[2 * i]);
            sb_str(b, ":");
            sb_json_str(b, meta[2 * i + 1]);
        }
        sb_str(b, "}");
    }
    for (int i = 0; i < count; ++i) {
        uint64_t bytes = (uint64_t)elems[i] * elem_size(t[i].dtype);
        if (i || n_meta > 0) sb_str(b, ",");
        sb_json_str(b, t[i].name);
        sb_fmt(b, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(t[i].dtype));
        for (int r = 0; r < t[i].rank; ++r)
            sb_fmt(b, "%s%lld", r ? "," : "", (long long)t[i].shape[r]);
        sb_fmt(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
               (unsigned long long)(off + bytes));
        off += bytes;
    }
    sb_str(b, "}");
    while ((8 + b->len) % 8) sb_str(b, " "); /* data starts 8-aligned */
}

qio_err qio_write_safetensors(const char *path, const qio_tensor_desc *t,
                              int count, const char *const *meta, int n_meta,
                              qio_error *err) {
    int64_t elems[64];
    sbuf b = {0};
    clear_error(err);
    if (!path || count < 0 || count > 64 || (count && !t) || n_meta < 0 ||
        (n_meta && !meta))
        return fail(err, QIO_E_ARG, "bad arguments to the safetensors writer");
    for (int i = 0; i < count; ++i) {
        qio_err e = check_desc(&t[i], &elems[i], err);
        if (e) return e;
    }
    st_header_text(&b, t, count, elems, meta, n_meta);
    if (b.oom) {
        free(b.s);
        return fail(err, QIO_E_NOMEM, "out of memory for the header");
    }
    unsigned char lenbuf[8];
    wr_le(lenbuf, b.len, 8);
    FILE *f = fopen(path, "wb");
    qio_err e = QIO_OK;
    if (!f) e = fail(err, QIO_E_WRITE, "%s: cannot create: %s", path, strerror(errno));
    else if (fwrite(lenbuf, 1, 8, f) != 8) {
        fclose(f);
        e = fail(err, QIO_E_WRITE, "%s: write failed", path);
    } else {
        e = write_file(f, path, b.s, b.len, t, elems, count, err);
    }
    free(b.s);
    return e;
}

