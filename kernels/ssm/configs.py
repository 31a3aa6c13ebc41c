"""Launch configs of the SSM-state Triton kernels, by config class (SPEC §2, §8).

A config class is a set of kernels that must run with one config because the config is part of the
numerics: `step` (BV, num_warps, num_stages) is shared by native verify, compact verify and commit,
and the replay forward (which folds inside) and fold/materialize, since BV and the warp layout set
the reduction tree of the `tl.sum` in `delta_step`, and the bitwise contracts between modes need the
same tree. `conv` (BC, num_warps, num_stages) is the conv kernel's own: its arithmetic is per
channel, so any config gives the same bits.

A config is a plain dict (`{"BV": 32, "num_warps": 4, "num_stages": 1}`); the autotuner sweeps
`config_space(...)` and a state pool falls back to `default_config(...)`.
"""

from __future__ import annotations

import itertools
from typing import Any

import triton

Config = dict[str, Any]

STEP = "step"
CONV = "conv"
CONFIG_CLASSES = (STEP, CONV)

# num_stages is kept as an axis with one value: the token loops carry no async copies for the
# pipeliner to stage (measured on an H200: identical TTGIR for 1, 2 and 3 stages), so sweeping it
# only multiplied autotune time.
_AXES: dict[str, dict[str, tuple[int, ...]]] = {
    STEP: {"BV": (8, 16, 32, 64, 128), "num_warps": (1, 2, 4, 8), "num_stages": (1,)},
    CONV: {"BC": (32, 64, 128, 256, 512), "num_warps": (1, 2, 4, 8), "num_stages": (1,)},
}
# A state block of BK x BV fp32 values spread over num_warps * 32 threads: fewer than 4 per thread
# leaves lanes idle, more than 128 spills registers (the block is carried across the token loop).
_MIN_PER_THREAD, _MAX_PER_THREAD = 4, 128


def _check_class(config_class: str) -> None:
    if config_class not in CONFIG_CLASSES:
        raise ValueError(f"unknown kernel config class {config_class!r}; choose one of {', '.join(CONFIG_CLASSES)}")


def _keep(config_class: str, config: Config, head_k_dim: int, head_v_dim: int, conv_dim: int) -> bool:
    threads = 32 * config["num_warps"]
    if config_class == STEP:
        if config["BV"] > max(8, triton.next_power_of_2(head_v_dim)):
            return False
        per_thread = triton.next_power_of_2(head_k_dim) * config["BV"] / threads
        return _MIN_PER_THREAD <= per_thread <= _MAX_PER_THREAD
    if config["BC"] > max(32, triton.next_power_of_2(conv_dim)):
        return False
    return config["BC"] >= threads


def config_space(config_class: str, *, head_k_dim: int, head_v_dim: int, conv_dim: int) -> list[Config]:
    """Candidate configs of `config_class` for one geometry (pruned, never empty).

    Args:
        config_class: `step` or `conv`.
        head_k_dim, head_v_dim: K and V of the state.
        conv_dim: channels of the conv (`2*H*K + HV*V`).
    """
    _check_class(config_class)
    axes = _AXES[config_class]
    configs = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    kept = [c for c in configs if _keep(config_class, c, head_k_dim, head_v_dim, conv_dim)]
    # Tiny shapes can prune everything; the smallest block with one warp always runs.
    return kept or [{**configs[0], "num_warps": 1}]


def default_config(config_class: str, *, head_k_dim: int, head_v_dim: int, conv_dim: int) -> Config:
    """The config used when nothing is tuned: BV 32 with 4 warps (fla's fused_recurrent_kda choice;
    BC 256 for the conv) when the space has it, else the space's largest block with the fewest warps."""
    _check_class(config_class)
    space = config_space(config_class, head_k_dim=head_k_dim, head_v_dim=head_v_dim, conv_dim=conv_dim)
    preferred = {STEP: {"BV": 32, "num_warps": 4, "num_stages": 1}, CONV: {"BC": 256, "num_warps": 4, "num_stages": 1}}
    if preferred[config_class] in space:
        return dict(preferred[config_class])
    block = "BV" if config_class == STEP else "BC"
    return dict(max(space, key=lambda c: (c[block], -c["num_warps"])))


def default_configs(*, head_k_dim: int, head_v_dim: int, conv_dim: int) -> dict[str, Config]:
    """`{config class: default config}` for every class (what a state pool starts with)."""
    dims = {"head_k_dim": head_k_dim, "head_v_dim": head_v_dim, "conv_dim": conv_dim}
    return {c: default_config(c, **dims) for c in CONFIG_CLASSES}


def check_config(config_class: str, config: Config) -> Config:
    """A copy of `config` after checking it names exactly the class's axes with allowed values."""
    _check_class(config_class)
    axes = _AXES[config_class]
    if set(config) != set(axes):
        raise ValueError(f"{config_class} config {config} must set exactly {sorted(axes)}")
    for name, allowed in axes.items():
        if config[name] not in allowed:
            raise ValueError(f"{config_class} config {name}={config[name]} not in {list(allowed)}")
    return dict(config)
