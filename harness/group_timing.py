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

import torch
import torch.distributed as dist

from harness.timing import Timing, bench


def bench_group(fn: Callable[[], object], *, device: torch.device | str, warmup: int, rep: int,
                group: dist.ProcessGroup | None = None) -> Timing:
    """Time `fn`, called by every process of `group` at once; every process gets the same Timing."""
    device = torch.device(device)
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        timer, barrier = "cuda-event", lambda: dist.barrier(group=group, device_ids=[index])
    else:
        timer, barrier = "cpu-wall", lambda: dist.barrier(group=group)
    mine = bench(fn, device=device, warmup=warmup, rep=rep, timer=timer, setup=barrier)
    samples = torch.tensor(mine.samples_us, dtype=torch.float64, device=device)
    dist.all_reduce(samples, op=dist.ReduceOp.MAX, group=group)
    return Timing.from_samples(samples.tolist(), timer=timer, warmup=warmup)
