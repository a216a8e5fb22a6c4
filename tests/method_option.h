/*
 * The parse / name / reset checks every method suffix option gets, and
 * the C API's check of a config set by hand (used by test_codesum.c,
 * test_v2.c and test_i8pv.c; include after check.h and qvattn.h).
 */
#ifndef QVATTN_TEST_METHOD_OPTION_H
#define QVATTN_TEST_METHOD_OPTION_H

#include <stddef.h>
#include <string.h>

/* The qva_config int at byte offset `field`. */
static int option_field(const qva_config *c, size_t field) {
    return *(const int *)((const char *)c + field);
}

/* Each of ok[] parses with the field set to value, names itself with
 * suffix and parses back from that name, and "fp8" (no option defaults on)
 * afterwards resets the field to reset; each of bad[] is QVA_ERR_PARSE. */
static void check_method_option(const char *const *ok, size_t nok, const char *const *bad,
                                size_t nbad, size_t field, int value, int reset,
                                const char *suffix) {
    for (size_t i = 0; i < nok; ++i) {
        qva_config c;
        qva_config_default(&c);
        CHECK(qva_config_set_method(&c, ok[i]) == QVA_OK, "%s: %s", ok[i], qva_last_error());
        CHECK(option_field(&c, field) == value, "%s sets the option", ok[i]);
        char name[96];
        CHECK(qva_config_method_name(&c, name, sizeof name) == QVA_OK && strstr(name, suffix),
              "%s names itself %s", ok[i], name);
        qva_config back;
        qva_config_default(&back);
        CHECK(qva_config_set_method(&back, name) == QVA_OK && option_field(&back, field) == value,
              "%s round trip", name);
        CHECK(qva_config_set_method(&c, "fp8") == QVA_OK && option_field(&c, field) == reset,
              "%s then fp8 resets the option", ok[i]);
    }
    for (size_t i = 0; i < nbad; ++i) {
        qva_config c;
        qva_config_default(&c);
        CHECK(qva_config_set_method(&c, bad[i]) == QVA_ERR_PARSE, "%s refused", bad[i]);
    }
}

/* What the C API's call check (qva_attention_check) says of cfg, on a
 * small f32 CPU call (B 1, H 2, N 128, D 64): for configs set field by
 * field, past the method-name parser. */
static qva_status option_call_check(const qva_config *cfg) {
    static float x[2 * 128 * 64];
    const qva_tensor t = qva_tensor_hnd(x, QVA_F32, QVA_DEVICE_CPU, 1, 2, 128, 64);
    return qva_attention_check(QVA_DEVICE_CPU, cfg, &t, &t, &t, NULL, NULL);
}

#endif
