#!/usr/bin/env bash
# Stage the peers' wheels (the baselines' libraries, kernels/ssm/baselines) for a CUDA box with no package
# registry (Python 3.12, x86-64) that receives the tree in copies of at most 64 MiB each, tree included.
#
#   bash scripts/stage_peers.sh     (in the checkout that goes to the box; writes its .carry/, git-ignored)
#
# It runs ../shared/tools/stage_wheels.sh (STAGE_WHEELS= to point elsewhere) with the pins below, so the
# 92 MB nvidia-cutlass-dsl-libs-cu13 wheel is split over the two copies, then slims the two large peers:
#   sglang            only the kernel files the adapters load (its GDN and KDA ReplaySSM files and the KDA
#                     recurrent verify, kernels/ssm/baselines/sglang.py) and its dist-info (the version), 39 MB -> a few kB;
#   flashinfer-python without flashinfer/data/ (cubins and CUDA sources the GDN CuTe DSL path does not use),
#                     experimental/, fused_moe/ and moe_ep/ (not imported by flashinfer.gdn_decode), 62 -> 6.4 MB;
#                     it travels in the first copy (a one-part "split": the whole wheel as part0, an empty
#                     part1), so that each copy stays under 64 MiB.
# Beside the peers: the pure-Python packages their import path needs (einops for fla-core; requests, tqdm,
# nvidia-ml-py and cuda-pathfinder for FlashInfer's), which fill what the box lacks without shadowing.
#
# On the box: with the first copy (.carry/a) `bash .carry/a/keep.sh`; with the second (.carry/b), right after,
# `bash .carry/b/install.sh && bash scripts/gpu_peers.sh`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)  # slim_wheel.py beside this script (the tree staged may be another checkout)
cd "$(git rev-parse --show-toplevel)"
STAGE=${STAGE_WHEELS:-../shared/tools/stage_wheels.sh}
PEERS=(sglang==0.5.23 flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
       nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15 fla-core==0.6.0)
DEPS=(einops==0.8.2 requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1 charset-normalizer==3.5.3
      tqdm==4.70.1 nvidia-ml-py==13.615.71 cuda-pathfinder==1.9.1)
PART_MB=70 bash "$STAGE" "${PEERS[@]}" "${DEPS[@]}"  # only the cutlass-cu13 wheel is over 70 MB: it splits

slim=$(mktemp -d)
sg=$(ls .carry/b/sglang-0.5.23-*.whl)
python3 "$here/slim_wheel.py" "$sg" "$slim" --keep sglang/kernels/ops/attention/linear/gdn_replayssm_spec_decode.py \
  --keep sglang/kernels/ops/attention/linear/kda_replayssm_spec_decode.py \
  --keep sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py
mv "$slim/$(basename "$sg")" "$sg"
fi=$(ls .carry/b/flashinfer_python-0.7.2.post1-*.whl)
name=$(basename "$fi")
python3 "$here/slim_wheel.py" "$fi" "$slim" --drop flashinfer/data/ --drop flashinfer/experimental/ \
  --drop flashinfer/fused_moe/ --drop flashinfer/moe_ep/
rm "$fi"
mv "$slim/$name" ".carry/a/$name.part0"  # the whole slim wheel rides in the first copy
: > ".carry/b/$name.part1"
echo "$(sha256sum ".carry/a/$name.part0" | cut -c1-64) $name" >> .carry/b/parts.txt
rmdir "$slim"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for part in a b; do
  bytes=$(du -cb .carry/$part | tail -1 | cut -f1)
  echo "copy $part: .carry/$part $((bytes / 1048576)) MiB + the tree $((tree / 1048576)) MiB = $(((bytes + tree) / 1048576)) MiB of 64"
done
