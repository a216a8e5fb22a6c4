#!/usr/bin/env bash
# The GPU reliability sweep (issue 13, item 5) on a CUDA machine (H200,
# sm_90a), from the repo root:
#
#   bash scripts/gpu-sweep.sh [--budget S] [--seed S] [--no-sanitize]
#
# Steps, each bounded by a timeout and logged to $SWEEP_LOGS/NN-step.log
# (default /tmp/gpu-sweep-logs):
#   build      cmake -S . -B build-gpu (if not configured) and
#              cmake --build build-gpu --target gpu_sweep (seconds when
#              scripts/gpu-check.sh built build-gpu already)
#   all        build-gpu/gpu_sweep all: streams, graphs, oom (with the
#              1,000-call soak), then >= 500 random cases with the time left
#   memcheck   compute-sanitizer --tool memcheck --leak-check full  gpu_sweep small
#   racecheck  compute-sanitizer --tool racecheck gpu_sweep small
#   synccheck  compute-sanitizer --tool synccheck gpu_sweep small
# The whole run fits in --budget seconds (default 540 = 9 min): the
# sanitizer steps are reserved 230 s and `all` gets what the build left.
# At the end $OUT (default ./out) receives two files: sweep-summary.md
# (the table below and gpu_sweep's own table) and sweep-logs.tar.gz (every
# log), so it fits beside scripts/device-run.sh's files in one device call:
#   bash scripts/device-run.sh; bash scripts/gpu-sweep.sh
# The exit status is non-zero if any step failed.
set -u

BUDGET=540
SEED=1
SANITIZE=1
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) shift; BUDGET=${1:-540} ;;
        --budget=*) BUDGET=${1#--budget=} ;;
        --seed) shift; SEED=${1:-1} ;;
        --seed=*) SEED=${1#--seed=} ;;
        --no-sanitize) SANITIZE=0 ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "gpu-sweep: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

T0=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-"$ROOT/out"}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=${SWEEP_LOGS:-/tmp/gpu-sweep-logs}
rm -rf "$LOGS" && mkdir -p "$LOGS"
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-16}
BIN="$ROOT/$BUILD/gpu_sweep"

for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if ! command -v nvcc >/dev/null 2>&1 && [ -x "$d/nvcc" ]; then
        export PATH="$PATH:$d"
    fi
done

ROWS=()   # "step|result|seconds|detail|log"
FAILS=0
CASES=0; CASE_FAILS=0; CASE_SKIPS=0; MODE_FAILS=0; SAN_FINDINGS=0; ALL_LOG=
N=0
elapsed() { echo $(( $(date +%s) - T0 )); }

# run_step NAME TIMEOUT CMD...: output to $LOGS/NN-NAME.log; sets RC, LOG, DT
run_step() {
    local name=$1 limit=$2
    shift 2
    N=$((N + 1))
    LOG=$(printf '%s/%02d-%s.log' "$LOGS" "$N" "$name")
    echo "== [$N] $name (limit ${limit}s): $*"
    { echo "\$ $*"; echo; } >"$LOG"
    local t
    t=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    RC=$?
    DT=$(( $(date +%s) - t ))
    if [ $RC -eq 124 ] || [ $RC -eq 137 ]; then
        echo "   TIMEOUT after ${DT}s -> $LOG"
    else
        echo "   rc=$RC (${DT}s) -> $LOG"
    fi
}
# $OUT/sweep-summary.md, rewritten after every step (a run cut short
# still leaves the steps done so far).
write_summary() {
    {
        echo "# gpu-sweep $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git rev-parse --short HEAD 2>/dev/null || echo n/a), seed $SEED"
        echo
        echo "| step | result | seconds | detail | log |"
        echo "|---|---|--:|---|---|"
        local r name res secs det log
        for r in "${ROWS[@]}"; do
            IFS='|' read -r name res secs det log <<<"$r"
            echo "| $name | $res | $secs | $det | $log |"
        done
        echo
        echo "cases run: $CASES, case failures: $CASE_FAILS, skipped: $CASE_SKIPS; FAIL lines in gpu_sweep all: $MODE_FAILS; sanitizer findings: $SAN_FINDINGS"
        if [ -n "${ALL_LOG:-}" ] && [ -f "$ALL_LOG" ]; then
            echo
            awk '/^## gpu_sweep all/{p=1} p' "$ALL_LOG"
        fi
        echo
        echo "gpu-sweep: $([ $FAILS -eq 0 ] && echo PASS || echo FAIL) ($FAILS failed steps) in $(elapsed) s (logs: sweep-logs.tar.gz)"
    } >"$OUT/sweep-summary.md"
    cp "$OUT/sweep-summary.md" "$LOGS/summary.md"
}
row() { # name result detail
    ROWS+=("$1|$2|$DT|$3|$(basename "$LOG")")
    case "$2" in pass) ;; *) FAILS=$((FAILS + 1)) ;; esac
    write_summary
}
tail_log() { tail -n "${2:-25}" "$1" | sed 's/^/   | /'; }

