#!/usr/bin/env bash
# The state-mode comparison on a CUDA box, in one command: per-kernel autotune of each preset (its wall
# time recorded), then the harness's own rows with that cache (every mode and variant, the fla baseline),
# and the same rows untuned (`--autotune off`) so a tuned row can be held against its untuned one.
# Writes under $OUT: runs.tgz (the run directories, autotune runs included), cache.json (the tuned
# configs), times.txt (wall seconds per step); prints each run's rows last.
#
# Usage: OUT=/tmp/m bash scripts/gpu_modes.sh
#   CASES="qwen3-next:128,256:3 glm-5.3-flash-tp8:128:3 qwen3-next:128:0"   (preset:batches:drafts; 0 = decode)
#   UNTUNED=1 (also run the first case with --autotune off; all: every case)   ROUNDS=2
#   TUNE=0 (no autotune: rows on the shipped configs)   MODES, REPLAY_FORWARD, COMPACT_COMMIT, HISTORY_LEN (harness
#   run's --modes / --replay-forward / --compact-commit / --history-len)   PRECISION=ieee,bf16x3 (autotune's --precision:
#   the matrix kernels' precisions to tune, when the rows ask for variants beyond the default ones)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/modes}
CASES=${CASES:-"qwen3-next:128,256:3 glm-5.3-flash-tp8:128:3 qwen3-next:128:0"}
UNTUNED=${UNTUNED:-1}
ROUNDS=${ROUNDS:-2}
RUNS=$(mktemp -d)
CACHE="$OUT/cache.json"
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=${TRITON_INTERPRET:-0}
DEVICE=${DEVICE:-cuda}
times="$OUT/times.txt"
: > "$times"
step() {
  local name=$1; shift
  local start=$SECONDS
  "$@" > "$RUNS/$name.json" 2> "$RUNS/$name.log" || echo "FAILED ($?): $name: $*"
  echo "$name $((SECONDS - start)) s" | tee -a "$times"
}

first=1
for case in $CASES; do  # case by case, so a call cut short still has the first cases' rows
  IFS=: read -r preset batches drafts <<< "$case"
  # tune the batch buckets of the rows (the W = 1 static key when drafts is 0: decode); TUNE=0 runs on the
  # shipped configs (harness/shipped_configs.json) and each kernel's default where nothing is shipped
  if [ "${TUNE:-1}" = 1 ]; then
    step "autotune-$preset-d$drafts" $PY -m harness autotune ssm --device "$DEVICE" --preset "$preset" --batch "$batches" \
      --drafts "$drafts" --autotune-cache "$CACHE" --out "$RUNS" --json ${HISTORY_LEN:+--history-len "$HISTORY_LEN"} \
      ${PRECISION:+--precision "$PRECISION"}
  fi
  scenario=mtp-fixed; extra=(--drafts "$drafts" --accept geometric:0.7)
  [ "$drafts" = 0 ] && { scenario=decode; extra=(); }
  common=(--preset "$preset" --device "$DEVICE" --backend "${BACKEND:-triton,fla}" --batch "$batches" --state-dtype fp32
          --rounds "$ROUNDS" --check-requests "${CHECK:-8}" --out "$RUNS" --json "${extra[@]}"
          ${MODES:+--modes "$MODES"} ${REPLAY_FORWARD:+--replay-forward "$REPLAY_FORWARD"}
          ${COMPACT_COMMIT:+--compact-commit "$COMPACT_COMMIT"} ${HISTORY_LEN:+--history-len "$HISTORY_LEN"})
  if [ "${TUNE:-1}" = 1 ]; then
    step "$scenario-$preset-b$batches-tuned" $PY -m harness run "$scenario" "${common[@]}" --autotune-cache "$CACHE"
  else
    step "$scenario-$preset-b$batches-shipped" $PY -m harness run "$scenario" "${common[@]}"
  fi
  if [ "$UNTUNED" = all ] || { [ "$UNTUNED" = 1 ] && [ $first = 1 ]; }; then
    step "$scenario-$preset-b$batches-untuned" $PY -m harness run "$scenario" "${common[@]}" --autotune off
  fi
  first=0
  tar -C "$RUNS" -czf "$OUT/runs.tgz" .
done
tar -C "$RUNS" -czf "$OUT/runs.tgz" .
for f in "$RUNS"/*-tuned.json "$RUNS"/*-untuned.json "$RUNS"/*-shipped.json; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .json)"
  $PY - "$f" <<'EOF'
import json, sys
import pandas as pd
run = json.load(open(sys.argv[1]))["run"]
t = pd.read_csv(f"{run}/throughput.csv")
t = t[t["status"].notna()]
cols = [c for c in ("batch", "mode", "variant", "backend", "status", "median_us", "ceiling_pct", "config_source")
        if c in t.columns]
print(t[cols].to_string(index=False))
EOF
done
