#!/usr/bin/env bash
# The field's kernels beside ours on a CUDA box (issue 21): the harness's own runs with the peers as
# baseline backends (fla, SGLang, FlashInfer; same rounds, same comparisons, reported not gated), then the
# per-kernel table (scripts/bench_kernels.py, ours and the peers' one layer at a time).
#
# The peers' wheels travel with the tree (scripts/stage_peers.sh): with the first copy run
# `bash .carry/a/keep.sh`, with the second `bash .carry/b/install.sh && bash scripts/gpu_peers.sh`. The staged
# packages live in /tmp/site, which install.sh appends to sys.path: they fill what the box lacks and
# shadow nothing (PYTHONPATH here is the repository alone).
#
# Usage: OUT=/tmp/p bash scripts/gpu_peers.sh [tests] [mtp] [mtp-kda] [decode] [bench]   (default: all, in order)
#   tests: the adapters' own tests on the real kernels (pytest -m cuda tests/test_baselines.py), a minute
#   ROUNDS=8 CHECK=8 (rounds compared; requests checked against fp64)  MTP_BATCH=128,256  KDA_BATCH=128  DECODE_BATCH=1,128
# Writes under $OUT: peers.txt (what the adapters find), tests.txt, <step>.json / .log, runs.tgz (every run
# directory, rewritten after each step), peers/<case>/ (each run's manifest, throughput and equivalence files,
# the layout scripts/h200_summary.py reads from a reference folder's peers/), kernels.csv / kernels.txt
# (bench); prints the peers' rows beside ours last.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs/peers}
ROUNDS=${ROUNDS:-8}
CHECK=${CHECK:-8}
RUNS="$OUT/runs"
mkdir -p "$RUNS"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
steps=${*:-tests mtp mtp-kda decode bench}

$PY - <<'EOF' | tee "$OUT/peers.txt"
import sys
from kernels.ssm.baselines import BASELINES
print("/tmp/site on sys.path:", "/tmp/site" in sys.path)
for b in BASELINES.values():
    print(f"{b.name}: {b.peer.dist} {b.peer.installed() or 'absent'} (pinned {b.peer.pin}): "
          f"{b.available('cuda') or 'loads'}")
EOF

step() {
  local name=$1; shift
  local start=$SECONDS
  "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" || echo "FAILED ($?): $name (see $name.log)"
  echo "== $name $((SECONDS - start)) s"
  tar -C "$RUNS" -czf "$OUT/runs.tgz" .
  run=$($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['run'])" "$OUT/$name.json" 2>/dev/null) || return 0
  mkdir -p "$OUT/peers/$name"
  cp "$run"/manifest.json "$run"/throughput.csv "$run"/equivalence.json "$run"/equivalence.md "$OUT/peers/$name/"
}
common=(--device cuda --state-dtype fp32 --rounds "$ROUNDS" --out "$RUNS" --json)
for s in $steps; do
  case $s in
    tests) start=$SECONDS
           $PY -m pytest -q -p no:cacheprovider -m cuda tests/test_baselines.py > "$OUT/tests.txt" 2>&1 \
             || echo "FAILED ($?): tests (see tests.txt)"
           echo "== tests $((SECONDS - start)) s: $(tail -n 1 "$OUT/tests.txt")" ;;
    mtp) step mtp-fixed-qwen3-next $PY -m harness run mtp-fixed "${common[@]}" --preset qwen3-next --check-requests "$CHECK" --batch "${MTP_BATCH:-128,256}" --drafts 3 \
           --backend triton,fla,sglang,flashinfer ;;
    # KDA (GLM-5.3-Flash): SGLang's KDA ReplaySSM and fla's KDA recurrence beside ours
    mtp-kda) step mtp-fixed-glm-5.3-flash-tp8 $PY -m harness run mtp-fixed "${common[@]}" --preset glm-5.3-flash-tp8 \
               --check-requests "$CHECK" \
               --batch "${KDA_BATCH:-128}" --drafts 3 --backend triton,fla,sglang ;;
    # decode checks one request per batch: its default batches start at 1 (--check-requests <= the batch)
    decode) step decode-qwen3-next $PY -m harness run decode "${common[@]}" --preset qwen3-next --check-requests "${DECODE_CHECK:-1}" \
              --batch "${DECODE_BATCH:-1,128}" \
              --backend triton,fla,flashinfer ;;
    bench) start=$SECONDS
           $PY scripts/bench_kernels.py --preset qwen3-next --batch "${BENCH_BATCH:-1,32,128,256}" --drafts 3 \
             --bv "${BV:-16,32,64}" --warps "${WARPS:-1,2}" --jobs "${JOBS:-12}" --out "$OUT/kernels.csv" > "$OUT/kernels.txt" 2> "$OUT/kernels.log" \
             || echo "FAILED ($?): bench (see kernels.log)"
           echo "== bench $((SECONDS - start)) s" ;;
    *) echo "unknown step $s (tests | mtp | mtp-kda | decode | bench)"; exit 2 ;;
  esac
done

for f in "$OUT"/mtp-fixed-qwen3-next.json "$OUT"/mtp-fixed-glm-5.3-flash-tp8.json "$OUT"/decode-qwen3-next.json; do
  [ -s "$f" ] || continue
  echo "== $(basename "$f" .json)"
  $PY - "$f" <<'EOF'
import json, sys
import pandas as pd
run = json.load(open(sys.argv[1]))["run"]
t = pd.read_csv(f"{run}/throughput.csv")
t = t[t["status"].notna()].sort_values(["batch", "mode", "backend"])
t["reason"] = t["reason"].fillna("").str.slice(0, 70)
t["variant"] = t["variant"].fillna("")
t["median_us"] = t["median_us"].round(1)
t.loc[t["status"] == "passed", "reason"] = ""
cols = ["batch", "mode", "variant", "backend", "status", "median_us", "reason"]
print(t[cols].to_string(index=False))
EOF
done
[ -s "$OUT/kernels.txt" ] && tail -n 40 "$OUT/kernels.txt"
exit 0
