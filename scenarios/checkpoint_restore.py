"""checkpoint-restore: snapshot requests mid-stream, keep decoding, restore them into fresh slots and
replay the same inputs; within a mode and across modes (SPEC §6, contract 4).

Per backend, every requested mode runs the rollout over the whole batch. Before round `r0` (chosen so
replay has pending history), the first half of the batch is snapshotted, moved to host memory (pinned
on CUDA) and back, and the bytes compared (the checkpoint transfer is byte-exact). After the rollout,
for every ordered pair (A, B) of modes, B's pool loads A's snapshot into fresh slots, replays rounds
`r0..` with the same inputs for those requests only, and must produce what B produced without the
interruption: bit for bit when A's snapshot equals B's at `r0` (same mode; native and compact; replay
with fp32 state), within the backend RMS bound otherwise (bf16 replay checkpoints round differently).
Restored into replay, outputs are compared within contract 2's bound and states bit for bit: the
restored pool starts from the materialized checkpoint, the uninterrupted one from its older checkpoint
plus pending history, so outputs are the same sums associated differently while the fold replays the
same fp32 steps.

Timing: `snapshot` (export) and `load` (import) of the restored requests, per mode. A row's `batch` is
the case's batch; `restored_requests` in its `config` is how many requests the timed transfer moves.
"""

from __future__ import annotations

import json

from typing import Any

import torch

from scenarios import tolerances
from scenarios.base import CaseMemory, CaseResult, RunContext
from scenarios.ssm_engine import (LAYER_CONV_DIMS, LAYER_STATE_DIMS, STATE_DIMS, SSMCase, Variant, base_row,
                                  by_request, label, launch_rollouts, timing_fields, variant_option)
from scenarios.ssm_memory import ssm_case_memory
from scenarios.ssm_options import plan_ssm
from scenarios.ssm_scenarios import workload_for
from states import MODES, SSMState, make_state
from states.base import exact_fold
from states.params import TokenInputs

CONV_DIMS = ("request", "layer", "channel", "column")
OUT_DIMS = ("token", "head", "v")


