"""Autotune sweeps of the SSM-state Triton kernels (`harness autotune ssm`) and the config lookup the
SSM scenarios do with the same keys (SPEC §2, §8).

Config classes (kernels/ssm/configs.py): `step` is shared by native verify, compact verify + commit
and the replay fold, because its BV and warp layout set the reduction tree the bitwise contracts
depend on; it is tuned as one unit on the sum of those members' times, and a candidate is valid only
if, with it, compact equals native bit for bit and (fp32 state) replay's fold equals native bit for
bit, and native is within the reference bound of the torch backend. `replay-forward` and `conv` are
tuned alone against the torch backend. Every sweep runs on disposable one-layer pools (the kernels
are per layer; compact's all-layer commit scales linearly), never on a run's state.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import torch

from scenarios import tolerances
from scenarios.base import RunContext, TuneJob
from scenarios.options import check_device, given, parse_batches, parse_dtype
from scenarios.ssm_workload import AcceptModel, build_workload
from states import make_state
from states.base import ACT_DTYPES, DTYPE_NAMES, STATE_DTYPES, StateConfig
from states.geometry import SSMGeometry
from states.presets import get_ssm_preset

STEP, CONV, REPLAY_FORWARD = "step", "conv", "replay-forward"
STEP_MEMBERS = ("native-verify", "compact-round", "replay-fold")


def static_key(geom: SSMGeometry, cfg: StateConfig, config_class: str) -> dict[str, Any]:
    """What changes the best config of a class (the batch is the run key, bucketed)."""
    key = {
        "family": geom.family, "H": geom.key_heads, "HV": geom.value_heads, "K": geom.head_k_dim,
        "V": geom.head_v_dim, "conv_dim": geom.conv_dim, "state": DTYPE_NAMES[cfg.state_dtype],
        "act": DTYPE_NAMES[cfg.act_dtype], "W": cfg.width,
    }
    if config_class == REPLAY_FORWARD:
        key.update(Lh=cfg.history_len, hist=DTYPE_NAMES[cfg.history_dtype])
    return key


def lookup_configs(ctx: RunContext, geom: SSMGeometry, cfg: StateConfig, batch: int,
                   defaults: dict[str, dict]) -> tuple[dict[str, dict], str]:
    """The configs a triton pool of this case runs with, and where they came from (for the row)."""
    chosen, sources = {}, set()
    for cls, default in defaults.items():
        chosen[cls], source = ctx.kernel_config(cls, static_key(geom, cfg, cls), batch, default)
        sources.add(source)
    return chosen, "cached" if sources == {"cached"} else "default"  # any class on its default: not tuned


def tuning_jobs(options: dict[str, Any]) -> list[TuneJob]:
    preset = get_ssm_preset(given(options.get("preset"), "tiny-gdn"))
    device = given(options.get("device"), "cpu")
    check_device(device, ["triton"])
    drafts = 3 if options.get("drafts") is None else int(options["drafts"])
    if drafts < 1:
        raise ValueError("tuning covers verify rounds: --drafts must be >= 1")
    state_dtype = parse_dtype(given(options.get("state_dtype"), "fp32"), STATE_DTYPES, "--state-dtype")
    act_dtype = parse_dtype(given(options.get("act_dtype"), "bf16"), ACT_DTYPES, "--act-dtype")
    geom = replace(preset.ssm, layers=1)
    history_len = max(8, 1 << (drafts + 1 - 1).bit_length())
    jobs = []
    for batch in parse_batches(given(options.get("batch"), "4")):
        cfg = StateConfig("native", batch, drafts=drafts, state_dtype=state_dtype, act_dtype=act_dtype,
                          history_len=history_len, backend="triton", device=device)
        jobs += _jobs_for(geom, cfg, batch)
    return jobs


def _jobs_for(geom: SSMGeometry, cfg: StateConfig, batch: int) -> list[TuneJob]:
    from kernels.ssm.configs import config_space, default_configs
    from kernels.ssm.replay import DEFAULT_FORWARD_CONFIG

    dims = {"head_k_dim": geom.head_k_dim, "head_v_dim": geom.head_v_dim, "conv_dim": geom.conv_dim}
    defaults = {**default_configs(**dims), REPLAY_FORWARD: dict(DEFAULT_FORWARD_CONFIG)}
    rounds = 3
    bound = tolerances.backend_rms(cfg.state_dtype)

    def build(bucket: int) -> dict[str, Any]:
        wl = build_workload(geom, batch=bucket, drafts=cfg.drafts, rounds=rounds, state_dtype=cfg.state_dtype,
                            act_dtype=cfg.act_dtype, accept=AcceptModel.parse("geometric:0.7", cfg.drafts),
                            dynamic_widths=False, seed=bucket, device=cfg.device)
        torch_cfg = replace(cfg, backend="torch")
        ref = {}
        for mode in ("native", "replay"):
            st, slots = _fresh(geom, wl, torch_cfg, mode, None)
            ref[mode] = [_round(st, slots, wl, r) for r in range(rounds)]
        pools = {mode: _fresh(geom, wl, cfg, mode, defaults) for mode in ("native", "compact", "replay")}
        rst, rslots = pools["replay"]
        for r in range(rounds):  # pending history, so the timed fold has records to replay
            _round(rst, rslots, wl, r)
        return {"wl": wl, "ref": ref, "pools": pools}

    def on(inputs: dict, mode: str, configs: dict[str, dict]):
        st, slots = inputs["pools"][mode]
        st.set_kernel_configs(configs)
        return st, slots

    def run_round(mode: str, cls: str):
        def run(config: dict, inputs: dict) -> None:
            st, slots = on(inputs, mode, {cls: config})
            _round(st, slots, inputs["wl"], 0)
        return run

    def run_fold(config: dict, inputs: dict) -> None:
        st, slots = on(inputs, "replay", {STEP: config})
        st.snapshot(slots)  # folds the pending history into a scratch copy, never into the pool

    def rollout(inputs: dict, mode: str, configs: dict) -> tuple[list[torch.Tensor], tuple]:
        wl = inputs["wl"]
        st, slots = _fresh(geom, wl, cfg, mode, {**defaults, **configs})
        outs = [_round(st, slots, wl, r) for r in range(rounds)]
        return outs, st.snapshot(slots)

    def check_step(config: dict, inputs: dict) -> tuple[bool, str]:
        native, nsnap = rollout(inputs, "native", {STEP: config})
        compact, csnap = rollout(inputs, "compact", {STEP: config})
        _, rsnap = rollout(inputs, "replay", {STEP: config})
        if not all(torch.equal(a, b) for a, b in zip(compact, native, strict=True)):
            return False, "compact outputs differ from native under this config"
        if not all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(csnap, nsnap, strict=True)):
            return False, "compact state differs from native under this config"
        if cfg.state_dtype == torch.float32 and not torch.equal(rsnap[0], nsnap[0]):
            return False, "replay fold differs from native state under this config"
        worst = max(_rms(o, ref) for o, ref in zip(native, inputs["ref"]["native"], strict=True))
        return worst <= bound, f"native vs torch backend RMS {worst:.3g} (bound {bound:.3g})"

    def check_alone(mode: str, cls: str):
        def check(config: dict, inputs: dict) -> tuple[bool, str]:
            outs, _ = rollout(inputs, mode, {cls: config})
            worst = max(_rms(o, ref) for o, ref in zip(outs, inputs["ref"][mode], strict=True))
            return worst <= bound, f"{mode} vs torch backend RMS {worst:.3g} (bound {bound:.3g})"
        return check

    forward_space = [
        {"BV": bv, "num_warps": w, "num_stages": st}
        for bv in (8, 16, 32, 64, 128) if bv <= max(8, geom.head_v_dim)
        for w in (1, 2, 4, 8) if 4 <= geom.head_k_dim * bv // (32 * w) <= 128 or (bv, w) == (8, 1)
        for st in (1, 2)
    ]
    key = {c: static_key(geom, cfg, c) for c in (STEP, CONV, REPLAY_FORWARD)}
    return [
        TuneJob(STEP, key[STEP], batch, config_space(STEP, **dims), defaults[STEP], build,
                {"native-verify": run_round("native", STEP), "compact-round": run_round("compact", STEP),
                 "replay-fold": run_fold},
                check_step, members=STEP_MEMBERS),
        TuneJob(REPLAY_FORWARD, key[REPLAY_FORWARD], batch, forward_space, defaults[REPLAY_FORWARD], build,
                run_round("replay", REPLAY_FORWARD), check_alone("replay", REPLAY_FORWARD)),
        TuneJob(CONV, key[CONV], batch, config_space(CONV, **dims), defaults[CONV], build,
                run_round("native", CONV), check_alone("native", CONV)),
    ]


def _fresh(geom: SSMGeometry, wl, cfg: StateConfig, mode: str, configs: dict[str, dict] | None):
    st = make_state(geom, wl.params, replace(cfg, mode=mode, max_requests=wl.batch))
    slots = st.alloc(wl.batch)
    st.load(slots, wl.init_ssm, wl.init_conv)
    if configs is not None:
        st.set_kernel_configs(_for_mode(configs, mode))
    return st, slots


def _for_mode(configs: dict[str, dict], mode: str) -> dict[str, dict]:
    """Only replay pools run a replay-forward kernel."""
    return {c: v for c, v in configs.items() if c != REPLAY_FORWARD or mode == "replay"}


def _round(st, slots, wl, r: int) -> torch.Tensor:
    st.begin_round(slots, wl.widths(r), validate=False)
    o = st.forward(0, wl.inputs(r, 0))
    st.accept(wl.accepted(r), validate=False)
    return o


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def config_json(configs: dict[str, dict]) -> str:
    return json.dumps(configs, sort_keys=True)
