"""The harness: CLI, runner, timing, equivalence, autotune, memory accounting and reports."""
