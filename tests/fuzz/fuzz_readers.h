/*
 * The fuzz target of the CLI's file readers (fuzz_readers.c) as the
 * mutation driver (fuzz_driver.c) sees it.  libFuzzer needs only
 * LLVMFuzzerTestOneInput.
 */
#ifndef QVA_FUZZ_READERS_H
#define QVA_FUZZ_READERS_H

#include <stddef.h>
#include <stdint.h>

#include "io/io.h"

/* Bytes starting with the .npy magic are one to three .npy files laid end to
 * end (1: q = k = v, 2: q then k = v, 3: q, k, v); anything else is one
 * safetensors file.  Returns 0; a broken invariant aborts. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* How the target splits an input into .npy files: the number of files
 * (0: not .npy, a safetensors input) and where file i spans
 * [cut[i], cut[i+1]). */
int fuzz_npy_files(const uint8_t *data, size_t size, size_t cut[4]);

/* Outcomes so far: [QIO_OK] loads, [code] rejections by code. */
typedef struct fuzz_counts {
    long st[QIO_E_WRITE + 1];
    long npy[QIO_E_WRITE + 1];
} fuzz_counts;

const fuzz_counts *fuzz_readers_counts(void);

/* What the last input gave: "loaded ..." or "<code>: <message>". */
const char *fuzz_readers_last(void);

#endif /* QVA_FUZZ_READERS_H */
