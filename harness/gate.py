"""`harness gate`: every SPEC §5 contract at gate shapes, no timing; fails on anything it cannot vouch for.

The gate cases are data (below): both families, fp32 and bf16 state, fixed and dynamic widths,
several acceptance patterns, long-memory rollouts of >= 1024 tokens for drift, KV page transfers (CPU
pages at every TP degree, PD pages at every TP pair, GQA and MLA), on every backend that can run here.
They go through the same scenario code as `harness run` (with timing off), so the gate checks what
the benchmarks run. Accepted states are compared on every round for every request (every 16th round
and the last in the long-memory rollouts; their outputs on every round), and the fp64 reference checks
every request at tiny shapes and 8 at model shapes.

The gate fails when (SPEC §5):

* a comparison breaks its contract (judged on every (round, layer) on its own);
* a comparison has no partner (the variant it is checked against left nothing to compare with);
* an expected variant is missing or its row is not `passed`, except `unsupported` / `oom` where the
  spec or the memory budget predicts it (harness/expected.py).

Each failure is one line naming the case, the contract by name, the worst value and where it is. The
result is an ordinary run directory (`results/runs/<id>-gate/`): equivalence.md has every comparison,
gate.md the verdict with every failure line and expected variant; `--junit` writes one test case per
comparison and per expected variant, named by case and contract.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness import env, fontcache
from harness.equivalence import Comparison, EquivalenceReport, failure_line
from harness.expected import RowCheck, check_case
from harness.phases import PhaseClock
from harness.repro import Repro
from harness.runner import DEFAULT_OUT, case_label, draw_figures, make_context, run_case
from kernels.common.precompile import compile_log, summarize_compiles
from kernels.common.triton_cpu import interpreting
from results.store import RunWriter, update_manifest
from scenarios import get_scenario
from scenarios.page_options import tp_degrees
from scenarios.ssm_options import DECODE_RUN_VARIANTS, RUN_VARIANTS

TINY = ("tiny-gdn", "tiny-kda")
# Every gate case runs every variant of every mode (SPEC §3) and compares accepted states of every request
# on every round.
GATE_OPTIONS = {"snapshot_every": 1, "snapshot_requests": "all", "compact_commit": "accept,deferred",
               "replay_forward": "inline,precompute"}
# Where the Triton kernels run (the model cases, the interpreter cases) compact's matrix-form verify runs too;
# on the torch backend alone it is `accept` again (states/compact.py), so the torch-only cases leave it out.
# The model cases run the variants a run compares by default (RUN_VARIANTS, and decode's DECODE_RUN_VARIANTS in
# every case: the bitwise ones and the fastest
# contract-keeping matrix variants, at bf16x3), so what the rows report is what the GPU gate judged. The
# precompute forward with the bitwise token fold (`precompute`) is judged in the interpreter cases and the
# CUDA kernel tests; at model shape it would only repeat matrix-bf16x3's forward (SPEC §7's 2-minute budget).
KERNEL_GATE_OPTIONS = {**GATE_OPTIONS, "compact_commit": ",".join(RUN_VARIANTS["compact"]),
                       "replay_forward": ",".join((*RUN_VARIANTS["replay"], *DECODE_RUN_VARIANTS["replay"]))}
# The interpreter computes every product in fp32 whatever precision is asked, so its cases name each matrix
# variant once, at the default precision.
INTERPRETER_GATE_OPTIONS = {**GATE_OPTIONS, "replay_forward": "inline,precompute,matrix",
                            "compact_commit": "accept,deferred,accept-precompute,deferred-precompute"}
# Long-memory rollouts (SPEC §5: decays 0.995..0.9997, >= 1024 tokens): where bf16 state drifts most.
LONG_MEMORY_TOKENS = 1024
# Their accepted states are compared every 16th round and on the last (outputs on every round): with a snapshot
# of every mode on every round a case took 46 s on the CPU gate, 25 s like this (replay's snapshot folds its history).
LONG_MEMORY_SNAPSHOT_EVERY = 16


# Every tiny MTP case verifies at the model gate's width (drafts 3, W = 4) with its history (Lh 4: replay
# folds nearly every round, and W == Lh), and decode uses the default history like the long-memory decode,
# so on a GPU the tiny cases of one preset and state dtype share each kernel's constexprs: the cases
# with drafts 1, 2 and 3 and Lh 4 and 16 compiled 181 specializations (scripts/gate_specializations.py),
# most of a cold tiny gate on an H200. Widths 2 and 3 are judged by the interpreter cases below (CPU gate)
# and the kernel tests; compact, native and replay step every token with the same code at any W.
TINY_DRAFTS = 3
TINY_HISTORY = 4


def tiny_ssm_cases() -> list[tuple[str, dict[str, Any], str]]:
    """The tiny SSM cases as (scenario, options, on_gpu): `on_gpu` is "" where the GPU tiny gate runs the
    case too, else why it does not (the model gate judges that scenario, acceptance and width on a GPU for
    both families and state dtypes, so the tiny case would only repeat it; the CPU gate still runs it)."""
    model = "the model gate judges this scenario and acceptance at drafts 3, both families and state dtypes"
    out: list[tuple[str, dict[str, Any], str]] = []
    for preset in TINY:
        for sd in ("fp32", "bf16"):
            base = {"preset": preset, "state_dtype": sd, **GATE_OPTIONS}
            mtp = {**base, "drafts": TINY_DRAFTS, "history_len": TINY_HISTORY}
            out += [
                ("decode", {**base, "batch": "3", "rounds": 24},
                 "the model gate's decode and the long-memory decode judge width 1 on a GPU"),
                ("mtp-fixed", {**mtp, "batch": "3", "accept": "geometric:0.7", "rounds": 16}, model),
                ("mtp-fixed", {**mtp, "batch": "2", "accept": "fixed:1", "rounds": 12}, ""),
                ("mtp-fixed", {**mtp, "batch": "2", "accept": "none", "rounds": 12}, ""),
                # a bf16 history is a contract with fp32 state (docs/CONTRACTS.md); with bf16 state the state's
                # own rounding dominates, so that case accepts everything on the fp32 history
                ("mtp-fixed", {**mtp, "batch": "2", "accept": "all", "rounds": 12,
                               **({"history_dtype": "bf16"} if sd == "fp32" else {})}, ""),
                ("mtp-dynamic", {**mtp, "batch": "4", "accept": "geometric:0.5", "rounds": 16}, model),
                ("checkpoint-restore", {**mtp, "batch": "4", "accept": "geometric:0.6", "rounds": 9},
                 "the model gate's checkpoint-restore judges restores within and across modes at drafts 3"),
            ]
    return out


def tiny_cases(gpu: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Gate cases at CPU-test size: (scenario, options). `gpu`: the GPU tiny gate's selection, which leaves
    out the SSM cases the model gate repeats (`tiny_ssm_cases`) and runs the long-memory rollouts on the
    Triton backend only (their torch drift is the CPU gate's: the same torch code, 1024 rounds of hundreds
    of small launches each on a GPU)."""
    cases = [(n, o) for n, o, on_gpu in tiny_ssm_cases() if not (gpu and on_gpu)]
    long_memory = long_memory_cases(TINY)
    if gpu:
        long_memory = [(n, {**o, "backend": "triton"}) for n, o in long_memory]
    return cases + long_memory + page_cases(TINY, page_size=16)


