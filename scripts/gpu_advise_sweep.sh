#!/usr/bin/env bash
# The sweep `harness advise` stands on (issue 22), on an H200, in parts that each fit one 10-minute command:
# per part, one preset and state dtype and a few draft counts; per draft count, `harness autotune ssm` (tuned
# configs into the part's cache) and then the rows with that cache: decode for drafts 0 (no speculation),
# mtp-fixed --accept geometric:0.7 otherwise, at batch 1,8,32,128,256,512, every mode and the
# run's default variants (RUN_VARIANTS, scenarios/ssm_options.py) with the fla baseline, CUDA-graph timing. OOM rows stay:
# they are data. Writes under $OUT (which returns at most 8 files): <part>.tgz (the run directories, the
# autotune runs, cache.json, times.txt), re-tarred after every step so a command cut short keeps what it did;
# prints each run's median_us per batch and mode last.
#
# Usage (one part a command):  PART=1 bash scripts/gpu_advise_sweep.sh      (PART=list prints the parts)
#   PARTS="qwen3-next:fp32:0,1 glm-5.3-flash-tp8:bf16:3"   (preset:state dtype:drafts; instead of PART)
#   BATCH=1,8,32,128,256,512  TUNE_BATCH=128  (configs tuned at 128, looked up by nearest bucket at every batch)
#   ROUNDS=2 CHECK=1 (requests checked against fp64: the sweep times, the model gate checks)  BACKEND=triton,fla
#   DEVICE=cuda (DEVICE=cpu BACKEND=torch PARTS=tiny-gdn:fp32:0,1 BATCH=1,2 TUNE_BATCH=2: a CPU smoke test of the script)
#
# Device time, estimated from the committed H200 runs (manifest wall_s / case_wall_s, modes/times.txt):
#   autotune at one bucket: Qwen3-Next drafts 0 22 s, drafts 3 73 s; GLM drafts 3 61 s (h200-2026-12-03/modes);
#     drafts 1 and 7 are not measured: taken as 50 s and 100 s (Qwen), 0.85x that for GLM.
#   a run of 4 batches (1,32,128,512; h200-2026-12-02b): decode 70 s, mtp-fixed drafts 3 94 s, the first case
#     ~40 s of Triton compiles, then 5-29 s a case; 6 batches: about decode 90 s, drafts 1 115 s, drafts 3 145 s,
#     drafts 7 190 s (more tokens a round); GLM rows at batch 128 took half Qwen's (13 s against 27 s): 0.7x.
#   Parts (below), estimated: Qwen3-Next 0,1 ~280 s, 3 ~220 s, 7 ~290 s per state dtype; GLM 0,1 ~200 s,
#   3,7 ~380 s per state dtype. All ten: ~2700 s (45 min) plus a machine start: two device sessions
#   (Qwen3-Next parts 1-6 ~26 min; GLM parts 7-10 ~19 min). A warm machine keeps its Triton cache across
#   parts, so later parts compile less; RUN_TIMEOUT (default 330 s) bounds each harness command.
set -uo pipefail
cd "$(dirname "$0")/.."
# Batch 1..512 in one process: without expandable segments the caching allocator's fragments from the small
# batches made batch 512 `oom` at 36 GiB asked with 34 GiB reserved and unused (h100-2026-12-07, part 1).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/advise-sweep}
BATCH=${BATCH:-1,8,32,128,256,512}
TUNE_BATCH=${TUNE_BATCH:-128}
ROUNDS=${ROUNDS:-2}
CHECK=${CHECK:-1}
BACKEND=${BACKEND:-triton,fla}
RUN_TIMEOUT=${RUN_TIMEOUT:-330}
DEVICE=${DEVICE:-cuda}
DEFAULT_PARTS=(
  qwen3-next:fp32:0,1 qwen3-next:fp32:3 qwen3-next:fp32:7
  qwen3-next:bf16:0,1 qwen3-next:bf16:3 qwen3-next:bf16:7
  glm-5.3-flash-tp8:fp32:0,1 glm-5.3-flash-tp8:fp32:3,7
  glm-5.3-flash-tp8:bf16:0,1 glm-5.3-flash-tp8:bf16:3,7
)
if [ "${PART:-}" = list ]; then
  for i in "${!DEFAULT_PARTS[@]}"; do echo "PART=$((i + 1)): ${DEFAULT_PARTS[$i]}"; done
  exit 0
fi
if [ -n "${PARTS:-}" ]; then
  read -r -a parts <<< "$PARTS"
elif [ -n "${PART:-}" ]; then
  [[ "$PART" =~ ^[0-9]+$ ]] && [ "$PART" -ge 1 ] && [ "$PART" -le ${#DEFAULT_PARTS[@]} ] \
    || { echo "error: PART must be 1..${#DEFAULT_PARTS[@]} or list, got $PART" >&2; exit 2; }
  parts=("${DEFAULT_PARTS[$((PART - 1))]}")
else
  echo "error: give PART=1..${#DEFAULT_PARTS[@]} (one part a command; PART=list) or PARTS=preset:dtype:drafts" >&2
  exit 2
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT"

for part in "${parts[@]}"; do
  IFS=: read -r preset dtype drafts_list <<< "$part"
  name="$preset-$dtype-d${drafts_list//,/_}"
  work=$(mktemp -d)
  cache="$work/cache.json"
  times="$work/times.txt"
  : > "$times"
  step() {  # name, command...: wall seconds into times.txt; a failure or timeout is a line, the part goes on
    local what=$1; shift
    local start=$SECONDS
    timeout "$RUN_TIMEOUT" "$@" > "$work/$what.json" 2> "$work/$what.log"
    local rc=$?
    echo "$what rc=$rc $((SECONDS - start)) s" | tee -a "$times"
    tar -C "$work" -czf "$OUT/$name.tgz" .
  }
  for d in ${drafts_list//,/ }; do
    step "autotune-$preset-$dtype-d$d" $PY -m harness autotune ssm --device "$DEVICE" --preset "$preset" --batch "$TUNE_BATCH" \
      --drafts "$d" --state-dtype "$dtype" --autotune-cache "$cache" --out "$work/runs" --json
    scenario=mtp-fixed; extra=(--drafts "$d" --accept geometric:0.7)
    [ "$d" = 0 ] && { scenario=decode; extra=(); }
    step "$scenario-$preset-$dtype-d$d" $PY -m harness run "$scenario" --preset "$preset" --device "$DEVICE" \
      --backend "$BACKEND" --batch "$BATCH" --state-dtype "$dtype" --rounds "$ROUNDS" --check-requests "$CHECK" \
      --memory-budget-gib 140 --autotune-cache "$cache" --out "$work/runs" --json "${extra[@]}"
  done
  echo "== $name: $OUT/$name.tgz"
  $PY scripts/print_rows.py "$work/runs"
done
