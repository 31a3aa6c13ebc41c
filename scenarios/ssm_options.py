"""Options shared by the SSM scenarios (decode, mtp-fixed, mtp-dynamic, checkpoint-restore):
parsing and validation, so that bad input fails before any work with one clear line naming the option.

With `--trace`, the trace fixes the batch, drafts, rounds, acceptances and the state and activation
dtypes: giving one of those options with a different value is an error, never silently ignored.
"""

from __future__ import annotations

from typing import Any

from kernels.ssm.baselines import BASELINES
from scenarios.options import (
    check_device,
    given,
    parse_batches,
    parse_dtype,
    parse_int,
    parse_positive_float,
    split_list,
)
from scenarios.ssm_engine import SSMCase
from scenarios.ssm_workload import AcceptModel
from scenarios.trace import read_trace
from states import MODES
from states.base import ACT_DTYPES, BACKENDS, DTYPE_NAMES, MODE_VARIANTS, STATE_DTYPES
from states.params import check_gates
from states.presets import get_ssm_preset

SSM_BACKENDS = (*BACKENDS, *BASELINES)  # ours, then the peers' kernels (kernels/ssm/baselines)
# The variants a run compares when --compact-commit / --replay-forward are not given.
# Beside the bitwise variants (accept, deferred, inline), the fastest variant of each mode that keeps the fp32
# contract, measured in tuned rows on an H200 (results/reference/h200-2026-12-04c/modes, Qwen3-Next, W 4, batch
# 128 / 256, against native): compact accept-precompute-bf16x3 1.42x / 1.44x and deferred-precompute-bf16x3
# 1.55x / 1.58x, replay matrix-bf16x3 1.85x / 1.90x (precompute-bf16x3, the same forward with the bitwise token
# fold, is slower; ieee products are slower at every matrix kernel, h200-2026-12-04b/precompute). Decode's best
# replay is inline-matrix-bf16x3 (the inline forward, folding in matrix form): on an H100, Qwen3-Next batch 128,
# 1.51x native against inline's 1.35x and matrix-bf16x3's 1.31x, where at W 4 it is 1.49x against matrix-bf16x3's
# 2.56x (results/reference/h100-2026-12-07c/inline-matrix). So decode runs (drafts 0) add it; MTP runs name it with
# --replay-forward. The model gate runs all of them in every case (harness/gate.py).
RUN_VARIANTS = {"compact": ("accept", "deferred", "accept-precompute-bf16x3", "deferred-precompute-bf16x3"),
                "replay": ("inline", "matrix-bf16x3")}
DECODE_RUN_VARIANTS = {"replay": ("inline-matrix-bf16x3",)}
SEED_MAX = 2**31 - 1
SNAPSHOT_EVERY = 8  # the default of --snapshot-every


