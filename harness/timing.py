"""Timing device work (SPEC §7).

Methodology:

* The caller builds every input before calling `bench`; the timed closure `fn` does only the work
  being measured (no allocation of inputs, no host<->device copies it does not mean to time). When
  `fn` updates state in place and each sample must start from the same state, pass `setup` (for
  example, copy a pristine state back): it runs before every sample, outside the timed span.
* Warm-up: `fn` runs `warmup` times first (compilation, autotuning, allocator growth, clocks);
  those runs are never samples.
* Samples: `rep` timed samples. Reported are all samples, their median, the 20th and 80th
  percentiles (the p20-p80 band used by reports and by `harness compare`), and the noise: the width
  of that band as a percentage of the median, `(p80 - p20) / median * 100`. It was the relative
  standard deviation, which one stalled sample drives to hundreds of percent (292% beside a p20-p80
  of 113-117 us, issue 17); the band is what people read next to it, and a few outliers barely move it.
* Timers, recorded with every result:
  - `cuda-graph`: `fn` is captured once into a CUDA graph (after warm-up on a side stream, as
    capture requires) and each sample times graph replays between CUDA events. This removes
    Python and launch overhead, which dominates small decode kernels. When one replay is shorter
    than `min_sample_us`, a sample times several back-to-back replays and divides, so event
    resolution does not dominate; with `setup`, a sample is always one replay.
  - `cuda-event`: CUDA events around each eager call of `fn` (includes launch overhead).
  - `cpu-wall`: `time.perf_counter_ns` around each call, for CPU runs only (CPU work is
    synchronous); these are CPU timings and are labelled as such, never GPU numbers.
  - `auto`: `cuda-graph` on CUDA when `fn` can be captured, otherwise `cuda-event` with the reason
    recorded in `Timing.fallback_reason`; `cpu-wall` on CPU.
* Events are read only after one synchronize at the end, so timing never stalls the stream between
  samples; wall-clock is never put around asynchronous GPU work.
* A failed capture is cleaned up (graph reset, CUDA generator states put back), so the process
  stays usable after `auto` falls back.

Measured on an H200 (torch 2.11, 2026-12-02): a device-to-device `Tensor.copy_` captured in a graph
(a memcpy node) moved 2.7 TB/s (read + written) against 4.2 TB/s eager; a
copy done by a kernel (e.g. `torch.add(a, 0, out=b)`) ran at 4.2 TB/s both ways. Work whose time is
dominated by large `copy_` calls is therefore slower under `cuda-graph` than under `cuda-event`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

TIMERS = ("auto", "cuda-graph", "cuda-event", "cpu-wall")


@dataclass(frozen=True)
class Timing:
    """Samples of one timed closure and their summary.

    Attributes:
        samples_us: every sample, in microseconds per call of `fn`.
        median_us, p20_us, p80_us: median and 20th/80th percentiles (linear interpolation).
        noise_pct: the p20-p80 spread as a percentage of the median, `(p80 - p20) / median * 100`
            (NaN with one sample).
        n_samples: len(samples_us).
        timer: the timer that produced the samples (`cuda-graph`, `cuda-event`, `cpu-wall`).
        warmup: untimed calls before the first sample.
        replays_per_sample: calls averaged into one sample (graph replays; 1 otherwise).
        fallback_reason: why `auto` did not use `cuda-graph` on CUDA, else None.
        parts: a phased sample's phases (`harness.group_timing.bench_group`), each with its own samples,
            aligned with these (sample i here is the sum of the parts' samples i); empty otherwise.
    """

    samples_us: tuple[float, ...]
    median_us: float
    p20_us: float
    p80_us: float
    noise_pct: float
    n_samples: int
    timer: str
    warmup: int
    replays_per_sample: int = 1
    fallback_reason: str | None = None
    parts: tuple[Timing, ...] = ()

    @classmethod
    def from_samples(cls, samples_us: Sequence[float], *, timer: str, warmup: int, **extra) -> Timing:
        if not samples_us:
            raise ValueError("a Timing needs at least one sample")
        s = sorted(samples_us)
        median, p20, p80 = _quantile(s, 0.5), _quantile(s, 0.2), _quantile(s, 0.8)
        noise = (p80 - p20) / median * 100 if len(s) > 1 and median > 0 else math.nan
        return cls(
            samples_us=tuple(samples_us),
            median_us=median,
            p20_us=p20,
            p80_us=p80,
            noise_pct=noise,
            n_samples=len(s),
            timer=timer,
            warmup=warmup,
            **extra,
        )


def bench(
    fn: Callable[[], object],
    *,
    device: torch.device | str,
    warmup: int = 10,
    rep: int = 100,
    timer: str = "auto",
    setup: Callable[[], object] | None = None,
    min_sample_us: float = 50.0,
) -> Timing:
    """Time `fn()` on `device`; see the module docstring for the method.

    Args:
        fn: zero-argument closure doing exactly the work to time.
        device: where `fn` runs (`cpu`, `cuda`, `cuda:1`, ...).
        warmup: untimed calls first (>= 0).
        rep: timed samples (>= 1).
        timer: `auto`, `cuda-graph`, `cuda-event` or `cpu-wall`.
        setup: optional closure run before every sample, outside the timed span.
        min_sample_us: a graph sample repeats replays until it spans at least this long.

    Raises:
        ValueError: bad counts, an unknown timer, or a timer that does not fit the device.
    """
    device = torch.device(device)
    if warmup < 0 or rep < 1:
        raise ValueError(f"need warmup >= 0 and rep >= 1, got warmup={warmup}, rep={rep}")
    if timer not in TIMERS:
        raise ValueError(f"unknown timer {timer!r}; choose one of {', '.join(TIMERS)}")
    if device.type == "cpu":
        if timer not in ("auto", "cpu-wall"):
            raise ValueError(f"timer {timer!r} needs a CUDA device; {device} takes 'cpu-wall' or 'auto'")
        return _bench_cpu(fn, warmup, rep, setup)
    if device.type != "cuda":
        raise ValueError(f"unsupported device {device}; timing supports cpu and cuda")
    if timer == "cpu-wall":
        raise ValueError("timer 'cpu-wall' is for CPU runs; wall-clock around async CUDA work is meaningless")

    with torch.cuda.device(device):
        if timer == "cuda-event":
            return _bench_events(fn, warmup, rep, setup)
        _warm_up_on_side_stream(fn, warmup)
        graph = torch.cuda.CUDAGraph()
        rng = [g.clone_state() for g in torch.cuda.default_generators]
        try:
            with torch.cuda.graph(graph):
                fn()
            torch.cuda.synchronize()
        except Exception as exc:  # capture rejects many ops (syncs, host reads); auto falls back
            _discard(graph, rng)
            if timer == "cuda-graph":
                raise
            message = str(exc).splitlines()[0] if str(exc) else ""
            reason = f"graph capture failed: {type(exc).__name__}: {message}"
            timing = _bench_events(fn, 0, rep, setup)  # capture already ran the warm-up
            return replace(timing, warmup=warmup, fallback_reason=reason)
        return _bench_graph(graph, warmup, rep, setup, min_sample_us)


def _bench_cpu(fn: Callable[[], object], warmup: int, rep: int, setup: Callable[[], object] | None) -> Timing:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rep):
        if setup is not None:
            setup()
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return Timing.from_samples(samples, timer="cpu-wall", warmup=warmup)


def _bench_events(fn: Callable[[], object], warmup: int, rep: int, setup: Callable[[], object] | None) -> Timing:
    for _ in range(warmup):
        fn()
    starts, ends = _events(rep), _events(rep)
    torch.cuda.synchronize()
    for start, end in zip(starts, ends):
        if setup is not None:
            setup()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return Timing.from_samples(samples, timer="cuda-event", warmup=warmup)


def _warm_up_on_side_stream(fn: Callable[[], object], warmup: int) -> None:
    # Capture needs the lazy work of a first call (allocations, compilation, cuBLAS handles) done,
    # and done on a side stream, not the legacy default stream.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def _discard(graph: torch.cuda.CUDAGraph, rng: list[torch.Generator]) -> None:
    # A failed capture leaves torch's CUDA generators mid-capture, and every later random op in the
    # process then fails ("Offset increment outside graph capture"); graph.reset() does not undo that
    # (torch 2.11, H200), putting back the generator states cloned before the capture does.
    graph.reset()
    for generator, state in zip(torch.cuda.default_generators, rng):
        generator.graphsafe_set_state(state)
    torch.cuda.synchronize()


def _bench_graph(
    graph: torch.cuda.CUDAGraph, warmup: int, rep: int, setup: Callable[[], object] | None, min_sample_us: float
) -> Timing:
    graph.replay()  # the first replay uploads the graph; never a sample
    replays = 1
    if setup is None:
        probe = _bench_replays(graph, 1, 5, None)
        median_probe = statistics.median(probe)
        if median_probe < min_sample_us:
            replays = min(1000, math.ceil(min_sample_us / max(median_probe, 1e-3)))
    samples = _bench_replays(graph, replays, rep, setup)
    return Timing.from_samples(samples, timer="cuda-graph", warmup=warmup, replays_per_sample=replays)


def _bench_replays(
    graph: torch.cuda.CUDAGraph, replays: int, rep: int, setup: Callable[[], object] | None
) -> list[float]:
    starts, ends = _events(rep), _events(rep)
    torch.cuda.synchronize()
    for start, end in zip(starts, ends):
        if setup is not None:
            setup()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 / replays for s, e in zip(starts, ends)]


def _events(n: int) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)

