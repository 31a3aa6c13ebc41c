"""Figures of a run (SPEC §9), drawn with the Agg canvas (no display, no pyplot global state).

Per (scenario, family), into `<scenario>-<family>-<metric>.png`:

* `throughput`: tokens/s vs batch per mode, with the p20-p80 band (tokens/s at the p80 and p20
  times), log-x;
* `memory`: bytes per request per mode, predicted and measured bars;
* `speedup`: native median / mode median vs batch, one line per mode and drafts (and any other axis
  that varies), log-x;
* `bandwidth`: achieved GB/s vs batch per mode, with the ceilings measured in the run as dashed lines.

KV page scenarios (cpu-page-restore, pd-roundtrip) get one figure per (scenario, family) instead:

* `page-bandwidth`: achieved GB/s (log) and % of the ceiling vs page chunk bytes (one layer of one
  page, from the row's config), log-x, one line per preset, direction (variant), backend and TP pair
  that varies; the measured ceilings dashed, the goals (90% of pinned memcpy, 80% of d2d) dashed, the
  64 KiB chunk size of the goals dotted, so the small-page cliff shows. A sweep of one page size
  over TP pairs (pd-roundtrip) puts the TP pair on the x axis instead.

What makes them readable (issue 24): each mode variant has one colour and marker in every figure
(results/styles.py), other axes that vary are line styles; a batch axis has ticks at the batches measured
and nothing else; a value axis is logarithmic when the data and the ceilings span more than a decade (a
CPU run's 0.3 GB/s otherwise lay on the zero line under a 27 GB/s ceiling); ceilings are legend entries
with their measured value (three significant digits, never "0 GB/s"), so their labels cannot overlap,
and a per-pair ceiling (pd-roundtrip's link) is a mark at its pair; a legend holds only what is drawn.

A figure's title names what it shows and where it was measured: scenario, family, preset(s),
device(s) and dtypes (state / activation for SSM rows, the KV dtype of page rows), so a PNG copied out
of its run directory still says what it is. A line's label is its mode plus every other key column
that varies inside the figure (backend, preset, drafts, dtypes, ...). A figure with no data to draw is
skipped and the reason returned, never an exception.

Long rollouts also get `drift-<case>.png` (results/drift.py): each mode's RMS ratio to the fp64 reference
per round, per state dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullLocator

from results import styles
from results.drift import drift_figures
from results.schema import KEY, Status
from results.store import Run
from results.tables import _fmt_num, mode_label, mode_order

METRICS = ("throughput", "memory", "speedup", "bandwidth")
PAGE_SCENARIOS = ("cpu-page-restore", "pd-roundtrip")
PAGE_METRICS = ("page-bandwidth",)
GOAL_CHUNK_BYTES = 64 << 10
_MODE_SPECIFIC = ["variant", "history_len", "history_dtype"]  # part of the mode's label (results.tables.mode_label)
# Key columns that are neither the figure (scenario, family), the x axis, nor part of the mode label.
_LABEL_COLUMNS = [c for c in KEY if c not in ("scenario", "family", "mode", "batch", *_MODE_SPECIFIC)]
# Series of one variant (results/styles.py: its colour and marker) that differ in another axis differ by line style.
_STYLES = ["-", "--", ":", "-."]
_CEILING_STYLES = ["--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]
LOG_SPAN = 20.0  # a value axis goes logarithmic when its largest value is more than this times its smallest


def plot_run(run: Run, out_dir: str | Path | None = None) -> dict[str, Path | str]:
    """Write every figure the run has data for; returns file name -> written path or skip reason."""
    out = Path(out_dir) if out_dir is not None else run.path / "figures"
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Path | str] = {}
    df = run.throughput
    for (scenario, family), _ in df.groupby(["scenario", "family"], sort=True):
        for metric in PAGE_METRICS if scenario in PAGE_SCENARIOS else METRICS:
            name = f"{scenario}-{family}-{metric}.png"
            fig = make_figure(df, scenario, family, metric)
            if isinstance(fig, str):
                results[name] = fig
                continue
            fig.savefig(out / name, dpi=120)
            results[name] = out / name
    results.update(drift_figures(run.comparisons, out))
    return results


def make_figure(df: pd.DataFrame, scenario: str, family: str, metric: str) -> Figure | str:
    """The `metric` figure for one (scenario, family) of a throughput frame, or why there is none."""
    if metric not in METRICS + PAGE_METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS + PAGE_METRICS)}")
    rows = df[(df["scenario"] == scenario) & (df["family"] == family)]
    if rows.empty:
        return f"no rows for {scenario}/{family}"
    return _DRAW[metric](rows, figure_title(rows))


def figure_title(rows: pd.DataFrame) -> str:
    """`scenario · family · preset · device · dtypes` of the rows of one figure (values that vary are
    joined with `/`)."""

    def values(column: str) -> str:
        return "/".join(sorted({str(v) for v in rows[column].dropna() if str(v)}))

    parts = [values(c) for c in ("scenario", "family", "preset", "device")]
    state, act = values("state_dtype"), values("act_dtype")
    if state or act:
        parts.append(f"{state or '-'} state, {act or '-'} act")
    else:  # KV page rows: the pages' dtype is in the row's config
        kv = {json.loads(c).get("dtype") for c in rows["config"].dropna() if isinstance(c, str) and c}
        if kv - {None}:
            parts.append("/".join(sorted(kv - {None})) + " KV")
    return " · ".join(p for p in parts if p)


def _throughput(rows: pd.DataFrame, title: str) -> Figure | str:
    rows = _timed(rows, "tokens_per_s")
    if rows.empty:
        return "no passed rows with batch and tokens_per_s"
    fig, ax = _axes(title, "batch", "tokens/s")
    values = []
    for label, style, line in _lines(rows):
        # tokens/s scales as 1 / time, so the p80 time gives the low edge of the band.
        ax.plot(line["batch"], line["tokens_per_s"], label=label, **style)
        lo = line["tokens_per_s"] * line["median_us"] / line["p80_us"]
        hi = line["tokens_per_s"] * line["median_us"] / line["p20_us"]
        ax.fill_between(line["batch"], lo, hi, alpha=0.2, color=style["color"])
        values += [*lo, *hi]
    _value_scale(ax, values)
    return _finish(fig, ax, batches=rows["batch"])


def _memory(rows: pd.DataFrame, title: str) -> Figure | str:
    cols = ["bytes_per_request_predicted", "bytes_per_request_measured"]
    rows = rows[rows[cols].notna().any(axis=1)]
    if rows.empty:
        return "no rows with bytes per request"
    labels, colours, predicted, measured = [], [], [], []
    for label, style, line in _lines(rows, x=None):
        labels.append(label)
        colours.append(style["color"])  # the variant's colour, as in the other figures
        predicted.append(line["bytes_per_request_predicted"].astype("float64").median() / 2**20)
        measured.append(line["bytes_per_request_measured"].astype("float64").median() / 2**20)
    fig, ax = _axes(title, "mode", "MiB per request")
    pos = list(range(len(labels)))
    # a kind of bar only where it has values: checkpoint-restore measures nothing, and its legend said
    # "measured" over no bar. Predicted bars are hatched and pale, measured ones solid.
    kinds = [(name, values, look) for name, values, look in
             (("predicted", predicted, {"alpha": 0.45, "hatch": "//"}), ("measured", measured, {}))
             if any(v == v for v in values)]
    width = 0.8 / len(kinds)
    for k, (name, values, look) in enumerate(kinds):
        offset = (k - (len(kinds) - 1) / 2) * width
        ax.bar([p + offset for p in pos], values, width=width, color=colours, edgecolor="black", linewidth=0.5,
               **look)
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    # one grey swatch per kind drawn (the bars carry their variant's colour)
    ax.legend(handles=[Patch(facecolor="#a6a6a6", edgecolor="black", label=name, **look) for name, _, look in kinds],
              fontsize=8)
    return fig


def _speedup(rows: pd.DataFrame, title: str) -> Figure | str:
    rows = _timed(rows, "median_us")
    native = rows[rows["mode"] == "native"]
    others = rows[rows["mode"].notna() & (rows["mode"] != "native")]
    if native.empty or others.empty:
        return "needs timed native rows and timed rows of another mode"
    match = [c for c in KEY if c not in ["mode", *_MODE_SPECIFIC]]
    base = native[match + ["median_us"]].rename(columns={"median_us": "native_us"})
    paired = others.merge(base, on=match)  # pandas matches empty (NA) keys with each other
    if paired.empty:
        return "no mode row has a native row with the same case key"
    paired["speedup"] = paired["native_us"] / paired["median_us"]
    fig, ax = _axes(title, "batch", "x faster than native (native median / mode median)")
    for label, style, line in _lines(paired):
        ax.plot(line["batch"], line["speedup"], label=label, **style)
    ax.axhline(1.0, color=styles.REFERENCE_GREY, linestyle=":", linewidth=1)
    _value_scale(ax, [*paired["speedup"], 1.0])
    return _finish(fig, ax, batches=paired["batch"])


def _bandwidth(rows: pd.DataFrame, title: str) -> Figure | str:
    rows = _timed(rows, "achieved_gbps")
    if rows.empty:
        return "no passed rows with batch and achieved_gbps"
    fig, ax = _axes(title, "batch", "GB/s")
    for label, style, line in _lines(rows):
        ax.plot(line["batch"], line["achieved_gbps"], label=label, **style)
    ceilings = _ceilings(ax, rows, x="batch")
    _value_scale(ax, [*rows["achieved_gbps"], *ceilings])
    return _finish(fig, ax, batches=rows["batch"])


def ceiling_label(name: str, gbps: float) -> str:
    """A ceiling's legend entry: its name and measured value (a CPU link's 0.3 GB/s is not "0 GB/s")."""
    return f"ceiling {name}: {_fmt_num(gbps)} GB/s"


def _ceilings(ax, rows: pd.DataFrame, *, x: str) -> list[float]:
    """Draw the rows' ceilings as legend entries (labels on the lines overlapped where two ceilings are
    close): one that holds at several x a line across the panel, one that holds at a single x (the link
    ceiling of one PD pair) a wide mark at that x, all such marks one legend entry. Returns the values."""
    rows = rows.dropna(subset=["ceiling_name", "ceiling_gbps"])
    drawn, local = [], []
    for k, (name, group) in enumerate(rows.groupby("ceiling_name", sort=True)):
        gbps = float(group["ceiling_gbps"].max())
        drawn.append(gbps)
        if group[x].nunique() == 1 and rows[x].nunique() > 1:
            local.append((float(group[x].iloc[0]), gbps))
        else:
            ax.axhline(gbps, color="black", linestyle=_CEILING_STYLES[k % len(_CEILING_STYLES)], linewidth=1,
                       label=ceiling_label(name, gbps))
    if local:
        xs, ys = zip(*local)
        ax.plot(xs, ys, linestyle="none", marker="_", markersize=22, markeredgewidth=2, color="black",
                label="ceiling per point: its own link, measured in the same samples")
    return drawn


def _page_bandwidth(rows: pd.DataFrame, title: str) -> Figure | str:
    rows = rows[(rows["status"] == Status.passed.value) & rows["achieved_gbps"].notna()]
    chunk = rows["config"].map(lambda c: json.loads(c).get("chunk_bytes") if isinstance(c, str) and c else None)
    rows = rows.assign(chunk_bytes=chunk).dropna(subset=["chunk_bytes"])
    if rows.empty:
        return "no timed page rows with chunk_bytes in their config"
    pair = rows["tp_prefill"].astype(str) + " -> " + rows["tp_decode"].astype(str)
    # One page size over many TP pairs (a pd-roundtrip sweep): the TP pair is the x axis instead.
    by_pair = rows["chunk_bytes"].nunique() == 1 and pair.nunique() > 1
    if by_pair:
        pairs = sorted(pair.unique(), key=lambda v: tuple(int(t) for t in v.split(" -> ")))
        rows = rows.assign(x=pair.map(pairs.index))
        xlabel = f"TP pair prefill -> decode (page chunk {_kib(rows['chunk_bytes'].iloc[0], 0)})"
        parts = ["preset", "direction", "backend"]
    else:
        rows = rows.assign(x=rows["chunk_bytes"])
        xlabel = "page chunk bytes (one layer of one page; dotted: 64 KiB)"
        parts = ["preset", "direction", "backend", "tp_prefill", "tp_decode"]
    fig = Figure(figsize=(13, 5), layout="constrained")
    FigureCanvasAgg(fig)
    gbps_ax, pct_ax = fig.subplots(1, 2)
    fig.suptitle(f"{title}: bandwidth vs {'TP pair' if by_pair else 'page chunk bytes'}")
    varying = [c for c in parts if rows[c].nunique(dropna=False) > 1] or parts[:1]
    groups = []
    for key, line in rows.groupby(varying, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        groups.append((" ".join(f"tp {v}" if c.startswith("tp_") else str(v) for c, v in zip(varying, key)), line))
    look = styles.assign(label for label, _ in groups)
    for label, line in groups:
        line = line.sort_values("x")
        gbps_ax.plot(line["x"], line["achieved_gbps"], label=label, **look[label].kwargs())
        if line["ceiling_pct"].notna().any():
            pct_ax.plot(line["x"], line["ceiling_pct"], label=f"{label} vs {_versus(line)}", **look[label].kwargs())
    ceilings = _ceilings(gbps_ax, rows, x="x")
    for goal in (90, 80):  # the goals: host transfers >= 90% of pinned memcpy, device >= 80% of d2d
        pct_ax.axhline(goal, color=styles.REFERENCE_GREY, linestyle="--", linewidth=1)
    gbps_ax.set_yscale("log")  # PCIe (tens of GB/s), device (TB/s) and a CPU link (< 1 GB/s) rows share it
    _value_scale(pct_ax, [*rows["ceiling_pct"].dropna(), 80.0, 90.0])
    for ax, ylabel in ((gbps_ax, "GB/s (log)"), (pct_ax, "% of the ceiling measured in the run")):
        if by_pair:
            ax.set_xticks(range(len(pairs)), pairs, rotation=45, ha="right", fontsize=8)
        else:
            ax.axvline(GOAL_CHUNK_BYTES, color=styles.REFERENCE_GREY, linestyle=":", linewidth=1)
            ax.set_xscale("log", base=2)
            _ticks_at(ax, rows["x"], FuncFormatter(_kib))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def _versus(line: pd.DataFrame) -> str:
    """What a line's % is of: its one ceiling, or, where each point has its own (the link ceiling of each
    PD pair), what they have in common. The legend named the first point's ceiling for all of them."""
    names = list(dict.fromkeys(line["ceiling_name"].dropna()))
    if len(names) == 1:
        return names[0]
    if all(n.startswith("link-") for n in names):
        return f"each pair's {names[0].split(' ')[0]} ceiling"
    return f"{len(names)} ceilings ({', '.join(names)})"


