"""`harness advise` as tables (markdown or rich): the verdict per batch, each batch's ranking, the concurrency
each candidate reaches under the budget, and the notes that say what the figures rest on."""

from __future__ import annotations

from rich.console import Console

from results.advise import Advice, BatchAdvice, Scored
from results.tables import TableData, _fmt_bytes, _fmt_si, _fmt_us, print_table


def header_lines(advice: Advice) -> list[str]:
    s, (a, b) = advice.sweep, advice.rest_us
    rest = "the SSM layers alone (no --rest-us)" if a == b == 0 else f"plus {a:g} + {b:g} * W us a round (--rest-us)"
    return [
        f"advise {s.preset} on {', '.join(s.devices)}: accept {advice.acceptance.spec}; ranked by expected accepted "
        f"tokens/s per request, {rest}",
        f"budget: {advice.budget_source}",
        f"runs: {', '.join(s.runs)}",
    ]


def verdict(b: BatchAdvice) -> str:
    """`best X, runner-up Y by 3.2% (outside the rows' noise)`, or why there is no verdict."""
    if b.best is None:
        return "no candidate can be judged"
    if b.runner_up is None:
        return f"{b.best.candidate.label}, the only candidate"
    noise = "inside the rows' noise: the rows cannot tell them apart" if b.inside_noise else "outside the rows' noise"
    return f"{b.best.candidate.label}, runner-up {b.runner_up.candidate.label} by {b.margin_pct:.1f}% ({noise})"


def verdict_table(advice: Advice, title: str | None = None) -> TableData:
    """One row per batch: best, its tokens/s per request, runner-up, margin, inside the noise."""
    rows = []
    for b in advice.batches:
        best, second = b.best, b.runner_up
        rows.append([
            str(b.batch),
            best.candidate.label if best else "none",
            _timing_note(best) if best else "-",
            _fmt_si(best.tokens_per_s_per_request) if best else "-",
            second.candidate.label if second else "-",
            f"{b.margin_pct:.1f}%" if second else "-",
            ("yes" if b.inside_noise else "no") if second else "-",
        ])  # fmt: skip
    columns = ["batch", "best", "timing", "tok/s per request", "runner-up", "margin", "inside noise"]
    return TableData(title or f"{advice.sweep.preset} · accept {advice.acceptance.spec}", columns, rows)


def batch_table(advice: Advice, b: BatchAdvice) -> TableData:
    """Every candidate judged at one batch, best first."""
    rest = any(s.rest_us for s in b.ranked)
    columns = ["rank", "candidate", "timing", "tokens/round (expected)", "round us (p20-p80)", *(["rest us"] if rest else []),
               "tok/s per request (p20-p80)", "tok/s (batch)", "state/request", "state (batch)"]
    rows = []
    for i, s in enumerate(b.ranked, 1):
        t, (lo, hi) = s.timing, s.band
        rows.append([
            str(i), s.candidate.label, _timing_note(s), f"{s.expected_tokens:.3g}",
            f"{_fmt_us(t.median_us)} ({_fmt_us(t.p20_us)}-{_fmt_us(t.p80_us)})",
            *([f"{s.rest_us:g}"] if rest else []),
            f"{_fmt_si(s.tokens_per_s_per_request)} ({_fmt_si(lo)}-{_fmt_si(hi)})", _fmt_si(s.tokens_per_s),
            _fmt_bytes(s.candidate.bytes_per_request), _fmt_bytes(s.state_bytes),
        ])  # fmt: skip
    return TableData(f"batch {b.batch}: {verdict(b)}", columns, rows)


def concurrency_table(advice: Advice) -> TableData:
    budget = "no budget" if advice.budget_bytes is None else _fmt_bytes(advice.budget_bytes)
    rows = [[c["label"], _fmt_bytes(c["bytes_per_request"]), _fmt_count(c["max_concurrency"]),
             _fmt_count(c["largest_passed_batch"]), _fmt_count(c["smallest_oom_batch"])]
            for c in advice.concurrency()]
    columns = ["candidate", "state/request", f"max concurrency ({budget})", "largest batch passed", "batch oom"]
    return TableData("requests each candidate fits in the budget (state only)", columns, rows)


def mode_line(advice: Advice) -> str:
    best = advice.mode_concurrency()
    if not best:
        return "max concurrency per mode: no budget to fill"
    return "max concurrency per mode: " + "; ".join(
        f"{m} {c['max_concurrency']:,} ({c['label']})" for m, c in best.items())


def excluded_lines(b: BatchAdvice) -> list[str]:
    return [f"not judged at batch {b.batch}: {label}: {reason}" for label, reason in b.excluded]


def render_markdown(advice: Advice) -> str:
    parts = ["# Advice", ""] + [f"- {line}" for line in header_lines(advice)]
    parts += ["", verdict_table(advice).to_markdown()]
    for b in advice.batches:
        parts += ["", batch_table(advice, b).to_markdown()]
        parts += [""] + [f"- {line}" for line in excluded_lines(b)] if b.excluded else []
    parts += ["", concurrency_table(advice).to_markdown(), "", f"- {mode_line(advice)}"]
    parts += ["", "## Notes", ""] + [f"- {n}" for n in advice.notes or ["none"]]
    return "\n".join(parts) + "\n"


def render_rich(advice: Advice, console: Console) -> None:
    def say(line: str, style: str | None = None) -> None:
        console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)

    for line in header_lines(advice):
        say(line)
    print_table(console, verdict_table(advice).to_rich())
    for b in advice.batches:
        print_table(console, batch_table(advice, b).to_rich())
        for line in excluded_lines(b):
            say(line, "dim")
    print_table(console, concurrency_table(advice).to_rich())
    say(mode_line(advice))
    for note in advice.notes:
        say(f"note: {note}", "yellow")


def _timing_note(s: Scored) -> str:
    t = s.timing
    if t.source == "measured":
        return "measured"
    return f"interpolated ({t.batches[0]}-{t.batches[1]})"


def _fmt_count(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"
