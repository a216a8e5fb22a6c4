#!/usr/bin/env bash
# The end-to-end fidelity harness (bench/fidelity) on a CUDA machine, in the
# two steps that fit 10-minute device calls on one warm machine (the weights
# cache, bench/out/fidelity-cache, is what the second step reads):
#
#   bash scripts/fidelity-run.sh train    # the models at once, bf16 only (~520 s on the H200)
#   bash scripts/fidelity-run.sh sample   # every method from the cache, then --merge (~145 s)
#   bash scripts/fidelity-run.sh train --tiny --device cpu   # more run.py options after the step
#   SEEDS=0 bash scripts/fidelity-run.sh sample   # no cache: trains and samples one model in one call
#
# The two steps need the same warm machine; a lent machine can go back
# between calls (the cache goes with it).  One model per call does not:
# with an empty cache, `sample` trains the seed first (one model alone:
# 213 s of training and ~250 s in all with 10 methods on the H200,
# 2026-12-03), and the JSON reports of the calls, unpacked from each
# fidelity-sample.tar.gz, join with `run.py --merge`.
#
# Each model trains in about 40 GB of GPU memory, so the models run as many
# at a time as the card holds (JOBS_GPU, default total memory / 42 GB: 3 on
# an H200, 1 on an 80 GB H100, where two at once ran out of memory on
# 2026-12-05).
#
# SEEDS (default "0 1 2") picks the models; METHODS (sample; default the
# harness's list) the methods.  A peer (sage2) runs where its package
# imports: put its build on PYTHONPATH (bench/README.md, "Peers").  Each
# step packs its reports and logs into $OUT/fidelity-<step>.tar.gz (a
# device call returns at most 8 files) and prints the last lines of each.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
STEP=${1:-}
case "$STEP" in train | sample) ;; *) sed -n '2,25p' "$0"; exit 2 ;; esac
shift
SEEDS=${SEEDS:-0 1 2}
OUT=${OUT:-$ROOT/out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 QVATTN_LIB=${QVATTN_LIB:-$ROOT/build-gpu/libqvattn.so}
if [ ! -f "$QVATTN_LIB" ]; then
    { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQVA_CUDA=ON &&
        cmake --build build-gpu -j "${JOBS:-16}"; } >"$WORK/build.log" 2>&1 ||
        { tail -20 "$WORK/build.log"; exit 1; }
fi
args=()
if [ "$STEP" = train ]; then args=(--methods bf16); elif [ -n "${METHODS:-}" ]; then args=(--methods "$METHODS"); fi
if [ -z "${JOBS_GPU:-}" ]; then
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    JOBS_GPU=$(( ${mib:-0} / 43008 ))
    [ "$JOBS_GPU" -ge 1 ] || JOBS_GPU=1
fi
t0=$SECONDS
pids=()
rc=0
for s in $SEEDS; do
    python3 bench/fidelity/run.py --seeds "$s" "${args[@]}" "$@" --out "$WORK/o$s" \
        >"$WORK/$STEP$s.log" 2>&1 &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$JOBS_GPU" ]; then
        for p in "${pids[@]}"; do wait "$p" || rc=1; done
        pids=()
    fi
done
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "fidelity $STEP: $((SECONDS - t0)) s, $JOBS_GPU model(s) at a time, exit $rc"
for s in $SEEDS; do echo "== seed $s"; tail -6 "$WORK/$STEP$s.log"; done
if [ "$STEP" = sample ]; then
    python3 bench/fidelity/run.py --merge "$WORK"/o*/fidelity-*.json --out "$WORK/merged" \
        >"$WORK/merge.log" 2>&1 || rc=1
    sed -n '/^## Fidelity/,/^## Training/p' "$WORK/merge.log" | grep -v '^## Training'
fi
tar -C "$WORK" -czf "$OUT/fidelity-$STEP.tar.gz" . && rm -rf "$WORK"
exit "$rc"