def long_memory_cases(presets: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """Decode over LONG_MEMORY_TOKENS tokens with long-memory gates, fp32 and bf16 state: the drift of each
    mode against fp64 (the run's drift figure), bounded by the measured bf16 bounds."""
    return [("decode", {"preset": p, "state_dtype": sd, "batch": "2", "rounds": LONG_MEMORY_TOKENS,
                        "gates": "long-memory", **GATE_OPTIONS, "snapshot_every": LONG_MEMORY_SNAPSHOT_EVERY})
            for p in presets for sd in ("fp32", "bf16")]


def interpreter_cases() -> list[tuple[str, dict[str, Any]]]:
    """Short SSM cases that also run the Triton kernels when they can only run in the interpreter (CPU,
    ~40x slower than torch): both families, fp32 and bf16 state, dynamic widths with idle rows, folds,
    decode, long-memory gates and a restore. The other tiny SSM cases then run on the torch backend only."""
    cases: list[tuple[str, dict[str, Any]]] = []
    both = {"backend": "torch,triton", **INTERPRETER_GATE_OPTIONS}
    for preset in TINY:
        for sd in ("fp32", "bf16"):
            gates = "long-memory" if sd == "bf16" else "random"  # where bf16 rounding matters most
            cases.append(("mtp-dynamic", {"preset": preset, "state_dtype": sd, "batch": "3", "drafts": 2,
                                          "accept": "geometric:0.6", "rounds": 6, "history_len": 4, "gates": gates,
                                          **both}))
    cases.append(("decode", {"preset": "tiny-kda", "state_dtype": "fp32", "batch": "2", "rounds": 10,
                             "history_len": 4, **both}))
    cases.append(("checkpoint-restore", {"preset": "tiny-gdn", "state_dtype": "fp32", "batch": "2", "drafts": 1,
                                         "rounds": 5, "history_len": 4, **both}))
    return cases


def page_cases(presets: tuple[str, ...], page_size: int) -> list[tuple[str, dict[str, Any]]]:
    """KV page transfers (contracts 4, 5): CPU pages at every TP degree of 1, 2, 4, 8 the preset's heads
    take, with both variants, and PD pages at every TP pair of those, with the hybrid state page where the
    preset has SSM layers."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for preset in presets:
        tps = ",".join(str(t) for t in tp_degrees(preset))  # the degrees its heads take
        cases += [("cpu-page-restore", {"preset": preset, "page_size": str(page_size), "tp": tps}),
                  ("pd-roundtrip", {"preset": preset, "page_tokens": str(page_size)})]
    return cases


def model_cases() -> list[tuple[str, dict[str, Any]]]:
    """Gate cases at real model shapes (CUDA), sized for SPEC §7's budget (the model-shape gate in under
    2 minutes on an H200): both presets, fp32 and bf16 state, every mode and variant, every layer of the
    preset, few rounds, 8 requests all checked against the fp64 reference (computed on the GPU). Triton
    only: the torch backend is the reference implementation, checked at tiny shapes, and its fixed-order
    reductions launch hundreds of small kernels per token (minutes per case at model shape). Drafts 3
    throughout so the W = 4 kernels compile once per preset and dtype."""
    cases = []
    for preset in ("qwen3-next", "glm-5.3-flash-tp8"):
        for sd in ("fp32", "bf16"):
            base = {"preset": preset, "state_dtype": sd, "backend": "triton", "check_requests": 8,
                    **KERNEL_GATE_OPTIONS}
            cases += [
                ("decode", {**base, "batch": "8", "rounds": 6, "history_len": 4}),
                ("mtp-fixed", {**base, "batch": "8", "drafts": 3, "accept": "geometric:0.7", "rounds": 6,
                               "history_len": 4}),
                ("mtp-dynamic", {**base, "batch": "8", "drafts": 3, "accept": "geometric:0.5", "rounds": 6,
                                 "history_len": 4}),
                ("checkpoint-restore", {**base, "batch": "8", "drafts": 3, "accept": "geometric:0.7", "rounds": 5,
                                        "history_len": 4}),
            ]
    # every layer of the GQA (Llama-3-8B, Qwen3-Next: 2 KV heads, replicated at TP 4 and 8) and MLA presets
    return cases + page_cases(("llama-3-8b", "qwen3-next", "deepseek-v3", "glm-5.3-flash-tp8"), page_size=64)


def default_backends(device: str) -> list[str]:
    """torch always; triton where its kernels can run (a GPU, or the interpreter on CPU)."""
    return ["torch", "triton"] if device.startswith("cuda") or interpreting() else ["torch"]


def compile_ahead(planned: list[tuple[Any, Any]], device: str,
                  progress: Callable[[str, int], Callable[[], None]] | None = None,
                  processes: int | None = None) -> dict[str, Any]:
    """Compile every Triton specialization the gate's cases launch, in parallel processes, before
    running any of them (Triton otherwise compiles each on its first launch, one after another).

    Each case's `launch` (every gate scenario has one: the SSM rollouts' first rounds, checkpoint-restore's
    rollouts, the page cases' transfers) runs with launches recorded and skipped
    (kernels/common/precompile.py), in a context that writes nothing; the records compile in forked
    workers into Triton's cache, where the real run finds them. A case that raises here (its outputs
    are garbage by design) contributes what it launched before; anything missed compiles on first
    launch in the real run, as without this step, and the run's manifest counts it (`compiles`).
    Returns {"specializations": recorded, "seconds": compile time, "failures": compile errors (each fails
    again, reported, in the real run)}."""
    from kernels.common.precompile import collect_compiles, compile_all

    # No bars of the cases' own: a launch that raises (by design, see above) never finishes its bar, which
    # then stayed in every later progress line of the run as `native/triton: 0/12 after 129 s`.
    throwaway, _ = make_context(device, 0, {}, None, scenario="gate", time_cases=False)
    tick = progress("gate compiles", 2) if progress is not None else (lambda: None)
    with collect_compiles() as jobs:
        for scenario, case in planned:
            if "triton" not in getattr(case, "backends", ()) or not hasattr(scenario, "launch"):
                continue
            try:
                scenario.launch(case, throwaway)
            except Exception:  # noqa: BLE001 - see the docstring: the real run reports real errors
                pass
    tick()
    seconds, failures = compile_all(jobs, processes)
    tick()
    return {"specializations": len(jobs), "seconds": round(seconds, 1), "failures": failures}


@dataclass
class GateOutcome:
    passed: bool
    path: Path
    lines: list[str]
    junit_error: str | None = None  # why --junit could not be written (the verdict holds all the same)


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
    repro: Repro | None = None,
) -> GateOutcome:
    """Run the gate cases; the outcome says whether the gate passed, where its report is, and its lines
    (a summary, then one line per failure). `repro` (from the CLI) fills the rows' repro column."""
    clock = PhaseClock(device)
    with clock.phase("setup"):
        return _run_gate(device, backends, shapes, junit, out_root, progress, argv, cases, clock, repro)