def _kib(value: float, _pos: int) -> str:
    return f"{value / 2**20:g} MiB" if value >= 2**20 else f"{value / 2**10:g} KiB"


_DRAW = {"throughput": _throughput, "memory": _memory, "speedup": _speedup, "bandwidth": _bandwidth,
         "page-bandwidth": _page_bandwidth}


def _timed(rows: pd.DataFrame, value: str) -> pd.DataFrame:
    rows = rows[rows["status"] == Status.passed.value]
    return rows.dropna(subset=["batch", value, "median_us", "p20_us", "p80_us"])


def _lines(rows: pd.DataFrame, x: str | None = "batch"):
    """(label, style, rows sorted by x) per line: the mode label plus the label columns that vary in `rows`."""
    varying = [c for c in _LABEL_COLUMNS if rows[c].nunique(dropna=False) > 1]
    labels = pd.Series(
        [" ".join([mode_label(r), *(f"{c}={getattr(r, c)}" for c in varying if not pd.isna(getattr(r, c)))])
         for r in rows.itertuples()],
        index=rows.index,
    )  # fmt: skip
    keys = pd.Series([styles.key(r.mode, getattr(r, "variant", None), r.backend) for r in rows.itertuples()],
                     index=rows.index)
    ordered = sorted(labels.unique(), key=mode_order)
    look = styles.assign(keys[labels == label].iloc[0] for label in ordered)
    seen: dict[str, int] = {}
    for label in ordered:
        line = rows[labels == label]
        name = keys[line.index[0]]
        style = {**look[name].kwargs(), "linestyle": _STYLES[seen.get(name, 0) % len(_STYLES)]}
        seen[name] = seen.get(name, 0) + 1
        yield label, style, (line.sort_values(x) if x else line)


def _axes(title: str, xlabel: str, ylabel: str):
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _finish(fig: Figure, ax, *, batches: pd.Series | None = None) -> Figure:
    """A batch x axis (log 2) with ticks at the measured batches only (ticks 2, 4, 8 stood around data at
    4 alone); the legend."""
    if batches is not None:
        ax.set_xscale("log", base=2)
        _ticks_at(ax, batches, FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.legend(fontsize=8)
    return fig


def _ticks_at(ax, values: pd.Series, formatter) -> None:
    xs = sorted({float(v) for v in values.dropna()})
    ax.set_xticks(xs)
    ax.xaxis.set_major_formatter(formatter)
    ax.xaxis.set_minor_locator(NullLocator())
    if len(xs) == 1:  # one batch: a margin around it, not a decade either side
        ax.set_xlim(xs[0] / 1.5, xs[0] * 1.5)


def _value_scale(ax, values) -> None:
    """Logarithmic when the values (data, bands, ceilings) span more than LOG_SPAN, so none of them lies on
    the zero line; linear otherwise."""
    positive = [float(v) for v in values if v == v and float(v) > 0]
    if positive and max(positive) > LOG_SPAN * min(positive):
        ax.set_yscale("log")
