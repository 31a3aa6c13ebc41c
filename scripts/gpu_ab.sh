#!/usr/bin/env bash
# One measurement on two trees of this repository, in one call on one GPU: the committed tree REF (default
# HEAD, unpacked with `git archive`; or a directory holding an unpacked tree, for a device copy whose .git is
# stale) and the working tree, so a change's before and after share the card, the clocks and the session
# (compare timings only within one call). Each tree keeps its own Triton cache. TOOL=run (default) runs
# `harness run ARGS`; TOOL=bench runs `scripts/bench_kernels.py ARGS` (one kernel at a time). Writes
# $OUT/ab.tgz (both sides' outputs and logs), re-tarred after each side; prints each side's rows last.
#
# Usage: OUT=/tmp/ab bash scripts/gpu_ab.sh mtp-fixed --preset qwen3-next --device cuda --batch 128 --drafts 3
#        TOOL=bench REF=.ab-ref bash scripts/gpu_ab.sh --preset qwen3-next --batch 128 --kernels replay-precompute
#   REF=HEAD (a commit or a directory)   RUN_TIMEOUT=300 (seconds per side)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/ab}
REF=${REF:-HEAD}
TOOL=${TOOL:-run}
[ $# -ge 1 ] || { echo "error: give the scenario (TOOL=run) or bench_kernels' options (TOOL=bench)" >&2; exit 2; }
case "$TOOL" in run|bench) ;; *) echo "error: TOOL is run or bench, got '$TOOL'" >&2; exit 2;; esac
mkdir -p "$OUT"
work=$(mktemp -d)
if [ -d "$REF" ]; then
  cp -r "$REF"/. "$work"
  ref_name="$REF ($(cat "$REF/.ref" 2>/dev/null || echo 'unnamed tree'))"
else
  git archive --format=tar "$REF" | tar -x -C "$work" || { echo "error: cannot unpack $REF" >&2; exit 2; }
  ref_name=$(git rev-parse --short "$REF")
fi
mkdir -p "$work/ab/ref" "$work/ab/tree"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > "$work/ab/gpu.txt" 2>&1
echo "ref $ref_name, tree $(git rev-parse --short HEAD) + $(git status --short | wc -l) changed paths" > "$work/ab/trees.txt"
for side in ref tree; do
  src=$PWD; [ "$side" = ref ] && src=$work
  if [ "$TOOL" = run ]; then cmd=(-m harness run "$@" --out "$work/ab/$side")
  else cmd=(scripts/bench_kernels.py "$@" --out "$work/ab/$side/kernels.csv"); fi
  t0=$SECONDS
  (cd "$src" && PYTHONPATH=$src TRITON_CACHE_DIR="$work/cache-$side" timeout "${RUN_TIMEOUT:-300}" \
     $PY "${cmd[@]}" > "$work/ab/$side.log" 2>&1)
  echo "== $side rc=$? $((SECONDS - t0)) s" | tee -a "$work/ab/trees.txt"
  tar -C "$work" -czf "$OUT/ab.tgz" ab
done
cat "$work/ab/trees.txt"
for side in ref tree; do
  echo "== $side"
  if [ "$TOOL" = run ]; then $PY scripts/print_rows.py "$work/ab/$side"; else grep -A50 "ceiling" "$work/ab/$side.log"; fi
done
