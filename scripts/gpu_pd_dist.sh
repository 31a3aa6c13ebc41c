#!/usr/bin/env bash
# pd-roundtrip across GPUs (issue 10): prefill TP p and decode TP d as processes of one torch.distributed
# group over NCCL, one GPU per process, on a box with 2, 4 or 8 GPUs (nvidia-h200-x2 / x4 / x8).
# Prefill rank i runs on GPU i, decode rank j on GPU N-1-j: pairs with p + d <= N use disjoint GPUs (every
# byte crosses NVLink); larger pairs up to max(p, d) <= N share the middle GPUs; pairs needing more GPUs
# are `unsupported` rows. Every pair is checked byte for byte (contracts 4, 5) on every process, then the
# export, the NVLink transfer and the import of about 64 MiB of pages are timed (CUDA events, the slowest
# process per sample), the transfer against the link ceiling measured in the same run (the same bytes by
# plain send/recv between the same GPUs).
#   1. Llama-3-8B (GQA 8 x 128, 32 layers), DeepSeek-V3 (MLA 576, 61 layers) and Qwen3-Next (GQA 2 x 256,
#      so TP 4 and 8 replicate heads, plus the GDN state page), triton backend, --nproc N;
#   2. the torch backend on one small case (the reference kernels across processes);
#   3. the same run once through torchrun (the other way in), one pair.
# One run directory per line under $OUT, and a markdown report of each at the end; a run that fails prints
# FAILED and the others still run. About 2-4 minutes on 8 H200s (process start-up and Triton compiles
# dominate).
# Usage: OUT=/path/to/out bash scripts/gpu_pd_dist.sh       (NPROC defaults to every visible GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast (NVLS, symmetric-memory multicast) stays off: point-to-point sends need none of it, and on
# shared hosts a program using it can take the GPUs out of service. Set for every process started below.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs}
PAGE_TOKENS=${PAGE_TOKENS:-128}
PRESETS=${PRESETS:-"llama-3-8b deepseek-v3 qwen3-next"}
RUN_TIMEOUT=${RUN_TIMEOUT:-400}
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH=$PWD
NPROC=${NPROC:-$($PY -c "import torch; print(torch.cuda.device_count())")}
if [ "$NPROC" -lt 2 ]; then
  echo "pd-roundtrip --transport dist needs at least 2 GPUs, this box has $NPROC"; exit 2
fi
mkdir -p "$OUT"
nvidia-smi topo -m > "$OUT/nvidia-smi-topo.txt" 2>&1 || true

run() {
  echo "== $(date +%T) $*"
  timeout "$RUN_TIMEOUT" "$@" --out "$OUT" --json > /dev/null || echo "FAILED ($?): $*"
}

for preset in $PRESETS; do
  run $PY -m harness run pd-roundtrip --transport dist --nproc "$NPROC" --device cuda --backend triton \
    --preset "$preset" --page-tokens "$PAGE_TOKENS"
done
run $PY -m harness run pd-roundtrip --transport dist --nproc "$NPROC" --device cuda --backend torch \
  --preset llama-3-8b --page-tokens 64 --pages 4 --tp-pairs 1:2,2:1
run $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m harness run pd-roundtrip --transport dist \
  --device cuda --backend triton --preset llama-3-8b --page-tokens "$PAGE_TOKENS" --tp-pairs 1:1

for dir in "$OUT"/*pd-roundtrip*/; do
  [ -f "$dir/manifest.json" ] && $PY -m harness report "$dir" --markdown > "$dir/report.md" || true
done
echo "== $(date +%T) done; runs under $OUT (each with report.md)"
