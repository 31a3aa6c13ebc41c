"""OOM guard, failure classification, memory budgets and subprocess isolation (harness/memory.py)."""

from __future__ import annotations

import ast
import gc
import os
import time
import weakref

import pytest
import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
from triton.runtime.errors import OutOfResources, PTXASError

from harness import memory
from harness.memory import (
    classify_failure,
    is_oom,
    max_concurrency,
    oom_guard,
    parse_wanted_bytes,
    predicted_fits,
    run_guarded,
    run_isolated,
)

GIB = 1 << 30
MIB = 1 << 20
TORCH_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.25 GiB is free. Of the allocated memory 130.02 GiB is allocated by PyTorch"
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (TORCH_OOM_MESSAGE, 2 * GIB),
        ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)", 20 * MIB),
        ("CUDA out of memory. Tried to allocate 1.50 KiB", 1536),
        ("MPS backend out of memory. Tried to allocate 256 bytes on private pool", 256),
        ("CUDA error: out of memory", None),
    ],
)
def test_parse_wanted_bytes(message: str, expected: int | None) -> None:
    assert parse_wanted_bytes(message) == expected


def test_is_oom_recognises_torch_and_runtime_errors_only() -> None:
    assert is_oom(torch.OutOfMemoryError(TORCH_OOM_MESSAGE))
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_oom(ValueError("out of memory"))
    assert not is_oom(OutOfResources(required=300_000, limit=232_448, name="shared memory"))


def test_a_cpu_allocation_too_large_for_the_host_is_an_oom_with_its_size() -> None:
    with oom_guard() as guard:
        torch.empty(1 << 50, dtype=torch.uint8)  # a PiB: refused by the allocator at once, never touched
    assert guard.record is not None and guard.record.wanted_bytes == 1 << 50


def test_check_fits_refuses_a_case_the_host_cannot_hold() -> None:
    from harness.memory import check_fits, host_available_bytes
    from scenarios.base import CaseMemory

    free = host_available_bytes()
    assert free is not None and free > 0
    small = CaseMemory(subject="--batch 4", device=1 << 20, variants={"native/torch": 1 << 20}, hint="lower --batch")
    check_fits(small, "cpu", "decode on tiny-gdn")
    big = CaseMemory(subject="--batch 9", device=1 << 20, host=free, variants={"a": 0, "b": 1 << 30}, hint="lower --batch")
    with pytest.raises(ValueError, match=r"^--batch 9: decode on tiny-gdn needs about .* GiB and the host has .*; lower"):
        check_fits(big, "cpu", "decode on tiny-gdn")  # on CPU the largest variant must fit


def test_oom_guard_records_and_swallows_an_oom() -> None:
    with oom_guard() as guard:
        raise torch.OutOfMemoryError(TORCH_OOM_MESSAGE)
    record = guard.record
    assert record is not None and record.status == "oom"
    assert record.wanted_bytes == 2 * GIB
    assert record.message == TORCH_OOM_MESSAGE
    # No CUDA on this machine: device memory is unknown, not guessed.
    assert (record.free_bytes, record.total_bytes) == (None, None)
    assert record.to_dict()["status"] == "oom"


def test_oom_guard_leaves_record_unset_when_nothing_fails() -> None:
    with oom_guard() as guard:
        value = torch.randn(4).sum()
    assert guard.record is None and torch.isfinite(value)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad shape"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        OutOfResources(required=300_000, limit=232_448, name="shared memory"),
        KeyError("BV"),
    ],
)
def test_oom_guard_catches_nothing_else(error: Exception) -> None:
    with pytest.raises(type(error)) as info:
        with oom_guard():
            raise error
    assert info.value is error


