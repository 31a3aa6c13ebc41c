#!/usr/bin/env bash
# Per-kernel probe on a CUDA box, in one command (a few minutes on an H200):
#   1. the bitwise contracts on real compilation, with native and the other modes on different launch
#      configs (the step's arithmetic must not depend on the config);
#   2. the per-kernel roofline sweep (scripts/bench_kernels.py; every case compiled first in JOBS processes);
#   3. Nsight Compute summaries (speed of light, occupancy, warp states, instruction mix) of chosen kernels.
# Everything lands under $OUT; the last lines printed are the best config per kernel.
#
# Usage: OUT=/tmp/k bash scripts/gpu_kernels.sh
#   PRESET=qwen3-next BATCH=128 BV=16,32,64,128 WARPS=1,2,4,8 JOBS=12
#   NCU="compact-verify:32:1 deferred-verify:16:1"   (bench case:BV:warps[:precision[:BK]]; empty to skip;
#       the precision and BK of a matrix-form kernel, e.g. replay-precompute:32:1:bf16x3:32)
#   STEPS="bitwise sweep ncu" (any subset, in that order)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/kernels}
PRESET=${PRESET:-qwen3-next}
BATCH=${BATCH:-128}
NCU_BIN=${NCU_BIN:-/usr/local/cuda/bin/ncu}
NCU=${NCU-"compact-verify:32:1 deferred-verify:16:1 replay-forward:64:2"}
STEPS=${STEPS:-"bitwise sweep ncu"}
has_step() { [[ " $STEPS " == *" $1 "* ]]; }
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"

if has_step bitwise; then
  t0=$SECONDS
  TRITON_INTERPRET=0 $PY -m pytest -q -x -p no:cacheprovider \
    "tests/test_triton_native_compact.py::test_compact_equals_native_and_tracks_references" \
    "tests/test_triton_replay.py::test_replay_snapshot_equals_triton_native_state_bitwise" 2>&1 | tail -5 | tee "$OUT/bitwise.txt"
  echo "== $((SECONDS - t0))s bitwise tests"
fi

if has_step sweep; then
  t0=$SECONDS
  $PY scripts/bench_kernels.py --preset "$PRESET" --batch "$BATCH" --bv "${BV:-16,32,64,128}" --warps "${WARPS:-1,2,4,8}" \
    --jobs "${JOBS:-12}" --out "$OUT/kernels.csv" > "$OUT/kernels.txt" 2> "$OUT/kernels.log"
  echo "== $((SECONDS - t0))s kernel sweep (rc $?)"
fi

regex_of() {  # bench case -> Triton kernel name
  case "$1" in
    native-verify|decode) echo native_verify_kernel ;; compact-verify|deferred-verify) echo compact_verify_kernel ;;
    compact-commit) echo compact_commit_kernel ;; replay-forward*) echo replay_forward_kernel ;;
    replay-fold) echo replay_fold_kernel ;; replay-precompute*) echo replay_precompute_kernel ;;
    replay-matrix-fold) echo replay_matrix_fold_kernel ;;
    compact-precompute|deferred-precompute) echo compact_precompute_kernel ;;
    conv) echo causal_conv ;; *) echo "$1" ;;
  esac
}
has_step ncu || NCU=""
for spec in $NCU; do
  IFS=: read -r kernel bv warps prec bk <<< "$spec"
  extra=() tag="$kernel-bv$bv-w$warps"
  [ -n "$prec" ] && extra+=(--precision "$prec") && tag+="-$prec"
  [ -n "$bk" ] && extra+=(--bk "$bk") && tag+="-k$bk"
  t0=$SECONDS
  "$NCU_BIN" --clock-control none --kernel-name "regex:$(regex_of "$kernel")" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters \
    $PY scripts/bench_kernels.py --preset "$PRESET" --batch "$BATCH" --bv "$bv" --warps "$warps" --kernels "$kernel" \
    --peers off "${extra[@]}" --out "$OUT/ncu-scratch.csv" > "$OUT/ncu-$tag.txt" 2>&1
  echo "== $((SECONDS - t0))s ncu $tag (rc $?)"
  grep -E "DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Executed Ipc A|Duration" \
    "$OUT/ncu-$tag.txt" | head -8
done
rm -f "$OUT/ncu-scratch.csv" "$OUT/ncu-scratch.manifest.json"
[ -f "$OUT/kernels.txt" ] && cat "$OUT/kernels.txt"
