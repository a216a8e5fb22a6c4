/* The thread-local error message every qva_ call leaves, and the status
 * names.  The lowest layer: it calls nothing else of the library. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

/* ------------------------------------------------------------ errors */
static _Thread_local char last_error[512];

qva_status qvi_fail(qva_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

void qvi_clear_error(void) { last_error[0] = 0; }
const char *qva_last_error(void) { return last_error; }

const char *qva_status_string(qva_status s) {
    switch (s) {
    case QVA_OK: return "ok";
    case QVA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case QVA_ERR_SHAPE: return "shape mismatch";
    case QVA_ERR_DTYPE: return "unsupported dtype";
    case QVA_ERR_UNSUPPORTED: return "unsupported on this backend";
    case QVA_ERR_OUT_OF_MEMORY: return "out of memory";
    case QVA_ERR_NONFINITE: return "non-finite input";
    case QVA_ERR_DEVICE: return "device error";
    case QVA_ERR_PARSE: return "parse error";
    case QVA_ERR_IO: return "i/o error";
    }
    return "unknown status";
}

