"""Out-of-memory handling and memory budgets (SPEC §7, §8).

A sweep (autotune candidates, scenario cases such as native with many drafts at a large batch) must
turn a CUDA out-of-memory error into a row with status `oom`, release what the failed attempt held,
and go on. Three pieces do that:

* `oom_guard()` / `run_guarded(fn)`: catch an OOM (and nothing else), free memory, and describe it
  as an `OOMRecord`: the bytes the allocator was asked for, the device's free and total memory
  when it failed, and the message;
* `classify_failure(exc)`: the status a sweep records for a failed candidate (`oom`,
  `out_of_resources`, `compile_error`), re-raising anything that is a real bug;
* `run_isolated("module:function", kwargs, timeout)`: run one case in a fresh Python process, for
  sweeps where a failure can poison the CUDA context (an illegal address cannot be recovered
  in-process), so the parent survives and records an `error` row with the child's stderr tail.

Memory is freed by dropping the failed frames (their locals hold the tensors: a live traceback keeps
a failed candidate's inputs allocated), `gc.collect()` and `torch.cuda.empty_cache()`.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import torch

_UNIT_BYTES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# PyTorch writes "Tried to allocate 2.00 GiB" / "20.00 MiB" / "512 bytes" (sizes in powers of 1024).
_WANTED_RE = re.compile(r"Tried to allocate\s+([0-9.]+)\s*(?:([KMGT])i?B|bytes?|B)\b", re.IGNORECASE)
_OUT_OF_RESOURCES_RE = re.compile(r"out of resource|too many resources requested", re.IGNORECASE)
_STDERR_TAIL_CHARS = 4000


@dataclass(frozen=True)
class OOMRecord:
    """One out-of-memory failure. `wanted_bytes` is parsed from PyTorch's message, which rounds to
    two decimals of its unit (None when the message names no size); free/total are the device's at
    the time of the failure (None off CUDA)."""

    message: str
    wanted_bytes: int | None
    free_bytes: int | None
    total_bytes: int | None
    status: str = "oom"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GuardResult:
    """What `run_guarded` returns: status `ok` with the function's value, or `oom` with the record."""

    status: str
    value: Any = None
    oom: OOMRecord | None = None


def is_oom(exc: BaseException) -> bool:
    """True for torch's OutOfMemoryError (CUDA's is the same class) and RuntimeErrors that say
    "out of memory" (e.g. `CUDA error: out of memory` from outside the caching allocator) or that the
    CPU allocator "can't allocate memory" (a host allocation larger than the machine can give)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def parse_wanted_bytes(message: str) -> int | None:
    """Bytes from "Tried to allocate X GiB/MiB/KiB/bytes" in an OOM message; None when absent."""
    match = _WANTED_RE.search(message)
    if match is None:
        return None
    return round(float(match.group(1)) * _UNIT_BYTES[(match.group(2) or "").upper()])


def device_memory(device: torch.device | str | int | None = None) -> tuple[int | None, int | None]:
    """(free_bytes, total_bytes) of a CUDA device now; (None, None) on CPU or without CUDA."""
    if device is not None and torch.device(device).type != "cuda":
        return None, None
    if not torch.cuda.is_available():
        return None, None
    return torch.cuda.mem_get_info(device)


def release_memory(exc: BaseException | None = None) -> None:
    """Drop the frames of a failed call (their locals pin tensors), collect, return cached blocks."""
    if exc is not None and exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def oom_record(exc: BaseException, device: torch.device | str | int | None = None) -> OOMRecord:
    """Describe an OOM, sampling device memory now (before anything is released)."""
    message = str(exc)
    free, total = device_memory(device)
    return OOMRecord(message=message, wanted_bytes=parse_wanted_bytes(message), free_bytes=free, total_bytes=total)


class OOMGuard:
    """Yielded by `oom_guard()`; `record` is set when the block ended in an OOM."""

    record: OOMRecord | None = None


@contextmanager
def oom_guard(device: torch.device | str | int | None = None) -> Iterator[OOMGuard]:
    """Run a block; an OOM inside it is swallowed, memory released and `guard.record` set.

    Any other exception propagates unchanged::

        with oom_guard() as guard:
            out = kernel(big_inputs)
        if guard.record is not None:
            rows.append({"status": "oom", **guard.record.to_dict()})
    """
    guard = OOMGuard()
    try:
        yield guard
    except Exception as exc:
        if not is_oom(exc):
            raise
        guard.record = oom_record(exc, device)
        release_memory(exc)


def run_guarded(fn: Callable[[], Any], device: torch.device | str | int | None = None) -> GuardResult:
    """`fn()` with an OOM turned into `GuardResult(status="oom", oom=record)`."""
    with oom_guard(device) as guard:
        return GuardResult(status="ok", value=fn())
    return GuardResult(status="oom", oom=guard.record)


def classify_failure(exc: BaseException) -> str:
    """The sweep status of a failed candidate; re-raises `exc` when it is none of them.

    * `oom`: see `is_oom`;
    * `out_of_resources`: Triton's OutOfResources (shared memory, registers) and the driver's
      "too many resources requested for launch";
    * `compile_error`: Triton's CompilationError (CompileTimeAssertionFailure included) and
      PTXASError; under `TRITON_INTERPRET=1` the kernel body runs in Python, so what a GPU compile
      rejects (a failed `tl.static_assert`, a type or shape error) arrives as InterpreterError and
      is classified here too.
    """
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import InterpreterError, OutOfResources, PTXASError

    if is_oom(exc):
        return "oom"
    if isinstance(exc, OutOfResources) or (isinstance(exc, RuntimeError) and _OUT_OF_RESOURCES_RE.search(str(exc))):
        return "out_of_resources"
    if isinstance(exc, (CompilationError, PTXASError, InterpreterError)):
        return "compile_error"
    raise exc


def predicted_fits(bytes_needed: int, device: torch.device | str | int | None = None) -> tuple[bool, int | None]:
    """(fits, free_bytes): whether `bytes_needed` more bytes fit in the device's free memory now.

    Off CUDA there is no device budget to check: (True, None).
    """
    if bytes_needed < 0:
        raise ValueError(f"bytes_needed must be >= 0, got {bytes_needed}")
    free, _ = device_memory(device)
    return (True, None) if free is None else (bytes_needed <= free, free)


def host_available_bytes() -> int | None:
    """Memory the host can give a new allocation without swapping: MemAvailable (Linux), else the free
    physical pages; None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class DeviceBudgetError(ValueError):
    """A case whose smallest variant does not fit in the device's free memory (`check_fits`): the run refuses
    it only when no case of the run fits; beside cases that do, it runs into its `oom` rows."""


