"""scripts/print_rows.py: the GPU scripts' last lines, one batch x mode table per run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

_spec = importlib.util.spec_from_file_location("print_rows", Path(__file__).parents[1] / "scripts" / "print_rows.py")
print_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(print_rows)


def _run(folder: Path, name: str, rows: list[dict]) -> Path:
    run = folder / name
    run.mkdir(parents=True)
    base = {"scenario": "mtp-fixed", "drafts": 3, "state_dtype": "fp32", "backend": "triton"}
    pd.DataFrame([{**base, **r} for r in rows]).to_csv(run / "throughput.csv", index=False)
    return run


def test_a_table_per_run_with_medians_of_passed_rows_and_statuses_of_the_rest(tmp_path, capsys):
    _run(tmp_path, "20261207T000000Z-mtp-fixed-aaaaaa", [
        {"mode": "native", "variant": None, "batch": 128, "median_us": 13983.4, "status": "passed"},
        {"mode": "replay", "variant": "matrix-bf16x3", "batch": 128, "median_us": 7543.5, "status": "passed"},
        {"mode": "native", "variant": None, "batch": 256, "median_us": None, "status": "oom"},
    ])
    _run(tmp_path, "20261207T000001Z-autotune-ssm-bbbbbb", [
        {"mode": "native", "variant": None, "batch": 128, "median_us": 1.0, "status": "passed"},
    ])
    (tmp_path / "20261207T000002Z-decode-cccccc.partial").mkdir()
    assert print_rows.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("-- ") == 1 and "mtp-fixed-aaaaaa: mtp-fixed drafts 3 fp32" in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert "replay-matrix-bf16x3/triton" in out.splitlines()[1]
    assert lines["128"] == ["13983", "7544"] and lines["256"][0] == "oom"


def test_no_argument_is_a_usage_error(capsys):
    assert print_rows.main([]) == 2
    assert "usage" in capsys.readouterr().err
