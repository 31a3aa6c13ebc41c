"""The modes of a run side by side, and the short markdown table a README quotes from it.

`modes_side_by_side(df)` puts the modes of one case next to each other: one row per case (every key
column except the mode and its replay-only axes), columns `(metric, mode label)`, plus a `speedup`
metric with native as the baseline (native median / mode median, when both were timed), shown as
"x faster than native": 2.00x is twice as fast as native, 0.50x half as fast. `formatted` turns it into display strings. The compare-modes notebook shows it
whole; `headline_markdown(run)` quotes a few of its columns under one line naming the run:

    run `20261202T153045Z-mtp-fixed-a1b2c3` · NVIDIA H200 (132 SMs) · `harness run mtp-fixed ...`

    | scenario | preset | state/act dtype | batch | drafts | native us | compact us | compact: x faster than native | ...

`python -m results.headline RUN [--scenario NAME]` prints it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pandas as pd

from results.schema import KEY, Status, is_blank
from results.store import Run, load_run
from results.tables import MODE_AXES, SPEEDUP, _fmt_bytes, _fmt_num, _fmt_si, _fmt_us, mode_label, mode_order

# The modes of one case share every key column except these.
CASE = [c for c in KEY if c not in ("mode", "variant", *MODE_AXES)]
METRICS = [
    "status", "median_us", "p20_us", "p80_us", "speedup", "tokens_per_s", "achieved_gbps", "ceiling_pct",
    "bytes_per_request_predicted", "bytes_per_request_measured",
]  # fmt: skip
LABELS = {
    "median_us": "median us", "p20_us": "p20 us", "p80_us": "p80 us", "speedup": SPEEDUP,
    "tokens_per_s": "tokens/s", "achieved_gbps": "GB/s", "ceiling_pct": "% ceiling",
    "bytes_per_request_predicted": "bytes/req predicted", "bytes_per_request_measured": "bytes/req measured",
}  # fmt: skip
# The same number formats as `harness report` (results.tables).
_FORMATS: dict[str, Callable[[float], str]] = {
    "status": str, "median_us": _fmt_us, "p20_us": _fmt_us, "p80_us": _fmt_us, "speedup": lambda x: f"{x:.2f}x",
    "tokens_per_s": _fmt_si, "achieved_gbps": _fmt_num, "ceiling_pct": lambda x: f"{_fmt_num(x)}%",
    "bytes_per_request_predicted": _fmt_bytes, "bytes_per_request_measured": _fmt_bytes,
}  # fmt: skip
# Always in the headline, even when constant, so a quoted table says what it measured.
HEADLINE_CASE = ["scenario", "preset", "state_dtype", "act_dtype", "batch", "drafts"]
_TITLES = {
    "median_us": "{mode} us", "speedup": "{mode}: " + SPEEDUP, "ceiling_pct": "{mode} % {ceiling}",
    "bytes_per_request_measured": "{mode} bytes/req",
}  # fmt: skip


def modes_side_by_side(df: pd.DataFrame) -> pd.DataFrame:
    """Throughput rows as one row per case (index: `CASE`), columns `(metric, mode label)` in `METRICS` order."""
    labelled = df.assign(mode_label=[mode_label(r) for r in df.itertuples()])
    measured = [m for m in METRICS if m != "speedup"]
    wide = labelled.set_index(CASE + ["mode_label"])[measured].unstack("mode_label")
    modes = sorted(labelled["mode_label"].unique(), key=mode_order)
    columns: dict[tuple[str, str], pd.Series] = {}
    for metric in METRICS:
        if metric != "speedup":
            columns.update({(metric, m): wide[(metric, m)] for m in modes})
        elif "native" in modes:
            native = wide[("median_us", "native")]
            columns.update({(metric, m): native / wide[("median_us", m)] for m in modes if m != "native"})
    out = pd.DataFrame(columns, index=wide.index)
    out.columns = out.columns.set_names(["metric", "mode"])
    return out


def formatted(wide: pd.DataFrame, metrics: list[str] | None = None) -> pd.DataFrame:
    """`modes_side_by_side` output (the `metrics` columns, all by default) as display strings.

    A mode that did not pass shows its status (`OOM`, `MISMATCH`, ...) in place of its median time.
    """
    keep = wide.columns.get_level_values("metric").isin(metrics or METRICS)
    cells = pd.DataFrame(index=wide.index, columns=wide.columns[keep], dtype=object)
    for metric, mode in cells.columns:
        fmt = _FORMATS[metric]
        cells[(metric, mode)] = ["-" if is_blank(x) else fmt(x) for x in wide[(metric, mode)]]
        if metric == "median_us":
            status = wide[("status", mode)]
            failed = status.notna() & (status != Status.passed.value)
            cells.loc[failed, (metric, mode)] = status[failed].str.upper()
    return cells


def headline_markdown(run: Run, scenario: str | None = None) -> str:
    """A line naming the run (id, GPU, command), then one markdown table row per case of `run`.

    Columns: scenario, preset, state/act dtype, batch, drafts (and any other key column that varies),
    then per mode: median us, x faster than native, % of the ceiling measured in the run, bytes per
    request (measured).

    Raises:
        ValueError: `scenario` is given and the run has no row of it.
    """
    df = run.throughput
    if scenario is not None:
        df = df[df["scenario"] == scenario]
        if df.empty:
            have = ", ".join(sorted(run.throughput["scenario"].unique()))
            raise ValueError(f"run {run.run_id} has no {scenario} rows; it has {have}")
    wide = modes_side_by_side(df)
    cells = formatted(wide, ["median_us", "speedup", "ceiling_pct", "bytes_per_request_measured"])
    cases = wide.index.to_frame(index=False)
    varying = [c for c in CASE if c not in HEADLINE_CASE and cases[c].nunique(dropna=False) > 1]
    ceiling = "/".join(sorted(df["ceiling_name"].dropna().unique())) or "ceiling"
    header = ["scenario", "preset", "state/act dtype", "batch", "drafts", *varying]
    header += [_TITLES[metric].format(mode=mode, ceiling=ceiling) for metric, mode in cells.columns]
    lines = [_run_line(run), "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for case, row in zip(cases.to_dict("records"), cells.itertuples(index=False)):
        ident = [case["scenario"], case["preset"], f"{case['state_dtype']}/{case['act_dtype']}", case["batch"]]
        ident += [case["drafts"], *(case[c] for c in varying)]
        lines.append("| " + " | ".join(["-" if is_blank(v) else str(v) for v in ident] + list(row)) + " |")
    return "\n".join(lines) + "\n"


def _run_line(run: Run) -> str:
    m = run.manifest
    if m.get("gpu_name"):
        device = f"{m['gpu_name']} ({m.get('sm_count')} SMs)"
    else:
        device = f"CPU ({m.get('host', '?')}), wall-clock timings"
    return f"run `{run.run_id}` · {device} · `{m.get('command', '')}`"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m results.headline", description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run directory (results/runs/<run-id> or results/reference/<run-id>)")
    parser.add_argument("--scenario", help="only this scenario's rows")
    args = parser.parse_args(argv)
    try:
        print(headline_markdown(load_run(args.run), args.scenario), end="")
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))  # one line and exit code 2, like the harness CLI


if __name__ == "__main__":
    main()
