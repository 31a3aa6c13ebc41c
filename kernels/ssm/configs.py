"""Launch configs of the SSM-state Triton kernels, one per kernel (SPEC §2, §8).

Every kernel has its own config, tuned on its own time: the token step's arithmetic does not depend on
the launch config (its K reductions run in a fixed order, `kdot` in kernels/ssm/step.py), so native
verify on one config and compact verify, commit or the replay fold on another still produce the same
bits (measured on an H200: tests/test_triton_native_compact.py and test_triton_replay.py run the modes
on different configs). Kernels, by the name used in code, caches and result columns:

    native-verify      native verify (W = 1 + drafts) and decode (W = 1): the static key's W tells them apart
    compact-verify     compact verify, accept variant (reads the state, writes records)
    deferred-verify    compact verify, deferred variant (applies the pending records, writes the state, verifies)
    compact-commit     compact commit (all layers in one launch; also the deferred snapshot)
    replay-forward     replay inline forward (folds inside when a row's history is full)
    replay-fold        replay fold of every layer (snapshot, materialize)
    replay-precompute  replay precompute forward (tensor cores)
    replay-matrix-fold replay fold in matrix form, matrix variants (tensor cores; states by tolerance)
    compact-precompute compact verify in matrix form, accept-precompute variants (tensor cores)
    deferred-precompute compact verify in matrix form after the pending commit, deferred-precompute variants
    conv               causal depthwise conv

A config is a plain dict (`{"BV": 32, "num_warps": 4, "num_stages": 1}`); the autotuner sweeps
`config_space(kernel, ...)` and a state pool starts from `default_config(kernel, ...)`.
"""

from __future__ import annotations

import itertools
from typing import Any

import triton

Config = dict[str, Any]

NATIVE_VERIFY = "native-verify"
COMPACT_VERIFY = "compact-verify"
DEFERRED_VERIFY = "deferred-verify"
COMPACT_COMMIT = "compact-commit"
REPLAY_FORWARD = "replay-forward"
REPLAY_FOLD = "replay-fold"
REPLAY_PRECOMPUTE = "replay-precompute"
REPLAY_MATRIX_FOLD = "replay-matrix-fold"
COMPACT_PRECOMPUTE = "compact-precompute"
DEFERRED_PRECOMPUTE = "deferred-precompute"
CONV = "conv"

# num_stages is kept as an axis with one value: the token loops carry no async copies for the
# pipeliner to stage (measured on an H200: identical TTGIR for 1, 2 and 3 stages), so sweeping it
# only multiplied autotune time.
_STEP_AXES = {"BV": (8, 16, 32, 64, 128), "num_warps": (1, 2, 4, 8), "num_stages": (1,)}
# the matrix-form kernels: BV is the tensor cores' M side, BK the K chunk of their reductions (both >= 16);
# their K loop carries loads the pipeliner can stage, so num_stages is an axis here
_MATRIX_AXES = {"BV": (16, 32, 64, 128), "BK": (16, 32, 64), "num_warps": (1, 2, 4, 8), "num_stages": (1, 2)}
_AXES: dict[str, dict[str, tuple[int, ...]]] = {
    NATIVE_VERIFY: _STEP_AXES, COMPACT_VERIFY: _STEP_AXES, DEFERRED_VERIFY: _STEP_AXES,
    COMPACT_COMMIT: _STEP_AXES, REPLAY_FORWARD: _STEP_AXES, REPLAY_FOLD: _STEP_AXES,
    REPLAY_PRECOMPUTE: _MATRIX_AXES, COMPACT_PRECOMPUTE: _MATRIX_AXES, REPLAY_MATRIX_FOLD: _MATRIX_AXES,
    DEFERRED_PRECOMPUTE: _MATRIX_AXES,
    CONV: {"BC": (32, 64, 128, 256, 512), "num_warps": (1, 2, 4, 8), "num_stages": (1,)},
}
KERNELS = tuple(_AXES)
# the kernels that step the state token by token over a `[K, BV]` block (same axes)
STEP_KERNELS = tuple(k for k, axes in _AXES.items() if axes is _STEP_AXES)

