#!/usr/bin/env bash
# Replay's precompute forward (tensor cores, kernels/ssm/replay_precompute.py) on a CUDA box, in one command:
#   1. its correctness tests on real compilation (against the torch replay and the fp64 reference, folds
#      bitwise), the precisions the interpreter cannot show;
#   2. the per-kernel sweep at one batch: every dot precision x BV x num_warps x BK x num_stages, beside
#      the token-step kernels it is judged against (scripts/bench_kernels.py, compiled first in JOBS processes);
#   3. the error of every precision against fp64 (worst (round, layer) RMS) over 1024-token rollouts at model
#      head size, long-memory and random gates, fp32 and bf16 state (scripts/measure_bounds.py): the
#      numbers behind scenarios/tolerances.py.
# Each step has its own time limit, so a call cut short keeps what finished. Everything lands under $OUT;
# the last lines printed are the best config per kernel and precision.
#
# Usage: OUT=/tmp/p bash scripts/gpu_precompute.sh
#   BATCH=128 PRECISIONS=ieee,tf32x3,bf16x3,bf16x6,tf32 BV=32,64,128 WARPS=2,4,8 BK=32,64 STAGES=1,2 JOBS=16
#   STEPS="tests sweep bounds" TESTS_K=precompute BOUNDS_DTYPES="fp32 bf16" GATES=long-memory,random
#   KERNELS=replay-precompute,... (bench_kernels' names; compact-precompute for compact's matrix verify,
#   replay-matrix-fold beside replay-fold for the matrix fold)   REPLAY_VARIANTS=inline,matrix,... (bounds)
#   BOUNDS_MODES=native,replay (native,compact,replay: compact's accept-precompute variants too)
#   TESTS_S / SWEEP_S / BOUNDS_S: each step's time limit in seconds
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/precompute}
PRECISIONS=${PRECISIONS:-ieee,tf32x3,bf16x3,bf16x6,tf32}
STEPS=${STEPS:-"tests sweep bounds"}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
compact_variants="accept,accept-precompute$(IFS=,; for p in $PRECISIONS; do [ "$p" = "$($PY -c 'from kernels.ssm.dot_precision import DEFAULT_PRECISION as d; print(d)')" ] || printf ',accept-precompute-%s' "$p"; done)"
variants="inline,precompute$(IFS=,; for p in $PRECISIONS; do [ "$p" = "$($PY -c 'from kernels.ssm.dot_precision import DEFAULT_PRECISION as d; print(d)')" ] || printf ',precompute-%s' "$p"; done)"
variants=${REPLAY_VARIANTS:-$variants}  # e.g. inline,matrix,matrix-bf16x3 for the matrix fold's states

for s in $STEPS; do
  t0=$SECONDS
  case $s in
    tests)
      timeout "${TESTS_S:-180}" $PY -m pytest -q -x -p no:cacheprovider tests/test_triton_replay.py \
        tests/test_triton_compact_precompute.py tests/test_triton_replay_matrix_fold.py -m "slow or not slow" -k "${TESTS_K:-precompute}" > "$OUT/tests.txt" 2>&1
      tail -3 "$OUT/tests.txt" ;;
    sweep)
      timeout "${SWEEP_S:-330}" $PY scripts/bench_kernels.py --preset "${PRESET:-qwen3-next}" --batch "${BATCH:-128}" \
        --bv "${BV:-32,64,128}" --warps "${WARPS:-2,4,8}" --bk "${BK:-32,64}" --stages "${STAGES:-1,2}" \
        --precision "$PRECISIONS" --kernels "${KERNELS:-replay-precompute,replay-forward,native-verify,compact-verify}" \
        --jobs "${JOBS:-16}" --out "$OUT/kernels.csv" > "$OUT/kernels.txt" 2> "$OUT/kernels.log" ;;
    bounds)
      # fp32 state first (the contract's case), then bf16; each part prints its own table
      : > "$OUT/bounds.md"
      for sd in ${BOUNDS_DTYPES:-fp32 bf16}; do
        timeout "${BOUNDS_S:-150}" $PY scripts/measure_bounds.py --backend triton --device cuda --geometry k128 \
          --families gdn,kda --state-dtypes "$sd" --gates "${GATES:-long-memory,random}" --modes "${BOUNDS_MODES:-native,replay}" \
          --replay-forward "$variants" --compact-commit "$compact_variants" >> "$OUT/bounds.md" 2> "$OUT/bounds-$sd.log" || echo "bounds $sd: rc $?" >> "$OUT/bounds.md"
      done ;;
  esac
  echo "== $((SECONDS - t0)) s $s"
done
[ -f "$OUT/bounds.md" ] && $PY - "$OUT/bounds.md" <<'EOF'
import collections, sys
worst = collections.defaultdict(float)  # (variant, family, state dtype, history) -> worst output RMS vs fp64
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.split("|")[1:-1]]
    if len(cells) != 4 or " vs fp64-reference" not in cells[1] or cells[2] != "o":
        continue
    case, lhs = cells[0], cells[1].split(" vs ")[0]
    fam = "kda" if "kda" in case else "gdn"
    sd = "bf16" if "bf16 state" in case else "fp32"
    hist = "bf16-hist" if "bf16 history" in case else ""
    key = (lhs, fam, sd, hist)
    worst[key] = max(worst[key], float(cells[3]))
for key in sorted(worst):
    print("  outputs vs fp64, worst:", " ".join(k for k in key if k), f"{worst[key]:.3g}")
EOF
[ -f "$OUT/kernels.txt" ] && cat "$OUT/kernels.txt"
