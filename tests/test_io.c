/*
 * Tests of the CLI's file readers (tools/io/): round trips through the
 * writers in every dtype and rank, then malformed files that must each give
 * one specific error, then a small mutation fuzz that must never crash
 * (run under `make asan` it also proves the reads stay in bounds).
 *
 * tools/io/ is not part of the library, so its files are compiled into this
 * test (which also lets the test reach their internal helpers, e.g. wr_le).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "io/common.c"
#include "io/json.c"
#include "io/load.c"
#include "io/npy.c"
#include "io/safetensors.c"
#include "io/tensor.c"

#include <unistd.h>

#include "check.h"

static char g_dir[64];
static char g_files[128][128];
static int g_nfiles;

/* A fresh path in the temp dir, remembered for cleanup. */
static const char *tmp_path(const char *name) {
    if (g_nfiles >= 128) return "/nonexistent/too-many-files";
    snprintf(g_files[g_nfiles], sizeof g_files[0], "%s/%s", g_dir, name);
    return g_files[g_nfiles++];
}

static void cleanup(void) {
    for (int i = 0; i < g_nfiles; ++i) unlink(g_files[i]);
    rmdir(g_dir);
}

/* A new file each time: rewriting one in place (O_TRUNC) makes ext4 flush
 * it to disk on close (auto_da_alloc), and the fuzz below writes thousands. */
static void write_bytes(const char *path, const void *p, size_t n) {
    unlink(path);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* Values exact in f32, bf16 and f16 (multiples of 1/8 in [-4, 4)), so every
 * round trip can be compared exactly. */
static float *make_data(size_t n, int salt) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)((int)((i * 7 + (size_t)salt * 13) % 64) - 32) / 8.0f;
    return x;
}

/* ------------------------------------------------------------ helpers */
typedef struct trio {
    int rank;
    int64_t shape_q[4], shape_kv[4];
    qva_dtype dt[3];
    float *data[3];
} trio;

static size_t numel(int rank, const int64_t *s) {
    size_t n = 1;
    for (int i = 0; i < rank; ++i) n *= (size_t)s[i];
    return n;
}

static void trio_make(trio *t, int rank, const int64_t *sq, const int64_t *skv,
                      qva_dtype a, qva_dtype b, qva_dtype c) {
    memset(t, 0, sizeof *t);
    t->rank = rank;
    memcpy(t->shape_q, sq, (size_t)rank * sizeof *sq);
    memcpy(t->shape_kv, skv, (size_t)rank * sizeof *skv);
    t->dt[0] = a;
    t->dt[1] = b;
    t->dt[2] = c;
    for (int i = 0; i < 3; ++i)
        t->data[i] = make_data(numel(rank, i ? skv : sq), i + 1);
}

static void trio_free(trio *t) {
    for (int i = 0; i < 3; ++i) free(t->data[i]);
}

static qio_tensor_desc trio_desc(const trio *t, int i) {
    qio_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.name = QKV_NAMES[i];
    d.dtype = t->dt[i];
    d.rank = t->rank;
    memcpy(d.shape, i ? t->shape_kv : t->shape_q, (size_t)t->rank * sizeof(int64_t));
    d.data = t->data[i];
    return d;
}

static qio_err trio_write_st(const trio *t, const char *path) {
    qio_tensor_desc d[3] = {trio_desc(t, 0), trio_desc(t, 1), trio_desc(t, 2)};
    const char *meta[4] = {"model", "wan2.1 \"test\"", "layer", "7"};
    qio_error err;
    return qio_write_safetensors(path, d, 3, meta, 2, &err);
}

/* Compares what was loaded with what was written. */
static void trio_check(const trio *t, const qio_qkv *x, const char *what) {
    const float *got[3] = {x->q, x->k, x->v};
    int64_t B = t->rank == 4 ? t->shape_kv[0] : 1;
    CHECK(x->B == B, "%s: B %lld", what, (long long)x->B);
    CHECK(x->H == t->shape_kv[t->rank - 3], "%s: H", what);
    CHECK(x->N == t->shape_kv[t->rank - 2], "%s: N", what);
    CHECK(x->Nq == t->shape_q[t->rank - 2], "%s: Nq", what);
    CHECK(x->D == t->shape_kv[t->rank - 1], "%s: D", what);
    for (int i = 0; i < 3; ++i) {
        size_t n = numel(t->rank, i ? t->shape_kv : t->shape_q), bad = 0;
        for (size_t j = 0; j < n && got[i]; ++j) bad += got[i][j] != t->data[i][j];
        CHECK(got[i] && bad == 0, "%s: tensor %d has %zu mismatches", what, i, bad);
        CHECK(x->file_dtype[i] == t->dt[i], "%s: dtype %d", what, i);
    }
}

