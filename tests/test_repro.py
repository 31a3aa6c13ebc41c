"""The `repro` column: every row's command line runs and reruns the same case (harness/repro.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.cli import app, cli_options, repro
from harness.repro import NOT_REPRODUCED, repro_argv
from results.schema import KEY
from results.store import load_run
from scenarios import SCENARIOS

runner = CliRunner()
FAST = ["--warmup", "0", "--rep", "2"]
# One small run per scenario: (name, arguments); every distinct repro line of its rows is rerun. Replay is
# timed over its fold cycle of Lh / W rounds a sample: Lh 4 keeps that short (decode's W = 1).
RUNS = [
    ("decode", ["--rounds", "2", "--batch", "3", "--check-requests", "2", "--seed", "7", "--history-len", "4"]),
    ("mtp-fixed", ["--rounds", "2", "--batch", "2", "--drafts", "1", "--accept", "all", "--state-dtype", "bf16",
                   "--history-len", "4"]),
    ("mtp-dynamic", ["--rounds", "2", "--batch", "3", "--history-len", "4", "--modes", "native,replay"]),
    ("checkpoint-restore", ["--rounds", "3", "--batch", "2", "--drafts", "1", "--history-len", "4"]),
    ("cpu-page-restore", ["--page-size", "16", "--pages", "1", "--tp", "1,2", "--variant", "direct"]),
    ("pd-roundtrip", ["--page-tokens", "16", "--pages", "1", "--tp-pairs", "1:2,2:1"]),
]
# These rerun under `-m slow`: their lines are built by the same code as the others', and
# test_every_option_of_the_cli_is_reproduced holds every scenario's options in the fast suite.
SLOW_RUNS = {"mtp-fixed", "checkpoint-restore"}


pytestmark = pytest.mark.usefixtures("light_runs")  # rows are what this file checks (tests/conftest.py)


def _run(argv: list[str], out: Path) -> pd.DataFrame:
    result = runner.invoke(app, [*argv, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, f"{argv}: {result.output}"
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return load_run(path).throughput


def _keys(df: pd.DataFrame) -> set[tuple[str, ...]]:
    return {tuple(r) for r in df[KEY].astype("string").fillna("").itertuples(index=False)}


@pytest.mark.parametrize(("scenario", "args"), [
    pytest.param(name, args, id=name, marks=[pytest.mark.slow] if name in SLOW_RUNS else []) for name, args in RUNS])
def test_every_repro_line_reruns_the_same_case(scenario: str, args: list[str], tmp_path: Path) -> None:
    rows = _run(["run", scenario, *args, *FAST], tmp_path / "first")
    assert not rows.empty
    for i, (line, produced) in enumerate(rows.groupby("repro", sort=True)):
        assert line.startswith(f"harness run {scenario}"), line
        if set(produced["status"]) == {"unsupported"}:
            # the row's mode alone: refused before any work with the row's reason, in one line naming --modes
            refused = runner.invoke(app, [*repro_argv(line), *FAST, "--out", str(tmp_path / f"again-{i}")])
            assert refused.exit_code == 2 and refused.output.startswith("error: --modes"), refused.output
            assert "--modes " in line and "needs drafts" in produced["reason"].iloc[0]
            continue
        again = _run([*repro_argv(line), *FAST], tmp_path / f"again-{i}")
        missing = _keys(produced) - _keys(again)
        assert not missing, f"`{line}` did not rerun {missing}"


def test_a_trace_run_reproduces_from_any_directory(tmp_path: Path, make_trace, monkeypatch) -> None:
    trace = make_trace(tmp_path / "in.trace")
    monkeypatch.chdir(tmp_path)
    rows = _run(["run", "mtp-dynamic", "--trace", "in.trace", "--modes", "native", *FAST], tmp_path / "first")
    (line,) = set(rows["repro"])
    assert f"--trace {trace}" in line  # absolute: the line works from anywhere
    monkeypatch.chdir(tmp_path / "first")
    assert _keys(_run([*repro_argv(line), *FAST], tmp_path / "again")) == _keys(rows)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_option_of_the_cli_is_reproduced(scenario: str) -> None:
    """Generic over the CLI: an option set to anything but its default appears in the line (an option added
    to `harness run` later is covered without a change here); output places and internal keys do not."""
    options = cli_options(scenario)
    assert options, scenario
    values = {name: (not default) if is_flag else f"v-{name}" for name, _, default, is_flag, _ in options}
    line = repro()(scenario, {**values, "scenario": scenario, "family": "gdn", "dynamic": True,
                                    "has_drafts": True})
    for name, flag, _, _, is_path in options:
        shown = flag in line.split()
        assert shown == (name not in NOT_REPRODUCED), (flag, line)
        if shown and is_path:
            assert os.path.abspath(f"v-{name}") in line
    for internal in ("--scenario", "--family", "--dynamic", "--has-drafts"):
        assert internal not in line


def test_defaults_are_left_out_and_the_interpreter_is_named(monkeypatch) -> None:
    repro_command = repro()
    assert repro_command("decode", {"preset": "tiny-gdn", "rounds": None, "seed": 0, "batch": "4"}) == \
        "harness run decode --batch 4"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    line = repro_command("mtp-fixed", {"backend": "triton", "device": "cpu"})
    assert line == "TRITON_INTERPRET=1 harness run mtp-fixed --backend triton"
    assert repro_argv(line) == ["run", "mtp-fixed", "--backend", "triton"]
    assert not repro_command("mtp-fixed", {"backend": "torch"}).startswith("TRITON")


def test_the_harness_imports_form_no_circle() -> None:
    """The CLI hands the runner its options (issue 14): no module of harness/ imports another that imports
    it back, counting imports inside functions (a repro line built by importing harness/cli.py closed a
    circle through cli, dist, gate, runner, tune)."""
    import ast

    folder = Path(__file__).resolve().parents[1] / "harness"
    deps: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "harness":
                found |= {f"harness.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness."):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("harness.")}
        deps[f"harness.{path.stem}"] = found

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for d in deps.get(start, ()):
            if d == goal or (d not in seen and reaches(d, goal, seen | {d})):
                return True
        return False

    circles = sorted(m for m in deps if reaches(m, m, set()))
    assert not circles, f"import circle through {circles}"
