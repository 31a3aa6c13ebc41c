"""Seeded inputs of an SSM scenario: parameters, initial state, and per round widths, acceptances and
token inputs (or the same read from a trace file, see results/trace.py).

Token inputs are generated per (round, layer) from their own seed, so a long rollout at model shape
never holds more than one round in memory and every mode sees exactly the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from states.geometry import SSMGeometry
from states.params import SSMParams, TokenInputs, make_params, make_token_inputs

ACCEPT_HELP = "all | none | fixed:k | geometric:p | trace (from --trace)"


@dataclass(frozen=True)
class AcceptModel:
    """How many drafts a request accepts in a round of width `w` (result in `[0, w - 1]`; -1 if idle).

    * `all`: every draft (`w - 1`); `none`: only the first token (0);
    * `fixed:k`: `min(k, w - 1)`;
    * `geometric:p`: each draft is accepted with probability p until the first rejection;
    * `trace`: taken from the trace file.
    """

    kind: str
    value: float = 0.0

    @classmethod
    def parse(cls, spec: str, drafts: int) -> AcceptModel:
        kind, _, arg = spec.partition(":")
        if kind in ("all", "none", "trace") and not arg:
            return cls(kind)
        if kind == "fixed":
            try:
                k = int(arg)
            except ValueError:
                raise ValueError(f"--accept fixed:k needs an integer k, got {spec!r}") from None
            if not 0 <= k <= drafts:
                raise ValueError(f"--accept fixed:{k} is outside [0, drafts = {drafts}]: accepted must be <= width - 1")
            return cls("fixed", k)
        if kind == "geometric":
            try:
                p = float(arg)
            except ValueError:
                raise ValueError(f"--accept geometric:p needs a probability, got {spec!r}") from None
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"--accept geometric:{p} is not a probability in [0, 1]")
            return cls("geometric", p)
        raise ValueError(f"--accept: unknown acceptance model {spec!r}; use {ACCEPT_HELP}")

    def sample(self, widths: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """`[n]` int32 accepted drafts for rows of `widths` (CPU tensors)."""
        w = widths.long()
        top = (w - 1).clamp_min(0)
        if self.kind == "all":
            acc = top
        elif self.kind == "none":
            acc = torch.zeros_like(w)
        elif self.kind == "fixed":
            acc = top.clamp_max(int(self.value))
        elif self.kind == "geometric":
            draws = torch.rand(w.shape[0], max(int(w.max()), 1), generator=gen) < self.value
            run = torch.cumprod(draws.long(), dim=1).sum(1)  # drafts accepted before the first rejection
            acc = torch.minimum(run, top)
        else:
            raise ValueError("acceptance comes from the trace file")
        return torch.where(w > 0, acc, -1).to(torch.int32)


@dataclass
class SSMWorkload:
    """Everything the modes of one case consume, identical for every mode and backend.

    Attributes:
        geom: the rank's linear-attention geometry.
        params: layer parameters (on the run device).
        init_ssm: `[n, L, HV, K, V]` state dtype, the requests' state before round 0.
        init_conv: `[n, L, conv_dim, kernel - 1]` activation dtype.
        width: W = drafts + 1 (packed inputs hold `n * W` rows).
        rounds: rounds in the rollout.
    """

    geom: SSMGeometry
    params: SSMParams
    init_ssm: torch.Tensor
    init_conv: torch.Tensor
    width: int
    rounds: int
    act_dtype: torch.dtype
    seed: int
    device: str
    widths_per_round: list[torch.Tensor]
    accepted_per_round: list[torch.Tensor]
    trace_inputs: list[list[TokenInputs]] | None = None
    gates: str = "random"  # gate inputs (states/params.py GATES): random | long-memory

    @property
    def batch(self) -> int:
        return self.init_ssm.shape[0]

    def widths(self, rnd: int) -> torch.Tensor:
        return self.widths_per_round[rnd]

    def accepted(self, rnd: int) -> torch.Tensor:
        return self.accepted_per_round[rnd]

    def inputs(self, rnd: int, layer: int) -> TokenInputs:
        """Packed `[n * W, ...]` inputs of `layer` in round `rnd`, on the run device."""
        if self.trace_inputs is not None:
            return self.trace_inputs[rnd][layer].to(self.device)
        gen = torch.Generator(device=self.device).manual_seed(_mix(self.seed, 1000 + rnd, layer))
        return make_token_inputs(self.geom, self.batch * self.width, self.act_dtype, gen, self.gates)


def build_workload(
    geom: SSMGeometry,
    *,
    batch: int,
    drafts: int,
    rounds: int,
    state_dtype: torch.dtype,
    act_dtype: torch.dtype,
    accept: AcceptModel,
    dynamic_widths: bool,
    seed: int,
    device: str,
    gates: str = "random",
) -> SSMWorkload:
    """Random (seeded) workload. States are never zero: they start as a random decayed history.
    `gates`: `random` or `long-memory` decays (states/params.py)."""
    gen = torch.Generator().manual_seed(_mix(seed, 0, 0))
    params = make_params(geom, act_dtype, gen, gates).to(device)
    L, HV, K, V = geom.layers, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    # drawn where they live: at model shapes the initial states are tens of GB on the CPU (seconds to
    # minutes a case); a CUDA run's seeded bits therefore differ from a CPU run's
    dgen = torch.Generator(device=device).manual_seed(_mix(seed, 0, 1))
    init_ssm = (torch.randn(batch, L, HV, K, V, generator=dgen, device=device) * K**-0.5).to(state_dtype)
    init_conv = torch.randn(batch, L, geom.conv_dim, geom.conv_kernel - 1, generator=dgen, device=device).to(act_dtype)
    W = drafts + 1
    widths, accepted = [], []
    for r in range(rounds):
        g = torch.Generator().manual_seed(_mix(seed, 1, r))
        w = torch.randint(0, W + 1, (batch,), generator=g) if dynamic_widths else torch.full((batch,), W)
        widths.append(w.to(torch.int32))
        accepted.append(accept.sample(w, g))
    return SSMWorkload(
        geom, params, init_ssm, init_conv, W, rounds, act_dtype, seed, device,
        [w.to(device) for w in widths], [a.to(device) for a in accepted], gates=gates,
    )


def _mix(seed: int, a: int, b: int) -> int:
    """A per-(round, layer) seed; distinct inputs give distinct seeds for any realistic sizes."""
    return (seed * 1_000_003 + a * 9_176 + b * 31 + 12345) % (2**63 - 1)


def expected_accepted_tokens(accept: AcceptModel, width: int) -> float:
    """Mean accepted tokens (accepted + 1) of a width-W round under `accept` (for reports)."""
    if accept.kind == "all":
        return float(width)
    if accept.kind == "none":
        return 1.0
    if accept.kind == "fixed":
        return 1.0 + min(accept.value, width - 1)
    if accept.kind == "geometric":
        p = accept.value
        return 1.0 + sum(p**i for i in range(1, width))
    return math.nan
