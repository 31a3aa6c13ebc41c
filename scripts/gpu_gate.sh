#!/usr/bin/env bash
# The equivalence gate on a GPU box: tiny and model shapes, torch + triton backends.
# Uses the machine's own torch/triton (installs the project without resolving dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/runs}
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH=$PWD
$PY -m harness gate --device cuda --shapes tiny --junit "$OUT/gate-tiny.xml" --out "$OUT"
$PY -m harness gate --device cuda --shapes model --junit "$OUT/gate-model.xml" --out "$OUT"
