"""Throughput tables of a run, as markdown and as rich tables (SPEC §9 `harness report`).

Rows are grouped by (scenario, family, preset, backend, device, dtypes); shape axes that are
constant in a group go into its title, the ones that vary are the row keys. Each group gets:

* a summary: one row per shape, one column per mode with the median time (p20-p80), native first
  as the baseline column, and for each other mode a `<mode>: x faster than native` column (native
  median / mode median, only when both passed and were timed: 2.00x is twice as fast as native,
  0.50x half as fast); a row that did not pass shows its status; in a group of our backends (triton,
  torch) with peers' rows beside it (baselines: fla, sglang, flashinfer), also a
  `<mode>: x faster than best peer` column per mode a peer ran: the fastest passed peer row of the same
  mode and shape over ours, naming the peer (`1.12x (flashinfer)`);
* details: one row per shape and mode with median (p20-p80), noise, tokens/s, achieved GB/s,
  % of the ceiling measured in the run, bytes per request predicted and measured, and the status
  with its reason.

Replay-only axes (history length and dtype) label the mode (`replay (Lh 8, bf16 history)`)
instead of splitting rows. Detail columns with nothing to show are dropped.

Above the tables: a device header (GPU, code version, measured ceilings, timers, equivalence
verdict); below them: a log of noisy rows (noise above 2%): one line per GPU row, and one line for
all the CPU rows of a run (CPU wall-clock timings on a shared machine are noisy as a rule, so a line
per row would bury the tables).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from results.schema import OUR_BACKENDS, Status, is_blank
from results.store import Run

MODE_ORDER = ("native", "compact", "replay")
GROUP_BY = ["scenario", "family", "preset", "backend", "device", "state_dtype", "act_dtype"]
ROW_AXES = ["batch", "drafts", "width", "accept", "layers", "tp_prefill", "tp_decode", "page_size", "direction"]
MODE_AXES = {"history_len": "Lh {}", "history_dtype": "{} history"}
NOISE_WARN_PCT = 2.0
SPEEDUP = "x faster than native"  # a ratio native median / mode median, so > 1 is faster than native
PEER_SPEEDUP = "x faster than best peer"  # best peer median / our median, same mode and shape


@dataclass
class TableData:
    """A rendered-to-strings table: a title, column headers and rows of cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |", "|" + " --- |" * len(self.columns)]
        lines += ["| " + " | ".join(cells) + " |" for cells in self.rows]
        return "\n".join(lines)

    def to_rich(self) -> Table:
        table = Table(title=self.title, title_justify="left")
        for i, name in enumerate(self.columns):
            table.add_column(name, justify="left" if i == 0 else "right")
        for cells in self.rows:
            table.add_row(*cells)
        return table


