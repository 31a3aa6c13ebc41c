"""results: schema validation, run directories, tables, run comparison and figures, on synthetic rows."""

from __future__ import annotations

import datetime
import json

import pandas as pd
import pytest
import torch
from rich.console import Console

from harness.equivalence import compare
from results import Run, RunWriter, latest_run, load_run
from results.compare import comparison_table, compare_runs
from results.plots import make_figure, plot_run
from results.schema import AXES, COLUMN_NAMES, COLUMNS, KEY, SchemaError, Status, validate_rows
from results.store import new_run_id
from results.tables import noisy_rows, render_markdown, render_rich, throughput_tables

MANIFEST = {"command": "harness run decode", "gpu_name": "NVIDIA H200", "sm_count": 132, "driver": "580.1",
            "cuda": "13.0", "git_sha": "0123456789abcdef", "git_dirty": False, "torch": "2.11", "triton": "3.6",
            "ceilings": {"d2d-copy": {"gbps": 4260.0}, "h2d-pinned": {"gbps": 55.5}}}  # fmt: skip


def _row(mode="native", batch=1, median=100.0, spread=2.0, status="passed", **extra) -> dict:
    row = {
        "scenario": "mtp-fixed", "family": "gdn", "mode": mode, "backend": "triton", "preset": "qwen3-next",
        "device": "cuda:0", "batch": batch, "drafts": 3, "width": 4, "accept": "none", "state_dtype": "fp32",
        "act_dtype": "bf16", "layers": 36, "config": '{"BV": 32}', "config_source": "autotuned", "status": status,
        "bytes_per_request_predicted": {"native": 4, "compact": 1, "replay": 2}.get(mode, 1) * (72 << 20),
        "bytes_per_request_measured": {"native": 4, "compact": 1, "replay": 2}.get(mode, 1) * (73 << 20),
        "repro": f"harness run mtp-fixed --modes {mode} --batch {batch}",
    }  # fmt: skip
    if mode == "replay":
        row.update(history_len=8, history_dtype="bf16")
    if status == "passed":
        row.update(
            timer="cuda-graph", samples=100, median_us=median, p20_us=median - spread, p80_us=median + spread,
            noise_pct=1.0, tokens_per_s=batch * 4 / (median * 1e-6), bytes_moved=10**9,
            achieved_gbps=10**9 / (median * 1e-6) / 1e9, ceiling_name="d2d-copy", ceiling_gbps=4260.0,
        )  # fmt: skip
        row["ceiling_pct"] = row["achieved_gbps"] / 4260.0 * 100
    else:
        row["reason"] = extra.pop("reason", f"{status} at batch {batch}")
    row.update(extra)
    return row


def _sweep() -> list[dict]:
    rows = []
    for batch in (1, 8, 64):
        rows.append(_row("native", batch, median=100.0 * batch))
        rows.append(_row("compact", batch, median=80.0 * batch))
        rows.append(_row("replay", batch, median=90.0 * batch))
    rows.append(_row("native", 512, status="oom", reason="needs 140.2 GiB, 139.1 GiB free"))
    rows.append(_row("compact", 512, median=80.0 * 512))
    rows.append(_row("replay", 512, status="unsupported", reason="history ring too long for Lh 8"))
    return rows


def _write_run(root, rows, comparisons=(), tag="mtp-fixed", run_id=None) -> Run:
    with RunWriter(root, run_id, manifest=MANIFEST, tag=tag) as w:
        w.add_rows(rows)
        w.add_equivalence(list(comparisons))
    return load_run(w.path)


# ---- schema -------------------------------------------------------------------------------------


