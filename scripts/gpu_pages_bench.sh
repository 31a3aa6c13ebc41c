#!/usr/bin/env bash
# The KV page benchmark of issue 4 on a CUDA box (sized for one H200, about 5 minutes):
# * cpu-page-restore over page sizes 16..1024 tokens (page chunks of a few KiB to MiBs, so the small-page
#   cliff shows) for Llama-3-8B (GQA 8 x 128, 32 layers), Qwen3-Next's attention layers (GQA 2 x 256, 12),
#   DeepSeek-V3 (MLA 576, 61) and GLM-5.3-Flash-TP8's MLA layers (11), direct and staged, triton backend;
#   plus the torch backend on one small case;
# * pd-roundtrip at every TP pair of 1, 2, 4, 8 for Llama-3-8B and DeepSeek-V3.
# Every case first checks its transfers byte for byte on a few pages (contracts 4, 5), then times a
# transfer of about 64 MiB (--pages auto) against the ceilings measured in the same run (pinned h2d/d2h,
# d2d). One run directory per line under $OUT, each with its GB/s-vs-page-bytes figure; a run that
# fails prints FAILED and the others still run.
# Usage: OUT=results/runs bash scripts/gpu_pages_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs}
SIZES=${SIZES:-16,32,64,128,256,512,1024}
PRESETS=${PRESETS:-"llama-3-8b qwen3-next deepseek-v3 glm-5.3-flash-tp8"}
PD_PRESETS=${PD_PRESETS:-"llama-3-8b deepseek-v3"}
PD_TOKENS=${PD_TOKENS:-128}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH=$PWD

run() {
  echo "== $(date +%T) harness run $*"
  timeout "$RUN_TIMEOUT" $PY -m harness run "$@" --device cuda --out "$OUT" --json > /dev/null \
    || echo "FAILED ($?): harness run $*"
}

for preset in $PRESETS; do
  run cpu-page-restore --preset "$preset" --page-size "$SIZES" --backend triton --variant direct,staged
done
# the PyTorch reference on one small case (it scatters pinned pages on the host: two pages per call)
run cpu-page-restore --preset llama-3-8b --page-size 64 --backend torch --variant direct,staged --pages 2
for preset in $PD_PRESETS; do
  run pd-roundtrip --preset "$preset" --page-tokens "$PD_TOKENS" --backend triton
done
echo "== $(date +%T) done; runs under $OUT"
