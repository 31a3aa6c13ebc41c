"""The compare-modes notebook runs headless on a small CPU run, and its committed .ipynb matches its source.

Also checks that a run ends with its figures written (harness/runner.py calls results.plots.plot_run).
"""

import os
from pathlib import Path

import jupytext
import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

from harness.runner import run_scenario
from results.store import Run, load_run

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
SOURCE = NOTEBOOKS / "compare_modes.py"
COMMITTED = NOTEBOOKS / "compare_modes.ipynb"
# Few timing samples: the notebook shows whatever the run measured, and CPU timings are not what it checks.
ARGV = ["harness", "run", "mtp-fixed", "--rounds", "4", "--batch", "2,3", "--warmup", "0", "--rep", "2"]
LIGHT = {"warmup": 0, "rep": 2}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_root = tmp_path_factory.mktemp("runs")
    return run_scenario("mtp-fixed", {"rounds": 4, "batch": "2,3", **LIGHT}, argv=ARGV, out_root=out_root).path


def test_a_run_ends_with_its_figures(small_run: Path) -> None:
    figures = {p.name: p.stat().st_size for p in (small_run / "figures").glob("*.png")}
    expected = {f"mtp-fixed-gdn-{metric}.png" for metric in ("throughput", "memory", "speedup", "bandwidth")}
    assert set(figures) == expected
    assert all(size > 0 for size in figures.values())


def test_a_figure_that_cannot_be_drawn_does_not_fail_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_plot_run(run: Run) -> None:
        raise RuntimeError("no canvas")

    monkeypatch.setattr("results.plots.plot_run", broken_plot_run)  # the runner imports it when drawing
    with pytest.warns(UserWarning, match="not drawn: RuntimeError.'no canvas'"):
        outcome = run_scenario("mtp-fixed", {"rounds": 2, "batch": "2", "history_len": 4, **LIGHT}, argv=ARGV,
                               out_root=tmp_path)
    assert load_run(outcome.path).throughput["status"].eq("passed").all()  # finished, not left .partial


@pytest.mark.slow  # a Jupyter kernel process (4 s); .ci/run executes it with the slow tests (SPEC §9)
def test_notebook_executes_on_a_cpu_run(small_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A "python3" kernel spec running this interpreter, first on JUPYTER_PATH: a user-level python3 spec
    # pointing at another Python cannot take over, and nothing is installed outside tmp_path.
    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")  # argv: sys.executable -m ipykernel_launcher
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # As notebooks/README.md runs it: HARNESS_RUN relative to the repository root, the kernel in notebooks/
    # (where Jupyter runs a notebook). From notebooks/ this relative path names nothing.
    relative = os.path.relpath(small_run, REPO)
    assert not (NOTEBOOKS / relative).exists()
    monkeypatch.setenv("HARNESS_RUN", relative)  # the kernel inherits this environment
    monkeypatch.setenv("MPLBACKEND", "Agg")

    nb = jupytext.read(SOURCE)
    client = NotebookClient(nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError on the first failing cell

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    data = [o.get("data", {}) for o in outputs]
    markdown = "\n".join(d.get("text/markdown", "") for d in data)
    html = "\n".join(d.get("text/html", "") for d in data)
    assert f"run {small_run.name}:" in markdown  # the manifest header of the run it was given
    assert "equivalence: PASS" in markdown
    for mode in ("native", "compact-accept", "compact-deferred", "replay-inline (Lh 16, fp32 history)",
                 "x faster than native", "bytes/req measured"):
        assert mode in html  # the side-by-side table
    assert "before the rollout" in html  # the equivalence verdicts table
    # harness advise: a verdict table per acceptance (this run has no decode rows: drafts 0 is not measured)
    for p in ("0.5", "0.7", "0.9"):
        assert f"### tiny-gdn · accept geometric:{p}" in markdown
    assert "| batch | best | timing | tok/s per request | runner-up | margin | inside noise |" in markdown
    # replay drift, memory and throughput, and advise's frontier: one figure each for this one-scenario run
    assert sum("image/png" in d for d in data) == 4


def test_committed_notebook_matches_its_source() -> None:
    source = jupytext.read(SOURCE)
    committed = nbformat.read(COMMITTED, as_version=4)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in source.cells], (
        "notebooks/compare_modes.ipynb is stale: run `jupytext --to ipynb notebooks/compare_modes.py`"
    )
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code), "commit it with outputs stripped"


def test_the_readme_says_what_a_run_prints_and_what_jupyter_does() -> None:
    """notebooks/README.md said the run directory was relative (tests/test_output.py checks the line is
    absolute) and that executing the notebook prints nothing else (the slow test below runs it)."""
    readme = (NOTEBOOKS / "README.md").read_text()
    assert "ends with `run directory: <path>`, an absolute" in readme and "prints nothing else" not in readme
    assert "[NbClientApp] Executing" in readme


@pytest.mark.slow  # a Jupyter kernel process; the README's own command line
def test_jupyter_execute_as_the_readme_gives_it(small_run: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter"), "HARNESS_RUN": str(small_run)}
    jupyter = Path(sys.executable).parent / "jupyter"
    proc = subprocess.run([str(jupyter), "execute", "notebooks/compare_modes.ipynb"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # the cells' outputs are not printed
    assert "[NbClientApp] Executing notebooks/compare_modes.ipynb" in proc.stderr  # jupyter's own lines are