def throughput_tables(df: pd.DataFrame) -> list[TableData]:
    """Per (scenario, family, preset, backend, device, dtypes) group: a summary table, then its details."""
    tables = []
    group_cols = [c for c in GROUP_BY if df[c].notna().any()]
    peer_rows = df[~df["backend"].isin(OUR_BACKENDS) & (df["status"] == Status.passed.value) & df["median_us"].notna()]
    for key, group in df.groupby(group_cols, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        peers = peer_rows.iloc[0:0]
        if "backend" in group_cols and key[group_cols.index("backend")] in OUR_BACKENDS:
            same = [c for c in group_cols if c != "backend"]
            match = pd.Series(True, index=peer_rows.index)
            for c in same:
                value = key[group_cols.index(c)]
                match &= peer_rows[c].isna() if is_blank(value) else peer_rows[c] == value
            peers = peer_rows[match]
        parts = [str(v) for v in key if not is_blank(v)]
        present = [c for c in ROW_AXES if group[c].notna().any()]
        axes = [c for c in present if group[c].nunique(dropna=False) > 1] or present[:1]
        parts += [_fmt_axis(c, group[c].iloc[0]) for c in present if c not in axes]  # constant axes
        title = " · ".join(parts)
        group = group.assign(variant_label=[mode_label(r) for r in group.itertuples()])
        tables += [_summary(title, group, axes, peers), _details(f"{title} · details", group, axes)]
    return tables


def _summary(title: str, group: pd.DataFrame, axes: list[str], peers: pd.DataFrame | None = None) -> TableData:
    """Rows: shapes; columns: each mode's median (p20-p80), how many times faster than native the other
    modes are, and (where `peers` has rows of the mode) how many times faster than the best peer row."""
    variants = sorted(group["variant_label"].unique(), key=mode_order)
    baseline = "native" if "native" in variants else None
    peers = group.iloc[0:0] if peers is None else peers
    mode_of = {r.variant_label: r.mode for r in group.itertuples()}
    peer_modes = set(peers["mode"].dropna())
    columns = list(axes)
    for v in variants:
        columns.append("us" if v == "-" else f"{v} us")  # "-": rows without a mode (KV pages)
        if baseline and v != baseline:
            columns.append(f"{v}: {SPEEDUP}")
        if mode_of.get(v) in peer_modes:
            columns.append(f"{v}: {PEER_SPEEDUP}")
    rows = []
    for values, shape in _by_shape(group, axes):
        by_variant = {r.variant_label: r for r in shape.itertuples()}
        base = by_variant.get(baseline)
        cells = [_fmt_value(v) for v in values]
        for v in variants:
            row = by_variant.get(v)
            cells.append("-" if row is None else _time_cell(row))
            if baseline and v != baseline:
                cells.append(_speedup(base, row))
            if mode_of.get(v) in peer_modes:
                cells.append(_peer_speedup(_best_peer(peers, axes, values, mode_of[v]), row))
        rows.append(cells)
    return TableData(title, columns, rows)


def _best_peer(peers: pd.DataFrame, axes: list[str], values: tuple, mode: str):
    """The fastest passed peer row of `mode` at the shape `values` of `axes`, or None."""
    match = peers["mode"] == mode
    for axis, value in zip(axes, values, strict=True):
        match &= peers[axis].isna() if is_blank(value) else peers[axis] == value
    rows = peers[match]
    return None if rows.empty else rows.loc[rows["median_us"].idxmin()]


def _peer_speedup(peer, row) -> str:
    """`1.12x (flashinfer)`: the best peer's median over ours, naming the peer and its variant."""
    if peer is None or row is None or row.status != Status.passed.value or is_blank(row.median_us):
        return "-"
    name = " ".join(str(x) for x in (peer["backend"], peer["variant"]) if not is_blank(x))
    return f"{peer['median_us'] / row.median_us:.2f}x ({name})"


def _details(title: str, group: pd.DataFrame, axes: list[str]) -> TableData:
    """One row per shape and mode with every metric; a non-passed row's status and reason."""
    columns = axes + [
        "mode", "us (p20-p80)", "noise", "tok/s", "GB/s", "% ceiling", "bytes/req predicted", "bytes/req measured",
        "status",
    ]  # fmt: skip
    rows = []
    for values, shape in _by_shape(group, axes):
        for r in sorted(shape.itertuples(), key=lambda r: mode_order(r.variant_label)):
            passed = r.status == Status.passed.value
            rows.append([
                *(_fmt_value(v) for v in values),
                r.variant_label,
                _time_cell(r) if passed else "-",
                _fmt_pct(r.noise_pct),
                _fmt_si(r.tokens_per_s),
                _fmt_num(r.achieved_gbps),
                "-" if is_blank(r.ceiling_pct) else f"{_fmt_num(r.ceiling_pct)}% {r.ceiling_name}",
                _fmt_bytes(r.bytes_per_request_predicted),
                _fmt_bytes(r.bytes_per_request_measured),
                "passed" if passed else f"{str(r.status).upper()}: {r.reason}",
            ])  # fmt: skip
    always = {*axes, "mode", "status"}
    keep = [i for i, name in enumerate(columns) if name in always or any(row[i] != "-" for row in rows)]
    return TableData(title, [columns[i] for i in keep], [[row[i] for i in keep] for row in rows])


def _by_shape(group: pd.DataFrame, axes: list[str]):
    """(axis values, rows) per shape, in axis order."""
    if not axes:
        yield (), group
        return
    for values, shape in group.groupby(axes, dropna=False, sort=True):
        yield (values if isinstance(values, tuple) else (values,)), shape


def _time_cell(row) -> str:
    if row.status != Status.passed.value:
        return str(row.status).upper()
    if is_blank(row.median_us):
        return "passed (untimed)"
    return f"{_fmt_us(row.median_us)} ({_fmt_us(row.p20_us)}-{_fmt_us(row.p80_us)})"


def _speedup(base, row) -> str:
    if base is None or row is None or is_blank(base.median_us) or is_blank(row.median_us):
        return "-"
    return f"{base.median_us / row.median_us:.2f}x"


def header_lines(run: Run) -> list[str]:
    """The device / code / ceilings / timers / equivalence summary of a run."""
    m = run.manifest
    if m.get("gpu_name"):
        device = f"{m['gpu_name']} ({m.get('sm_count')} SMs), driver {m.get('driver')}, CUDA {m.get('cuda')}"
    else:
        device = f"CPU ({m.get('host', '?')}): timings are CPU wall-clock, for correctness runs, not GPU performance"
    dirty = " (dirty)" if m.get("git_dirty") else ""
    sha = (m.get("git_sha") or "unknown")[:12]
    code = f"git {sha}{dirty}, torch {m.get('torch')}, triton {m.get('triton')}"
    if m.get("triton_interpret"):
        code += ", TRITON_INTERPRET=1"
    ceilings = ", ".join(
        f"{name} {c['gbps']:.1f} GB/s" for name, c in (m.get("ceilings") or {}).items()
    ) or "none measured"  # fmt: skip
    df = run.throughput
    timed = df[df["timer"].notna()]
    timers = ", ".join(
        f"{t} ({int(n)} samples)" for (t, n), _ in timed.groupby(["timer", "samples"])
    ) or "no timed rows"  # fmt: skip
    equivalence = run.equivalence_report().summary() if run.comparisons else "no comparisons recorded"
    return [
        f"run {run.run_id}: `{m.get('command', '')}`",
        f"device: {device}",
        f"code: {code}",
        f"ceilings (measured in this run): {ceilings}",
        f"timers: {timers}",
        f"equivalence: {equivalence}",
    ]


def noisy_rows(df: pd.DataFrame, threshold_pct: float = NOISE_WARN_PCT) -> pd.DataFrame:
    """Passed rows whose noise exceeds `threshold_pct`."""
    return df[(df["status"] == Status.passed.value) & (df["noise_pct"] > threshold_pct)]


def log_lines(df: pd.DataFrame, threshold_pct: float = NOISE_WARN_PCT) -> list[str]:
    """Warnings about noisy rows: one per GPU row, one for all the CPU (`cpu-wall`) rows together."""
    noisy = noisy_rows(df, threshold_pct)
    cpu = noisy[noisy["timer"] == "cpu-wall"]
    lines = [f"Warn: {_row_name(r)}: noise {r.noise_pct:.1f}% > {threshold_pct:g}%"
             for r in noisy[noisy["timer"] != "cpu-wall"].itertuples()]
    if not cpu.empty:
        timed = int((df["timer"] == "cpu-wall").sum())
        worst = cpu.loc[cpu["noise_pct"].idxmax()]
        lines.append(f"Warn: {len(cpu)} of {timed} CPU-timed rows have noise above {threshold_pct:g}% (worst "
                     f"{worst['noise_pct']:.1f}%, {_row_name(worst)}); CPU wall-clock timings are for "
                     "correctness runs, time on a GPU to compare modes")
    return lines


def _row_name(r) -> str:
    """`scenario/family/mode/backend axis=value ...` of a row (a named tuple or a Series)."""
    get = r.get if isinstance(r, pd.Series) else (lambda c: getattr(r, c))
    where = " ".join(_fmt_axis(a, get(a)) for a in ROW_AXES if not is_blank(get(a)))
    what = "/".join(str(get(c)) for c in ("scenario", "family", "mode", "backend") if not is_blank(get(c)))
    return f"{what} {where}"


def render_markdown(run: Run) -> str:
    parts = ["# Throughput", ""] + [f"- {line}" for line in header_lines(run)]
    for table in throughput_tables(run.throughput):
        parts += ["", table.to_markdown()]
    log = log_lines(run.throughput)
    parts += ["", "## Log", ""] + ([f"- {line}" for line in log] or ["- no row above the noise threshold"])
    return "\n".join(parts) + "\n"


def print_table(console: Console, table: Table) -> None:
    """Print `table` whole. On a terminal rich fits it to the window; into a file or a pipe the console is
    160 columns wide, and a table that needs more had its headers cut with an ellipsis mid-word. There it
    is printed at the narrowest width (from 160 up) at which rich cuts no word: a wide line in a log beats
    a lost header. Rich's own minimum width does not do: it shares a shortfall evenly over the columns."""
    width = console.width
    if not console.is_terminal:
        most = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
        while width < most and any(ELLIPSIS in line for line in _lines_at(console, table, width)):
            width = min(most, width + 4)
    if width == console.width:
        console.print(table)
        return
    narrow, console.width = console.width, width  # print(width=) can only narrow
    try:
        console.print(table)
    finally:
        console.width = narrow


ELLIPSIS = "\u2026"  # what rich puts where it cut a word


def _lines_at(console: Console, table: Table, width: int) -> list[str]:
    return ["".join(seg.text for seg in line) for line in console.render_lines(table, console.options.update_width(width))]


def render_rich(run: Run, console: Console | None = None) -> None:
    console = console or Console()
    for line in header_lines(run):
        console.print(line, markup=False, highlight=False)
    for table in throughput_tables(run.throughput):
        print_table(console, table.to_rich())
    for line in log_lines(run.throughput):
        console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)  # one line in a log