/* Asserts a load fails with `code` and a message containing `needle`. */
static void expect_fail(const char *input, qio_err code, const char *needle,
                        const char *what) {
    qio_qkv x;
    qio_error err;
    qio_err e = qio_load_qkv(input, &x, &err);
    CHECK(e == code, "%s: got %s (%s), want %s", what, qio_err_name(e), err.msg,
          qio_err_name(code));
    CHECK(e == QIO_OK || strstr(err.msg, needle) != NULL,
          "%s: message '%s' lacks '%s'", what, err.msg, needle);
    CHECK(x.q == NULL && x.k == NULL && x.v == NULL, "%s: buffers leaked", what);
    if (getenv("QVA_TEST_VERBOSE")) printf("%-32s %s\n", what, err.msg);
    if (e == QIO_OK) qio_qkv_free(&x);
}

/* A safetensors file with a hand-written header and `data_len` bytes. */
static void write_st_raw(const char *path, const char *header,
                         const void *data, size_t data_len) {
    size_t hl = strlen(header);
    unsigned char *buf = calloc(8 + hl + data_len + 1, 1);
    wr_le(buf, hl, 8);
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

/* A hand-written .npy (version 1 or 2) with the given dict text. */
static void write_npy_raw(const char *path, int version, const char *dict,
                          const void *data, size_t data_len) {
    size_t dl = strlen(dict), pre = version == 1 ? 10 : 12;
    unsigned char *buf = calloc(pre + dl + data_len + 1, 1);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)version;
    wr_le(buf + 8, dl, version == 1 ? 2 : 4);
    memcpy(buf + pre, dict, dl);
    if (data_len) memcpy(buf + pre + dl, data, data_len);
    write_bytes(path, buf, pre + dl + data_len);
    free(buf);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* ------------------------------------------------------------ conversions */
static void test_conversions(void) {
    const float exact16[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f,
                             5.9604644775390625e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof exact16 / sizeof exact16[0]; ++i) {
        float x = exact16[i];
        CHECK(qio_f16_to_f32(qio_f32_to_f16(x)) == x, "f16 round trip %g", x);
    }
    CHECK(qio_f32_to_f16(65520.0f) == 0x7C00, "f16 overflow to inf");
    CHECK(qio_f32_to_f16(1.0f + 1.0f / 2048) == 0x3C00, "f16 tie to even down");
    CHECK(qio_f32_to_f16(1.0f + 3.0f / 2048) == 0x3C02, "f16 tie to even up");
    CHECK(qio_f32_to_f16(2.9802322387695312e-08f) == 0, "f16 2^-25 ties to 0");
    CHECK(qio_f32_to_f16(4.4703483581542969e-08f) == 1, "f16 1.5*2^-25 -> 1");
    CHECK(isnan(qio_f16_to_f32(qio_f32_to_f16(NAN))), "f16 NaN");
    CHECK(qio_f16_to_f32(0x7C00) == INFINITY, "f16 inf decode");
    CHECK(qio_f32_to_bf16(1.0f) == 0x3F80, "bf16 1");
    CHECK(qio_f32_to_bf16(1.0f + 1.0f / 256) == 0x3F80, "bf16 tie to even");
    CHECK(qio_bf16_to_f32(0xC0A0) == -5.0f, "bf16 decode");
    CHECK(isnan(qio_bf16_to_f32(qio_f32_to_bf16(NAN))), "bf16 NaN");
}

/* ------------------------------------------------------------ round trips */
static void roundtrip_st(int rank, const int64_t *sq, const int64_t *skv,
                         qva_dtype a, qva_dtype b, qva_dtype c,
                         const char *name) {
    trio t;
    qio_qkv x;
    qio_error err;
    trio_make(&t, rank, sq, skv, a, b, c);
    const char *path = tmp_path(name);
    CHECK(trio_write_st(&t, path) == QIO_OK, "%s: write", name);
    qio_err e = qio_load_qkv(path, &x, &err);
    CHECK(e == QIO_OK, "%s: load: %s", name, err.msg);
    if (e == QIO_OK) {
        trio_check(&t, &x, name);
        CHECK(!strcmp(x.format, "safetensors"), "%s: format", name);
        qio_qkv_free(&x);
    }
    trio_free(&t);
}

static void test_safetensors_roundtrip(void) {
    int64_t hnd[3] = {2, 5, 64}, bhnd[4] = {2, 3, 7, 128}, bhnd_q[4] = {2, 3, 4, 128};
    roundtrip_st(3, hnd, hnd, QVA_F32, QVA_F32, QVA_F32, "f32_hnd.safetensors");
    roundtrip_st(4, bhnd, bhnd, QVA_BF16, QVA_BF16, QVA_BF16, "bf16_bhnd.safetensors");
    roundtrip_st(3, hnd, hnd, QVA_F16, QVA_F16, QVA_F16, "f16_hnd.safetensors");
    roundtrip_st(4, bhnd_q, bhnd, QVA_F16, QVA_BF16, QVA_F32, "mixed_nq.safetensors");
}

/* Whitespace, key order, metadata and an extra tensor are all tolerated. */
static void test_safetensors_liberal(void) {
    const char *path = tmp_path("liberal.safetensors");
    float data[3 * 64 + 2];
    for (int i = 0; i < 3 * 64 + 2; ++i) data[i] = (float)i;
    const char *hdr =
        " \n{ \"extra\" : {\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[768,776]},"
        "\t\"v\": {\"data_offsets\": [512, 768], \"shape\": [1, 1, 64], \"dtype\": \"F32\"},"
        "\"__metadata__\" : {\"format\": \"pt\", \"nested\\\"\": \"\\u00e9\"},"
        "\"\\u0071\" : {\"shape\":[1,1,64],\"dtype\":\"F32\",\"data_offsets\":[0,256],"
        "\"note\":[1,{\"x\":null},true,-1.5e3]},"
        "\"k\":{\"dtype\":\"F32\",\"shape\":[1,1,64],\"data_offsets\":[256,512]}}   ";
    write_st_raw(path, hdr, data, sizeof data);
    qio_qkv x;
    qio_error err;
    qio_err e = qio_load_qkv(path, &x, &err);
    CHECK(e == QIO_OK, "liberal header: %s", err.msg);
    if (e) return;
    CHECK(x.q[3] == 3.0f && x.k[0] == 64.0f && x.v[63] == 191.0f, "liberal data");
    qio_qkv_free(&x);
}

static void npy_write_trio(const trio *t, const char *pq, const char *pk,
                           const char *pv) {
    const char *p[3] = {pq, pk, pv};
    for (int i = 0; i < 3; ++i) {
        qio_tensor_desc d = trio_desc(t, i);
        qio_error err;
        CHECK(qio_write_npy(p[i], &d, &err) == QIO_OK, "npy write: %s", err.msg);
    }
}

static void test_npy_roundtrip(void) {
    int64_t hnd[3] = {3, 9, 64}, bhnd[4] = {1, 2, 6, 128};
    trio t;
    qio_qkv x;
    qio_error err;
    /* a directory of q.npy, k.npy, v.npy */
    trio_make(&t, 3, hnd, hnd, QVA_F32, QVA_F16, QVA_F32);
    npy_write_trio(&t, tmp_path("q.npy"), tmp_path("k.npy"), tmp_path("v.npy"));
    CHECK(qio_load_qkv(g_dir, &x, &err) == QIO_OK, "npy dir: %s", err.msg);
    if (!err.code) {
        trio_check(&t, &x, "npy dir");
        CHECK(!strcmp(x.format, "npy"), "npy format");
        qio_qkv_free(&x);
    }
    trio_free(&t);
    /* a comma-separated list, [B,H,N,D], f16 */
    trio_make(&t, 4, bhnd, bhnd, QVA_F16, QVA_F16, QVA_F16);
    char list[512];
    const char *a = tmp_path("a.npy"), *b = tmp_path("b.npy"), *c = tmp_path("c.npy");
    npy_write_trio(&t, a, b, c);
    snprintf(list, sizeof list, "%s,%s,%s", a, b, c);
    CHECK(qio_load_qkv(list, &x, &err) == QIO_OK, "npy list: %s", err.msg);
    if (!err.code) {
        trio_check(&t, &x, "npy list");
        qio_qkv_free(&x);
    }
    trio_free(&t);
}

/* A version-2 header with double quotes, Python-2 longs and odd spacing. */
static void test_npy_v2(void) {
    float data[64];
    for (int i = 0; i < 64; ++i) data[i] = (float)i;
    const char *p[3] = {tmp_path("v2q.npy"), tmp_path("v2k.npy"), tmp_path("v2v.npy")};
    for (int i = 0; i < 3; ++i)
        write_npy_raw(p[i], 2,
                      "{ \"shape\" : (1L,1L,64L) , 'fortran_order':False,"
                      "'descr':'<f4' }   \n",
                      data, sizeof data);
    qio_qkv x;
    qio_error err;
    CHECK(qio_load_npy_trio(p, &x, &err) == QIO_OK, "npy v2: %s", err.msg);
    if (!err.code) {
        CHECK(x.v[63] == 63.0f && x.N == 1 && x.H == 1, "npy v2 data");
        qio_qkv_free(&x);
    }
}

/* ------------------------------------------------------------ malformed */
static const char *st_case(const char *name, const char *hdr, size_t data_len) {
    static float zeros[2 * 128 * 2];
    const char *path = tmp_path(name);
    write_st_raw(path, hdr, zeros, data_len);
    return path;
}

#define ENT(n, dt, shape, a, b)                                               \
    "\"" n "\":{\"dtype\":\"" dt "\",\"shape\":" shape                        \
    ",\"data_offsets\":[" #a "," #b "]}"

static void test_st_malformed(void) {
    const char *p;
    /* a valid file [1,2,64] F32 to truncate */
    int64_t s[3] = {1, 2, 64};
    trio t;
    trio_make(&t, 3, s, s, QVA_F32, QVA_F32, QVA_F32);
    p = tmp_path("trunc.safetensors");
    trio_write_st(&t, p);
    size_t n;
    unsigned char *whole = slurp(p, &n);
    write_bytes(p, whole, n - 100);
    expect_fail(p, QIO_E_TRUNCATED, "truncated", "truncated data");
    write_bytes(p, whole, 40);
    expect_fail(p, QIO_E_TRUNCATED, "header length", "truncated header");
    write_bytes(p, whole, 5);
    expect_fail(p, QIO_E_TRUNCATED, "8-byte", "shorter than the length field");
    free(whole);
    trio_free(&t);

    p = st_case("badjson.safetensors", "{\"q\" {\"dtype\":\"F32\"}}", 0);
    expect_fail(p, QIO_E_JSON, "expected ':'", "bad JSON");
    p = st_case("trailing.safetensors", "{} x", 0);
    expect_fail(p, QIO_E_JSON, "trailing", "trailing garbage");

    unsigned char absurd[16] = {0, 0, 0, 0, 0, 0, 0, 0x10, '{', '}'};
    p = tmp_path("absurd.safetensors");
    write_bytes(p, absurd, sizeof absurd);
    expect_fail(p, QIO_E_HEADER, "absurd", "header length absurd");

    p = st_case("range.safetensors",
                "{" ENT("q", "F32", "[1,64]", 0, 256) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_RANK, "rank 2", "rank 2");
    p = st_case("offsets.safetensors",
                "{" ENT("q", "F32", "[1,1,64]", 0, 999999) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_OFFSETS, "999999", "offsets out of range");
    p = st_case("reversed.safetensors",
                "{" ENT("q", "F32", "[1,1,64]", 256, 0) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_OFFSETS, "end before", "offsets reversed");
    p = st_case("dtmismatch.safetensors",
                "{" ENT("q", "F16", "[1,1,64]", 0, 256) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_OFFSETS, "F16 [1,1,64] needs 128", "dtype x shape mismatch");
    p = st_case("unkdtype.safetensors",
                "{" ENT("q", "Q7", "[1,1,64]", 0, 256) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_DTYPE, "unknown dtype 'Q7'", "unknown dtype");
    p = st_case("f64.safetensors",
                "{" ENT("q", "F64", "[1,1,64]", 0, 512) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 512);
    expect_fail(p, QIO_E_DTYPE, "F64 not supported", "unsupported dtype");
    p = st_case("missingk.safetensors",
                "{" ENT("q", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_MISSING, "'k'", "missing k");
    p = st_case("kvshape.safetensors",
                "{" ENT("q", "F32", "[1,1,64]", 0, 256) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,2,64]", 0, 512) "}", 512);
    expect_fail(p, QIO_E_SHAPE, "different shapes", "k/v shape mismatch");
    p = st_case("qshape.safetensors",
                "{" ENT("q", "F32", "[2,1,64]", 0, 512) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 512);
    expect_fail(p, QIO_E_SHAPE, "does not match k", "q/k head mismatch");
    p = st_case("n0.safetensors",
                "{" ENT("q", "F32", "[1,0,64]", 0, 0) ","
                ENT("k", "F32", "[1,0,64]", 0, 0) ","
                ENT("v", "F32", "[1,0,64]", 0, 0) "}", 0);
    expect_fail(p, QIO_E_EMPTY, "N = 0", "N = 0");
    p = st_case("d96.safetensors",
                "{" ENT("q", "F32", "[1,1,96]", 0, 384) ","
                ENT("k", "F32", "[1,1,96]", 0, 384) ","
                ENT("v", "F32", "[1,1,96]", 0, 384) "}", 384);
    expect_fail(p, QIO_E_HEAD_DIM, "head dim D=96 not supported: 64 or 128", "D = 96");
    p = st_case("dupq.safetensors",
                "{" ENT("q", "F32", "[1,1,64]", 0, 256) ","
                ENT("q", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_JSON, "twice", "duplicate q");
    p = st_case("nodtype.safetensors",
                "{\"q\":{\"shape\":[1,1,64],\"data_offsets\":[0,256]}}", 256);
    expect_fail(p, QIO_E_JSON, "lacks \"dtype\"", "entry without dtype");
    p = st_case("hugedim.safetensors",
                "{" ENT("q", "F32", "[1,4294967296,64]", 0, 256) ","
                ENT("k", "F32", "[1,1,64]", 0, 256) ","
                ENT("v", "F32", "[1,1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_SHAPE, "out of range", "dimension too large");
    p = st_case("neg.safetensors",
                "{" ENT("q", "F32", "[1,-1,64]", 0, 256) "}", 256);
    expect_fail(p, QIO_E_JSON, "negative", "negative dimension");
}

static void test_st_nonfinite(void) {
    int64_t s[3] = {2, 3, 64};
    trio t;
    trio_make(&t, 3, s, s, QVA_F32, QVA_BF16, QVA_F16);
    t.data[2][64 * 4 + 5] = NAN; /* v: h=1, n=1, d=5 */
    const char *p = tmp_path("nan.safetensors");
    trio_write_st(&t, p);
    expect_fail(p, QIO_E_NONFINITE, "'v' has NaN at [b=0,h=1,n=1,d=5]", "NaN in v");
    t.data[2][64 * 4 + 5] = 0.0f;
    t.data[0][7] = 1e6f; /* finite in f32 ... */
    t.dt[0] = QVA_F16;   /* ... but Inf once written as f16 */
    trio_write_st(&t, p);
    expect_fail(p, QIO_E_NONFINITE, "'q' has +Inf", "Inf in q (f16 overflow)");
    trio_free(&t);
}

/* Deep nesting must be refused, not recursed into without bound. */
static void test_st_deep(void) {
    char hdr[2048];
    size_t n = 0;
    n += (size_t)snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"x\":");
    for (int i = 0; i < 500; ++i) hdr[n++] = '[';
    for (int i = 0; i < 500; ++i) hdr[n++] = ']';
    memcpy(hdr + n, "}}", 3);
    const char *p = st_case("deep.safetensors", hdr, 0);
    expect_fail(p, QIO_E_JSON, "too deep", "deep nesting");
}

static void npy_case_trio(const char *bad, char *list, size_t len) {
    float data[64] = {0};
    const char *q = tmp_path("okq.npy"), *k = tmp_path("okk.npy");
    const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 64), }";
    write_npy_raw(q, 1, d, data, sizeof data);
    write_npy_raw(k, 1, d, data, sizeof data);
    snprintf(list, len, "%s,%s,%s", q, k, bad);
}

static void test_npy_malformed(void) {
    float data[64] = {0};
    char list[512];
    const char *p = tmp_path("fortran.npy");
    write_npy_raw(p, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1, 64), }",
                  data, sizeof data);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_ORDER, "fortran_order", "fortran order");

    p = tmp_path("magic.npy");
    write_bytes(p, "\x93NUMPZ\x01\x00\x10\x00{}", 12);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_MAGIC, "bad magic", "bad npy magic");

    unsigned char longhdr[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff};
    p = tmp_path("longhdr.npy");
    write_bytes(p, longhdr, sizeof longhdr);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_HEADER, "too long", "npy header too long");

    p = tmp_path("bf16.npy");
    write_npy_raw(p, 1, "{'descr': '<V2', 'fortran_order': False, 'shape': (1, 1, 64), }",
                  data, 128);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_DTYPE, "bfloat16", "npy bf16");

    p = tmp_path("big.npy");
    write_npy_raw(p, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1, 1, 64), }",
                  data, sizeof data);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_DTYPE, "big-endian", "npy big-endian");

    p = tmp_path("short.npy");
    write_npy_raw(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 64), }",
                  data, 100);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_TRUNCATED, "needs 256 data bytes, 100 present", "npy truncated");

    p = tmp_path("nodescr.npy");
    write_npy_raw(p, 1, "{'fortran_order': False, 'shape': (1, 1, 64), }", data, sizeof data);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_HEADER, "lacks 'descr'", "npy without descr");

    p = tmp_path("d96.npy");
    write_npy_raw(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 96), }",
                  data, sizeof data);
    npy_case_trio(p, list, sizeof list);
    expect_fail(list, QIO_E_HEAD_DIM, "D=96", "npy D = 96");

    expect_fail(tmp_path("okq.npy"), QIO_E_ARG, "single .npy", "one npy file");
    expect_fail("/nonexistent/x.safetensors", QIO_E_OPEN, "cannot open", "missing file");
    expect_fail("a.npy,b.npy", QIO_E_ARG, "three", "two paths");
    snprintf(list, sizeof list, "%s,%s,/nonexistent/v.npy", tmp_path("okq.npy"),
             tmp_path("okk.npy"));
    expect_fail(list, QIO_E_OPEN, "/nonexistent/v.npy", "missing v.npy");
}

