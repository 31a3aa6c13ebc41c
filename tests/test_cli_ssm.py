"""The CLI as a new user meets it: the SSM scenarios end to end, the run directory, traces and dumps
(bad input: tests/test_cli_bad_input.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from results.store import load_run

runner = CliRunner()
RUN_FILES = ["manifest.json", "throughput.csv", "equivalence.json", "equivalence.md", "autotune.jsonl", "oom.jsonl"]
# What these tests check are rows, files and comparisons, not timings: few samples, and a replay history of
# 4 so that replay's timed fold cycle (Lh / W rounds a sample) stays short. `--history-len` is a run option
# like any other; the default Lh 16 runs in the slow test of the README command and in tests/test_notebook.py.
LIGHT = ["--warmup", "0", "--rep", "2", "--history-len", "4"]


def _invoke(args: list[str]):
    return runner.invoke(app, args, catch_exceptions=False)


def _single_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.parametrize("options", [
    pytest.param([], marks=pytest.mark.slow, id="the-readme-command"),  # `harness run decode`, every default
    pytest.param(["--rounds", "4", *LIGHT], id="light"),
])
def test_decode_default_run(tmp_path, options, request):
    if options:  # the README's command draws its figures and measures its ceiling as it would for a user
        request.getfixturevalue("light_runs")
    result = _invoke(["run", "decode", "--out", str(tmp_path), *options])
    assert result.exit_code == 0, result.output
    run_dir = _single_run(tmp_path)
    for name in RUN_FILES:
        assert (run_dir / name).exists(), name
    df = pd.read_csv(run_dir / "throughput.csv")
    assert list(df["mode"]) == ["native", "compact", "replay", "replay", "replay"]
    assert list(df["variant"].fillna("")) == ["", "accept", "inline", "matrix-bf16x3", "inline-matrix-bf16x3"]
    compact = df[df["mode"] == "compact"].iloc[0]
    assert compact["status"] == "unsupported" and "needs drafts" in compact["reason"]
    assert set(df[df["mode"] != "compact"]["status"]) == {"passed"}
    assert (df["bytes_per_request_predicted"].dropna() > 0).all()
    assert "run directory:" in result.output


@pytest.mark.parametrize("preset", ["tiny-kda", "tiny-gdn"])
@pytest.mark.usefixtures("light_runs")
def test_mtp_fixed_writes_every_file_and_contracts_hold(tmp_path, preset):
    result = _invoke(["run", "mtp-fixed", "--preset", preset, "--drafts", "3", "--accept", "geometric:0.7",
                      "--rounds", "8", *LIGHT, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = load_run(_single_run(tmp_path))
    assert set(run.throughput["status"]) == {"passed"}
    passed = run.throughput.set_index("mode")
    assert (passed["bytes_per_request_predicted"] == passed["bytes_per_request_measured"]).all()
    md = (run.path / "equivalence.md").read_text()
    assert "compact/torch" in md and "replay/torch" in md
    eq = run.equivalence_report()
    compact_state = [c for c in eq.comparisons if c.lhs == "compact/torch" and c.rhs == "native/torch" and c.name == "ssm"]
    replay_state = [c for c in eq.comparisons if c.lhs == "replay/torch" and c.rhs == "native/torch" and c.name == "ssm"]
    replay_out = [c for c in eq.comparisons if c.lhs == "replay/torch" and c.rhs == "native/torch" and c.name == "o"]
    assert compact_state[0].bitwise_equal and replay_state[0].bitwise_equal
    assert replay_out[0].policy == "rms" and replay_out[0].rms_ratio < 2e-3 and replay_out[0].max_ulp > 0


@pytest.mark.usefixtures("light_runs")
def test_mtp_dynamic_and_json_output(tmp_path):
    result = _invoke(["run", "mtp-dynamic", "--rounds", "6", "--batch", "2,3", *LIGHT, "--out", str(tmp_path),
                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # progress lines go to stderr: stdout stays machine-readable
    assert len(data["rows"]) == 14 and {r["batch"] for r in data["rows"]} == {2, 3}  # 7 variants x 2 batches


@pytest.mark.usefixtures("light_runs")
def test_trace_in_and_dump_out(tmp_path, make_trace):
    trace = make_trace(tmp_path / "in.trace")
    out, dump = tmp_path / "runs", tmp_path / "dump"
    result = _invoke(["run", "mtp-dynamic", "--drafts", "2", "--trace", str(trace), "--dump", str(dump), "--out", str(out),
                      "--snapshot-every", "3", *LIGHT])
    assert result.exit_code == 0, result.output
    run = load_run(_single_run(out))
    assert set(run.throughput["accept"]) == {"trace"} and set(run.throughput["batch"]) == {2}
    files = sorted(dump.rglob("round-*.pt"))
    assert len(files) == 7 * 4  # native, compact (accept, deferred, accept-precompute-bf16x3,
    # deferred-precompute-bf16x3), replay (inline, matrix-bf16x3); four rounds
    # docs/TRACE_FORMAT.md: states in rounds r with (r + 1) % N == 0, and in the last round
    for path in files:
        item = torch.load(path, weights_only=True)
        assert {"outputs", "widths", "accepted"} <= set(item)
        assert ({"ssm", "conv"} <= set(item)) == (item["round"] in (2, 3)), (path, item["round"])


def test_trace_with_a_wrong_shape_is_rejected(tmp_path, make_trace):
    trace = make_trace(tmp_path / "in.trace")
    data = torch.load(trace, weights_only=True)
    data["rounds"][1]["mixed_qkv"] = data["rounds"][1]["mixed_qkv"][:, :-1]
    torch.save(data, trace)
    out = tmp_path / "runs"
    out.mkdir()
    result = runner.invoke(app, ["run", "mtp-dynamic", "--drafts", "2", "--trace", str(trace), "--out", str(out)])
    assert result.exit_code == 2
    assert "rounds[1].mixed_qkv has shape" in result.output
    assert not any(out.iterdir())


@pytest.mark.usefixtures("light_runs")
def test_list_and_report(tmp_path):
    result = _invoke(["list", "--json"])
    data = json.loads(result.output)
    assert {s["name"] for s in data["scenarios"]} >= {"decode", "mtp-fixed", "mtp-dynamic"}
    assert "qwen3-next" in {p["name"] for p in data["presets"]}
    _invoke(["run", "decode", "--rounds", "4", *LIGHT, "--out", str(tmp_path)])
    report = _invoke(["report", str(_single_run(tmp_path)), "--markdown"])
    assert report.exit_code == 0 and "| batch |" in report.output


@pytest.mark.parametrize("state_dtype", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
@pytest.mark.usefixtures("light_runs")
def test_checkpoint_restore_within_and_across_modes(tmp_path, state_dtype):
    result = _invoke(["run", "checkpoint-restore", "--preset", "tiny-kda", "--state-dtype", state_dtype,
                      "--rounds", "7", "--history-len", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = load_run(_single_run(tmp_path))
    assert set(run.throughput["direction"]) == {"export", "import"}
    assert set(run.throughput["status"]) == {"passed"}
    # one batch everywhere: the rows say the case's batch (4, as the repro line does); the timed transfer's
    # requests (half of them) are in the config
    assert set(run.throughput["batch"]) == {4} and all("--batch 4" in r for r in run.throughput["repro"])
    assert {json.loads(c)["restored_requests"] for c in run.throughput["config"]} == {2}
    eq = run.equivalence_report().comparisons
    restored = {(c.lhs, c.name): c for c in eq if "restored from" in c.lhs}
    assert len(restored) == 49 * 3  # every ordered pair of the seven variants x (o, ssm, conv)
    assert restored[("native/torch restored from compact", "o")].bitwise_equal
    assert restored[("compact/torch restored from native", "ssm")].bitwise_equal
    # a deferred snapshot carries its pending records into the committed state it hands out
    assert restored[("native/torch restored from compact-deferred", "o")].bitwise_equal
    assert restored[("compact-deferred/torch restored from compact", "ssm")].bitwise_equal
    if state_dtype == "fp32":
        assert restored[("native/torch restored from replay", "o")].bitwise_equal
        assert restored[("replay/torch restored from native", "ssm")].bitwise_equal
    assert all(c.bitwise_equal for c in eq if c.name.startswith("checkpoint"))


def _nan_padded(make_trace, path: Path) -> tuple[Path, dict]:
    """A trace whose padding rows (past sum(widths): never read) hold NaN, and its loaded contents."""
    trace = make_trace(path)
    data = torch.load(trace, weights_only=True)
    padded = 0
    for rd in data["rounds"]:
        used = int(rd["widths"].long().sum())
        padded += rd["mixed_qkv"].shape[1] - used
        for name in ("mixed_qkv", "a", "b"):
            rd[name][:, used:] = float("nan")
    assert padded > 0  # the trace has padding rows, or this test tests nothing
    torch.save(data, trace)
    return trace, data


@pytest.mark.usefixtures("light_runs")
def test_a_trace_with_nan_padding_runs_and_nan_in_a_read_row_is_refused(tmp_path, make_trace):
    """Rows past sum(widths) are never read (docs/TRACE_FORMAT.md), and captured buffers are often left
    uninitialized there: NaN padding runs, every mode's outputs stay finite and equal the fp64
    reference; NaN in a row that is read is refused, naming the field."""
    trace, data = _nan_padded(make_trace, tmp_path / "in.trace")
    out = tmp_path / "runs"
    result = _invoke(["run", "mtp-dynamic", "--drafts", "2", "--trace", str(trace), "--out", str(out), *LIGHT])
    assert result.exit_code == 0, result.output
    run = load_run(_single_run(out))
    assert set(run.throughput["status"]) == {"passed"} and run.equivalence_report().passed

    data["rounds"][0]["a"][:, 0] = float("nan")  # the first request's first token: read
    torch.save(data, trace)
    bad = runner.invoke(app, ["run", "mtp-dynamic", "--drafts", "2", "--trace", str(trace), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "rounds[0].a holds NaN or Inf in its first" in bad.output, bad.output


@pytest.mark.slow
def test_the_triton_kernels_never_read_nan_padding_of_a_trace(tmp_path, make_trace):
    """The same NaN-padded trace through every Triton variant (the interpreter), compared as the gate does,
    untimed (timing interpreted kernels took 88 of the CLI run's 120 s and tells nothing here): every
    variant passes against its torch twin and the fp64 reference, with nothing NaN in what it wrote."""
    from harness.gate import run_gate
    from scenarios.ssm_options import RUN_VARIANTS

    trace, _ = _nan_padded(make_trace, tmp_path / "in.trace")
    outcome = run_gate(device="cpu", backends="torch,triton", out_root=tmp_path,
                       cases=[("mtp-dynamic", {"drafts": 2, "trace": str(trace), "history_len": 4})])
    assert outcome.passed, outcome.lines
    # a case given without variant options runs a run's defaults: native and RUN_VARIANTS, on both backends
    n = 2 * (1 + len(RUN_VARIANTS["compact"]) + len(RUN_VARIANTS["replay"]))
    assert f"{n} of {n} expected variants passed" in outcome.lines[0], outcome.lines[0]
