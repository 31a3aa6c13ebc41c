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
from harness.runner import DEFAULT_CACHE, DEFAULT_OUT
from results.store import RunWriter
from scenarios import given

# target -> module providing tuning_jobs(options)
TARGETS = {"ssm": "scenarios.ssm_tuning", "pages": "scenarios.page_tuning"}


@dataclass
class TuneOutcome:
    path: Path
    cache: Path
    choices: list[dict[str, Any]]


def run_autotune(
    target: str,
    options: dict[str, Any],
    *,
    argv: list[str],
    out_root: Path | str = DEFAULT_OUT,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> TuneOutcome:
    if target not in TARGETS:
        raise ValueError(f"unknown autotune target {target!r}; choose one of {', '.join(TARGETS)}")
    level = autotune.Level(given(options.get("level"), "tune-missing"))
    device = given(options.get("device"), "cpu")
    jobs = importlib.import_module(TARGETS[target]).tuning_jobs(options)
    if not jobs:
        raise ValueError(f"no {target} sweeps for these options")
    cache_path = Path(given(options.get("autotune_cache"), DEFAULT_CACHE))
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    classes = {job.kernel: autotune.ConfigClass(job.kernel, job.members) for job in jobs if job.members}
    cache = autotune.AutotuneCache(cache_path, classes=set(classes.values()))

    warmup, rep = int(options.get("warmup", 3)), int(options.get("rep", 20))

    def timer(fn: Callable[[], Any]) -> float:
        return timing.bench(fn, device=device, warmup=warmup, rep=rep).median_us

    writer = RunWriter(out_root, manifest=env.manifest(argv, 0, device, {}), tag=f"autotune-{target}")
    choices = []
    tick = (progress or (lambda d, t: (lambda: None)))(f"autotune {target}", len(jobs))
    with writer:

        def sink(record: autotune.TuneRecord) -> None:
            writer.add_autotune(record.to_dict())
            if record.status == "oom":
                writer.add_oom(record.to_dict())

        for job in jobs:
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
            tick()
    return TuneOutcome(writer.path, cache_path, choices)
