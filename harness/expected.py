"""What the gate expects each case to produce, so a variant cannot pass by going missing (SPEC §5).

The expectation comes from the case as planned, never from the rows the scenario wrote: every
(mode, variant, backend) of an SSM case (its modes x the variants asked for each mode x its backends),
and every (variant, backend) of a KV page case, must show up as rows whose status is `passed`. The
only other statuses accepted are the ones the spec predicts:

* `unsupported` where SPEC says so: compact without drafts (§3: compact stores a verify round's
  records); replay's `matrix*` variants with a bf16 history (their fold reads the stored d's). (A TP degree that does not divide a hybrid preset's SSM heads is refused when planning, so a
  state page is never expected to be unsupported);
* `oom` where the memory budget predicted it: the pool of the row's predicted bytes per request
  (§3 formulas) for the whole batch does not fit in the device memory free now.

Anything else (a missing row, a `mismatch` or `error` row, an `oom` the budget did not predict, an
`unsupported` the spec does not sanction) is a failing `RowCheck` with one line saying which and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.memory import predicted_fits

# Page row directions of the staged variant (the bulk copy and the device halves); all others are direct.
STAGED_DIRECTIONS = {"d2h-staged", "h2d-staged", "gather", "scatter"}


@dataclass(frozen=True)
class RowCheck:
    """One expected variant of a case and what its rows say."""

    case: str
    variant: str  # `compact-deferred/torch`, `staged/triton`, `state page/torch`
    status: str  # the rows' worst status, or `missing`
    reason: str
    passed: bool

    @property
    def name(self) -> str:
        return f"expected variant {self.variant}"

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict} {self.case}: {self.name}: {self.status}" + (f" ({self.reason})" if self.reason else "")


def check_case(label: str, case: Any, rows: list[dict[str, Any]], device: str) -> list[RowCheck]:
    """Every expected variant of `case` against the `rows` it produced."""
    if hasattr(case, "variants_of"):
        return _check_ssm(label, case, rows, device)
    return _check_pages(label, case, rows, device)


def _check_ssm(label: str, case: Any, rows: list[dict[str, Any]], device: str) -> list[RowCheck]:
    import torch

    from scenarios.ssm_engine import Variant, label as variant_label
    from states.base import BACKENDS, MATRIX_FOLD_PRECISION

    checks = []
    # from the case's own axes, not from the engine's run list: a variant the engine drops is still expected
    expected = [Variant(m, var, b) for b in case.backends if b in BACKENDS  # the peers' are baselines, not gated
                for m in case.modes for var in case.variants_of(m)]
    for v in expected:
        mine = [r for r in rows if (r.get("mode"), r.get("variant") or "", r.get("backend")) == tuple(v)]
        allowed = "compact mode needs drafts (docs/CONTRACTS.md)" if v.mode == "compact" and case.drafts < 1 else ""
        if v.mode == "replay" and v.variant in MATRIX_FOLD_PRECISION and case.history_dtype != torch.float32:
            allowed = "replay's matrix fold reads the stored d's, so it needs an fp32 history (docs/CONTRACTS.md)"
        checks.append(_judge(label, variant_label(v), mine, allowed, case.batch, device))
    return checks


def _check_pages(label: str, case: Any, rows: list[dict[str, Any]], device: str) -> list[RowCheck]:
    checks = []
    for backend in case.backends:
        for variant in case.variants:
            mine = [r for r in rows if r.get("backend") == backend and r.get("direction") != "roundtrip"
                    and _page_variant(r.get("direction", "")) == variant]
            checks.append(_judge(label, f"{variant}/{backend}", mine, "", 1, device))
    ssm = getattr(case, "ssm", None)
    if ssm is not None:  # the hybrid state page follows the KV pages (torch, untimed)
        mine = [r for r in rows if r.get("direction") == "roundtrip"]
        checks.append(_judge(label, "state page/torch", mine, "", 1, device))
    return checks


def _page_variant(direction: str) -> str:
    return "staged" if direction in STAGED_DIRECTIONS else "direct"


def _judge(label: str, variant: str, rows: list[dict[str, Any]], unsupported_ok: str, batch: int,
           device: str) -> RowCheck:
    if not rows:
        return RowCheck(label, variant, "missing", "no row: the variant was dropped", False)
    bad = [r for r in rows if r.get("status") != "passed"]
    if not bad:
        return RowCheck(label, variant, "passed", "", True)
    row = bad[0]
    status, reason = row.get("status") or "no status", row.get("reason") or ""
    if status == "unsupported":
        if unsupported_ok:
            return RowCheck(label, variant, status, f"as the spec says: {unsupported_ok}", True)
        return RowCheck(label, variant, status, f"{reason}; the spec supports this variant", False)
    if status == "oom":
        predicted = _oom_predicted(row, batch, device)
        if predicted:
            return RowCheck(label, variant, status, f"predicted by the memory budget: {predicted}", True)
        return RowCheck(label, variant, status, f"{reason}; the memory budget predicted it fits", False)
    return RowCheck(label, variant, status, reason, False)


def _oom_predicted(row: dict[str, Any], batch: int, device: str) -> str:
    """Why the budget predicted this out-of-memory, or "" when it predicted the case fits (or cannot say)."""
    per_request = row.get("bytes_per_request_predicted")
    if per_request is None or per_request != per_request:  # no prediction (NaN or absent)
        return ""
    need = int(per_request) * batch
    fits, free = predicted_fits(need, device)
    return "" if fits else f"{need / 2**30:.1f} GiB for the batch, {free / 2**30:.1f} GiB free"
