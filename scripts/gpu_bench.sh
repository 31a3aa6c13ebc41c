#!/usr/bin/env bash
# The SSM state-mode benchmark of issue 3 on a CUDA box: decode and mtp-fixed (drafts 1, 3, 7,
# geometric:0.7) for Qwen3-Next and GLM-5.3-Flash at TP8, batch 1..512, every linear layer per round,
# triton backend with the fla baseline, CUDA-graph timing, ceilings measured in the same run.
# Usage: OUT=results/runs PRESETS="qwen3-next glm-5.3-flash-tp8" bash scripts/gpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs}
PRESETS=${PRESETS:-"qwen3-next glm-5.3-flash-tp8"}
BATCH=${BATCH:-1,8,32,128,256,512}
DRAFTS=${DRAFTS:-"1 3 7"}
COMMON=(--device cuda --backend triton,fla --batch "$BATCH" --state-dtype fp32 --rounds 3
        --check-requests 1 --memory-budget-gib 128 --out "$OUT")
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH=$PWD
for preset in $PRESETS; do
  $PY -m harness run decode --preset "$preset" --modes native,replay "${COMMON[@]}" --json > /dev/null
  for s in $DRAFTS; do
    $PY -m harness run mtp-fixed --preset "$preset" --drafts "$s" --accept geometric:0.7 "${COMMON[@]}" --json > /dev/null
  done
done
