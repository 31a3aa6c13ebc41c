"""The figures of `harness advise` (Agg canvas, no pyplot state), each titled with the preset, device, acceptance
and budget it was judged under:

* `advise-<preset>-choice-map.png`: batch (x) against geometric acceptance p (y), each cell coloured by the
  best candidate there (its mode's colour, lighter for more drafts) and labelled with its drafts;
  grey where no candidate can be judged. The budget and --rest-us of the advice apply to every cell.
* `advise-<preset>-frontier.png`: one panel per batch: tokens/s per request (with the p20-p80 band)
  against state bytes per request, a point per candidate judged there, and per mode the frontier of the
  candidates no other of that mode beats with less memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from results.advise import Advice, Candidate, _order, choice_map
from results.styles import MODE_COLOURS

CHOICE_PS = tuple(round(p, 2) for p in np.arange(0.05, 0.951, 0.05))
_MODE_COLOURS = MODE_COLOURS  # a mode's default variant's colour in the run figures (results/styles.py)
_MARKERS = {"": "o", "accept": "o", "deferred": "s", "inline": "o", "precompute": "^"}
_NONE = (0.85, 0.85, 0.85)
_PLAIN = FuncFormatter(lambda x, _: f"{x:g}")


def write_figures(advice: Advice, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    for name, fig in ((f"advise-{advice.sweep.preset}-choice-map.png", choice_map_figure(advice)),
                      (f"advise-{advice.sweep.preset}-frontier.png", frontier_figure(advice))):
        fig.savefig(out / name, dpi=120)
        made[name] = out / name
    return made


def _where(advice: Advice) -> str:
    s = advice.sweep
    budget = "no budget" if advice.budget_bytes is None else f"budget {advice.budget_bytes / 2**30:.1f} GiB"
    a, b = advice.rest_us
    rest = "" if a == b == 0 else f", rest {a:g} + {b:g}·W us"
    return f"{s.preset} on {', '.join(s.devices)} ({budget}{rest})"


def _colours(candidates: list[Candidate]) -> dict[tuple, tuple[float, float, float]]:
    """The mode's colour, mixed with white the more drafts (and the later variant) a candidate has."""
    out = {}
    for mode, base in _MODE_COLOURS.items():
        mine = sorted({(c.variant or "", c.drafts, c.key) for c in candidates if c.mode == mode})
        for i, (_, _, key) in enumerate(mine):
            mix = 0.65 * i / max(len(mine) - 1, 1)
            out[key] = tuple(x + (1 - x) * mix for x in to_rgb(base))
    for c in candidates:  # a mode outside the three: one grey-blue
        out.setdefault(c.key, (0.4, 0.4, 0.6))
    return out


def choice_map_figure(advice: Advice, ps: tuple[float, ...] = CHOICE_PS) -> Figure:
    batches = [b.batch for b in advice.batches]
    best = choice_map(advice.sweep, ps, batches, budget_bytes=advice.budget_bytes, rest_us=advice.rest_us)
    chosen = sorted({c.key: c for c in best.values() if c is not None}.values(), key=_order)
    colours = _colours(chosen)
    index = {c.key: i + 1 for i, c in enumerate(chosen)}
    grid = np.array([[index[best[(b, p)].key] if best[(b, p)] else 0 for b in batches] for p in ps])
    fig = Figure(figsize=(max(6.0, 1.1 * len(batches) + 3.5), 6), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(f"best candidate per batch and acceptance\n{_where(advice)}", fontsize=9)
    ax = fig.add_subplot(xlabel="batch", ylabel="geometric acceptance p")
    ax.set_title("cell text: drafts S of the best candidate (S0: no speculation)", fontsize=8)
    cmap = ListedColormap([_NONE] + [colours[c.key] for c in chosen])
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(chosen), aspect="auto", origin="lower", interpolation="nearest")
    for (i, p) in enumerate(ps):
        for j, b in enumerate(batches):
            c = best[(b, p)]
            ax.text(j, i, "-" if c is None else f"S{c.drafts}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_yticks(range(len(ps)), [f"{p:.2f}" for p in ps], fontsize=7)
    handles = [Patch(color=colours[c.key], label=c.label) for c in chosen]
    handles += [Patch(color=_NONE, label="none judged")] if (grid == 0).any() else []
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def frontier_figure(advice: Advice) -> Figure:
    batches = advice.batches
    cols = min(3, max(len(batches), 1))
    rows = -(-max(len(batches), 1) // cols)
    fig = Figure(figsize=(4.6 * cols + 2.5, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(f"tokens/s per request vs state per request, accept {advice.acceptance.spec}\n{_where(advice)}\n"
                 "o native, compact-accept, replay-inline; s compact-deferred; ^ replay-precompute\n"
                 "hollow: interpolated; lines: each mode's frontier", fontsize=8)
    for n, b in enumerate(batches):
        ax = fig.add_subplot(rows, cols, n + 1, title=f"batch {b.batch}", xlabel="state per request (MiB)",
                             ylabel="tokens/s per request")
        by_mode: dict[str, list] = {}
        for s in b.ranked:
            if s.candidate.bytes_per_request is None:
                continue
            by_mode.setdefault(s.candidate.mode, []).append(s)
        for mode, points in by_mode.items():
            colour = _MODE_COLOURS.get(mode, "C7")
            for s in points:
                x, y, (lo, hi) = s.candidate.bytes_per_request / 2**20, s.tokens_per_s_per_request, s.band
                ax.errorbar(x, y, yerr=[[y - lo], [hi - y]], fmt=_MARKERS.get(s.candidate.variant or "", "o"),
                            color=colour, ms=5, mfc="none" if s.timing.source != "measured" else colour)
                ax.annotate(f"S{s.candidate.drafts} {s.candidate.state_dtype}", (x, y), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
            front = _frontier(points)
            ax.plot([s.candidate.bytes_per_request / 2**20 for s in front],
                    [s.tokens_per_s_per_request for s in front], "-", color=colour, alpha=0.6, label=mode)
        if not by_mode:
            ax.text(0.5, 0.5, "no candidate judged", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(_PLAIN)
            ax.xaxis.set_minor_formatter(_PLAIN)
            ax.tick_params(axis="x", which="both", labelsize=7)
            ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    return fig


def _frontier(points: list) -> list:
    """The points no other point beats with less (or equal) memory, by memory."""
    front, top = [], -np.inf
    for s in sorted(points, key=lambda s: (s.candidate.bytes_per_request, -s.tokens_per_s_per_request)):
        if s.tokens_per_s_per_request > top:
            front.append(s)
            top = s.tokens_per_s_per_request
    return front
