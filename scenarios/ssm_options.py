"""Options shared by the SSM scenarios (decode, mtp-fixed, mtp-dynamic, checkpoint-restore):
parsing and validation, so that bad input fails before any work with one clear line."""

from __future__ import annotations

import os
from typing import Any

import torch

from states.presets import get_ssm_preset
from scenarios.ssm_engine import SSMCase
from scenarios.ssm_workload import AcceptModel
from scenarios.trace import read_trace
from states import MODES
from states.base import ACT_DTYPES, MODE_VARIANTS, STATE_DTYPES
from states.params import check_gates

SSM_BACKENDS = ("torch", "triton", "fla")
# The variants a run compares when --compact-commit / --replay-forward are not given.
RUN_VARIANTS = {"compact": ("accept", "deferred"), "replay": ("inline",)}


def split_list(value: str | list | tuple | None, what: str) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    items = [str(x).strip() for x in items if str(x).strip()]
    if not items:
        raise ValueError(f"{what} is empty")
    return items


def parse_batches(value: Any) -> list[int]:
    out = []
    for x in split_list(value, "--batch"):
        try:
            b = int(x)
        except ValueError:
            raise ValueError(f"--batch takes integers, got {x!r}") from None
        if b < 1:
            raise ValueError(f"--batch values must be >= 1, got {b}")
        out.append(b)
    return out


def parse_variants(value: Any, mode: str, option: str) -> tuple[str, ...]:
    """A comma list of `mode`'s variants (SPEC §3), in the given order; the default variant when unset."""
    choices = MODE_VARIANTS[mode]
    items = split_list(value, option) if value is not None else list(RUN_VARIANTS[mode])
    for item in items:
        if item not in choices:
            raise ValueError(f"{option} takes {', '.join(choices)}, got {item!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"{option} lists a variant twice: {value!r}")
    return tuple(items)


def parse_dtype(value: str, table: dict[str, torch.dtype], what: str) -> torch.dtype:
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {', '.join(table)}, got {value!r}") from None


def check_device(device: str, backends: list[str]) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device} needs CUDA, which this machine does not have (use --device cpu)")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"--device must be cpu or cuda[:i], got {device!r}")
    needs_gpu = [b for b in backends if b in ("triton", "fla")]
    if device == "cpu" and needs_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend {needs_gpu[0]} runs Triton kernels and needs --device cuda "
            "(or TRITON_INTERPRET=1 to run them in the interpreter on CPU, tiny presets only)"
        )


def plan_ssm(
    scenario: str,
    options: dict[str, Any],
    *,
    drafts_default: int,
    dynamic: bool,
    accept_default: str = "all",
    rounds_default: int = 32,
) -> list[SSMCase]:
    """Validate the options of an SSM scenario and expand them into one case per batch size."""
    preset = get_ssm_preset(options.get("preset") or "tiny-gdn")
    explicit_modes = options.get("modes") is not None
    modes = split_list(options.get("modes") or ",".join(MODES), "--modes")
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    backends = split_list(options.get("backend") or "torch", "--backend")
    for b in backends:
        if b not in SSM_BACKENDS:
            raise ValueError(f"unknown backend {b!r}; choose from {', '.join(SSM_BACKENDS)}")
    device = options.get("device") or "cpu"
    check_device(device, backends)
    trace = read_trace(options["trace"], preset.ssm) if options.get("trace") else None
    if options.get("drafts") is not None:
        drafts = int(options["drafts"])
    else:
        drafts = trace["_drafts"] if trace is not None else drafts_default
    if drafts < 0:
        raise ValueError(f"--drafts must be >= 0, got {drafts}")
    if explicit_modes and "compact" in modes and drafts == 0:
        raise ValueError("compact mode needs drafts (--drafts >= 1): it stores a verify round's records")
    state_dtype = parse_dtype(options.get("state_dtype") or "fp32", STATE_DTYPES, "--state-dtype")
    act_dtype = parse_dtype(options.get("act_dtype") or "bf16", ACT_DTYPES, "--act-dtype")
    history_dtype = parse_dtype(options.get("history_dtype") or "fp32", STATE_DTYPES, "--history-dtype")
    history_len = int(options.get("history_len") or 16)
    if "replay" in modes:
        if history_len < 4 or history_len & (history_len - 1):
            raise ValueError(f"--history-len must be a power of two and at least 4, got {history_len}")
        if history_len < drafts + 1:
            raise ValueError(f"--history-len {history_len} is shorter than the verify width W = drafts + 1 = {drafts + 1}")
    compact_commits = parse_variants(options.get("compact_commit"), "compact", "--compact-commit")
    if drafts == 0 and options.get("compact_commit") is None:
        compact_commits = compact_commits[:1]  # compact cannot run without drafts: one unsupported row is enough
    replay_forwards = parse_variants(options.get("replay_forward"), "replay", "--replay-forward")
    accept_spec = options.get("accept") or accept_default
    accept = AcceptModel.parse(accept_spec, drafts)
    if accept.kind == "trace" and not options.get("trace"):
        raise ValueError("--accept trace needs --trace FILE")
    rounds = int(options.get("rounds") or rounds_default)
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    batches = parse_batches(options.get("batch") or "4")
    if trace is not None:
        data = trace
        if options.get("batch") and batches != [data["_batch"]]:
            raise ValueError(f"--batch {options['batch']} does not match the trace's batch of {data['_batch']}")
        if data["_drafts"] != drafts:
            raise ValueError(f"the trace verifies {data['_drafts']} drafts per round, this run {drafts} (--drafts)")
        if options.get("accept") not in (None, "trace"):
            raise ValueError("with --trace, acceptances come from the trace (leave --accept unset or use trace)")
        batches, rounds, accept_spec, act_dtype = [data["_batch"]], len(data["rounds"]), "trace", data["_act_dtype"]
    gates = check_gates(options.get("gates") or "random")
    if trace is not None and gates != "random":
        raise ValueError("--gates generates gate inputs; with --trace every input comes from the trace")
    snapshot_every = int(options.get("snapshot_every") or 8)
    opts = {**options, "family": preset.ssm.family}
    return [
        SSMCase(
            scenario=scenario, preset=preset.name, modes=tuple(modes), backends=tuple(backends), batch=b,
            drafts=drafts, rounds=rounds, state_dtype=state_dtype, act_dtype=act_dtype, history_len=history_len,
            history_dtype=history_dtype, accept=accept_spec, snapshot_every=snapshot_every,
            options={**opts, "dynamic": dynamic}, compact_commits=compact_commits, replay_forwards=replay_forwards,
            gates=gates,
        )
        for b in batches
    ]
