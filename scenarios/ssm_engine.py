"""Run the SSM state modes of one case side by side: compare round by round, then time each.

Equivalence (SPEC §5), in lockstep over the rollout, every comparison merged over rounds so drift is
reported:

* contract 1: compact vs native of the same backend, outputs and accepted states, bitwise;
* contract 2: replay vs native of the same backend: accepted (materialized) state bitwise with fp32
  state, outputs within the documented RMS bound;
* contract 3: every mode and backend vs the fp64 reference of §2 (outputs and states), and a backend
  against the torch backend of the same mode;
* contract 5: slots outside the batch are filled with random bits before the rollout and must be
  byte-identical after it.

Timing (SPEC §7) happens only for variants whose comparisons all passed, on a fresh pool loaded with
the same initial state (never on the pool the comparisons used): one round = begin_round + every
layer's forward + accept, repeated on the evolving state (replay crosses its folds at their natural
rate), through `ctx.bench` (CUDA graph replay on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kernels.gdn.naive import naive_recurrent_gdn
from kernels.kda.naive import naive_recurrent_kda
from scenarios import cost, tolerances
from scenarios.base import CaseResult, RunContext
from scenarios.ssm_workload import SSMWorkload
from states import MODES, SSMState, StateConfig, make_state
from states.base import DTYPE_NAMES

SPARE_SLOTS = 2  # poisoned slots that no round touches (contract 5)
OUT_DIMS = ("token", "head", "v")
STATE_DIMS = ("request", "layer", "head", "k", "v")
CONV_DIMS = ("request", "layer", "channel", "column")


@dataclass(frozen=True)
class SSMCase:
    """One point of an SSM scenario sweep (everything but the batch is shared by the sweep)."""

    scenario: str
    preset: str
    modes: tuple[str, ...]
    backends: tuple[str, ...]
    batch: int
    drafts: int
    rounds: int
    state_dtype: torch.dtype
    act_dtype: torch.dtype
    history_len: int
    history_dtype: torch.dtype
    accept: str
    snapshot_every: int
    options: dict[str, Any]  # the CLI options of the run (for repro commands and row identity)

    def config(self, mode: str, backend: str, device: str, capacity: int) -> StateConfig:
        return StateConfig(
            mode=mode, max_requests=capacity, drafts=self.drafts, state_dtype=self.state_dtype,
            act_dtype=self.act_dtype, history_len=self.history_len, history_dtype=self.history_dtype,
            backend=backend, device=device,
        )


Variant = tuple[str, str]  # (mode, backend)


def label(v: Variant) -> str:
    return f"{v[0]}/{v[1]}"


def run_ssm_case(case: SSMCase, wl: SSMWorkload, ctx: RunContext) -> CaseResult:
    """Compare every requested (mode, backend) over the rollout, then time the ones that passed."""
    result = CaseResult()
    g = wl.geom
    n, cap = wl.batch, wl.batch + SPARE_SLOTS
    variants = [(m, b) for b in case.backends for m in case.modes]
    states: dict[Variant, SSMState] = {}
    status: dict[Variant, tuple[str, str]] = {}
    slots: dict[Variant, torch.Tensor] = {}
    spare: dict[Variant, torch.Tensor] = {}
    before: dict[Variant, dict[str, torch.Tensor]] = {}
    measured: dict[Variant, float] = {}  # storage bytes per request of the pool actually allocated
    poison = torch.Generator().manual_seed(ctx.seed + 77)
    for v in variants:
        try:
            cls = MODES[v[0]]
            cls._validate_config(g, case.config(v[0], v[1], ctx.device, cap))
        except ValueError as e:
            status[v] = ("unsupported", str(e))
            continue
        with ctx.oom_guard() as guard:
            st = make_state(g, wl.params, case.config(v[0], v[1], ctx.device, cap))
            all_slots = st.alloc(cap)
            slots[v], spare[v] = all_slots[:n], all_slots[n:]
            st.load(slots[v], wl.init_ssm, wl.init_conv)
            st.fill_slot_rows(spare[v], poison)
            before[v] = {k: t.clone() for k, t in st.slot_rows(spare[v]).items()}
            states[v] = st
            measured[v] = st.measured_bytes_per_request()
        if guard.record is not None:
            status[v] = ("oom", guard.record.get("message", "CUDA out of memory"))
            result.ooms.append({**_identity(case, v), **guard.record})
    live = [v for v in variants if v in states]
    comparisons = _Comparisons(case, ctx, g.family)
    ref = _Reference(wl, case.options.get("check_requests") or ctx.check_requests) if live else None
    advance = ctx.progress(f"{case.scenario} {case.preset} batch {n}: rollout", wl.rounds)
    for r in range(wl.rounds):
        widths, accepted = wl.widths(r), wl.accepted(r)
        for v in live:
            states[v].begin_round(slots[v], widths)
        outs: dict[Variant, list[torch.Tensor]] = {v: [] for v in live}
        ref_outs = []
        for layer in range(g.layers):
            inputs = wl.inputs(r, layer)
            for v in live:
                outs[v].append(states[v].forward(layer, inputs))
            ref_outs.append(ref.layer(layer, inputs, widths, accepted))
        for v in live:
            states[v].accept(accepted)
        comparisons.outputs(r, outs, ref_outs, widths, ref.checked)
        if (r + 1) % case.snapshot_every == 0 or r == wl.rounds - 1:
            snaps = {v: states[v].snapshot(slots[v]) for v in live}
            comparisons.states(r, snaps, ref.states(), ref.checked)
            if ctx.dump_dir:
                _dump(ctx.dump_dir, case, r, outs, snaps, widths, accepted)
        elif ctx.dump_dir:
            _dump(ctx.dump_dir, case, r, outs, None, widths, accepted)
        advance()
    for v in live:
        after = states[v].slot_rows(spare[v])
        for name, t in before[v].items():
            c = ctx.compare(
                after[name], t, name=f"untouched {name}", lhs=label(v), rhs="before the rollout",
                contract="5", policy="bitwise", scenario=case.scenario,
            )
            comparisons.add(v, c)
    for v in live:
        status[v] = ("passed", "") if comparisons.passed(v) else ("mismatch", comparisons.why(v))
    states.clear()  # release the comparison pools before timing

    for v in variants:
        row = base_row(case, v, wl, ctx)
        if v in measured:
            row["bytes_per_request_measured"] = measured[v]
        st_name, reason = status[v]
        row["status"], row["reason"] = st_name, reason
        if st_name == "passed" and ctx.time_cases:
            timed, rec = _time_variant(case, v, wl, ctx)
            if rec is not None:
                row["status"], row["reason"] = "oom", rec.get("message", "CUDA out of memory")
                result.ooms.append({**_identity(case, v), **rec})
            else:
                row.update(timed)
        result.rows.append(row)
    return result


# ---------------------------------------------------------------------------------------------- compare
class _Comparisons:
    """Rollouts of every compared pair of the case; recorded into the run report at the end."""

    def __init__(self, case: SSMCase, ctx: RunContext, family: str) -> None:
        self.case, self.ctx, self.family = case, ctx, family
        self.rollouts: dict[tuple, Any] = {}
        self.single: list[tuple[Variant, Any]] = []
        self._recorded = False

    def _add_round(self, key: tuple, v: Variant, index: int, c: Any) -> None:
        if key not in self.rollouts:
            self.rollouts[key] = (v, self.ctx.rollout())
        self.rollouts[key][1].add(index, c)

    def add(self, v: Variant, c: Any) -> None:
        self.single.append((v, c))

    def _cmp(self, a, b, **kw):
        return self.ctx.compare(a, b, scenario=self.case.scenario, **kw)

    def outputs(self, r: int, outs, ref_outs, widths: torch.Tensor, checked: int) -> None:
        sd = self.case.state_dtype
        # packed rows: request r's tokens follow request r-1's, so valid rows are a prefix
        rows = slice(0, int(widths.long().sum()))
        ref_rows = slice(0, int(widths[:checked].long().sum()))
        for v, per_layer in outs.items():
            base = ("native", v[1])
            for layer, o in enumerate(per_layer):
                mine = o[rows]
                if v[0] != "native" and base in outs:
                    other = outs[base][layer][rows]
                    if v[0] == "compact":
                        c = self._cmp(mine, other, name="o", lhs=label(v), rhs=label(base), contract="1",
                                      policy="bitwise", dims=OUT_DIMS)
                    else:
                        c = self._cmp(mine, other, name="o", lhs=label(v), rhs=label(base), contract="2",
                                      policy="rms", tolerance=tolerances.replay_output_rms(sd, self.case.history_dtype),
                                      dims=OUT_DIMS)
                    self._add_round(("o", v, base), v, r, _with_layer(c, layer))
                torch_twin = (v[0], "torch")
                if v[1] != "torch" and torch_twin in outs:
                    c = self._cmp(mine, outs[torch_twin][layer][rows], name="o", lhs=label(v), rhs=label(torch_twin),
                                  contract="3", policy="rms", tolerance=tolerances.backend_rms(sd), dims=OUT_DIMS)
                    self._add_round(("o", v, torch_twin), v, r, _with_layer(c, layer))
                if checked and ref_outs[layer] is not None:
                    c = self._cmp(o[ref_rows], ref_outs[layer], name="o", lhs=label(v), rhs="fp64-reference",
                                  contract="3", policy="rms", tolerance=self._ref_tol(v), dims=OUT_DIMS)
                    self._add_round(("o", v, "ref"), v, r, _with_layer(c, layer))

    def states(self, r: int, snaps, ref_states, checked: int) -> None:
        sd = self.case.state_dtype
        for v, (ssm, conv) in snaps.items():
            base = ("native", v[1])
            if v[0] != "native" and base in snaps:
                bssm, bconv = snaps[base]
                bitwise = v[0] == "compact" or sd == torch.float32
                contract = "1" if v[0] == "compact" else "2"
                kw = {"policy": "bitwise"} if bitwise else {"policy": "rms", "tolerance": tolerances.backend_rms(sd)}
                c = self._cmp(ssm, bssm, name="ssm", lhs=label(v), rhs=label(base), contract=contract,
                              dims=STATE_DIMS, **kw)
                self._add_round(("ssm", v, base), v, r, c)
                c = self._cmp(conv, bconv, name="conv", lhs=label(v), rhs=label(base), contract=contract,
                              policy="bitwise", dims=CONV_DIMS)
                self._add_round(("conv", v, base), v, r, c)
            twin = (v[0], "torch")
            if v[1] != "torch" and twin in snaps:
                c = self._cmp(ssm.float(), snaps[twin][0].float(), name="ssm", lhs=label(v), rhs=label(twin),
                              contract="3", policy="rms", tolerance=tolerances.backend_rms(sd), dims=STATE_DIMS)
                self._add_round(("ssm", v, twin), v, r, c)
            if checked:
                c = self._cmp(ssm[:checked], ref_states, name="ssm", lhs=label(v), rhs="fp64-reference",
                              contract="3", policy="rms", tolerance=self._ref_tol(v), dims=STATE_DIMS)
                self._add_round(("ssm", v, "ref"), v, r, c)

    def _ref_tol(self, v: Variant) -> float:
        hist = self.case.history_dtype if v[0] == "replay" else torch.float32
        return tolerances.reference_rms(self.family, self.case.state_dtype, hist)

    def _results(self) -> list[tuple[Variant, Any]]:
        return [(v, ro.result()) for v, ro in self.rollouts.values()] + self.single

    def passed(self, v: Variant) -> bool:
        self._record()
        return all(c.passed for w, c in self._final if w == v)

    def why(self, v: Variant) -> str:
        bad = [c for w, c in self._final if w == v and not c.passed]
        return "; ".join(f"{c.name} vs {c.rhs} (contract {c.contract}, {_summary(c)})" for c in bad[:3])

    def _record(self) -> None:
        if not self._recorded:
            self._final = self._results()
            for _, c in self._final:
                self.ctx.record(c)
            self._recorded = True


def _summary(c) -> str:
    if c.policy == "bitwise":
        return f"{c.mismatches} of {c.numel} elements differ, max ULP {c.max_ulp}"
    return f"RMS ratio {c.rms_ratio:.3g} > {c.tolerance:.3g}"


def _with_layer(c, layer: int):
    if c.first_mismatch is None:
        return c
    return replace(c, first_mismatch={"layer": layer, **c.first_mismatch})


# -------------------------------------------------------------------------------------------- reference
class _Reference:
    """The fp64 reference of §2 for the first `checked` requests: per request and layer, the accepted
    state and conv window, advanced round by round along the accepted tokens."""

    def __init__(self, wl: SSMWorkload, check_requests: int | None) -> None:
        self.wl, g = wl, wl.geom
        self.checked = wl.batch if check_requests is None else min(check_requests, wl.batch)
        self.S = wl.init_ssm[: self.checked].double().clone()  # [c, L, HV, K, V]
        self.conv = wl.init_conv[: self.checked].clone()  # [c, L, C, kernel - 1]
        self.fn = naive_recurrent_gdn if g.family == "gdn" else naive_recurrent_kda

    def layer(self, layer: int, inputs, widths: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor | None:
        if not self.checked:
            return None
        g, p = self.wl.geom, self.wl.params
        w = widths.long().tolist()
        acc = accepted.long().tolist()
        starts = [0]
        for x in w[:-1]:
            starts.append(starts[-1] + x)
        outs = []
        for r in range(self.checked):
            if w[r] == 0:
                continue
            rows = slice(starts[r], starts[r] + w[r])
            extra = {} if g.family == "gdn" else {"lower_bound": g.lower_bound}
            o, S, win = self.fn(
                inputs.mixed_qkv[rows], inputs.a[rows], inputs.b[rows], self.conv[r, layer], self.S[r, layer],
                p.conv_weight[layer], p.A_log[layer], p.dt_bias[layer], g.key_heads, **extra,
            )
            outs.append(o)
            self.S[r, layer] = S[acc[r]]
            self.conv[r, layer] = win[acc[r]]
        if not outs:
            return torch.zeros(0, g.value_heads, g.head_v_dim, dtype=torch.float64, device=self.S.device)
        return torch.cat(outs)

    def states(self) -> torch.Tensor:
        return self.S


# ---------------------------------------------------------------------------------------------- timing
def _time_variant(case: SSMCase, v: Variant, wl: SSMWorkload, ctx: RunContext) -> tuple[dict, dict | None]:
    """Time one round of all layers on a fresh pool; returns (row fields, oom record or None)."""
    g, n = wl.geom, wl.batch
    fields: dict[str, Any] = {}
    with ctx.oom_guard() as guard:
        cfg = case.config(v[0], v[1], ctx.device, n)
        st = make_state(g, wl.params, cfg)
        slots = st.alloc(n)
        st.load(slots, wl.init_ssm, wl.init_conv)
        widths, accepted = wl.widths(0), wl.accepted(0)
        inputs = [wl.inputs(0, layer) for layer in range(g.layers)]

        def one_round() -> None:
            st.begin_round(slots, widths, validate=False)
            for layer in range(g.layers):
                st.forward(layer, inputs[layer])
            st.accept(accepted, validate=False)

        timing = ctx.bench(one_round)
    if guard.record is not None:
        return {}, guard.record
    tokens = float((accepted.long() + 1).clamp_min(0).sum())
    round_bytes = _round_bytes(case, v, g, cfg, widths, accepted)
    fields.update(
        timer=timing.timer, samples=timing.n_samples, median_us=timing.median_us, p20_us=timing.p20_us,
        p80_us=timing.p80_us, noise_pct=timing.noise_pct, tokens_per_s=tokens / (timing.median_us * 1e-6),
        bytes_moved=round_bytes, achieved_gbps=round_bytes / (timing.median_us * 1e-6) / 1e9,
    )
    name = "d2d-copy" if "d2d-copy" in ctx.ceilings else "cpu-memcpy"
    ceiling = ctx.ceilings.get(name, {}).get("gbps")
    if ceiling:
        fields.update(ceiling_name=name, ceiling_gbps=ceiling, ceiling_pct=100 * fields["achieved_gbps"] / ceiling)
    if getattr(timing, "fallback_reason", None):
        fields["reason"] = f"timer fallback: {timing.fallback_reason}"
    return fields, None


def _round_bytes(case: SSMCase, v: Variant, g, cfg: StateConfig, widths, accepted) -> float:
    if v[0] == "replay":
        counts = torch.zeros_like(widths.cpu(), dtype=torch.long)
        _, counts = cost.steady_replay_round_bytes(g, cfg, widths, accepted, counts, rounds=4 * case.history_len)
        return cost.steady_replay_round_bytes(g, cfg, widths, accepted, counts, rounds=4 * case.history_len)[0]
    return cost.ROUND_BYTES[v[0]](g, cfg, widths, accepted)


# ------------------------------------------------------------------------------------------------- rows
def _identity(case: SSMCase, v: Variant) -> dict[str, Any]:
    g_fam = case.options.get("family", "")
    return {
        "scenario": case.scenario, "family": g_fam, "mode": v[0], "backend": v[1], "preset": case.preset,
        "batch": case.batch, "drafts": case.drafts,
    }


def base_row(case: SSMCase, v: Variant, wl: SSMWorkload, ctx: RunContext) -> dict[str, Any]:
    g = wl.geom
    cfg = case.config(v[0], v[1], ctx.device, wl.batch)
    row = {
        **_identity(case, v),
        "family": g.family,
        "device": ctx.device,
        "width": case.drafts + 1,
        "accept": case.accept,
        "state_dtype": DTYPE_NAMES[case.state_dtype],
        "act_dtype": DTYPE_NAMES[case.act_dtype],
        "history_len": case.history_len if v[0] == "replay" else None,
        "history_dtype": DTYPE_NAMES[case.history_dtype] if v[0] == "replay" else None,
        "layers": g.layers,
        "config": "",
        "config_source": "",
        "repro": ctx.repro({**case.options, "modes": v[0], "backend": v[1], "batch": str(case.batch)}),
    }
    try:
        terms = MODES[v[0]].bytes_per_request(g, cfg)
        row["bytes_per_request_predicted"] = terms["total"]
        budget = case.options.get("memory_budget_gib")
        if budget:
            row["max_concurrency"] = int(budget * 2**30 // terms["total"])
    except ValueError:
        pass
    return row


def _dump(root: str, case: SSMCase, r: int, outs, snaps, widths, accepted) -> None:
    """Write each variant's round outputs (and accepted states on snapshot rounds), see docs/TRACE_FORMAT.md."""
    for v, per_layer in outs.items():
        d = Path(root) / f"{case.scenario}-{case.preset}-b{case.batch}" / f"{v[0]}-{v[1]}"
        d.mkdir(parents=True, exist_ok=True)
        item = {"round": r, "widths": widths.cpu(), "accepted": accepted.cpu(),
                "outputs": torch.stack([o.cpu() for o in per_layer])}
        if snaps is not None:
            item["ssm"], item["conv"] = (t.cpu() for t in snaps[v])
        torch.save(item, d / f"round-{r:05d}.pt")
