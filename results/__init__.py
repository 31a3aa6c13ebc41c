"""Results schema and run-directory I/O. `load_run` is the one way to read a run back."""

from results.store import Run, RunWriter, latest_run, load_run

__all__ = ["Run", "RunWriter", "latest_run", "load_run"]
