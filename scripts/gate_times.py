"""Record the steps of `make gpu-gate` in gpu-gate-times.json (issue 23), as scripts/gpu_gate.sh runs them.

The file, next to the run directories of one `make gpu-gate`:

    {"cold": true, "total_s": 212, "steps": [
        {"name": "gate-tiny", "rc": 0, "seconds": 71, "verdict": "PASS: 1432 of 1432 comparisons passed, ..."},
        {"name": "gate-model", "rc": 0, "seconds": 104, "verdict": "PASS: ..."},
        {"name": "pytest-cuda", "rc": 0, "seconds": 31, "verdict": "PASS 27 passed, 0 skipped"}]}

`cold`: Triton's cache directory held no compiled kernel when the run started. `total_s` is the run's wall
time: scripts/gpu_gate.sh runs `pytest -m cuda` beside the tiny gate, so it can be less than the steps' sum. A step's verdict is the
gate's own summary line (its run directory's manifest, found through the `gate report:` line of the
step's log) or pytest's counts (its JUnit file), and starts with PASS only when the step's exit status
is 0 as well; a step stopped at its time limit, or one that left no report, says so after FAIL.

    python3 scripts/gate_times.py start --times OUT/gpu-gate-times.json --cache DIR
    python3 scripts/gate_times.py step --times FILE --name gate-tiny --rc 0 --seconds 71 --log LOG [--junit XML]
        [--elapsed N]
    python3 scripts/gate_times.py finish --times FILE --total 212

Each call rewrites the file whole (through a temporary file), so a run cut short keeps the steps that finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

STEPS = ("gate-tiny", "gate-model", "pytest-cuda")
TIMEOUT_RCS = (124, 137)  # timeout(1)'s status, and SIGKILL's


def cache_is_cold(cache: Path) -> bool:
    """No compiled kernel in Triton's cache directory (each kernel is a folder holding a .json)."""
    return not cache.is_dir() or not any(cache.glob("*/*.json"))


def gate_verdict(rc: int, seconds: int, log: Path | None) -> str:
    """The gate's summary line from the manifest of the run directory its log names."""
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    reports = re.findall(r"^gate report: (.+)$", text, flags=re.M)
    summary = ""
    if reports:
        manifest = Path(reports[-1].strip()) / "manifest.json"
        if manifest.exists():
            summary = json.loads(manifest.read_text()).get("gate_summary", "")
    if rc == 0 and summary.startswith("PASS"):
        return summary
    if summary.startswith("FAIL"):
        return summary
    return "FAIL " + _why(rc, seconds, text, "no gate report")


def pytest_verdict(rc: int, seconds: int, junit: Path | None, log: Path | None) -> str:
    """pytest's counts from its JUnit file."""
    if junit is not None and junit.exists():
        root = ET.parse(junit).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        if suite is not None:
            n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
            passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
            counts = f"{passed} passed, {n['skipped']} skipped"
            if n["failures"] or n["errors"]:
                counts = f"{n['failures']} failed, {n['errors']} errors, " + counts
            if not n["tests"]:
                return f"FAIL no test ran (rc {rc})"
            if rc == 0 and not (n["failures"] or n["errors"]):
                return f"PASS {counts}"
            return f"FAIL {counts}" + ("" if n["failures"] or n["errors"] else f" (rc {rc})")
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    return "FAIL " + _why(rc, seconds, text, "no JUnit report")


def _why(rc: int, seconds: int, text: str, missing: str) -> str:
    if rc in TIMEOUT_RCS:
        return f"stopped at the step's time limit after {seconds} s (rc {rc}); last line: {_last_line(text)}"
    return f"rc {rc}, {missing}; last line: {_last_line(text)}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(empty log)"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start", help="begin a run: cold or warm, no steps yet")
    start.add_argument("--times", type=Path, required=True)
    start.add_argument("--cache", type=Path, required=True, help="Triton's cache directory")
    step = sub.add_parser("step", help="add one finished step")
    step.add_argument("--times", type=Path, required=True)
    step.add_argument("--name", choices=STEPS, required=True)
    step.add_argument("--rc", type=int, required=True)
    step.add_argument("--seconds", type=int, required=True)
    step.add_argument("--elapsed", type=int, default=None,
                      help="the run's wall seconds so far (steps that overlapped); default: the steps' sum")
    step.add_argument("--log", type=Path, default=None)
    step.add_argument("--junit", type=Path, default=None)
    fin = sub.add_parser("finish", help="set the run's total wall seconds")
    fin.add_argument("--times", type=Path, required=True)
    fin.add_argument("--total", type=int, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "start":
        _write(args.times, {"cold": cache_is_cold(args.cache), "total_s": 0, "steps": []})
        return 0
    data = _read(args.times)
    if args.cmd == "step":
        if args.name == "pytest-cuda":
            verdict = pytest_verdict(args.rc, args.seconds, args.junit, args.log)
        else:
            verdict = gate_verdict(args.rc, args.seconds, args.log)
        data["steps"].append({"name": args.name, "rc": args.rc, "seconds": args.seconds, "verdict": verdict})
        so_far = sum(s["seconds"] for s in data["steps"]) if args.elapsed is None else args.elapsed
        data["total_s"] = max(data["total_s"], so_far)  # until `finish` gives the wall time
    else:
        data["total_s"] = args.total
    _write(args.times, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
