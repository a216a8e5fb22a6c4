#!/usr/bin/env bash
# Two builds of qvattn compared on a CUDA machine, from the repo root:
#
#   bash scripts/compare-builds.sh BASE_SRC [hash|speed|both|checks|ncu|all] [ROUNDS]
#
# BASE_SRC is a source tree of the earlier commit (e.g. `git archive <rev> |
# tar -x -C .base`); its test_backend is built from this tree's
# tests/test_backend.c, whose hash mode needs only the public API.
#   hash   `test_backend hash` on both builds: a 64-bit hash of every CUDA
#          output and LSE of every (case, method); the two lists must match
#          line for line (kernel names in the [why] column may differ)
#   speed  bench/compare.py on Wan2.2-720p for sage8, vc8+expcast and
#          draft@85/0/0/15 (and draft@70/10/10/10, the mma.sync draft kernel
#          with an NVFP4 phase), the two builds alternating ROUNDS times (default
#          2), each run with its own cuDNN baseline; the medians of the
#          full-call ratios to cuDNN are compared (METHODS=a,b,c overrides the list)
#   checks the new build's device tests: cuda_test_codes, cuda_test_ops,
#          cuda_test_draft and `test_backend test`
#   ncu    Nsight Compute time, DRAM and issue share of the kernels matching
#          NCU_KERNELS (a regex, required) in both builds' `qvattn bench`
#          at NCU_SHAPE (default 1,40,75600,128) with NCU_METHODS (default
#          vc8+expcast) and NCU_ARGS (e.g. "--grid 21,45,80" for draft)
#   timeline  bench/idle_gaps.py --timeline for both builds with
#          TIMELINE_METHODS (default vc8+expcast,draft@85/0/7.5/7.5+expcast):
#          each call's kernels with start, end and stream (the preparation
#          as it runs back to back, where ncu times kernels alone)
#   both   hash and speed (the default); all: hash, checks, ncu (when
#          NCU_KERNELS is set), timeline and speed
# Logs and JSON go to $OUT (default ./out).  On the lent device machine,
# where at most 8 files come back, pack everything into the machine's
# $OUT and write the logs elsewhere: `PACK_TO=$OUT OUT=/tmp/cb bash ...`
# (in that order: in `OUT=/tmp/cb PACK_TO=$OUT` bash expands $OUT after
# the first assignment, so both name /tmp/cb and nothing comes back).
# Carrying BASE_SRC again replaces the machine's copy, its build with it.
# PREBUILT=1 skips both builds: the binaries the steps use (libqvattn.so*,
# test_backend, qvattn and, for checks, cuda_test_*) are already in
# BASE_SRC/build-gpu and build-gpu, e.g. built off the device with the same
# flags and unpacked there, so the lent machine spends no time compiling.
# Exit status non-zero if the hashes differ or a check fails.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
[ $# -ge 1 ] || { sed -n '2,35p' "$0"; exit 2; }
BASE=$(cd "$1" && pwd) || exit 2
WHAT=${2:-both}
ROUNDS=${3:-2}
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
JOBS=${JOBS:-16}
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if ! command -v nvcc >/dev/null 2>&1 && [ -x "$d/nvcc" ]; then export PATH="$PATH:$d"; fi
done

has() { # does WHAT include step $1
    case "$WHAT" in
        all) true ;;
        both) [ "$1" = hash ] || [ "$1" = speed ] ;;
        *) [ "$WHAT" = "$1" ] ;;
    esac
}
build() { # src dir, name, extra targets...
    local src=$1 name=$2
    shift 2
    if [ -n "${PREBUILT:-}" ]; then
        [ -x "$src/build-gpu/test_backend" ] || { echo "compare-builds: PREBUILT, but no $src/build-gpu/test_backend"; return 1; }
        return 0
    fi
    cmake -S "$src" -B "$src/build-gpu" -DCMAKE_BUILD_TYPE=Release -DQVA_CUDA=ON >"$OUT/build-$name.log" 2>&1 &&
        cmake --build "$src/build-gpu" -j "$JOBS" --target qvattn_shared test_backend qvattn "$@" \
            >>"$OUT/build-$name.log" 2>&1
}
cp tests/test_backend.c "$BASE/tests/test_backend.c"
build "$BASE" base || { echo "compare-builds: base build failed ($OUT/build-base.log)"; exit 1; }
NEW_TESTS=""
has checks && NEW_TESTS="cuda_test_codes cuda_test_ops cuda_test_draft"
# shellcheck disable=SC2086  # the test names are words
build "$ROOT" new $NEW_TESTS || { echo "compare-builds: new build failed ($OUT/build-new.log)"; exit 1; }

rc=0
if has hash; then
    "$BASE/build-gpu/test_backend" hash >"$OUT/hash-base.txt" 2>&1
    "$ROOT/build-gpu/test_backend" hash >"$OUT/hash-new.txt" 2>&1
    strip() { sed -E 's/  \[.*\]$//' "$1" | grep '^hash '; }
    n=$(strip "$OUT/hash-new.txt" | wc -l)
    if [ "$n" -gt 0 ] && diff <(strip "$OUT/hash-base.txt") <(strip "$OUT/hash-new.txt") >"$OUT/hash-diff.txt"; then
        echo "hash: $n outputs bit-identical"
    else
        echo "hash: DIFFER ($n outputs; $OUT/hash-diff.txt)"
        rc=1
    fi
