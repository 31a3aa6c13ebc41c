#!/usr/bin/env bash
# `make gpu-gate` timed from a cold and then a warm Triton cache (issue 14: cold and warm wall times in the
# README). Runs scripts/gpu_gate.sh twice with one fresh TRITON_CACHE_DIR: the first run compiles every
# specialization, the second finds them all cached (what a CI runner with a persistent cache sees).
# Writes under $OUT: gate.tgz (both runs' gate directories, JUnit files and logs) and times.txt
# (`cold gate-tiny 84 s` ...); prints the times last.
# Usage: OUT=/tmp/g bash scripts/gpu_gate_timed.sh      PASSES="cold warm" (or just "cold")
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
  OUT="$WORK/$pass" bash scripts/gpu_gate.sh > "$WORK/$pass.log" 2>&1 || status=1
  sed "s/^/$pass /" "$WORK/$pass/gpu-gate-times.txt" >> "$OUT/times.txt"
  echo "$pass total $((SECONDS - start)) s" >> "$OUT/times.txt"
  grep -h "PASS\|FAIL\|passed\|failed" "$WORK/$pass.log" | tail -5
done
tar -czf "$OUT/gate.tgz" -C "$WORK" --exclude triton-cache .
cat "$OUT/times.txt"
exit $status
