#!/usr/bin/env bash
# One device call for the draft work (issue 6), from the repo root:
#
#   bash scripts/draft-check.sh
#
# Builds for sm_90a (build-gpu), then, each step bounded and logged to $OUT:
#   1. test_backend with the default draft kernel (dw7), then with each of
#      $BACKEND_KERNELS (QVA_DRAFT_KERNEL values)
#   2. compute-sanitizer racecheck of the draft methods of test_backend
#      with QVA_DRAFT_KERNEL=mma (the draft prep without the block-sparse
#      kernel; RACE_MMA=0 skips it), then with the default kernel
#   3. bench/profile_draft.py: per-kernel times of the router and the prep
#   4. bench/compare.py on the three draft grids with $DW_KERNELS (dw7,dw4)
#   5. Nsight Compute of one draft kernel launch at Wan2.2-720p (speed of
#      light, warp stall reasons, pipe use), unless NCU=0
# Budget: about 6 minutes with the default limits; RACE=0 skips step 2.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if ! command -v nvcc >/dev/null 2>&1 && [ -x "$d/nvcc" ]; then export PATH="$PATH:$d"; fi
done
LIB="$ROOT/build-gpu/libqvattn.so"
step() { # name limit cmd...
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc ($(( $(date +%s) - t0 )) s)  $(tail -1 "$OUT/$name.log")"
}
step build 240 bash -c "cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQVA_CUDA=ON && cmake --build build-gpu -j 16"
[ -f "$LIB" ] || { echo "draft-check: no library"; exit 1; }
step backend-default 60 build-gpu/test_backend
for k in ${BACKEND_KERNELS:-}; do step "backend-$k" 60 env QVA_DRAFT_KERNEL=$k build-gpu/test_backend; done
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "${RACE:-1}" != 0 ]; then
[ "${RACE_MMA:-1}" != 0 ] && step racecheck-mma "${RACE_LIMIT:-90}" env QVA_DRAFT_KERNEL=mma "$CS" --tool racecheck --error-exitcode 1 build-gpu/test_backend test draft
step racecheck-default "${RACE_LIMIT:-90}" "$CS" --tool racecheck --error-exitcode 1 build-gpu/test_backend test draft
for k in ${RACE_KERNELS:-}; do
    step "racecheck-$k" "${RACE_LIMIT:-90}" env QVA_DRAFT_KERNEL=$k "$CS" --tool racecheck --error-exitcode 1 build-gpu/test_backend test draft
done
fi
step profile 90 env QVATTN_LIB="$LIB" python3 bench/profile_draft.py --out "$OUT"
step compare 200 env QVATTN_LIB="$LIB" python3 bench/compare.py \
    --shapes "${SHAPES:-wan2.2-720p,wan2.2-720p-text,hunyuanvideo1.5-720p}" \
    --methods draft@85/0/0/15,draft@85/0/7.5/7.5,draft@85/0/7.5/7.5+expcast \
    --kernels "${DW_KERNELS:-dw7,dw4}" --baselines cudnn --iters 5 --time-limit-s 180 --out "$OUT"
if [ "${NCU:-1}" != 0 ]; then
    NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu 150 "$NCU_BIN" --kernel-name regex:attn_draft_ws --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" \
        build-gpu/qvattn bench --shape 1,40,75600,128 --grid 21,45,80 \
        --methods draft@85/0/0/15 --iters 1 --device cuda
fi