def test_schema_columns_are_named_with_their_units():
    names = [c.name for c in COLUMNS]
    assert len(names) == len(set(names))
    for c in COLUMNS:
        assert c.kind in ("str", "int", "float") and c.meaning
        assert not c.unit or c.unit in c.name, c.name
    brief = """run_id scenario family mode backend preset device batch drafts width accept state_dtype act_dtype
        history_len history_dtype layers tp_prefill tp_decode page_size direction config config_source status reason
        timer samples median_us p20_us p80_us noise_pct tokens_per_s bytes_moved achieved_gbps ceiling_name
        ceiling_gbps ceiling_pct bytes_per_request_predicted bytes_per_request_measured max_concurrency repro"""
    assert set(brief.split()) <= set(COLUMN_NAMES)
    assert "run_id" not in KEY and "batch" in KEY and "median_us" not in KEY and set(AXES) <= set(KEY)
    assert {s.value for s in Status} == {"passed", "mismatch", "oom", "unsupported", "error"}


def test_validate_accepts_a_mixed_sweep_and_types_it():
    df = validate_rows(pd.DataFrame(_sweep()).assign(run_id="r"))
    assert list(df.columns) == COLUMN_NAMES
    assert str(df["batch"].dtype) == "Int64" and str(df["median_us"].dtype) == "float64"
    assert df["history_len"].isna().sum() == 8  # axes a row does not have stay empty


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda r: r[9].update(median_us=5.0), "median_us is set on a non-passed row"),  # timing on an oom row
        (lambda r: r[9].update(achieved_gbps=5.0), "achieved_gbps is set on a non-passed row"),
        (lambda r: r[9].update(reason=""), "reason is empty"),
        (lambda r: r[0].update(status="flaky"), "status outside"),
        (lambda r: r[0].update(p20_us=500.0), "p20_us <= median_us <= p80_us"),
        (lambda r: r[0].update(p80_us=None), "partly filled"),
        (lambda r: r[1].update(mode="native"), "same case key"),
        (lambda r: r[0].update(backend=""), "backend is empty"),
        (lambda r: r[0].update(median_us=-1.0, p20_us=-2.0, p80_us=-0.5), "median_us is negative"),
        (lambda r: r[0].update(batch=1.5), "schema type"),
    ],
)
def test_validate_rejects(change, message):
    rows = _sweep()
    change(rows)
    with pytest.raises(SchemaError, match=message):
        validate_rows(pd.DataFrame(rows).assign(run_id="r"))


def test_validate_rejects_unknown_columns():
    with pytest.raises(SchemaError, match=r"unknown columns \['median_ms'\]"):
        validate_rows(pd.DataFrame([_row(median_ms=1.0)]).assign(run_id="r"))


# ---- run directories ----------------------------------------------------------------------------


def test_run_is_built_partial_then_renamed(tmp_path):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    comp = compare(a, a.clone(), name="o", lhs="compact", rhs="native", contract="compact-vs-native", policy="bitwise")
    bad = compare(a, b, name="ssm", lhs="replay", rhs="native", contract="replay", policy="rms", tolerance=1e-3)
    w = RunWriter(tmp_path, manifest=MANIFEST, tag="MTP fixed!")
    assert w.path.name.endswith(".partial") and not w.final_dir.exists()
    w.add_rows(_sweep())
    w.add_equivalence(comp)
    w.add_equivalence([bad])
    w.add_autotune({"kernel": "native_verify", "config": {"BV": 32}, "status": "ok", "median_us": 12.5})
    w.add_autotune({"kernel": "native_verify", "config": {"BV": 128}, "status": "oom", "wanted_bytes": 1 << 40})
    w.add_oom({"mode": "native", "batch": 512, "wanted_bytes": 150 << 30, "free_bytes": 139 << 30})
    assert len((w.path / "rows.jsonl").read_text().splitlines()) == 12  # crash-safe copy while running
    w.figure_path("x.png").write_bytes(b"png")
    assert not (tmp_path / w.run_id).exists()
    final = w.finish()
    assert final == tmp_path / w.run_id and not w.partial_dir.exists()
    files = "manifest.json throughput.csv equivalence.json equivalence.md autotune.jsonl oom.jsonl figures"
    assert {p.name for p in final.iterdir()} == set(files.split())
    run = load_run(final)
    assert run.run_id == w.run_id and run.manifest["rows"] == 12 and run.manifest["equivalence_passed"] is False
    assert run.manifest["gpu_name"] == "NVIDIA H200"
    expected = validate_rows(pd.DataFrame(_sweep()).assign(run_id=w.run_id))
    pd.testing.assert_frame_equal(run.throughput, expected)
    assert (run.throughput["accept"] == "none").all()  # "none" is a value, not a missing cell
    assert [c.name for c in run.comparisons] == ["o", "ssm"] and run.comparisons[0].passed
    assert list(run.equivalence["passed"]) == [True, False]
    assert list(run.autotune["status"]) == ["ok", "oom"] and run.oom.loc[0, "batch"] == 512
    assert "FAIL: 1 of 2 comparisons passed" in (final / "equivalence.md").read_text()
    with pytest.raises(RuntimeError, match="finished"):
        w.add_row(_row())


