"""Autotune sweeps of the SSM-state Triton kernels (`harness autotune ssm`) and the config lookup the
SSM scenarios do with the same keys (SPEC §2, §8).

Config classes (kernels/ssm/configs.py): `step` is shared by native verify, compact verify + commit
(both variants) and the replay forward with its in-kernel fold, because its BV and warp layout set
the reduction tree the bitwise contracts depend on; it is tuned as one unit on the sum of those
members' times (one round each), and a candidate is valid only if, with it, both compact variants
equal native bit for bit and (fp32 state) replay's fold equals native bit for bit, and native and
replay are within the reference bound of the torch backend. `conv` is tuned alone against the torch
backend. Every sweep runs on disposable one-layer pools (the kernels are per layer; compact's
all-layer commit scales linearly), never on a run's state.
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

STEP, CONV, PRECOMPUTE = "step", "conv", "replay-precompute"
STEP_MEMBERS = ("native-round", "compact-accept-round", "compact-deferred-round", "replay-round")


def static_key(geom: SSMGeometry, cfg: StateConfig, config_class: str) -> dict[str, Any]:
    """What changes the best config of a class (the batch is the run key, bucketed)."""
    key = {
        "family": geom.family, "H": geom.key_heads, "HV": geom.value_heads, "K": geom.head_k_dim,
        "V": geom.head_v_dim, "conv_dim": geom.conv_dim, "state": DTYPE_NAMES[cfg.state_dtype],
        "act": DTYPE_NAMES[cfg.act_dtype], "W": cfg.width,
    }
    if config_class in (STEP, PRECOMPUTE):  # replay forwards are members: their history shapes the registers
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
    history_len = max(16, 1 << (drafts + 1 - 1).bit_length())
    jobs = []
    for batch in parse_batches(given(options.get("batch"), "4")):
        cfg = StateConfig("native", batch, drafts=drafts, state_dtype=state_dtype, act_dtype=act_dtype,
                          history_len=history_len, backend="triton", device=device)
        jobs += _jobs_for(geom, cfg, batch)
    return jobs


def _jobs_for(geom: SSMGeometry, cfg: StateConfig, batch: int) -> list[TuneJob]:
    from kernels.ssm.configs import config_space, default_configs
    from kernels.ssm.replay_precompute import DEFAULT_PRECOMPUTE_CONFIG, precompute_supported

    dims = {"head_k_dim": geom.head_k_dim, "head_v_dim": geom.head_v_dim, "conv_dim": geom.conv_dim}
    defaults = default_configs(**dims)
    rounds = 3
    bound = tolerances.backend_rms(geom.family, cfg.state_dtype)

    # the step class's members: (pool name, mode, variant); each is timed on one round of its own pool
    members = {"native-round": ("native", ""), "compact-accept-round": ("compact", "accept"),
               "compact-deferred-round": ("compact", "deferred"), "replay-round": ("replay", "")}
    with_precompute = precompute_supported(geom.head_k_dim, geom.head_v_dim) is None
    if with_precompute:  # timed alone (its own class), on its own pool
        members_all = {**members, "replay-precompute-round": ("replay", "precompute")}
    else:
        members_all = members

    def build(bucket: int) -> dict[str, Any]:
        wl = build_workload(geom, batch=bucket, drafts=cfg.drafts, rounds=rounds, state_dtype=cfg.state_dtype,
                            act_dtype=cfg.act_dtype, accept=AcceptModel.parse("geometric:0.7", cfg.drafts),
                            dynamic_widths=False, seed=bucket, device=cfg.device)
        torch_cfg = replace(cfg, backend="torch")
        ref = {}
        for mode in ("native", "replay"):
            st, slots = _fresh(geom, wl, torch_cfg, mode, "", None)
            ref[mode] = [_round(st, slots, wl, r) for r in range(rounds)]
        pools = {name: _fresh(geom, wl, cfg, mode, variant, defaults) for name, (mode, variant) in members_all.items()}
        for name in ("compact-deferred-round", "replay-round", "replay-precompute-round"):  # records before timing
            if name not in pools:
                continue
            st, slots = pools[name]
            for r in range(rounds):
                _round(st, slots, wl, r)
        return {"wl": wl, "ref": ref, "pools": pools}

    def run_member(name: str, cls: str):
        def run(config: dict, inputs: dict) -> None:
            st, slots = inputs["pools"][name]
            st.set_kernel_configs({cls: config})
            _round(st, slots, inputs["wl"], 0)
        return run

    def rollout(inputs: dict, mode: str, variant: str, configs: dict) -> tuple[list[torch.Tensor], tuple]:
        wl = inputs["wl"]
        st, slots = _fresh(geom, wl, cfg, mode, variant, {**defaults, **configs})
        outs = [_round(st, slots, wl, r) for r in range(rounds)]
        return outs, st.snapshot(slots)

    def check_step(config: dict, inputs: dict) -> tuple[bool, str]:
        native, nsnap = rollout(inputs, "native", "", {STEP: config})
        for variant in ("accept", "deferred"):
            compact, csnap = rollout(inputs, "compact", variant, {STEP: config})
            if not all(torch.equal(a, b) for a, b in zip(compact, native, strict=True)):
                return False, f"compact ({variant}) outputs differ from native under this config"
            if not all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(csnap, nsnap, strict=True)):
                return False, f"compact ({variant}) state differs from native under this config"
        replay, rsnap = rollout(inputs, "replay", "", {STEP: config})
        if cfg.state_dtype == torch.float32 and not torch.equal(rsnap[0], nsnap[0]):
            return False, "replay fold differs from native state under this config"
        worst = max(_rms(o, ref) for o, ref in zip(native, inputs["ref"]["native"], strict=True))
        worst_replay = max(_rms(o, ref) for o, ref in zip(replay, inputs["ref"]["replay"], strict=True))
        ok = max(worst, worst_replay) <= bound
        return ok, f"native / replay vs torch backend RMS {worst:.3g} / {worst_replay:.3g} (bound {bound:.3g})"

    def check_conv(config: dict, inputs: dict) -> tuple[bool, str]:
        outs, _ = rollout(inputs, "native", "", {CONV: config})
        worst = max(_rms(o, ref) for o, ref in zip(outs, inputs["ref"]["native"], strict=True))
        return worst <= bound, f"native vs torch backend RMS {worst:.3g} (bound {bound:.3g})"

    def check_precompute(config: dict, inputs: dict) -> tuple[bool, str]:
        outs, _ = rollout(inputs, "replay", "precompute", {PRECOMPUTE: config})
        worst = max(_rms(o, ref) for o, ref in zip(outs, inputs["ref"]["replay"], strict=True))
        return worst <= bound, f"replay precompute vs torch backend RMS {worst:.3g} (bound {bound:.3g})"

    key = {c: static_key(geom, cfg, c) for c in (STEP, CONV, PRECOMPUTE)}
    jobs = [
        TuneJob(STEP, key[STEP], batch, cpu_space(config_space(STEP, **dims), defaults[STEP], cfg.device),
                defaults[STEP], build,
                {name: run_member(name, STEP) for name in members}, check_step, members=STEP_MEMBERS),
        TuneJob(CONV, key[CONV], batch, cpu_space(config_space(CONV, **dims), defaults[CONV], cfg.device),
                defaults[CONV], build,
                run_member("native-round", CONV), check_conv),
    ]
    if with_precompute:
        space = cpu_space(precompute_space(geom), dict(DEFAULT_PRECOMPUTE_CONFIG), cfg.device)
        jobs.append(TuneJob(PRECOMPUTE, key[PRECOMPUTE], batch, space, dict(DEFAULT_PRECOMPUTE_CONFIG),
                            build, run_member("replay-precompute-round", PRECOMPUTE), check_precompute))
    return jobs


def cpu_space(space: list[dict], default: dict, device: str) -> list[dict]:
    """The candidates to sweep: the whole space on a GPU; on CPU, where the kernels run in the interpreter
    (its times say nothing about a GPU, and the full space took many minutes), the default and the space's
    first other config, as the page kernels do: enough to check them and to exercise the sweep and cache."""
    if str(device).startswith("cuda"):
        return space
    return [dict(default)] + [c for c in space if c != default][:1]


def precompute_space(geom: SSMGeometry) -> list[dict]:
    """`replay-precompute` candidates: BV up to V (at least one 16-wide tile), warps that leave each
    thread 4 to 128 values of the `[K, BV]` block."""
    from kernels.ssm.replay_precompute import PRECOMPUTE_AXES

    bk = 1 << (geom.head_k_dim - 1).bit_length()
    return [
        {"BV": bv, "num_warps": nw, "num_stages": ns}
        for bv in PRECOMPUTE_AXES["BV"] if bv <= max(16, 1 << (geom.head_v_dim - 1).bit_length())
        for nw in PRECOMPUTE_AXES["num_warps"] if 4 <= bk * bv // (32 * nw) <= 128
        for ns in PRECOMPUTE_AXES["num_stages"]
    ]


def _fresh(geom: SSMGeometry, wl, cfg: StateConfig, mode: str, variant: str, configs: dict[str, dict] | None):
    st = make_state(geom, wl.params, replace(cfg, mode=mode, variant=variant, max_requests=wl.batch))
    slots = st.alloc(wl.batch)
    st.load(slots, wl.init_ssm, wl.init_conv)
    if configs is not None:
        st.set_kernel_configs(configs)
    return st, slots


def _round(st, slots, wl, r: int) -> torch.Tensor:
    st.begin_round(slots, wl.widths(r), validate=False)
    o = st.forward(0, wl.inputs(r, 0))
    st.accept(wl.accepted(r), validate=False)
    return o


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def config_json(configs: dict[str, dict]) -> str:
    return json.dumps(configs, sort_keys=True)
