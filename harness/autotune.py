"""Kernel config autotuning with a persistent cache and recorded failures (SPEC §8).

Vocabulary:

* a **config** is a dict of launch meta-parameters, e.g. `{"BV": 32, "num_warps": 4, "num_stages": 1}`;
  a kernel declares its candidates with `config_space(...)` and a default config;
* the **static key** is a dict of everything that changes which config is best and is fixed for a
  run (family, mode, geometry, dtypes, width, history length, ...); the **run key** is the batch,
  tuned and cached per power-of-two **bucket** and looked up by the nearest bucket (log2 distance);
* `AutotuneCache` is one JSON file keyed by GPU name, Triton version, kernel and static key;
* **levels** say what a run may do: `cache-only` (cached config, else the default), `tune-missing`
  (tune a bucket that is not cached), `force` (always re-tune), `off` (always the default). The
  returned `Choice.source` (`cache | tuned | default`) is what reports show as the config's origin.

`tune()` sweeps the candidates on a disposable set of inputs that `build(bucket)` makes (never on
state a run is using): each candidate is first checked against the reference, then timed with the
injected `timer` (CUDA-graph timing on a GPU, wall clock on CPU). Every candidate becomes a
`TuneRecord` with status `ok | out_of_resources | compile_error | mismatch | oom`; a CUDA
out-of-memory error is caught, the memory released and the sweep goes on. The fastest `ok`
candidate wins and is cached; a mismatching candidate is never chosen.

Config classes. Where kernels must share one config (a config that changed their arithmetic would
break a bitwise contract between them), they are grouped in a `ConfigClass`: each candidate is checked
once (the class's `check` compares every member) and its cost is the sum of the members' times; the
winner is cached under the class name, and a lookup for any member returns it. The SSM kernels no
longer need this (their arithmetic does not depend on the config, kernels/ssm/step.py) and are tuned
one kernel at a time; the mechanism stays for kernels that do.

Before a sweep times anything, on a GPU, every candidate is compiled in parallel processes
(kernels/common/precompile.py), so a sweep's wall time is timing, not one compile after another.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from enum import Enum
from functools import partial
from typing import Any, Callable, Iterable, Mapping, NoReturn, Sequence

import torch
import triton

from harness.memory import classify_failure, oom_record, release_memory, run_guarded

Config = dict[str, Any]
RunFn = Callable[[Config, Any], Any]
CheckFn = Callable[[Config, Any], tuple[bool, str]]
Timer = Callable[[Callable[[], Any]], float]

CACHE_FORMAT = 1


class Level(str, Enum):
    """How much tuning a run may do (the values are the CLI names)."""

    CACHE_ONLY = "cache-only"
    TUNE_MISSING = "tune-missing"
    FORCE = "force"
    OFF = "off"

    @classmethod
    def _missing_(cls, value: object) -> NoReturn:
        raise ValueError(f"unknown autotune level {value!r}; choose one of {[level.value for level in cls]}")


@dataclass(frozen=True)
class ConfigClass:
    """Kernels that must share one config (see the module docstring); `name` is its cache key."""

    name: str
    members: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        if not self.members or len(set(self.members)) != len(self.members):
            raise ValueError(f"config class {self.name!r} needs distinct member kernels, got {self.members}")


def config_space(keep: Callable[[Config], bool] | None = None, **axes: Sequence[Any]) -> list[Config]:
    """Cartesian product of the axes (in the order given), filtered by `keep(config)`.

    `config_space(BV=[8, 16, 32], num_warps=[1, 2, 4], keep=lambda c: c["BV"] >= 8 * c["num_warps"])`
    """
    if not axes:
        raise ValueError("config_space needs at least one axis")
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)) or len(values) == 0:
            raise ValueError(f"axis {name!r} must be a non-empty list of values, got {values!r}")
    configs = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    kept = [c for c in configs if keep is None or keep(c)]
    if not kept:
        raise ValueError(f"the keep predicate rejected all {len(configs)} configs of {dict(axes)}")
    return kept


def _key_value(name: str, value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_key_value(name, v) for v in value]
    raise ValueError(f"static key field {name!r} must be a str/int/float/bool/None/dtype or a list of them, "
                     f"got {type(value).__name__}")


def canonical_key(static_key: Mapping[str, Any]) -> str:
    """The static key as canonical JSON (sorted keys, no spaces; dtypes written as 'bfloat16')."""
    if not static_key:
        raise ValueError("static key must not be empty")
    normalized = {str(k): _key_value(str(k), v) for k, v in static_key.items()}
    return json.dumps(normalized, sort_keys=True, separators=(",", ":"))


def batch_bucket(batch: int) -> int:
    """The power-of-two bucket a batch is tuned at: the smallest power of two >= batch."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return 1 << (batch - 1).bit_length()


