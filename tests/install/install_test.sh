#!/usr/bin/env bash
# The C packages, as a user meets them (CTest `install`):
#   1. `cmake --install` of the build to a temporary prefix: the layout;
#   2. app.c against it through pkg-config, shared (`--cflags --libs`);
#   3. ... and static (`--static`, with libqvattn.a; no libqvattn.so NEEDED);
#   4. ... through find_package(qvattn) in a CMake project (this folder's
#      CMakeLists.txt): qvattn::qvattn and qvattn::qvattn_static;
#   5. the source tree through add_subdirectory() in the same project, with
#      CUDA off (a CPU build of the library takes seconds; with CUDA it takes
#      minutes); where the build has CUDA, the add_subdirectory project is
#      also configured with CUDA on.  QVA_INSTALL_TEST_SUBDIR_CUDA=1 builds
#      and runs that one too.
# app.c calls only what works without a GPU (the CPU attention), so this
# runs on CUDA builds on machines without one.
#
#   install_test.sh BUILD_DIR SOURCE_DIR CMAKE CC PKG_CONFIG HAVE_CUDA
# (PKG_CONFIG may be empty: steps 2 and 3 are then skipped, and said so.)
set -euo pipefail

BUILD=$1 SRC=$2 CMAKE=$3 CC=$4 PKG_CONFIG=${5:-} HAVE_CUDA=${6:-0}
HERE="$SRC/tests/install"
T=$(mktemp -d /tmp/qvattn-install-XXXXXX)
trap 'rm -rf "$T"' EXIT
P="$T/prefix"
T0=$(date +%s.%N)
STEP_T0=$T0

step_done() { # NAME
    local now
    now=$(date +%s.%N)
    awk -v a="$STEP_T0" -v b="$now" -v n="$1" 'BEGIN { printf "ok   %s (%.1f s)\n", n, b - a }'
    STEP_T0=$now
}
fail() { echo "FAIL $*" >&2; exit 1; }
# quiet CMD...: runs CMD, its output shown only if it fails
quiet() {
    "$@" >"$T/log" 2>&1 || { cat "$T/log" >&2; fail "$*"; }
}
# needs_lib BINARY yes|no: whether BINARY has libqvattn.so.0 as NEEDED
needs_lib() {
    local got=no
    if readelf -d "$1" | grep -q 'NEEDED.*\[libqvattn\.so\.0\]'; then got=yes; fi
    [ "$got" = "$2" ] || fail "$1: libqvattn.so.0 NEEDED: $got (expected $2)"
}
run_app() { # BINARY [LD_LIBRARY_PATH]
    local out
    out=$(LD_LIBRARY_PATH="${2:-}" "$1" 2>&1) || { echo "$out" >&2; fail "$1"; }
    echo "     $(basename "$1"): $out"
}

# ---- 1. install and layout
quiet "$CMAKE" --install "$BUILD" --prefix "$P"
PC=$(find "$P" -name qvattn.pc)
[ -n "$PC" ] || fail "no qvattn.pc under the prefix"
PCDIR=$(dirname "$PC")
LIBDIR=$(dirname "$PCDIR")
for f in "$P/include/qvattn.h" "$LIBDIR/libqvattn.a" "$LIBDIR/libqvattn.so" \
         "$LIBDIR/cmake/qvattn/qvattn-config.cmake" \
         "$LIBDIR/cmake/qvattn/qvattn-config-version.cmake"; do
    [ -e "$f" ] || fail "not installed: ${f#"$P"/}"
done
REAL=$(readlink -f "$LIBDIR/libqvattn.so")
case "$(basename "$REAL")" in
    libqvattn.so.*.*.*) ;;
    *) fail "libqvattn.so points at $(basename "$REAL"), not a versioned file" ;;
esac
SONAME=$(readelf -d "$REAL" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$SONAME" = libqvattn.so.0 ] || fail "SONAME '$SONAME', expected libqvattn.so.0"
[ -e "$LIBDIR/$SONAME" ] || fail "no $SONAME link"
step_done "install: $(cd "$P" && find . -type f -o -type l | sed 's|^\./||' | sort | tr '\n' ' ')"

# ---- 2, 3. pkg-config
if [ -n "$PKG_CONFIG" ]; then
    export PKG_CONFIG_PATH="$PCDIR"
    VER=$("$PKG_CONFIG" --modversion qvattn)
    echo "     pkg-config: qvattn $VER; --static --libs: $("$PKG_CONFIG" --static --libs qvattn)"
    # shellcheck disable=SC2046
    quiet "$CC" -std=c11 -o "$T/app-pc-shared" "$HERE/app.c" $("$PKG_CONFIG" --cflags --libs qvattn)
    needs_lib "$T/app-pc-shared" yes
    run_app "$T/app-pc-shared" "$LIBDIR"
    step_done "pkg-config, shared"
    # The README's static line: libqvattn.a by name, then Libs.private.
    # shellcheck disable=SC2046
    quiet "$CC" -std=c11 -o "$T/app-pc-static" "$HERE/app.c" $("$PKG_CONFIG" --cflags qvattn) \
        $("$PKG_CONFIG" --static --libs qvattn | sed 's/-lqvattn\b/-l:libqvattn.a/')
    needs_lib "$T/app-pc-static" no
    run_app "$T/app-pc-static"
    step_done "pkg-config --static"
else
    echo "SKIP pkg-config steps: no pkg-config found"
fi

# ---- 4. find_package
quiet "$CMAKE" -S "$HERE" -B "$T/fp" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$CC" \
    -DCMAKE_BUILD_TYPE=Release
quiet "$CMAKE" --build "$T/fp" -j 2
needs_lib "$T/fp/app_shared" yes
needs_lib "$T/fp/app_static" no
run_app "$T/fp/app_shared"
run_app "$T/fp/app_static"
step_done "find_package(qvattn): qvattn::qvattn, qvattn::qvattn_static"

# ---- 5. add_subdirectory
SUBCUDA=OFF
[ "${QVA_INSTALL_TEST_SUBDIR_CUDA:-0}" = 1 ] && [ "$HAVE_CUDA" = 1 ] && SUBCUDA=ON
if [ "$HAVE_CUDA" = 1 ] && [ "$SUBCUDA" = OFF ]; then
    quiet "$CMAKE" -S "$HERE" -B "$T/sub-cuda" -DQVATTN_SOURCE_DIR="$SRC" -DQVA_CUDA=ON \
        -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Release
    grep -q '^CMAKE_CUDA_COMPILER:' "$T/sub-cuda/CMakeCache.txt" ||
        fail "add_subdirectory with QVA_CUDA=ON did not enable CUDA"
    step_done "add_subdirectory, CUDA on: configured and generated"
fi
quiet "$CMAKE" -S "$HERE" -B "$T/sub" -DQVATTN_SOURCE_DIR="$SRC" -DQVA_CUDA=$SUBCUDA \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Release
quiet "$CMAKE" --build "$T/sub" -j 2
needs_lib "$T/sub/app_shared" yes
needs_lib "$T/sub/app_static" no
run_app "$T/sub/app_shared"
run_app "$T/sub/app_static"
step_done "add_subdirectory, CUDA $SUBCUDA: built and ran"

awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "install test: all steps passed in %.1f s\n", b - a }'
