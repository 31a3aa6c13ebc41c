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

import torch

POLICIES = ("bitwise", "rms", "ulp")

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_INT64_MAX = torch.iinfo(torch.int64).max
# Fields that may hold a non-finite float, written to JSON as the strings "nan", "inf", "-inf".
_FLOAT_FIELDS = {
    "tolerance", "mismatch_frac", "max_abs", "max_rel", "rms_ratio", "first_actual", "first_expected",
    "rms_series", "rms_ratio_max", "err_sq_sum", "ref_sq_sum",
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
        rms_ratio_max / rms_ratio_max_round: the worst round's RMS ratio and its round.
        err_sq_sum / ref_sq_sum: `sum (a - b)^2` and `sum b^2` in fp64, kept so rounds combine.
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
    rms_ratio_max: float = 0.0
    rms_ratio_max_round: int | None = None
    err_sq_sum: float = 0.0
    ref_sq_sum: float = 0.0

    def to_dict(self) -> dict:
        """A JSON-ready dict; non-finite floats become the strings `nan`, `inf`, `-inf`."""
        return {k: _encode(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> Comparison:
        known = {f.name for f in fields(cls)}
        values = {k: _decode(v) if k in _FLOAT_FIELDS else v for k, v in d.items() if k in known}
        values["shape"] = tuple(values["shape"])
        return cls(**values)


def compare(
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
) -> Comparison:
    """Compare `actual` against `expected` element by element.

    Args:
        actual, expected: tensors of the same shape; float (fp64/fp32/fp16/bf16/fp8) or integer.
        name, lhs, rhs, contract, scenario: labels carried into the report.
        policy: `bitwise`, `rms` (needs `tolerance` as the max RMS ratio) or `ulp` (needs
            `tolerance` as the max ULP distance).
        dims: names of the leading dims for the first-mismatch index, e.g.
            `("request", "layer", "head")`; dims not named are called `dim<i>`.

    Raises:
        ValueError: shapes differ, an unknown policy, a tolerance missing or given for `bitwise`,
            more dim names than dims, or an unsupported dtype.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(f"{name}: shapes differ: actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}")
    _check_policy(policy, tolerance)
    names = _dim_names(dims, actual.ndim, name)
    a = _as_comparable(actual.detach().cpu(), name)
    b = _as_comparable(expected.detach().cpu(), name)
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    a64, b64 = a_flat.to(torch.float64), b_flat.to(torch.float64)
    numel = a_flat.numel()

    if a.dtype == b.dtype:
        differ = _ordered_bits(a_flat)[1] != _ordered_bits(b_flat)[1]
    else:
        # Widening to fp64 is exact for every dtype we accept, so this compares exact values
        # (and the sign of zero, through the fp64 bits).
        differ = a64.view(torch.int64) != b64.view(torch.int64)
    nan = a64.isnan() | b64.isnan()
    mismatches = int(differ.sum())
    valid = differ & ~nan

    if valid.any():
        abs_err = (a64[valid] - b64[valid]).abs()
        ref = b64[valid].abs()
        rel_err = torch.where(abs_err == 0, torch.zeros_like(abs_err), abs_err / ref)
        max_abs, max_rel = float(abs_err.max()), float(rel_err.max())
        max_ulp = int(_ulp_distance(a_flat[valid], b_flat[valid]).max())
    else:
        max_abs = max_rel = 0.0
        max_ulp = 0

    if nan.any():
        err_sq = ref_sq = math.nan
    else:
        err_sq = float(((a64 - b64) ** 2).sum())
        ref_sq = float((b64**2).sum())

    first = first_a = first_b = None
    if mismatches:
        flat_index = int(differ.nonzero()[0, 0])
        first = dict(zip(names, _unravel(flat_index, tuple(actual.shape))))
        first_a, first_b = float(a64[flat_index]), float(b64[flat_index])

    dtype = str(actual.dtype).removeprefix("torch.")
    if expected.dtype != actual.dtype:
        dtype += " vs " + str(expected.dtype).removeprefix("torch.")
    rms = _rms_ratio(err_sq, ref_sq)
    nan_count = int(nan.sum())
    bitwise = mismatches == 0 and actual.dtype == expected.dtype
    return Comparison(
        name=name,
        lhs=lhs,
        rhs=rhs,
        contract=contract,
        scenario=scenario,
        policy=policy,
        tolerance=tolerance,
        shape=tuple(actual.shape),
        dtype=dtype,
        numel=numel,
        bitwise_equal=bitwise,
        mismatches=mismatches,
        mismatch_frac=mismatches / numel if numel else 0.0,
        nan_count=nan_count,
        max_abs=max_abs,
        max_rel=max_rel,
        max_ulp=max_ulp,
        rms_ratio=rms,
        first_mismatch=first,
        first_actual=first_a,
        first_expected=first_b,
        passed=_passes(policy, tolerance, bitwise, nan_count, rms, max_ulp),
        rms_ratio_max=rms,
        err_sq_sum=err_sq,
        ref_sq_sum=ref_sq,
    )


class Rollout:
    """Merges the per-round comparisons of one pair over a long rollout.

    Usage: `r = Rollout()`; each round `r.add(round_index, compare(...))`; then `r.result()`.
    Every added comparison must carry the same name, lhs, rhs, contract, scenario and policy.
    """

    def __init__(self) -> None:
        self._rounds: list[tuple[int, Comparison]] = []

    def add(self, round_index: int, comparison: Comparison) -> None:
        if self._rounds:
            first = self._rounds[0][1]
            for key in ("name", "lhs", "rhs", "contract", "scenario", "policy", "tolerance"):
                if getattr(first, key) != getattr(comparison, key):
                    raise ValueError(
                        f"rollout of {first.name!r}: round {round_index} has {key}={getattr(comparison, key)!r}, "
                        f"earlier rounds {getattr(first, key)!r}"
                    )
        self._rounds.append((round_index, comparison))

    def result(self) -> Comparison:
        if not self._rounds:
            raise ValueError("rollout has no rounds")
        rounds = sorted(self._rounds, key=lambda rc: rc[0])
        comps = [c for _, c in rounds]
        numel = sum(c.numel for c in comps)
        mismatches = sum(c.mismatches for c in comps)
        err_sq = sum(c.err_sq_sum for c in comps)
        ref_sq = sum(c.ref_sq_sum for c in comps)
        series = [c.rms_ratio for c in comps]
        worst_round, worst = max(rounds, key=lambda rc: _nan_high(rc[1].rms_ratio))
        first_round, first = next(((r, c) for r, c in rounds if c.first_mismatch is not None), (None, None))
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
            first_mismatch=None if first is None else {"round": first_round, **first.first_mismatch},
            first_actual=None if first is None else first.first_actual,
            first_expected=None if first is None else first.first_expected,
            passed=all(c.passed for c in comps),
            rounds=len(comps),
            rms_series=series,
            rms_ratio_max=worst.rms_ratio,
            rms_ratio_max_round=worst_round,
            err_sq_sum=err_sq,
            ref_sq_sum=ref_sq,
        )


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
            groups.setdefault((c.scenario, c.contract), []).append(c)
        header = (
            "| lhs vs rhs | tensor | bitwise | mismatches | max abs | max ULP | RMS ratio | tolerance | result "
            "| first mismatch |"
        )
        for (scenario, contract), comps in groups.items():
            lines += ["", f"## {scenario or '(no scenario)'}: {contract}", "", header, "|" + " --- |" * 10]
            lines += [_markdown_row(c) for c in comps]
        return "\n".join(lines) + "\n"


def _markdown_row(c: Comparison) -> str:
    mism = f"{c.mismatches} ({c.mismatch_frac:.2%})" if c.mismatches else "0"
    if c.nan_count:
        mism += f", {c.nan_count} NaN"
    rms = _fmt(c.rms_ratio)
    if c.rounds > 1:
        rms += f" (worst {_fmt(c.rms_ratio_max)} @ round {c.rms_ratio_max_round}, {c.rounds} rounds)"
    tol = "bitwise" if c.policy == "bitwise" else f"{c.policy} <= {_fmt(c.tolerance)}"
    first = "-"
    if c.first_mismatch is not None:
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
