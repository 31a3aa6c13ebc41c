"""Run the SSM state modes of one case side by side: compare round by round, then time each.

Equivalence (SPEC §5), in lockstep over the rollout, every comparison merged over rounds so drift is
reported:

* contract 1: compact vs native of the same backend, outputs and accepted states, bitwise (the
  `accept-precompute*` variants: states bitwise, outputs within replay's RMS bound);
* contract 2: replay vs native of the same backend: accepted (materialized) state bitwise with fp32
  state, outputs within the documented RMS bound;
* contract 3: every mode and backend vs the fp64 reference of §2 (outputs and states), and a backend
  against the torch backend of the same mode;
* contract 5: slots outside the batch are filled with random bits before the rollout and must be
  byte-identical after it.

Baselines (the peers' kernels, scenarios/ssm_baselines.py) run the same rollout and timing as a mode of
ours; their comparisons (against the fp64 reference and against our native) are reported, not gated
(SPEC §5 last paragraph): their bound only tells a precision difference from a broken adapter.

Timing (SPEC §7) happens only for variants whose comparisons all passed, on a fresh pool loaded with
the same initial state (never on the pool the comparisons used): one round = begin_round + every
layer's forward + accept, repeated on the evolving state (replay crosses its folds at their natural
rate), through `ctx.bench` (CUDA graph replay on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kernels.gdn.naive import naive_recurrent_gdn
from kernels.kda.naive import naive_recurrent_kda
from scenarios import cost, ssm_baselines, tolerances
from scenarios.base import CaseResult, RunContext
from scenarios.ssm_baselines import BaselineState, is_baseline
from scenarios.ssm_workload import SSMWorkload
from states import MODES, SSMState, StateConfig, make_state
from states.base import DTYPE_NAMES, MODE_VARIANTS, exact_fold, precompute_precision
from states.compact import CompactState
from states.geometry import SSMGeometry

SPARE_SLOTS = 2  # poisoned slots that no round touches (contract 5)
# Runs compare accepted states for at most this many requests (all outputs are); the gate asks for all of
# them (`snapshot_requests: "all"`) on every round.
SNAPSHOT_REQUESTS = 64
# A baseline's comparisons: reported, not gated (SPEC §5); the bound only catches a broken adapter.
BASELINE_POLICY = {"contract": "baseline", "policy": "rms", "tolerance": tolerances.BASELINE_SANITY_RMS}
OUT_DIMS = ("token", "head", "v")
STATE_DIMS = ("request", "layer", "head", "k", "v")
CONV_DIMS = ("request", "layer", "channel", "column")
LAYER_STATE_DIMS = ("request", "head", "k", "v")  # one layer of a snapshot (the layer goes with the round)
LAYER_CONV_DIMS = ("request", "channel", "column")


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
    compact_commits: tuple[str, ...] = ("accept",)  # compact variants to run (--compact-commit)
    replay_forwards: tuple[str, ...] = ("inline",)  # replay variants to run (--replay-forward)
    gates: str = "random"  # gate inputs (--gates): random | long-memory

    @property
    def label(self) -> str:
        """The case in one readable line (gate failure lines, JUnit names): what tells it apart."""
        parts = [self.scenario, self.preset, f"{DTYPE_NAMES[self.state_dtype]} state", f"batch {self.batch}"]
        if self.drafts:
            parts += [f"drafts {self.drafts}", f"accept {self.accept}"]
        parts.append(f"{self.rounds} rounds")
        if "replay" in self.modes:
            parts.append(f"Lh {self.history_len}" + (f" {DTYPE_NAMES[self.history_dtype]} history"
                                                     if self.history_dtype != torch.float32 else ""))
        if self.act_dtype != torch.bfloat16:
            parts.append(f"{DTYPE_NAMES[self.act_dtype]} act")
        if self.gates != "random":
            parts.append(f"{self.gates} gates")
        return " ".join(parts[:1]) + " " + ", ".join(parts[1:])

    @property
    def variants(self) -> list[Variant]:
        """Every (mode, variant, backend) the case runs, in run order: torch before triton (the twin a
        triton variant is checked against), native first per backend, the baselines (the peers' kernels)
        after ours: they are compared with our native."""
        backends = sorted(self.backends, key=lambda b: (b != "torch", is_baseline(b)))
        modes = sorted(self.modes, key=lambda m: m != "native")
        return [Variant(m, var, b) for b in backends for m in modes for var in self.variants_of(m, b)]

    def config(self, mode: str, backend: str, device: str, capacity: int, variant: str = "") -> StateConfig:
        return StateConfig(
            mode=mode, max_requests=capacity, drafts=self.drafts, state_dtype=self.state_dtype,
            act_dtype=self.act_dtype, history_len=self.history_len, history_dtype=self.history_dtype,
            variant=variant, backend=backend, device=device,
        )

    def variants_of(self, mode: str, backend: str = "") -> tuple[str, ...]:
        """The variants of `mode` this case runs (the mode's only variant for native; a baseline's own,
        e.g. SGLang's dot precision)."""
        if is_baseline(backend):
            return ssm_baselines.variants(backend, mode, str(self.options.get("family") or "gdn"),
                                          str(self.options.get("device") or "cpu"))
        return {"compact": self.compact_commits, "replay": self.replay_forwards}.get(mode, MODE_VARIANTS[mode])


class Variant(NamedTuple):
    """One pool configuration a case runs: a mode, its variant and a backend."""

    mode: str
    variant: str
    backend: str

    def config(self, case: SSMCase, device: str, capacity: int) -> StateConfig:
        return case.config(self.mode, self.backend, device, capacity, self.variant)


def label(v: Variant) -> str:
    """`compact/triton` for a mode's default variant, `compact-deferred/triton` for another."""
    default = MODE_VARIANTS[v.mode][0]
    name = v.mode if v.variant in ("", default) else f"{v.mode}-{v.variant}"
    return f"{name}/{v.backend}"


def run_ssm_case(case: SSMCase, wl: SSMWorkload, ctx: RunContext) -> CaseResult:
    """Compare every requested (mode, backend) over the rollout, then time the ones that passed.

    Variants run one after another (only one pool on the device at a time, so a variant that does not
    fit becomes an `oom` row without taking the others down); the outputs and states of the variants
    others are compared against (native of each backend, the torch twin of each mode) are kept.
    """
    result = CaseResult()
    g = wl.geom
    variants = case.variants
    checked = min(wl.batch, case.options.get("check_requests") or ctx.check_requests or wl.batch)
    comparisons = _Comparisons(case, ctx, g.family, _Reference(wl, checked), variants)
    status: dict[Variant, tuple[str, str]] = {}
    measured: dict[Variant, float] = {}  # storage bytes per request of the pool actually allocated
    ooms: set[str] = set()  # labels of the variants that ran out of memory: nothing to compare against
    for v in variants:
        why = _unsupported(v, case, g, ctx.device)
        if why:
            status[v] = ("unsupported", why)
            continue
        with ctx.oom_guard() as guard, ctx.phase("rollout"):
            measured[v] = _rollout(v, case, wl, ctx, comparisons)
        if guard.record is not None:
            status[v] = ("oom", guard.record.get("message", "CUDA out of memory"))
            result.ooms.append({**_identity(case, v), **guard.record})
            comparisons.forget(v)
            ooms.add(label(v))
        else:
            status[v] = comparisons.status(v, ooms)
    comparisons.record()
    comparisons.release()

    def cfg_of(v: Variant) -> StateConfig:
        return v.config(case, ctx.device, wl.batch)

    for v in variants:
        row = base_row(case, v, wl, ctx)
        if v in measured:
            row["bytes_per_request_measured"] = measured[v]
        st_name, reason = status[v]
        row["status"], row["reason"] = st_name, reason
        if st_name == "unsupported":  # no valid pool of this config exists, so no memory to predict
            row.pop("bytes_per_request_predicted", None), row.pop("max_concurrency", None)
        if st_name == "passed" and ctx.time_cases:
            with ctx.phase("timing"):
                timed, rec = _time_variant(case, v, wl, ctx)
            if rec is not None:
                row["status"], row["reason"] = "oom", rec.get("message", "CUDA out of memory")
                result.ooms.append({**_identity(case, v), **rec})
            else:
                row.update(timed, reason="; ".join(filter(None, [row["reason"], timed.get("reason")])))
        if is_baseline(v.backend) and st_name != "unsupported":  # which peer functions, layout and precision
            row["reason"] = "; ".join(filter(None, [row["reason"], ssm_baselines.describe(v.backend, g, cfg_of(v))]))
        result.rows.append(row)
    return result


def launch_rollouts(case: SSMCase, wl: SSMWorkload, ctx: RunContext) -> None:
    """Every Triton variant of the case over the first rounds of its rollout, nothing compared, dumped or
    timed: the launches a compile-ahead pass records (harness/gate.py). `2 Lh + 4` rounds reach every
    specialization the whole rollout launches (replay's ring overflows and folds well within them)."""
    rounds = min(wl.rounds, 2 * case.history_len + 4)
    for v in case.variants:
        if v.backend == "triton" and not _unsupported(v, case, wl.geom, ctx.device):  # the real run says why
            _rollout(v, case, wl, ctx, None, rounds)


def _unsupported(v: Variant, case: SSMCase, g: SSMGeometry, device: str) -> str:
    """Why no pool of this variant exists for the case (compact without drafts, say; a peer that lacks the
    mode or is not installed), or "" if one does."""
    if is_baseline(v.backend):
        return ssm_baselines.unsupported(v.backend, g, v.config(case, device, 1))
    try:
        MODES[v.mode]._validate_config(g, v.config(case, device, 1))
    except ValueError as e:
        return str(e)
    return ""


def _rollout(v: Variant, case: SSMCase, wl: SSMWorkload, ctx: RunContext, comparisons: _Comparisons | None,
             rounds: int | None = None) -> float:
    """One variant over the whole rollout on its own pool (its first `rounds` rounds, without comparisons
    when `comparisons` is None); returns its measured bytes per request."""
    g, n = wl.geom, wl.batch
    st = _make_state(g, wl.params, v.config(case, ctx.device, n + SPARE_SLOTS))
    _use_tuned_configs(st, ctx, n)
    all_slots = st.alloc(n + SPARE_SLOTS)
    slots, spare = all_slots[:n], all_slots[n:]
    st.load(slots, wl.init_ssm, wl.init_conv)
    before = {}
    if comparisons is not None:  # a launch pass checks nothing, so its spare slots need no poison
        st.fill_slot_rows(spare, torch.Generator().manual_seed(ctx.seed + 77))
        before = {k: t.clone() for k, t in st.slot_rows(spare).items()}
    measured = st.measured_bytes_per_request()
    shown = slots[: snapshot_requests(case, n)]
    advance = ctx.progress(f"{case.scenario} {case.preset} batch {n}: {label(v)}", wl.rounds)
    rounds = wl.rounds if rounds is None else rounds
    for r in range(rounds):
        widths, accepted = wl.widths(r), wl.accepted(r)
        valid = int(widths.long().sum())  # packed rows: every request's tokens follow the previous one's
        st.begin_round(slots, widths)
        outs = None  # [L, valid, HV, V]: the round's outputs, copied as each layer returns them
        for layer in range(g.layers):
            o = st.forward(layer, wl.inputs(r, layer))[:valid]
            if outs is None:
                outs = o.new_empty((g.layers, *o.shape))
            outs[layer] = o
        st.accept(accepted)
        if comparisons is None:
            st.snapshot(shown)  # its launches, nothing to compare
            continue
        comparisons.outputs(v, r, outs, widths)
        snap = None
        if (r + 1) % case.snapshot_every == 0 or r == wl.rounds - 1:
            snap = st.snapshot(shown)
            comparisons.state(v, r, snap)
        if ctx.dump_dir:
            _dump(ctx.dump_dir, case, v, r, outs, snap, widths, accepted)
        advance()
    if comparisons is None:
        return measured
    after = st.slot_rows(spare)
    for name, t in before.items():
        # compared as bit patterns: the spare rows hold whatever bits were there (random ones include NaN
        # encodings), and contract 5 is about bytes, so a float view would report NaN counts and ULPs of noise
        comparisons.add(v, ctx.compare(_bits(after[name]), _bits(t), name=f"untouched {name}", lhs=label(v),
                                       rhs="before the rollout", contract="5", policy="bitwise",
                                       scenario=case.scenario))
    return measured


def _make_state(g: SSMGeometry, params, cfg: StateConfig) -> SSMState:
    """Our mode's pool, or a peer's behind the same protocol."""
    return BaselineState(g, params, cfg) if is_baseline(cfg.backend) else make_state(g, params, cfg)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as signed integers of the same width (the same bytes, no float semantics)."""
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def snapshot_requests(case: SSMCase, batch: int) -> int:
    """How many requests' accepted states a round compares: all of them for the gate, else the first
    `SNAPSHOT_REQUESTS` (a snapshot of every request at model shape and large batch would not fit)."""
    asked = case.options.get("snapshot_requests")
    return batch if asked == "all" else min(batch, int(asked or SNAPSHOT_REQUESTS))


# ---------------------------------------------------------------------------------------------- compare
class _Comparisons:
    """Every compared pair of the case, merged over the rollout; recorded into the run report at the end.

    Kept (on the run's device, compared there): the outputs and accepted states of the variants others
    are checked against: native of each backend (contracts 1, 2) and the torch twin of each mode (backend
    agreement, contract 3). The fp64 reference advances lazily with the rounds.

    Every comparison is judged per (round, layer): outputs per layer as they come, accepted states
    split by layer. A partner that the case runs but that left nothing to compare with (out of memory,
    an error) is an unpaired comparison, which fails: a missing partner never passes silently.

    A baseline (a peer's kernels) is compared with our native (triton, else torch) and with the fp64
    reference under contract `baseline`: reported, judged only against `tolerances.BASELINE_SANITY_RMS`
    (an error that large is a broken adapter, not a precision).
    """

    def __init__(self, case: SSMCase, ctx: RunContext, family: str, ref: _Reference, variants: list[Variant]) -> None:
        self.case, self.ctx, self.family, self.ref = case, ctx, family, ref
        self.runs = set(variants)
        self.keep = {v for v in self.runs if (v.mode == "native" or v.backend == "torch") and not is_baseline(v.backend)}
        self.outs: dict[tuple, torch.Tensor] = {}
        self.snaps: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rollouts: dict[tuple, tuple[Variant, Any]] = {}
        self.single: list[tuple[Variant, Any]] = []
        self.missing: dict[tuple, tuple[Variant, Any]] = {}  # unpaired comparisons, one per pair

    def _add_round(self, key: tuple, v: Variant, index: int, c: Any, layer: int | None = None) -> None:
        if key not in self.rollouts:
            self.rollouts[key] = (v, self.ctx.rollout())
        self.rollouts[key][1].add(index, c, layer=layer)

    def add(self, v: Variant, c: Any) -> None:
        self.single.append((v, c))

    def _cmp(self, a, b, **kw):
        return self.ctx.compare(a, b, scenario=self.case.scenario, **kw)

    def _partners(self, v: Variant) -> list[tuple[Variant, str]]:
        """(variant to compare against, relation) for v: its backend's native, its torch twin; only
        partners the case runs (`--modes compact` alone has no native to compare with); a baseline's is our
        native."""
        if is_baseline(v.backend):
            ours = [Variant("native", "", b) for b in ("triton", "torch") if Variant("native", "", b) in self.runs]
            return [(ours[0], "baseline")] if ours else []
        out = []
        if v.mode != "native":
            out.append((Variant("native", "", v.backend), "mode"))
        if v.backend != "torch":
            out.append((v._replace(backend="torch"), "backend"))
        return [(other, rel) for other, rel in out if other in self.runs]

    def _unpaired(self, name: str, v: Variant, other: Variant, **kw) -> None:
        key = (name, v, other)
        if key not in self.missing:
            why = f"{label(other)} left no {name} to compare with (it did not run to the end: see its row)"
            self.missing[key] = (v, self.ctx.unpaired(name=name, lhs=label(v), rhs=label(other),
                                                      scenario=self.case.scenario, why=why, **kw))

    def _output_policy(self, v: Variant, rel: str) -> dict[str, Any]:
        sd, hd = self.case.state_dtype, self.case.history_dtype
        if rel == "baseline":
            return BASELINE_POLICY
        if rel == "mode" and v.mode == "compact":
            if precompute_precision(v.mode, v.variant) is None:
                return {"contract": "1", "policy": "bitwise"}
            # accept-precompute*: states bitwise (the commit is accept's), outputs from the matrix form by
            # the bound replay's take (no intermediate state rounding, the same products)
            bound = tolerances.replay_output_rms(self.family, sd)
            return {"contract": "1", "policy": "rms", "tolerance": tolerances.variant_output_rms(v.variant, bound)}
        if rel == "mode":
            bound = tolerances.replay_output_rms(self.family, sd, hd)
            return {"contract": "2", "policy": "rms", "tolerance": tolerances.variant_output_rms(v.variant, bound)}
        # replay's outputs read the history; a bf16 one rounds differently on the two backends (tolerances)
        bound = tolerances.backend_rms(self.family, sd, hd if v.mode == "replay" else torch.float32)
        return {"contract": "3", "policy": "rms", "tolerance": tolerances.variant_output_rms(v.variant, bound)}

    def _each(self, a: torch.Tensor, b: torch.Tensor, **kw) -> list[Any]:
        """One comparison per layer (dim 0 of `a` and `b`), reduced together."""
        return self.ctx.compare_each(a, b, scenario=self.case.scenario, **kw)

    def _add_layers(self, key: tuple, v: Variant, r: int, comps: list[Any], widths: list[int] | None = None) -> None:
        for layer, c in enumerate(comps):
            self._add_round(key, v, r, by_request(c, widths), layer)

    def outputs(self, v: Variant, r: int, outs: torch.Tensor, widths: torch.Tensor) -> None:
        """Round `r`'s outputs of every layer, `[L, rows, HV, V]` (packed rows of the round's tokens)."""
        w = widths.tolist()  # request widths: name the request of a packed row, and the reference's rows
        for other, rel in self._partners(v):
            kw = self._output_policy(v, rel)
            base = self.outs.get((other, r))
            if base is None:
                self._unpaired("o", v, other, **kw)
                continue
            self._add_layers(("o", v, other), v, r,
                             self._each(outs, base, name="o", lhs=label(v), rhs=label(other), dims=OUT_DIMS, **kw), w)
        with self.ctx.phase("reference"):
            ref = self.ref.outputs(r)
        if ref is not None:
            rows = sum(w[: self.ref.checked])
            self._add_layers(("o", v, "ref"), v, r,
                             self._each(outs[:, :rows], ref, name="o", lhs=label(v), rhs="fp64-reference",
                                        dims=OUT_DIMS, **self._ref_policy(v, outputs=True)), w)
        if v in self.keep:
            self.outs[(v, r)] = outs

    def state(self, v: Variant, r: int, snap: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Round `r`'s accepted states (`[n, L, ...]` ssm and conv of the snapshot requests), per layer."""
        sd = self.case.state_dtype
        ssm, conv = snap
        by_layer = ssm.transpose(0, 1)
        for other, rel in self._partners(v):
            if rel == "mode":
                contract = "1" if v.mode == "compact" else "2"
                # replay's matrix fold keeps the fp32 contract by tolerance, every other fold bit for bit
                bitwise = v.mode == "compact" or (sd == torch.float32 and exact_fold(v.mode, v.variant))
            else:
                contract, bitwise = "3", False
            tol = tolerances.backend_rms(self.family, sd)
            kw = {"policy": "bitwise"} if bitwise else {"policy": "rms", "tolerance": tol}
            if rel == "baseline":
                kw = dict(BASELINE_POLICY)
                contract = kw.pop("contract")
            if (other, r) not in self.snaps:
                self._unpaired("ssm", v, other, contract=contract, **kw)
                continue
            bssm, bconv = self.snaps[(other, r)]
            a, b = by_layer, bssm.transpose(0, 1)
            a, b = (a, b) if bitwise else (a.float(), b.float())
            self._add_layers(("ssm", v, other), v, r,
                             self._each(a, b, name="ssm", lhs=label(v), rhs=label(other), contract=contract,
                                        dims=LAYER_STATE_DIMS, **kw))
            if rel == "mode":
                self._add_layers(("conv", v, other), v, r,
                                 self._each(conv.transpose(0, 1), bconv.transpose(0, 1), name="conv", lhs=label(v),
                                            rhs=label(other), contract=contract, policy="bitwise",
                                            dims=LAYER_CONV_DIMS))
        with self.ctx.phase("reference"):
            ref = self.ref.state(r)
        if ref is not None:
            checked = min(self.ref.checked, ssm.shape[0])
            self._add_layers(("ssm", v, "ref"), v, r,
                             self._each(by_layer[:, :checked], ref[:checked].transpose(0, 1), name="ssm", lhs=label(v),
                                        rhs="fp64-reference", dims=LAYER_STATE_DIMS, **self._ref_policy(v)))
        if v in self.keep:
            self.snaps[(v, r)] = (ssm.clone(), conv.clone())

    def forget(self, v: Variant) -> None:
        """A variant that ran out of memory: drop its partial comparisons and anything kept from it (the
        variants that would have been compared with it then fail as unpaired)."""
        self.rollouts = {k: val for k, val in self.rollouts.items() if val[0] != v}
        self.single = [(w, c) for w, c in self.single if w != v]
        self.missing = {k: val for k, val in self.missing.items() if val[0] != v}
        self.outs = {k: t for k, t in self.outs.items() if k[0] != v}
        self.snaps = {k: t for k, t in self.snaps.items() if k[0] != v}

    def _ref_policy(self, v: Variant, outputs: bool = False) -> dict[str, Any]:
        """Contract 3 against the fp64 reference at the mode's bound (outputs of a variant outside the fp32
        contract at its own, `tolerances.variant_output_rms`); a baseline's is reported (`BASELINE_POLICY`)."""
        if is_baseline(v.backend):
            return BASELINE_POLICY
        hist = self.case.history_dtype if v.mode == "replay" else torch.float32
        bound = tolerances.reference_rms(self.family, self.case.state_dtype, hist, mode=v.mode)
        return {"contract": "3", "policy": "rms",
                "tolerance": tolerances.variant_output_rms(v.variant, bound) if outputs else bound}

    def _final(self, v: Variant) -> list[Any]:
        return ([ro.result() for w, ro in self.rollouts.values() if w == v] + [c for w, c in self.single if w == v]
                + [c for w, c in self.missing.values() if w == v])

    def _failed(self, v: Variant) -> list[Any]:
        return [c for c in self._final(v) if not c.passed]

    def status(self, v: Variant, ooms: set[str]) -> tuple[str, str]:
        """The row's (status, reason) once `v` ran to the end: `passed`, or `mismatch` with why. A variant
        whose only failed comparisons are against partners in `ooms` (native at a batch the device cannot
        hold, where replay and compact still fit) stays `passed`, its timing kept, and its reason says which
        contracts went unchecked; those comparisons still fail in the equivalence report (the gate and the
        run's exit code refuse a contract left unchecked)."""
        bad = self._failed(v)
        if not bad:
            return "passed", ""
        if all(c.problem and c.rhs in ooms for c in bad):
            unchecked = sorted({f"contract {c.contract} vs {c.rhs}" for c in bad})
            return "passed", f"unchecked ({', '.join(unchecked)}: out of memory); every other comparison passed"
        return "mismatch", "; ".join(f"{c.name} vs {c.rhs} (contract {c.contract}, {_summary(c)})" for c in bad[:3])

    def record(self) -> None:
        for _, ro in self.rollouts.values():
            self.ctx.record(ro.result())
        for _, c in self.single:
            self.ctx.record(c)
        for _, c in self.missing.values():
            self.ctx.record(c)

    def release(self) -> None:
        self.outs.clear()
        self.snaps.clear()


def _summary(c) -> str:
    if c.problem:
        return c.problem
    if c.policy == "bitwise":
        return f"{c.mismatches} of {c.numel} elements differ, max ULP {c.max_ulp}"
    return f"worst RMS ratio {c.rms_ratio_max:.3g} > {c.tolerance:.3g} at round {c.rms_ratio_max_round}"


def by_request(c, widths: list[int] | None):
    """Name the request of a packed output row: `token` (row) becomes (`request`, `token` in the request)."""
    if widths is None:
        return c

    def split(at: dict | None) -> dict | None:
        if not at or "token" not in at:
            return at
        row, start = at["token"], 0
        for req, w in enumerate(widths):
            if row < start + w:
                return {"request": req, "token": row - start, **{k: v for k, v in at.items() if k != "token"}}
            start += w
        return at

    return replace(c, first_mismatch=split(c.first_mismatch), worst_at=split(c.worst_at))


# -------------------------------------------------------------------------------------------- reference
class _Reference:
    """The fp64 reference of §2 for the first `checked` requests: per layer, the accepted state and conv
    window of every checked request, advanced round by round along the accepted tokens, all requests at
    once on the run's device (`naive_recurrent_fp64` batched: each request's W tokens padded to the round
    width; tokens past a request's width are computed and dropped, which cannot change earlier tokens).
    Computed once, lazily, as the first variant walks the rounds; outputs and snapshot-round states are
    kept."""

    def __init__(self, wl: SSMWorkload, checked: int) -> None:
        self.wl, g = wl, wl.geom
        self.checked = checked
        self.S = wl.init_ssm[:checked].double().clone()  # [c, L, HV, K, V]
        self.conv = wl.init_conv[:checked].clone()  # [c, L, C, kernel - 1]
        self.fn = naive_recurrent_gdn if g.family == "gdn" else naive_recurrent_kda
        self.done = 0  # rounds advanced
        self.outs: dict[int, torch.Tensor] = {}  # round -> [L, rows, HV, V]
        self.states: dict[int, torch.Tensor] = {}

    def _advance_to(self, r: int) -> None:
        while self.done <= r:
            rnd = self.done
            widths, accepted = self.wl.widths(rnd), self.wl.accepted(rnd)
            self.outs[rnd] = torch.stack([self._layer(layer, self.wl.inputs(rnd, layer), widths, accepted)
                                          for layer in range(self.wl.geom.layers)])
            self.states[rnd] = self.S.clone()
            self.done += 1

    def outputs(self, r: int) -> torch.Tensor | None:
        """`[L, rows, HV, V]` fp64 outputs of the checked requests in round `r`."""
        if not self.checked:
            return None
        self._advance_to(r)
        return self.outs[r]

    def state(self, r: int) -> torch.Tensor | None:
        if not self.checked:
            return None
        self._advance_to(r)
        return self.states[r]

    def _layer(self, layer: int, inputs, widths: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        g, p, c, W = self.wl.geom, self.wl.params, self.checked, self.wl.width
        w = widths[:c].long()
        start = torch.cumsum(widths.long(), 0)[:c] - w  # packed row of each request's first token
        rows = (start[:, None] + torch.arange(W, device=w.device)).clamp_max(inputs.mixed_qkv.shape[0] - 1)
        extra = {} if g.family == "gdn" else {"lower_bound": g.lower_bound}
        o, S, win = self.fn(
            inputs.mixed_qkv[rows], inputs.a[rows], inputs.b[rows], self.conv[:, layer], self.S[:, layer],
            p.conv_weight[layer], p.A_log[layer], p.dt_bias[layer], g.key_heads, **extra,
        )  # o [c, W, HV, V], S [c, W, HV, K, V], win [c, W, C, kernel - 1]
        live = w > 0
        pick = accepted[:c].long().clamp_min(0)
        n = torch.arange(c, device=w.device)
        self.S[:, layer] = torch.where(live[:, None, None, None], S[n, pick], self.S[:, layer])
        self.conv[:, layer] = torch.where(live[:, None, None], win[n, pick], self.conv[:, layer])
        return o[torch.arange(W, device=w.device)[None, :] < w[:, None]]  # packed like the modes' outputs


def _use_tuned_configs(st: SSMState, ctx: RunContext, batch: int) -> tuple[str, str]:
    """Give a triton pool the autotuned configs of its case (nearest batch bucket) and say which. A baseline
    runs our conv with native's tuned config and the peer's functions with the adapter's fixed launch."""
    from scenarios.ssm_tuning import config_json, lookup_configs

    if isinstance(st, BaselineState):
        configs, source = lookup_configs(ctx, st.geom, replace(st.cfg, mode="native", variant="", backend="triton"),
                                         batch, dict(st.kernel_configs))
        st.set_kernel_configs(configs)
        return st.config_json(), "+".join(sorted({source, "fixed"}))
    if st.cfg.backend != "triton":
        return "", "fixed"  # the torch backend has no launch configs

    configs, source = lookup_configs(ctx, st.geom, st.cfg, batch, dict(st.kernel_configs))
    st.set_kernel_configs(configs)
    return config_json(configs), source


# ---------------------------------------------------------------------------------------------- timing
def timing_cycle(cfg: StateConfig) -> int:
    """Consecutive rounds timed in one graph (SPEC §7 steady state). Replay's cost varies with where a
    row is in its history (folds), so it is timed over `2 * ceil(Lh / W)` rounds, enough for every row
    to fold; compact-deferred's pending records alternate halves, so two rounds; the others cost the
    same every round and are timed one round at a time."""
    if cfg.mode == "replay":
        return 2 * -(-cfg.history_len // cfg.width)
    if cfg.mode == "compact" and CompactState.is_deferred(cfg):
        return 2
    return 1


def per_round(timing, rounds: int):
    """A timing of `rounds` consecutive rounds as per-round figures (samples, median, p20/p80 divided)."""
    if rounds == 1:
        return timing
    return replace(timing, samples_us=tuple(x / rounds for x in timing.samples_us), median_us=timing.median_us / rounds,
                   p20_us=timing.p20_us / rounds, p80_us=timing.p80_us / rounds)


def _time_variant(case: SSMCase, v: Variant, wl: SSMWorkload, ctx: RunContext) -> tuple[dict, dict | None]:
    """Time rounds of all layers on a fresh pool, a steady-state cycle per sample (`timing_cycle`);
    returns (row fields, oom record or None)."""
    g, n = wl.geom, wl.batch
    fields: dict[str, Any] = {}
    with ctx.oom_guard() as guard:
        cfg = v.config(case, ctx.device, n)
        st = _make_state(g, wl.params, cfg)
        config, source = _use_tuned_configs(st, ctx, n)
        fields.update(config=config, config_source=source)
        slots = st.alloc(n)
        st.load(slots, wl.init_ssm, wl.init_conv)
        widths, accepted = wl.widths(0), wl.accepted(0)
        inputs = [wl.inputs(0, layer) for layer in range(g.layers)]
        cycle = st.peer.cycle() if isinstance(st, BaselineState) else timing_cycle(cfg)

        def rounds() -> None:
            for _ in range(cycle):
                st.begin_round(slots, widths, validate=False)
                for layer in range(g.layers):
                    st.forward(layer, inputs[layer])
                st.accept(accepted, validate=False)

        timing = per_round(ctx.bench(rounds, calls=cycle), cycle)
    if guard.record is not None:
        return {}, guard.record
    tokens = float((accepted.long() + 1).clamp_min(0).sum())
    moved = (cost.baseline_round_bytes(v.backend, g, cfg, widths, accepted) if is_baseline(v.backend)
             else _round_bytes(case, v, g, cfg, widths, accepted))
    fields.update(timing_fields(timing, tokens, moved, ctx))
    if cycle > 1:
        note = f"steady state: {cycle} consecutive rounds per graph, figures per round"
        fields["reason"] = "; ".join(filter(None, [fields.get("reason"), note]))
    return fields, None


def timing_fields(timing, tokens: float | None, round_bytes: float, ctx: RunContext) -> dict[str, Any]:
    """Row columns of a timed call: the timing, tokens/s (when tokens is given), bytes, GB/s and % of the
    run's device-to-device ceiling (the CPU memcpy ceiling on a CPU run)."""
    fields = dict(
        timer=timing.timer, samples=timing.n_samples, median_us=timing.median_us, p20_us=timing.p20_us,
        p80_us=timing.p80_us, noise_pct=timing.noise_pct,
        bytes_moved=round(round_bytes), achieved_gbps=round_bytes / (timing.median_us * 1e-6) / 1e9,
    )
    if tokens is not None:
        fields["tokens_per_s"] = tokens / (timing.median_us * 1e-6)
    name = "d2d-copy" if "d2d-copy" in ctx.ceilings else "cpu-memcpy"
    ceiling = ctx.ceilings.get(name, {}).get("gbps")
    if ceiling:
        fields.update(ceiling_name=name, ceiling_gbps=ceiling, ceiling_pct=100 * fields["achieved_gbps"] / ceiling)
    if getattr(timing, "fallback_reason", None):
        fields["reason"] = f"timer fallback: {timing.fallback_reason}"
    return fields


def _round_bytes(case: SSMCase, v: Variant, g, cfg: StateConfig, widths, accepted) -> float:
    if v.mode == "replay":
        counts = torch.zeros_like(widths.cpu(), dtype=torch.long)
        _, counts = cost.steady_replay_round_bytes(g, cfg, widths, accepted, counts, rounds=4 * case.history_len)
        return cost.steady_replay_round_bytes(g, cfg, widths, accepted, counts, rounds=4 * case.history_len)[0]
    return cost.ROUND_BYTES[v.mode](g, cfg, widths, accepted)


# ------------------------------------------------------------------------------------------------- rows
def _identity(case: SSMCase, v: Variant) -> dict[str, Any]:
    g_fam = case.options.get("family", "")
    return {
        "scenario": case.scenario, "family": g_fam, "mode": v.mode, "variant": v.variant, "backend": v.backend,
        "preset": case.preset, "batch": case.batch, "drafts": case.drafts,
    }


def variant_option(v: Variant) -> dict[str, str]:
    """The CLI option that selects `v`'s variant (`--compact-commit` / `--replay-forward`), if any (a
    baseline's variant is the peer's default on the device, chosen by no option)."""
    if is_baseline(v.backend):
        return {}
    option = {"compact": "compact_commit", "replay": "replay_forward"}.get(v.mode)
    return {option: v.variant} if option else {}


def base_row(case: SSMCase, v: Variant, wl: SSMWorkload, ctx: RunContext) -> dict[str, Any]:
    g = wl.geom
    cfg = v.config(case, ctx.device, wl.batch)
    row = {
        **_identity(case, v),
        "family": g.family,
        "device": ctx.device,
        "width": case.drafts + 1,
        "accept": case.accept,
        "state_dtype": DTYPE_NAMES[case.state_dtype],
        "act_dtype": DTYPE_NAMES[case.act_dtype],
        "history_len": case.history_len if v.mode == "replay" else None,
        "history_dtype": DTYPE_NAMES[case.history_dtype] if v.mode == "replay" else None,
        "gates": None if case.gates == "random" else case.gates,
        "layers": g.layers,
        "config": "",
        "config_source": "",
        "repro": ctx.repro({**case.options, "modes": v.mode, "backend": v.backend, "batch": str(case.batch),
                            **variant_option(v)}),
    }
    try:
        terms = (ssm_baselines.bytes_per_request(v.backend, g, cfg) if is_baseline(v.backend)
                 else MODES[v.mode].bytes_per_request(g, cfg))
        row["bytes_per_request_predicted"] = terms["total"]
        budget = case.options.get("memory_budget_gib")
        if budget:
            row["max_concurrency"] = int(budget * 2**30 // terms["total"])
    except ValueError:
        pass
    # An unsupported row's repro asks for its mode alone too: the planner then refuses it in one line with
    # the same reason (exit 2, nothing run), which is what the row reproduces, instead of rerunning every mode.
    return row


def _dump(root: str, case: SSMCase, v: Variant, r: int, outs, snap, widths, accepted) -> None:
    """Write a variant's round outputs (and accepted states on snapshot rounds), see docs/TRACE_FORMAT.md."""
    d = Path(root) / f"{case.scenario}-{case.preset}-b{case.batch}" / label(v).replace("/", "-")
    d.mkdir(parents=True, exist_ok=True)
    item = {"round": r, "widths": widths.cpu(), "accepted": accepted.cpu(),
            "outputs": torch.stack([o.cpu() for o in outs])}
    if snap is not None:
        item["ssm"], item["conv"] = (t.cpu() for t in snap)
    torch.save(item, d / f"round-{r:05d}.pt")
