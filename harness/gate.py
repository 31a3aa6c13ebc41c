"""`harness gate`: every SPEC §5 contract at gate shapes, no timing; fails on any broken comparison.

The gate cases are data (below): both families, fp32 and bf16 state, fixed and dynamic widths,
several acceptance patterns, a long decode rollout for drift, KV page transfers (CPU pages at every TP
degree, PD pages at every TP pair, GQA and MLA), on every backend that can run here.
They go through the same scenario code as `harness run` (with timing off), so the gate checks what
the benchmarks run. The result is an ordinary run directory (`results/runs/<id>-gate/`) whose
equivalence.md is the gate report; `--junit` also writes one test case per comparison.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness import env
from harness.runner import DEFAULT_OUT, make_context
from results.store import RunWriter
from scenarios import get_scenario

TINY = ("tiny-gdn", "tiny-kda")


def tiny_cases() -> list[tuple[str, dict[str, Any]]]:
    """Gate cases at CPU-test size: (scenario, options)."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for preset in TINY:
        for sd in ("fp32", "bf16"):
            base = {"preset": preset, "state_dtype": sd}
            cases += [
                ("decode", {**base, "batch": "3", "rounds": 24, "history_len": 4}),
                ("mtp-fixed", {**base, "batch": "3", "drafts": 3, "accept": "geometric:0.7", "rounds": 16}),
                ("mtp-fixed", {**base, "batch": "2", "drafts": 2, "accept": "fixed:1", "rounds": 12, "history_len": 4}),
                ("mtp-fixed", {**base, "batch": "2", "drafts": 1, "accept": "none", "rounds": 12}),
                ("mtp-fixed", {**base, "batch": "2", "drafts": 3, "accept": "all", "rounds": 12, "history_dtype": "bf16"}),
                ("mtp-dynamic", {**base, "batch": "4", "drafts": 3, "accept": "geometric:0.5", "rounds": 16}),
                ("checkpoint-restore", {**base, "batch": "4", "drafts": 2, "accept": "geometric:0.6", "rounds": 9,
                                        "history_len": 4}),
            ]
        # drift over a long rollout (>= 1024 tokens per request), fp32 state
        cases.append(("decode", {"preset": preset, "state_dtype": "fp32", "batch": "1", "rounds": 1024,
                                 "snapshot_every": 256}))
    cases += page_cases(TINY, page_size=16)
    return cases


