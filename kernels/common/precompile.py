"""Compile many Triton kernels in parallel processes before running any of them.

A sweep (autotune, the per-kernel bench, a gate) launches dozens of kernel specializations, and Triton
compiles each on first launch, one after another, in the launching process: on an H200 box that is
2-4 s a specialization, most of a sweep's wall time. `collect_compiles()` runs the caller's launches
with a cache hook that records what each launch would compile and skips it; `compile_all()` then
compiles the records in forked worker processes into Triton's on-disk cache, where the real launches
find them. The records carry the exact signature, constants, attributes and options the JIT computed,
so the cache keys are the ones the real launches look up.

Usage:
    with collect_compiles() as jobs:
        for run in closures:
            run()            # nothing runs on the device; kernels compiled before still do
    compile_all(jobs, processes=8)
    for run in closures:
        run()                # loads from the cache
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import triton
from triton import knobs


@dataclass(frozen=True)
class CompileJob:
    """One specialization a launch asked for."""

    fn: Any  # the JITFunction
    signature: dict
    constants: dict
    attrs: dict
    options: dict
    target: Any


@contextlib.contextmanager
def collect_compiles() -> Iterator[list[CompileJob]]:
    """Inside the block, a launch of a kernel not yet compiled in this process records a `CompileJob`
    and does not run (its outputs stay as they were); the list fills as launches happen."""
    jobs: list[CompileJob] = []
    seen: set[str] = set()
    target = triton.runtime.driver.active.get_current_target()

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's names
        if compile["specialization_data"] not in seen:
            seen.add(compile["specialization_data"])
            # as the JIT's own preload reads them back: JSON lists are tuples
            options = {k: tuple(v) if isinstance(v, list) else v
                       for k, v in json.loads(compile["specialization_data"])["options"].items()}
            jobs.append(CompileJob(fn.jit_function, compile["signature"], compile["constants"],
                                   compile["configs"][0], options, target))
        return True  # skip the launch

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        yield jobs
    finally:
        knobs.runtime.jit_cache_hook = previous


_PENDING: list[CompileJob] = []  # what forked workers compile, by index (nothing is pickled)


def _compile_one(index: int) -> str | None:
    job = _PENDING[index]
    try:
        src = triton.compiler.ASTSource(job.fn, job.signature, job.constants, job.attrs)
        triton.compile(src, target=job.target, options=dict(job.options))
    except Exception as exc:  # noqa: BLE001 - the real launch raises it again, where it is reported
        return f"{job.fn.__name__}: {type(exc).__name__}: {exc}"
    return None


def compile_all(jobs: list[CompileJob], processes: int | None = None) -> tuple[float, list[str]]:
    """Compile `jobs` into Triton's cache with `processes` forked workers (default: CPUs, at most 16).

    Returns (seconds, failures): a job that fails here is left for its real launch, which compiles it
    again and raises the error where the caller handles launch errors (an out-of-resources config, say).
    Workers are forked so they inherit the kernels without pickling; they never touch the device.
    """
    t0 = time.perf_counter()
    if not jobs:
        return 0.0, []
    processes = max(1, min(processes or os.cpu_count() or 1, 16, len(jobs)))
    _PENDING[:] = jobs
    try:
        if processes == 1:
            failures = [f for f in map(_compile_one, range(len(jobs))) if f]
        else:
            with mp.get_context("fork").Pool(processes) as pool:
                failures = [f for f in pool.map(_compile_one, range(len(jobs))) if f]
    finally:
        _PENDING.clear()
    return time.perf_counter() - t0, failures
