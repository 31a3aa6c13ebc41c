"""Run a scenario end to end: plan (validate), measure ceilings, run cases, write the run directory.

Planning happens before anything is created, so bad input fails with one line and leaves no run
directory; a run that fails later stays `<run-id>.partial/` with FAILED.txt, never looking complete.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness import autotune, env, equivalence, memory, timing
from harness.group_timing import bench_group
from results.plots import plot_run
from results.store import RunWriter, load_run
from scenarios import RunContext, get_scenario

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "runs"
# Autotuned configs (keyed inside by GPU name, Triton version, kernel, static key); `harness autotune` fills it.
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / "results" / "autotune" / "cache.json"
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
    autotune_level: str = "cache-only",
    autotune_cache: Path | str = DEFAULT_CACHE,
) -> tuple[RunContext, equivalence.EquivalenceReport]:
    """A RunContext wired to the harness (comparisons go to `writer` and to the returned report)."""
    report = equivalence.EquivalenceReport()
    level = autotune.Level(autotune_level)
    if level not in (autotune.Level.CACHE_ONLY, autotune.Level.OFF):
        raise ValueError(f"runs look configs up (cache-only | off); tune with `harness autotune --level {level.value}`")
    cache: list[autotune.AutotuneCache] = []  # opened on first use

    def kernel_config(kernel: str, static_key: dict, batch: int, default: dict) -> tuple[dict, str]:
        if not cache:
            cache.append(autotune.AutotuneCache(autotune_cache))
        choice = autotune.cached_choice(kernel, static_key, batch, cache=cache[0], level=level, default=default)
        return choice.config, "cached" if choice.source == "cache" else "default"

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
        kernel_config=kernel_config,
        bench_group=(lambda fn: bench_group(fn, device=device, warmup=warmup, rep=rep))
        if dist.is_initialized() else None,
    )
    return ctx, report


def run_scenario(
    name: str,
    options: dict[str, Any],
    *,
    argv: list[str],
    out_root: Path | str = DEFAULT_OUT,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> RunOutcome | None:
    """Plan, then run every case of scenario `name`; ValueError (nothing written) on bad options.
    None on the ranks other than 0 of a distributed run (rank 0 writes and returns the run)."""
    scenario = get_scenario(name)
    cases = scenario.plan(options)
    if options.get("rep") is not None and int(options["rep"]) < 2:
        raise ValueError(f"--rep must be >= 2 (the noise column needs two samples), got {options['rep']}")
    if options.get("warmup") is not None and int(options["warmup"]) < 0:
        raise ValueError(f"--warmup must be >= 0, got {options['warmup']}")
    if autotune.Level(options.get("autotune") or "cache-only") not in (autotune.Level.CACHE_ONLY, autotune.Level.OFF):
        raise ValueError("--autotune takes cache-only or off in a run; tune with `harness autotune`")
    device = options.get("device") or "cpu"
    seed = int(options.get("seed") or 0)
    torch.manual_seed(seed)
    # In a run spread over a torch.distributed group every process runs the cases; rank 0 alone measures
    # the copy ceilings and writes the run directory (harness/dist.py).
    lead = not dist.is_initialized() or dist.get_rank() == 0
    writer, ceilings = None, {}
    if lead:
        ceilings = env.measure_ceilings(device, cpu_bytes=64 << 20) if device == "cpu" else env.measure_ceilings(device)
        manifest = env.manifest(argv, seed, device, ceilings)
        if dist.is_initialized():
            manifest["dist"] = {"backend": dist.get_backend(), "world_size": dist.get_world_size()}
        writer = RunWriter(out_root, manifest=manifest, tag=name)
    with writer or nullcontext():
        ctx, report = make_context(
            device, seed, ceilings, writer, scenario=name, progress=progress, dump_dir=options.get("dump"),
            check_requests=options.get("check_requests"),
            autotune_level=options.get("autotune") or "cache-only",
            autotune_cache=options.get("autotune_cache") or DEFAULT_CACHE,
            warmup=5 if options.get("warmup") is None else int(options["warmup"]),
            rep=30 if options.get("rep") is None else int(options["rep"]),
        )
        rows = []
        for case in cases:
            result = scenario.run(case, ctx)
            if writer is not None:
                writer.add_rows(result.rows)
                for rec in result.ooms:
                    writer.add_oom(rec)
            rows += result.rows
    if writer is None:
        return None
    # Every run directory gets its figures (SPEC §9). The run is complete and valid by now, so a figure that
    # cannot be drawn is a warning, not a failed run (plot_run itself skips figures that have no data).
    try:
        plot_run(load_run(writer.path))
    except Exception as exc:
        warnings.warn(f"figures of {writer.path} not drawn: {exc!r}", stacklevel=2)
    return RunOutcome(writer.path, rows, report)
