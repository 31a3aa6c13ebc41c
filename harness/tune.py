"""`harness autotune`: sweep kernel configs per static key and batch bucket into the config cache.

Which sweeps exist is up to the scenario modules: each target below names a module whose
`tuning_jobs(options) -> list[TuneJob]` builds them (disposable inputs, candidates, reference check).
Every candidate of every sweep is recorded in the run's autotune.jsonl (ok, out_of_resources,
compile_error, mismatch, oom) and out-of-memory candidates also in oom.jsonl; winners go to the
cache that runs read with `--autotune cache-only` (the default).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import autotune, env, timing
from harness.runner import DEFAULT_CACHE, DEFAULT_OUT, check_cache
from harness.writable import check_output_dir
from results.store import RunWriter
from scenarios import given
from scenarios.base import TuneJob

# target -> module providing tuning_jobs(options)
TARGETS = {"ssm": "scenarios.ssm_tuning", "pages": "scenarios.page_tuning"}


@dataclass
class TuneOutcome:
    path: Path
    cache: Path
    choices: list[dict[str, Any]]


def plan_autotune(target: str, options: dict[str, Any], out_root: Path | str) -> list[TuneJob]:
    """Everything `harness autotune` checks before any work or write: the target, the level, where the run
    directory and the cache go (the cache checked like `--out`), and the target's own options (its jobs)."""
    if target not in TARGETS:
        raise ValueError(f"unknown autotune target {target!r}; choose one of {', '.join(TARGETS)}")
    try:
        autotune.Level(given(options.get("level"), "tune-missing"))
    except ValueError as e:
        raise ValueError(f"--level: {e}") from None
    check_output_dir(out_root, "--out")
    check_cache(given(options.get("autotune_cache"), DEFAULT_CACHE), written=True)
    jobs = importlib.import_module(TARGETS[target]).tuning_jobs(options)
    if not jobs:
        raise ValueError(f"no {target} sweeps for these options")
    return jobs


def run_autotune(
    target: str,
    options: dict[str, Any],
    *,
    argv: list[str],
    out_root: Path | str = DEFAULT_OUT,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> TuneOutcome:
    """Plan, then sweep every job. Writes only the run directory under `out_root` and the cache file (its
    folder is made when the first winner is stored, not before)."""
    jobs = plan_autotune(target, options, out_root)
    level = autotune.Level(given(options.get("level"), "tune-missing"))
    device = given(options.get("device"), "cpu")
    cache_path = Path(given(options.get("autotune_cache"), DEFAULT_CACHE))
    classes = {job.kernel: autotune.ConfigClass(job.kernel, job.members) for job in jobs if job.members}
    cache = autotune.AutotuneCache(cache_path, classes=set(classes.values()))

    # On CPU the kernels run in the interpreter, whose times say nothing about a GPU: a few samples are
    # enough to rank the (few) candidates, and the default 3 + 20 calls per candidate took minutes.
    warmup_default, rep_default = (3, 20) if str(device).startswith("cuda") else (1, 3)
    warmup, rep = int(given(options.get("warmup"), warmup_default)), int(given(options.get("rep"), rep_default))

    def timer(fn: Callable[[], Any]) -> float:
        return timing.bench(fn, device=device, warmup=warmup, rep=rep).median_us

    writer = RunWriter(out_root, manifest=env.manifest(argv, 0, device, {}), tag=f"autotune-{target}")
    choices = []
    # one step per candidate, so the progress lines move with the sweep (a job can take minutes on CPU)
    tick = (progress or (lambda d, t: (lambda: None)))(f"autotune {target}", sum(len(j.candidates) for j in jobs))
    with writer:
        for job in jobs:
            swept = [0]

            def sink(record: autotune.TuneRecord) -> None:
                writer.add_autotune(record.to_dict())
                if record.status == "oom":
                    writer.add_oom(record.to_dict())
                swept[0] += 1
                tick()

            name = job.kernel
            try:
                choice = autotune.tune(
                    classes.get(job.kernel, job.kernel), job.static_key, job.batch, job.candidates, build=job.build, run=job.run,
                    check=job.check, cache=cache, level=level, timer=timer, default=job.default, sink=sink,
                )
                choices.append({"kernel": name, "batch": job.batch, "config": choice.config, "source": choice.source,
                                "median_us": choice.median_us, "static_key": autotune.canonical_key(job.static_key)})
            except autotune.NoValidConfigError as e:
                choices.append({"kernel": name, "batch": job.batch, "config": None, "source": "error",
                                "median_us": None, "static_key": autotune.canonical_key(job.static_key),
                                "error": str(e)})
            for _ in range(len(job.candidates) - swept[0]):  # a cached job sweeps nothing
                tick()
    return TuneOutcome(writer.path, cache_path, choices)