def mode_label(row) -> str:
    """A row's mode with its replay-only axes, e.g. `replay (Lh 8, bf16 history)`; `-` for no mode."""
    mode = "-" if is_blank(row.mode) else str(row.mode)
    if not is_blank(getattr(row, "variant", None)):
        mode = f"{mode}-{row.variant}"
    extra = [fmt.format(getattr(row, axis)) for axis, fmt in MODE_AXES.items() if not is_blank(getattr(row, axis))]
    return f"{mode} ({', '.join(extra)})" if extra else mode


def mode_order(variant: str) -> tuple[int, str]:
    """Sort key: native, compact, replay, then anything else."""
    mode = variant.split(" ")[0]
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), variant)


def _fmt_axis(axis: str, value: object) -> str:
    return f"{axis}={_fmt_value(value)}"


def _fmt_value(value: object) -> str:
    return "-" if is_blank(value) else str(value)


def _fmt_us(x: float) -> str:
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _fmt_num(x: float) -> str:
    """Three significant digits below 1000 (small CPU-run bandwidths stay readable), whole numbers above."""
    if is_blank(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _fmt_pct(x: float) -> str:
    return "-" if is_blank(x) else f"{x:.1f}%"


def _fmt_si(x: float) -> str:
    if is_blank(x):
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{suffix}"
    return f"{x:.1f}"


def _fmt_bytes(x: object) -> str:
    if is_blank(x):
        return "-"
    value = float(x)
    for scale, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {suffix}"
    return f"{value:.0f} B"
