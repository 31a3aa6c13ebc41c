#!/usr/bin/env bash
# The SSM state-mode benchmark (issue 7) on a CUDA box: per preset, autotune the kernels (optional),
# then decode and mtp-fixed (geometric:0.7) at every batch, every mode and variant with the fla
# baseline, every linear layer per round, CUDA-graph timing, ceilings measured in the same run.
# One run directory per command under $OUT; a command that fails or times out prints FAILED and the
# others still run. Each line prints its wall time, so the harness's own overhead shows.
#
# Usage: OUT=results/runs bash scripts/gpu_bench.sh
#   PRESETS="qwen3-next glm-5.3-flash-tp8" BATCH=1,8,32,128,256,512 DRAFTS="1 3 7"
#   TUNE=1 TUNE_BATCH=1,32,128,512   (harness autotune ssm first, drafts 3; configs into the run cache)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs}
PRESETS=${PRESETS:-"qwen3-next glm-5.3-flash-tp8"}
BATCH=${BATCH:-1,8,32,128,256,512}
DRAFTS=${DRAFTS:-"1 3 7"}
TUNE=${TUNE:-0}
TUNE_BATCH=${TUNE_BATCH:-1,32,128,512}
RUN_TIMEOUT=${RUN_TIMEOUT:-400}
COMMON=(--device cuda --backend triton,fla --batch "$BATCH" --state-dtype fp32 --rounds 2
        --check-requests 1 --memory-budget-gib 128 --out "$OUT")
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH=$PWD

run() {
  local t0=$SECONDS
  timeout "$RUN_TIMEOUT" $PY -m harness "$@" --json > /dev/null || echo "FAILED ($?): harness $*"
  echo "== $((SECONDS - t0))s harness $*"
}

for preset in $PRESETS; do
  if [ "$TUNE" = 1 ]; then
    run autotune ssm --device cuda --preset "$preset" --batch "$TUNE_BATCH" --drafts 3 --out "$OUT"
  fi
  run run decode --preset "$preset" "${COMMON[@]}"
  for s in $DRAFTS; do
    run run mtp-fixed --preset "$preset" --drafts "$s" --accept geometric:0.7 "${COMMON[@]}"
  done
done
