"""Integer columns hold integers: byte counts rounded once when a row is written (results/schema.py),
on real runs at odd geometries, and anything else non-integral refused naming its column."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.cli import app
from results.schema import BYTE_COLUMNS, COLUMNS, SchemaError, round_bytes
from results.store import RunWriter, load_run
from states import presets
from states.geometry import SSMGeometry

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("light_runs")  # columns are what this file checks (tests/conftest.py)
INT_COLUMNS = [c.name for c in COLUMNS if c.kind == "int"]
# Nothing a power of two, value heads a multiple of key heads, KDA and GDN.
ODD = {
    "tiny-odd-gdn": SSMGeometry("gdn", layers=3, key_heads=1, value_heads=3, head_k_dim=5, head_v_dim=7),
    "tiny-odd-kda": SSMGeometry("kda", layers=1, key_heads=3, value_heads=3, head_k_dim=3, head_v_dim=5),
}


@pytest.fixture
def odd_presets(monkeypatch):
    base = presets.PRESETS["tiny-gdn"]
    for name, geom in ODD.items():
        monkeypatch.setitem(presets.PRESETS, name, dataclasses.replace(base, name=name, ssm=geom, attn=None))


def _run(args: list[str], out: Path) -> pd.DataFrame:
    result = runner.invoke(app, ["run", *args, "--warmup", "0", "--rep", "2", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return load_run(path).throughput


def _integral(df: pd.DataFrame) -> None:
    for name in INT_COLUMNS:
        values = df[name].dropna()
        assert str(df[name].dtype) == "Int64", name
        assert all(float(v).is_integer() for v in values), name


# The command as the issue gave it, Lh 16 included: replay is timed over 8-round fold cycles (20 s). The odd
# geometries below check the same columns at Lh 4 in the fast suite.
@pytest.mark.slow
def test_the_issue_command_writes_integer_bytes(tmp_path):
    """`mtp-dynamic --preset tiny-kda --drafts 1` used to fail after all its work: replay's mean bytes per
    round (e.g. 30473.5) did not fit the integer `bytes_moved`."""
    df = _run(["mtp-dynamic", "--preset", "tiny-kda", "--drafts", "1", "--rounds", "4"], tmp_path)
    assert set(df["status"]) == {"passed"}
    _integral(df)
    assert (df["bytes_moved"] > 0).all()


# The fast suite runs each scenario once, on both odd geometries between them; the other two under -m slow.
@pytest.mark.parametrize(("scenario", "preset"), [
    ("mtp-dynamic", "tiny-odd-gdn"), pytest.param("mtp-dynamic", "tiny-odd-kda", marks=pytest.mark.slow),
    ("checkpoint-restore", "tiny-odd-kda"), pytest.param("checkpoint-restore", "tiny-odd-gdn", marks=pytest.mark.slow),
], ids=lambda v: v)
def test_odd_geometries_write_integer_columns(odd_presets, tmp_path, preset, scenario):
    df = _run([scenario, "--preset", preset, "--drafts", "1", "--batch", "3,5", "--rounds", "5", "--history-len", "4"],
              tmp_path)
    # the default run variants at an odd geometry: every row passes but replay's matrix fold, whose tensor-core
    # tiles need K, V >= 16 (the presets' are 5..7), which says so instead of running
    passed = df["status"] == "passed"
    refused = df[~passed]
    assert set(refused["status"]) <= {"unsupported"} and set(refused["variant"]) <= {"matrix-bf16x3"}, \
        df[["mode", "variant", "status", "reason"]]
    assert refused["reason"].str.contains("the matrix fold needs K >= 16 and V >= 16").all()
    assert passed.sum() >= 6 * 2  # native, four compact variants, replay inline at each batch
    _integral(df)
    assert df.loc[passed, "bytes_moved"].notna().all()  # every passed row timed, so each has its cost-model bytes


def test_bytes_are_rounded_once_and_other_fractions_refused(tmp_path):
    assert round_bytes({"bytes_moved": 30473.5, "bytes_per_request_measured": 10.25, "batch": 3}) == \
        {"bytes_moved": 30474, "bytes_per_request_measured": 10, "batch": 3}
    assert set(BYTE_COLUMNS) == {"bytes_moved", "bytes_per_request_predicted", "bytes_per_request_measured"}
    row = {"scenario": "decode", "family": "gdn", "mode": "native", "backend": "torch", "preset": "tiny-gdn",
           "device": "cpu", "status": "passed", "bytes_moved": 1234.5}
    with RunWriter(tmp_path, manifest={}) as w:
        w.add_row(row)
    assert int(load_run(w.path).throughput["bytes_moved"].iloc[0]) == 1234  # to the nearest, half to even
    with pytest.raises(SchemaError, match=r"column batch \(int\) does not hold its schema type in rows \[0\]"):
        with RunWriter(tmp_path, manifest={}) as w:
            w.add_row({**row, "batch": 2.5})