def interpreter_cases() -> list[tuple[str, dict[str, Any]]]:
    """Short SSM cases that also run the Triton kernels when they can only run in the interpreter (CPU,
    ~40x slower than torch): both families, fp32 and bf16 state, dynamic widths with idle rows, folds,
    decode and a restore. The other tiny SSM cases then run on the torch backend only."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for preset in TINY:
        for sd in ("fp32", "bf16"):
            cases.append(("mtp-dynamic", {"preset": preset, "state_dtype": sd, "batch": "3", "drafts": 2,
                                          "accept": "geometric:0.6", "rounds": 6, "history_len": 4,
                                          "backend": "torch,triton"}))
    cases.append(("decode", {"preset": "tiny-kda", "state_dtype": "fp32", "batch": "2", "rounds": 10,
                             "history_len": 4, "backend": "torch,triton"}))
    cases.append(("checkpoint-restore", {"preset": "tiny-gdn", "state_dtype": "fp32", "batch": "2", "drafts": 1,
                                         "rounds": 5, "history_len": 4, "backend": "torch,triton"}))
    return cases


def page_cases(presets: tuple[str, ...], page_size: int) -> list[tuple[str, dict[str, Any]]]:
    """KV page transfers (contracts 4, 5): CPU pages at every TP degree with both variants, and PD pages at
    every TP pair, with the hybrid state page where the preset has SSM layers."""
    tps = "1,2,4,8"
    cases: list[tuple[str, dict[str, Any]]] = []
    for preset in presets:
        cases += [("cpu-page-restore", {"preset": preset, "page_size": str(page_size), "tp": tps}),
                  ("pd-roundtrip", {"preset": preset, "page_tokens": str(page_size)})]
    return cases


def model_cases() -> list[tuple[str, dict[str, Any]]]:
    """Gate cases at real model shapes (CUDA): few requests and rounds, every layer of the preset."""
    cases = []
    for preset in ("qwen3-next", "glm-5.3-flash-tp8"):
        for sd in ("fp32", "bf16"):
            base = {"preset": preset, "state_dtype": sd, "check_requests": 2}
            cases += [
                ("decode", {**base, "batch": "4", "rounds": 12, "snapshot_every": 6}),
                ("mtp-fixed", {**base, "batch": "4", "drafts": 3, "accept": "geometric:0.7", "rounds": 8,
                               "snapshot_every": 4}),
                ("mtp-dynamic", {**base, "batch": "6", "drafts": 3, "accept": "geometric:0.5", "rounds": 8,
                                 "snapshot_every": 4}),
                ("checkpoint-restore", {**base, "batch": "4", "drafts": 3, "accept": "geometric:0.7", "rounds": 6}),
            ]
    # every layer of the GQA (Llama-3-8B, Qwen3-Next: 2 KV heads, replicated at TP 4 and 8) and MLA presets
    return cases + page_cases(("llama-3-8b", "qwen3-next", "deepseek-v3", "glm-5.3-flash-tp8"), page_size=64)


def default_backends(device: str) -> list[str]:
    """torch always; triton where its kernels can run (a GPU, or the interpreter on CPU)."""
    can_triton = device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"
    return ["torch", "triton"] if can_triton else ["torch"]


@dataclass
class GateOutcome:
    passed: bool
    path: Path
    lines: list[str]


def run_gate(
    *,
    device: str = "cpu",
    backends: str | None = None,
    shapes: str = "tiny",
    junit: Path | None = None,
    out_root: Path | str | None = None,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
    argv: list[str] | None = None,
    cases: list[tuple[str, dict[str, Any]]] | None = None,
) -> GateOutcome:
    """Run the gate cases; the outcome says whether every comparison passed and where the report is."""
    if shapes not in ("tiny", "model"):
        raise ValueError(f"--shapes must be tiny or model, got {shapes!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device} needs CUDA, which this machine does not have")
    if shapes == "model" and not device.startswith("cuda"):
        raise ValueError("--shapes model runs real preset shapes and needs --device cuda")
    chosen = backends or ",".join(default_backends(device))
    if cases is None and shapes == "tiny" and backends is None and device == "cpu" and "triton" in chosen:
        # the interpreter: every tiny SSM case on torch, a short subset on triton too
        ssm = {"decode", "mtp-fixed", "mtp-dynamic", "checkpoint-restore"}
        cases = [(n, {**o, "backend": "torch"}) if n in ssm else (n, o) for n, o in tiny_cases()] + interpreter_cases()
    cases = cases if cases is not None else (tiny_cases() if shapes == "tiny" else model_cases())
    planned = []
    for name, options in cases:  # plan everything first: a bad gate case fails before any work
        scenario = get_scenario(name)
        for case in scenario.plan({"backend": chosen, **options, "device": device}):
            planned.append((scenario, case))
    ceilings = env.measure_ceilings(device, cpu_bytes=16 << 20) if device == "cpu" else env.measure_ceilings(device)
    writer = RunWriter(out_root or DEFAULT_OUT, manifest=env.manifest(argv or ["harness", "gate"], 0, device, ceilings),
                       tag="gate")
    tick = (progress or (lambda d, t: (lambda: None)))("gate cases", len(planned))
    with writer:
        ctx, report = make_context(device, 0, ceilings, writer, scenario="gate", progress=progress, time_cases=False)
        for scenario, case in planned:
            result = scenario.run(case, ctx)
            writer.add_rows(result.rows)
            for rec in result.ooms:
                writer.add_oom(rec)
            tick()
    if junit is not None:
        write_junit(report, junit)
    lines = [report.summary()] + [
        f"FAIL {c.scenario}: {c.lhs} vs {c.rhs} {c.name} (contract {c.contract}): "
        f"{c.mismatches} mismatches, RMS ratio {c.rms_ratio:.3g}, first at {c.first_mismatch}"
        for c in report.failures
    ]
    return GateOutcome(report.passed, writer.path, lines)


def write_junit(report: Any, path: Path) -> None:
    """One JUnit test case per comparison (classname = scenario and contract)."""
    suite = ET.Element("testsuite", name="harness-gate", tests=str(len(report.comparisons)),
                       failures=str(len(report.failures)))
    for c in report.comparisons:
        tc = ET.SubElement(suite, "testcase", classname=f"{c.scenario}.contract{c.contract}",
                           name=f"{c.lhs} vs {c.rhs}: {c.name}")
        if not c.passed:
            ET.SubElement(tc, "failure", message=f"{c.policy} failed").text = (
                f"mismatches={c.mismatches} max_abs={c.max_abs} max_ulp={c.max_ulp} rms_ratio={c.rms_ratio} "
                f"tolerance={c.tolerance} first_mismatch={c.first_mismatch}"
            )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
