#!/usr/bin/env bash
# One `harness run` on two trees of this repository, in one call on one GPU: the committed tree REF (default
# HEAD, unpacked with `git archive`) and the working tree, so a change's before and after share the card,
# the clocks and the session (compare timings only within one call). Each tree keeps its own Triton cache.
# Writes $OUT/ab.tgz (both run directories, each tree's log), re-tarred after each tree; prints each run's
# rows (median us per batch, mode and variant) last.
#
# Usage: OUT=/tmp/ab bash scripts/gpu_ab.sh mtp-fixed --preset qwen3-next --device cuda --batch 128 --drafts 3
#   REF=HEAD (any commit)   RUN_TIMEOUT=300 (seconds per tree)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/ab}
REF=${REF:-HEAD}
[ $# -ge 1 ] || { echo "error: give the scenario and its options, e.g. mtp-fixed --preset qwen3-next --device cuda" >&2; exit 2; }
mkdir -p "$OUT"
work=$(mktemp -d)
git archive --format=tar "$REF" | tar -x -C "$work" || { echo "error: cannot unpack $REF" >&2; exit 2; }
mkdir -p "$work/ab/ref" "$work/ab/tree"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > "$work/ab/gpu.txt" 2>&1
echo "ref $(git rev-parse --short "$REF"), tree $(git rev-parse --short HEAD) + $(git status --short | wc -l) changed paths" \
  > "$work/ab/trees.txt"
for side in ref tree; do
  src=$PWD; [ "$side" = ref ] && src=$work
  t0=$SECONDS
  (cd "$src" && PYTHONPATH=$src TRITON_CACHE_DIR="$work/cache-$side" timeout "${RUN_TIMEOUT:-300}" \
     $PY -m harness run "$@" --out "$work/ab/$side" > "$work/ab/$side.log" 2>&1)
  echo "== $side rc=$? $((SECONDS - t0)) s" | tee -a "$work/ab/trees.txt"
  tar -C "$work" -czf "$OUT/ab.tgz" ab
done
cat "$work/ab/trees.txt"
$PY - "$work/ab" <<'PYEOF'
import sys
from pathlib import Path

import pandas as pd

for side in ("ref", "tree"):
    for csv in sorted(Path(sys.argv[1], side).glob("*/throughput.csv")):
        t = pd.read_csv(csv)
        t["mode"] = (t["mode"] + "-" + t["variant"].fillna("")).str.rstrip("-") + "/" + t["backend"]
        t["cell"] = t["median_us"].map("{:.0f}".format).where(t["status"] == "passed", t["status"])
        print(f"-- {side}: {csv.parent.name}")
        print(t.pivot_table(index="batch", columns="mode", values="cell", aggfunc="first").to_string())
PYEOF