def test_failed_run_leaves_no_complete_looking_directory(tmp_path):
    good = _write_run(tmp_path, _sweep())
    with pytest.raises(KeyError), RunWriter(tmp_path, manifest=MANIFEST, tag="decode") as w:
        w.add_row(_row())
        raise KeyError("scenario crashed")
    assert not w.final_dir.exists() and w.partial_dir.is_dir()
    assert "scenario crashed" in (w.partial_dir / "FAILED.txt").read_text()
    assert (w.partial_dir / "rows.jsonl").read_text()  # what it had is kept for forensics
    with pytest.raises(ValueError, match=r"is a failed run \(FAILED.txt: KeyError: 'scenario crashed'\); it holds 1 rows"):
        load_run(w.partial_dir)  # the error, the traceback's last line, and what the run holds
    assert latest_run(tmp_path).run_id == good.run_id  # the newer failed run is skipped


def test_rows_that_break_the_schema_fail_the_run(tmp_path):
    w = RunWriter(tmp_path, manifest=MANIFEST)
    w.add_row(_row(status="oom", reason="out of memory", median_us=3.0))
    with pytest.raises(SchemaError, match="median_us is set on a non-passed row"):
        w.finish()
    assert not w.final_dir.exists() and (w.partial_dir / "FAILED.txt").is_file()
    with pytest.raises(SchemaError, match="unknown columns"):
        RunWriter(tmp_path, manifest=MANIFEST).add_row({"median_ms": 1.0})


def test_run_ids_sort_by_time_and_never_collide(tmp_path):
    t0 = datetime.datetime(2026, 12, 2, 9, 59, 59, tzinfo=datetime.timezone.utc)
    ids = [new_run_id("Decode", t0 + datetime.timedelta(seconds=s)) for s in (0, 1, 3600)]
    assert ids == sorted(ids) and ids[0].startswith("20261202T095959Z-decode-")
    assert len({new_run_id("x", t0) for _ in range(50)}) == 50
    RunWriter(tmp_path, "fixed-id", manifest=MANIFEST)
    with pytest.raises(FileExistsError):
        RunWriter(tmp_path, "fixed-id", manifest=MANIFEST)
    with pytest.raises(ValueError, match="run id"):
        RunWriter(tmp_path, "../escape", manifest=MANIFEST)


def test_load_run_needs_the_required_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="no finished run"):
        latest_run(tmp_path / "nothing")


# ---- tables -------------------------------------------------------------------------------------


