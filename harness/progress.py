"""Progress of long work for people: rich bars on a terminal, plain lines in a log or CI.

Scenarios report through `progress(description, total) -> advance()` (scenarios/base.py RunContext).
On a TTY that drives a transient rich progress bar. When stdout is not a TTY (a CI log, `| tee`,
`> file`), bars would print nothing useful for minutes, so plain lines take their place: the first
task's start, then a heartbeat of at most one line every `every_s` seconds saying what is running and
how far it is (with the outermost task's count, e.g. the gate's cases, in front), also while one step
runs longer than that, and the end of every task that took that long. A run of short tasks (the gate runs
hundreds) stays a few lines; a long one is never silent for more than `every_s`.
Either way the output goes to stderr, so `--json` output on stdout stays machine-readable, and nothing
is drawn until the first task starts (a run refused during planning prints only its error line).

Tasks are what scenarios count; between them a run spends minutes in work nobody counts (timing a
model-shape case on CPU, a PD pair, figures). The run's phase clock (harness/phases.py) therefore tells
the reporter which phase and case it is in (`Reporter.phase`), and the heartbeat also beats while no task
runs: `decode qwen3-next batch 1: timing for 40 s (running)`. So every phase is heard from at least every
`every_s` (`HARNESS_PROGRESS_EVERY_S` overrides the default, e.g. 0 for every event in a test).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Advance = Callable[[], None]
Factory = Callable[[str, int], Advance]
EVERY_S = 10.0


def default_every_s() -> float:
    """EVERY_S, or `HARNESS_PROGRESS_EVERY_S` when set (tests of a whole CLI run read every event with 0)."""
    value = os.environ.get("HARNESS_PROGRESS_EVERY_S")
    return EVERY_S if value in (None, "") else float(value)


class Reporter:
    """What a run reports progress to: called as `progress(description, total) -> advance`, and told the
    phase and case the run is in by `phase(text)` (None: between phases), so its heartbeat can name them."""

    def __call__(self, description: str, total: int) -> Advance:
        raise NotImplementedError

    def phase(self, text: str | None) -> None:
        raise NotImplementedError


@contextmanager
def progress_reporter(tty: bool | None = None, stream: TextIO | None = None, every_s: float | None = None
                      ) -> Iterator[Reporter]:
    """A `Reporter` for the duration of the block.

    `tty` defaults to whether stdout is a terminal; `stream` (default stderr) receives the output;
    `every_s` defaults to `default_every_s()`.
    """
    tty = sys.stdout.isatty() if tty is None else tty
    stream = stream or sys.stderr
    every_s = default_every_s() if every_s is None else every_s
    reporter: _Plain | _Bars = _Plain(stream, every_s) if not tty else _Bars(Console(file=stream))
    try:
        yield reporter
    finally:
        reporter.stop()


@dataclass
class _Task:
    description: str
    total: int
    start: float
    done: int = 0

    def status(self, now: float) -> str:
        return f"{self.description}: {self.done}/{self.total} after {now - self.start:.0f} s"


class _Plain(Reporter):
    """Plain lines: one heartbeat for every task of the run, at most one line every `every_s`. A line names
    the outermost unfinished task too (the gate's `gate cases: 12/40`), so overall progress shows while
    inner tasks advance, and a clock thread prints the running tasks (or, with none, the phase) when a
    single step is longer than `every_s` (an interpreted kernel, a timing phase), so a log is never silent
    for longer than that."""

    def __init__(self, stream: TextIO, every_s: float) -> None:
        self.stream, self.every_s = stream, every_s
        self.last = -math.inf  # when the last line was printed
        self.created = time.monotonic()  # the clock's first beat waits a whole period (planning is quiet)
        self.active: list[_Task] = []  # unfinished tasks, outermost (earliest started) first
        self.current: tuple[str, float] | None = None  # the phase text and since when
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.clock: threading.Thread | None = None
        if every_s > 0:
            self.clock = threading.Thread(target=self._tick, name="progress-heartbeat", daemon=True)
            self.clock.start()

    def __call__(self, description: str, total: int) -> Advance:
        return self.make(description, total)

    def phase(self, text: str | None) -> None:
        with self.lock:
            if text is None:
                self.current = None
            elif self.current is None or self.current[0] != text:
                self.current = (text, time.monotonic())

    def make(self, description: str, total: int) -> Advance:
        task = _Task(description, total, time.monotonic())
        with self.lock:
            self.active.append(task)
            self._emit(self._with_outer(task, f"{description}: started, {total} steps"))

        def advance() -> None:
            with self.lock:
                task.done += 1
                now = time.monotonic()
                took = now - task.start
                if task.done >= task.total:
                    line = self._with_outer(task, f"{description}: done, {task.done}/{task.total} in {took:.1f} s")
                    if task in self.active:
                        self.active.remove(task)
                    self._emit(line, force=took >= self.every_s)
                else:
                    self._emit(self._with_outer(task, task.status(now)))

        return advance

    def stop(self) -> None:
        self.stopped.set()
        if self.clock is not None:
            self.clock.join()

    def _with_outer(self, task: _Task, text: str) -> str:
        outer = self.active[0] if self.active else None
        return text if outer is None or outer is task else f"{outer.status(time.monotonic())} | {text}"

    def _emit(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            print(text, file=self.stream, flush=True)
            self.last = now

    def _tick(self) -> None:
        while not self.stopped.wait(self.every_s / 4):
            with self.lock:
                now = time.monotonic()
                if now - max(self.last, self.created) < self.every_s:
                    continue
                if self.active:
                    inner = self.active[-1]
                    where = f", {self.current[0]}" if self.current is not None and self.current[1] > inner.start else ""
                    self._emit(self._with_outer(inner, inner.status(now) + f" (running{where})"))
                elif self.current is not None:  # no task counts this work: say which phase it is
                    text, since = self.current
                    self._emit(f"{text} for {now - since:.0f} s (running)")


class _Bars(Reporter):
    """A transient rich progress: a bar per task and a line with the run's phase and its elapsed time."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None  # started on the first task or phase
        self.status: Any = None  # the phase line's task

    def _started(self) -> Progress:
        if self.bar is None:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
        return self.bar

    def __call__(self, description: str, total: int) -> Advance:
        bar = self._started()
        task = bar.add_task(description, total=total)
        return lambda: bar.advance(task)

    def phase(self, text: str | None) -> None:
        if text is None and self.bar is None:
            return
        bar = self._started()
        if self.status is None:
            self.status = bar.add_task(text or "", total=None)
        elif text is not None and bar.tasks[self.status].description != text:
            bar.reset(self.status, description=text, total=None)  # the elapsed time is the phase's

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
