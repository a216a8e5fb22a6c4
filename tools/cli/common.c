/*
 * Messages, timing and option parsing shared by every command.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* ------------------------------------------------------------ messages */
static const char *g_cmd = "qvattn"; /* subcommand, for "try --help" */

void cli_set_command(const char *name) {
    static char label[64];
    snprintf(label, sizeof label, "qvattn %s", name);
    g_cmd = label;
}

/* Prints one message to stderr; usage errors end by pointing at --help. */
static int report(int rc, const char *fmt, va_list ap) {
    fputs(rc == RC_USAGE ? "qvattn: " : "qvattn: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    if (rc == RC_USAGE) fprintf(stderr, "\nTry '%s --help'.\n", g_cmd);
    else fputc('\n', stderr);
    return rc;
}

int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = report(RC_USAGE, fmt, ap);
    va_end(ap);
    return rc;
}

int runtime_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = report(RC_RUNTIME, fmt, ap);
    va_end(ap);
    return rc;
}

int lib_error(qva_status st, const char *what) {
    return runtime_error("%s: %s: %s", what, qva_status_string(st),
                         qva_last_error());
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ------------------------------------------------------------ options */
void opts_init(opts *o) {
    memset(o, 0, sizeof *o);
    o->prefix = o->layer = o->step = o->steps = UNSET;
    o->heads = o->query_sample = o->iters = UNSET;
}

/* Strict decimal int: an optional '-' and digits, the whole string (no
 * blank, '+' or hex).  1 and *v if it is an int (> INT_MIN, which is
 * UNSET), 0 if it is no integer, -1 if it is one outside that range. */
static int parse_int(const char *s, int *v) {
    char *end;
    if (!s || !isdigit((unsigned char)(s[0] == '-' ? s[1] : s[0]))) return 0;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end) return 0;
    if (errno == ERANGE || x < INT_MIN + 1 || x > INT_MAX) return -1;
    *v = (int)x;
    return 1;
}

static const opt_spec *find_opt(const opt_spec *specs, const char *name,
                                size_t len) {
    for (const opt_spec *s = specs; s->name; ++s)
        if (strlen(s->name) == len && !strncmp(s->name, name, len)) return s;
    return NULL;
}

static int set_opt(opts *o, const opt_spec *s, const char *val) {
    char *base = (char *)o + s->off;
    if (s->kind == OPT_STR) {
        memcpy(base, &val, sizeof val);
        return RC_OK;
    }
    int v, r = parse_int(val, &v);
    if (r < 0)
        return usage_error("--%s %s does not fit an int (at most %d in magnitude)",
                           s->name, val, INT_MAX);
    if (!r) return usage_error("--%s expects an integer, got '%s'", s->name, val);
    memcpy(base, &v, sizeof v);
    return RC_OK;
}

/* One argument at argv[*i] ("--name", "--name=value" or "--name value"). */
static int parse_one(int argc, char **argv, int *i, const opt_spec *specs,
                     opts *o) {
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) != 0) return usage_error("unexpected argument '%s'", a);
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const opt_spec *s = find_opt(specs, name, len);
    if (!s) return usage_error("unknown option '%.*s' for '%s'", (int)len + 2, a, g_cmd);
    if (s->kind == OPT_FLAG) {
        if (eq) return usage_error("--%s takes no value", s->name);
        int one = 1;
        memcpy((char *)o + s->off, &one, sizeof one);
        return RC_OK;
    }
    const char *val = eq ? eq + 1 : NULL;
    if (!val) {
        if (*i + 1 >= argc) return usage_error("--%s needs a value", s->name);
        val = argv[++*i];
    }
    return set_opt(o, s, val);
}

/* Parses argv[2..]; RC_HELP after printing `help` for --help. */
int parse_opts(int argc, char **argv, const opt_spec *specs, const char *help,
               opts *o) {
    opts_init(o);
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RC_HELP;
        }
        int rc = parse_one(argc, argv, &i, specs, o);
        if (rc) return rc;
    }
    return RC_OK;
}

/* "a,b,c" of ints in [lo, hi] into v; count <= max. */
int parse_int_list(const char *s, const char *what, int lo, int hi, int *v,
                   int max, int *count) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--%s: list too long", what);
    strcpy(buf, s);
    *count = 0;
    for (char *tok = buf, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        int x, r = parse_int(tok, &x);
        if (!r) return usage_error("--%s: '%s' is not an integer", what, tok);
        if (r < 0 || x < lo || x > hi)
            return usage_error("--%s: %s is outside [%d, %d]", what, tok, lo, hi);
        if (*count >= max) return usage_error("--%s: more than %d entries", what, max);
        v[(*count)++] = x;
    }
    return RC_OK;
}

int opt_or(int v, int dflt) { return v == UNSET ? dflt : v; }
