"""`harness advise` from the command line: bad input is one line, exit 2, nothing written; good input prints the
verdict, its JSON and its figures; and a real small CPU run (`harness run`) is judged consistently with its rows."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from advise_runs import make_run, row
from typer.testing import CliRunner

from harness.cli import app
from harness.runner import run_scenario
from results.acceptance import geometric
from results.advise import advise, load_sweep
from results.store import load_run

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("advise-runs")
    good = make_run(root, [row("native", 0, 8, 100.0), row("native", 3, 8, 400.0), row("compact", 3, 8, 300.0),
                           row("native", 0, 32, 300.0), row("compact", 3, 32, 800.0)], tag="good")
    kda = make_run(root, [row("native", 0, 8, 90.0, preset="tiny-kda")], tag="kda")
    other_gpu = make_run(root, [row("native", 3, 8, 50.0)], gpu="NVIDIA B300", tag="b300")
    both = make_run(root, [row("native", 0, 8, 100.0), row("native", 0, 8, 90.0, preset="tiny-kda")], tag="both")
    partial = root / "20261201T000000Z-x-000000.partial"
    partial.mkdir()
    (root / "profile-bad.txt").write_text("0.8 nope\n")
    (root / "notarun").mkdir()
    return {"good": good, "kda": kda, "b300": other_gpu, "both": both, "partial": partial, "root": root,
            "missing": root / "missing", "bad_profile": root / "profile-bad.txt", "notarun": root / "notarun"}


BAD = [
    ("{missing} --preset tiny-gdn", "no such run directory"),
    ("{partial} --preset tiny-gdn", "is an unfinished run without FAILED.txt"),
    ("{notarun} --preset tiny-gdn", "manifest.json is missing"),
    ("{good} {good} --preset tiny-gdn", "given twice"),
    ("{good} {kda} --preset tiny-gdn", "--allow-mixed"),
    ("{both} --preset tiny-gdn", "--allow-mixed"),
    ("{good} {b300} --preset tiny-gdn", "different devices"),
    ("{good} --preset tiny-kda", "--allow-mixed"),
    ("{kda} --preset tiny-gdn --allow-mixed", "no decode or mtp-fixed row of preset tiny-gdn"),
    ("{good} --preset tiny-gdn --budget-gib 0.001", "--budget-gib 0.001 holds no request"),
    ("{good} --preset tiny-gdn --budget-gib 0", "--budget-gib must be"),
    ("{good} --preset tiny-gdn --budget-gib -2", "--budget-gib must be"),
    ("{good} --preset tiny-gdn --budget-gib nan", "--budget-gib must be"),
    ("{good} --preset tiny-gdn --budget-gib lots", "--budget-gib"),
    ("{good} --preset tiny-gdn --accept geometric:1.5", "--accept"),
    ("{good} --preset tiny-gdn --accept geometric:x", "--accept"),
    ("{good} --preset tiny-gdn --accept geometric:", "--accept"),
    ("{good} --preset tiny-gdn --accept fixed:2", "--accept"),
    ("{good} --preset tiny-gdn --accept 0.7", "--accept"),
    ("{good} --preset tiny-gdn --accept geometric:0.7 --accept-profile 0.8", "--accept"),
    ("{good} --preset tiny-gdn --accept-profile 0.3,0.6", "--accept-profile"),
    ("{good} --preset tiny-gdn --accept-profile 0.8,,0.5", "--accept-profile"),
    ("{good} --preset tiny-gdn --accept-profile 1.2", "--accept-profile"),
    ("{good} --preset tiny-gdn --accept-profile ''", "--accept-profile"),
    ("{good} --preset tiny-gdn --accept-profile {missing}", "--accept-profile"),
    ("{good} --preset tiny-gdn --accept-profile {bad_profile}", "--accept-profile"),
    ("{good} --preset tiny-gdn --rest-us 5", "--rest-us"),
    ("{good} --preset tiny-gdn --rest-us a,b", "--rest-us"),
    ("{good} --preset tiny-gdn --rest-us -1,0", "--rest-us"),
    ("{good} --preset tiny-gdn --rest-us inf,0", "--rest-us"),
    ("{good} --preset tiny-gdn --batch 0", "--batch"),
    ("{good} --preset tiny-gdn --batch 8,,32", "--batch"),
    ("{good} --preset tiny-gdn --batch 8,8", "--batch"),
    ("{good} --preset tiny-gdn --figures /proc/advise", "--figures"),
    ("{good}", "--preset"),
    ("--preset tiny-gdn", "Missing argument 'runs'"),
]


@pytest.mark.parametrize(("args", "says"), BAD, ids=[a for a, _ in BAD])
def test_bad_input_is_one_line_and_writes_nothing(args: str, says: str, runs: dict[str, Path], tmp_path: Path) -> None:
    figures = tmp_path / "figures"
    argv = ["advise", *shlex.split(args.format(**{k: str(v) for k, v in runs.items()}))]
    if "--figures" not in argv:
        argv += ["--figures", str(figures)]
    result = runner.invoke(app, argv)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output
    assert "Traceback" not in result.output
    assert not figures.exists()


def test_mixed_runs_are_judged_together_when_asked(runs: dict[str, Path]) -> None:
    result = runner.invoke(app, ["advise", str(runs["good"]), str(runs["kda"]), str(runs["b300"]), "--preset",
                                 "tiny-gdn", "--allow-mixed", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["devices"] == ["NVIDIA B300", "NVIDIA H200"]
    assert any("holds no tiny-gdn decode or mtp-fixed row: left out" in n for n in out["notes"])


def test_json_figures_and_tables(runs: dict[str, Path], tmp_path: Path) -> None:
    args = ["advise", str(runs["good"]), "--preset", "tiny-gdn", "--accept", "geometric:0.5", "--batch", "8,16,32,64"]
    result = runner.invoke(app, [*args, "--json", "--figures", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    by_batch = {b["batch"]: b for b in out["batches"]}
    assert by_batch[8]["best"] == "native/triton S=0 fp32"  # 1 / 100 us against 1.875 / 300 us
    assert by_batch[16]["ranked"][0]["timing"] == "interpolated"
    assert by_batch[16]["ranked"][0]["median_us"] == pytest.approx(100 + 200 * 8 / 24)
    assert by_batch[64]["best"] is None and by_batch[64]["excluded"]
    assert sorted(out["figures"]) == ["advise-tiny-gdn-choice-map.png", "advise-tiny-gdn-frontier.png"]
    assert all(Path(p).stat().st_size > 0 for p in out["figures"].values())
    md = runner.invoke(app, [*args, "--markdown"])
    assert md.exit_code == 0, md.output
    assert "| 8 | native/triton S=0 fp32 | measured |" in md.output
    assert "interpolated (8-32)" in md.output
    assert "not judged at batch 64: native/triton S=0 fp32: not measured" in md.output
    rich = runner.invoke(app, args)
    assert rich.exit_code == 0 and "runner-up" in rich.output


@pytest.mark.usefixtures("light_runs")
def test_a_real_cpu_run_is_judged_from_its_own_rows(tmp_path: Path) -> None:
    common = {"batch": "2,4", "rounds": 2, "history_len": 4}
    argv = ["harness", "run"]
    decode = run_scenario("decode", common, argv=argv, out_root=tmp_path).path
    mtp = run_scenario("mtp-fixed", {**common, "drafts": 2}, argv=argv, out_root=tmp_path).path
    sweep = load_sweep([decode, mtp], "tiny-gdn")
    out = advise(sweep, geometric(0.6), budget_bytes=None)
    assert [b.batch for b in out.batches] == [2, 4]
    rows = {r: load_run(r).throughput for r in (decode, mtp)}
    passed = sum(int((df["status"] == "passed").sum()) for df in rows.values())
    for b in out.batches:
        assert len(b.ranked) == passed // 2  # every passed row of this batch is a candidate, measured
        assert all(s.timing.source == "measured" for s in b.ranked)
        tps = [s.tokens_per_s_per_request for s in b.ranked]
        assert tps == sorted(tps, reverse=True)
        for s in b.ranked:
            assert s.expected_tokens == pytest.approx(1 + 0.6 + 0.36 if s.candidate.drafts == 2 else 1.0)
            assert s.tokens_per_s_per_request == pytest.approx(s.expected_tokens / s.timing.median_us * 1e6)
        # decode accepts its one token a round: the run's own tokens/s is advise's for the batch
        decode_rows = rows[decode][(rows[decode]["status"] == "passed") & (rows[decode]["batch"] == b.batch)]
        for r in decode_rows.itertuples():
            s = next(s for s in b.ranked if s.candidate.drafts == 0 and s.candidate.mode == r.mode
                     and (s.candidate.variant or None) == (r.variant if isinstance(r.variant, str) else None)
                     and s.candidate.backend == r.backend)
            assert s.tokens_per_s == pytest.approx(r.tokens_per_s, rel=1e-9)
    assert any("CPU wall-clock" in n for n in out.notes)
