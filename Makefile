# Everyday entry points. CPU: setup, test (the fast suite), test-slow, gate, decode. GPU box: gpu-gate, gpu-bench.
PY := .venv/bin/python
HARNESS := .venv/bin/harness

.PHONY: setup test test-slow gate decode gpu-gate gpu-bench gpu-pd-dist

setup:
	python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[dev]'

test:
	$(PY) -m pytest -q -n 2

# the tests marked slow (tests/conftest.py), which .ci/run runs after the fast suite
test-slow:
	$(PY) -m pytest -q -n 2 -m slow

gate:
	TRITON_INTERPRET=1 $(HARNESS) gate --device cpu

decode:
	$(HARNESS) run decode

# On a CUDA machine whose python already has torch + triton (no dependency resolution).
gpu-gate:
	bash scripts/gpu_gate.sh

gpu-bench:
	bash scripts/gpu_bench.sh

# On a box with 2 or more GPUs: pd-roundtrip across processes over NCCL (scripts/gpu_pd_dist.sh).
gpu-pd-dist:
	bash scripts/gpu_pd_dist.sh