class CheckpointRestore:
    name = "checkpoint-restore"
    help = ("Snapshot half the batch mid-stream, keep decoding, restore into fresh slots (same mode and "
            "across modes) and replay the same inputs: byte-exact transfer, bitwise continuation.")
    families = ("gdn", "kda")

    def plan(self, options: dict[str, Any]) -> list[SSMCase]:
        cases = plan_ssm(self.name, options, drafts_default=3, dynamic=False, accept_default="geometric:0.7",
                         rounds_default=24, trace_widths_vary=True)
        for case in cases:
            if case.rounds < 3:
                raise ValueError("--rounds: checkpoint-restore needs --rounds >= 3 (decode, snapshot, keep decoding)")
        return cases

    def memory(self, case: SSMCase, device: str) -> CaseMemory:
        return ssm_case_memory(case, device, restore=True)

    def launch(self, case: SSMCase, ctx: RunContext) -> None:
        """The case's Triton launches, for a compile-ahead pass to record (harness/gate.py): its rollouts,
        snapshots included (`launch_rollouts`); the restored pools replay the same kernels on fewer rows
        and the load is a torch copy, so nothing else compiles (scripts/gate_specializations.py checks)."""
        launch_rollouts(case, workload_for(case, ctx), ctx)

    def run(self, case: SSMCase, ctx: RunContext) -> CaseResult:
        wl = workload_for(case, ctx)
        result = CaseResult()
        for backend in case.backends:
            self._run_backend(case, wl, ctx, backend, result)
        return result

    def _run_backend(self, case: SSMCase, wl, ctx: RunContext, backend: str, result: CaseResult) -> None:
        g, n = wl.geom, wl.batch
        p = max(1, n // 2)  # the restored requests are the first p rows (a packed prefix of every round)
        r0 = _snapshot_round(case)
        # every (mode, variant) of this backend; "modes" below are these variants
        variants = [Variant(m, var, backend) for m in case.modes for var in case.variants_of(m)]
        modes, status, pools, slots = [], {}, {}, {}
        for m in variants:
            try:
                MODES[m.mode]._validate_config(g, m.config(case, ctx.device, 1))
            except ValueError as e:
                status[m] = ("unsupported", str(e))
                continue
            modes.append(m)
        for m in modes:
            # room for the live batch plus one restored copy of the first p requests per source mode
            pools[m] = make_state(g, wl.params, m.config(case, ctx.device, n + p * len(modes)))
            slots[m] = pools[m].alloc(n)
            pools[m].load(slots[m], wl.init_ssm, wl.init_conv)

        made: list = []  # every comparison of this backend, to decide each mode's status

        def record(c) -> None:
            made.append(c)
            ctx.record(c)

        outs: dict[Variant, list[list[torch.Tensor]]] = {m: [] for m in modes}  # [round - r0][layer] -> [cu[p], HV, V]
        snaps: dict[Variant, tuple[torch.Tensor, torch.Tensor]] = {}
        tick = ctx.progress(f"{case.scenario} {case.preset} batch {n}/{backend}: rollout", wl.rounds)
        for r in range(wl.rounds):
            if r == r0:
                for m in modes:
                    snaps[m] = _through_host(pools[m].snapshot(slots[m][:p]), m, case, ctx, record)
            widths, accepted = wl.widths(r), wl.accepted(r)
            keep = int(widths[:p].long().sum())
            for m in modes:
                pools[m].begin_round(slots[m], widths)
                per_layer = [pools[m].forward(layer, wl.inputs(r, layer)) for layer in range(g.layers)]
                pools[m].accept(accepted)
                if r >= r0:
                    outs[m].append([o[:keep] for o in per_layer])
            tick()
        finals = {m: pools[m].snapshot(slots[m][:p]) for m in modes}

        for b in modes:
            # Restoring into b is a function of the bytes loaded: the kernels are deterministic and the fresh
            # slots start from the load alone (replay's history empty). So the sources whose snapshots are
            # bitwise equal (the bitwise variants at fp32 state agree by contract) replay into b once, and
            # each pair's comparisons are still made and recorded; this keeps the n^2 restores of a case with
            # many variants at (distinct snapshots) x n rollouts, which the interpreter cases need.
            restored: list[tuple[tuple[torch.Tensor, torch.Tensor], list, tuple[torch.Tensor, torch.Tensor]]] = []
            for a in modes:
                same = next((r for r in restored if _bitwise(r[0], snaps[a])), None)
                if same is None:
                    fresh = pools[b].alloc(p)
                    pools[b].load(fresh, *snaps[a])
                    same = (snaps[a], _replay(pools[b], fresh, wl, r0, p), pools[b].snapshot(fresh))
                    pools[b].free(fresh)
                    restored.append(same)
                _, replayed, (ssm, conv) = same
                # a bf16 replay checkpoint materialized at r0 rounds once more than the uninterrupted pool, and
                # replay's matrix fold sums the records before and after r0 in one product where the restored
                # pool folds them in two: both restore within the contract's tolerance, not bit for bit
                exact = _bitwise(snaps[a], snaps[b]) and not (
                    b.mode == "replay" and (case.state_dtype != torch.float32 or not exact_fold(b.mode, b.variant)))
                kw = {"policy": "bitwise"} if exact else {
                    "policy": "rms", "tolerance": tolerances.backend_rms(g.family, case.state_dtype)}
                # A restored replay pool starts from the materialized checkpoint with no history, the
                # uninterrupted one from its old checkpoint plus pending history: outputs are the same
                # sums associated differently (contract 2's bound); its states still fold bit for bit.
                out_kw = kw if b.mode != "replay" else {
                    "policy": "rms",
                    "tolerance": tolerances.replay_output_rms(g.family, case.state_dtype, case.history_dtype)}
                who, whom = f"{label(b)} restored from {label(a).split('/')[0]}", label(b)
                # every comparison judged per (round, layer), like the engine's
                ro = ctx.rollout()
                for i, per_layer in enumerate(replayed):
                    widths = wl.widths(r0 + i)[:p].tolist()
                    comps = ctx.compare_each(torch.stack(per_layer), torch.stack(outs[b][i]), name="o", lhs=who,
                                             rhs=whom, contract="4", dims=OUT_DIMS, scenario=case.scenario, **out_kw)
                    for layer, c in enumerate(comps):
                        ro.add(r0 + i, by_request(c, widths), layer=layer)
                record(ro.result())
                fs, fc = finals[b]
                a, e = ssm.transpose(0, 1), fs.transpose(0, 1)
                for comps in (
                    ctx.compare_each(a if exact else a.float(), e if exact else e.float(), name="ssm", lhs=who,
                                     rhs=whom, contract="4", dims=LAYER_STATE_DIMS, scenario=case.scenario, **kw),
                    ctx.compare_each(conv.transpose(0, 1), fc.transpose(0, 1), name="conv", lhs=who, rhs=whom,
                                     contract="4", policy="bitwise", dims=LAYER_CONV_DIMS, scenario=case.scenario),
                ):
                    final = ctx.rollout()
                    for layer, c in enumerate(comps):
                        final.add(wl.rounds - 1, c, layer=layer)
                    record(final.result())

        for m in variants:
            if m in status:
                continue
            bad = [c for c in made if c.lhs.split(" ")[0] == label(m) and not c.passed]
            status[m] = ("mismatch", f"{len(bad)} comparison(s) failed, first: {bad[0].name} vs {bad[0].rhs}") if bad \
                else ("passed", "")
        for m in variants:
            for direction in ("export", "import"):
                row = base_row(case, m, wl, ctx)
                # `batch` stays the case's batch (what the repro line and progress say); the p requests
                # the timed snapshot / load moves go into the row's config
                config = {**(json.loads(row["config"]) if row["config"] else {}), "restored_requests": p}
                row.update(direction=direction, config=json.dumps(config, sort_keys=True), status=status[m][0],
                           reason=status[m][1])
                row["repro"] = ctx.repro({**case.options, "modes": m.mode, "backend": backend, "batch": str(n),
                                          **variant_option(m)})
                if status[m][0] == "passed" and ctx.time_cases:
                    row.update(_time_transfer(pools[m], slots[m][:p], direction, ctx))
                result.rows.append(row)


def _snapshot_round(case: SSMCase) -> int:
    """A round boundary where replay has pending (unfolded) history: a third of the way in, moved off
    a multiple of the history length."""
    r0 = max(1, case.rounds // 3)
    return r0 + 1 if r0 % case.history_len == 0 and r0 + 1 < case.rounds else r0


def _through_host(snap: tuple[torch.Tensor, torch.Tensor], v: Variant, case: SSMCase,
                  ctx: RunContext, record) -> tuple[torch.Tensor, torch.Tensor]:
    """Move a snapshot to host memory (pinned on CUDA) and back; record that the bytes survived."""
    back = []
    for name, t in zip(("ssm", "conv"), snap, strict=True):
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        host.copy_(t, non_blocking=t.is_cuda)
        if t.is_cuda:
            torch.cuda.synchronize()
        again = host.to(t.device)
        record(ctx.compare(again, t, name=f"checkpoint {name}", lhs=f"{label(v)} via host",
                               rhs=label(v), contract="4", policy="bitwise",
                               dims=STATE_DIMS if name == "ssm" else CONV_DIMS, scenario=case.scenario))
        back.append(again)
    return back[0], back[1]


def _replay(pool: SSMState, fresh: torch.Tensor, wl, r0: int, p: int) -> list[list[torch.Tensor]]:
    """Rounds r0.. again for the first p requests only, now living in `fresh` slots."""
    outs = []
    W = wl.width
    for r in range(r0, wl.rounds):
        widths, accepted = wl.widths(r)[:p], wl.accepted(r)[:p]
        keep = int(widths.long().sum())
        pool.begin_round(fresh, widths)
        per_layer = []
        for layer in range(wl.geom.layers):
            x = wl.inputs(r, layer)
            sub = TokenInputs(x.mixed_qkv[: p * W], x.a[: p * W], x.b[: p * W])  # the first p requests' rows
            per_layer.append(pool.forward(layer, sub)[:keep])
        pool.accept(accepted)
        outs.append(per_layer)
    return outs


def _bitwise(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b, strict=True))


def _time_transfer(pool: SSMState, slots: torch.Tensor, direction: str, ctx: RunContext) -> dict[str, Any]:
    """Time `snapshot` (export: materialize the accepted state) or `load` (import) of `slots`."""
    # bytes: the snapshot read and written once (export reads the accepted state and writes the copy;
    # import writes the state); replay's export also reads its pending history, not counted here
    ssm, conv = pool.snapshot(slots)
    if direction == "export":
        timing = ctx.bench(lambda: pool.snapshot(slots))
    else:
        timing = ctx.bench(lambda: pool.load(slots, ssm, conv))
    moved = 2 * (ssm.numel() * ssm.element_size() + conv.numel() * conv.element_size())
    return timing_fields(timing, None, moved, ctx)
