/*
 * Fuzz target for the CLI's file readers (tools/io/): one input goes to
 * disk as the CLI would meet it and through qio_load_qkv, the call the CLI
 * makes.  Whatever the bytes, the result must be one of
 *   - a load: q, k, v present, shapes the library can run (B, H, N, Nq > 0,
 *     D 64 or 128), every value finite, no more data than the file holds,
 *     and the tensors survive a write and a reload bit for bit;
 *   - a rejection: a code that names a file problem, a one-line message
 *     (no control characters: it goes to a terminal), and out zeroed.
 * Anything else aborts; ASan/UBSan report crashes, leaks and UB.
 *
 * Built two ways (tests/fuzz/README.md): with libFuzzer (clang
 * -fsanitize=fuzzer) and with fuzz_driver.c, a deterministic mutation
 * driver that CI runs under gcc's ASan/UBSan.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "fuzz_readers.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const unsigned char NPY_MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static fuzz_counts g_counts;
static char g_last[600];
static char g_dir[256];
/* the input file(s) and the round-trip file */
static char g_st[300], g_npy[3][300], g_rt[300];

const fuzz_counts *fuzz_readers_counts(void) { return &g_counts; }
const char *fuzz_readers_last(void) { return g_last; }

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz_readers: invariant broken: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

#define REQUIRE(cond, ...) \
    do {                   \
        if (!(cond)) die(__VA_ARGS__); \
    } while (0)

static void cleanup(void) {
    unlink(g_st);
    unlink(g_rt);
    for (int i = 0; i < 3; ++i) unlink(g_npy[i]);
    rmdir(g_dir);
}

static void init_once(void) {
    if (g_dir[0]) return;
    /* $TMPDIR, else /dev/shm where there is one (memory: each input is
     * written to a file, and a disk makes that the slow part), else /tmp */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) >= 200)
        tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/qvattn-fuzz-XXXXXX", tmp);
    REQUIRE(mkdtemp(g_dir) != NULL, "cannot make a temp dir under %s", g_dir);
    snprintf(g_st, sizeof g_st, "%s/in.safetensors", g_dir);
    snprintf(g_rt, sizeof g_rt, "%s/rt.safetensors", g_dir);
    for (int i = 0; i < 3; ++i)
        snprintf(g_npy[i], sizeof g_npy[i], "%s/%c.npy", g_dir, "qkv"[i]);
    atexit(cleanup);
}

/* A new file each time: rewriting one in place (O_TRUNC) makes ext4 flush
 * it to disk on close (auto_da_alloc), 30x slower. */
static void write_file_bytes(const char *path, const uint8_t *p, size_t n) {
    unlink(path);
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL, "cannot create %s", path);
    REQUIRE(n == 0 || fwrite(p, 1, n, f) == n, "cannot write %s", path);
    REQUIRE(fclose(f) == 0, "cannot close %s", path);
}

/* Start of the next .npy magic at or after `from`, or size. */
static size_t next_magic(const uint8_t *d, size_t size, size_t from) {
    for (size_t i = from; i + sizeof NPY_MAGIC <= size; ++i)
        if (d[i] == NPY_MAGIC[0] && !memcmp(d + i, NPY_MAGIC, sizeof NPY_MAGIC))
            return i;
    return size;
}

int fuzz_npy_files(const uint8_t *data, size_t size, size_t cut[4]) {
    int files = 1;
    if (size < sizeof NPY_MAGIC || memcmp(data, NPY_MAGIC, sizeof NPY_MAGIC))
        return 0;
    cut[0] = 0;
    while (files < 3 &&
           (cut[files] = next_magic(data, size, cut[files - 1] + 1)) < size)
        ++files;
    cut[files] = size;
    return files;
}

static int all_zero(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i)
        if (b[i]) return 0;
    return 1;
}

/* A rejection: a code naming a file problem, a one-line message, out zeroed. */
static void check_error(qio_err e, const qio_qkv *x, const qio_error *err,
                        int npy) {
    /* what a file's bytes may cause; ARG, OPEN, NOMEM and WRITE may not
     * (no input here can make the readers allocate past twice its size) */
    static const qio_err st_codes[] = {
        QIO_E_TRUNCATED, QIO_E_HEADER,  QIO_E_JSON,  QIO_E_OFFSETS,
        QIO_E_DTYPE,     QIO_E_RANK,    QIO_E_MISSING, QIO_E_SHAPE,
        QIO_E_EMPTY,     QIO_E_HEAD_DIM, QIO_E_NONFINITE};
    static const qio_err npy_codes[] = {
        QIO_E_TRUNCATED, QIO_E_MAGIC, QIO_E_HEADER,   QIO_E_DTYPE,
        QIO_E_RANK,      QIO_E_SHAPE, QIO_E_EMPTY,    QIO_E_HEAD_DIM,
        QIO_E_NONFINITE, QIO_E_ORDER};
    const qio_err *codes = npy ? npy_codes : st_codes;
    size_t ncodes = npy ? sizeof npy_codes / sizeof *npy_codes
                        : sizeof st_codes / sizeof *st_codes;
    int known = 0;
    for (size_t i = 0; i < ncodes; ++i) known |= codes[i] == e;
    REQUIRE(known, "%s reader returned code %d (%s): %s", npy ? "npy" : "safetensors",
            (int)e, qio_err_name(e), err->msg);
    REQUIRE(err->code == e, "err.code %d but the call returned %d", (int)err->code,
            (int)e);
    size_t len = strnlen(err->msg, sizeof err->msg);
    REQUIRE(len > 0 && len < sizeof err->msg, "message empty or unterminated");
    for (size_t i = 0; i < len; ++i) {
        unsigned char c = (unsigned char)err->msg[i];
        REQUIRE(c >= 0x20 && c != 0x7f,
                "control character 0x%02x at byte %zu of the message: %s", c, i,
                err->msg);
    }
    REQUIRE(all_zero(x, sizeof *x), "out not zeroed after a failed load (%s)",
            err->msg);
    g_counts.npy[e] += npy;
    g_counts.st[e] += !npy;
    snprintf(g_last, sizeof g_last, "%s: %s", qio_err_name(e), err->msg);
}