# The untuned default of each kernel: its fastest config at Qwen3-Next shape, batch 128, W = 4, fp32
# state on an H200 (results/reference/h200-2026-12-03/kernels-fma), used where the space has it.
_PREFERRED: dict[str, Config] = {
    NATIVE_VERIFY: {"BV": 64, "num_warps": 2, "num_stages": 1},
    COMPACT_VERIFY: {"BV": 32, "num_warps": 1, "num_stages": 1},
    DEFERRED_VERIFY: {"BV": 16, "num_warps": 1, "num_stages": 1},
    COMPACT_COMMIT: {"BV": 16, "num_warps": 1, "num_stages": 1},
    REPLAY_FORWARD: {"BV": 64, "num_warps": 2, "num_stages": 1},
    REPLAY_FOLD: {"BV": 16, "num_warps": 1, "num_stages": 1},
    REPLAY_PRECOMPUTE: {"BV": 64, "BK": 32, "num_warps": 2, "num_stages": 1},
    COMPACT_PRECOMPUTE: {"BV": 32, "BK": 32, "num_warps": 1, "num_stages": 1},  # h200-2026-12-03c/compact-precompute
    # the best at bf16x3, which the matrix-bf16x3 rows run (Qwen3-Next batch 128, h200-2026-12-04b/precompute: 158
    # us; at ieee it takes 198 where the tuned 8 warps take 165); deferred-precompute's earlier 4-warp guess took
    # 444 us where 1 warp takes 226
    REPLAY_MATRIX_FOLD: {"BV": 64, "BK": 32, "num_warps": 2, "num_stages": 1},
    DEFERRED_PRECOMPUTE: {"BV": 32, "BK": 32, "num_warps": 1, "num_stages": 1},
    CONV: {"BC": 64, "num_warps": 1, "num_stages": 1},  # h200-2026-12-04c/conv: best at batch 128 and 256
}
# A state block of K x BV fp32 values spread over num_warps * 32 threads: fewer than 4 per thread
# leaves lanes idle, more than 128 spills registers (the block is carried across the token loop).
_MIN_PER_THREAD, _MAX_PER_THREAD = 4, 128
# The matrix kernels that hold only a `[BK, BV]` chunk of the state at a time (their K loop reduces chunk by
# chunk), so the bound above applies to the chunk. Deferred-precompute is not one: it commits the pending
# records on the whole `[K, BV]` block first. (Bounding these by the whole block pruned BV 64 and 128 on one
# warp at K = 128, which no sweep then measured; 1 warp is where every one of them is fastest at BV 32.)
_CHUNKED = (REPLAY_PRECOMPUTE, COMPACT_PRECOMPUTE, REPLAY_MATRIX_FOLD)


def _check_kernel(kernel: str) -> None:
    if kernel not in _AXES:
        raise ValueError(f"unknown SSM kernel {kernel!r}; choose one of {', '.join(KERNELS)}")


def _keep(kernel: str, config: Config, head_k_dim: int, head_v_dim: int, conv_dim: int) -> bool:
    threads = 32 * config["num_warps"]
    if kernel == CONV:
        return config["BC"] <= max(32, triton.next_power_of_2(conv_dim)) and config["BC"] >= threads
    matrix = _AXES[kernel] is _MATRIX_AXES
    widest = max(16 if matrix else 8, triton.next_power_of_2(head_v_dim))
    if config["BV"] > widest:
        return False
    if matrix:  # K chunks of 32 or 64 (16 only where K is that small)
        chunk, kp = config["BK"], triton.next_power_of_2(head_k_dim)
        if chunk > max(16, kp) or (chunk < 32 and kp >= 32):
            return False
    rows = config["BK"] if kernel in _CHUNKED else triton.next_power_of_2(head_k_dim)
    per_thread = rows * config["BV"] / threads
    return _MIN_PER_THREAD <= per_thread <= _MAX_PER_THREAD


def config_axes(kernel: str) -> tuple[str, ...]:
    """The names a config of `kernel` sets (`BV`, `num_warps`, ...)."""
    _check_kernel(kernel)
    return tuple(_AXES[kernel])


def config_space(kernel: str, *, head_k_dim: int, head_v_dim: int, conv_dim: int) -> list[Config]:
    """Candidate configs of `kernel` for one geometry (pruned, never empty).

    Args:
        kernel: one of `KERNELS`.
        head_k_dim, head_v_dim: K and V of the state.
        conv_dim: channels of the conv (`2*H*K + HV*V`).
    """
    _check_kernel(kernel)
    axes = _AXES[kernel]
    configs = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    kept = [c for c in configs if _keep(kernel, c, head_k_dim, head_v_dim, conv_dim)]
    # Tiny shapes can prune everything; the smallest block with one warp always runs.
    return kept or [{**configs[0], "num_warps": 1}]


def default_config(kernel: str, *, head_k_dim: int, head_v_dim: int, conv_dim: int) -> Config:
    """The config used when nothing is tuned: the kernel's preferred config when the space has it,
    else the space's largest block with the fewest warps."""
    space = config_space(kernel, head_k_dim=head_k_dim, head_v_dim=head_v_dim, conv_dim=conv_dim)
    if _PREFERRED[kernel] in space:
        return dict(_PREFERRED[kernel])
    block = "BC" if kernel == CONV else "BV"
    return dict(max(space, key=lambda c: (c[block], -c["num_warps"])))


def default_configs(kernels: tuple[str, ...], *, head_k_dim: int, head_v_dim: int, conv_dim: int) -> dict[str, Config]:
    """`{kernel: default config}` for the kernels a state pool launches."""
    dims = {"head_k_dim": head_k_dim, "head_v_dim": head_v_dim, "conv_dim": conv_dim}
    return {k: default_config(k, **dims) for k in kernels}


def for_step_kernels(config: Config) -> dict[str, Config]:
    """`{kernel: config}` giving every token-step kernel the same `config` (tests and sweeps)."""
    return {k: dict(config) for k in STEP_KERNELS}


def check_config(kernel: str, config: Config) -> Config:
    """A copy of `config` after checking it names exactly the kernel's axes with allowed values."""
    _check_kernel(kernel)
    axes = _AXES[kernel]
    if set(config) != set(axes):
        raise ValueError(f"{kernel} config {config} must set exactly {sorted(axes)}")
    for name, allowed in axes.items():
        if config[name] not in allowed:
            raise ValueError(f"{kernel} config {name}={config[name]} not in {list(allowed)}")
    return dict(config)
