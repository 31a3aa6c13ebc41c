# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Compare the state modes of a run
#
# Native, compact and replay keep the same recurrent (SSM) state in different layouts; this notebook puts
# them side by side for one run directory, with native as the baseline. It reads the run only through
# `results.load_run`, so it works on any run the harness wrote and on the curated reference runs.
#
# `RUN` picks the run: `HARNESS_RUN` when set (or edit the line), else the newest run under `results/runs/`,
# else the newest curated reference run under `results/reference/`. Jupyter runs a notebook in its own
# folder (`notebooks/`), so a relative `HARNESS_RUN` such as `results/runs/<run-id>` is taken from the
# repository root, where the README's commands run.

# %%
import io
import os
from pathlib import Path

from IPython.display import Image, Markdown, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import results
from results import latest_run, load_run
from results.drift import series_rounds, series_style
from results.headline import LABELS, formatted, modes_side_by_side
from results.plots import make_figure
from results.tables import header_lines

RUN = os.environ.get("HARNESS_RUN")

RESULTS = Path(results.__file__).resolve().parent
REPO = RESULTS.parent
if RUN:
    run = load_run(Path(RUN) if Path(RUN).is_absolute() or not (REPO / RUN).exists() else REPO / RUN)
else:
    try:
        run = latest_run(RESULTS / "runs")
    except FileNotFoundError:
        run = latest_run(RESULTS / "reference")


def show(figure: Figure | str) -> None:
    """Display a figure as PNG (the same under any matplotlib backend), or the reason there is none."""
    if isinstance(figure, str):
        display(Markdown(f"*no figure: {figure}*"))
        return
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=90)
    display(Image(png.getvalue()))


# One (scenario, family) per table and per figure, as in `harness report` and `harness plot`.
groups = sorted(run.throughput.groupby(["scenario", "family"]).groups)

# %% [markdown]
# ## The run
#
# Where it ran and with which code, the copy ceilings measured in the same run (the `% ceiling` columns
# below are relative to them), the timers used and the overall equivalence verdict. A CPU run times with the
# wall clock: read it for correctness and memory, not for GPU performance.

# %%
display(Markdown("\n".join(f"- {line}" for line in header_lines(run))))

# %% [markdown]
# ## Modes side by side
#
# One table per scenario and family; each row is one case (the key columns that vary, the constant ones
# are in the title), each column group one metric with a column per mode. `x faster than native` is native's
# median time over the mode's (2.00x: twice as fast as native; 0.50x: half as fast). A mode that did not pass shows its status in
# place of its time. Bytes per request are the state one request holds in that mode: predicted from the
# SPEC §3 formula and measured from the allocator.

# %%
SHOWN = ["median_us", "speedup", "tokens_per_s", "achieved_gbps", "ceiling_pct",
         "bytes_per_request_predicted", "bytes_per_request_measured"]  # fmt: skip

for scenario, family in groups:
    rows = run.throughput[(run.throughput["scenario"] == scenario) & (run.throughput["family"] == family)]
    table = formatted(modes_side_by_side(rows), SHOWN).rename(columns=LABELS, level="metric")
    cases = table.index.to_frame(index=False)
    varying = [c for c in cases if cases[c].nunique(dropna=False) > 1] or ["batch"]
    constant = [f"{c}={cases[c][0]}" for c in cases if c not in varying and not cases[c].isna().all()]
    display(Markdown(f"### {' · '.join(constant)}"), table.droplevel([c for c in cases if c not in varying]))

# %% [markdown]
# ## Equivalence
#
# Every comparison of the run, grouped by SPEC §5 contract and pair (lhs against rhs): how many tensors were
# compared under which policy (`bitwise`: identical bits; `rms`: RMS error ratio within tolerance) and the
# worst RMS ratio and ULP distance seen.

# %%
display(Markdown(f"**{run.equivalence_report().summary()}**" if run.comparisons else "*no comparisons recorded*"))
if run.comparisons:
    verdicts = run.equivalence.groupby(["scenario", "contract", "policy", "lhs", "rhs"]).agg(
        tensors=("name", lambda names: ", ".join(sorted(set(names)))),
        comparisons=("passed", "size"),
        failed=("passed", lambda passed: int((~passed).sum())),
        worst_rms_ratio=("rms_ratio", "max"),
        worst_ulp=("max_ulp", "max"),
    )
    display(verdicts)

# %% [markdown]
# ### Replay drift
#
# Replay rebuilds the state from a checkpoint plus a token history, so its rounding error can grow with
# the rollout. Each line is one replay comparison's RMS error ratio per round (a flat line: no drift).

# %%
drift = [c for c in run.comparisons if c.lhs.startswith("replay") and len(c.rms_series) > 1]
if drift:
    fig = Figure(figsize=(7.5, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(title="replay drift", xlabel="round", ylabel="RMS error ratio")
    for c in drift:  # x: the rounds compared (states only on snapshot rounds), colour: the variant's in every figure
        ax.plot(series_rounds(c), c.rms_series, label=f"{c.name}: {c.lhs} vs {c.rhs}, shape {list(c.shape)}",
                linestyle="-" if c.name == "o" else "--", **series_style(c).kwargs())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    show(fig)
else:
    show("no replay rollout with a per-round RMS series in this run")

# %% [markdown]
# ## Memory per request
#
# State bytes one request holds in each mode (predicted and measured); fewer bytes per request means more
# concurrent requests in the same memory.

# %%
for scenario, family in groups:
    show(make_figure(run.throughput, scenario, family, "memory"))

# %% [markdown]
# ## Throughput vs batch
#
# Tokens per second per mode as the batch grows, with the band between the p20 and p80 times: where the
# bands of two modes overlap, the run cannot tell them apart.

# %%
for scenario, family in groups:
    show(make_figure(run.throughput, scenario, family, "throughput"))

# %% [markdown]
# ## Which mode to ship
#
# `harness advise` on this run (results/advise.py): at each batch the run measured, every mode, variant, drafts
# count and state dtype that fits the memory budget (here the device's memory from the manifest; none on a CPU
# run), ranked by expected accepted tokens per second per request of the linear-attention layers: E[tokens per
# round] under geometric acceptance p over the measured round time. One table per acceptance: the best, the
# runner-up, the margin and whether the margin is inside the rows' p20-p80 noise. A run of one scenario has no
# decode rows (then no speculation, drafts 0, is "not measured") or no speculation rows. The frontier below it:
# tokens/s per request against state per request at p = 0.7, per mode.

# %%
from results.advise import advise_runs
from results.advise_plots import frontier_figure
from results.advise_tables import verdict_table

judged = run.throughput[run.throughput["scenario"].isin(["decode", "mtp-fixed"])]
for preset in sorted(set(judged["preset"].dropna())):
    for p in (0.5, 0.7, 0.9):
        advice = advise_runs([run.path], preset, accept=f"geometric:{p}", allow_mixed=True)
        display(Markdown(verdict_table(advice).to_markdown()))
        if p == 0.7:
            frontier = frontier_figure(advice)
    show(frontier)
if judged.empty:
    show("no decode or mtp-fixed rows in this run: nothing to advise")
