"""A short H200 session when device time is scarce: the equivalence gate on a subset of its cases at
tiny and model shapes (torch + triton), then a reduced state-mode benchmark sweep. Writes run
directories under $OUT (or results/runs). The full versions are scripts/gpu_gate.sh and gpu_bench.sh.

    python3 scripts/gpu_quick.py [gate|bench|all]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from harness.gate import run_gate
from harness.runner import run_scenario

OUT = Path(os.environ.get("OUT", "results/runs"))
GATE_TINY = [
    ("mtp-dynamic", {"preset": "tiny-gdn", "state_dtype": "fp32", "batch": "4", "drafts": 3, "accept": "geometric:0.5",
                     "rounds": 12, "history_len": 4}),
    ("mtp-fixed", {"preset": "tiny-kda", "state_dtype": "bf16", "batch": "3", "drafts": 3, "accept": "geometric:0.7",
                   "rounds": 12, "history_len": 4}),
    ("checkpoint-restore", {"preset": "tiny-gdn", "state_dtype": "fp32", "batch": "4", "drafts": 2, "rounds": 9,
                            "history_len": 4}),
]
GATE_MODEL = [
    ("mtp-fixed", {"preset": "qwen3-next", "state_dtype": "fp32", "batch": "3", "drafts": 3, "rounds": 4,
                   "check_requests": 1, "snapshot_every": 4}),
    ("mtp-dynamic", {"preset": "glm-5.3-flash-tp8", "state_dtype": "bf16", "batch": "4", "drafts": 3, "rounds": 4,
                     "check_requests": 1, "snapshot_every": 4}),
]
BENCH = [
    ("mtp-fixed", {"preset": "qwen3-next", "drafts": 3, "accept": "geometric:0.7", "batch": "32,256"}),
    ("mtp-fixed", {"preset": "qwen3-next", "drafts": 3, "accept": "geometric:0.7", "batch": "1,128"}),
    ("decode", {"preset": "qwen3-next", "modes": "native,replay", "batch": "1,32,256"}),
    ("mtp-fixed", {"preset": "glm-5.3-flash-tp8", "drafts": 3, "accept": "geometric:0.7", "batch": "32,256"}),
]
COMMON = {"device": "cuda", "backend": "triton,fla", "state_dtype": "fp32", "rounds": 2, "check_requests": 1,
          "memory_budget_gib": 128}


def gate(cases: list, tag: str) -> None:
    t = time.time()
    outcome = run_gate(device="cuda", backends="torch,triton", cases=cases, out_root=OUT,
                       junit=OUT / f"gate-{tag}.xml", argv=sys.argv)
    print(f"gate {tag}: {outcome.lines[0]} ({time.time() - t:.0f}s) -> {outcome.path}", flush=True)
    for line in outcome.lines[1:8]:
        print(line, flush=True)


def bench() -> None:
    for name, opts in BENCH:
        t = time.time()
        res = run_scenario(name, {**COMMON, **opts}, argv=["scripts/gpu_quick.py", name], out_root=OUT)
        print(f"{name} {opts['preset']}: {res.equivalence.summary()} ({time.time() - t:.0f}s) -> {res.path}",
              flush=True)
        for r in res.rows:
            us = f"{r['median_us']:.0f}us" if r.get("median_us") else "-"
            pct = f"{r.get('ceiling_pct') or 0:.0f}%"
            print(f"  b{r['batch']} {r['mode']}/{r['backend']}: {r['status']} {us} {pct} {r.get('reason') or ''}"[:160],
                  flush=True)


def main(what: str) -> None:
    if what in ("gate", "all"):
        gate(GATE_TINY, "tiny")
    if what in ("bench", "all"):
        bench()
    if what in ("gate", "all"):
        gate(GATE_MODEL, "model")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
