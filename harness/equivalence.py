"""Compare two tensors and say how far apart they are (SPEC §5).

`compare(actual, expected, ...)` returns a `Comparison`: whether the raw bits are equal, how many
elements differ and by how much (max abs, max relative, max ULP distance, RMS error ratio
`||a - b|| / ||b||` in fp64), where the first difference is, and whether it passes its policy:

* `bitwise`: every element has identical bits (so `-0.0` vs `0.0` and different NaN payloads fail);
* `rms`: `rms_ratio <= tolerance`;
* `ulp`: `max_ulp <= tolerance`.

NaN on either side never passes a tolerance policy. A long rollout compares the same pair once per
round; `Rollout` merges those into one `Comparison` (max of the maxima, summed mismatches, combined
RMS, the earliest first mismatch with its round) and keeps the per-round RMS series, so drift is
visible rather than only the last round. `EquivalenceReport` collects every comparison of a run and
renders `equivalence.json` / `equivalence.md`.

ULP distance: a float's bits, read as a sign-magnitude integer, map to a monotonic integer line
(`-magnitude` for negative, `+magnitude` for positive; both zeros sit at 0), and the distance is
the difference on that line: the number of representable values between the two. When the two
tensors have different dtypes (a backend against the fp64 reference), ULPs are counted in the
less precise dtype after rounding the other one to it; mismatches and abs/rel/RMS errors use the
exact values, widened to fp64. Integer tensors (pages, indices) count ULPs as the integer
difference.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

POLICIES = ("bitwise", "rms", "ulp")

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_INT64_MAX = torch.iinfo(torch.int64).max
# Fields that may hold a non-finite float, written to JSON as the strings "nan", "inf", "-inf".
_FLOAT_FIELDS = {
    "tolerance", "mismatch_frac", "max_abs", "max_rel", "rms_ratio", "first_actual", "first_expected",
    "rms_series", "rms_ratio_max", "err_sq_sum", "ref_sq_sum", "worst_abs",
}  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """One compared pair of tensors (or one pair over many rounds, see `Rollout`).

    Attributes:
        name: the tensor compared (`o`, `ssm`, `conv`, `page`, ...).
        lhs: what produced `actual` (e.g. `compact/triton`).
        rhs: what produced `expected` (e.g. `native/triton`, `fp64-reference`).
        contract: the SPEC §5 contract this comparison enforces.
        scenario: the scenario that made it (groups the markdown report).
        policy: `bitwise`, `rms` or `ulp`.
        tolerance: the bound of `rms` / `ulp`; None for `bitwise`.
        shape: shape of one round's tensors; dtype: `actual`'s dtype (and `expected`'s when it differs).
        numel: elements compared (summed over rounds).
        bitwise_equal: same dtype and identical bits everywhere.
        mismatches: elements whose bits (or, across dtypes, exact values) differ.
        mismatch_frac: mismatches / numel.
        nan_count: elements that are NaN in `actual` or `expected`.
        max_abs / max_rel / max_ulp: over elements where neither side is NaN.
        rms_ratio: `||a - b|| / ||b||` in fp64 (combined over rounds); NaN if any NaN.
        first_mismatch: the first differing element in row-major order: its index by dim name (plus
            `round` for a rollout), None when none differs.
        first_actual / first_expected: the two values there.
        passed: the policy holds (every round, for a rollout).
        rounds: rounds merged (1 for a single comparison).
        rms_series: per-round RMS ratio (a rollout's drift); empty for a single comparison.
        series_rounds: the round of each `rms_series` entry (states are compared on snapshot rounds only).
        rms_ratio_max / rms_ratio_max_round: the worst round's RMS ratio and its round.
        err_sq_sum / ref_sq_sum: `sum (a - b)^2` and `sum b^2` in fp64, kept so rounds combine.
        case: the case that made it (a readable label; empty outside a run).
        worst_at: where the worst error is: the element with the largest |a - b| (the first NaN if
            any), inside the worst unit of a rollout (with its `round`, and `layer` when given).
        worst_abs: |a - b| there (NaN for a NaN).
        units: (round, layer) units merged; failed_units: how many of them broke the policy.
        problem: why a comparison could not be made (e.g. no partner to compare with); such a
            comparison never passes.
    """

    name: str
    lhs: str
    rhs: str
    contract: str
    scenario: str
    policy: str
    tolerance: float | None
    shape: tuple[int, ...]
    dtype: str
    numel: int
    bitwise_equal: bool
    mismatches: int
    mismatch_frac: float
    nan_count: int
    max_abs: float
    max_rel: float
    max_ulp: int
    rms_ratio: float
    first_mismatch: dict[str, int] | None
    first_actual: float | None
    first_expected: float | None
    passed: bool
    rounds: int = 1
    rms_series: list[float] = field(default_factory=list)
    series_rounds: list[int] = field(default_factory=list)
    rms_ratio_max: float = 0.0
    rms_ratio_max_round: int | None = None
    err_sq_sum: float = 0.0
    ref_sq_sum: float = 0.0
    case: str = ""
    worst_at: dict[str, int] | None = None
    worst_abs: float = 0.0
    units: int = 1
    failed_units: int = 0
    problem: str = ""

    @property
    def title(self) -> str:
        """`contract 1 compact == native`: the contract by number and name."""
        return contract_title(self.contract, self.rhs)

    def to_dict(self) -> dict:
        """A JSON-ready dict; non-finite floats become the strings `nan`, `inf`, `-inf`."""
        return {k: _encode(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> Comparison:
        known = {f.name for f in fields(cls)}
        values = {k: _decode(v) if k in _FLOAT_FIELDS else v for k, v in d.items() if k in known}
        values["shape"] = tuple(values["shape"])
        return cls(**values)


def compare(actual: torch.Tensor, expected: torch.Tensor, **labels: Any) -> Comparison:
    """Compare `actual` against `expected` element by element (keywords: see `compare_each`).

    Raises:
        ValueError: shapes differ, an unknown policy, a tolerance missing or given for `bitwise`,
            more dim names than dims, or an unsupported dtype.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        name = labels.get("name", "")
        raise ValueError(f"{name}: shapes differ: actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}")
    return compare_each(actual.unsqueeze(0), expected.unsqueeze(0), **labels)[0]


# Elements reduced at once: bounds the fp64 / int64 temporaries of a comparison (about 40 bytes per element).
_CHUNK_ELEMENTS = 1 << 25


def compare_each(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    name: str,
    lhs: str,
    rhs: str,
    contract: str,
    policy: str,
    tolerance: float | None = None,
    dims: Sequence[str] | None = None,
    scenario: str = "",
) -> list[Comparison]:
    """`compare` of every index of dim 0 on its own (e.g. every layer of a round), in one pass.

    Each unit is judged alone, so a bad layer is never averaged with good ones; the reductions of all
    units run together where the tensors live (a few launches and two host syncs per chunk of units,
    whatever the number of units), so comparing a model's 36 layers costs about what one layer does.

    Args:
        actual, expected: tensors of the same shape `[units, ...]`; float (fp64/fp32/fp16/bf16/fp8) or
            integer.
        name, lhs, rhs, contract, scenario: labels carried into the report.
        policy: `bitwise`, `rms` (needs `tolerance` as the max RMS ratio) or `ulp` (needs
            `tolerance` as the max ULP distance).
        dims: names of the leading dims of one unit (dim 1 on) for the first-mismatch and worst-error
            indices, e.g. `("request", "head")`; dims not named are called `dim<i>`.

    Raises:
        ValueError: shapes differ, an unknown policy, a tolerance missing or given for `bitwise`,
            more dim names than dims, or an unsupported dtype.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(f"{name}: shapes differ: actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}")
    _check_policy(policy, tolerance)
    if actual.ndim < 1:
        raise ValueError(f"{name}: compare_each needs a leading unit dim, got a scalar")
    unit_shape = tuple(actual.shape[1:])
    names = _dim_names(dims, len(unit_shape), name)
    a = _as_comparable(actual.detach(), name)
    b = _as_comparable(expected.detach().to(a.device), name)
    dtype = str(actual.dtype).removeprefix("torch.")
    if expected.dtype != actual.dtype:
        dtype += " vs " + str(expected.dtype).removeprefix("torch.")
    labels = dict(name=name, lhs=lhs, rhs=rhs, contract=contract, scenario=scenario, policy=policy,
                  tolerance=tolerance, shape=unit_shape, dtype=dtype)
    same_dtype = actual.dtype == expected.dtype
    units, per_unit = a.shape[0], math.prod(unit_shape)
    if per_unit == 0:
        return [Comparison(**labels, numel=0, bitwise_equal=same_dtype, mismatches=0, mismatch_frac=0.0, nan_count=0,
                           max_abs=0.0, max_rel=0.0, max_ulp=0, rms_ratio=0.0, first_mismatch=None,
                           first_actual=None, first_expected=None,
                           passed=_passes(policy, tolerance, same_dtype, 0, 0.0, 0)) for _ in range(units)]
    a, b = a.reshape(units, per_unit), b.reshape(units, per_unit)
    step = max(1, _CHUNK_ELEMENTS // per_unit)
    stats = []
    for lo in range(0, units, step):
        stats += _unit_stats(a[lo : lo + step], b[lo : lo + step], same_dtype)
    out = []
    for mismatches, nan_count, max_ulp, first_i, first_nan, worst_i, max_abs, max_rel, err_sq, ref_sq, fa, fb in stats:
        if nan_count:
            err_sq = ref_sq = math.nan
        rms = _rms_ratio(err_sq, ref_sq)
        bitwise = mismatches == 0 and same_dtype
        passed = _passes(policy, tolerance, bitwise, nan_count, rms, max_ulp)
        worst_i = first_nan if nan_count else worst_i
        out.append(Comparison(
            **labels,
            numel=per_unit,
            bitwise_equal=bitwise,
            mismatches=mismatches,
            mismatch_frac=mismatches / per_unit,
            nan_count=nan_count,
            max_abs=max_abs,
            max_rel=max_rel,
            max_ulp=max_ulp,
            rms_ratio=rms,
            first_mismatch=dict(zip(names, _unravel(first_i, unit_shape))) if mismatches else None,
            first_actual=fa if mismatches else None,
            first_expected=fb if mismatches else None,
            passed=passed,
            rms_ratio_max=rms,
            err_sq_sum=err_sq,
            ref_sq_sum=ref_sq,
            worst_at=dict(zip(names, _unravel(worst_i, unit_shape))) if mismatches else None,
            worst_abs=(math.nan if nan_count else max_abs) if mismatches else 0.0,
            failed_units=0 if passed else 1,
        ))
    return out


def _unit_stats(a: torch.Tensor, b: torch.Tensor, same_dtype: bool) -> list[list]:
    """Per row of `[units, n]`: mismatches, NaNs, max ULP, first mismatch, first NaN, largest error (flat
    indices), max abs, max rel, sum (a - b)^2, sum b^2, and the two values at the first mismatch."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    if same_dtype:
        differ = _ordered_bits(a)[1] != _ordered_bits(b)[1]
    else:
        # Widening to fp64 is exact for every dtype we accept, so this compares exact values
        # (and the sign of zero, through the fp64 bits).
        differ = a64.view(torch.int64) != b64.view(torch.int64)
    nan = a64.isnan() | b64.isnan()
    valid = differ & ~nan
    zero = a64.new_zeros(())
    abs_err = torch.where(valid, (a64 - b64).abs(), zero)
    rel_err = torch.where(abs_err == 0, zero, abs_err / b64.abs())
    ulp = torch.where(valid, _ulp_distance(a, b), 0)
    first = differ.to(torch.int8).argmax(1, keepdim=True)  # the first True (argmax returns the first maximum)
    ints = torch.stack([differ.sum(1), nan.sum(1), ulp.amax(1), first[:, 0], nan.to(torch.int8).argmax(1),
                        abs_err.argmax(1)], dim=1)
    floats = torch.stack([abs_err.amax(1), rel_err.amax(1), ((a64 - b64) ** 2).sum(1), (b64**2).sum(1),
                          a64.gather(1, first)[:, 0], b64.gather(1, first)[:, 0]], dim=1)
    return [i + f for i, f in zip(ints.tolist(), floats.tolist())]


def unpaired(*, name: str, lhs: str, rhs: str, contract: str, scenario: str, policy: str, why: str,
             tolerance: float | None = None) -> Comparison:
    """A comparison that could not be made because `rhs` produced nothing to compare with: it fails, so a
    partner that went missing (out of memory, an error, a dropped variant) can never pass silently."""
    return Comparison(
        name=name, lhs=lhs, rhs=rhs, contract=contract, scenario=scenario, policy=policy, tolerance=tolerance,
        shape=(), dtype="", numel=0, bitwise_equal=False, mismatches=0, mismatch_frac=0.0, nan_count=0,
        max_abs=math.nan, max_rel=math.nan, max_ulp=0, rms_ratio=math.nan, first_mismatch=None, first_actual=None,
        first_expected=None, passed=False, rms_ratio_max=math.nan, failed_units=1, problem=f"no partner: {why}",
    )


class Rollout:
    """Merges the per-(round, layer) comparisons of one pair over a long rollout.

    Usage: `r = Rollout()`; each round (and layer) `r.add(round_index, compare(...), layer=l)`; then
    `r.result()`. Every added comparison must carry the same name, lhs, rhs, contract, scenario and policy.
    Each added comparison is one unit, judged on its own: the result passes only if every unit does, so a
    single bad (round, layer) is never averaged away by the rest of the rollout. `rms_series` holds one
    RMS ratio per round (the round's layers combined), the drift.
    """

    def __init__(self) -> None:
        self._units: list[tuple[int, int | None, Comparison]] = []

    def add(self, round_index: int, comparison: Comparison, layer: int | None = None) -> None:
        if self._units:
            first = self._units[0][2]
            for key in ("name", "lhs", "rhs", "contract", "scenario", "policy", "tolerance"):
                if getattr(first, key) != getattr(comparison, key):
                    raise ValueError(
                        f"rollout of {first.name!r}: round {round_index} has {key}={getattr(comparison, key)!r}, "
                        f"earlier rounds {getattr(first, key)!r}"
                    )
        self._units.append((round_index, layer, comparison))

    def result(self) -> Comparison:
        if not self._units:
            raise ValueError("rollout has no rounds")
        units = sorted(self._units, key=lambda u: (u[0], -1 if u[1] is None else u[1]))
        comps = [c for _, _, c in units]
        numel = sum(c.numel for c in comps)
        mismatches = sum(c.mismatches for c in comps)
        err_sq = sum(c.err_sq_sum for c in comps)
        ref_sq = sum(c.ref_sq_sum for c in comps)
        per_round: dict[int, list[float]] = {}
        for r, _, c in units:
            acc = per_round.setdefault(r, [0.0, 0.0])
            acc[0] += c.err_sq_sum
            acc[1] += c.ref_sq_sum
        series = [_rms_ratio(e, s) for _, (e, s) in sorted(per_round.items())]
        worst_r, worst_l, worst = max(units, key=lambda u: _severity(u[2]))
        worst_rms_r, _, worst_rms = max(units, key=lambda u: _nan_high(u[2].rms_ratio))
        first = next(((r, l, c) for r, l, c in units if c.first_mismatch is not None), None)
        problems = sorted({c.problem for c in comps if c.problem})
        return replace(
            comps[0],
            numel=numel,
            bitwise_equal=all(c.bitwise_equal for c in comps),
            mismatches=mismatches,
            mismatch_frac=mismatches / numel if numel else 0.0,
            nan_count=sum(c.nan_count for c in comps),
            max_abs=max(c.max_abs for c in comps),
            max_rel=max(c.max_rel for c in comps),
            max_ulp=max(c.max_ulp for c in comps),
            rms_ratio=_rms_ratio(err_sq, ref_sq),
            first_mismatch=None if first is None else _at(first[0], first[1], first[2].first_mismatch),
            first_actual=None if first is None else first[2].first_actual,
            first_expected=None if first is None else first[2].first_expected,
            passed=all(c.passed for c in comps),
            rounds=len(per_round),
            rms_series=series,
            series_rounds=sorted(per_round),
            rms_ratio_max=worst_rms.rms_ratio,
            rms_ratio_max_round=worst_rms_r,
            err_sq_sum=err_sq,
            ref_sq_sum=ref_sq,
            worst_at=None if worst.worst_at is None else _at(worst_r, worst_l, worst.worst_at),
            worst_abs=worst.worst_abs,
            units=len(comps),
            failed_units=sum(not c.passed for c in comps),
            problem="; ".join(problems),
        )


def _at(round_index: int, layer: int | None, where: dict[str, int]) -> dict[str, int]:
    lead = {"round": round_index} if layer is None else {"round": round_index, "layer": layer}
    return {**lead, **where}


def _severity(c: Comparison) -> tuple:
    """Orders units from best to worst: failing after passing, then by the policy's own measure."""
    measure = _nan_high(c.rms_ratio) if c.policy == "rms" else (c.max_ulp, c.mismatches)
    return (not c.passed, measure)


# Contract names (SPEC §5), used in every failure line next to the number.
CONTRACT_NAMES = {
    "1": "compact == native",
    "2": "replay vs native",
    "3": "vs fp64 reference",
    "4": "transfer/restore",
    "5": "untouched slots",
}


# A peer's kernels (a baseline backend) under the same comparisons as ours, reported, not gated (SPEC §5).
BASELINE_TITLE = "baseline: a peer's kernels vs the fp64 reference and our native (reported, not gated)"


def contract_title(contract: str, rhs: str = "fp64-reference") -> str:
    """`contract 1 compact == native`; contract 3 against another backend reads `backend agreement`."""
    if contract == "baseline":
        return BASELINE_TITLE
    if contract == "3" and rhs != "fp64-reference":
        return "contract 3 backend agreement"
    name = CONTRACT_NAMES.get(contract)
    return f"contract {contract} {name}" if name else contract


def failure_line(c: Comparison) -> str:
    """One line naming the case, the contract by name, the pair, the worst value and where it is."""
    head = f"FAIL {c.case or c.scenario}: {c.title}: {c.lhs} vs {c.rhs} {c.name}: "
    if c.problem:
        return head + c.problem
    units = f"; {c.failed_units} of {c.units} (round, layer) units fail" if c.units > 1 else ""
    where = _where(c.worst_at)
    if c.nan_count:
        return head + f"{c.nan_count} NaN, first at {where}{units}"
    if c.policy == "rms":
        return (head + f"RMS ratio {_fmt(c.rms_ratio_max)} > {_fmt(c.tolerance)}"
                + (f" at round {c.rms_ratio_max_round}" if c.rms_ratio_max_round is not None else "")
                + f" (worst unit), largest error {_fmt(c.worst_abs)} at {where}{units}")
    bound = "bitwise" if c.policy == "bitwise" else f"max ULP <= {_fmt(c.tolerance)}"
    return (head + f"{c.mismatches} of {c.numel} elements differ ({bound}), max ULP {c.max_ulp}, largest error "
            f"{_fmt(c.worst_abs)} at {where}; first at {_where(c.first_mismatch)}{units}")


def _where(at: dict[str, int] | None) -> str:
    return "-" if not at else "(" + ", ".join(f"{k} {v}" for k, v in at.items()) + ")"


class EquivalenceReport:
    """Every comparison of a run, in the order made."""

    def __init__(self, comparisons: Iterable[Comparison] = ()) -> None:
        self.comparisons: list[Comparison] = list(comparisons)

    def add(self, comparison: Comparison) -> None:
        self.comparisons.append(comparison)

    def extend(self, comparisons: Iterable[Comparison]) -> None:
        self.comparisons.extend(comparisons)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.passed]

    def summary(self) -> str:
        n, bad = len(self.comparisons), len(self.failures)
        verdict = "PASS" if bad == 0 else "FAIL"
        return f"{verdict}: {n - bad} of {n} comparisons passed, {bad} failed"

    def to_records(self) -> list[dict]:
        return [c.to_dict() for c in self.comparisons]

    def to_json(self) -> str:
        return json.dumps({"passed": self.passed, "comparisons": self.to_records()}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> EquivalenceReport:
        return cls(Comparison.from_dict(d) for d in json.loads(text)["comparisons"])

    def to_markdown(self) -> str:
        lines = ["# Equivalence", "", f"**{self.summary()}**"]
        groups: dict[tuple[str, str], list[Comparison]] = {}
        for c in self.comparisons:
            groups.setdefault((c.case or c.scenario, c.contract), []).append(c)
        header = (
            "| lhs vs rhs | tensor | bitwise | mismatches | max abs | max ULP | RMS ratio | tolerance | result "
            "| first mismatch |"
        )
        for (where, contract), comps in groups.items():
            lines += ["", f"## {where or '(no scenario)'}: {contract_title(contract)}", "", header,
                      "|" + " --- |" * 10]
            lines += [_markdown_row(c) for c in comps]
        lines += ["", *READING]
        return "\n".join(lines) + "\n"


# What readers asked about (issue 17), under every equivalence.md; docs/REPORTS.md says more.
READING = [
    "## Reading this",
    "",
    "* Contracts, tolerances and what the gate refuses: docs/CONTRACTS.md; every column: docs/REPORTS.md.",
    "* `N NaN` counts elements that are NaN on either side; a bitwise row passes with NaN only when both sides "
    "hold the same NaN bits at the same places. Byte comparisons (pages, untouched slots) compare integer words.",
    "* `max ULP` counts representable values between the two sides and misleads near zero, where they are "
    "densest: 5e-8 vs -4.5e-8 (9.5e-8 apart) is 1.7e9 ULP. Judge tolerance rows by max abs and the RMS ratio.",
    "* `RMS ratio` is ||a - b|| / ||b|| in fp64; a rollout is judged on its worst round (`worst ... @ round r`).",
]


def _markdown_row(c: Comparison) -> str:
    mism = f"{c.mismatches} ({c.mismatch_frac:.2%})" if c.mismatches else "0"
    if c.nan_count:
        mism += f", {c.nan_count} NaN"
    rms = _fmt(c.rms_ratio)
    if c.rounds > 1:
        rms += f" (worst {_fmt(c.rms_ratio_max)} @ round {c.rms_ratio_max_round}, {c.rounds} rounds)"
    if not c.passed and c.worst_at:
        rms += f", largest error {_fmt(c.worst_abs)} at {_where(c.worst_at)}"
    tol = "bitwise" if c.policy == "bitwise" else f"{c.policy} <= {_fmt(c.tolerance)}"
    first = "-"
    if c.problem:
        first = c.problem
    elif c.first_mismatch is not None:
        where = ", ".join(f"{k}={v}" for k, v in c.first_mismatch.items())
        first = f"{where}: {c.first_actual!r} vs {c.first_expected!r}"
    cells = [
        f"{c.lhs} vs {c.rhs}",
        c.name,
        "yes" if c.bitwise_equal else "no",
        mism,
        _fmt(c.max_abs),
        str(c.max_ulp),
        rms,
        tol,
        "PASS" if c.passed else "**FAIL**",
        first,
    ]
    return "| " + " | ".join(cells) + " |"


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _check_policy(policy: str, tolerance: float | None) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy == "bitwise" and tolerance is not None:
        raise ValueError(f"policy 'bitwise' takes no tolerance, got {tolerance}")
    if policy != "bitwise" and (tolerance is None or not tolerance >= 0):
        raise ValueError(f"policy {policy!r} needs a tolerance >= 0, got {tolerance}")


def _dim_names(dims: Sequence[str] | None, ndim: int, name: str) -> list[str]:
    dims = list(dims or [])
    if len(dims) > ndim:
        raise ValueError(f"{name}: {len(dims)} dim names {dims} for a tensor with {ndim} dims")
    return dims + [f"dim{i}" for i in range(len(dims), ndim)]


def _as_comparable(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_complex() or t.element_size() not in _INT_VIEW:
        raise ValueError(f"{name}: unsupported dtype {t.dtype}")
    if t.dtype == torch.uint64:
        raise ValueError(f"{name}: uint64 is not supported (its distance does not fit int64)")
    return t.contiguous()


def _ordered_bits(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(monotonic integer line position as int64, raw bits as int64) of each element."""
    if not t.is_floating_point():
        as_int = t.to(torch.int64)
        return as_int, as_int
    raw = t.view(_INT_VIEW[t.element_size()]).to(torch.int64)
    bits = 8 * t.element_size()
    magnitude = raw & ((1 << (bits - 1)) - 1)
    return torch.where(raw < 0, -magnitude, magnitude), raw


def _ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Representable values between `a` and `b` (NaN-free, same length), as int64 (saturating)."""
    if a.dtype != b.dtype:
        coarse = a.dtype if _eps(a.dtype) >= _eps(b.dtype) else b.dtype
        a, b = a.to(coarse), b.to(coarse)
    oa, ob = _ordered_bits(a)[0], _ordered_bits(b)[0]
    same_sign = (oa >= 0) == (ob >= 0)
    # Opposite signs: distance = |oa| + |ob|, which only fp64 can push past int64; it wraps negative.
    dist = torch.where(same_sign, (oa - ob).abs(), oa.abs() + ob.abs())
    return torch.where(dist < 0, torch.full_like(dist, _INT64_MAX), dist)


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 1.0


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return out[::-1]


def _rms_ratio(err_sq: float, ref_sq: float) -> float:
    if math.isnan(err_sq) or math.isnan(ref_sq):
        return math.nan
    if ref_sq == 0:
        return 0.0 if err_sq == 0 else math.inf
    return math.sqrt(err_sq / ref_sq)


def _passes(policy: str, tolerance: float | None, bitwise: bool, nan_count: int, rms: float, max_ulp: int) -> bool:
    if policy == "bitwise":
        return bitwise
    if nan_count:
        return False
    return rms <= tolerance if policy == "rms" else max_ulp <= tolerance


def _nan_high(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _encode(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list | tuple):
        return [_encode(x) for x in v]
    return v


def _decode(v):
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return float(v) if isinstance(v, str) else v
