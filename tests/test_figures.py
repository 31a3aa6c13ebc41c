"""Figures a person can read (issue 24 item 5), checked on each figure kind drawn from small real runs: one
colour and marker per variant, the same in every figure; batch ticks where the data is; a value scale the
data needs; no legend entry without something drawn; ceiling labels equal to the ceilings the manifest
holds, per-pair ceilings at their pair; drift (run figure and the notebook's) plotted at the rounds compared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator
from typer.testing import CliRunner

from harness.cli import app
from results import styles
from results.drift import drift_figures, figure, series_rounds
from results.plots import make_figure
from results.store import Run, load_run
from results.tables import _fmt_num

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
QUICK = ["--warmup", "0", "--rep", "3"]
RUNS = {
    "mtp-fixed": ["run", "mtp-fixed", "--rounds", "2", "--batch", "2,4", *QUICK],
    "decode": ["run", "decode", "--rounds", "32", "--batch", "2", "--modes", "native,replay", "--replay-forward",
               "inline", "--history-len", "4", *QUICK],
    "checkpoint-restore": ["run", "checkpoint-restore", "--batch", "2", "--rounds", "9", "--drafts", "2",
                           "--history-len", "4", *QUICK],
    "pd-dist": ["run", "pd-roundtrip", "--transport", "dist", "--nproc", "2", "--page-tokens", "16", "--pages", "1",
                *QUICK],
    "cpu-pages": ["run", "cpu-page-restore", "--page-size", "16,64", "--pages", "2", *QUICK],
}


def _run(name: str, out: Path, monkeypatch) -> Run:
    """Run RUNS[name] into `out` (each test builds the one run it reads: under xdist a shared fixture
    would be built again on every worker)."""
    from harness import env

    measure = env.measure_ceilings  # over 1 MiB: the ceiling's value is what is checked, not its size
    monkeypatch.setattr(env, "measure_ceilings", lambda device, **_: measure(device, cpu_bytes=1 << 20, repeats=3))
    result = runner.invoke(app, [*RUNS[name], "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.iterdir()
    return load_run(path)


def _figure(run: Run, metric: str) -> Figure:
    (scenario,) = set(run.throughput["scenario"])
    family = "gqa" if metric == "page-bandwidth" else "gdn"  # tiny-gdn's KV pages; its state page row is untimed
    fig = make_figure(run.throughput, scenario, family, metric)
    assert isinstance(fig, Figure), fig
    return fig


def _series(fig: Figure) -> dict[str, Line2D]:
    """The data lines of a figure by label (ceilings, goals and the 1.0x line left out)."""
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()
            if not line.get_label().startswith(("_", "ceiling "))}


def _legend_entries_have_data(fig: Figure) -> None:
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        texts = [t.get_text() for t in legend.get_texts()]
        assert all(texts), texts
        for handle, text in zip(legend.legend_handles, texts):
            if isinstance(handle, Line2D) and handle.get_linestyle() == "None":  # a mark-only entry: its data
                (drawn,) = [line for line in ax.get_lines() if line.get_label() == text]
                assert len(drawn.get_xdata()) > 0, text


def _ceilings_in_legend(fig: Figure) -> dict[str, str]:
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            m = re.fullmatch(r"ceiling (.+): (\S+) GB/s", line.get_label())
            if m:
                out[m[1]] = m[2]
    return out


def _manifest_gbps(run: Run, name: str) -> float:
    """A ceiling's value from the manifest; `<base> x<n>` (dist export/import) is n times the base's."""
    ceilings = run.manifest["ceilings"]
    if name in ceilings:
        return ceilings[name]["gbps"]
    base, _, times = name.rpartition(" x")
    return ceilings[base]["gbps"] * int(times)


def test_run_figures_one_style_per_variant_ticks_and_scales_the_data_needs(tmp_path, monkeypatch):
    run = _run("mtp-fixed", tmp_path, monkeypatch)
    timed = run.throughput[run.throughput["median_us"].notna()]
    variants = {styles.key(r.mode, r.variant, r.backend) for r in timed.itertuples()}
    assert len(variants) >= 5  # native and at least two variants each of compact and replay
    for metric in ("throughput", "speedup", "bandwidth"):
        fig = _figure(run, metric)
        series = _series(fig)
        assert len(series) == len(variants) - (metric == "speedup"), (metric, list(series))  # native is the base
        looks = [(line.get_color(), line.get_marker()) for line in series.values()]
        assert len(set(c for c, _ in looks)) == len(looks), looks  # every series its own colour
        for label, line in series.items():  # and the variant's own, as in every other figure
            variant = label.split(" ")[0]
            assert (line.get_color(), line.get_marker()) == (styles.FIXED[variant].color, styles.FIXED[variant].marker)
        ax = fig.axes[0]
        assert list(ax.get_xticks()) == [2.0, 4.0]  # the batches measured, not 2, 4, 8 around them
        assert isinstance(ax.xaxis.get_minor_locator(), NullLocator)  # no unlabelled log ticks between them
        _legend_entries_have_data(fig)

    # bandwidth: CPU rows far under the copy ceiling, on the scale they need, the ceiling labelled by value
    fig = _figure(run, "bandwidth")
    ax = fig.axes[0]
    data = [y for line in _series(fig).values() for y in line.get_ydata()]
    ceiling = run.manifest["ceilings"]["cpu-memcpy"]["gbps"]
    assert max(data) * 20 < ceiling and ax.get_yscale() == "log"
    low, high = ax.get_ylim()
    assert low < min(data) and high > ceiling
    assert _ceilings_in_legend(fig) == {"cpu-memcpy": _fmt_num(ceiling)}

    # memory: both kinds of bar, each variant in its colour (pale and solid share it), not two for all
    full = _figure(run, "memory")
    assert [t.get_text() for t in full.axes[0].get_legend().get_texts()] == ["predicted", "measured"]
    assert len({tuple(p.get_facecolor()[:3]) for p in full.axes[0].patches}) == len(variants)


def test_memory_legend_only_names_bars_that_are_drawn(tmp_path, monkeypatch):
    run = _run("checkpoint-restore", tmp_path, monkeypatch)
    restore = _figure(run, "memory")
    assert run.throughput["bytes_per_request_measured"].isna().all()  # checkpoint-restore measures none
    assert [t.get_text() for t in restore.axes[0].get_legend().get_texts()] == ["predicted"]
    assert [p for p in restore.axes[0].patches if p.get_height() > 0]


@pytest.mark.parametrize("name", ["pd-dist", "cpu-pages"])  # a ceiling per pair; one per line
def test_page_bandwidth_ceilings_are_the_manifests_and_never_zero(name, tmp_path, monkeypatch):
    run = _run(name, tmp_path, monkeypatch)
    fig = _figure(run, "page-bandwidth")
    gbps_ax, pct_ax = fig.axes
    labelled = _ceilings_in_legend(fig)
    assert labelled, "no ceiling drawn"
    for ceiling, text in labelled.items():
        assert text == _fmt_num(_manifest_gbps(run, ceiling)) and float(text) > 0, (ceiling, text)
    series = _series(fig)
    gbps = {label: line for label, line in series.items() if line.axes is gbps_ax}
    assert len({line.get_color() for line in gbps.values()}) == len(gbps), list(gbps)
    rows = run.throughput[run.throughput["ceiling_name"].notna() & (run.throughput["status"] == "passed")]
    for label, line in series.items():
        if line.axes is not pct_ax:
            continue
        direction = label.split(" vs ")[0].split(" ")[0]
        names = set(rows.loc[rows["direction"] == direction, "ceiling_name"])
        said = label.split(" vs ", 1)[1]
        # the legend names the ceiling(s) its points are judged against, not the first point's for all
        assert said in names or said.startswith("each pair's link-") or all(n in said for n in names), (label, names)
    _legend_entries_have_data(fig)
    if name == "pd-dist":  # each pair's own link ceiling: a mark at that pair, at the manifest's value
        (marks,) = [line for line in gbps_ax.get_lines() if line.get_label().startswith("ceiling per point")]
        pairs = [t.get_text() for t in gbps_ax.get_xticklabels()]
        for x, y in zip(marks.get_xdata(), marks.get_ydata()):
            p, d = pairs[int(x)].split(" -> ")
            link = [n for n in run.manifest["ceilings"] if n.startswith("link-") and f" tp{p}:{d} " in n]
            assert len(link) == 1 and y == pytest.approx(run.manifest["ceilings"][link[0]]["gbps"]), (x, y, link)


def test_drift_is_drawn_at_the_rounds_compared_in_the_run_and_the_notebook(tmp_path, monkeypatch):
    run = _run("decode", tmp_path / "runs", monkeypatch)
    states = [c for c in run.comparisons if c.rhs == "fp64-reference" and c.name == "ssm" and len(c.rms_series) > 1]
    assert states and all(c.series_rounds == [7, 15, 23, 31] for c in states)  # --snapshot-every 8 over 32 rounds
    made = drift_figures(run.comparisons, tmp_path)
    assert [p for p in made.values() if isinstance(p, Path)]
    fig = figure("decode", [("fp32", c) for c in run.comparisons if c.rhs == "fp64-reference" and len(c.rms_series) > 1])
    ssm_panel = fig.axes[1]
    for line in ssm_panel.get_lines():
        if line.get_label().startswith("_"):
            continue
        assert list(line.get_xdata()) == [7, 15, 23, 31], line.get_label()
        variant = line.get_label().split("/")[0]
        assert line.get_color() == styles.FIXED[variant].color  # the variant's colour in the run figures too

    # the notebook's own replay drift figure (its cell run as written) had x = 0..3 for rounds 7..31
    source = (REPO / "notebooks" / "compare_modes.py").read_text()
    (cell,) = [c for c in source.split("# %%") if "replay drift" in c and "add_subplot" in c]
    shown = []
    namespace = {"run": run, "show": shown.append}
    exec(compile("from matplotlib.backends.backend_agg import FigureCanvasAgg\nfrom matplotlib.figure import Figure\n"
                 "from results.drift import series_rounds, series_style\n" + cell, "compare_modes.py", "exec"), namespace)
    (fig,) = shown
    replay = {f"{c.name}: {c.lhs} vs {c.rhs}, shape {list(c.shape)}": c for c in run.comparisons
              if c.lhs.startswith("replay") and len(c.rms_series) > 1}
    lines = [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert len(lines) == len(replay)
    assert any(list(line.get_xdata()) == [7, 15, 23, 31] for line in lines)
    for line in lines:
        assert list(line.get_xdata()) == series_rounds(replay[line.get_label()])


def test_styles_are_distinct_in_a_figure_and_stable_across_figures():
    names = [*styles.FIXED, "native/sglang", "native/flashinfer", "replay-inline/sglang", "h2d", "d2h"]
    names = [n for n in names if n not in ("compact", "replay")]  # the bare modes of old runs: their default's look
    one = styles.assign(names)
    assert len({s.color for s in one.values()}) == len(names)
    assert styles.assign(reversed(names)) == one  # the same series, the same look, whatever else is drawn
    assert styles.key("compact", "deferred", "triton") == "compact-deferred"
    assert styles.key("native", "", "sglang") == "native/sglang"
