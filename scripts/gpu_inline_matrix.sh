#!/usr/bin/env bash
# Replay's inline-matrix variants (the inline token forward with the matrix fold inside it) on a CUDA box, in
# one command, cheapest evidence first:
#   1. their kernel tests on real compilation (against the torch replay and the fp64 reference);
#   2. the forward alone at one batch and width: its common round, the round every row folds token by token
#      (`inline`'s fold) and in matrix form (`inline-matrix`'s), per BV x warps (scripts/bench_kernels.py);
#   3. the harness's own rows, native beside the replay variants, on the shipped configs (scripts/gpu_modes.sh,
#      TUNE=0): decode and mtp-fixed.
# Each step has its own time limit, so a call cut short keeps what finished; everything lands under $OUT (at
# most 8 files come back from a device call: tests.txt, bench.csv, bench.txt, modes/ with runs.tgz).
#
# Usage: OUT=/tmp/i bash scripts/gpu_inline_matrix.sh
#   STEPS="tests bench rows"  PRESET=qwen3-next BATCH=128 DRAFTS=0 BV=16,32,64 WARPS=1,2,4 PRECISION=bf16x3
#   CASES="qwen3-next:128:0 qwen3-next:128:3 glm-5.3-flash-tp8:128:3" (the rows, as gpu_modes.sh takes them)
#   REPLAY_FORWARD=inline,matrix-bf16x3,inline-matrix-bf16x3   TESTS_S=240 BENCH_S=200 ROWS_S=300
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/inline-matrix}
STEPS=${STEPS:-"tests bench rows"}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
for s in $STEPS; do
  t0=$SECONDS
  case $s in
    tests)
      timeout "${TESTS_S:-240}" $PY -m pytest -q -x -p no:cacheprovider tests/test_triton_replay.py \
        tests/test_triton_replay_matrix_fold.py -m "slow or not slow" -k "inline-matrix or matrix" > "$OUT/tests.txt" 2>&1
      tail -3 "$OUT/tests.txt" ;;
    bench)
      timeout "${BENCH_S:-200}" $PY scripts/bench_kernels.py --preset "${PRESET:-qwen3-next}" --batch "${BATCH:-128}" \
        --drafts "${DRAFTS:-0}" --bv "${BV:-16,32,64}" --warps "${WARPS:-1,2,4}" --precision "${PRECISION:-bf16x3}" \
        --kernels replay-forward,replay-forward-folding,replay-forward-matrix-folding,native-verify \
        --peers off --jobs "${JOBS:-16}" --out "$OUT/bench.csv" > "$OUT/bench.txt" 2>&1
      tail -12 "$OUT/bench.txt" ;;
    rows)
      OUT=$OUT/modes TUNE=0 UNTUNED=0 BACKEND=triton MODES=native,replay \
        REPLAY_FORWARD=${REPLAY_FORWARD:-inline,matrix-bf16x3,inline-matrix-bf16x3} \
        CASES=${CASES:-"qwen3-next:128:0 qwen3-next:128:3 glm-5.3-flash-tp8:128:3"} \
        timeout "${ROWS_S:-300}" bash scripts/gpu_modes.sh > "$OUT/rows.txt" 2>&1
      tail -40 "$OUT/rows.txt" ;;
    *) echo "unknown step $s (tests, bench, rows)"; exit 2 ;;
  esac
  echo "step $s $((SECONDS - t0)) s"
done