def test_tables_put_native_first_with_speedups_and_statuses(tmp_path):
    run = _write_run(tmp_path, _sweep() + [_row("native", 8, median=900.0, drafts=1, width=2)])
    summary, details = throughput_tables(run.throughput)
    # Constant axes move into the title; the varying ones key the rows.
    assert summary.title == "mtp-fixed · gdn · qwen3-next · triton · cuda:0 · fp32 · bf16 · accept=none · layers=36"
    assert details.title == summary.title + " · details"
    replay = "replay (Lh 8, bf16 history)"  # replay-only axes label the mode instead of splitting rows
    assert summary.columns == [
        "batch", "drafts", "width", "native us", "compact us", "compact: x faster than native",
        f"{replay} us", f"{replay}: x faster than native",
    ]  # fmt: skip
    rows = {tuple(r[:3]): dict(zip(summary.columns, r)) for r in summary.rows}
    assert list(rows) == [("1", "3", "4"), ("8", "1", "2"), ("8", "3", "4"), ("64", "3", "4"), ("512", "3", "4")]
    assert rows[("8", "3", "4")]["native us"] == "800 (798-802)"
    assert rows[("8", "3", "4")]["compact: x faster than native"] == "1.25x"
    assert rows[("8", "3", "4")][f"{replay}: x faster than native"] == "1.11x"
    assert rows[("8", "1", "2")]["compact us"] == "-"  # no such case
    assert rows[("512", "3", "4")]["native us"] == "OOM"
    assert rows[("512", "3", "4")]["compact: x faster than native"] == "-"  # no speedup against a row that did not pass
    assert rows[("512", "3", "4")][f"{replay} us"] == "UNSUPPORTED"

    detail = {(r[0], r[1], r[3]): dict(zip(details.columns, r)) for r in details.rows}
    assert [r[3] for r in details.rows[:3]] == ["native", "compact", replay]
    oom = detail[("512", "3", "native")]
    assert oom["status"] == "OOM: needs 140.2 GiB, 139.1 GiB free" and oom["us (p20-p80)"] == "-"
    assert oom["bytes/req predicted"] == "288.0 MiB" and oom["bytes/req measured"] == "292.0 MiB"
    ok = detail[("64", "3", "compact")]
    assert ok["status"] == "passed" and ok["noise"] == "1.0%" and ok["tok/s"] == "50.00k"
    assert ok["GB/s"] == "195" and ok["% ceiling"] == "4.58% d2d-copy"

    md = render_markdown(run)
    assert "NVIDIA H200 (132 SMs)" in md and "d2d-copy 4260.0 GB/s" in md and "cuda-graph (100 samples)" in md
    assert "UNSUPPORTED: history ring too long" in md and md.count("\n### ") == 2
    assert "no row above the noise threshold" in md


def test_our_summary_says_how_much_faster_than_the_best_peer_row_of_each_mode(tmp_path):
    """Peers' rows (baseline backends) get their own tables, and our summary gains a `<mode>: x faster than
    best peer` column for each mode a peer ran: the fastest passed peer row of that mode and shape, named."""
    rows = [_row("native", 8, median=400.0), _row("replay", 8, median=300.0), _row("compact", 8, median=130.0),
            _row("native", 8, median=370.0, backend="flashinfer"), _row("native", 8, median=500.0, backend="fla"),
            _row("replay", 8, median=120.0, backend="sglang", variant="tf32"),
            _row("native", 64, median=3000.0), _row("native", 64, status="unsupported", backend="flashinfer")]
    run = _write_run(tmp_path, rows)
    tables = {t.title.split(" · ")[3]: t for t in throughput_tables(run.throughput) if "details" not in t.title}
    assert set(tables) == {"triton", "flashinfer", "fla", "sglang"}
    ours = tables["triton"]
    replay = "replay (Lh 8, bf16 history)"
    assert "native: x faster than best peer" in ours.columns and f"{replay}: x faster than best peer" in ours.columns
    assert "compact: x faster than best peer" not in ours.columns  # no peer ran compact
    cells = {r[0]: dict(zip(ours.columns, r)) for r in ours.rows}
    assert cells["8"]["native: x faster than best peer"] == "0.93x (flashinfer)"
    assert cells["8"][f"{replay}: x faster than best peer"] == "0.40x (sglang tf32)"
    assert cells["64"]["native: x faster than best peer"] == "-"  # the peer's row did not pass
    assert not any("best peer" in c for c in tables["sglang"].columns)


