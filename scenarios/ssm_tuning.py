"""Autotune sweeps of the SSM-state Triton kernels (`harness autotune ssm`), one per kernel, and the
config lookup the SSM scenarios do with the same keys (SPEC §2, §8).

Every kernel (kernels/ssm/configs.py) is tuned on its own time: the candidate launches that kernel alone
on a disposable one-layer pool at the batch bucket (scenarios/ssm_kernels.py), CUDA-graph timed. Before
it is timed, a candidate must pass the check its kernel already has: a short rollout of the kernel's
mode with the candidate (every other kernel on its default) against

* native on its default config, bit for bit (outputs and committed state) for native verify, compact
  verify / commit / deferred verify and the conv: the step's arithmetic does not depend on the launch
  config, so a candidate that changes a bit is wrong, not merely different;
* the replay fold against native's state, bit for bit (fp32 state), for the replay forward (which folds
  inside) and the all-layer fold;
* the torch backend within the fp32 / bf16 reference bound for native and both replay forwards.

The matrix-form kernels (`MATRIX_KERNEL_BASES`) are keyed by their dot precision too, and tuned at the
precisions the runs' default variants use (`--precision` for others): each is checked through its variant at
that precision (states bitwise where the variant's contract says so, outputs and the matrix fold's states by
the variant's tolerance).

The default config is always a candidate, so a tuned kernel is never slower than the untuned one as
far as the sweep can tell. Candidates compile in parallel processes before the sweep (on CUDA).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import torch

from scenarios import tolerances
from scenarios.base import RunContext, TuneJob
from scenarios.options import check_device, given, parse_batches, parse_dtype, split_list
from scenarios.ssm_workload import AcceptModel, build_workload
from states import make_state
from kernels.ssm.dot_precision import DEFAULT_PRECISION, PRECISIONS
from states.base import (ACT_DTYPES, DTYPE_NAMES, MODE_VARIANTS, STATE_DTYPES, StateConfig, exact_fold,
                         precompute_precision, tensor_core_precision)
from states.geometry import SSMGeometry
from states.presets import get_ssm_preset

# kernel -> (mode, variant) whose rollout checks it
_MODE_OF = {
    "native-verify": ("native", ""), "compact-verify": ("compact", "accept"),
    "deferred-verify": ("compact", "deferred"), "compact-commit": ("compact", "accept"),
    "replay-forward": ("replay", "inline"), "replay-fold": ("replay", "inline"),
    "replay-precompute": ("replay", "precompute"), "compact-precompute": ("compact", "accept-precompute"),
    "replay-matrix-fold": ("replay", "matrix"), "deferred-precompute": ("compact", "deferred-precompute"),
    "conv": ("native", ""),
}


def _rounds(cfg: StateConfig) -> int:
    """Rollout rounds of a check: on a GPU enough that replay's history overflows at least once (each round
    adds at least one record), so the fold inside the forward is checked too; in the interpreter (CPU), 3,
    as a smoke run (the kernel tests check the folds there)."""
    if not str(cfg.device).startswith("cuda"):
        return 3
    return max(3, cfg.history_len - cfg.width + 2)


# The matrix-form kernels, by the variant bases that launch them: their best config depends on the `tl.dot`
# precision (bf16x3 splits each product into three, ieee runs on CUDA cores), so their static key carries it
# and each is tuned at the precisions the runs use. A base's variant at precision p is `<base>-<p>` (the base
# itself at the default precision).
MATRIX_KERNEL_BASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "replay-precompute": ("replay", ("precompute", "matrix")), "compact-precompute": ("compact", ("accept-precompute",)),
    "deferred-precompute": ("compact", ("deferred-precompute",)),
    "replay-matrix-fold": ("replay", ("matrix", "inline-matrix")),
}


def variant_at(kernel: str, precision: str) -> str:
    """The variant whose rollout checks matrix kernel `kernel` at `precision` (its first base's)."""
    base = MATRIX_KERNEL_BASES[kernel][1][0]
    return base if precision == DEFAULT_PRECISION else f"{base}-{precision}"


def run_precisions(kernel: str) -> list[str]:
    """The precisions a run's default variants (RUN_VARIANTS) launch matrix kernel `kernel` at; the default
    precision when none of them does (so it is tuned where its own variants run)."""
    from scenarios.ssm_options import RUN_VARIANTS

    mode, bases = MATRIX_KERNEL_BASES[kernel]
    found = set()
    for v in RUN_VARIANTS.get(mode, ()):
        p = tensor_core_precision(mode, v)
        if p is not None and v in {base if p == DEFAULT_PRECISION else f"{base}-{p}" for base in bases}:
            found.add(p)
    return sorted(found) or [DEFAULT_PRECISION]


def static_key(geom: SSMGeometry, cfg: StateConfig, kernel: str, precision: str | None = None) -> dict[str, Any]:
    """What changes the best config of a kernel (the batch is the run key, bucketed). A matrix kernel's key
    carries its dot precision: `precision`, or the one `cfg`'s variant runs it at."""
    key = {
        "family": geom.family, "H": geom.key_heads, "HV": geom.value_heads, "K": geom.head_k_dim,
        "V": geom.head_v_dim, "conv_dim": geom.conv_dim, "state": DTYPE_NAMES[cfg.state_dtype],
        "act": DTYPE_NAMES[cfg.act_dtype], "W": cfg.width,
    }
    if kernel.startswith("replay"):  # their history shapes the registers
        key.update(Lh=cfg.history_len, hist=DTYPE_NAMES[cfg.history_dtype])
    if kernel in MATRIX_KERNEL_BASES:
        key["prec"] = precision or tensor_core_precision(cfg.mode, cfg.mode_variant) or DEFAULT_PRECISION
    return key


def lookup_configs(ctx: RunContext, geom: SSMGeometry, cfg: StateConfig, batch: int,
                   defaults: dict[str, dict]) -> tuple[dict[str, dict], str]:
    """The configs a triton pool of this case runs with (kernel -> config), and where they came from for
    the row: `cached` (the run's cache), `shipped` (harness/shipped_configs.json), `default` (untuned),
    or the sources joined with `+` when the kernels' differ (`cached+default`)."""
    chosen, sources = {}, set()
    for kernel, default in defaults.items():
        chosen[kernel], source = ctx.kernel_config(kernel, static_key(geom, cfg, kernel), batch, default)
        sources.add(source)
    return chosen, "+".join(sorted(sources))


def tuning_jobs(options: dict[str, Any]) -> list[TuneJob]:
    preset = get_ssm_preset(given(options.get("preset"), "tiny-gdn"))
    device = given(options.get("device"), "cpu")
    check_device(device, ["triton"])
    drafts = 3 if options.get("drafts") is None else int(options["drafts"])
    if drafts < 0:
        raise ValueError(f"--drafts must be >= 0 (0 tunes decode), got {drafts}")
    state_dtype = parse_dtype(given(options.get("state_dtype"), "fp32"), STATE_DTYPES, "--state-dtype")
    act_dtype = parse_dtype(given(options.get("act_dtype"), "bf16"), ACT_DTYPES, "--act-dtype")
    geom = replace(preset.ssm, layers=1)
    # the replay kernels are keyed by Lh: tune the one the runs use (theirs defaults to 16, at least W)
    history_len = int(given(options.get("history_len"), max(16, 1 << drafts.bit_length())))
    if history_len < 4 or history_len & (history_len - 1) or history_len < drafts + 1:
        raise ValueError(f"--history-len must be a power of two >= 4 and >= W = {drafts + 1}, got {history_len}")
    precisions = split_list(options["precision"], "--precision") if options.get("precision") else None
    for p in precisions or ():
        if p not in PRECISIONS:
            raise ValueError(f"--precision: {p!r} is not a dot precision; choose from {', '.join(PRECISIONS)}")
    jobs = []
    # on CPU the sweep is a check run in the interpreter, whose time grows with the programs launched
    # (batch x heads): batch 2 checks the same kernels in half the time of 4
    for batch in parse_batches(given(options.get("batch"), "4" if device.startswith("cuda") else "2")):
        cfg = StateConfig("native", batch, drafts=drafts, state_dtype=state_dtype, act_dtype=act_dtype,
                          history_len=history_len, backend="triton", device=device)
        jobs += _jobs_for(geom, cfg, batch, precisions)
    return jobs


def _jobs_for(geom: SSMGeometry, cfg: StateConfig, batch: int, precisions: list[str] | None = None) -> list[TuneJob]:
    """One job per kernel the case launches; a matrix kernel one per precision (`precisions`, or the ones the
    default run variants use: `run_precisions`)."""
    from kernels.ssm.configs import config_space, default_config
    from scenarios.ssm_kernels import kernel_cases

    dims = {"head_k_dim": geom.head_k_dim, "head_v_dim": geom.head_v_dim, "conv_dim": geom.conv_dim}
    bound = tolerances.backend_rms(geom.family, cfg.state_dtype)
    built: dict[int, dict[str, Any]] = {}  # bucket -> inputs, shared by the kernels' sweeps

    def build(bucket: int) -> dict[str, Any]:
        if bucket in built:
            return built[bucket]
        wl = build_workload(geom, batch=bucket, drafts=cfg.drafts, rounds=_rounds(cfg), state_dtype=cfg.state_dtype,
                            act_dtype=cfg.act_dtype, accept=AcceptModel.parse("geometric:0.7", max(cfg.drafts, 1)),
                            dynamic_widths=False, seed=bucket, device=cfg.device)
        torch_cfg = replace(cfg, backend="torch")
        ref = {mode: _rollout(geom, wl, torch_cfg, mode, "", None) for mode in ("native", "replay")}
        native = _rollout(geom, wl, cfg, "native", "", {})  # triton, every kernel on its default
        built[bucket] = {"wl": wl, "ref": ref, "native": native, "cases": {}}
        return built[bucket]

    def build_at(precision: str | None):
        """`build`, with the kernels' timed cases at `precision` (None: the default), made once per bucket."""
        def at(bucket: int) -> dict[str, Any]:
            inputs = build(bucket)
            if precision not in inputs["cases"]:
                inputs["cases"][precision] = {
                    c.kernel: c for c in kernel_cases(geom, inputs["wl"].params, batch=bucket, drafts=cfg.drafts,
                                                      state_dtype=cfg.state_dtype, act_dtype=cfg.act_dtype,
                                                      history_len=cfg.history_len, device=cfg.device,
                                                      precision=precision or "")
                    if c.name == c.kernel}
            return {**inputs, "cases": inputs["cases"][precision]}
        return at

    def run_kernel(kernel: str):
        def run(config: dict, inputs: dict) -> None:
            inputs["cases"][kernel].run(config)
        return run

    def check_kernel(kernel: str, precision: str | None):
        mode, variant = _MODE_OF[kernel] if precision is None else (MATRIX_KERNEL_BASES[kernel][0],
                                                                     variant_at(kernel, precision))

        def check(config: dict, inputs: dict) -> tuple[bool, str]:
            outs, snap = _rollout(geom, inputs["wl"], cfg, mode, variant, {kernel: config})
            n_outs, n_snap = inputs["native"]
            said = []
            # compact's matrix-form verify: states bitwise (accept's commit), outputs by tolerance like replay's
            matrix = mode == "compact" and precompute_precision(mode, variant) is not None
            if mode in ("native", "compact"):
                if not matrix and not all(torch.equal(a, b) for a, b in zip(outs, n_outs, strict=True)):
                    return False, f"{mode} outputs differ from native's default config bit for bit"
                if not all(_same_bytes(a, b) for a, b in zip(snap, n_snap, strict=True)):
                    return False, f"{mode} committed state differs from native's default config bit for bit"
                said.append("states bitwise == native" if matrix else "bitwise == native")
            elif cfg.state_dtype == torch.float32 and exact_fold(mode, variant):
                if not torch.equal(snap[0], n_snap[0]):
                    return False, "replay fold differs from native state bit for bit"
                said.append("fold bitwise == native")
            elif cfg.state_dtype == torch.float32:  # the matrix fold: native's state within the fp32 contract
                worst = _rms(snap[0], n_snap[0])
                if worst > bound:
                    return False, f"replay matrix fold vs native state RMS {worst:.3g} (bound {bound:.3g})"
                said.append(f"fold vs native RMS {worst:.3g}")
            if mode != "compact" or matrix:
                limit = tolerances.variant_output_rms(variant, bound)
                ref = inputs["ref"]["native" if matrix else mode][0]  # torch computes compact as native does
                worst = max(_rms(o, r) for o, r in zip(outs, ref, strict=True))
                if worst > limit:
                    return False, f"{mode} vs torch backend RMS {worst:.3g} (bound {limit:.3g})"
                said.append(f"vs torch RMS {worst:.3g} (bound {limit:.3g})")
            return True, "; ".join(said)
        return check

    jobs = []
    for kernel in kernels_of(geom, cfg):
        default = default_config(kernel, **dims)
        space = cpu_space(config_space(kernel, **dims), default, cfg.device)
        for precision in (precisions or run_precisions(kernel)) if kernel in MATRIX_KERNEL_BASES else [None]:
            if precision is not None and variant_at(kernel, precision) not in MODE_VARIANTS[_MODE_OF[kernel][0]]:
                continue  # no variant runs it there (the matrix fold has no plain-tf32 variant)
            jobs.append(TuneJob(kernel, static_key(geom, cfg, kernel, precision), batch, space, default,
                                build_at(precision), run_kernel(kernel), check_kernel(kernel, precision)))
    return jobs


def cpu_space(space: list[dict], default: dict, device: str) -> list[dict]:
    """The candidates to sweep: the whole space on a GPU; on CPU, where the kernels run in the interpreter
    (its times say nothing about a GPU, and the full space took many minutes), the default and the space's
    first other config, as the page kernels do: enough to check them and to exercise the sweep and cache."""
    if str(device).startswith("cuda"):
        return space
    return [dict(default)] + [c for c in space if c != default][:1]


def kernels_of(geom: SSMGeometry, cfg: StateConfig) -> list[str]:
    """The kernels a case of this geometry and width launches: compact needs drafts; the precompute
    forward and the matrix fold need tensor-core tiles, and the matrix fold an fp32 history."""
    from kernels.ssm.replay_matrix_fold import matrix_fold_supported
    from kernels.ssm.replay_precompute import precompute_supported

    kernels = ["native-verify", "conv", "replay-forward", "replay-fold"]
    if cfg.drafts >= 1:
        kernels += ["compact-verify", "compact-commit", "deferred-verify"]
    if precompute_supported(geom.head_k_dim, geom.head_v_dim) is None:
        kernels.append("replay-precompute")
        if cfg.drafts >= 1:
            kernels += ["compact-precompute", "deferred-precompute"]
        if matrix_fold_supported(geom.head_k_dim, geom.head_v_dim, cfg.history_dtype) is None:
            kernels.append("replay-matrix-fold")
    return kernels


def _rollout(geom: SSMGeometry, wl, cfg: StateConfig, mode: str, variant: str,
             configs: dict[str, dict] | None) -> tuple[list[torch.Tensor], tuple]:
    st, slots = _fresh(geom, wl, cfg, mode, variant, configs)
    outs = [_round(st, slots, wl, r) for r in range(wl.rounds)]
    return outs, st.snapshot(slots)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


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