def _run_gate(device, backends, shapes, junit, out_root, progress, argv, cases, clock, repro) -> GateOutcome:
    if shapes not in ("tiny", "model"):
        raise ValueError(f"--shapes must be tiny or model, got {shapes!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device} needs CUDA, which this machine does not have")
    if shapes == "model" and not device.startswith("cuda"):
        raise ValueError("--shapes model runs real preset shapes and needs --device cuda")
    if backends is None and not device.startswith("cuda") and not interpreting():
        # the gate is not complete without the Triton kernels; never say PASS for the torch backend alone
        raise ValueError("harness gate --device cpu runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1 "
                         "before starting Python (the CLI does), or narrow it with --backend torch")
    chosen = backends or ",".join(default_backends(device))
    if cases is None and shapes == "tiny" and backends is None and device == "cpu":
        # the interpreter: every tiny SSM case on torch, a short subset on triton too
        ssm = {"decode", "mtp-fixed", "mtp-dynamic", "checkpoint-restore"}
        cases = [(n, {**o, "backend": "torch"}) if n in ssm else (n, o) for n, o in tiny_cases()] + interpreter_cases()
    if cases is None and shapes == "tiny" and device.startswith("cuda"):
        cases = tiny_cases(gpu=True)
        if backends is not None:  # the caller's backends hold for every case, the long-memory ones included
            cases = [(n, {k: v for k, v in o.items() if k != "backend"}) for n, o in cases]
    cases = cases if cases is not None else (tiny_cases() if shapes == "tiny" else model_cases())
    planned = []
    for name, options in cases:  # plan everything first: a bad gate case fails before any work
        scenario = get_scenario(name)
        for case in scenario.plan({"backend": chosen, **options, "device": device}):
            planned.append((scenario, case))
    fonts = fontcache.prewarm()  # planned and valid: the figures will be drawn
    # the gate times nothing, so no row is held against a copy ceiling: measuring them (1 GiB on-device and
    # 256 MiB pinned copies, 23 times each way on a GPU) would only add to the gate's wall time
    ceilings: dict[str, dict] = {}
    writer = RunWriter(out_root or DEFAULT_OUT, manifest=env.manifest(argv or ["harness", "gate"], 0, device, ceilings),
                       tag="gate")
    checks: list[RowCheck] = []
    with writer:
        ctx, report = make_context(device, 0, ceilings, writer, scenario="gate", progress=progress, time_cases=False,
                                   clock=clock, repro=repro)
        compiles: dict[str, Any] = {}
        if device.startswith("cuda") and "triton" in chosen:
            with clock.phase("compile"):
                compiles["ahead"] = compile_ahead(planned, device, progress)
        tick = ctx.progress("gate cases", len(planned))
        per_case: dict[str, dict] = {}
        with compile_log() as events:  # what each case still compiled on first launch, and loaded
            for scenario, case in planned:
                label, start = case_label(scenario.name, case), len(events)
                result = run_case(scenario, case, ctx, clock)
                writer.add_rows(result.rows)
                for rec in result.ooms:
                    writer.add_oom(rec)
                checks += check_case(label, case, result.rows, device)
                if len(events) > start:
                    per_case[label] = summarize_compiles(events[start:])
                tick()
        compiles.update(first_launch=summarize_compiles(events), per_case=per_case)
        with clock.phase("write"):
            writer.finish()
    triton_cases = sum("triton" in getattr(case, "backends", ()) for _, case in planned)
    where = chosen.replace(",", ", ")
    if "triton" in chosen and not device.startswith("cuda"):
        where += f" (triton in the interpreter, {triton_cases} of {len(planned)} cases)"
    verdict = GateVerdict(report, checks, backends=where)
    (writer.path / "gate.md").write_text(verdict.markdown())
    update_manifest(writer.path, {"gate_passed": verdict.passed, "gate_summary": verdict.summary(), "compiles": compiles})
    junit_error = None
    if junit is not None:
        try:
            write_junit(verdict, junit)
        except OSError as e:  # checked before the cases ran; a full disk is found out only now
            junit_error = str(e)
    draw_figures(writer.path, clock, fonts, drift_only=True)
    return GateOutcome(verdict.passed, writer.path, verdict.lines(), junit_error)


