"""The harness: CLI, runner, timing, equivalence, autotune, memory accounting and reports."""

import time

# When the harness was first imported: a run's profile counts imports from here (harness/phases.py).
STARTED = time.perf_counter()
