#!/usr/bin/env bash
# `make gpu-gate` timed from a cold and then a warm Triton cache (issues 14, 23), and the GPU runners' CI job.
# Runs scripts/gpu_gate.sh once per pass, all passes on one TRITON_CACHE_DIR: pass `cold` empties it first
# (every specialization compiles), any other pass name (`warm`, `ci`) uses it as it is (a warm pass finds
# what cold compiled; CI finds what the previous job left, restored by actions/cache).
# Writes under $OUT, as each pass finishes (a call cut short keeps what finished):
#   <pass>/                 the pass's gate run directories, JUnit files, step logs and gpu-gate-times.json
#                           ({"cold": ..., "total_s": ..., "steps": [{name, rc, seconds, verdict}]}: cold means
#                           the cache held no kernel when the pass started)
#   <pass>.log              everything the pass printed
# $OUT can be copied to results/reference/<session>/gate-timed/ as it is (scripts/h200_summary.py reads it).
# Usage: OUT=results/runs/gate-timed bash scripts/gpu_gate_timed.sh
#   PASSES="cold warm" (default) | "cold" | "warm" | "ci"     STEP_TIMEOUT=600 (seconds per step)
#   TRITON_CACHE_DIR=DIR (default: a fresh temporary folder; set it to split cold and warm over two calls)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/runs/gate-timed}
PASSES=${PASSES:-"cold warm"}
export STEP_TIMEOUT=${STEP_TIMEOUT:-600}
if [ -z "${TRITON_CACHE_DIR:-}" ]; then  # a folder of our own, removed at the end
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  TRITON_CACHE_DIR=$tmp/triton-cache
fi
export TRITON_CACHE_DIR PYTHONUNBUFFERED=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
status=0
for pass in $PASSES; do
  case "$pass" in *[!a-z0-9-]*|"") echo "gpu_gate_timed: pass names are lower-case words, got '$pass'" >&2; exit 2;; esac
  [ "$pass" = cold ] && rm -rf "$TRITON_CACHE_DIR"
  mkdir -p "$TRITON_CACHE_DIR"
  rm -rf "${OUT:?}/$pass"
  echo "== $(date +%T) pass $pass (TRITON_CACHE_DIR=$TRITON_CACHE_DIR)"
  OUT="$OUT/$pass" bash scripts/gpu_gate.sh > "$OUT/$pass.log" 2>&1 || status=1
  grep -h "^FAILED\|rc=" "$OUT/$pass.log" | tail -4
  cat "$OUT/$pass/gpu-gate-times.json" 2>/dev/null || echo "pass $pass wrote no gpu-gate-times.json (see $OUT/$pass.log)"
done
exit $status
