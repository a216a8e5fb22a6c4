/*
 * A deterministic mutation driver for the file-reader fuzz target
 * (fuzz_readers.c), so CI can fuzz with gcc's ASan/UBSan and no libFuzzer.
 *
 *   fuzz_readers_driver [-n COUNT] [-s SEED] [-i K [-o FILE]] [-c FILE]
 *                       [-m MAXLEN] [-t SEC] [-q] [-v] CORPUS...
 *
 * CORPUS are directories (every regular file in them, in name order) or
 * files.  Each seed runs once as it is, then COUNT mutated inputs: input K
 * depends only on SEED, K and the seeds, so `-i K` rebuilds it alone.
 * Half of the inputs are mutated blindly (bit flips, interesting integers,
 * inserts, deletes, splices); the other half edit only the header text of
 * a safetensors file or of one .npy and then rewrite its length field, so
 * they get past the length checks into the parsers and the data reads.
 *
 * A failing input (sanitizer report, broken invariant, time limit) is saved
 * to the -c file (default fuzz-crash.bin); `fuzz_readers_driver FILE`
 * replays it.  Exit status 0 when every input passed.
 */
#define _POSIX_C_SOURCE 200809L /* scandir, strnlen */

#include "fuzz_readers.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define QVA_FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QVA_FUZZ_ASAN 1
#endif
#endif
#ifdef QVA_FUZZ_ASAN
void __sanitizer_set_death_callback(void (*callback)(void));
#endif

/* gcc links ASan and UBSan as two runtimes, and the death callback set
 * below reaches only ASan's: UBSan is told to end with abort() instead,
 * which the SIGABRT handler below sees (the environment's UBSAN_OPTIONS
 * still win).  Unused without UBSan. */
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "abort_on_error=1"; }

/* ------------------------------------------------------------ seeds */
typedef struct seed {
    char name[256];
    unsigned char *p;
    size_t n;
} seed;

typedef struct seeds {
    seed *v;
    int count, cap;
} seeds;

static int add_file(seeds *s, const char *path, const char *name) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_readers_driver: cannot open %s\n", path);
        return -1;
    }
    unsigned char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            unsigned char *t = realloc(p, cap);
            if (!t) break;
            p = t;
        }
        size_t got = fread(p + n, 1, cap - n, f);
        if (!got) break;
        n += got;
    }
    fclose(f);
    if (s->count == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
        if (!s->v) abort();
    }
    seed *d = &s->v[s->count++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->p = p;
    d->n = n;
    return 0;
}

static int only_files(const struct dirent *e) { return e->d_name[0] != '.'; }

static int add_path(seeds *s, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz_readers_driver: no such corpus: %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return add_file(s, path, path);
    struct dirent **list;
    int n = scandir(path, &list, only_files, alphasort), rc = 0;
    if (n < 0) return -1;
    for (int i = 0; i < n; ++i) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, list[i]->d_name);
        if (!rc && stat(full, &st) == 0 && S_ISREG(st.st_mode))
            rc = add_file(s, full, list[i]->d_name);
        free(list[i]);
    }
    free(list);
    return rc;
}

/* ------------------------------------------------------------ random */
static uint64_t rnd(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); 0 when n is 0. */
static size_t below(uint64_t *s, size_t n) { return n ? (size_t)(rnd(s) % n) : 0; }

/* A span length, mostly short. */
static size_t span(uint64_t *r) { return 1 + below(r, below(r, 4) ? 8 : 128); }

/* ------------------------------------------------------------ buffers */
typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void b_insert(buf *b, size_t at, const void *src, size_t len) {
    unsigned char tmp[512];
    if (at > b->n) at = b->n;
    if (len > b->cap - b->n) len = b->cap - b->n;
    if (len > sizeof tmp) len = sizeof tmp;
    memcpy(tmp, src, len); /* src may lie inside b */
    memmove(b->p + at + len, b->p + at, b->n - at);
    memcpy(b->p + at, tmp, len);
    b->n += len;
}

static void b_erase(buf *b, size_t at, size_t len) {
    if (at >= b->n) return;
    if (len > b->n - at) len = b->n - at;
    memmove(b->p + at, b->p + at + len, b->n - at - len);
    b->n -= len;
}

static void b_replace(buf *b, size_t at, size_t len, const void *src, size_t slen) {
    b_erase(b, at, len);
    b_insert(b, at, src, slen);
}