def batch_buckets(max_batch: int) -> list[int]:
    """Every bucket up to the one holding `max_batch`: [1, 2, 4, ..., batch_bucket(max_batch)]."""
    return [1 << i for i in range(batch_bucket(max_batch).bit_length())]


def nearest_bucket(batch: int, buckets: Iterable[int]) -> int:
    """The bucket closest to `batch` in log2 distance; ties go to the larger bucket."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    buckets = list(buckets)
    if not buckets:
        raise ValueError("no buckets to choose from")
    return min(buckets, key=lambda b: (abs(math.log2(b) - math.log2(batch)), -b))


@dataclass(frozen=True)
class CacheEntry:
    config: Config
    median_us: float
    tuned_at: str
    bucket: int


class AutotuneCacheError(ValueError):
    """The cache file exists but cannot be used."""


class AutotuneCache:
    """Tuned configs in one JSON file: {gpu: {triton: {kernel: {static key: {bucket: entry}}}}}.

    A missing file is an empty cache. Writes go to a temporary file in the same folder that is then
    renamed over the cache, so a reader never sees half a file; `store` re-reads the file first so
    entries another process wrote meanwhile are kept. `classes` maps member kernels to the
    `ConfigClass` whose config they share.
    """

    def __init__(self, path: str | os.PathLike[str], *, gpu_name: str | None = None,
                 triton_version: str | None = None, classes: Iterable[ConfigClass] = ()) -> None:
        self.path = os.fspath(path)
        self.gpu_name = gpu_name or (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
        self.triton_version = triton_version or triton.__version__
        self.classes = {c.name: c for c in classes}
        self._class_of: dict[str, ConfigClass] = {}
        for config_class in self.classes.values():
            for member in config_class.members:
                if member in self._class_of or member in self.classes:
                    raise ValueError(f"kernel {member!r} is in more than one config class or is a class name")
                self._class_of[member] = config_class
        self._data = self._read()

    def cache_name(self, kernel: str) -> str:
        """The name a kernel's configs are cached under: its class's name for a class member."""
        config_class = self._class_of.get(kernel)
        return config_class.name if config_class is not None else kernel

    def lookup(self, kernel: str, static_key: Mapping[str, Any], batch: int) -> CacheEntry | None:
        """The entry of the nearest cached bucket for `batch`, or None."""
        per_bucket = self._buckets(kernel, static_key)
        if not per_bucket:
            return None
        return self._entry(per_bucket, nearest_bucket(batch, (int(b) for b in per_bucket)))

    def get(self, kernel: str, static_key: Mapping[str, Any], bucket: int) -> CacheEntry | None:
        """The entry of exactly this bucket, or None."""
        per_bucket = self._buckets(kernel, static_key)
        return self._entry(per_bucket, bucket) if str(bucket) in per_bucket else None

    def store(self, kernel: str, static_key: Mapping[str, Any], bucket: int, config: Config,
              median_us: float) -> CacheEntry:
        """Record a tuned config for one bucket and write the file."""
        if bucket != batch_bucket(bucket):
            raise ValueError(f"bucket must be a power of two, got {bucket}")
        tuned_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._data = self._read()
        per_kernel = self._data["entries"].setdefault(self.gpu_name, {}).setdefault(self.triton_version, {})
        per_key = per_kernel.setdefault(self.cache_name(kernel), {}).setdefault(canonical_key(static_key), {})
        per_key[str(bucket)] = {"config": dict(config), "median_us": float(median_us), "tuned_at": tuned_at}
        self._write()
        return self._entry(per_key, bucket)

    def _buckets(self, kernel: str, static_key: Mapping[str, Any]) -> dict[str, Any]:
        per_kernel = self._data["entries"].get(self.gpu_name, {}).get(self.triton_version, {})
        return per_kernel.get(self.cache_name(kernel), {}).get(canonical_key(static_key), {})

    @staticmethod
    def _entry(per_bucket: Mapping[str, Any], bucket: int) -> CacheEntry:
        raw = per_bucket[str(bucket)]
        return CacheEntry(dict(raw["config"]), raw["median_us"], raw["tuned_at"], bucket)

    def _read(self) -> dict[str, Any]:
        if not os.path.exists(self.path):
            return {"format": CACHE_FORMAT, "entries": {}}
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise AutotuneCacheError(f"autotune cache {self.path} is not valid JSON ({exc}); fix or delete it") from exc
        well_formed = isinstance(data, dict) and isinstance(data.get("entries"), dict)
        if not well_formed or data.get("format") != CACHE_FORMAT:
            raise AutotuneCacheError(f"autotune cache {self.path} is not an autotune cache of format {CACHE_FORMAT} "
                                     f"(expected {{'format': {CACHE_FORMAT}, 'entries': {{...}}}}); fix or delete it")
        return data

    def _write(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(dir=folder, prefix=os.path.basename(self.path) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self._data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_path, self.path)
        except BaseException:
            os.unlink(tmp_path)
            raise


@dataclass(frozen=True)
class TuneRecord:
    """One candidate of one sweep (a line of the run's autotune.jsonl).

    `median_us` (sum over members for a class) and `member_us` only when `ok`; `wanted_bytes` and
    `free_bytes` only for `oom`; `detail` is the check's message or the error's.
    """

    kernel: str
    static_key: dict[str, Any]
    batch: int
    bucket: int
    config: Config
    status: str
    detail: str = ""
    median_us: float | None = None
    member_us: dict[str, float] | None = None
    wanted_bytes: int | None = None
    free_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Choice:
    """The config a kernel runs with and where it came from (`cache | tuned | default`)."""

    config: Config
    source: str
    bucket: int | None = None
    median_us: float | None = None
    records: list[TuneRecord] = field(default_factory=list)


class NoValidConfigError(RuntimeError):
    """Every candidate of a sweep failed; `records` says how."""

    def __init__(self, kernel: str, static_key: Mapping[str, Any], bucket: int, records: list[TuneRecord]) -> None:
        self.records = records
        lines = [f"  {r.config}: {r.status}" + (f" ({r.detail.splitlines()[0][:200]})" if r.detail else "")
                 for r in records]
        super().__init__(f"autotune of {kernel} {canonical_key(static_key)} at batch bucket {bucket}: "
                         f"no valid config among {len(records)} candidates:\n" + "\n".join(lines))


def wallclock_median_us(fn: Callable[[], Any], warmup: int = 1, reps: int = 5) -> float:
    """Median wall-clock time of `fn` in µs, synchronizing CUDA around each call (a CPU/test timer;
    on a GPU inject the CUDA-graph timer instead)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    for _ in range(warmup):
        fn()
    times_us = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times_us.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times_us)


