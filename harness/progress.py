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
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Advance = Callable[[], None]
Factory = Callable[[str, int], Advance]
EVERY_S = 10.0


@contextmanager
def progress_reporter(tty: bool | None = None, stream: TextIO | None = None, every_s: float = EVERY_S
                      ) -> Iterator[Factory]:
    """A `progress(description, total) -> advance` factory for the duration of the block.

    `tty` defaults to whether stdout is a terminal; `stream` (default stderr) receives the output.
    """
    tty = sys.stdout.isatty() if tty is None else tty
    stream = stream or sys.stderr
    if not tty:
        plain = _Plain(stream, every_s)
        try:
            yield plain.make
        finally:
            plain.stop()
        return
    bars: list[Progress] = []  # started on the first task
    try:
        yield _bars(bars, Console(file=stream))
    finally:
        for bar in bars:
            bar.stop()


@dataclass
class _Task:
    description: str
    total: int
    start: float
    done: int = 0

    def status(self, now: float) -> str:
        return f"{self.description}: {self.done}/{self.total} after {now - self.start:.0f} s"


class _Plain:
    """Plain lines: one heartbeat for every task of the run, at most one line every `every_s`. A line names
    the outermost unfinished task too (the gate's `gate cases: 12/40`), so overall progress shows while
    inner tasks advance, and a clock thread prints the running tasks when a single step is longer than
    `every_s` (an interpreted kernel), so a log is never silent for longer than that."""

    def __init__(self, stream: TextIO, every_s: float) -> None:
        self.stream, self.every_s = stream, every_s
        self.last = -math.inf  # when the last line was printed
        self.active: list[_Task] = []  # unfinished tasks, outermost (earliest started) first
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.clock: threading.Thread | None = None
        if every_s > 0:
            self.clock = threading.Thread(target=self._tick, name="progress-heartbeat", daemon=True)
            self.clock.start()

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
                if self.active and time.monotonic() - self.last >= self.every_s:
                    inner = self.active[-1]
                    self._emit(self._with_outer(inner, inner.status(time.monotonic()) + " (running)"))


def _bars(bars: list[Progress], console: Console) -> Factory:
    def make(description: str, total: int) -> Advance:
        if not bars:
            bars.append(Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True))
            bars[0].start()
        task = bars[0].add_task(description, total=total)
        return lambda: bars[0].advance(task)

    return make
