"""`harness advise`: which state mode, variant, drafts and state dtype to run at each batch, under a memory
budget, from measured rows (issue 22).

A candidate is one (mode, variant, backend, drafts, state dtype) as the rows of `decode` (drafts 0: no
speculation) and `mtp-fixed` (drafts S >= 1) measured it, with the activation dtype and replay's history
length and dtype when they vary (`CANDIDATE`, named as the throughput columns are). At a batch B, each
candidate is judged by the expected accepted tokens per second of one request, in the linear-attention
layers the rows time:

    tokens_per_s_per_request = E[tokens per round] / (median_us + rest_us) * 1e6

* `E[tokens per round]` = 1 + a_1 + ... + a_S from the acceptance model (results/acceptance.py);
* `median_us`: the row's median time of one round of all its layers for the whole batch, so ranking per
  request at one batch ranks the batch's throughput (`tokens_per_s` = B * that) the same way;
* `rest_us` = A + B' * W (`--rest-us A,B'`, W = 1 + S): the rest of the model's step, so the verdict can
  be judged for the whole step; 0 by default (the SSM layers alone).

The p20 and p80 times give the band of each candidate's figure (its noise); the best candidate's margin
over the runner-up is `inside the noise` when the two bands overlap (the rule `harness compare` uses).

What the rows do not say is never guessed: a batch the rows lack for a candidate is `interpolated`
linearly in batch between the nearest measured batches below and above it (median, p20 and p80 each,
when both neighbours passed), else `not measured` (no extrapolation); a row that ran out of memory
excludes its candidate there (`oom in the run`), and at larger batches. A round's time is taken as it was
measured, under the run's own acceptance (the note says which): the advice assumes the time of a round
does not depend on how many of its drafts are accepted.

Memory: a candidate fits at batch B when B * bytes_per_request fits the budget; bytes per request are
the rows' (the larger of predicted and measured, which agree on the runs so far), the same at every
batch. The budget defaults to the device's memory in the runs' manifest (all of it for state: an upper
bound), and to none on a CPU run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path

import pandas as pd

from harness.memory import max_concurrency
from results.acceptance import Acceptance, geometric, parse_acceptance
from results.schema import Status, is_blank
from results.store import Run, load_run
from results.tables import _fmt_bytes, mode_label, mode_order

SCENARIOS = ("decode", "mtp-fixed")  # fixed width every round: one round time per (candidate, batch)
CANDIDATE = ["mode", "variant", "backend", "drafts", "state_dtype", "act_dtype", "history_len", "history_dtype"]
GIB = 2**30


@dataclass(frozen=True)
class Candidate:
    """One way to run the state, as the rows name it (`CANDIDATE` columns); `bytes_per_request` from its rows."""

    mode: str
    variant: str | None
    backend: str
    drafts: int
    state_dtype: str
    act_dtype: str | None
    history_len: int | None
    history_dtype: str | None
    bytes_per_request: int | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, c) for c in CANDIDATE)

    @property
    def label(self) -> str:
        """`compact-deferred/triton S=3 fp32`: the mode as tables show it, the backend, drafts, state dtype."""
        return f"{mode_label(self)}/{self.backend} S={self.drafts} {self.state_dtype}"

    @property
    def mode_variant(self) -> str:
        return self.mode if self.variant is None else f"{self.mode}-{self.variant}"

    def to_dict(self) -> dict:
        return {"label": self.label, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True)
class Timing:
    """A candidate's round time at one batch: `measured` (its row) or `interpolated` from `batches`."""

    source: str
    median_us: float
    p20_us: float
    p80_us: float
    batches: tuple[int, ...]
    timer: str
    accept: str | None