def plan_ssm(
    scenario: str,
    options: dict[str, Any],
    *,
    drafts_default: int,
    dynamic: bool,
    accept_default: str = "all",
    rounds_default: int = 32,
    trace_widths_vary: bool | None = None,
) -> list[SSMCase]:
    """Validate the options of an SSM scenario and expand them into one case per batch size.

    `trace_widths_vary` (default: `dynamic`) says whether a trace may have widths other than W; decode
    and mtp-fixed verify W tokens for every request each round, so they refuse such a trace.
    """
    try:
        preset = get_ssm_preset(given(options.get("preset"), "tiny-gdn"))
    except ValueError as e:
        raise ValueError(f"--preset: {e}") from None
    explicit_modes = options.get("modes") is not None
    modes = split_list(given(options.get("modes"), ",".join(MODES)), "--modes")
    for m in modes:
        if m not in MODES:
            raise ValueError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    backends = split_list(given(options.get("backend"), "torch"), "--backend")
    for b in backends:
        if b not in SSM_BACKENDS:
            raise ValueError(f"--backend: unknown backend {b!r}; choose from {', '.join(SSM_BACKENDS)}")
    check_device(given(options.get("device"), "cpu"), backends)
    parse_int(given(options.get("seed"), 0), "--seed", 0, SEED_MAX)
    trace = read_trace(options["trace"], preset.ssm) if options.get("trace") is not None else None
    traced = trace is not None

    def fixed(name: str, default: Any, parse, key: str) -> Any:
        return _traced(options, name, parse, default, trace[key] if traced else _NO_TRACE)

    drafts = fixed("drafts", drafts_default, lambda v: parse_int(v, "--drafts", lo=0), "_drafts")
    if explicit_modes and "compact" in modes and drafts == 0:
        raise ValueError("--modes: compact mode needs drafts (--drafts >= 1): it stores a verify round's records")
    state_dtype = fixed("state_dtype", STATE_DTYPES["fp32"], lambda v: parse_dtype(v, STATE_DTYPES, "--state-dtype"),
                        "_state_dtype")
    act_dtype = fixed("act_dtype", ACT_DTYPES["bf16"], lambda v: parse_dtype(v, ACT_DTYPES, "--act-dtype"),
                      "_act_dtype")
    history_dtype = parse_dtype(given(options.get("history_dtype"), "fp32"), STATE_DTYPES, "--history-dtype")
    history_len = parse_int(given(options.get("history_len"), 16), "--history-len")
    if history_len < 4 or history_len & (history_len - 1):
        raise ValueError(f"--history-len must be a power of two and at least 4, got {history_len}")
    if "replay" in modes and history_len < drafts + 1:
        if options.get("history_len") is None:  # the default history is fine; the drafts made W too wide
            wide = 1 << drafts.bit_length()
            raise ValueError(f"--drafts {drafts}: replay's history of {history_len} tokens (--history-len) is shorter "
                             f"than the verify width W = {drafts + 1}; add --history-len {wide}, or leave replay "
                             "out of --modes")
        raise ValueError(f"--history-len {history_len} is shorter than the verify width W = drafts + 1 = {drafts + 1}")
    compact_commits = parse_variants(options.get("compact_commit"), "compact", "--compact-commit")
    if drafts == 0 and options.get("compact_commit") is None:
        compact_commits = compact_commits[:1]  # compact cannot run without drafts: one unsupported row is enough
    replay_forwards = parse_variants(options.get("replay_forward"), "replay", "--replay-forward")
    if drafts == 0 and options.get("replay_forward") is None:
        replay_forwards = (*replay_forwards, *DECODE_RUN_VARIANTS["replay"])
    rounds = fixed("rounds", rounds_default, lambda v: parse_int(v, "--rounds", lo=1), "_rounds")
    if trace is None:
        accept_spec = given(options.get("accept"), accept_default)
        if AcceptModel.parse(accept_spec, drafts).kind == "trace":
            raise ValueError("--accept trace needs --trace FILE")
        batches = parse_batches(given(options.get("batch"), "4"))
    else:
        if options.get("accept") not in (None, "trace"):
            raise ValueError("--accept: with --trace, acceptances come from the trace (leave --accept unset or use trace)")
        accept_spec = "trace"
        batches = [fixed("batch", 4, _one_batch, "_batch")]
        if not (dynamic if trace_widths_vary is None else trace_widths_vary):
            _check_fixed_widths(options["trace"], trace, drafts + 1, scenario)
    gates = check_gates(given(options.get("gates"), "random"))
    if trace is not None and options.get("gates") is not None:
        raise ValueError("--gates generates gate inputs; with --trace every input comes from the trace")
    if options.get("check_requests") is not None:
        checked = parse_int(options["check_requests"], "--check-requests", lo=1)
        if checked > min(batches):
            source = "the trace's batch" if traced else "--batch"
            raise ValueError(f"--check-requests {checked} is more than the batch of {min(batches)} requests ({source})")
    if options.get("memory_budget_gib") is not None:
        parse_positive_float(options["memory_budget_gib"], "--memory-budget-gib")
    snapshot_every = parse_int(given(options.get("snapshot_every"), SNAPSHOT_EVERY), "--snapshot-every", lo=1)
    opts = {**options, "scenario": scenario, "family": preset.ssm.family, "dynamic": dynamic}
    return [
        SSMCase(
            scenario=scenario, preset=preset.name, modes=tuple(modes), backends=tuple(backends), batch=b,
            drafts=drafts, rounds=rounds, state_dtype=state_dtype, act_dtype=act_dtype, history_len=history_len,
            history_dtype=history_dtype, accept=accept_spec, snapshot_every=snapshot_every, options=opts,
            compact_commits=compact_commits, replay_forwards=replay_forwards, gates=gates,
        )
        for b in batches
    ]


def parse_variants(value: Any, mode: str, option: str) -> tuple[str, ...]:
    """A comma list of `mode`'s variants (SPEC §3), in the given order; `RUN_VARIANTS` when unset."""
    choices = MODE_VARIANTS[mode]
    items = split_list(value, option) if value is not None else list(RUN_VARIANTS[mode])
    for item in items:
        if item not in choices:
            raise ValueError(f"{option} takes {', '.join(choices)}, got {item!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"{option} lists a variant twice: {value!r}")
    return tuple(items)


_NO_TRACE = object()


def _traced(options: dict[str, Any], name: str, parse, default: Any, from_trace: Any) -> Any:
    """An option a trace fixes: the trace's value; given as well, it must say the same thing."""
    value = options.get(name)
    if from_trace is _NO_TRACE:
        return default if value is None else parse(value)
    if value is not None and parse(value) != from_trace:
        flag = "--" + name.replace("_", "-")
        shown = DTYPE_NAMES.get(from_trace, from_trace)
        raise ValueError(f"{flag} {value} contradicts --trace {options['trace']}, which has {shown} "
                         f"(leave {flag} unset with a trace)")
    return from_trace


def _one_batch(value: Any) -> int:
    batches = parse_batches(value)
    if len(batches) != 1:
        raise ValueError(f"--batch takes one size with --trace (the trace's batch), got {value!r}")
    return batches[0]


def _check_fixed_widths(path: Any, trace: dict[str, Any], width: int, scenario: str) -> None:
    """Every request of every round verifies `width` tokens, as the scenario's name promises."""
    for r, rd in enumerate(trace["rounds"]):
        if (rd["widths"] != width).any():
            raise ValueError(f"--trace {path}: round {r} has widths other than W = {width}, which {scenario} "
                             "verifies every round; run it with mtp-dynamic")
