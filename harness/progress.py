"""Progress of long work for people: rich bars on a terminal, plain lines in a log or CI.

Scenarios report through `progress(description, total) -> advance()` (scenarios/base.py RunContext).
On a TTY that drives a transient rich progress bar. When stdout is not a TTY (a CI log, `| tee`,
`> file`), bars would print nothing useful for minutes, so plain lines take their place: the first
task's start, then a heartbeat of at most one line every `every_s` seconds saying what is running and
how far it is, and the end of every task that took that long. A run of short tasks (the gate runs
hundreds) stays a few lines; a long one is never silent for more than `every_s`.
Either way the output goes to stderr, so `--json` output on stdout stays machine-readable, and nothing
is drawn until the first task starts (a run refused during planning prints only its error line).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
        yield _plain(stream, every_s)
        return
    bars: list[Progress] = []  # started on the first task
    try:
        yield _bars(bars, Console(file=stream))
    finally:
        for bar in bars:
            bar.stop()


def _plain(stream: TextIO, every_s: float) -> Factory:
    last = [-math.inf]  # when the last line was printed: one heartbeat for every task of the run

    def emit(text: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - last[0] >= every_s:
            print(text, file=stream, flush=True)
            last[0] = now

    def make(description: str, total: int) -> Advance:
        start = time.monotonic()
        done = 0
        emit(f"{description}: started, {total} steps")

        def advance() -> None:
            nonlocal done
            done += 1
            took = time.monotonic() - start
            if done >= total:
                emit(f"{description}: done, {done}/{total} in {took:.1f} s", force=took >= every_s)
            else:
                emit(f"{description}: {done}/{total} after {took:.0f} s")

        return advance

    return make


def _bars(bars: list[Progress], console: Console) -> Factory:
    def make(description: str, total: int) -> Advance:
        if not bars:
            bars.append(Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True))
            bars[0].start()
        task = bars[0].add_task(description, total=total)
        return lambda: bars[0].advance(task)

    return make