@dataclass
class GateVerdict:
    """Comparisons and expected-variant checks of a gate run, and what they add up to."""

    report: EquivalenceReport
    checks: list[RowCheck]
    backends: str  # what ran where, for the summary line

    @property
    def passed(self) -> bool:
        return self.report.passed and all(c.passed for c in self.checks) and bool(self.report.comparisons)

    def summary(self) -> str:
        comps, bad = len(self.report.comparisons), len(self.report.failures)
        rows_bad = sum(not c.passed for c in self.checks)
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: {comps - bad} of {comps} comparisons passed, {len(self.checks) - rows_bad} of "
                f"{len(self.checks)} expected variants passed; backends {self.backends}")

    def lines(self) -> list[str]:
        return ([self.summary()] + [c.line() for c in self.checks if not c.passed]
                + [failure_line(c) for c in self.report.failures])

    def markdown(self) -> str:
        out = ["# Gate", "", f"**{self.summary()}**", ""]
        failures = self.lines()[1:]
        if failures:
            out += ["## Failures", "", *[f"* {line}" for line in failures], ""]
        out += ["## Expected variants", "", "| case | variant | status | note |", "| --- | --- | --- | --- |"]
        out += [f"| {c.case} | {c.variant} | {'passed' if c.passed and c.status == 'passed' else c.status}"
                f"{'' if c.passed else ' **FAIL**'} | {c.reason} |" for c in self.checks]
        out += ["", "Every comparison: equivalence.md (how to read it: docs/REPORTS.md). The contracts by name, their "
                "tolerances and what the gate refuses: docs/CONTRACTS.md.", ""]
        return "\n".join(out)