{
    echo "qvattn gpu-sweep $(date -u +%Y-%m-%dT%H:%M:%SZ) (git $(git rev-parse --short HEAD 2>/dev/null || echo n/a))"
    command -v nvidia-smi >/dev/null 2>&1 &&
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    echo "budget ${BUDGET}s seed $SEED sanitize $SANITIZE logs $LOGS out $OUT"
} | tee "$LOGS/00-header.log"

# ---------------------------------------------------------------- build
BUILT=0
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    run_step configure 180 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DQVA_CUDA=ON
    if [ $RC -ne 0 ]; then row configure FAIL "rc=$RC"; tail_log "$LOG"; fi
fi
if [ -f "$BUILD/CMakeCache.txt" ]; then
    run_step build 420 cmake --build "$BUILD" -j "$JOBS" --target gpu_sweep
    if [ $RC -eq 0 ] && [ -x "$BIN" ]; then
        BUILT=1; row build pass ""
    else
        row build FAIL "rc=$RC"; tail_log "$LOG"
    fi
fi

# ---------------------------------------------------------------- all
if [ $BUILT -eq 1 ]; then
    RESERVE=$(( SANITIZE ? 230 : 10 ))
    SECS=$(( BUDGET - $(elapsed) - RESERVE - 40 ))
    [ $SECS -lt 120 ] && SECS=120
    run_step all $(( SECS + 150 )) "$BIN" all --seed "$SEED" --seconds "$SECS"
    ALL_LOG=$LOG
    c=$(grep -E '^@@ mode=cases ' "$LOG" | tail -n 1)
    CASES=$(sed -n 's/.* run=\([0-9]*\).*/\1/p' <<<"$c"); CASES=${CASES:-0}
    CASE_FAILS=$(sed -n 's/.* fail=\([0-9]*\).*/\1/p' <<<"$c"); CASE_FAILS=${CASE_FAILS:-0}
    CASE_SKIPS=$(sed -n 's/.* skip=\([0-9]*\).*/\1/p' <<<"$c"); CASE_SKIPS=${CASE_SKIPS:-0}
    MODE_FAILS=$(grep -cE '^FAIL' "$LOG")
    detail=$(grep -E '^\| (streams|graphs|oom|cases) \|' "$LOG" | awk -F'|' '{gsub(/ /,"",$2); gsub(/ /,"",$3); printf "%s%s %s (%s fail)", (NR>1?"; ":""), $2, $3, $5}')
    if [ $RC -eq 0 ]; then row all pass "$detail"
    else row all "FAIL rc=$RC" "${detail:-no summary table (see log)}"; tail_log "$LOG" 40; fi
else
    DT=0; LOG=-; row all "skipped" "no build"
fi

# ---------------------------------------------------------------- sanitizers
CS=$(command -v compute-sanitizer || true)
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /usr/local/cuda-13.0/bin; do
    [ -z "$CS" ] && [ -x "$d/compute-sanitizer" ] && CS="$d/compute-sanitizer"
done
if [ $SANITIZE -eq 1 ] && [ $BUILT -eq 1 ]; then
    if [ -z "$CS" ]; then   # asked for and impossible: a failure, not a skip
        DT=0; LOG=-; row sanitizers "FAIL compute-sanitizer not found" ""
    else
        for spec in "memcheck 80 --leak-check full" "racecheck 100" "synccheck 50"; do
            # shellcheck disable=SC2086  # word splitting wanted
            set -- $spec
            tool=$1; limit=$2; shift 2
            run_step "$tool" "$limit" "$CS" --tool "$tool" "$@" --error-exitcode 99 "$BIN" small
            errs=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$LOG" | tail -n 1 | grep -oE '[0-9]+$')
            hzl=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazards? displayed.*' "$LOG" | tail -n 1)
            hz=$(grep -oE '[0-9]+' <<<"$hzl" | head -n 1)
            small=$(grep -E '^@@ mode=small ' "$LOG" | tail -n 1 | sed -n 's/.*result=\([A-Za-z]*\).*/\1/p')
            n=$(( ${errs:-0} + ${hz:-0} ))
            SAN_FINDINGS=$(( SAN_FINDINGS + n ))
            d="${errs:-?} errors${hz:+, $hz hazards ${hzl#*displayed }}; small cases: ${small:-no result}"
            if [ $RC -eq 124 ] || [ $RC -eq 137 ]; then row "$tool" "FAIL timeout ${limit}s" "$d"; tail_log "$LOG"
            elif [ $RC -eq 0 ] && [ "$n" -eq 0 ] && [ "$small" = pass ]; then row "$tool" pass "$d"
            else row "$tool" "FAIL rc=$RC" "$d"; tail_log "$LOG" 40; fi
        done
    fi
elif [ $SANITIZE -eq 1 ]; then
    DT=0; LOG=-; row sanitizers skipped "no build"
fi

# ---------------------------------------------------------------- summary
write_summary
tar -C "$(dirname "$LOGS")" -czf "$OUT/sweep-logs.tar.gz" "$(basename "$LOGS")"
cat "$OUT/sweep-summary.md"
[ $FAILS -eq 0 ]
