"""Run a scenario on every process of one `torch.distributed` group: pd-roundtrip's `dist` transport
(issue 10, SPEC §12).

Two ways in:

* `harness run pd-roundtrip --transport dist --nproc N`: this process checks the options first (bad
  input is one line and exit code 2, before any process starts), then starts N worker processes (fork
  on a CPU, which is fast; spawn with CUDA, which cannot be forked). They join one group through a TCP
  store that this process serves on a port the OS picks, so parallel runs never collide. Worker r is
  rank r: on GPU r with NCCL, or on the CPU with gloo (one torch thread each: the processes share the
  cores).
* `torchrun --nproc-per-node N -m harness run pd-roundtrip --transport dist ...`: every process
  torchrun starts is a rank already (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and joins from
  the environment; `--nproc` may be left out (it is the world size) or must equal it.

`--nproc` left out otherwise: the visible GPUs with `--device cuda`, 2 on a CPU. Every rank then runs
the same cases through `harness.runner.run_scenario`; rank 0 alone measures the copy ceilings and
writes the run directory, and this process renders it. Rank 0 prints the progress lines (its cases, PD
pairs, phases); the run id is chosen here, so that on Ctrl-C this process can say where the partial run
is: it gives the workers a few seconds to stop on their own SIGINT (rank 0 then writes FAILED.txt), sends
SIGINT to those still running, and ends the rest.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.progress import progress_reporter
from harness.repro import Repro
from harness.runner import RunOutcome, run_scenario
from results.store import INTERRUPTED, PARTIAL_SUFFIX, load_run, new_run_id
from scenarios import get_scenario

TIMEOUT = datetime.timedelta(minutes=10)  # a collective that waits longer than this fails the run
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_ENV)


def comm_backend(options: dict[str, Any]) -> str:
    """The process group's backend: `--dist-backend`, or by device (NCCL with CUDA, gloo on CPU). The
    scenario's plan has already refused a backend that does not fit the device."""
    chosen = options.get("dist_backend") or "auto"
    if chosen != "auto":
        return chosen
    return "nccl" if str(options.get("device") or "cpu").startswith("cuda") else "gloo"


def run_dist(
    name: str, options: dict[str, Any], *, argv: list[str], out_root: Path | str, progress: Any = None,
    repro: Repro | None = None,
) -> RunOutcome | None:
    """Run scenario `name` over a process group (module docstring). Returns the run on the process that
    started the workers and on rank 0 of a torchrun launch; None on torchrun's other ranks."""
    options = dict(options)
    device = str(options.get("device") or "cpu")
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if options.get("nproc") not in (None, world):
            raise ValueError(f"--nproc {options['nproc']} but torchrun started {world} processes")
        options["nproc"] = world
        get_scenario(name).plan(options)
        _join(comm_backend(options), int(os.environ["RANK"]), world, int(os.environ["LOCAL_RANK"]), device, None)
        try:
            return run_scenario(name, options, argv=argv, out_root=out_root, progress=progress, repro=repro)
        finally:
            dist.destroy_process_group()

    if options.get("nproc") is None:
        options["nproc"] = torch.cuda.device_count() if device.startswith("cuda") else 2
    get_scenario(name).plan(options)  # bad input fails here, before any process starts
    world = int(options["nproc"])
    if device.startswith("cuda") and torch.cuda.device_count() < world:
        raise ValueError(f"--nproc {world} needs {world} GPUs (one per process), this machine has "
                         f"{torch.cuda.device_count()}")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    method = "spawn" if device.startswith("cuda") else "fork"
    queue = mp.get_context(method).SimpleQueue()
    run_id = new_run_id(name)
    workers = mp.start_processes(_worker, args=(world, store.port, comm_backend(options), name, options, argv,
                                                str(out_root), queue, repro, run_id),
                                 nprocs=world, start_method=method, join=False)
    try:
        while not workers.join():
            pass
    except KeyboardInterrupt as exc:
        _stop(workers.processes)
        _mark_interrupted(exc, Path(out_root) / (run_id + PARTIAL_SUFFIX))
        raise
    path = Path(queue.get())
    run = load_run(path)
    return RunOutcome(path, run.throughput.to_dict(orient="records"), run.equivalence_report())


def _stop(processes: list[Any]) -> None:
    """End the workers after Ctrl-C: first the SIGINT they got with this process (a terminal's Ctrl-C
    reaches the whole process group; writing FAILED.txt takes milliseconds), then one of our own (a second
    one earlier could cut that short), then SIGKILL."""
    for send, grace_s in ((None, 2.0), (signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in processes if p.is_alive()]
        if not alive:
            return
        if send is not None:
            for proc in alive:
                os.kill(proc.pid, send)
        deadline = time.monotonic() + grace_s
        for proc in alive:
            proc.join(max(0.0, deadline - time.monotonic()))


def _mark_interrupted(exc: KeyboardInterrupt, partial: Path) -> None:
    """Where rank 0 was (FAILED.txt's first line) and the partial run it left, as the runner marks them."""
    failed = partial / "FAILED.txt"
    first = failed.read_text(errors="replace").partition("\n")[0] if failed.is_file() else ""
    where = first[len(INTERRUPTED):].strip() if first.startswith(INTERRUPTED) else ""
    exc.harness_where = f"{where}, on rank 0" if where else "the process group (rank 0 did not say where)"
    exc.harness_run_dir = (partial, False) if partial.is_dir() else None


def _worker(rank: int, world: int, port: int, backend: str, name: str, options: dict[str, Any], argv: list[str],
            out_root: str, queue: Any, repro: Repro | None, run_id: str) -> None:
    device = str(options.get("device") or "cpu")
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    _join(backend, rank, world, rank, device, store)
    try:
        # rank 0 writes the run and says how far it is; the others run the same cases in step with it
        with progress_reporter() if rank == 0 else nullcontext(None) as progress:
            outcome = run_scenario(name, options, argv=argv, out_root=out_root, repro=repro, run_id=run_id,
                                   progress=progress)
    finally:
        dist.destroy_process_group()
    if outcome is not None:
        queue.put(str(outcome.path))  # a short string: the pipe never fills while the parent joins


def _join(backend: str, rank: int, world: int, local_rank: int, device: str, store: dist.Store | None) -> None:
    bound = None
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)  # one GPU per rank; "cuda" then means this one
        bound = torch.device("cuda", local_rank)  # NCCL binds the group to it instead of guessing
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT, device_id=bound)
