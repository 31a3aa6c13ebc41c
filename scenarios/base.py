"""What a scenario is, and the context the runner hands it (SPEC §6).

A scenario declares its parameters, expands them into cases, and for each case builds seeded inputs,
runs every requested mode and backend, compares them (SPEC §5), then times them. It never imports the
harness: comparing, timing and out-of-memory guarding come in through `RunContext`, which the runner
fills with the harness's implementations. A scenario's `plan` validates everything it can before any
work starts, so bad input fails with a one-line error and no run directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol


CHECK_REQUESTS = 4  # requests checked against the fp64 reference per case when --check-requests is not given


@dataclass
class RunContext:
    """Services the runner provides to a scenario.

    Attributes:
        device: `cpu` or `cuda[:i]`.
        seed: base seed of the run.
        ceilings: measured copy ceilings of this run (`d2d_gbps`, `h2d_gbps`, `d2h_gbps`, ... by name).
        compare: `compare(actual, expected, *, name, lhs, rhs, contract, policy, tolerance, dims)` ->
            Comparison (pure: nothing is recorded).
        compare_each: the same over dim 0, one Comparison per index (e.g. per layer), reduced together.
        rollout: `rollout()` -> an accumulator with `add(index, comparison)` and `result()`, merging
            the per-round comparisons of one pair over a long rollout (drift series included).
        record: `record(comparison)` puts a comparison into the run's equivalence report.
        bench: `bench(fn, setup=None, calls=1) -> Timing` with the run's timer settings; `calls` says
            how many rounds one call of `fn` does (the run's warm-up and sample counts are divided by it).
        oom_guard: context manager factory; inside it a CUDA out-of-memory error is caught and turned
            into `guard.record` (a dict with status `oom`, bytes wanted, free bytes), never a crash.
        unpaired: `unpaired(*, name, lhs, rhs, contract, scenario, policy, why, tolerance=None)` ->
            a failing Comparison for a pair whose `rhs` left nothing to compare with.
        phase: `with ctx.phase(name):` counts the wall time inside toward phase `name` of the run's
            profile (manifest `wall_s`); comparisons and timing are counted by the runner already.
        progress: `progress(description, total) -> callable advance()`; a no-op in tests.
        dump_dir: where `--dump` writes per-round outputs and accepted states, or None.
        check_requests: at most this many requests are compared against the fp64 reference per case
            (the reference is a slow per-request loop); None = all.
        time_cases: False for the gate (equivalence only).
        repro: builds the repro command of a row from the case's options.
        kernel_config: `kernel_config(kernel, static_key, batch, default) -> (config, source)`: the
            autotuned config from the run's cache (nearest batch bucket) per the run's autotune level,
            else `default` with source `default` (SPEC §8).
        bench_group: in a run spread over a `torch.distributed` group (pd-roundtrip's `dist` transport),
            `bench_group(fn) -> Timing`, called by every process at once with its part of the work; each
            sample is the slowest process's, and every process gets the same Timing; `bench_group(*phases)`
            times each phase apart and sums them per sample (`Timing.parts`). None otherwise.
        record_ceiling: `record_ceiling(name, entry)` adds a ceiling measured during a case (an entry like
            `ceilings`' own: gbps, bytes, method, timer, samples, noise_pct) to the run's ceilings, so a
            row's `ceiling_name` is always one the manifest and the printed header list.
    """

    device: str
    seed: int
    ceilings: dict[str, Any]
    compare: Callable[..., Any]
    compare_each: Callable[..., list[Any]]
    rollout: Callable[[], Any]
    record: Callable[[Any], None]
    bench: Callable[..., Any]
    oom_guard: Callable[[], AbstractContextManager[Any]]
    unpaired: Callable[..., Any]
    phase: Callable[[str], AbstractContextManager[Any]] = lambda name: nullcontext()
    progress: Callable[[str, int], Callable[[], None]] = lambda desc, total: (lambda: None)
    dump_dir: str | None = None
    check_requests: int | None = None
    time_cases: bool = True
    repro: Callable[[dict[str, Any]], str] = lambda opts: ""
    kernel_config: Callable[..., tuple[dict[str, Any], str]] = lambda kernel, key, batch, default: (dict(default), "default")
    bench_group: Callable[..., Any] | None = None
    record_ceiling: Callable[[str, dict[str, Any]], None] = lambda name, entry: None


@dataclass
class TuneJob:
    """One autotune sweep a scenario module offers to `harness autotune` (SPEC §8).

    The fields are the arguments of `harness.autotune.tune`. `kernel` is a kernel name, or the name of
    a config class when `members` lists the kernels that must share one config (then `run` maps each
    member to its run closure, and the class is tuned on the sum of their times); `build(bucket)`
    makes DISPOSABLE inputs at a batch bucket (never a run's state); `check(config, inputs) -> (ok,
    detail)` compares a candidate's results with the reference.
    """

    kernel: str
    static_key: dict[str, Any]
    batch: int
    candidates: list[dict[str, Any]]
    default: dict[str, Any]
    build: Callable[[int], Any]
    run: Any
    check: Callable[[dict[str, Any], Any], tuple[bool, str]]
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaseMemory:
    """A case's predicted memory, so the runner can refuse a case that cannot fit before allocating.

    An estimate of the large allocations (inputs, pools, pages, what comparisons keep), not of every
    transient. `device` bytes live on the run device, `host` bytes in host memory whatever the device
    (outputs kept for comparisons, pinned pages). `variants` are what each variant (mode x backend)
    adds on the device; `together` says whether they are allocated at the same time
    (else one after another). `subject` names the case by its options (`--batch 8`), `hint` says which
    options shrink it.
    """

    subject: str
    device: int
    host: int = 0
    variants: dict[str, int] = field(default_factory=dict)
    together: bool = False
    hint: str = ""

    def device_bytes(self, largest: bool) -> int:
        """Device bytes with every variant (`together`), else with the largest or the smallest one."""
        sizes = list(self.variants.values()) or [0]
        extra = sum(sizes) if self.together else (max(sizes) if largest else min(sizes))
        return self.device + extra


@dataclass
class CaseResult:
    """What one case produced: throughput rows (one per mode x backend) and out-of-memory records."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    ooms: list[dict[str, Any]] = field(default_factory=list)


class Scenario(Protocol):
    """A registered scenario (see scenarios/__init__.py)."""

    name: str
    help: str
    families: tuple[str, ...]

    def plan(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        """Validate options and expand them into cases (one dict per batch size, TP pair, ...)."""
        ...

    def run(self, case: dict[str, Any], ctx: RunContext) -> Iterator[CaseResult] | CaseResult:
        """Run one case: compare through `ctx.compare`, time through `ctx.bench`."""
        ...

    def memory(self, case: Any, device: str) -> CaseMemory:
        """The case's predicted memory (checked by the runner against the machine before any work)."""
        ...