def test_noisy_rows_are_logged(tmp_path):
    rows = [_row("native", 1, median=100.0, spread=3.0, noise_pct=3.0), _row("compact", 1, median=100.0)]
    run = _write_run(tmp_path, rows)
    assert list(noisy_rows(run.throughput)["mode"]) == ["native"]
    assert "Warn: mtp-fixed/gdn/native/triton batch=1" in render_markdown(run)
    console = Console(record=True, width=300)
    render_rich(run, console)
    text = console.export_text()
    assert "mtp-fixed · gdn · qwen3-next" in text and "Warn:" in text and "NVIDIA H200" in text


def test_cpu_runs_are_labelled_and_kv_rows_without_mode_render(tmp_path):
    rows = [
        _row(mode="", family="gqa", scenario="cpu-page-restore", direction=d, page_size=256, batch=4, drafts=None,
             width=None, accept=None, state_dtype=None, device="cpu", timer="cpu-wall")
        for d in ("h2d", "d2h")
    ]  # fmt: skip
    with RunWriter(tmp_path, manifest={"command": "harness run cpu-page-restore", "host": "laptop"}) as w:
        w.add_rows(rows)
    run = load_run(w.path)
    md = render_markdown(run)
    assert "timings are CPU wall-clock" in md and "cpu-wall (100 samples)" in md
    summary, details = throughput_tables(run.throughput)
    assert summary.title.endswith("batch=4 · layers=36 · page_size=256")
    assert summary.columns == ["direction", "us"] and [r[0] for r in summary.rows] == ["d2h", "h2d"]
    assert len(details.rows) == 2 and details.rows[0][1] == "-"


# ---- compare ------------------------------------------------------------------------------------


def test_compare_verdicts_from_intervals(tmp_path):
    a_rows = [
        _row("native", 1, median=100.0, spread=2.0),  # B separated below: faster
        _row("native", 8, median=100.0, spread=2.0),  # B separated above: slower
        _row("native", 64, median=100.0, spread=5.0),  # overlap, medians within noise: same
        _row("compact", 1, median=100.0, spread=10.0),  # overlap, medians apart more than noise: ambiguous
        _row("compact", 8, median=100.0),  # B is oom: untimed
        _row("compact", 64, median=100.0),  # only in A
    ]
    b_rows = [
        _row("native", 1, median=90.0, spread=2.0),
        _row("native", 8, median=110.0, spread=2.0),
        _row("native", 64, median=100.5, spread=5.0),
        _row("compact", 1, median=85.0, spread=20.0, noise_pct=3.0),
        _row("compact", 8, status="oom", reason="out of memory"),
        _row("replay", 1, median=50.0),  # only in B
    ]
    a = _write_run(tmp_path, a_rows, run_id="a")
    b = _write_run(tmp_path, b_rows, run_id="b")
    df = compare_runs(a, b)
    verdict = {(r.mode, r.batch): r.verdict for r in df.itertuples()}
    assert verdict == {
        ("native", 1): "faster", ("native", 8): "slower", ("native", 64): "same", ("compact", 1): "ambiguous",
        ("compact", 8): "untimed", ("compact", 64): "only-a", ("replay", 1): "only-b",
    }  # fmt: skip
    speedup = {(r.mode, r.batch): r.speedup for r in df.itertuples()}
    assert speedup[("native", 1)] == pytest.approx(100 / 90) and speedup[("native", 8)] == pytest.approx(100 / 110)
    assert speedup[("native", 64)] == pytest.approx(100 / 100.5)
    assert all(pd.isna(speedup[k]) for k in [("compact", 1), ("compact", 8), ("compact", 64), ("replay", 1)])
    assert df.loc[df["verdict"] == "untimed", "status_b"].item() == "oom"
    table = comparison_table(df)
    assert len(table.rows) == 7 and any("ambiguous" in r and "-" == r[-1] for r in table.rows)