@dataclass
class Sweep:
    """The decode and mtp-fixed rows of one preset on one device, one row per (candidate, batch)."""

    preset: str
    devices: list[str]
    runs: list[str]
    rows: pd.DataFrame
    candidates: dict[tuple, Candidate]
    device_memory_bytes: int | None
    notes: list[str]

    def candidate_rows(self, key: tuple) -> pd.DataFrame:
        return self._by_candidate[key]

    @cached_property
    def _by_candidate(self) -> dict[tuple, pd.DataFrame]:
        # indexed once: a choice map judges every candidate at every batch for each of its acceptances
        return {key: rows.sort_values("batch") for key, rows in self.rows.groupby("candidate", sort=False)}

    def measured_batches(self) -> list[int]:
        return sorted(int(b) for b in self.rows["batch"].unique())

    def unsupported(self) -> list[tuple[Candidate, str]]:
        """Candidates none of whose rows ran (all `unsupported`): never candidates, listed once."""
        out = []
        for key, cand in self.candidates.items():
            rows = self.candidate_rows(key)
            if (rows["status"] == Status.unsupported.value).all():
                out.append((cand, str(rows["reason"].iloc[0])))
        return out

    def timing(self, key: tuple, batch: int) -> Timing | str:
        """The candidate's round time at `batch`, or why the rows give none."""
        rows = self.candidate_rows(key)
        at = rows[rows["batch"] == batch]
        if not at.empty:
            r = at.iloc[0]
            if r["status"] == Status.passed.value and not is_blank(r["median_us"]):
                return _timing("measured", [r])
            if r["status"] == Status.oom.value:
                return "oom in the run"
            if r["status"] == Status.passed.value:
                return "passed untimed in the run: no round time"
            return f"{r['status']} in the run: {r['reason']}"
        below = rows[rows["batch"] < batch]
        above = rows[rows["batch"] > batch]
        oom = below[below["status"] == Status.oom.value]
        if not oom.empty:
            return f"oom in the run at batch {int(oom['batch'].iloc[0])}, below this batch"
        lo = below.iloc[-1] if not below.empty else None
        hi = above.iloc[0] if not above.empty else None
        if all(r is not None and r["status"] == Status.passed.value and not is_blank(r["median_us"])
               for r in (lo, hi)):
            return _timing("interpolated", [lo, hi], batch)
        measured = ", ".join(str(int(b)) for b in rows["batch"])
        return f"not measured (its rows: batch {measured}; no extrapolation)"


def _timing(source: str, rows: list[pd.Series], batch: int | None = None) -> Timing:
    """A measured row's timing, or the linear interpolation in batch between two rows at `batch`."""
    timer = "+".join(sorted({str(r["timer"]) for r in rows}))
    accept = "+".join(sorted({str(r["accept"]) for r in rows if not is_blank(r["accept"])})) or None
    batches = tuple(int(r["batch"]) for r in rows)
    if len(rows) == 1:
        values = [float(rows[0][c]) for c in ("median_us", "p20_us", "p80_us")]
    else:
        (b1, b2), f = batches, (batch - batches[0]) / (batches[1] - batches[0])
        values = [float(rows[0][c]) + (float(rows[1][c]) - float(rows[0][c])) * f
                  for c in ("median_us", "p20_us", "p80_us")]
    return Timing(source, *values, batches=batches, timer=timer, accept=accept)


def device_name(run: Run) -> str:
    """What a run's timings are of: the GPU's name, or `cpu`."""
    return str(run.manifest.get("gpu_name") or "cpu")


def load_sweep(paths: Sequence[str | Path], preset: str, *, allow_mixed: bool = False) -> Sweep:
    """Read the run directories and keep the decode and mtp-fixed rows of `preset` (rows of `--gates long-memory`,
    which time the same kernels on drift-test inputs, are left out).

    Raises ValueError (one line) for a path that is not a finished run, a run given twice, runs of different
    devices or a run holding other presets' rows (unless `allow_mixed`: then only `preset`'s rows are used,
    and a note says which runs were left out), or no such row at all.
    """
    if not paths:
        raise ValueError("advise needs at least one run directory")
    runs: list[Run] = []
    for p in paths:
        path = Path(p)
        if not path.is_dir():
            raise ValueError(f"run {p}: no such run directory")
        try:
            run = load_run(path)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
        if any(r.run_id == run.run_id for r in runs):
            raise ValueError(f"run {run.run_id} is given twice ({p})")
        runs.append(run)
    devices = sorted({device_name(r) for r in runs})
    if len(devices) > 1 and not allow_mixed:
        which = "; ".join(f"{r.path}: {device_name(r)}" for r in runs)
        raise ValueError(f"the runs were timed on different devices ({which}); --allow-mixed to judge them together")
    notes, frames = [], []
    for run in runs:
        df = run.throughput
        df = df[df["scenario"].isin(SCENARIOS) & df["gates"].isna()]
        presets = sorted(set(df["preset"].dropna()))
        if presets != [preset] and not allow_mixed:
            held = ", ".join(presets) or "no decode or mtp-fixed row"
            raise ValueError(f"run {run.path} holds {held}, not only --preset {preset}; --allow-mixed to use only "
                             f"{preset}'s rows")
        mine = df[df["preset"] == preset]
        if mine.empty:
            notes.append(f"run {run.run_id} holds no {preset} decode or mtp-fixed row: left out")
            continue
        frames.append(mine.assign(run_order=_run_order(run), tuned=~mine["config_source"].fillna("").str.contains(
            "default")))
    if not frames:
        raise ValueError(f"no decode or mtp-fixed row of preset {preset} in {', '.join(str(p) for p in paths)}")
    rows = pd.concat(frames, ignore_index=True)
    rows["candidate"] = [tuple(None if is_blank(v) else (int(v) if c in ("drafts", "history_len") else str(v))
                               for c, v in zip(CANDIDATE, values)) for values in rows[CANDIDATE].itertuples(index=False)]
    rows, dropped = _one_row_each(rows)
    if dropped:
        notes.append(f"{dropped} (candidate, batch) rows were measured more than once: kept the row timed with tuned "
                     "configs (cached or shipped), then the newest run's")
    candidates = {key: _candidate(key, group) for key, group in rows.groupby("candidate", sort=False)}
    memory = [r.manifest.get("gpu_memory_bytes") for r in runs if r.manifest.get("gpu_memory_bytes")]
    return Sweep(preset, devices, [r.run_id for r in runs], rows, candidates, min(memory) if memory else None, notes)


