#!/usr/bin/env bash
# The GPU gate (`make gpu-gate`): the equivalence gate at tiny and model shapes (torch + triton, real
# compilation), then the CUDA-only tests (`pytest -m cuda`: graph capture, offsets past 2^31, pinned
# pages). Every step runs even when an earlier one fails, and the script exits non-zero if any did.
# Writes under $OUT: the two gate run directories, gate-tiny.xml, gate-model.xml, pytest-cuda.xml (JUnit,
# one test per comparison / expected variant / test, named by case and contract), each step's log
# (<step>.log) and gpu-gate-times.json (scripts/gate_times.py: cold or warm Triton cache, total seconds,
# and per step its exit status, seconds and verdict; rewritten after every step). Target on one H200
# (SPEC §7, issue 23): model gate < 2 min, everything < 5 min from a cold Triton cache.
# Uses the machine's own torch/triton (installs the project without resolving dependencies).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs}
mkdir -p "$OUT"
start_all=$SECONDS
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH=$PWD
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-gate: no CUDA device visible to $PY; refusing to report a GPU gate that ran nothing" >&2
  exit 2
fi
# the interpreter would hide what the GPU gate is for (real fp contraction, graph capture)
export TRITON_INTERPRET=0
times="$OUT/gpu-gate-times.json"
cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}  # where Triton keeps compiled kernels (its default)
$PY scripts/gate_times.py start --times "$times" --cache "$cache"
status=0
STEP_TIMEOUT=${STEP_TIMEOUT:-900}  # seconds a step may take before it is stopped and counted as failed
step() {
  local name=$1 junit=$2; shift 2
  local start=$SECONDS rc seconds
  echo "== $(date +%T) $name: $*"
  timeout "$STEP_TIMEOUT" "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]} seconds=$((SECONDS - start))
  [ "$rc" -eq 0 ] || { echo "FAILED ($rc): $name"; status=1; }
  $PY scripts/gate_times.py step --times "$times" --name "$name" --rc "$rc" --seconds "$seconds" \
    --log "$OUT/$name.log" --junit "$junit"
  echo "$name rc=$rc $seconds s"
}
step gate-tiny "$OUT/gate-tiny.xml" \
  $PY -m harness gate --device cuda --shapes tiny --junit "$OUT/gate-tiny.xml" --out "$OUT"
step gate-model "$OUT/gate-model.xml" \
  $PY -m harness gate --device cuda --shapes model --junit "$OUT/gate-model.xml" --out "$OUT"
# test_notebook.py holds no CUDA test and imports jupyter packages a GPU box's python need not have
step pytest-cuda "$OUT/pytest-cuda.xml" \
  $PY -m pytest -q -m cuda -rs -p no:cacheprovider --junitxml "$OUT/pytest-cuda.xml" tests --ignore=tests/test_notebook.py
$PY scripts/gate_times.py finish --times "$times" --total $((SECONDS - start_all))
cat "$times"
exit $status
