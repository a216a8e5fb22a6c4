#!/usr/bin/env bash
# Wrapper for one call on the lent H200 (see /work/.library/device): at most
# 8 files come back from $OUT, so gpu-check writes its logs elsewhere and
# this packs them into one archive plus the summary and the bench tables.
#
#   bash scripts/device-run.sh [gpu-check options...]
# Wheels under .whl/ (carried) are installed first into /tmp/site.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
RET=${OUT:-$ROOT/out}
mkdir -p "$RET"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export OUT=/tmp/gpu-check-logs
rm -rf "$OUT" && mkdir -p "$OUT"
bash scripts/gpu-check.sh "$@" 2>&1 | tee "$RET/console.log"
rc=${PIPESTATUS[0]}
tar -C /tmp -czf "$RET/logs.tar.gz" gpu-check-logs
for f in "$OUT"/*.md "$OUT"/*.json; do [ -f "$f" ] && cp "$f" "$RET/"; done
exit "$rc"
