"""The acceptance model `harness advise` judges speculation by: the probability that draft i is accepted.

Two forms, one meaning: `a_i = P(draft i of a round is accepted)`, for i = 1, 2, ... (a draft is only
accepted when every draft before it is, so `a_i` cannot grow with i).

* `geometric:p`: each draft accepted with probability p until the first rejection (the scenarios'
  `--accept geometric:p`), so `a_i = p**i` at every position;
* a per-position profile `a_1,a_2,...,a_k` as serving engines report it (vLLM's per-position
  acceptance rate, e.g. 0.84,0.60,0.39,0.27): measured for the first k positions only, so a round of
  more than k drafts has no expectation here (advise says so rather than guess the tail).

A round of S drafts then yields `E[tokens per round] = 1 + a_1 + ... + a_S` accepted tokens: the
verified token always counts, and draft i counts exactly when it is accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

GEOMETRIC_HELP = "geometric:p with p in [0, 1]"
PROFILE_HELP = "a comma list of per-position acceptances in [0, 1] that never grow (0.84,0.60,0.39,0.27), or a file of them"


@dataclass(frozen=True)
class Acceptance:
    """`p` for geometric acceptance, else `profile` (a_1..a_k); `spec` is how it is written back."""

    spec: str
    p: float | None = None
    profile: tuple[float, ...] | None = None

    def covers(self, drafts: int) -> bool:
        """Whether the model says how often each of `drafts` drafts is accepted."""
        return self.profile is None or drafts <= len(self.profile)

    def accepted(self, position: int) -> float:
        """`a_i`: the probability that draft `position` (1-based) is accepted."""
        if position < 1 or not self.covers(position):
            raise ValueError(f"acceptance {self.spec} gives no probability for draft {position}")
        return self.p**position if self.profile is None else self.profile[position - 1]

    def expected_tokens(self, drafts: int) -> float:
        """E[tokens per round] of a round with `drafts` drafts: 1 + a_1 + ... + a_S."""
        return 1.0 + sum(self.accepted(i) for i in range(1, drafts + 1))


def geometric(p: float) -> Acceptance:
    return Acceptance(f"geometric:{p:g}", p=p)


def parse_acceptance(accept: str | None, accept_profile: str | None) -> Acceptance:
    """The model from `--accept geometric:p` or `--accept-profile LIST|FILE` (at most one; default geometric:0.7,
    the scenarios' default). Raises ValueError naming the option on anything malformed."""
    if accept is not None and accept_profile is not None:
        raise ValueError("--accept and --accept-profile are two ways to give the acceptance: give one")
    if accept_profile is not None:
        return _parse_profile(accept_profile)
    spec = "geometric:0.7" if accept is None else accept.strip()
    kind, _, arg = spec.partition(":")
    if kind != "geometric":
        raise ValueError(f"--accept takes {GEOMETRIC_HELP}, got {spec!r} (a per-position profile: --accept-profile)")
    p = _probability(arg, "--accept", spec)
    return geometric(p)


def _parse_profile(value: str) -> Acceptance:
    text = value.strip()
    if not re.fullmatch(r"[0-9eE.+\-,\s]+", text):  # not a list of numbers: a file of them
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"--accept-profile {value!r} is neither {PROFILE_HELP.split(', or')[0]} nor a file")
        lines = [line.split("#", 1)[0] for line in path.read_text(errors="replace").splitlines()]
        text = ",".join(part for line in lines for part in re.split(r"[\s,]+", line) if part)
        where = f"--accept-profile {value}"
    else:
        where = "--accept-profile"
    items = [x.strip() for x in text.split(",")]
    if not text or not all(items):
        raise ValueError(f"{where} needs {PROFILE_HELP}, got {text!r}")
    profile = tuple(_probability(x, where, text) for x in items)
    for i in range(1, len(profile)):
        if profile[i] > profile[i - 1]:
            raise ValueError(f"{where}: draft {i + 1} is accepted more often ({profile[i]:g}) than draft {i} "
                             f"({profile[i - 1]:g}), but a draft is only accepted after every draft before it")
    return Acceptance("profile:" + ",".join(f"{a:g}" for a in profile), profile=profile)


def _probability(text: str, where: str, spec: str) -> float:
    try:
        p = float(text)
    except ValueError:
        raise ValueError(f"{where} needs probabilities, got {spec!r}") from None
    if not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{where}: {text} is not a probability in [0, 1] (in {spec!r})")
    return p