def check_fits(memory: Any, device: str, where: str) -> None:
    """Refuse a case whose predicted memory (`scenarios.base.CaseMemory`) exceeds what is free now.

    CUDA: DeviceBudgetError when even the smallest variant cannot fit in the device's free memory; a
    variant that alone does not fit runs into `oom_guard` and becomes an `oom` row (SPEC §8). CPU (and the
    host side of a CUDA case): Linux overcommits and kills the process instead of failing an allocation, so
    there is nothing to catch: ValueError when the largest variant does not fit in the available host memory.
    """
    cuda = device.startswith("cuda")
    host = memory.host + (0 if cuda else memory.device_bytes(largest=True))
    checks = [(host, host_available_bytes(), "the host has", ValueError)]
    if cuda:
        checks.append((memory.device_bytes(largest=False), device_memory(device)[0], f"{device} has",
                       DeviceBudgetError))
    for need, free, who, error in checks:
        if free is not None and need > free:
            raise error(f"{memory.subject}: {where} needs about {_gib(need)} and {who} {_gib(free)} free; "
                        f"{memory.hint}")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def max_concurrency(bytes_per_request: int, budget_bytes: int, fixed_bytes: int = 0) -> int:
    """How many requests fit in `budget_bytes` after `fixed_bytes` (weights, scratch) is taken."""
    if bytes_per_request <= 0:
        raise ValueError(f"bytes_per_request must be > 0, got {bytes_per_request}")
    if budget_bytes < 0 or fixed_bytes < 0:
        raise ValueError(f"budget_bytes and fixed_bytes must be >= 0, got {budget_bytes} and {fixed_bytes}")
    return max(budget_bytes - fixed_bytes, 0) // bytes_per_request


def run_isolated(fn_path: str, kwargs: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run `module:function(**kwargs)` in a fresh Python process and return its outcome.

    `kwargs` and the function's return value must be JSON. Returns `{"status": "ok", "result": ...}`,
    the child's OOM record (`status` `oom`, see `OOMRecord`), or `{"status": "error", "detail": ...,
    "returncode": ..., "stderr_tail": ...}` when the child raised, crashed or timed out. The child
    sees the parent's `sys.path`, so whatever the parent can import it can too.
    """
    module, sep, function = fn_path.partition(":")
    if not sep or not module or not function:
        raise ValueError(f"fn_path must look like 'package.module:function', got {fn_path!r}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="isolated-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        command = [sys.executable, "-m", __name__, fn_path, result_path]
        try:
            proc = subprocess.run(command, input=json.dumps(kwargs), capture_output=True, text=True,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return {"status": "error", "detail": f"timed out after {timeout} s", "returncode": None,
                    "stderr_tail": stderr[-_STDERR_TAIL_CHARS:]}
        if proc.returncode != 0 or not os.path.exists(result_path):
            return {"status": "error", "detail": f"{fn_path} exited with code {proc.returncode}",
                    "returncode": proc.returncode, "stderr_tail": proc.stderr[-_STDERR_TAIL_CHARS:]}
        with open(result_path) as f:
            return json.load(f)


def _isolated_main(fn_path: str, result_path: str) -> None:
    """Child side of `run_isolated`: kwargs on stdin, outcome written to `result_path`."""
    import importlib

    module, _, function = fn_path.partition(":")
    fn = getattr(importlib.import_module(module), function)
    kwargs = json.loads(sys.stdin.read())
    outcome = run_guarded(lambda: fn(**kwargs))
    payload = {"status": "ok", "result": outcome.value} if outcome.oom is None else outcome.oom.to_dict()
    with open(result_path, "w") as f:
        json.dump(payload, f)


if __name__ == "__main__":
    _isolated_main(*sys.argv[1:])
