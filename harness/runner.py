"""Run a scenario end to end: plan (validate), measure ceilings, run cases, write the run directory.

Planning happens before anything is created, so bad input fails with one line and leaves no run
directory; a run that fails later stays `<run-id>.partial/` with FAILED.txt, never looking complete.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness import autotune, env, equivalence, fontcache, memory, timing
from harness.group_timing import bench_group
from harness.phases import PhaseClock
from harness.repro import Repro
from harness.writable import check_output_dir, check_output_file
from results.store import RunWriter, load_run, update_manifest
from scenarios import CHECK_REQUESTS, RunContext, Scenario, get_scenario, given, parse_int

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "runs"
# Autotuned configs (keyed inside by GPU name, Triton version, kernel, static key); `harness autotune` fills it.
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / "results" / "autotune" / "cache.json"
# Configs tuned on named GPUs that ship with the harness (same format): a run on such a GPU uses them where
# its own cache has nothing (source `shipped`). scripts/ship_configs.py writes it from an autotune cache.
SHIPPED_CACHE = Path(__file__).resolve().parent / "shipped_configs.json"


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
    autotune_level: str = "cache-only",
    autotune_cache: Path | str = DEFAULT_CACHE,
    clock: PhaseClock | None = None,
    repro: Repro | None = None,
) -> tuple[RunContext, equivalence.EquivalenceReport]:
    """A RunContext wired to the harness (comparisons go to `writer` and to the returned report); with a
    `clock`, comparisons count as phase `compare`, timing as `timing` (scenarios add their own). `repro`
    builds the rows' repro lines (the CLI hands it over); without one the column stays empty."""
    report = equivalence.EquivalenceReport()
    if clock is not None and progress is not None:
        clock.listen(progress)  # the heartbeat names the phase and case; only once planning has passed
    clock = clock or PhaseClock(device)
    level = autotune.Level(autotune_level)
    if level not in (autotune.Level.CACHE_ONLY, autotune.Level.OFF):
        raise ValueError(f"runs look configs up (cache-only | off); tune with `harness autotune --level {level.value}`")
    caches: list[autotune.AutotuneCache] = []  # the run's cache, then the shipped one; opened on first use

    def kernel_config(kernel: str, static_key: dict, batch: int, default: dict) -> tuple[dict, str]:
        if not caches:
            caches.append(autotune.AutotuneCache(autotune_cache))
            if SHIPPED_CACHE.exists():
                caches.append(autotune.AutotuneCache(SHIPPED_CACHE))
        for cache, source in zip(caches, ("cached", "shipped")):
            choice = autotune.cached_choice(kernel, static_key, batch, cache=cache, level=level, default=default)
            if choice.source == "cache":
                return choice.config, source
        return dict(default), "default"

    def record_ceiling(name: str, entry: dict) -> None:
        ceilings[name] = entry
        if writer is not None:
            writer.add_ceiling(name, entry)

    def record(c: equivalence.Comparison) -> None:
        report.add(c)
        if writer is not None:
            writer.add_equivalence(c)

    def compare(*args: Any, **kwargs: Any) -> equivalence.Comparison:
        with clock.phase("compare"):
            return equivalence.compare(*args, **kwargs)

    def compare_each(*args: Any, **kwargs: Any) -> list[equivalence.Comparison]:
        with clock.phase("compare"):
            return equivalence.compare_each(*args, **kwargs)

    def bench(fn: Callable[[], Any], setup: Callable[[], Any] | None = None, calls: int = 1) -> timing.Timing:
        # `calls` > 1: fn does that many rounds, so fewer warm-up calls and samples cover the same work
        with clock.phase("timing"):
            return timing.bench(fn, device=device, timer=timer, warmup=max(1, warmup // calls),
                                rep=max(5, rep // calls), setup=setup)

    ctx = RunContext(
        device=device,
        seed=seed,
        ceilings=ceilings,
        compare=compare,
        compare_each=compare_each,
        rollout=equivalence.Rollout,
        record=record,
        bench=bench,
        oom_guard=lambda: _oom_guard(device),
        unpaired=equivalence.unpaired,
        phase=clock.phase,
        progress=progress or (lambda desc, total: (lambda: None)),
        dump_dir=dump_dir,
        check_requests=check_requests,
        time_cases=time_cases,
        # a case's options name its scenario (the gate runs several through one context)
        repro=(lambda opts: repro(opts.get("scenario") or scenario, opts)) if repro is not None else (lambda opts: ""),
        kernel_config=kernel_config,
        bench_group=_timed_group(clock, device, warmup, rep) if dist.is_initialized() else None,
        record_ceiling=record_ceiling,
    )
    return ctx, report


def _timed_group(clock: PhaseClock, device: str, warmup: int, rep: int) -> Callable[..., Any]:
    def timed(*phases: Callable[[], Any]) -> Any:
        with clock.phase("timing"):
            return bench_group(*phases, device=device, warmup=warmup, rep=rep)

    return timed


def plan_run(scenario: Scenario, options: dict[str, Any], out_root: Path | str) -> list[Any]:
    """Everything a run checks before it does any work or writes anything: where it writes, the
    scenario's options (its `plan`), the options every run shares, and that each case fits in memory."""
    check_output_dir(out_root, "--out")
    if options.get("dump") is not None:
        check_output_dir(options["dump"], "--dump")
        dump = Path(options["dump"])
        if dump.is_dir() and any(dump.iterdir()):  # a dump's rounds are files per round: two runs would mix
            raise ValueError(f"--dump {dump} is not empty (another dump's rounds would mix with this run's); "
                             "give a new or empty folder")
    cases = scenario.plan(options)
    if options.get("rep") is not None:
        parse_int(options["rep"], "--rep", lo=2)  # the noise column needs two samples
    if options.get("warmup") is not None:
        parse_int(options["warmup"], "--warmup", lo=0)
    value = given(options.get("autotune"), "cache-only")
    level = next((lv for lv in autotune.Level if lv.value == value), None)
    if level not in (autotune.Level.CACHE_ONLY, autotune.Level.OFF):  # say only what a run takes
        tune = " (tuning is `harness autotune --level tune-missing | force`)" if level is not None else ""
        raise ValueError(f"--autotune takes cache-only or off in a run, got {value!r}{tune}")
    if options.get("autotune_cache") is not None:
        check_cache(options["autotune_cache"])
    device = given(options.get("device"), "cpu")
    # A case the device cannot hold is refused only when no case can: beside cases that fit (a sweep over
    # batches) it runs, and its allocations become `oom` rows with the bytes they wanted (SPEC §8), data
    # for `harness advise` rather than a run refused over its largest batch.
    over = []
    for case in cases:
        try:
            memory.check_fits(scenario.memory(case, device), device, f"{scenario.name} on {case.preset}")
        except memory.DeviceBudgetError as e:
            over.append(e)
    if over and len(over) == len(cases):
        raise over[0]
    for e in over:
        print(f"{scenario.name}: {e} (beside cases that fit, it runs into oom rows)", file=sys.stderr, flush=True)
    return cases


def check_cache(path: str | Path, *, written: bool = False) -> None:
    """`--autotune-cache` checked like `--out`: an existing file must be a readable cache; a missing one
    must be somewhere a file can be made (a path that can never hold a cache is a typo, not an empty
    cache). `written` (the autotune): an existing file must also be writable."""
    if Path(path).is_dir():
        raise ValueError(f"--autotune-cache {path} is a folder, not a cache file")
    if written or not Path(path).exists():
        check_output_file(path, "--autotune-cache")
    try:
        autotune.AutotuneCache(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"--autotune-cache {path}: {e}") from None


def run_scenario(
    name: str,
    options: dict[str, Any],
    *,
    argv: list[str],
    out_root: Path | str = DEFAULT_OUT,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
    repro: Repro | None = None,
    run_id: str | None = None,
) -> RunOutcome | None:
    """Plan, then run every case of scenario `name`; ValueError (nothing written) on bad options.
    None on the ranks other than 0 of a distributed run (rank 0 writes and returns the run). `repro`
    (from the CLI) fills the rows' repro column; `run_id` names the run directory (default: a new id).

    Ctrl-C (KeyboardInterrupt) leaves with where it struck (`harness.phases.interrupted_at`) and, as
    `harness_run_dir`, what it left: `(path, finished)`, or None when nothing was written yet."""
    device = options.get("device") or "cpu"
    clock = PhaseClock(device)
    with clock.phase("setup"):
        return _run_scenario(name, options, argv, out_root, progress, clock, repro, run_id)


def _run_scenario(name: str, options: dict[str, Any], argv: list[str], out_root: Path | str,
                  progress: Callable[[str, int], Callable[[], None]] | None, clock: PhaseClock,
                  repro: Repro | None, run_id: str | None) -> RunOutcome | None:
    scenario = get_scenario(name)
    cases = plan_run(scenario, options, out_root)
    device = options.get("device") or "cpu"
    seed = int(options.get("seed") or 0)
    torch.manual_seed(seed)
    # In a run spread over a torch.distributed group every process runs the cases; rank 0 alone measures
    # the copy ceilings and writes the run directory (harness/dist.py).
    lead = not dist.is_initialized() or dist.get_rank() == 0
    if lead:  # what the plan leaves out without being asked to (pd-roundtrip's TP pairs): one line each
        for note in getattr(scenario, "notes", lambda options, cases: [])(options, cases):
            print(f"{name}: {note}", file=sys.stderr, flush=True)
    writer, ceilings, fonts = None, {}, None
    try:
        if lead:
            fonts = fontcache.prewarm()  # planned and valid: the figures will be drawn
            ceilings = env.measure_ceilings(device, cpu_bytes=64 << 20) if device == "cpu" else env.measure_ceilings(device)
            manifest = env.manifest(argv, seed, device, ceilings)
            if dist.is_initialized():
                manifest["dist"] = {"backend": dist.get_backend(), "world_size": dist.get_world_size()}
            writer = RunWriter(out_root, run_id, manifest=manifest, tag=name)
        with writer or nullcontext():
            ctx, report = make_context(
                device, seed, ceilings, writer, scenario=name, progress=progress, dump_dir=options.get("dump"),
                check_requests=given(options.get("check_requests"), CHECK_REQUESTS),
                autotune_level=options.get("autotune") or "cache-only",
                autotune_cache=options.get("autotune_cache") or DEFAULT_CACHE,
                warmup=5 if options.get("warmup") is None else int(options["warmup"]),
                rep=30 if options.get("rep") is None else int(options["rep"]),
                clock=clock,
                repro=repro,
            )
            # the cases as the outer count of the progress lines (each PD pair is a case); one case needs none
            tick = ctx.progress(f"{name} cases", len(cases)) if len(cases) > 1 else (lambda: None)
            rows = []
            for case in cases:
                result = run_case(scenario, case, ctx, clock)
                if writer is not None:
                    writer.add_rows(result.rows)
                    for rec in result.ooms:
                        writer.add_oom(rec)
                rows += result.rows
                tick()
            if writer is not None:
                with clock.phase("write"):
                    writer.finish()  # validates and writes the tables (the `with` would, uncounted)
        if writer is None:
            return None
        draw_figures(writer.path, clock, fonts)
    except KeyboardInterrupt as exc:
        if not hasattr(exc, "harness_run_dir"):  # the writer marks a partial run itself
            exc.harness_run_dir = None if writer is None else (writer.path, writer.path == writer.final_dir)
        raise
    return RunOutcome(writer.path, rows, report)


def case_label(scenario_name: str, case: Any) -> str:
    """A case in one readable line (the case's own `label`, else the scenario name)."""
    return getattr(case, "label", None) or scenario_name


def run_case(scenario: Any, case: Any, ctx: RunContext, clock: PhaseClock) -> Any:
    """Run one case with its comparisons labelled by the case (failure lines and JUnit names say which)."""
    label = case_label(scenario.name, case)
    record = ctx.record
    labelled = dataclasses.replace(ctx, record=lambda c: record(dataclasses.replace(c, case=label)))
    with clock.case(label):
        return scenario.run(case, labelled)


def draw_figures(path: Path, clock: PhaseClock, fonts: subprocess.Popen | None = None, *,
                 drift_only: bool = False) -> None:
    """Every run directory gets its figures (SPEC §9), drawn once per run after every case (the gate's:
    the drift figures only, it times nothing), then the run's wall-time profile goes into its manifest.
    The run is complete and valid by now, so a figure that cannot be drawn is a warning, not a failed
    run (plot_run itself skips figures without data)."""
    with clock.phase("figures"):
        fontcache.wait(fonts)
        try:  # matplotlib only when figures are drawn
            if drift_only:
                from results.drift import drift_figures

                drift_figures(load_run(path).comparisons, path / "figures")
            else:
                from results.plots import plot_run

                plot_run(load_run(path))
        except Exception as exc:
            warnings.warn(f"figures of {path} not drawn: {exc!r}", stacklevel=2)
    update_manifest(path, clock.profile())
