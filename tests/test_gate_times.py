"""`make gpu-gate`'s times file (scripts/gate_times.py, issue 23): exactly the issue's schema, verdicts from the
gates' manifests and pytest's JUnit file, failures and timeouts said as such; and scripts/h200_summary.py
reading it (and still the older text file)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMES = ROOT / "scripts" / "gate_times.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _times(*args) -> None:
    subprocess.run([sys.executable, str(TIMES), *map(str, args)], check=True)


def _gate_run(out: Path, name: str, shapes: str, summary: str) -> Path:
    run = out / name
    run.mkdir(parents=True)
    manifest = {"argv": ["harness", "gate", "--device", "cuda", "--shapes", shapes], "gate_summary": summary,
                "wall_s": {"setup": 3.2, "compile": 9.7, "rollout": 30.1, "total": 50.4},
                "compiles": {"ahead": {"specializations": 64, "seconds": 9.1, "failures": []},
                             "first_launch": {"compiled": 0, "compile_s": 0, "loaded": 64, "kernels": {}}}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def _junit(path: Path, tests: int, failures: int, skipped: int) -> Path:
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" '
                    f'failures="{failures}" errors="0" skipped="{skipped}"></testsuite></testsuites>')
    return path


def test_times_file_has_the_issue_schema_and_the_real_verdicts(tmp_path):
    out, cache = tmp_path / "cold", tmp_path / "cache"
    out.mkdir()
    times = out / "gpu-gate-times.json"
    _times("start", "--times", times, "--cache", cache)  # no cache folder at all: cold
    tiny = _gate_run(out, "20261204T000000Z-gate-aaaaaa", "tiny", "PASS: 1432 of 1432 comparisons passed, ...")
    (out / "gate-tiny.log").write_text(f"gate cases: done, 28/28 in 60.1 s\nPASS: ...\ngate report: {tiny}\n")
    _times("step", "--times", times, "--name", "gate-tiny", "--rc", 0, "--seconds", 71, "--log", out / "gate-tiny.log")
    # the model gate ran into its step limit: no report, the verdict says so whatever the last line was
    (out / "gate-model.log").write_text("gate cases: 40/96 after 110 s | mtp-fixed qwen3-next batch 8\n")
    _times("step", "--times", times, "--name", "gate-model", "--rc", 124, "--seconds", 120,
           "--log", out / "gate-model.log")
    junit = _junit(out / "pytest-cuda.xml", tests=29, failures=1, skipped=2)
    _times("step", "--times", times, "--name", "pytest-cuda", "--rc", 1, "--seconds", 33, "--junit", junit,
           "--log", out / "missing.log")
    _times("finish", "--times", times, "--total", 231)
    data = json.loads(times.read_text())
    assert set(data) == {"cold", "total_s", "steps"} and data["cold"] is True and data["total_s"] == 231
    assert [set(s) for s in data["steps"]] == [{"name", "rc", "seconds", "verdict"}] * 3
    tiny_step, model_step, pytest_step = data["steps"]
    assert tiny_step == {"name": "gate-tiny", "rc": 0, "seconds": 71,
                         "verdict": "PASS: 1432 of 1432 comparisons passed, ..."}
    assert model_step["rc"] == 124 and model_step["verdict"].startswith("FAIL stopped at the step's time limit after 120 s")
    assert "40/96 after 110 s" in model_step["verdict"]
    assert pytest_step["verdict"] == "FAIL 1 failed, 0 errors, 26 passed, 2 skipped"


def test_a_gate_that_exits_non_zero_never_reads_pass_and_a_warm_cache_is_not_cold(tmp_path):
    cache = tmp_path / "cache"
    (cache / "ABC123").mkdir(parents=True)
    (cache / "ABC123" / "kernel.json").write_text("{}")
    times = tmp_path / "gpu-gate-times.json"
    _times("start", "--times", times, "--cache", cache)
    run = _gate_run(tmp_path, "20261204T000000Z-gate-bbbbbb", "model", "PASS: 10 of 10 comparisons passed")
    (tmp_path / "gate-model.log").write_text(f"gate report: {run}\nTraceback: figures failed\n")
    _times("step", "--times", times, "--name", "gate-model", "--rc", 1, "--seconds", 5, "--log", tmp_path / "gate-model.log")
    _times("step", "--times", times, "--name", "pytest-cuda", "--rc", 0, "--seconds", 30,
           "--junit", _junit(tmp_path / "p.xml", tests=27, failures=0, skipped=0))
    data = json.loads(times.read_text())
    assert data["cold"] is False and data["total_s"] == 35  # the steps so far, before `finish`
    assert data["steps"][0]["verdict"] == "FAIL rc 1, no gate report; last line: Traceback: figures failed"
    assert data["steps"][1]["verdict"] == "PASS 27 passed, 0 skipped"


def test_steps_that_ran_side_by_side_count_the_wall_time_not_their_sum(tmp_path):
    times = tmp_path / "gpu-gate-times.json"
    _times("start", "--times", times, "--cache", tmp_path / "cache")
    junit = _junit(tmp_path / "p.xml", tests=27, failures=0, skipped=0)
    # scripts/gpu_gate.sh: pytest -m cuda (40 s) beside the tiny gate (70 s), then the model gate (100 s)
    _times("step", "--times", times, "--name", "gate-tiny", "--rc", 1, "--seconds", 70, "--elapsed", 71)
    _times("step", "--times", times, "--name", "pytest-cuda", "--rc", 0, "--seconds", 40, "--elapsed", 71,
           "--junit", junit)
    assert json.loads(times.read_text())["total_s"] == 71
    _times("step", "--times", times, "--name", "gate-model", "--rc", 1, "--seconds", 100, "--elapsed", 172)
    data = json.loads(times.read_text())
    assert data["total_s"] == 172 and sum(s["seconds"] for s in data["steps"]) == 210
    assert [set(s) for s in data["steps"]] == [{"name", "rc", "seconds", "verdict"}] * 3  # the issue's schema


def test_h200_summary_reads_the_json_passes_and_the_older_text_file(tmp_path):
    summary = _load("h200_summary")
    folder = tmp_path / "gate-timed"
    for name, cold, total in (("cold", True, 212), ("warm", False, 318)):
        p = folder / name
        p.mkdir(parents=True)
        _gate_run(p, "20261204T000000Z-gate-cccccc", "model", "PASS: 2192 of 2192 comparisons passed; backends x")
        steps = [{"name": "gate-tiny", "rc": 0, "seconds": 71, "verdict": "PASS: 1432 of 1432; backends x"},
                 {"name": "gate-model", "rc": 0, "seconds": 104, "verdict": "PASS: 2192 of 2192; backends x"},
                 {"name": "pytest-cuda", "rc": 0, "seconds": 31, "verdict": "PASS 27 passed, 0 skipped"}]
        (p / "gpu-gate-times.json").write_text(json.dumps({"cold": cold, "total_s": total, "steps": steps}))
    lines = summary.gate_passes(folder)
    assert lines[2] == ("| cold | cold | 71 s, PASS: 1432 of 1432 | 104 s, PASS: 2192 of 2192 | 31 s, PASS 27 passed, "
                        "0 skipped | 212 s (under 300) |")
    assert lines[3].startswith("| warm | warm |") and lines[3].endswith("| 318 s (over 300) |")
    # a pass cut short: the missing step says so, and its total is not held against the 5 minutes
    cut = folder / "warm" / "gpu-gate-times.json"
    data = json.loads(cut.read_text())
    cut.write_text(json.dumps({**data, "total_s": 143, "steps": data["steps"][::2]}))
    row = summary.gate_passes(folder)[3]
    assert "| did not finish |" in row and row.endswith("| incomplete (143 s of finished steps) |")
    assert ("* cold model gate: 50 s (setup 3, compile 10, rollout 30); compiled ahead 64 specializations in 9.1 s, "
            "then 0 compiled on first launch (0 s) and 64 loaded from the cache.") in lines
    old = summary.gate_times(ROOT / "results" / "reference" / "h200-2026-12-03")  # text only: seconds, last line wins
    assert old["cold"] is None and old["steps"]["gate-model"]["seconds"] == 178
    assert old["steps"]["pytest-cuda"] == {"rc": 0, "seconds": 32, "verdict": None}
