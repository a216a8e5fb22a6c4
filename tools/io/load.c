/*
 * qio_load_qkv: tells from the input string which reader it needs (a
 * comma-separated .npy trio, a directory of .npy files or a safetensors
 * file).
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define QIO_PATH_MAX 4096

/* "a,b,c" -> three paths (each non-empty). */
static qio_err split_trio(const char *input, char buf[3][QIO_PATH_MAX],
                          qio_error *err) {
    const char *s = input;
    for (int i = 0; i < 3; ++i) {
        const char *end = i < 2 ? strchr(s, ',') : s + strlen(s);
        if (!end || end == s || (size_t)(end - s) >= QIO_PATH_MAX ||
            (i == 2 && strchr(s, ',')))
            return fail(err, QIO_E_ARG,
                        "input '%s': expected three comma-separated .npy "
                        "paths q,k,v",
                        input);
        memcpy(buf[i], s, (size_t)(end - s));
        buf[i][end - s] = '\0';
        s = end + 1;
    }
    return QIO_OK;
}

static qio_err load_trio_paths(char buf[3][QIO_PATH_MAX], qio_qkv *out,
                               qio_error *err) {
    const char *p[3] = {buf[0], buf[1], buf[2]};
    return qio_load_npy_trio(p, out, err);
}

static int starts_with_npy_magic(const char *path) {
    unsigned char b[6] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(b, 1, 6, f);
    fclose(f);
    return got == 6 && !memcmp(b, "\x93NUMPY", 6);
}

qio_err qio_load_qkv(const char *input, qio_qkv *out, qio_error *err) {
    char buf[3][QIO_PATH_MAX];
    struct stat st;
    clear_error(err);
    if (!input || !*input || !out) return fail(err, QIO_E_ARG, "no input given");
    memset(out, 0, sizeof *out);
    if (strchr(input, ',')) {
        qio_err e = split_trio(input, buf, err);
        return e ? e : load_trio_paths(buf, out, err);
    }
    if (stat(input, &st) != 0)
        return fail(err, QIO_E_OPEN, "%s: cannot open: %s", input,
                    strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        for (int i = 0; i < 3; ++i)
            if (snprintf(buf[i], QIO_PATH_MAX, "%s/%s.npy", input,
                         QKV_NAMES[i]) >= QIO_PATH_MAX)
                return fail(err, QIO_E_ARG, "directory path too long");
        return load_trio_paths(buf, out, err);
    }
    if (starts_with_npy_magic(input))
        return fail(err, QIO_E_ARG,
                    "%s: a single .npy holds one tensor; pass "
                    "q.npy,k.npy,v.npy or a directory holding them",
                    input);
    return qio_load_safetensors(input, out, err);
}
