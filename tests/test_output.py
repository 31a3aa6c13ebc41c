"""Output for people: progress in logs, one noise line per CPU run, speedups that say which way, figure
titles that say what and where, and `harness compare` on runs that share nothing."""

from __future__ import annotations

import io
import time

import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.progress import progress_reporter
from results.plots import make_figure
from results.schema import validate_rows
from results.store import RunWriter
from results.tables import SPEEDUP, log_lines, print_table, throughput_tables

runner = CliRunner()


def _row(mode: str, batch: int = 4, *, timer: str = "cpu-wall", noise: float = 30.0, median: float = 100.0,
         **extra) -> dict:
    row = {
        "run_id": "r", "scenario": "mtp-fixed", "family": "gdn", "mode": mode, "backend": "torch", "preset": "tiny-gdn",
        "device": "cpu" if timer == "cpu-wall" else "cuda:0", "batch": batch, "drafts": 3, "state_dtype": "fp32",
        "act_dtype": "bf16", "status": "passed", "timer": timer, "samples": 30, "median_us": median,
        "p20_us": median * 0.9, "p80_us": median * 1.1, "noise_pct": noise, "tokens_per_s": 1e5, "achieved_gbps": 1.0,
        "ceiling_name": "cpu-memcpy", "ceiling_gbps": 10.0, "ceiling_pct": 10.0,
    }  # fmt: skip
    return {**row, **extra}


def test_plain_progress_lines_off_a_terminal():
    stream = io.StringIO()
    with progress_reporter(tty=False, stream=stream, every_s=0.0) as progress:
        advance = progress("decode tiny-gdn batch 4: native/torch", 3)
        for _ in range(3):
            advance()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "decode tiny-gdn batch 4: native/torch: started, 3 steps"
    assert lines[1].startswith("decode tiny-gdn batch 4: native/torch: 1/3 after ")
    assert lines[-1].startswith("decode tiny-gdn batch 4: native/torch: done, 3/3 in ") and len(lines) == 4


def test_plain_progress_is_a_heartbeat_not_a_line_per_task():
    stream = io.StringIO()
    with progress_reporter(tty=False, stream=stream, every_s=3600.0) as progress:
        for case in range(50):  # many short tasks, as the gate runs them
            advance = progress(f"case {case}", 2)
            advance(), advance()
    assert stream.getvalue().splitlines() == ["case 0: started, 2 steps"]


def test_plain_progress_shows_the_overall_count_while_inner_tasks_advance():
    """The gate's cases are the outer task; the scenario's own tasks advance far more often, and every line
    still says how far the gate is (issue 17: no overall progress for 10 minutes)."""
    stream = io.StringIO()
    with progress_reporter(tty=False, stream=stream, every_s=0.0) as progress:
        cases = progress("gate cases", 2)
        for case in range(2):
            step = progress(f"case {case}", 2)
            step(), step()
            cases()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "gate cases: started, 2 steps"
    assert lines[1].startswith("gate cases: 0/2 after ") and lines[1].endswith(" | case 0: started, 2 steps")
    assert lines[4].startswith("gate cases: 1/2 after ")
    assert [line for line in lines if " | case 1: 1/2 after " in line and line.startswith("gate cases: 1/2")]
    assert lines[-1].startswith("gate cases: done, 2/2 in ")


def test_plain_progress_beats_while_one_step_runs_long():
    """A single step longer than the heartbeat (an interpreted kernel config) still gets lines."""
    stream = io.StringIO()
    with progress_reporter(tty=False, stream=stream, every_s=0.2) as progress:
        advance = progress("autotune ssm", 1)
        time.sleep(0.9)
        advance()
    lines = stream.getvalue().splitlines()
    running = [line for line in lines if line.startswith("autotune ssm: 0/1 after ") and line.endswith("(running)")]
    assert len(running) >= 2, lines
    assert lines[-1].startswith("autotune ssm: done, 1/1 in ")


def test_the_heartbeat_names_the_phase_and_case_while_no_task_counts():
    """Issue 24: a timing phase of minutes (no task counts it) printed nothing; now every phase beats."""
    def run(clock):
        with clock.case("decode qwen3-next batch 1"), clock.phase("timing"):
            time.sleep(0.9)
        with clock.phase("figures"):
            time.sleep(0.5)

    lines = _beats(0.2, run).splitlines()
    timing = [line for line in lines if line.startswith("decode qwen3-next batch 1: timing for ")]
    assert len(timing) >= 2 and all(line.endswith(" s (running)") for line in timing), lines
    assert [line for line in lines if line.startswith("figures for ")], lines
    assert not [line for line in lines if line.startswith("setup")], lines  # the clock listened after it began


def test_the_first_beat_waits_a_whole_period():
    """Planning (and a run refused there) stays silent: the clock's first line comes after `every_s`."""
    assert _beats(0.6, lambda clock: time.sleep(0.4)) == ""


