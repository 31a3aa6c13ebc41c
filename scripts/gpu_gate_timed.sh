#!/usr/bin/env bash
# `make gpu-gate` timed from a cold and then a warm Triton cache (issue 14: cold and warm wall times in the
# README). Runs scripts/gpu_gate.sh twice with one fresh TRITON_CACHE_DIR: the first run compiles every
# specialization, the second finds them all cached (what a CI runner with a persistent cache sees).
# Writes under $OUT as it goes (a call cut short keeps what finished): <pass>.log, times.txt
# (`cold gate-tiny 84 s` ...), and gate-<pass>.tgz (the pass's gate directories and JUnit files).
# Usage: OUT=/tmp/g bash scripts/gpu_gate_timed.sh      PASSES="cold warm" (or just "cold")   STEP_TIMEOUT=900
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/runs/gate-timed}
PASSES=${PASSES:-"cold warm"}
WORK=$(mktemp -d)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$WORK/triton-cache} PYTHONUNBUFFERED=1
rm -rf "$TRITON_CACHE_DIR"
mkdir -p "$OUT"
: > "$OUT/times.txt"
status=0
for pass in $PASSES; do
  start=$SECONDS
  OUT="$WORK/$pass" bash scripts/gpu_gate.sh > "$OUT/$pass.log" 2>&1 || status=1
  sed "s/^/$pass /" "$WORK/$pass/gpu-gate-times.txt" >> "$OUT/times.txt"
  echo "$pass total $((SECONDS - start)) s" >> "$OUT/times.txt"
  tar -czf "$OUT/gate-$pass.tgz" -C "$WORK" "$pass"
  grep -h "PASS\|FAIL\|passed\|failed" "$OUT/$pass.log" | tail -4
done
cat "$OUT/times.txt"
exit $status