def junit_name(c: Comparison) -> str:
    """`contract 1 compact == native: compact/torch vs native/torch o`."""
    return f"{c.title}: {c.lhs} vs {c.rhs} {c.name}"


def write_junit(verdict: GateVerdict, path: Path) -> None:
    """One JUnit test case per comparison and per expected variant: classname the case, name the contract
    and pair (unique: a repeated name gets ` #2`, ` #3`, ...)."""
    report = verdict.report
    failures = len(report.failures) + sum(not c.passed for c in verdict.checks)
    suite = ET.Element("testsuite", name="harness-gate", tests=str(len(report.comparisons) + len(verdict.checks)),
                       failures=str(failures))
    seen: dict[tuple[str, str], int] = {}

    def case(classname: str, name: str) -> ET.Element:
        n = seen[(classname, name)] = seen.get((classname, name), 0) + 1
        return ET.SubElement(suite, "testcase", classname=classname, name=name if n == 1 else f"{name} #{n}")

    for check in verdict.checks:
        tc = case(check.case, check.name)
        if not check.passed:
            ET.SubElement(tc, "failure", message=check.line()).text = check.line()
    for c in report.comparisons:
        tc = case(c.case or c.scenario, junit_name(c))
        if not c.passed:
            ET.SubElement(tc, "failure", message=failure_line(c)).text = json.dumps(
                {k: c.to_dict()[k] for k in ("mismatches", "max_abs", "max_ulp", "rms_ratio", "rms_ratio_max",
                                             "rms_ratio_max_round", "tolerance", "worst_at", "first_mismatch",
                                             "problem")}, default=str)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