def _beats(every_s: float, body) -> str:
    """What plain progress prints while `body(clock)` runs inside a run's setup phase, the clock listening
    from then on (as make_context does once planning passed)."""
    from harness.phases import PhaseClock

    stream = io.StringIO()
    with progress_reporter(tty=False, stream=stream, every_s=every_s) as progress:
        clock = PhaseClock("cpu")
        with clock.phase("setup"):
            clock.listen(progress)
            body(clock)
    return stream.getvalue()


@pytest.mark.usefixtures("light_runs")
def test_every_pd_pair_ticks_and_the_pairs_left_out_are_named(tmp_path, monkeypatch):
    """Each TP pair is a case: the cases are the outer count, so a pd-roundtrip is never silent; the
    default sweep on tiny-gdn has no TP 4 or 8 pair, and one line says why."""
    monkeypatch.setenv("HARNESS_PROGRESS_EVERY_S", "0")
    result = runner.invoke(app, ["run", "pd-roundtrip", "--page-tokens", "16", "--pages", "1", "--warmup", "0",
                                 "--rep", "2", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == ("pd-roundtrip: tiny-gdn: pairs with TP 4, 8 left out: TP 4 does not divide its 2 SSM key / "
                        "4 value heads (the linear-attention layers split heads over the ranks)")
    assert lines[1] == "pd-roundtrip cases: started, 4 steps"
    for k in (1, 2, 3):
        assert [line for line in lines if line.startswith(f"pd-roundtrip cases: {k}/4 after ")], lines
    assert [line for line in lines if line.startswith("pd-roundtrip cases: done, 4/4 in ")], lines


def test_dist_pairs_that_need_more_processes_are_named():
    from scenarios import get_scenario

    scenario = get_scenario("pd-roundtrip")
    options = {"preset": "llama-3-8b", "transport": "dist", "nproc": 2, "tp_pairs": None}
    notes = scenario.notes(options, scenario.plan(options))
    assert notes == ["pairs 1:4, 1:8, 2:4, 2:8, 4:1, 4:2, 4:4, 4:8, 8:1, 8:2, 8:4, 8:8 need more than --nproc 2 "
                     "processes: their rows are unsupported"]
    assert scenario.notes({**options, "nproc": 8}, scenario.plan({**options, "nproc": 8})) == []


def test_progress_bars_on_a_terminal_draw_nothing_until_work_starts():
    stream = io.StringIO()
    with progress_reporter(tty=True, stream=stream):
        pass  # a run refused while planning: its error line must stand alone
    assert stream.getvalue() == ""


@pytest.mark.usefixtures("light_runs")
def test_a_run_in_a_log_says_what_it_is_doing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "decode", "--rounds", "2", "--warmup", "0", "--rep", "2", "--history-len", "4",
                                 "--out", "runs"], catch_exceptions=False)  # CliRunner's stdout is no TTY
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("decode tiny-gdn batch 4: native/torch: started, 2 steps\n")
    assert "started" not in result.stdout  # stdout keeps the tables (and --json) clean
    # the last line names the run absolutely, a relative --out too (notebooks/README.md quotes it)
    line = result.stdout.splitlines()[-1]
    assert line == f"run directory: {next((tmp_path / 'runs').iterdir())}"


def test_cpu_noise_is_one_line_per_run_and_gpu_noise_one_per_row():
    df = validate_rows(pd.DataFrame([_row(m, b) for m in ("native", "compact") for b in (2, 4, 8)]
                                    + [_row("native", 16, noise=1.0)]))
    (line,) = log_lines(df)
    assert line.startswith("Warn: 6 of 7 CPU-timed rows have noise above 2% (worst 30.0%")
    gpu = validate_rows(pd.DataFrame([_row("native", b, timer="cuda-graph", noise=5.0) for b in (2, 4)]))
    assert [x.split(":")[0] for x in log_lines(gpu)] == ["Warn", "Warn"] and len(log_lines(gpu)) == 2


def test_speedup_columns_say_which_way():
    df = validate_rows(pd.DataFrame([_row("native", median=100.0), _row("compact", median=50.0)]))
    summary = throughput_tables(df)[0]
    column = f"compact: {SPEEDUP}"
    assert SPEEDUP == "x faster than native" and column in summary.columns
    assert summary.rows[0][summary.columns.index(column)] == "2.00x"


@pytest.mark.parametrize("metric", ["throughput", "memory", "speedup", "bandwidth"])
def test_figure_titles_name_preset_device_and_dtypes(metric):
    rows = [_row(m, b, median=100.0 * b, bytes_per_request_predicted=1000, bytes_per_request_measured=1000)
            for m in ("native", "compact") for b in (2, 4)]
    fig = make_figure(validate_rows(pd.DataFrame(rows)), "mtp-fixed", "gdn", metric)
    assert fig.axes[0].get_title() == "mtp-fixed · gdn · tiny-gdn · cpu · fp32 state, bf16 act"


