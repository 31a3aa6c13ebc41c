"""The drift figure: how far each mode's outputs and states move from the fp64 reference over a long
rollout, per mode and state dtype (SPEC §5, contract 3).

A finding for users choosing a state dtype, drawn rather than hidden: with long-memory gates, native
and compact round the state to bf16 after every token and drift away from fp64, while replay keeps
fp32 between folds and stays closer; fp32 state stays orders of magnitude below both.

One figure per rollout (cases that differ only in their state dtype share a figure, so fp32 and bf16
lines sit side by side), `drift-<case>.png`, two panels: outputs and accepted states, RMS ratio to
fp64 per round (the round's layers combined), log y, one line per mode / backend and state dtype,
the bounds the gate applies dashed. Only rollouts of at least `MIN_ROUNDS` rounds are drawn.
"""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.equivalence import Comparison
from results import styles

MIN_ROUNDS = 32
REFERENCE = "fp64-reference"
_STATE_DTYPE = re.compile(r", (fp32|bf16) state")  # scenarios.ssm_engine.SSMCase.label writes it so
_DTYPE_STYLES = {"bf16": "-", "fp32": ":"}
MARKS = 12  # markers per line: a 1024-round line with a marker per round is a smear


def drift_figures(comparisons: list[Comparison], out: Path) -> dict[str, Path | str]:
    """Write every drift figure `comparisons` have data for into `out`; file name -> path (or why not)."""
    groups: dict[str, list[tuple[str, Comparison]]] = {}
    for c in comparisons:
        if c.rhs != REFERENCE or c.policy != "rms" or c.name not in ("o", "ssm") or len(c.rms_series) < 2:
            continue
        key, dtype = _split(c.case or c.scenario)
        groups.setdefault(key, []).append((dtype, c))
    made: dict[str, Path | str] = {}
    for key, items in groups.items():
        name = "drift-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-") + ".png"
        if max(c.rounds for _, c in items) < MIN_ROUNDS:
            made[name] = f"rollout shorter than {MIN_ROUNDS} rounds"
            continue
        figure(key, items).savefig(out / name, dpi=110)
        made[name] = out / name
    return made


def figure(title: str, items: list[tuple[str, Comparison]]) -> Figure:
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    panels = dict(zip(("o", "ssm"), fig.subplots(1, 2, sharex=True)))
    fig.suptitle(f"drift vs fp64: {title}", fontsize=10)
    bounds: dict[str, dict[float, set[str]]] = {"o": {}, "ssm": {}}  # bound -> the lines it applies to
    for dtype, c in sorted(items, key=lambda it: (it[1].lhs, it[0])):
        mode = c.lhs.split("/")[0].split("-")[0]
        x = series_rounds(c)
        y = [max(v, 1e-12) for v in c.rms_series]  # an exact round (0) still shows on the log axis
        panels[c.name].plot(x, y, linestyle=_DTYPE_STYLES.get(dtype, "-"), markevery=max(1, len(x) // MARKS),
                            label=f"{c.lhs} {dtype} state" if dtype else c.lhs, **series_style(c).kwargs())
        if c.tolerance is not None:
            bounds[c.name].setdefault(c.tolerance, set()).add(f"{mode} {dtype}".strip())
    for name, ax in panels.items():
        for b, whose in sorted(bounds[name].items()):
            ax.axhline(b, color="grey", linestyle="--", linewidth=1)
            ax.annotate(f"bound {b:.3g}: {', '.join(sorted(whose))}", (0.01, b), xycoords=("axes fraction", "data"),
                        va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_ylabel(f"RMS ratio to fp64 ({'outputs' if name == 'o' else 'accepted states'})")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    return fig


def series_rounds(c: Comparison) -> list[int]:
    """The round of each point of `c.rms_series`: states are compared on snapshot rounds only (7, 15, 23,
    31 with --snapshot-every 8), so the point's index is not its round."""
    return list(c.series_rounds) if c.series_rounds else list(range(len(c.rms_series)))


def series_style(c: Comparison) -> styles.Style:
    """The colour and marker of the comparison's variant (`compact-deferred/torch`), as in the run's figures."""
    variant, _, backend = c.lhs.partition("/")
    return styles.style(styles.key(variant, None, backend))


def _split(label: str) -> tuple[str, str]:
    """(the rollout without its state dtype, the state dtype) of a case label."""
    m = _STATE_DTYPE.search(label)
    return (label, "") if m is None else (label[: m.start()] + label[m.end():], m.group(1))
