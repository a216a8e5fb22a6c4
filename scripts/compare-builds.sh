#!/usr/bin/env bash
# Two builds of qvattn compared on a CUDA machine, from the repo root:
#
#   bash scripts/compare-builds.sh BASE_SRC [hash|speed|both] [ROUNDS]
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
# Logs and JSON go to $OUT (default ./out).  Exit status non-zero if the
# hashes differ.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
[ $# -ge 1 ] || { sed -n '2,21p' "$0"; exit 2; }
BASE=$(cd "$1" && pwd) || exit 2
WHAT=${2:-both}
ROUNDS=${3:-2}
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
JOBS=${JOBS:-16}
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if ! command -v nvcc >/dev/null 2>&1 && [ -x "$d/nvcc" ]; then export PATH="$PATH:$d"; fi
done

build() { # src dir
    cmake -S "$1" -B "$1/build-gpu" -DCMAKE_BUILD_TYPE=Release -DQVA_CUDA=ON >"$OUT/build-$2.log" 2>&1 &&
        cmake --build "$1/build-gpu" -j "$JOBS" --target qvattn_shared test_backend >>"$OUT/build-$2.log" 2>&1
}
cp tests/test_backend.c "$BASE/tests/test_backend.c"
build "$BASE" base || { echo "compare-builds: base build failed ($OUT/build-base.log)"; exit 1; }
build "$ROOT" new || { echo "compare-builds: new build failed ($OUT/build-new.log)"; exit 1; }

rc=0
if [ "$WHAT" != speed ]; then
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

if [ "$WHAT" != hash ]; then
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
exit $rc
