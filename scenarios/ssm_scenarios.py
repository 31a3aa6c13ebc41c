"""The SSM scenarios that differ only in how rounds are shaped: decode, mtp-fixed, mtp-dynamic."""

from __future__ import annotations

from typing import Any

from scenarios.base import CaseMemory, CaseResult, RunContext
from scenarios.ssm_engine import SSMCase, launch_rollouts, run_ssm_case
from scenarios.ssm_memory import ssm_case_memory
from scenarios.ssm_options import plan_ssm
from scenarios.ssm_workload import AcceptModel, SSMWorkload, build_workload
from scenarios.trace import load_trace
from states.presets import get_preset


def workload_for(case: SSMCase, ctx: RunContext) -> SSMWorkload:
    """The case's inputs: from `--trace FILE` when given, else generated from the run seed."""
    geom = get_preset(case.preset).ssm
    trace = case.options.get("trace")
    if trace:
        return load_trace(trace, geom, case, ctx.device)
    return build_workload(
        geom, batch=case.batch, drafts=case.drafts, rounds=case.rounds, state_dtype=case.state_dtype,
        act_dtype=case.act_dtype, accept=AcceptModel.parse(case.accept, case.drafts),
        dynamic_widths=case.options["dynamic"], seed=ctx.seed, device=ctx.device, gates=case.gates,
    )


class _Rollouts:
    """What the three scenarios share: a case is a rollout of the workload (`run_ssm_case`)."""

    families = ("gdn", "kda")

    def run(self, case: SSMCase, ctx: RunContext) -> CaseResult:
        return run_ssm_case(case, workload_for(case, ctx), ctx)

    def launch(self, case: SSMCase, ctx: RunContext) -> None:
        """The case's Triton launches alone (a compile-ahead pass records them): `launch_rollouts`."""
        launch_rollouts(case, workload_for(case, ctx), ctx)

    def memory(self, case: SSMCase, device: str) -> CaseMemory:
        return ssm_case_memory(case, device)


class Decode(_Rollouts):
    name = "decode"
    help = "Width-1 decode for every request, many rounds (long enough to cross several replay folds)."

    def plan(self, options: dict[str, Any]) -> list[SSMCase]:
        if options.get("drafts"):
            raise ValueError("--drafts: decode verifies one token per round; use mtp-fixed for --drafts")
        cases = plan_ssm(self.name, options, drafts_default=0, dynamic=False, rounds_default=64)
        if cases and cases[0].drafts:
            raise ValueError(f"--trace {options['trace']} verifies {cases[0].drafts} drafts per round and decode "
                             "verifies one token; run it with mtp-fixed or mtp-dynamic")
        return cases


class MtpFixed(_Rollouts):
    name = "mtp-fixed"
    help = "Every request verifies W = 1 + S tokens per round, then accepts a prefix (--accept)."

    def plan(self, options: dict[str, Any]) -> list[SSMCase]:
        cases = plan_ssm(self.name, options, drafts_default=3, dynamic=False, accept_default="geometric:0.7")
        if cases and cases[0].drafts < 1:
            raise ValueError("--drafts: mtp-fixed needs --drafts >= 1 (use decode for width-1 rounds)")
        return cases


class MtpDynamic(_Rollouts):
    name = "mtp-dynamic"
    help = ("Each request verifies its own width in [0, 1 + S] each round (0 = idle padding row), packed "
            "varlen with fixed tensor shapes so one CUDA graph serves every round.")

    def plan(self, options: dict[str, Any]) -> list[SSMCase]:
        cases = plan_ssm(self.name, options, drafts_default=3, dynamic=True, accept_default="geometric:0.7")
        if cases and cases[0].drafts < 1:
            raise ValueError("--drafts: mtp-dynamic needs --drafts >= 1")
        return cases