static void put_le(buf *b, size_t at, uint64_t v, int width) {
    for (int i = 0; i < width && at + (size_t)i < b->n; ++i)
        b->p[at + (size_t)i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int width) {
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

/* ------------------------------------------------------------ dictionaries */
static const uint64_t INTS[] = {
    0, 1, 2, 3, 7, 8, 9, 15, 16, 63, 64, 65, 127, 128, 129, 255, 256, 1024,
    0x7fff, 0x8000, 0xffff, 0x10000, 0x7fffffff, 0x80000000u, 0xffffffffu,
    0x100000000ull, 100000000, 100000001, 1ull << 20, (1ull << 20) + 1,
    1ull << 40, 1ull << 53, (1ull << 53) + 1, 0x7fffffffffffffffull,
    0x8000000000000000ull, ~0ull,
    /* f32 and f16 specials, for the data */
    0x7f800000, 0xff800000u, 0x7fc00000, 0x7f7fffff, 0x7c00, 0xfc00, 0x7e00};
#define N_INTS (sizeof INTS / sizeof INTS[0])

static const char *const NUMBERS[] = {
    "0", "1", "2", "3", "63", "64", "65", "96", "127", "128", "129", "256",
    "00", "-0", "-1", "1.5", "1e3", "0x40", "64L", "+64", " 64",
    "2147483647", "2147483648", "4294967295", "4294967296", "1099511627776",
    "9007199254740991", "9007199254740992", "9007199254740993",
    "18446744073709551615", "18446744073709551616", "99999999999999999999999"};
#define N_NUMBERS (sizeof NUMBERS / sizeof NUMBERS[0])

static const char *const TOKENS[] = {
    "q", "k", "v", "dtype", "shape", "data_offsets", "__metadata__", "F32",
    "BF16", "F16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "descr",
    "fortran_order", "True", "False", "None", "<f4", "<f2", ">f4", "<f8", "|V2",
    "<bf16", "\\u0071", "\\u0000", "\\u001b", "\\\"", "\\", "\"\"", "''",
    "null", "true", "[]", "{}", "()", "(1,)", "[0,256]", "[1,1,64]",
    "(1, 1, 64)", ",", ":", "{", "}", "[", "]", "(", ")", "\"", "'", " ",
    "\n", "\x01", "\x1b", "\xff", "\xc3\xa9"};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static const unsigned char BYTES[] = {0,   1,   0x7f, 0x80, 0xff, ' ', '"',
                                      '\'', '{', '}',  '[',  ']',  '(', ')',
                                      ',', ':', '\\', '0',  '9',  '-', 'L'};

/* ------------------------------------------------------------ mutations */
/* Replaces one run of digits (one of the first 256 in the first 4 KB) with
 * an interesting number. */
static void op_number(buf *b, uint64_t *r) {
    size_t runs[256], nr = 0, lim = b->n < 4096 ? b->n : 4096;
    for (size_t i = 0; i < lim && nr < 256; ++i)
        if (b->p[i] >= '0' && b->p[i] <= '9' && (i == 0 || b->p[i - 1] < '0' || b->p[i - 1] > '9'))
            runs[nr++] = i;
    if (!nr) return;
    size_t at = runs[below(r, nr)], end = at;
    while (end < b->n && b->p[end] >= '0' && b->p[end] <= '9') ++end;
    const char *num = NUMBERS[below(r, N_NUMBERS)];
    b_replace(b, at, end - at, num, strlen(num));
}

/* Replaces the text of one quoted string with a token. */
static void op_string(buf *b, uint64_t *r) {
    size_t quotes[256], nq = 0, lim = b->n < 4096 ? b->n : 4096;
    for (size_t i = 0; i < lim && nq < 256; ++i)
        if (b->p[i] == '"' || b->p[i] == '\'') quotes[nq++] = i;
    if (!nq) return;
    size_t at = quotes[below(r, nq)] + 1, end = at;
    while (end < b->n && end - at < 64 && b->p[end] != b->p[at - 1]) ++end;
    const char *t = TOKENS[below(r, N_TOKENS)];
    b_replace(b, at, end - at, t, strlen(t));
}

static void op_token(buf *b, uint64_t *r) {
    const char *t = TOKENS[below(r, N_TOKENS)];
    b_insert(b, below(r, b->n + 1), t, strlen(t));
}

static void op_duplicate(buf *b, uint64_t *r) {
    if (!b->n) return;
    size_t from = below(r, b->n), len = span(r);
    if (len > b->n - from) len = b->n - from;
    b_insert(b, below(r, b->n + 1), b->p + from, len);
}

/* Edits that make sense in header text (and anywhere else). */
static void mutate_text(buf *b, uint64_t *r) {
    unsigned char c;
    switch (below(r, 8)) {
    case 0: case 1: op_number(b, r); break;
    case 2: case 3: op_string(b, r); break;
    case 4: op_token(b, r); break;
    case 5: b_erase(b, below(r, b->n), span(r)); break;
    case 6: op_duplicate(b, r); break;
    default:
        c = BYTES[below(r, sizeof BYTES)];
        if (b->n) b->p[below(r, b->n)] = c;
        break;
    }
}

/* An interesting integer in a length or version field of the format. */
static void op_header_int(buf *b, uint64_t *r) {
    size_t cut[4];
    int files = fuzz_npy_files(b->p, b->n, cut);
    uint64_t v = INTS[below(r, N_INTS)];
    if (!files) {
        if (b->n < 8) return;
        if (below(r, 2)) v = (below(r, 2) ? get_le(b->p, 8) : b->n - 8) + below(r, 5) - 2;
        put_le(b, 0, v, 8);
        return;
    }
    size_t at = cut[below(r, (size_t)files)];
    if (below(r, 3) == 0) {
        static const unsigned char versions[] = {0, 1, 2, 3, 4, 255};
        put_le(b, at + 6, versions[below(r, sizeof versions)], 1);
        return;
    }
    int width = at + 6 < b->n && b->p[at + 6] == 1 ? 2 : 4;
    if (below(r, 2) && at + 8 + (size_t)width <= b->n)
        v = get_le(b->p + at + 8, width) + below(r, 5) - 2;
    put_le(b, at + 8, v, width);
}

/* Anything, anywhere. */
static void mutate_blind(buf *b, const seeds *s, uint64_t *r) {
    const seed *o;
    size_t at = below(r, b->n), len;
    unsigned char tmp[64];
    switch (below(r, 12)) {
    case 0: if (b->n) b->p[at] ^= (unsigned char)(1u << below(r, 8)); break;
    case 1: if (b->n) b->p[at] = (unsigned char)rnd(r); break;
    case 2: if (b->n) b->p[at] = BYTES[below(r, sizeof BYTES)]; break;
    case 3: put_le(b, at, INTS[below(r, N_INTS)], 1 << below(r, 4)); break;
    case 4: op_header_int(b, r); break;
    case 5:
        len = span(r) % sizeof tmp;
        for (size_t i = 0; i < len; ++i) tmp[i] = (unsigned char)rnd(r);
        b_insert(b, below(r, b->n + 1), tmp, len);
        break;
    case 6: b_erase(b, at, span(r)); break;
    case 7: op_duplicate(b, r); break;
    case 8: /* splice: our head, another seed's tail */
        o = &s->v[below(r, (size_t)s->count)];
        len = below(r, o->n + 1);
        b->n = below(r, b->n + 1);
        while (len < o->n && b->n < b->cap) {
            size_t part = o->n - len < 512 ? o->n - len : 512;
            b_insert(b, b->n, o->p + len, part);
            len += part;
        }
        break;
    case 9: /* a piece of another seed */
        o = &s->v[below(r, (size_t)s->count)];
        if (o->n) {
            size_t from = below(r, o->n);
            len = span(r);
            b_insert(b, below(r, b->n + 1), o->p + from,
                     len < o->n - from ? len : o->n - from);
        }
        break;
    case 10: b->n = below(r, b->n + 1); break; /* truncate */
    default: mutate_text(b, r); break;
    }
}

/* Header text of the input (safetensors, or one .npy of it) as a span. */
static int header_span(const buf *b, uint64_t *r, size_t *len_at, int *width,
                       size_t *start, size_t *len) {
    size_t cut[4];
    int files = fuzz_npy_files(b->p, b->n, cut);
    if (!files) {
        if (b->n < 8) return 0;
        *len_at = 0;
        *width = 8;
    } else {
        int f = (int)below(r, (size_t)files);
        if (cut[f + 1] - cut[f] < 12) return 0;
        *len_at = cut[f] + 8;
        *width = b->p[cut[f] + 6] == 1 ? 2 : 4;
    }
    *start = *len_at + (size_t)*width;
    *len = (size_t)get_le(b->p + *len_at, *width);
    return *len <= b->n - *start;
}

/* Edits the header text only, then sets the length field to match (the
 * data bytes after the header stay as they were, unless also hit). */
static int mutate_header(buf *b, uint64_t *r) {
    size_t len_at, start, len;
    int width;
    if (!header_span(b, r, &len_at, &width, &start, &len)) return 0;
    size_t rest = b->n - start - len;
    buf h = {b->p + start, len, b->cap - start - rest};
    memmove(b->p + b->cap - rest, b->p + start + len, rest); /* park the tail */
    for (int i = 1 + (int)below(r, 4); i > 0; --i) mutate_text(&h, r);
    memmove(b->p + start + h.n, b->p + b->cap - rest, rest);
    len = h.n;
    b->n = start + len + rest;
    if (width == 8 || len < (1ull << (8 * width))) put_le(b, len_at, len, width);
    if (below(r, 8) == 0) { /* and the data: NaN, Inf, or cut short */
        if (below(r, 2)) b->n -= below(r, rest + 1);
        else if (rest >= 4)
            put_le(b, start + len + below(r, rest - 3), INTS[N_INTS - 7 + below(r, 7)],
                   below(r, 2) ? 4 : 2);
    }
    return 1;
}

/* Input k: a copy of one seed with 1 to 8 stacked mutations. */
static void make_input(const seeds *s, uint64_t seed_val, uint64_t k, buf *b) {
    uint64_t r = seed_val * 0x2545F4914F6CDD1Dull ^ (k + 1) * 0x9E3779B97F4A7C15ull;
    rnd(&r);
    const seed *src = &s->v[below(&r, (size_t)s->count)];
    b->n = src->n < b->cap ? src->n : b->cap;
    memcpy(b->p, src->p, b->n);
    int structured = below(&r, 2) == 0;
    int ops = 1 + (int)below(&r, (size_t)1 << below(&r, 4));
    for (int i = 0; i < ops; ++i)
        if (!structured || !mutate_header(b, &r)) mutate_blind(b, s, &r);
}

/* ------------------------------------------------------------ failures */
static const unsigned char *g_cur;
static size_t g_cur_n;
static char g_cur_label[320];
static const char *g_crash_path = "fuzz-crash.bin";

static void say(const char *s) {
    ssize_t rc = write(2, s, strlen(s));
    (void)rc;
}

/* Saves the input being run (called as the process dies). */
static void save_current(void) {
    char msg[1024];
    if (!g_cur) return;
    int fd = open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write(fd, g_cur, g_cur_n) == (ssize_t)g_cur_n;
    if (fd >= 0) close(fd);
    snprintf(msg, sizeof msg,
             "fuzz_readers_driver: failing input: %s (%zu bytes)%s%s\n"
             "  replay: fuzz_readers_driver -n 0 %s\n",
             g_cur_label, g_cur_n, ok ? ", saved to " : ", could not save it to ",
             g_crash_path, g_crash_path);
    say(msg);
    g_cur = NULL;
}

static void on_signal(int sig) {
    save_current();
    if (sig == SIGALRM) {
        say("fuzz_readers_driver: time limit per input passed (a hang)\n");
        _exit(70);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run_one(const unsigned char *p, size_t n, const char *label,
                    unsigned limit_s) {
    g_cur = p;
    g_cur_n = n;
    snprintf(g_cur_label, sizeof g_cur_label, "%s", label);
    alarm(limit_s);
    LLVMFuzzerTestOneInput(p, n);
    alarm(0);
    g_cur = NULL;
}

/* ------------------------------------------------------------ main */
static long loads(void) {
    const fuzz_counts *c = fuzz_readers_counts();
    return c->st[QIO_OK] + c->npy[QIO_OK];
}

static void print_counts(const char *what, const long *c) {
    long total = 0;
    for (int e = 0; e <= QIO_E_WRITE; ++e) total += c[e];
    printf("  %-11s %7ld inputs: %ld loaded; rejected:", what, total, c[QIO_OK]);
    for (int e = 1; e <= QIO_E_WRITE; ++e)
        if (c[e]) printf(" %s %ld", qio_err_name((qio_err)e), c[e]);
    printf("\n");
}

static int usage(void) {
    fprintf(stderr,
            "usage: fuzz_readers_driver [-n COUNT] [-s SEED] [-i K [-o FILE]] "
            "[-c FILE] [-m MAXLEN] [-t SEC] [-q] [-v] CORPUS...\n"
            "  -n COUNT  mutated inputs after the seeds (default 20000)\n"
            "  -s SEED   seed of the mutations (default 1)\n"
            "  -i K      run only mutated input K; -o FILE writes it instead\n"
            "  -c FILE   where a failing input is saved (default fuzz-crash.bin)\n"
            "  -m MAXLEN longest input (default 8192)\n"
            "  -t SEC    time limit per input (default 10)\n"
            "  -q        no summary\n"
            "  -v        what each seed (or the -i input) gave\n");
    return 2;
}

static int parse_u64(const char *s, uint64_t *v) {
    char *end;
    if (!s || !*s || *s == '-') return -1;
    *v = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

int main(int argc, char **argv) {
    uint64_t count = 20000, seed_val = 1, only = 0, maxlen = 8192, limit_s = 10;
    int have_only = 0, quiet = 0, verbose = 0, opt;
    const char *dump = NULL;
    while ((opt = getopt(argc, argv, "n:s:i:o:c:m:t:qv")) != -1) {
        int bad = 0;
        switch (opt) {
        case 'n': bad = parse_u64(optarg, &count); break;
        case 's': bad = parse_u64(optarg, &seed_val); break;
        case 'i': bad = parse_u64(optarg, &only); have_only = 1; break;
        case 'o': dump = optarg; break;
        case 'c': g_crash_path = optarg; break;
        case 'm': bad = parse_u64(optarg, &maxlen) || maxlen < 16 || maxlen > (1u << 24); break;
        case 't': bad = parse_u64(optarg, &limit_s) || limit_s > 3600; break;
        case 'q': quiet = 1; break;
        case 'v': verbose = 1; break;
        default: return usage();
        }
        if (bad) return usage();
    }
    if (optind >= argc || (dump && !have_only)) return usage();
    seeds s = {0};
    for (int i = optind; i < argc; ++i)
        if (add_path(&s, argv[i]) != 0) return 2;
    if (!s.count) {
        fprintf(stderr, "fuzz_readers_driver: no seeds in the corpus\n");
        return 2;
    }
    buf b = {malloc(maxlen), 0, maxlen};
    if (!b.p) return 2;
#ifdef QVA_FUZZ_ASAN
    __sanitizer_set_death_callback(save_current);
#else
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
#endif
    signal(SIGABRT, on_signal);
    signal(SIGALRM, on_signal);

    char label[320];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t ran = 0;
    int wrong = 0;
    if (have_only) {
        make_input(&s, seed_val, only, &b);
        if (dump) {
            FILE *f = fopen(dump, "wb");
            int ok = f && fwrite(b.p, 1, b.n, f) == b.n;
            if (f && fclose(f) != 0) ok = 0;
            if (!ok) fprintf(stderr, "fuzz_readers_driver: cannot write %s\n", dump);
            return ok ? 0 : 1;
        }
        snprintf(label, sizeof label, "mutation %llu of seed %llu",
                 (unsigned long long)only, (unsigned long long)seed_val);
        run_one(b.p, b.n, label, (unsigned)limit_s);
        if (verbose) printf("%s: %s\n", label, fuzz_readers_last());
        ran = 1;
    } else {
        for (int i = 0; i < s.count; ++i, ++ran) {
            snprintf(label, sizeof label, "seed %s", s.v[i].name);
            long before = loads();
            run_one(s.v[i].p, s.v[i].n, label, (unsigned)limit_s);
            /* a seed named *-ok-* must load, *-bad-* must not */
            int loaded = loads() > before;
            if (verbose) printf("%-40s %s\n", s.v[i].name, fuzz_readers_last());
            if ((strstr(s.v[i].name, "-ok-") && !loaded) ||
                (strstr(s.v[i].name, "-bad-") && loaded)) {
                fprintf(stderr, "fuzz_readers_driver: seed %s was %s\n",
                        s.v[i].name, loaded ? "loaded" : "rejected");
                ++wrong;
            }
        }
        for (uint64_t k = 0; k < count; ++k, ++ran) {
            make_input(&s, seed_val, k, &b);
            snprintf(label, sizeof label,
                     "mutation %llu (reproduce: -s %llu -i %llu)",
                     (unsigned long long)k, (unsigned long long)seed_val,
                     (unsigned long long)k);
            run_one(b.p, b.n, label, (unsigned)limit_s);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!quiet) {
        const fuzz_counts *c = fuzz_readers_counts();
        printf("fuzz_readers_driver: %llu inputs (%d seeds + %llu mutations, seed "
               "%llu) in %.2f s, %.0f/s, %s\n",
               (unsigned long long)ran, have_only ? 0 : s.count,
               (unsigned long long)(have_only ? 1 : count),
               (unsigned long long)seed_val, secs, secs > 0 ? (double)ran / secs : 0.0,
               wrong ? "seeds misnamed or readers changed" : "all passed");
        print_counts("safetensors", c->st);
        print_counts("npy", c->npy);
        fflush(stdout); /* before LeakSanitizer's report ends the process */
    }
    for (int i = 0; i < s.count; ++i) free(s.v[i].p);
    free(s.v);
    free(b.p);
    return wrong ? 1 : 0;
}
