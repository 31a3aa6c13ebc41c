"""Scenarios, one module each, registered explicitly here (SPEC §6)."""

from __future__ import annotations

from scenarios.base import CHECK_REQUESTS, CaseResult, RunContext, Scenario
from scenarios.checkpoint_restore import CheckpointRestore
from scenarios.cpu_page_restore import CpuPageRestore
from scenarios.options import given, parse_int
from scenarios.pd_roundtrip import PdRoundtrip
from scenarios.ssm_scenarios import Decode, MtpDynamic, MtpFixed

SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (Decode(), MtpFixed(), MtpDynamic(), CheckpointRestore(), CpuPageRestore(), PdRoundtrip())
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None


__all__ = ["CHECK_REQUESTS", "SCENARIOS", "given", "parse_int", "CaseResult", "RunContext", "Scenario", "get_scenario"]
