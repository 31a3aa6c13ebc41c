"""The README's `harness advise` section, generated from committed H200 runs (never typed by hand).

Reads every finished run directory under --reference (default REFERENCE below: until the sweep of
scripts/gpu_advise_sweep.sh is committed, the 2026-12-03 mode runs, which cover batch 128 only), takes their
decode and mtp-fixed rows per preset, and prints markdown: what the rows cover, the verdict per batch at
geometric acceptance 0.5, 0.7 and 0.9 (results/advise.py; budget: the device's memory), the most requests
each mode fits, and links to the two figures (choice map, frontier at 0.7). With --write, draws the figures
into --figures (default docs/advise/) and replaces the text between `<!-- advise:begin -->` and `<!-- advise:end -->` in README.md;
tests/test_advise_summary.py checks that the README holds what this prints.

    python3 scripts/advise_summary.py --write
    python3 scripts/advise_summary.py --reference results/reference/<the sweep> --write   (once it is committed)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from results.acceptance import geometric  # noqa: E402
from readme_section import write_section  # noqa: E402
from results.advise import SCENARIOS, Advice, advise, load_sweep, resolve_budget  # noqa: E402
from results.advise_tables import mode_line  # noqa: E402
from results.store import load_run  # noqa: E402

REFERENCE = ROOT / "results" / "reference" / "h200-2026-12-03" / "modes"
FIGURES = ROOT / "docs" / "advise"
BEGIN, END = "<!-- advise:begin -->", "<!-- advise:end -->"
PS = (0.5, 0.7, 0.9)
KINDS = ("choice-map", "frontier")
FULL_SWEEP = {"batch": [1, 8, 32, 128, 256, 512], "drafts": [0, 1, 3, 7], "state_dtype": ["bf16", "fp32"]}


def runs_by_preset(reference: Path) -> dict[str, list[Path]]:
    """Every finished run under `reference` with decode or mtp-fixed rows, by the presets of those rows."""
    out: dict[str, list[Path]] = {}
    for manifest in sorted(reference.rglob("manifest.json")):
        run = manifest.parent
        if run.name.endswith(".partial") or not (run / "throughput.csv").is_file():
            continue
        df = load_run(run).throughput
        for preset in sorted(set(df.loc[df["scenario"].isin(SCENARIOS), "preset"].dropna())):
            out.setdefault(preset, []).append(run)
    return out


def coverage(sweep) -> str:
    """What the rows measured against what the full sweep asks for, so a thin demonstration says it is thin."""
    rows = sweep.rows
    have = {"batch": sorted({int(b) for b in rows["batch"]}), "drafts": sorted({int(d) for d in rows["drafts"]}),
            "state_dtype": sorted(set(rows["state_dtype"]))}
    parts = [f"{axis} {', '.join(map(str, values))}" for axis, values in have.items()]
    missing = [f"{axis} {', '.join(str(v) for v in FULL_SWEEP[axis] if v not in have[axis])}"
               for axis in FULL_SWEEP if any(v not in have[axis] for v in FULL_SWEEP[axis])]
    line = f"the rows cover {'; '.join(parts)}"
    return line + (f" (not measured: {'; '.join(missing)})" if missing else " (the whole sweep)")


def preset_section(preset: str, runs: list[Path], figures: Path) -> tuple[list[str], Advice]:
    """The preset's markdown (coverage, verdicts at each p, concurrency, the figures' links) and its advice at 0.7."""
    sweep = load_sweep(runs, preset)
    budget, source = resolve_budget(sweep, None)
    lines = [f"**{preset}** on {', '.join(sweep.devices)}: {coverage(sweep)}; budget {source.split(',')[0]}, "
             "state only.", "",
             "| accept | batch | best | timing | tok/s per request | runner-up | margin | inside noise |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in PS:
        advice = advise(sweep, geometric(p), budget_bytes=budget, budget_source=source)
        lines += [_verdict_row(p, b) for b in advice.batches]
        if p == 0.7:
            at_07 = advice
    not_judged = sorted({label for b in at_07.batches for label, _ in b.excluded})
    lines += ["", mode_line(at_07) + "."]
    if not_judged:
        lines += ["", f"Not judged at some batch (at 0.7; `harness advise` says why): {', '.join(not_judged)}."]
    lines += ["", " ".join(f"![{preset} {kind}]({_rel(figures)}/advise-{preset}-{kind}.png)" for kind in KINDS)]
    return lines, at_07


def _verdict_row(p: float, b) -> str:
    best, second = b.best, b.runner_up
    cells = [f"{p:g}", str(b.batch)]
    cells += ([best.candidate.label, best.timing.source, f"{best.tokens_per_s_per_request:.1f}"] if best
              else ["none", "-", "-"])
    cells += ([second.candidate.label, f"{b.margin_pct:.1f}%", "yes" if b.inside_noise else "no"] if second
              else ["-", "-", "-"])
    return "| " + " | ".join(cells) + " |"


def summary(reference: Path = REFERENCE, figures: Path = FIGURES, draw: bool = False) -> str:
    """The README section; with `draw`, also the figures it links, into `figures`."""
    out = [f"Generated by `scripts/advise_summary.py` from `{_rel(reference)}/` with `harness advise`'s "
           "model (results/advise.py): per batch, the best (mode, variant, backend, drafts, state dtype) by expected "
           "accepted tokens/s per request of the linear-attention layers, the runner-up, the margin and whether it "
           "is inside the rows' p20-p80 noise; round times as measured (under geometric 0.7), E[tokens per round] "
           "from each acceptance. `harness advise RUN... --preset P --accept geometric:p --markdown` prints the "
           "full ranking.", ""]
    for preset, runs in runs_by_preset(reference).items():
        lines, at_07 = preset_section(preset, runs, figures)
        out += lines + [""]
        if draw:
            from results.advise_plots import choice_map_figure, frontier_figure

            figures.mkdir(parents=True, exist_ok=True)
            for kind, make in zip(KINDS, (choice_map_figure, frontier_figure)):
                make(at_07).savefig(figures / f"advise-{preset}-{kind}.png", dpi=100)
    return "\n".join(out).rstrip("\n") + "\n"


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, default=REFERENCE, help="folder of the run directories")
    ap.add_argument("--figures", type=Path, default=FIGURES, help="where the figures go (inside the repository)")
    ap.add_argument("--write", action="store_true", help="replace the README's generated section")
    args = ap.parse_args()
    text = summary(args.reference.resolve(), args.figures.resolve(), draw=args.write)
    if args.write:
        write_section(BEGIN, END, text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