/* Writes what was loaded as F32 safetensors, reloads it: same bits. */
static void check_roundtrip(const qio_qkv *x) {
    qio_tensor_desc t[3];
    const float *data[3] = {x->q, x->k, x->v};
    qio_error err;
    qio_qkv y;
    for (int i = 0; i < 3; ++i) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].name = i == 0 ? "q" : i == 1 ? "k" : "v";
        t[i].dtype = QVA_F32;
        t[i].rank = 4;
        t[i].shape[0] = x->B;
        t[i].shape[1] = x->H;
        t[i].shape[2] = i ? x->N : x->Nq;
        t[i].shape[3] = x->D;
        t[i].data = data[i];
    }
    unlink(g_rt); /* a new file: see write_file_bytes */
    REQUIRE(qio_write_safetensors(g_rt, t, 3, NULL, 0, &err) == QIO_OK,
            "round trip: write: %s", err.msg);
    REQUIRE(qio_load_qkv(g_rt, &y, &err) == QIO_OK, "round trip: load: %s",
            err.msg);
    REQUIRE(y.B == x->B && y.H == x->H && y.Nq == x->Nq && y.N == x->N &&
                y.D == x->D,
            "round trip: shape changed");
    size_t nq = (size_t)(x->B * x->H * x->Nq * x->D),
           nkv = (size_t)(x->B * x->H * x->N * x->D);
    REQUIRE(!memcmp(y.q, x->q, nq * sizeof(float)) &&
                !memcmp(y.k, x->k, nkv * sizeof(float)) &&
                !memcmp(y.v, x->v, nkv * sizeof(float)),
            "round trip: data changed");
    qio_qkv_free(&y);
}

/* A load: shapes the library can run, finite data within the file's bytes. */
static void check_loaded(const qio_qkv *x, const qio_error *err, int npy,
                         size_t size) {
    REQUIRE(err->code == QIO_OK, "load succeeded with err.code %d", (int)err->code);
    REQUIRE(x->q && x->k && x->v, "load succeeded without buffers");
    REQUIRE(x->B > 0 && x->H > 0 && x->Nq > 0 && x->N > 0 &&
                (x->D == 64 || x->D == 128),
            "load succeeded with shape B=%lld H=%lld Nq=%lld N=%lld D=%lld",
            (long long)x->B, (long long)x->H, (long long)x->Nq, (long long)x->N,
            (long long)x->D);
    REQUIRE(x->format && !strcmp(x->format, npy ? "npy" : "safetensors"),
            "format '%s'", x->format ? x->format : "(null)");
    int64_t rows[3] = {x->Nq, x->N, x->N};
    const float *data[3] = {x->q, x->k, x->v};
    for (int i = 0; i < 3; ++i) {
        qva_dtype dt = x->file_dtype[i];
        REQUIRE(dt == QVA_F32 || dt == QVA_F16 || (dt == QVA_BF16 && !npy),
                "tensor %d: file dtype %d", i, (int)dt);
        /* every element read (ASan checks each buffer holds them all) */
        int64_t n = x->B * x->H * rows[i] * x->D;
        for (int64_t j = 0; j < n; ++j)
            REQUIRE(isfinite(data[i][j]), "tensor %d: element %lld not finite", i,
                    (long long)j);
        /* tensors may share bytes, but none holds more than the input */
        uint64_t bytes = (uint64_t)n * (dt == QVA_F32 ? 4u : 2u);
        REQUIRE(bytes <= size, "tensor %d: %llu data bytes from a %zu-byte input",
                i, (unsigned long long)bytes, size);
    }
    check_roundtrip(x);
    g_counts.npy[QIO_OK] += npy;
    g_counts.st[QIO_OK] += !npy;
    snprintf(g_last, sizeof g_last, "loaded %s B=%lld H=%lld Nq=%lld N=%lld D=%lld",
             x->format, (long long)x->B, (long long)x->H, (long long)x->Nq,
             (long long)x->N, (long long)x->D);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char input[3 * 300 + 3];
    qio_qkv x;
    qio_error err;
    size_t cut[4];
    int files = fuzz_npy_files(data, size, cut), npy = files > 0;
    init_once();
    if (!npy) {
        write_file_bytes(g_st, data, size);
        snprintf(input, sizeof input, "%s", g_st);
    } else {
        for (int i = 0; i < files; ++i)
            write_file_bytes(g_npy[i], data + cut[i], cut[i + 1] - cut[i]);
        if (files == 3) /* the directory form: DIR/{q,k,v}.npy */
            snprintf(input, sizeof input, "%s", g_dir);
        else /* the list form: Q,K,V */
            snprintf(input, sizeof input, "%s,%s,%s", g_npy[0],
                     g_npy[files - 1], g_npy[files - 1]);
    }
    memset(&x, 0xA5, sizeof x); /* the reader must set every field */
    qio_err e = qio_load_qkv(input, &x, &err);
    if (e == QIO_OK) {
        check_loaded(&x, &err, npy, size);
        qio_qkv_free(&x);
    } else {
        check_error(e, &x, &err, npy);
    }
    return 0;
}