def test_oom_guard_releases_tensors_held_by_the_failed_frames() -> None:
    """Even when someone keeps the exception (as failed autotune configs do), the failed call's
    locals must not stay alive through its traceback."""
    kept: list[BaseException] = []
    alive: list[weakref.ref] = []

    def allocate_then_fail() -> None:
        big = torch.randn(1 << 16)
        alive.append(weakref.ref(big))
        error = torch.OutOfMemoryError(TORCH_OOM_MESSAGE)
        kept.append(error)
        raise error

    result = run_guarded(allocate_then_fail)
    gc.collect()
    assert result.status == "oom" and result.value is None
    assert kept[0].__traceback__ is None
    assert alive[0]() is None


def test_run_guarded_returns_the_value_or_the_oom() -> None:
    x = torch.randn(8)
    ok = run_guarded(lambda: x * 2)
    assert ok.status == "ok" and ok.oom is None and torch.equal(ok.value, x * 2)

    def fail() -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")

    oom = run_guarded(fail)
    assert oom.status == "oom" and oom.oom is not None and oom.oom.wanted_bytes == 20 * MIB


def _static_assert_failure() -> Exception:
    @triton.jit
    def block_limited(x_ptr, BV: tl.constexpr):
        tl.static_assert(BV <= 32)
        offsets = tl.arange(0, BV)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1)

    x = torch.randn(64)
    try:
        block_limited[(1,)](x, BV=64)
    except Exception as exc:  # whatever the interpreter raises is what a sweep would see
        return exc
    raise AssertionError("the static_assert did not fire")


@pytest.mark.parametrize(
    ("make_error", "status"),
    [
        (lambda: torch.OutOfMemoryError(TORCH_OOM_MESSAGE), "oom"),
        (lambda: RuntimeError("CUDA error: out of memory"), "oom"),
        (lambda: OutOfResources(required=300_000, limit=232_448, name="shared memory"), "out_of_resources"),
        (lambda: RuntimeError("Triton Error [CUDA]: too many resources requested for launch"), "out_of_resources"),
        (lambda: CompilationError(None, ast.AST(), "unsupported tensor index"), "compile_error"),
        (lambda: CompileTimeAssertionFailure(None, ast.AST(), "BV <= 32"), "compile_error"),
        (lambda: PTXASError("ptxas fatal: too many registers"), "compile_error"),
        (_static_assert_failure, "compile_error"),
    ],
)
def test_classify_failure(make_error, status: str) -> None:
    assert classify_failure(make_error()) == status


@pytest.mark.parametrize(
    "error", [ValueError("wrong shape"), RuntimeError("CUDA error: an illegal memory access was encountered")]
)
def test_classify_failure_reraises_everything_else(error: Exception) -> None:
    with pytest.raises(type(error)) as info:
        classify_failure(error)
    assert info.value is error


def test_predicted_fits_on_cpu_has_no_budget() -> None:
    assert predicted_fits(1 << 40, "cpu") == (True, None)
    with pytest.raises(ValueError, match="bytes_needed must be >= 0, got -1"):
        predicted_fits(-1)


def test_predicted_fits_compares_with_free_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "device_memory", lambda device=None: (3 * GIB, 80 * GIB))
    assert predicted_fits(3 * GIB, "cuda") == (True, 3 * GIB)
    assert predicted_fits(3 * GIB + 1, "cuda") == (False, 3 * GIB)


def test_max_concurrency() -> None:
    assert max_concurrency(72 * MIB, 10 * GIB) == 142
    assert max_concurrency(72 * MIB, 10 * GIB, fixed_bytes=2 * GIB) == 113
    assert max_concurrency(100, 99) == 0
    assert max_concurrency(100, 1000, fixed_bytes=2000) == 0
    with pytest.raises(ValueError, match="bytes_per_request must be > 0, got 0"):
        max_concurrency(0, 1000)
    with pytest.raises(ValueError, match="got -1 and 0"):
        max_concurrency(10, -1)


# Run in a child process by the run_isolated tests (this module is importable there).
def child_sum(values: list[float], scale: float) -> dict[str, float]:
    return {"sum": scale * sum(values), "pid": os.getpid()}


