/*
 * The named synthetic workloads (docs/SYNTHETIC.md): each a spec that
 * qva_synthetic_generate (generate.c) turns into Q, K and V.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------ presets */
#define VIDEO QVA_SYN_VIDEO
#define GLOBAL QVA_SYN_GLOBAL
#define LOCAL QVA_SYN_LOCAL_CLUSTERED
#define MIXED QVA_SYN_MIXED
static const qva_synthetic_spec PRESETS[] = {
    /* name                   B  H   D   T   H   W  prefix seed  recipe */
    {"tiny",                  1, 2,  64,  2,  8,  8,   0, 0x7131A11ULL, VIDEO},
    {"small",                 1, 2, 128,  3, 12, 16,   0, 0x5A11ULL, VIDEO},
    {"wan-small",             1, 2, 128,  4, 16, 24,   0, 0x3A7500ULL, VIDEO},
    {"wan-small-prefix",      1, 2, 128,  4, 16, 24,  64, 0x3A7564ULL, VIDEO},
    {"wan2.2-720p",           1, 40, 128, 21, 45, 80,  0, 0x3A72207ULL, VIDEO},
    {"longcat-480p",          1, 32, 128, 24, 30, 52,  0, 0x10C4A7ULL, VIDEO},
    {"hunyuan-720p",          1, 16, 128, 31, 45, 80, 100, 0x4B7E7ULL, VIDEO},
    /* issue 15's two situations, small enough for the CPU reference */
    {"video-global",          1, 2, 128,  4, 20, 32,   0, 0x610BA1ULL, GLOBAL},
    {"video-global-d64",      1, 2,  64,  4, 20, 32,   0, 0x610BA64ULL, GLOBAL},
    {"video-local-clustered", 1, 2, 128,  4, 20, 32,   0, 0x10CA1ULL, LOCAL},
    {"video-mixed",           1, 4, 128,  4, 20, 32,   0, 0x3B1EDULL, MIXED},
};
#undef VIDEO
#undef GLOBAL
#undef LOCAL
#undef MIXED
#define NPRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

int qva_synthetic_preset_count(void) { return NPRESETS; }

const char *qva_synthetic_preset_name(int i) {
    return (i >= 0 && i < NPRESETS) ? PRESETS[i].name : NULL;
}

/* Writes "tiny, small, ..." into buf for error messages. */
static void preset_list(char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < NPRESETS && used + 1 < len; ++i) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                         PRESETS[i].name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

qva_status qva_synthetic_preset(const char *name, qva_synthetic_spec *spec) {
    char list[512];
    preset_list(list, sizeof list);
    if (!name)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "synthetic preset name is NULL; presets: %s", list);
    if (!spec)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "spec is NULL");
    for (int i = 0; i < NPRESETS; ++i) {
        if (strcmp(name, PRESETS[i].name) == 0) {
            *spec = PRESETS[i];
            return QVA_OK;
        }
    }
    return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                    "unknown synthetic preset '%s'; presets: %s", name, list);
}
