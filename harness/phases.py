"""Where a run's wall time goes: seconds per phase (SPEC §7 "profile before guessing").

A run is split into phases (`setup`, `reference`, `rollout`, `compare`, `timing`, `figures`, ...).
Each second is counted once, toward the innermost phase open at the time: entering `compare` inside
`rollout` pauses `rollout`. On CUDA every phase boundary synchronizes the device, so asynchronous
kernels are counted in the phase that launched them rather than in the next one that waits.
The profile goes into manifest.json as `wall_s`, with `imports` (process start to the first phase)
and `total`; `case_wall_s` holds each case's wall time by case label.

The clock also knows where the run is: a progress reporter it `listen`s to hears every change of phase
and case (its heartbeat names them), and an exception leaving a phase, Ctrl-C's KeyboardInterrupt
above all, is marked with where it struck (`interrupted_at`), innermost phase and case first, so the
run directory's FAILED.txt and the CLI's one line can say it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import harness

PHASES = ("imports", "setup", "compile", "reference", "rollout", "compare", "timing", "figures", "write")


class PhaseClock:
    def __init__(self, device: str = "cpu") -> None:
        self._cuda = str(device).startswith("cuda")
        self.totals: dict[str, float] = {}
        self.cases: dict[str, float] = {}
        self._stack: list[str] = []
        self._cases: list[str] = []  # the case being run (the gate runs one at a time)
        self._listener: Any = None
        self._since = self._start = self._now()
        self.totals["imports"] = self._start - harness.STARTED

    def listen(self, reporter: Any) -> None:
        """Tell `reporter` (harness.progress.Reporter, or anything with a `phase(text)` method; others are
        ignored) where the run is from now on, starting with where it is now."""
        self._listener = reporter if callable(getattr(reporter, "phase", None)) else None
        self._notify()

    def where(self) -> str:
        """`timing of decode tiny-gdn batch 4`: the innermost phase, and the case when one runs."""
        phase = self._stack[-1] if self._stack else "start-up"
        return f"{phase} of {self._cases[-1]}" if self._cases else phase

    def _notify(self) -> None:
        if self._listener is not None:
            case = self._cases[-1] if self._cases else None
            phase = self._stack[-1] if self._stack else None
            self._listener.phase(None if phase is None else f"{case}: {phase}" if case else phase)

    def _now(self) -> float:
        if self._cuda and torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        now = self._now()
        if self._stack:
            self._charge(self._stack[-1], now)
        self._stack.append(name)
        self._since = now
        self._notify()
        try:
            yield
        except BaseException as exc:
            _mark(exc, self.where())
            raise
        finally:
            now = self._now()
            self._charge(name, now)
            self._stack.pop()
            self._since = now
            self._notify()

    @contextmanager
    def case(self, label: str) -> Iterator[None]:
        """Wall time of one case (on top of its phases)."""
        start = self._now()
        self._cases.append(label)
        self._notify()
        try:
            yield
        except BaseException as exc:
            _mark(exc, self.where())
            raise
        finally:
            self._cases.pop()
            self.cases[label] = self.cases.get(label, 0.0) + self._now() - start
            self._notify()

    def _charge(self, name: str, now: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + now - self._since

    def profile(self) -> dict[str, dict[str, float]]:
        """`{"wall_s": {phase: seconds, ..., "total": ...}, "case_wall_s": {case: seconds}}` (ms precision)."""
        totals = dict(self.totals)
        now = time.perf_counter()
        if self._stack:  # the phase still open (the run's outer one) counts up to now
            totals[self._stack[-1]] = totals.get(self._stack[-1], 0.0) + now - self._since
        wall = {k: round(v, 3) for k, v in sorted(totals.items(), key=lambda kv: _order(kv[0]))}
        wall["total"] = round(totals["imports"] + now - self._start, 3)
        return {"wall_s": wall, "case_wall_s": {k: round(v, 3) for k, v in self.cases.items()}}


def interrupted_at(exc: BaseException) -> str | None:
    """Where a PhaseClock saw `exc` first (`timing of decode tiny-gdn batch 4`), None if none did."""
    return getattr(exc, "harness_where", None)


def _mark(exc: BaseException, where: str) -> None:
    if interrupted_at(exc) is None:  # the innermost phase sees it first and says the most
        try:
            exc.harness_where = where  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: nothing to say
            pass


def _order(name: str) -> int:
    return PHASES.index(name) if name in PHASES else len(PHASES)
