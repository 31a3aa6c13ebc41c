"""Print the rows of run directories as one table per run: batch down, `mode-variant/backend` across, the
median microseconds of a passed row or its status (`oom`, `unsupported`, `mismatch`, ...). What the GPU
scripts print last (scripts/gpu_ab.sh, scripts/gpu_advise_sweep.sh), so a call's reply shows its rows.

Usage: python3 scripts/print_rows.py RUN_OR_FOLDER... (a run directory, or a folder of them; autotune runs
and unfinished `.partial` runs are skipped)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def runs(paths: list[str]) -> list[Path]:
    """The run directories under `paths` (each a run or a folder of runs), in name order."""
    found = []
    for p in map(Path, paths):
        found += [p] if (p / "throughput.csv").is_file() else sorted(d for d in p.iterdir() if d.is_dir())
    return [r for r in found if (r / "throughput.csv").is_file() and not r.name.endswith(".partial")
            and "autotune" not in r.name]


def table(csv: Path) -> tuple[str, str]:
    """A run's title line and its batch x mode table."""
    t = pd.read_csv(csv)
    t["mode"] = (t["mode"] + "-" + t["variant"].fillna("")).str.rstrip("-") + "/" + t["backend"]
    t["cell"] = t["median_us"].map("{:.0f}".format).where(t["status"] == "passed", t["status"])
    title = f"{csv.parent.name}: {t['scenario'][0]} drafts {t['drafts'][0]} {t['state_dtype'][0]} (median us or status)"
    return title, t.pivot_table(index="batch", columns="mode", values="cell", aggfunc="first").to_string()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: print_rows.py RUN_OR_FOLDER...", file=sys.stderr)
        return 2
    for run in runs(argv):
        title, body = table(run / "throughput.csv")
        print(f"-- {title}\n{body}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
