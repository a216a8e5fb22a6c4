#!/usr/bin/env bash
# libFuzzer on the CLI's file readers: builds tests/fuzz/fuzz_readers.c with
# clang -fsanitize=fuzzer,address,undefined (whatever compiler CMake uses)
# and runs it on a work copy of the seed corpus, so the committed corpus
# stays as it is.
#
#   tests/fuzz/libfuzzer.sh [LIBFUZZER FLAGS...]    default: -runs=200000
#   tests/fuzz/libfuzzer.sh -max_total_time=600 -jobs=2 -workers=2
#   tests/fuzz/libfuzzer.sh build-fuzz/crash-...    replays one input
#
# Needs clang with its runtime (Debian: apt-get install clang
# libclang-rt-14-dev, or the clang package alone on older releases).
# Output, new inputs and crash-* files go to $OUT (default build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/../.."
CC=${CC:-clang}
OUT=${OUT:-build-fuzz}
mkdir -p "$OUT/corpus"
"$CC" -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Iinclude -Itools tests/fuzz/fuzz_readers.c tools/io/*.c -lm \
    -o "$OUT/fuzz_readers_libfuzzer"
if [ $# -eq 1 ] && [ -f "$1" ]; then
    exec "$OUT/fuzz_readers_libfuzzer" "$1"
fi
[ $# -gt 0 ] || set -- -runs=200000
exec "$OUT/fuzz_readers_libfuzzer" -dict=tests/fuzz/readers.dict -max_len=8192 \
    -artifact_prefix="$OUT/" "$@" "$OUT/corpus" tests/fuzz/corpus
