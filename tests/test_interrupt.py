"""Ctrl-C and killed runs (issue 24 item 2): one line saying where the run was and where its partial run is,
exit code 130, FAILED.txt in words; the workers of a `--transport dist` run ended; `harness report` on a
`.partial` saying what is known of it, FAILED.txt or not."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from harness.cli import app
from results.store import RunWriter

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^interrupted at (?P<where>.+); partial run kept at (?P<path>\S+\.partial)$")


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    """`harness ARGS --out tmp_path` in its own process, SIGINT at its default (a parent that ignores SIGINT
    would pass that on, and Python then never raises KeyboardInterrupt), every progress event a line."""
    env = {**os.environ, "HARNESS_PROGRESS_EVERY_S": "0"}
    return subprocess.Popen([sys.executable, "-m", "harness", *args, "--out", str(tmp_path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(proc: subprocess.Popen, text: str, timeout_s: float = 120.0) -> list[str]:
    """stderr lines up to the first holding `text` (the run is past planning and its directory exists)."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if text in line:
            return seen
    proc.kill()
    raise AssertionError(f"no {text!r} on stderr: {seen}")


def _interrupt(proc: subprocess.Popen) -> tuple[int, list[str]]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err.splitlines()


def test_ctrl_c_is_one_line_exit_130_and_failed_txt_in_words(tmp_path):
    proc = _start(["run", "decode", "--rounds", "2000"], tmp_path)
    _wait_for(proc, "native/torch: 1/2000")  # in the rollout, the run directory being written
    code, err = _interrupt(proc)
    assert code == 130, err
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in err), err
    m = LINE.match(err[-1])
    assert m, err
    assert m["where"].startswith(("rollout of decode tiny-gdn", "compare of decode tiny-gdn")), m["where"]
    (partial,) = tmp_path.iterdir()
    assert Path(m["path"]) == partial and partial.name.endswith(".partial")
    failed = (partial / "FAILED.txt").read_text()
    assert failed.startswith(f"interrupted at {m['where']}\n") and "Traceback" not in failed
    assert "interrupted (Ctrl-C, SIGINT)" in failed and "rows.jsonl" in failed and "did not finish" in failed
    report = runner.invoke(app, ["report", str(partial)])
    assert report.exit_code == 2 and len(report.stderr.splitlines()) == 1
    assert f"is a failed run (FAILED.txt: interrupted at {m['where']})" in report.stderr


@pytest.mark.slow  # two worker processes on a 2-core box (9 s); the plain run's Ctrl-C stays in the fast suite
def test_ctrl_c_in_a_dist_run_ends_the_workers_and_keeps_rank_0s_partial_run(tmp_path):
    """Rank 0 prints the progress lines (it is a worker process: this test reads them from the parent's
    stderr); the parent alone gets the SIGINT here, forwards it, and every worker ends."""
    proc = _start(["run", "pd-roundtrip", "--transport", "dist", "--nproc", "2", "--page-tokens", "16",
                   "--pages", "1", "--rep", "200000"], tmp_path)
    seen = _wait_for(proc, "pd-roundtrip cases: started, 4 steps")
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert len(workers) >= 2, seen
    code, err = _interrupt(proc)
    assert code == 130, err
    m = LINE.match(err[-1])
    assert m and m["where"].endswith(", on rank 0") and " of pd-roundtrip tiny-gdn" in m["where"], err
    assert (Path(m["path"]) / "FAILED.txt").read_text().startswith("interrupted at ")
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive


@pytest.mark.usefixtures("light_runs")
def test_ctrl_c_while_timing_names_the_phase_and_case(tmp_path, monkeypatch):
    from harness import timing

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(timing, "bench", interrupted)
    result = runner.invoke(app, ["run", "mtp-fixed", "--rounds", "2", "--out", str(tmp_path)])
    assert result.exit_code == 130, result.output
    line = result.stderr.splitlines()[-1]
    m = LINE.match(line)
    assert m and m["where"] == "timing of mtp-fixed tiny-gdn, fp32 state, batch 4, drafts 3, accept geometric:0.7, " \
                               "2 rounds, Lh 16", line
    text = (Path(m["path"]) / "FAILED.txt").read_text()
    assert "0 rows in rows.jsonl" in text and "0 failed, the last of case mtp-fixed tiny-gdn" in text, text


def test_ctrl_c_before_the_run_directory_exists_says_nothing_was_written(tmp_path, monkeypatch):
    from harness import env

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(env, "measure_ceilings", interrupted)
    result = runner.invoke(app, ["run", "decode", "--rounds", "2", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 130
    assert result.stderr.splitlines() == ["interrupted at setup; nothing written"]
    assert not (tmp_path / "runs").exists()


def test_report_on_a_killed_run_says_what_is_known(tmp_path):
    """A run killed with kill -9 leaves a .partial without FAILED.txt: the report says so and what it holds."""
    writer = RunWriter(tmp_path, manifest={"command": "harness run decode"}, tag="decode")
    writer.add_row({"scenario": "decode", "mode": "native", "status": "passed"})
    partial = writer.path  # never finished nor aborted, as after SIGKILL
    result = runner.invoke(app, ["report", str(partial)])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "FAILED.txt there" not in line
    assert f"{partial} is an unfinished run without FAILED.txt (killed" in line
    assert "it holds 1 rows in rows.jsonl and 0 comparisons in equivalence.jsonl (0 failed)" in line
