"""`python -m harness ...` is the `harness` console script (for machines where the project is on
PYTHONPATH rather than installed)."""

from harness.cli import app

app(prog_name="harness")
