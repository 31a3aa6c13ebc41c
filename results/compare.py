"""Compare two runs row by row from their timing spread, not a bare ratio (SPEC §9 `harness compare`).

Rows match on the case key (`results.schema.KEY`: scenario, family, mode, backend, preset, device
and every shape axis). Run A is the baseline; the verdict says what B is:

* `faster` / `slower`: the p20-p80 intervals are separated (B's p80 below A's p20, or B's p20
  above A's p80);
* `same`: the intervals overlap and the medians differ by no more than the larger noise of the two;
* `ambiguous`: the intervals overlap but the medians differ by more than the noise; or a side was timed
  with the CPU wall clock (`cpu-wall`) and the intervals are separated: a CPU run's p20-p80 spread says how
  steady it was within itself, not how far the next run on a shared machine lands (two back-to-back runs
  of the same code came out "0.48x slower"), so only `same` is a verdict there;
* `untimed`: a side has no timing (not passed, or passed without timing); the statuses say why;
* `only-a` / `only-b`: the case ran in one run only.

`speedup` = A's median / B's median (> 1: B is faster), given only for same / faster / slower.

Two runs that share no case at all (different scenarios, presets, devices, ...) have nothing to
compare: `no_common_case` says so in one line, naming what each run holds, and `harness compare`
exits with code 2 instead of listing every row as one-sided.
"""

from __future__ import annotations

import pandas as pd

from results.schema import KEY
from results.store import Run
from results.tables import TableData

VERDICTS = ("same", "faster", "slower", "ambiguous", "untimed", "only-a", "only-b")
CPU_WALL = "cpu-wall"  # harness.timing's CPU timer: no run-to-run verdict beyond `same` (module docstring)
_SIDE = ["status", "reason", "timer", "median_us", "p20_us", "p80_us", "noise_pct"]


def compare_runs(run_a: Run, run_b: Run) -> pd.DataFrame:
    """One row per case in either run: the key, each side's status and timing (`_a`, `_b`), verdict, speedup."""
    a, b = (_keyed(run.throughput) for run in (run_a, run_b))
    merged = a.merge(b, on="_key", how="outer", suffixes=("_a", "_b"), indicator=True)
    for col in KEY:
        merged[col] = merged[f"{col}_a"].combine_first(merged[f"{col}_b"])
    merged["verdict"] = [_verdict(r) for r in merged.to_dict("records")]
    timed = merged["verdict"].isin(["same", "faster", "slower"])
    merged["speedup"] = (merged["median_us_a"] / merged["median_us_b"]).where(timed)
    side = [f"{c}_{s}" for c in _SIDE for s in ("a", "b")]
    return merged[KEY + side + ["verdict", "speedup"]].sort_values(KEY, na_position="first").reset_index(drop=True)


def no_common_case(run_a: Run, run_b: Run, compared: pd.DataFrame) -> None:
    """ValueError (one line) when `compared` (from `compare_runs`) matched no case of A with one of B."""
    if (~compared["verdict"].isin(["only-a", "only-b"])).any():
        return
    raise ValueError(f"{run_a.run_id} and {run_b.run_id} share no case, so there is nothing to compare: "
                     f"A has {_holds(run_a)}; B has {_holds(run_b)}")


def _holds(run: Run) -> str:
    df = run.throughput
    parts = []
    for column in ("scenario", "preset", "device", "backend", "batch"):
        values = sorted({str(v) for v in df[column].dropna()})
        if values:
            parts.append(f"{column} {','.join(values)}")
    return " ".join(parts) or "no rows"


def comparison_table(df: pd.DataFrame, title: str = "compare") -> TableData:
    """`compare_runs` output as a table: case, A and B median (p20-p80), verdict, speedup."""
    shown = [c for c in KEY if df[c].notna().any()]
    rows = []
    for r in df.to_dict("records"):
        case = " ".join(f"{c}={r[c]}" for c in shown if not pd.isna(r[c]))
        speedup = "-" if pd.isna(r["speedup"]) else f"{r['speedup']:.3f}x"
        rows.append([case, _side(r, "a"), _side(r, "b"), r["verdict"], speedup])
    return TableData(title, ["case", "A us (p20-p80)", "B us (p20-p80)", "verdict", "B speedup"], rows)


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    # Empty axes must match empty axes, so the key is built from strings with blanks as "".
    keyed = df[KEY + _SIDE].copy()
    blanked = keyed[KEY].astype("string").fillna("")
    keyed["_key"] = ["\x1f".join(values) for values in blanked.itertuples(index=False)]
    return keyed


def _verdict(r: dict) -> str:
    if r["_merge"] == "left_only":
        return "only-a"
    if r["_merge"] == "right_only":
        return "only-b"
    if any(pd.isna(r[f"{c}_{s}"]) for c in ("median_us", "p20_us", "p80_us") for s in ("a", "b")):
        return "untimed"
    separated = "faster" if r["p80_us_b"] < r["p20_us_a"] else "slower" if r["p20_us_b"] > r["p80_us_a"] else None
    if separated is not None:
        return "ambiguous" if CPU_WALL in (r["timer_a"], r["timer_b"]) else separated
    noise = max(_zero_if_na(r["noise_pct_a"]), _zero_if_na(r["noise_pct_b"]))
    change_pct = abs(r["median_us_b"] - r["median_us_a"]) / r["median_us_a"] * 100
    return "same" if change_pct <= noise else "ambiguous"


def _side(r: dict, s: str) -> str:
    if pd.isna(r[f"median_us_{s}"]):
        return "-" if pd.isna(r[f"status_{s}"]) else str(r[f"status_{s}"])
    return f"{r[f'median_us_{s}']:.2f} ({r[f'p20_us_{s}']:.2f}-{r[f'p80_us_{s}']:.2f})"


def _zero_if_na(x: object) -> float:
    return 0.0 if pd.isna(x) else float(x)
