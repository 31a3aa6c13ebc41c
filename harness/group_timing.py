"""Timing work that every process of a `torch.distributed` group takes part in (pd-roundtrip's `dist`
transport, issue 10).

A sample starts after a barrier, so every process starts it together, and each process times its own
part with its own timer (CUDA events on its GPU, the wall clock on a CPU); the group's sample is the
slowest process's, because a transfer is done only when its last receiver is. Warm-up calls and samples
are the same number on every process, as each call is collective. Never captured in a CUDA graph: a
process whose capture failed would fall out of step with the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from harness.timing import Timing, bench


def bench_group(*phases: Callable[[], object], device: torch.device | str, warmup: int, rep: int,
                group: dist.ProcessGroup | None = None) -> Timing:
    """Time `phases`, each called by every process of `group` at once; every process gets the same Timing.

    One phase: its samples. Several (a transfer's pack, exchange, unpack): each phase is timed on its own,
    every sample after a barrier, and sample i of the whole is the sum of the phases' samples i; `parts`
    holds each phase's Timing. A phase's sample never exceeds the whole's, so a ceiling taken from one phase
    (the exchange: the link) is never beaten by the whole, whatever the noise.
    """
    if not phases:
        raise ValueError("bench_group needs at least one phase")
    timings = [_bench_one(fn, torch.device(device), warmup, rep, group) for fn in phases]
    if len(timings) == 1:
        return timings[0]
    summed = [sum(samples) for samples in zip(*(t.samples_us for t in timings), strict=True)]
    return replace(Timing.from_samples(summed, timer=timings[0].timer, warmup=warmup), parts=tuple(timings))


def _bench_one(fn: Callable[[], object], device: torch.device, warmup: int, rep: int,
               group: dist.ProcessGroup | None) -> Timing:
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        timer, barrier = "cuda-event", lambda: dist.barrier(group=group, device_ids=[index])
    else:
        timer, barrier = "cpu-wall", lambda: dist.barrier(group=group)
    mine = bench(fn, device=device, warmup=warmup, rep=rep, timer=timer, setup=barrier)
    samples = torch.tensor(mine.samples_us, dtype=torch.float64, device=device)
    dist.all_reduce(samples, op=dist.ReduceOp.MAX, group=group)
    return Timing.from_samples(samples.tolist(), timer=timer, warmup=warmup)