def test_compare_of_cpu_wall_clock_rows_is_never_faster_or_slower(tmp_path):
    """Issue 24: two back-to-back CPU runs of the same code came out "slower 0.480x": a CPU row's spread
    says how steady one run was, not where the next one lands on a shared box."""
    cpu = {"device": "cpu", "timer": "cpu-wall"}
    a = _write_run(tmp_path, [_row("native", 1, median=100.0, **cpu), _row("native", 8, median=100.0, spread=5.0,
                                                                            **cpu)], run_id="a")
    b = _write_run(tmp_path, [_row("native", 1, median=208.0, **cpu), _row("native", 8, median=101.0, spread=5.0,
                                                                            **cpu)], run_id="b")
    verdict = {r.batch: (r.verdict, r.speedup) for r in compare_runs(a, b).itertuples()}
    assert verdict[1][0] == "ambiguous" and pd.isna(verdict[1][1])  # separated intervals, but the wall clock
    assert verdict[8] == ("same", pytest.approx(100 / 101))  # within the noise: still a verdict


def test_compare_matches_rows_with_empty_axes(tmp_path):
    kv = {"mode": "", "family": "gqa", "scenario": "cpu-page-restore", "drafts": None, "width": None, "accept": None}
    a = _write_run(tmp_path, [_row(**kv, direction="h2d", median=10.0, spread=0.1)], run_id="a")
    b = _write_run(tmp_path, [_row(**kv, direction="h2d", median=10.05, spread=0.1)], run_id="b")
    df = compare_runs(a, b)
    assert len(df) == 1 and df.loc[0, "verdict"] == "same"


# ---- plots --------------------------------------------------------------------------------------


def test_plots_write_pngs(tmp_path):
    two_drafts = [_row(mode, 8, median=t, drafts=1, width=2) for mode, t in (("native", 900.0), ("compact", 700.0))]
    rows = _sweep() + two_drafts
    run = _write_run(tmp_path, rows)
    written = plot_run(run)
    names = {f"mtp-fixed-gdn-{m}.png" for m in ("throughput", "memory", "speedup", "bandwidth")}
    assert set(written) == names
    for name in names:
        path = written[name]
        assert path == run.path / "figures" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    fig = make_figure(run.throughput, "mtp-fixed", "gdn", "speedup")
    lines = [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    labels = [line.get_label() for line in lines]
    assert labels == [
        "compact drafts=1 width=2", "compact drafts=3 width=4", "replay (Lh 8, bf16 history) drafts=3 width=4",
    ]  # fmt: skip
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()  # one colour per mode
    assert lines[0].get_linestyle() != lines[1].get_linestyle()
    compact_b8 = lines[1].get_xydata()[list(lines[1].get_xdata()).index(8)]
    assert compact_b8[1] == pytest.approx(800.0 / 640.0)  # native median / compact median at batch 8


def test_plots_skip_with_a_reason_when_there_is_no_data(tmp_path):
    rows = [_row("native", 512, status="oom", reason="out of memory", bytes_per_request_predicted=None,
                 bytes_per_request_measured=None)]  # fmt: skip
    run = _write_run(tmp_path, rows)
    written = plot_run(run, tmp_path / "figs")
    assert all(isinstance(v, str) for v in written.values()) and len(written) == 4
    assert "no passed rows" in written["mtp-fixed-gdn-throughput.png"]
    assert not list((tmp_path / "figs").iterdir())
    assert make_figure(run.throughput, "decode", "kda", "throughput") == "no rows for decode/kda"
    with pytest.raises(ValueError, match="unknown metric"):
        make_figure(run.throughput, "mtp-fixed", "gdn", "latency")


def test_equivalence_json_is_what_load_run_reads(tmp_path):
    a = torch.randn(2, 3)
    comp = compare(a, a + 1, name="o", lhs="x", rhs="y", contract="c", policy="ulp", tolerance=4)
    run = _write_run(tmp_path, [_row()], [comp])
    on_disk = json.loads((run.path / "equivalence.json").read_text())
    assert on_disk["passed"] is False and on_disk["comparisons"][0]["max_ulp"] == comp.max_ulp
    assert run.comparisons == [comp]