def test_page_figure_titles_name_the_kv_dtype():
    rows = [_row("", None, scenario="pd-roundtrip", family="gqa", drafts=None, state_dtype=None,
                 act_dtype=None, direction=d, tp_prefill=1, tp_decode=2, page_size=16,
                 config='{"chunk_bytes": 1024, "dtype": "bf16", "pages": 1, "variant": "direct"}')
            for d in ("export", "import")]
    fig = make_figure(validate_rows(pd.DataFrame(rows)), "pd-roundtrip", "gqa", "page-bandwidth")
    assert fig._suptitle.get_text().startswith("pd-roundtrip · gqa · tiny-gdn · cpu · bf16 KV")


def test_compare_of_runs_with_nothing_in_common_says_so(tmp_path):
    paths = []
    for name, preset in (("a", "tiny-gdn"), ("b", "tiny-kda"), ("c", "tiny-gdn")):
        with RunWriter(tmp_path, run_id=name, manifest={}) as w:
            w.add_rows([{k: v for k, v in _row("native", preset=preset).items() if k != "run_id"}])
        paths.append(str(w.path))
    result = runner.invoke(app, ["compare", paths[0], paths[1]])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: a and b share no case, so there is nothing to compare: A has ")
    assert "preset tiny-gdn" in lines[0] and "preset tiny-kda" in lines[0]
    same = runner.invoke(app, ["compare", paths[0], paths[2]])
    assert same.exit_code == 0 and "same" in same.output


@pytest.mark.usefixtures("light_runs")  # equivalence.md is the subject here, not figures or ceilings
def test_what_users_read_cites_docs_in_the_repository_not_the_spec(tmp_path):
    """Issue 17: help and gate.md cited "SPEC §3/§5", a file that is not in the repository. They cite
    docs/CONTRACTS.md and docs/REPORTS.md, which exist and name every contract; equivalence.md explains
    its NaN counts and its ULPs near zero, and untouched slots compare bytes (no NaN of random bits)."""
    from pathlib import Path

    from harness.equivalence import CONTRACT_NAMES, EquivalenceReport
    from harness.gate import GateVerdict

    repo = Path(__file__).resolve().parents[1]
    contracts = (repo / "docs" / "CONTRACTS.md").read_text()
    assert all(f"`{name}`" in contracts for name in CONTRACT_NAMES.values())
    assert (repo / "docs" / "REPORTS.md").exists()
    for args in (["--help"], ["gate", "--help"], ["run", "decode", "--help"], ["autotune", "--help"]):
        shown = runner.invoke(app, args, terminal_width=200).output
        assert "SPEC" not in shown and "§" not in shown, (args, shown)
    assert "docs/CONTRACTS.md" in runner.invoke(app, ["gate", "--help"], terminal_width=200).output
    gate_md = GateVerdict(EquivalenceReport(), [], backends="torch").markdown()
    assert "SPEC" not in gate_md and "docs/CONTRACTS.md" in gate_md

    result = runner.invoke(app, ["run", "decode", "--rounds", "2", "--warmup", "0", "--rep", "2", "--out",
                                 str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    md = (run / "equivalence.md").read_text()
    assert "SPEC" not in md and "docs/REPORTS.md" in md and "1.7e9 ULP" in md
    untouched = [line for line in md.splitlines() if "| untouched " in line]
    assert untouched and not any("NaN" in line for line in untouched)


def test_tables_written_to_a_file_keep_every_header_whole():
    """Into a file (no terminal) the console is 160 wide; a table that needed more had its headers cut with
    "…" mid-word. Every word of every header and cell must come out whole."""
    from rich.console import Console

    modes = ["native", "compact", "compact", "replay", "replay", "replay"]
    variants = [None, "accept", "deferred", "inline", "precompute", "precompute-tf32"]
    rows = [_row(m, b, variant=v, **({"history_len": 16, "history_dtype": "fp32"} if m == "replay" else {}))
            for m, v in zip(modes, variants) for b in (2, 4)]
    df = validate_rows(pd.DataFrame(rows))
    stream = io.StringIO()
    console = Console(width=160, file=stream)  # what harness.cli makes when stdout is not a terminal
    assert not console.is_terminal
    tables = throughput_tables(df)
    for table in tables:
        print_table(console, table.to_rich())
    text = stream.getvalue()
    assert "\u2026" not in text
    words = set(text.replace("\u2503", " ").replace("\u2502", " ").split())
    for table in tables:
        for header in table.columns:
            assert set(header.split()) <= words, header


def test_progress_bars_show_the_phase_on_one_line():
    stream = io.StringIO()
    with progress_reporter(tty=True, stream=stream) as progress:
        progress.phase("decode tiny-gdn batch 4: rollout")
        advance = progress("decode tiny-gdn batch 4: native/torch", 2)
        advance()
        progress.phase("decode tiny-gdn batch 4: timing")
        advance()
        descriptions = [task.description for task in progress.bar.tasks]
    assert descriptions == ["decode tiny-gdn batch 4: timing", "decode tiny-gdn batch 4: native/torch"]