def _run_order(run: Run) -> str:
    return str(run.manifest.get("finished_utc") or run.run_id)


def _one_row_each(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """One row per (candidate, batch): a tuned row before a default-config one, then the newest run's."""
    ordered = rows.sort_values(["tuned", "run_order"], ascending=[False, False], kind="stable")
    kept = ordered.drop_duplicates(subset=["candidate", "batch"], keep="first")
    return kept.sort_index().reset_index(drop=True), len(rows) - len(kept)


def _candidate(key: tuple, rows: pd.DataFrame) -> Candidate:
    sizes = [float(v) for c in ("bytes_per_request_predicted", "bytes_per_request_measured") for v in rows[c]
             if not is_blank(v)]
    return Candidate(*key, bytes_per_request=int(max(sizes)) if sizes else None)


# ------------------------------------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class Scored:
    """A candidate judged at one batch."""

    candidate: Candidate
    batch: int
    timing: Timing
    expected_tokens: float
    rest_us: float

    @property
    def tokens_per_s_per_request(self) -> float:
        return self.expected_tokens / (self.timing.median_us + self.rest_us) * 1e6

    @property
    def band(self) -> tuple[float, float]:
        """tokens/s per request at the p80 and p20 times: the noise of the figure."""
        return tuple(self.expected_tokens / (t + self.rest_us) * 1e6 for t in (self.timing.p80_us, self.timing.p20_us))

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.tokens_per_s_per_request

    @property
    def state_bytes(self) -> int | None:
        """The state of the whole batch in this candidate."""
        size = self.candidate.bytes_per_request
        return None if size is None else self.batch * size

    def to_dict(self) -> dict:
        t = self.timing
        return {
            **self.candidate.to_dict(), "timing": t.source, "timed_batches": list(t.batches), "timer": t.timer,
            "timed_accept": t.accept, "median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us,
            "rest_us": self.rest_us, "expected_tokens": self.expected_tokens,
            "tokens_per_s_per_request": self.tokens_per_s_per_request,
            "tokens_per_s_per_request_band": list(self.band), "tokens_per_s": self.tokens_per_s,
            "state_bytes": self.state_bytes,
        }  # fmt: skip


@dataclass
class BatchAdvice:
    """The candidates of one batch, best first, and the ones left out with the reason."""

    batch: int
    ranked: list[Scored]
    excluded: list[tuple[str, str]]

    @property
    def best(self) -> Scored | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> Scored | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def margin_pct(self) -> float | None:
        """How much more the best candidate yields than the runner-up, in percent."""
        if self.runner_up is None:
            return None
        return (self.best.tokens_per_s_per_request / self.runner_up.tokens_per_s_per_request - 1) * 100

    @property
    def inside_noise(self) -> bool | None:
        """Whether the best's p20-p80 band reaches the runner-up's: the rows cannot tell the two apart."""
        if self.runner_up is None:
            return None
        return self.best.band[0] <= self.runner_up.band[1]

    def to_dict(self) -> dict:
        return {
            "batch": self.batch, "best": self.best.candidate.label if self.best else None,
            "runner_up": self.runner_up.candidate.label if self.runner_up else None,
            "margin_pct": self.margin_pct, "inside_noise": self.inside_noise,
            "ranked": [s.to_dict() for s in self.ranked],
            "excluded": [{"label": label, "reason": reason} for label, reason in self.excluded],
        }  # fmt: skip


@dataclass
class Advice:
    sweep: Sweep
    acceptance: Acceptance
    budget_bytes: int | None
    budget_source: str
    rest_us: tuple[float, float]
    batches: list[BatchAdvice]
    notes: list[str]

    def concurrency(self) -> list[dict]:
        """Per candidate that ran: its state per request, the requests the budget holds, and what the runs saw."""
        out = []
        for key, cand in sorted(self.sweep.candidates.items(), key=lambda kv: _order(kv[1])):
            rows = self.sweep.candidate_rows(key)
            if (rows["status"] == Status.unsupported.value).all():
                continue
            passed = rows[rows["status"] == Status.passed.value]["batch"]
            oom = rows[rows["status"] == Status.oom.value]["batch"]
            fits = None
            if self.budget_bytes is not None and cand.bytes_per_request:
                fits = max_concurrency(cand.bytes_per_request, self.budget_bytes)
            out.append({**cand.to_dict(), "max_concurrency": fits,
                        "largest_passed_batch": int(passed.max()) if not passed.empty else None,
                        "smallest_oom_batch": int(oom.min()) if not oom.empty else None})
        return out

    def mode_concurrency(self) -> dict[str, dict]:
        """Per mode (and variant): the most requests any of its candidates fits in the budget, and which."""
        best: dict[str, dict] = {}
        for c in self.concurrency():
            name = c["mode"] if c["variant"] is None else f"{c['mode']}-{c['variant']}"
            if c["max_concurrency"] is not None and c["max_concurrency"] > best.get(name, {}).get("max_concurrency", -1):
                best[name] = c
        return best

    def to_dict(self) -> dict:
        return {
            "preset": self.sweep.preset, "devices": self.sweep.devices, "runs": self.sweep.runs,
            "accept": self.acceptance.spec, "budget_bytes": self.budget_bytes, "budget_source": self.budget_source,
            "rest_us": list(self.rest_us), "notes": self.notes, "batches": [b.to_dict() for b in self.batches],
            "max_concurrency": self.concurrency(),
            "mode_max_concurrency": {m: {"label": c["label"], "max_concurrency": c["max_concurrency"]}
                                     for m, c in self.mode_concurrency().items()},
        }  # fmt: skip


def _order(c: Candidate) -> tuple:
    return (mode_order(mode_label(c)), c.backend, c.drafts, c.state_dtype, str(c.act_dtype))


def parse_rest_us(value: str | None) -> tuple[float, float]:
    """`--rest-us A,B`: A + B * W microseconds a round for the rest of the model; (0, 0) when not given."""
    if value is None:
        return 0.0, 0.0
    parts = [p.strip() for p in str(value).split(",")]
    try:
        a, b = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--rest-us takes two numbers A,B (A + B * W us a round), got {value!r}") from None
    if not all(math.isfinite(x) and x >= 0 for x in (a, b)):
        raise ValueError(f"--rest-us A,B must be finite and >= 0, got {value!r}")
    return a, b


def resolve_budget(sweep: Sweep, budget_gib: float | None) -> tuple[int | None, str]:
    """The budget in bytes and where it came from; ValueError when it holds no request of any candidate."""
    if budget_gib is None:
        if sweep.device_memory_bytes is None:
            return None, "none (a CPU run, and no --budget-gib)"
        return sweep.device_memory_bytes, (f"{sweep.device_memory_bytes / GIB:.1f} GiB, the device's memory from the "
                                           "manifest, all of it for state (--budget-gib to set it)")
    if not math.isfinite(budget_gib) or budget_gib <= 0:
        raise ValueError(f"--budget-gib must be a finite number > 0, got {budget_gib}")
    budget = int(budget_gib * GIB)
    sizes = [c.bytes_per_request for c in sweep.candidates.values() if c.bytes_per_request]
    if sizes and budget < min(sizes):
        raise ValueError(f"--budget-gib {budget_gib:g} holds no request: the smallest state of one request is "
                         f"{_fmt_bytes(min(sizes))}")
    return budget, f"{budget_gib:g} GiB (--budget-gib)"


def advise(sweep: Sweep, acceptance: Acceptance, *, budget_bytes: int | None, budget_source: str = "",
           batches: Sequence[int] | None = None, rest_us: tuple[float, float] = (0.0, 0.0)) -> Advice:
    """Rank every candidate at each batch (default: the batches the rows measured)."""
    batches = sorted(batches) if batches else sweep.measured_batches()
    unsupported = {c.key for c, _ in sweep.unsupported()}
    live = [c for k, c in sweep.candidates.items() if k not in unsupported]
    out = [_judge(sweep, live, b, acceptance, budget_bytes, rest_us) for b in batches]
    return Advice(sweep, acceptance, budget_bytes, budget_source, rest_us, out, _notes(sweep, out, acceptance))


def _judge(sweep: Sweep, live: list[Candidate], batch: int, acceptance: Acceptance, budget: int | None,
           rest: tuple[float, float]) -> BatchAdvice:
    ranked, excluded = [], []
    for cand in sorted(live, key=_order):
        reason = None
        if budget is not None and cand.bytes_per_request is None:
            reason = "its rows give no bytes per request, so the budget cannot judge it"
        elif budget is not None and batch * cand.bytes_per_request > budget:
            reason = (f"needs {_fmt_bytes(batch * cand.bytes_per_request)} of state for {batch} requests, over the "
                      f"budget of {_fmt_bytes(budget)}")
        elif not acceptance.covers(cand.drafts):
            reason = f"the acceptance profile gives {len(acceptance.profile)} positions, not {cand.drafts} drafts"
        timing = sweep.timing(cand.key, batch)
        if reason is None and isinstance(timing, str):
            reason = timing
        if reason is not None:
            excluded.append((cand.label, reason))
            continue
        rest_us = rest[0] + rest[1] * (cand.drafts + 1)
        ranked.append(Scored(cand, batch, timing, acceptance.expected_tokens(cand.drafts), rest_us))
    if not any(c.drafts == 0 for c in live):  # no speculation is always a candidate: say when it cannot be judged
        excluded.append(("no speculation (drafts 0)", "not measured: no decode row in the runs"))
    ranked.sort(key=lambda s: (-s.tokens_per_s_per_request, _order(s.candidate)))
    return BatchAdvice(batch, ranked, excluded)


def _notes(sweep: Sweep, batches: list[BatchAdvice], acceptance: Acceptance) -> list[str]:
    notes = list(sweep.notes)
    accepts = sorted({str(a) for a in sweep.rows.loc[sweep.rows["drafts"] > 0, "accept"].dropna()})
    if accepts:
        notes.append(f"round times are the rows' own, measured under accept {', '.join(accepts)}; E[tokens per round] "
                     f"comes from {acceptance.spec}, taking a round's time as independent of how many drafts it accepts")
    if (sweep.rows["timer"] == "cpu-wall").any():
        notes.append("CPU wall-clock timings: they check the advice, they do not choose a GPU deployment")
    if any(s.timing.source == "interpolated" for b in batches for s in b.ranked):
        notes.append("interpolated: linear in batch between the nearest measured batches below and above (median, "
                     "p20 and p80 each); never extrapolated")
    for cand, reason in sweep.unsupported():
        notes.append(f"{cand.label}: unsupported in the runs ({reason})")
    return notes


def choice_map(sweep: Sweep, ps: Sequence[float], batches: Sequence[int], *, budget_bytes: int | None,
               rest_us: tuple[float, float] = (0.0, 0.0)) -> dict[tuple[int, float], Candidate | None]:
    """The best candidate at each (batch, geometric acceptance p); None where no candidate can be judged."""
    out = {}
    for p in ps:
        advice = advise(sweep, geometric(p), budget_bytes=budget_bytes, batches=batches, rest_us=rest_us)
        for b in advice.batches:
            out[(b.batch, p)] = b.best.candidate if b.best else None
    return out


def advise_runs(paths: Sequence[str | Path], preset: str, *, accept: str | None = None,
                accept_profile: str | None = None, budget_gib: float | None = None, batch: str | None = None,
                rest_us: str | None = None, allow_mixed: bool = False) -> Advice:
    """`harness advise` from its options: every option is checked (one-line ValueError) before the rows are judged."""
    from scenarios.options import parse_batches

    acceptance = parse_acceptance(accept, accept_profile)
    rest = parse_rest_us(rest_us)
    batches = parse_batches(batch) if batch is not None else None
    sweep = load_sweep(paths, preset, allow_mixed=allow_mixed)
    budget, source = resolve_budget(sweep, budget_gib)
    return advise(sweep, acceptance, budget_bytes=budget, budget_source=source, batches=batches, rest_us=rest)