def cached_choice(
    kernel: str | ConfigClass,
    static_key: Mapping[str, Any],
    batch: int,
    *,
    cache: AutotuneCache,
    level: Level | str,
    default: Config,
) -> Choice | None:
    """The choice that needs no tuning, or None when `level` asks for a sweep.

    `off` gives the default; `cache-only` the nearest cached bucket, else the default;
    `tune-missing` the exact bucket when cached; `force` always None. A member kernel of a
    `ConfigClass` gets its class's config.
    """
    level = Level(level)
    name = kernel.name if isinstance(kernel, ConfigClass) else cache.cache_name(kernel)
    if level is Level.OFF:
        return Choice(dict(default), "default")
    if level is Level.FORCE:
        return None
    if level is Level.CACHE_ONLY:
        entry = cache.lookup(name, static_key, batch)
    else:
        entry = cache.get(name, static_key, batch_bucket(batch))
    if entry is not None:
        return Choice(entry.config, "cache", entry.bucket, entry.median_us)
    return Choice(dict(default), "default") if level is Level.CACHE_ONLY else None


def tune(
    kernel: str | ConfigClass,
    static_key: Mapping[str, Any],
    batch: int,
    candidates: Sequence[Config],
    *,
    build: Callable[[int], Any],
    run: RunFn | Mapping[str, RunFn],
    check: CheckFn,
    cache: AutotuneCache,
    level: Level | str = Level.TUNE_MISSING,
    timer: Timer = wallclock_median_us,
    default: Config | None = None,
    sink: Callable[[TuneRecord], None] | None = None,
) -> Choice:
    """Pick the config for `kernel` at `static_key` and `batch`, tuning when `level` says so.

    * `kernel`: a kernel name, or a `ConfigClass` (registered in `cache`) to tune its members
      together; a member's name alone may be looked up but not tuned;
    * `candidates`: the config space; `default` (else the first candidate) is used by `off` and by
      `cache-only` on a miss;
    * `build(bucket) -> inputs`: a disposable set of inputs at the batch bucket, never serving state;
    * `run(config, inputs)`: one launch (may update the inputs' state in place); for a class, a
      mapping from every member kernel to its run;
    * `check(config, inputs) -> (ok, detail)`: launches with `config` and compares with the
      reference (all members, for a class); it is called before timing, so it must not depend on
      `inputs` being pristine (compute the reference from what it finds);
    * `timer(fn) -> median µs`; `sink(record)` receives every candidate's record.

    Raises `NoValidConfigError` (listing the records) when a sweep has no `ok` candidate. Errors
    other than OOM, out-of-resources and compile errors propagate: they are bugs.
    """
    if not candidates:
        raise ValueError(f"no candidate configs for {kernel}")
    default_config = dict(candidates[0] if default is None else default)
    choice = cached_choice(kernel, static_key, batch, cache=cache, level=level, default=default_config)
    if choice is not None:
        return choice
    name, runs = _resolve(kernel, run, cache)
    bucket = batch_bucket(batch)
    # Records carry the key as JSON (dtypes as names) so the sink can write them as they are.
    key_json = json.loads(canonical_key(static_key))
    records = _sweep(name, key_json, batch, bucket, candidates, build, runs, check, timer, sink)
    valid = [r for r in records if r.status == "ok"]
    if not valid:
        raise NoValidConfigError(name, static_key, bucket, records)
    best = min(valid, key=lambda r: r.median_us)
    cache.store(name, static_key, bucket, best.config, best.median_us)
    return Choice(dict(best.config), "tuned", bucket, best.median_us, records)