def child_oom() -> None:
    raise torch.OutOfMemoryError(TORCH_OOM_MESSAGE)


def child_crash(code: int) -> None:
    print("about to fail", flush=True)
    raise SystemExit(code)


def child_raise() -> None:
    raise ValueError("poisoned context: illegal address")


def child_sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_run_isolated_returns_the_json_result_from_another_process() -> None:
    out = run_isolated(f"{__name__}:child_sum", {"values": [1.0, 2.5, 4.0], "scale": 2.0}, timeout=120)
    assert out["status"] == "ok"
    assert out["result"]["sum"] == 15.0
    assert out["result"]["pid"] != os.getpid()


# A child's OOM record and its errors under `-m slow` (2-4 s of child processes): the child runs run_guarded,
# whose records are tested in-process above; the fast suite keeps a child's result and the time-out.
@pytest.mark.slow
def test_run_isolated_reports_an_oom_record() -> None:
    out = run_isolated(f"{__name__}:child_oom", {}, timeout=120)
    assert out["status"] == "oom"
    assert out["wanted_bytes"] == 2 * GIB
    assert out["message"] == TORCH_OOM_MESSAGE


@pytest.mark.slow
def test_run_isolated_reports_errors_with_the_stderr_tail() -> None:
    raised = run_isolated(f"{__name__}:child_raise", {}, timeout=120)
    assert raised["status"] == "error" and raised["returncode"] == 1
    assert "ValueError: poisoned context: illegal address" in raised["stderr_tail"]

    crashed = run_isolated(f"{__name__}:child_crash", {"code": 7}, timeout=120)
    assert crashed["status"] == "error" and crashed["returncode"] == 7


def test_run_isolated_times_out() -> None:
    start = time.perf_counter()
    out = run_isolated(f"{__name__}:child_sleep", {"seconds": 600}, timeout=1)  # killed while importing or sleeping
    assert out["status"] == "error" and out["detail"] == "timed out after 1 s"
    assert time.perf_counter() - start < 60


def test_run_isolated_rejects_a_malformed_path() -> None:
    with pytest.raises(ValueError, match="'package.module:function'"):
        run_isolated("harness.memory.run_guarded", {}, timeout=5)


def test_a_run_refuses_device_budget_only_when_no_case_fits(monkeypatch, tmp_path, capsys) -> None:
    """`plan_run` on CUDA: a case whose smallest variant is over the free device memory runs beside cases that
    fit (its allocations become oom rows, sweep data); a run in which no case fits is refused, one line."""
    from types import SimpleNamespace

    from harness import memory, runner
    from scenarios.base import CaseMemory

    free = 10 * GIB
    monkeypatch.setattr(memory, "device_memory", lambda device=None: (free, 2 * free))
    sizes = {1: GIB, 512: 3 * free}  # batch -> the case's device bytes

    def scenario(batches):
        return SimpleNamespace(
            name="mtp-fixed",
            plan=lambda options: [SimpleNamespace(preset="qwen3-next", batch=b) for b in batches],
            memory=lambda case, device: CaseMemory(subject=f"--batch {case.batch}", device=sizes[case.batch],
                                                   variants={"native/triton": 0}, hint="lower --batch"))

    cases = runner.plan_run(scenario([1, 512]), {"device": "cuda"}, tmp_path / "out")
    assert [c.batch for c in cases] == [1, 512]
    err = capsys.readouterr().err
    assert "--batch 512: mtp-fixed on qwen3-next needs about 30.0 GiB and cuda has 10.0 GiB free" in err
    assert "--batch 1:" not in err
    with pytest.raises(ValueError, match=r"^--batch 512: mtp-fixed on qwen3-next needs about 30\.0 GiB and cuda has"):
        runner.plan_run(scenario([512]), {"device": "cuda"}, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything is written