/* ------------------------------------------------------------ fuzz */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Every prefix and many single-byte mutations of a valid file must load or
 * fail cleanly (the CHECK is that we get here; ASAN checks the reads). */
static void fuzz_file(const char *valid, const char *scratch, const char *fmt_list) {
    size_t n;
    unsigned char *orig = slurp(valid, &n), *buf = malloc(n);
    uint64_t seed = 12345;
    char input[512];
    int fails = 0;
    snprintf(input, sizeof input, fmt_list, scratch);
    for (size_t cut = 0; cut < n; cut += cut < 300 ? 1 : 97) {
        write_bytes(scratch, orig, cut);
        qio_qkv x;
        qio_error err;
        if (qio_load_qkv(input, &x, &err) == QIO_OK) qio_qkv_free(&x);
        else ++fails;
    }
    for (int it = 0; it < 3000; ++it) {
        memcpy(buf, orig, n);
        int flips = 1 + (int)(rng_next(&seed) % 4);
        for (int f = 0; f < flips; ++f) {
            size_t at = (size_t)(rng_next(&seed) % (n < 400 ? n : 400));
            buf[at] = (unsigned char)rng_next(&seed);
        }
        write_bytes(scratch, buf, n);
        qio_qkv x;
        qio_error err;
        if (qio_load_qkv(input, &x, &err) == QIO_OK) qio_qkv_free(&x);
        else {
            ++fails;
            CHECK(err.msg[0] != '\0', "fuzz: failure without message");
        }
    }
    CHECK(fails > 0, "fuzz of %s: every mutation loaded", valid);
    free(orig);
    free(buf);
}

static void test_fuzz(void) {
    int64_t s[3] = {1, 3, 64};
    trio t;
    trio_make(&t, 3, s, s, QVA_BF16, QVA_F32, QVA_F16);
    const char *st = tmp_path("fuzz_src.safetensors");
    trio_write_st(&t, st);
    fuzz_file(st, tmp_path("fuzz.safetensors"), "%s");
    qio_tensor_desc d = trio_desc(&t, 2);
    const char *np = tmp_path("fuzz_src.npy");
    qio_error err;
    qio_write_npy(np, &d, &err);
    char fmt[512];
    snprintf(fmt, sizeof fmt, "%s,%s,%%s", np, np);
    fuzz_file(np, tmp_path("fuzz.npy"), fmt);
    trio_free(&t);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/qvattn-io-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_conversions();
    test_safetensors_roundtrip();
    test_safetensors_liberal();
    test_npy_roundtrip();
    test_npy_v2();
    test_st_malformed();
    test_st_nonfinite();
    test_st_deep();
    test_npy_malformed();
    test_fuzz();
    cleanup();
    return check_summary("test_io");
}
