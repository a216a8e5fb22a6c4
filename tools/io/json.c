/*
 * The JSON the safetensors header needs: a minimal parser (a cursor over
 * the header text) and a growable string to write one.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ parsing */
qio_err jp_fail(jp *p, const char *what) {
    return fail(p->err, QIO_E_JSON, "header JSON: %s at byte %zu", what, p->i);
}

void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        ++p->i;
}

int jp_peek(jp *p) {
    jp_ws(p);
    return p->i < p->n ? (unsigned char)p->s[p->i] : -1;
}

qio_err jp_lit(jp *p, char c) {
    char what[32];
    if (jp_peek(p) != (unsigned char)c) {
        snprintf(what, sizeof what, "expected '%c'", c);
        return jp_fail(p, what);
    }
    ++p->i;
    return QIO_OK;
}

/* After an element of an object or array: 1 on ',', 0 on the closer. */
qio_err jp_next(jp *p, char closer, int *more) {
    int c = jp_peek(p);
    if (c == ',' || c == (unsigned char)closer) {
        ++p->i;
        *more = c == ',';
        return QIO_OK;
    }
    char what[40];
    snprintf(what, sizeof what, "expected ',' or '%c'", closer);
    return jp_fail(p, what);
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* \uXXXX: the names we look for are ASCII, so other code points only need
 * to stay distinct from them ('?'). */
static qio_err jp_unicode(jp *p, char *out) {
    if (p->n - p->i < 4) return jp_fail(p, "truncated \\u escape");
    unsigned code = 0;
    for (int k = 0; k < 4; ++k) {
        int h = hexval((unsigned char)p->s[p->i++]);
        if (h < 0) return jp_fail(p, "bad \\u escape");
        code = code * 16 + (unsigned)h;
    }
    *out = code > 0 && code < 0x80 ? (char)code : '?';
    return QIO_OK;
}

static qio_err jp_escape(jp *p, char *out) {
    if (p->i >= p->n) return jp_fail(p, "unterminated string");
    char e = p->s[p->i++];
    switch (e) {
    case '"': case '\\': case '/': *out = e; return QIO_OK;
    case 'b': *out = '\b'; return QIO_OK;
    case 'f': *out = '\f'; return QIO_OK;
    case 'n': *out = '\n'; return QIO_OK;
    case 'r': *out = '\r'; return QIO_OK;
    case 't': *out = '\t'; return QIO_OK;
    case 'u': return jp_unicode(p, out);
    default: return jp_fail(p, "bad escape in string");
    }
}

/* Reads a string into buf (cap >= 1), truncating long ones: a truncated
 * name is longer than every name we compare with, so it never matches. */
qio_err jp_string(jp *p, char *buf, size_t cap) {
    size_t len = 0;
    qio_err e = jp_lit(p, '"');
    if (e) return e;
    for (;;) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        char c = p->s[p->i++];
        if (c == '"') break;
        if ((unsigned char)c < 0x20) return jp_fail(p, "control character in string");
        if (c == '\\' && (e = jp_escape(p, &c)) != QIO_OK) return e;
        if (len + 1 < cap) buf[len++] = c;
    }
    buf[len] = '\0';
    return QIO_OK;
}

/* A non-negative integer no larger than 2^53 (what JSON writers keep
 * exact); fractions, exponents and signs are errors. */
qio_err jp_uint(jp *p, uint64_t *out) {
    int c = jp_peek(p);
    if (c == '-') return jp_fail(p, "negative number");
    if (c < '0' || c > '9') return jp_fail(p, "expected a non-negative integer");
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (v > (1ull << 53)) return jp_fail(p, "integer too large");
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' ||
                        p->s[p->i] == 'E'))
        return jp_fail(p, "expected an integer, found a fraction");
    *out = v;
    return QIO_OK;
}

static qio_err jp_skip_container(jp *p, int depth, char closer) {
    char key[8];
    int more = 1;
    ++p->i; /* the opener */
    if (jp_peek(p) == (unsigned char)closer) {
        ++p->i;
        return QIO_OK;
    }
    while (more) {
        qio_err e;
        if (closer == '}' && ((e = jp_string(p, key, sizeof key)) ||
                              (e = jp_lit(p, ':'))))
            return e;
        if ((e = jp_skip(p, depth + 1)) || (e = jp_next(p, closer, &more)))
            return e;
    }
    return QIO_OK;
}

static qio_err jp_skip_word(jp *p, const char *w) {
    size_t len = strlen(w);
    if (p->n - p->i < len || memcmp(p->s + p->i, w, len) != 0)
        return jp_fail(p, "unexpected token");
    p->i += len;
    return QIO_OK;
}

static qio_err jp_skip_number(jp *p) {
    size_t start = p->i;
    while (p->i < p->n && strchr("+-0123456789.eE", p->s[p->i]) &&
           p->s[p->i] != '\0')
        ++p->i;
    return p->i > start ? QIO_OK : jp_fail(p, "bad number");
}

/* Skips any JSON value (depth-limited: a fuzzer's [[[[... must not blow
 * the stack). */
qio_err jp_skip(jp *p, int depth) {
    char scratch[8];
    if (depth > QIO_JSON_MAX_DEPTH) return jp_fail(p, "nesting too deep");
    int c = jp_peek(p);
    switch (c) {
    case '{': return jp_skip_container(p, depth, '}');
    case '[': return jp_skip_container(p, depth, ']');
    case '"': return jp_string(p, scratch, sizeof scratch);
    case 't': return jp_skip_word(p, "true");
    case 'f': return jp_skip_word(p, "false");
    case 'n': return jp_skip_word(p, "null");
    case -1: return jp_fail(p, "unexpected end of header");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return jp_skip_number(p);
        return jp_fail(p, "unexpected character");
    }
}

/* ------------------------------------------------------------ writing */
static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

void sb_json_str(sbuf *b, const char *s) {
    sb_str(b, "\"");
    for (; *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            sb_fmt(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\"");
}

