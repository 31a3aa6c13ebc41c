"""Compile many Triton kernels in parallel processes before running any of them.

A sweep (autotune, the per-kernel bench, a gate) launches dozens of kernel specializations, and Triton
compiles each on first launch, one after another, in the launching process: on an H200 box that is
2-4 s a specialization, most of a sweep's wall time. `collect_compiles()` runs the caller's launches
with a cache hook that records what each launch would compile and skips it; `compile_all()` then
compiles the records in forked worker processes into Triton's on-disk cache, where the real launches
find them. The records carry the exact signature, constants, attributes and options the JIT computed,
so the cache keys are the ones the real launches look up, provided every process computes the same
keys: `stable_cache_keys()` (called by `collect_compiles`) makes them independent of launch order.

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


def _jit_functions() -> list[Any]:
    """Every Triton JIT function defined in a loaded module of the kernels package (kernels and helpers)."""
    import sys

    from triton.runtime.jit import JITFunction

    found: dict[int, Any] = {}
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == "kernels" or name.startswith("kernels.")):
            continue
        for value in vars(module).values():
            if isinstance(value, JITFunction) and value.fn.__module__ == name:
                found[id(value)] = value
    return sorted(found.values(), key=lambda f: (f.fn.__module__, f.fn.__qualname__))


def stable_cache_keys(max_passes: int = 8) -> int:
    """Give every JIT function of the kernels package the cache key it has when its callees were
    hashed first, in every process alike; returns how many passes that took.

    Triton 3.6 hashes a function's callees into its key (`JITFunction.cache_key`) and adds the constexpr
    globals they read (`_EMULATE_RTNE` in kernels/ssm/step.py), but it merges a callee's globals *before*
    hashing the callee, so the first kernel hashed in a process leaves out the globals of helpers
    nobody hashed yet; a later kernel calling the same helpers gets them. The key of a kernel thus
    depends on which kernel a process happened to launch first: forked compile workers (which start
    from different kernels) and the launching process disagree, and a compiled-ahead specialization is
    compiled again on its first launch (seen on CPU with scripts/gate_specializations.py --mode
    simulate: the tiny gate's decode case recompiled native verify). Rehashing everything until no key
    changes gives each function the key over its whole call tree, the same whatever the order.
    Idempotent; call it before the first compile of a process, and before forking workers.
    """
    functions = _jit_functions()
    for passes in range(1, max_passes + 1):
        before = [(f.hash, tuple(f.used_global_vals)) for f in functions]
        for f in functions:
            f.hash = None  # recomputed below with the callees' globals of the previous pass
        for f in functions:
            f.cache_key  # noqa: B018 - computes and caches the key
        if [(f.hash, tuple(f.used_global_vals)) for f in functions] == before:
            return passes
    raise RuntimeError(f"Triton cache keys of the kernels did not settle in {max_passes} passes")


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
    stable_cache_keys()  # the keys the forked workers and the real launches compute must agree
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


@contextlib.contextmanager
def compile_log() -> Iterator[list[dict]]:
    """Inside the block, every `triton.compile` of this process (a JIT launch's first use of a
    specialization) appends `{"kernel", "cache_hit", "seconds"}`: `cache_hit` True when the binary came
    from Triton's on-disk cache, False when it was compiled here. Where a gate's time goes (issue 23)."""
    events: list[dict] = []
    previous = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        events.append({"kernel": getattr(src, "name", "?"), "cache_hit": bool(cache_hit),
                       "seconds": times.total / 1e6})  # CompileTimes are in microseconds
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    knobs.compilation.listener = listener
    try:
        yield events
    finally:
        knobs.compilation.listener = previous


def summarize_compiles(events: list[dict]) -> dict:
    """`{"compiled": n, "compile_s": s, "loaded": m, "kernels": {kernel: compiled}}` of `compile_log` events."""
    built = [e for e in events if not e["cache_hit"]]
    kernels: dict[str, int] = {}
    for e in built:
        kernels[e["kernel"]] = kernels.get(e["kernel"], 0) + 1
    return {"compiled": len(built), "compile_s": round(sum(e["seconds"] for e in built), 2),
            "loaded": len(events) - len(built), "kernels": kernels}


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