fi

if has checks; then
    for t in cuda_test_codes cuda_test_ops cuda_test_draft "test_backend test"; do
        log="$OUT/check-${t// /-}.log"
        # shellcheck disable=SC2086  # "test_backend test" is a program and its mode
        (cd "$ROOT" && timeout 300 build-gpu/$t >"$log" 2>&1)
        r=$?
        echo "check $t: rc=$r, $(grep -v '^\s*$' "$log" | tail -1)"
        [ $r -eq 0 ] || rc=1
    done
fi

if has ncu && [ -n "${NCU_KERNELS:-}" ]; then
    for b in base new; do
        tree="$ROOT"
        [ $b = base ] && tree="$BASE"
        # shellcheck disable=SC2086  # NCU_ARGS is a list of options
        timeout 300 ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active \
            -k "regex:$NCU_KERNELS" "$tree/build-gpu/qvattn" bench --shape "${NCU_SHAPE:-1,40,75600,128}" \
            --dtype bf16 --methods "${NCU_METHODS:-vc8+expcast}" ${NCU_ARGS:-} --iters 1 --device cuda \
            >"$OUT/ncu-$b.log" 2>&1 || echo "ncu $b: rc=$?"
        echo "ncu $b (us, % of DRAM peak, % issue active):"
        awk '/^  [A-Za-z_]/ { name = $0; sub(/^ +/, "", name); sub(/\(.*/, "", name) }
             /gpu__time_duration/ { t = $NF }
             /dram__throughput/ { d = $NF }
             /issue_active/ { printf "  %-60s %10s %7s %7s\n", substr(name, 1, 60), t, d, $NF }' "$OUT/ncu-$b.log"
    done
fi

if has timeline; then
    for b in base new; do
        tree="$ROOT"
        [ $b = base ] && tree="$BASE"
        PYTHONPATH="$tree/python" QVATTN_LIB="$tree/build-gpu/libqvattn.so" timeout 200 python3 \
            "$ROOT/bench/idle_gaps.py" "${TIMELINE_METHODS:-vc8+expcast,draft@85/0/7.5/7.5+expcast}" \
            --timeline >"$OUT/timeline-$b.txt" 2>&1 || echo "timeline $b: rc=$?"
        echo "timeline $b:"
        grep -E "^== |^ +[0-9.]+ +[0-9.]+ +[0-9]+ " "$OUT/timeline-$b.txt" | grep -v "attn8_ws\|attn_draft_ws" | head -40
    done
fi

if has speed; then
    for r in $(seq 1 "$ROUNDS"); do
        for b in base new; do
            # each build with its own Python package and bench script
            tree="$ROOT"
            [ $b = base ] && tree="$BASE"
            mkdir -p "$OUT/speed-$b-$r"
            QVATTN_LIB="$tree/build-gpu/libqvattn.so" timeout 300 python3 "$tree/bench/compare.py" --shapes wan2.2-720p \
                --methods "${METHODS:-sage8,vc8+expcast,draft@85/0/0/15,draft@70/10/10/10}" --baselines cudnn --iters 5 \
                --out "$OUT/speed-$b-$r" >"$OUT/speed-$b-$r.log" 2>&1 || echo "speed $b $r: rc=$?"
            grep -E "qvattn |error|Error" "$OUT/speed-$b-$r.log" | head -12
        done
    done
    python3 - "$OUT" "$ROUNDS" <<'PY'
import glob, json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for b in ("base", "new"):
    for r in range(1, rounds + 1):
        for f in glob.glob(os.path.join(out, f"speed-{b}-{r}", "*.json")):
            data = json.load(open(f))
            for shape in data.get("shapes", []):
                for e in shape.get("entries", []):
                    if e.get("vs_cudnn"):
                        label = " ".join(str(x) for x in (e.get("label"), e.get("mode")) if x)
                        rows.setdefault((label, b), []).append((e["vs_cudnn"], e["ms"]))
print("| call | base x cuDNN (median) | new x cuDNN (median) | new/base |")
print("|---|--:|--:|--:|")
for label in sorted({k[0] for k in rows}):
    b, n = rows.get((label, "base"), []), rows.get((label, "new"), [])
    if not b or not n:
        continue
    mb, mn = statistics.median(x[0] for x in b), statistics.median(x[0] for x in n)
    print(f"| {label} | {mb:.3f} ({len(b)} runs) | {mn:.3f} ({len(n)} runs) | {mn / mb:.3f} |")
PY
fi
if [ -n "${PACK_TO:-}" ]; then
    # PACK_TO is the device's $OUT, OUT a folder outside it: a tarball
    # written into the folder it packs would pack itself
    if [ "$(cd "$PACK_TO" && pwd)" = "$(cd "$OUT" && pwd)" ]; then
        echo "compare-builds: PACK_TO is OUT; set OUT to a folder outside PACK_TO"
    else
        tar -C "$OUT" -czf "$PACK_TO/compare-builds.tar.gz" . && echo "packed into $PACK_TO/compare-builds.tar.gz"
    fi
fi
exit $rc
