"""Run a scenario end to end: plan (validate), measure ceilings, run cases, write the run directory.

Planning happens before anything is created, so bad input fails with one line and leaves no run
directory; a run that fails later stays `<run-id>.partial/` with FAILED.txt, never looking complete.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness import env, equivalence, memory, timing
from results.plots import plot_run
from results.store import RunWriter, load_run
from scenarios import RunContext, get_scenario

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "runs"
INTERNAL_OPTIONS = {"family", "dynamic", "out", "dump", "json", "quiet"}


@dataclass
class RunOutcome:
    path: Path
    rows: list[dict]
    equivalence: equivalence.EquivalenceReport


class _Guard:
    record: dict | None = None


@contextmanager
def _oom_guard(device: str) -> Iterator[_Guard]:
    """`harness.memory.oom_guard` with its record as a plain dict (what rows and oom.jsonl hold)."""
    out = _Guard()
    with memory.oom_guard(device if device.startswith("cuda") else None) as g:
        yield out
    if g.record is not None:
        out.record = g.record.to_dict()


def repro_command(scenario: str, options: dict[str, Any]) -> str:
    """A `harness run` line that reruns exactly this case."""
    argv = ["harness", "run", scenario]
    for key, value in sorted(options.items()):
        if key in INTERNAL_OPTIONS or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return shlex.join(argv)


def make_context(
    device: str,
    seed: int,
    ceilings: dict,
    writer: RunWriter | None,
    *,
    scenario: str,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
    dump_dir: str | None = None,
    check_requests: int | None = None,
    time_cases: bool = True,
    timer: str = "auto",
    warmup: int = 5,
    rep: int = 30,
) -> tuple[RunContext, equivalence.EquivalenceReport]:
    """A RunContext wired to the harness (comparisons go to `writer` and to the returned report)."""
    report = equivalence.EquivalenceReport()

    def record(c: equivalence.Comparison) -> None:
        report.add(c)
        if writer is not None:
            writer.add_equivalence(c)

    ctx = RunContext(
        device=device,
        seed=seed,
        ceilings=ceilings,
        compare=equivalence.compare,
        rollout=equivalence.Rollout,
        record=record,
        bench=lambda fn, setup=None: timing.bench(fn, device=device, timer=timer, warmup=warmup, rep=rep, setup=setup),
        oom_guard=lambda: _oom_guard(device),
        progress=progress or (lambda desc, total: (lambda: None)),
        dump_dir=dump_dir,
        check_requests=check_requests,
        time_cases=time_cases,
        repro=lambda opts: repro_command(scenario, opts),
    )
    return ctx, report


def run_scenario(
    name: str,
    options: dict[str, Any],
    *,
    argv: list[str],
    out_root: Path | str = DEFAULT_OUT,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> RunOutcome:
    """Plan, then run every case of scenario `name`; ValueError (nothing written) on bad options."""
    scenario = get_scenario(name)
    cases = scenario.plan(options)
    device = options.get("device") or "cpu"
    seed = int(options.get("seed") or 0)
    torch.manual_seed(seed)
    ceilings = env.measure_ceilings(device, cpu_bytes=64 << 20) if device == "cpu" else env.measure_ceilings(device)
    writer = RunWriter(out_root, manifest=env.manifest(argv, seed, device, ceilings), tag=name)
    with writer:
        ctx, report = make_context(
            device, seed, ceilings, writer, scenario=name, progress=progress, dump_dir=options.get("dump"),
            check_requests=options.get("check_requests"),
        )
        rows = []
        for case in cases:
            result = scenario.run(case, ctx)
            writer.add_rows(result.rows)
            for rec in result.ooms:
                writer.add_oom(rec)
            rows += result.rows
    # Every run directory gets its figures (SPEC §9). The run is complete and valid by now, so a figure that
    # cannot be drawn is a warning, not a failed run (plot_run itself skips figures that have no data).
    try:
        plot_run(load_run(writer.path))
    except Exception as exc:
        warnings.warn(f"figures of {writer.path} not drawn: {exc!r}", stacklevel=2)
    return RunOutcome(writer.path, rows, report)