def _resolve(kernel: str | ConfigClass, run: RunFn | Mapping[str, RunFn],
             cache: AutotuneCache) -> tuple[str, dict[str, RunFn]]:
    """(cache name, run per member) for a sweep, after checking that a class is registered and
    fully covered and that a lone member is not tuned apart from its class."""
    if isinstance(kernel, ConfigClass):
        if cache.classes.get(kernel.name) != kernel:
            raise ValueError(f"config class {kernel.name!r} is not registered in the cache "
                             f"(AutotuneCache(..., classes=[...])), so member lookups would miss it")
        if not isinstance(run, Mapping) or set(run) != set(kernel.members):
            got = sorted(run) if isinstance(run, Mapping) else type(run).__name__
            raise ValueError(f"config class {kernel.name!r} needs one run per member {list(kernel.members)}, got {got}")
        return kernel.name, {member: run[member] for member in kernel.members}
    if cache.cache_name(kernel) != kernel:
        class_name = cache.cache_name(kernel)
        raise ValueError(f"kernel {kernel!r} belongs to config class {class_name!r}; tune the class "
                         f"with a run per member {list(cache.classes[class_name].members)}")
    if isinstance(run, Mapping):
        raise ValueError(f"kernel {kernel!r} takes one run callable; a mapping of runs is for a ConfigClass")
    return kernel, {kernel: run}


def _sweep(name: str, static_key: dict[str, Any], batch: int, bucket: int, candidates: Sequence[Config],
           build: Callable[[int], Any], runs: dict[str, RunFn], check: CheckFn, timer: Timer,
           sink: Callable[[TuneRecord], None] | None) -> list[TuneRecord]:
    records: list[TuneRecord] = []

    def emit(config: Config, status: str, **fields: Any) -> None:
        record = TuneRecord(name, static_key, batch, bucket, dict(config), status, **fields)
        records.append(record)
        if sink is not None:
            sink(record)

    built = run_guarded(lambda: build(bucket))
    if built.oom is not None:
        # Nothing can run without inputs: every candidate is an oom of the build.
        for config in candidates:
            emit(config, "oom", detail=f"building inputs at batch {bucket}: {built.oom.message}",
                 wanted_bytes=built.oom.wanted_bytes, free_bytes=built.oom.free_bytes)
        return records
    inputs = built.value
    _precompile(candidates, runs, inputs)
    for config in candidates:
        try:
            ok, detail = check(config, inputs)
            if not ok:
                emit(config, "mismatch", detail=detail)
                continue
            member_us = {member: timer(partial(member_run, config, inputs)) for member, member_run in runs.items()}
        except Exception as exc:
            status = classify_failure(exc)
            if status == "oom":
                oom = oom_record(exc)
                release_memory(exc)
                emit(config, "oom", detail=oom.message, wanted_bytes=oom.wanted_bytes, free_bytes=oom.free_bytes)
            else:
                emit(config, status, detail=f"{type(exc).__name__}: {exc}")
            continue
        emit(config, "ok", detail=detail, median_us=sum(member_us.values()), member_us=member_us)
    return records


def _precompile(candidates: Sequence[Config], runs: dict[str, RunFn], inputs: Any) -> None:
    """On a GPU, compile every candidate of every member in parallel processes before the sweep: the
    sweep then loads them from Triton's cache instead of compiling one at a time (measured on an H200:
    2-4 s a specialization). A launch that fails here fails again, recorded, in the sweep."""
    from kernels.common.precompile import collect_compiles, compile_all
    from kernels.common.triton_cpu import interpreting

    if interpreting() or not torch.cuda.is_available():
        return
    with collect_compiles() as jobs:
        for config in candidates:
            for member_run in runs.values():
                try:
                    member_run(config, inputs)
                except Exception:  # noqa: BLE001 - the sweep runs it again and records the error
                    pass
    compile_all(jobs)
