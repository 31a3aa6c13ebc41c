"""Cost models: bytes a round must move through device memory, per mode (SPEC §7).

Each function counts the fewest bytes an implementation of the mode must read and write for one
round of all layers (each tensor read once, each written once); achieved GB/s and % of the measured
device-to-device ceiling are computed from these, so they are roofline fractions, not profiler numbers.
Counted per layer and per active request (width w > 0):

* inputs: the round's `w` tokens of `mixed_qkv`, gate input `a` and beta input `b` (activation dtype),
  and outputs `[w, HV, V]` fp32;
* conv: the accepted window `(kernel - 1) x conv_dim` read, `(kernel - 2 + w) x conv_dim` written;
* state, records and history as each mode's docstring says.

Layer parameters and index tensors are not counted (they are tiny and stay in cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from states.base import PRECOMPUTE_PRECISION, StateConfig, _nbytes
from states.geometry import SSMGeometry


@dataclass(frozen=True)
class TokenBytes:
    """Byte sizes of one token / one state of a geometry under a config."""

    state: int
    inputs: int
    outputs: int
    conv_col: int
    record: int  # compact record: raw k, raw v, exp(g), beta
    derived: int  # replay derived record: normalized k, d (history dtype), log gate
    raw: int  # replay raw record: raw k, raw v (activation dtype), beta

    @classmethod
    def of(cls, g: SSMGeometry, cfg: StateConfig) -> TokenBytes:
        act, hist = _nbytes(cfg.act_dtype), _nbytes(cfg.history_dtype)
        H, HV, K, V, gw = g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim, g.gate_width
        a_width = HV if g.family == "gdn" else HV * K
        return cls(
            state=g.state_elems * _nbytes(cfg.state_dtype),
            inputs=(g.conv_dim + a_width + HV) * act,
            outputs=HV * V * 4,
            conv_col=g.conv_dim * act,
            record=H * K * act + HV * V * act + HV * gw * 4 + HV * 4,
            derived=H * K * hist + HV * V * hist + HV * gw * 4,
            raw=H * K * act + HV * V * act + HV * 4,
        )


def _common(tb: TokenBytes, g: SSMGeometry, w: torch.Tensor) -> float:
    """Inputs, outputs and conv windows of active rows, all layers."""
    active = w > 0
    per_layer = (
        (w * (tb.inputs + tb.outputs)).sum()
        + active.sum() * (g.conv_kernel - 1) * tb.conv_col
        + ((g.conv_kernel - 2 + w) * active).sum() * tb.conv_col
    )
    return float(per_layer) * g.layers


def native_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor) -> float:
    """Native: read the accepted state once, write a snapshot after every one of the `w` tokens."""
    tb, w = TokenBytes.of(g, cfg), widths.long().cpu()
    states = float(((w > 0).long() + w).sum()) * tb.state * g.layers
    return _common(tb, g, w) + states


def compact_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor) -> float:
    """Compact, by variant. `accept`: verify reads the state and writes `w` records; commit reads the
    state and the `accepted + 1` kept records and writes the state once (3 state passes). `deferred`
    (steady state, the previous round accepted as many as this one): verify reads the state and the
    pending round's `accepted + 1` records, writes the state once and the `w` new records (2 passes)."""
    tb, w, a = TokenBytes.of(g, cfg), widths.long().cpu(), accepted.long().cpu()
    active = (w > 0).long()
    kept = (a + 1).clamp_min(0) * tb.record
    if cfg.mode_variant == "deferred":
        per_layer = (active * 2 * tb.state + kept + w * tb.record).sum()
    else:
        verify = active * tb.state + w * tb.record
        commit = active * 2 * tb.state + kept
        per_layer = (verify + commit).sum()
    return _common(tb, g, w) + float(per_layer) * g.layers


def replay_round_bytes(
    g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor, counts: torch.Tensor
) -> float:
    """Replay: forward reads the checkpoint and the `count` derived history records since it, and
    writes `w` derived + raw records; a request whose history would overflow first folds: it reads its
    `count` raw records plus log gates and writes the checkpoint once. The `inline` forward folds from
    the checkpoint it read anyway; the precompute variants fold in a launch of their own before the
    forward, which reads the checkpoint once more. `counts` are the accepted records before the round's
    fold decision."""
    tb, w = TokenBytes.of(g, cfg), widths.long().cpu()
    c = counts.long().cpu()
    fold = (c + w > cfg.history_len) & (w > 0)
    gate = g.value_heads * g.gate_width * 4
    checkpoint_passes = 2 if cfg.mode_variant in PRECOMPUTE_PRECISION else 1
    fold_bytes = (fold * (checkpoint_passes * tb.state + c * (tb.raw + gate))).sum()
    c_after = torch.where(fold, 0, c)
    forward = ((w > 0) * (tb.state + c_after * tb.derived) + w * (tb.derived + tb.raw)).sum()
    return _common(tb, g, w) + float(fold_bytes + forward) * g.layers


def fla_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor) -> float:
    """The fla baseline (in place on the native pool): what every mode moves besides its state
    (inputs, outputs, conv windows), plus splitting the conv output into the contiguous q, k, v fla
    takes (read and written once), plus fla's state traffic: the accepted state read and one state
    written per token (decode: the same row, in place), as native's."""
    tb, w = TokenBytes.of(g, cfg), widths.long().cpu()
    split = (w * 2 * g.conv_dim * _nbytes(cfg.act_dtype)).sum()
    states = ((w > 0).long() + w).sum() * tb.state
    return _common(tb, g, w) + float(split + states) * g.layers


def replay_counts_after(
    counts: torch.Tensor, widths: torch.Tensor, accepted: torch.Tensor, history_len: int
) -> torch.Tensor:
    """Accepted records per request after one round (fold when `count + w > Lh`, then `+ accepted + 1`)."""
    c, w = counts.long().cpu(), widths.long().cpu()
    c = torch.where((c + w > history_len) & (w > 0), 0, c)
    return c + torch.where(w > 0, accepted.long().cpu() + 1, 0)


def steady_replay_round_bytes(
    g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor, counts: torch.Tensor, rounds: int = 64
) -> tuple[float, torch.Tensor]:
    """Mean replay bytes per round over `rounds` repeats of the same (widths, accepted) pattern starting
    from `counts` (what a timing loop replaying one round sees), and the counts afterwards."""
    total = 0.0
    for _ in range(rounds):
        total += replay_round_bytes(g, cfg, widths, accepted, counts)
        counts = replay_counts_after(counts, widths, accepted, cfg.history_len)
    return total / rounds, counts


ROUND_BYTES = {"native": native_round_bytes, "compact": compact_round_bytes}
