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

from kernels.ssm.baselines.base import PoolSpec
from kernels.ssm.baselines.sglang import ring_len
from states.base import MATRIX_FOLD_PRECISION, StateConfig, _nbytes, separate_fold_launch
from states.compact import CompactState
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
    if CompactState.is_deferred(cfg):  # deferred and deferred-precompute*: the same bytes
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
    the checkpoint it read anyway, and so does GDN's `matrix*` precompute forward (the folded block read
    back from L2); `precompute*` and KDA's `matrix*` fold in a launch of their own before the forward,
    which reads the checkpoint once more (`separate_fold_launch`). `counts` are the accepted records
    before the round's fold decision."""
    tb, w = TokenBytes.of(g, cfg), widths.long().cpu()
    c = counts.long().cpu()
    fold = (c + w > cfg.history_len) & (w > 0)
    gate = g.value_heads * g.gate_width * 4
    checkpoint_passes = 2 if separate_fold_launch(g.family, cfg.mode_variant) else 1
    # the token fold replays the raw records; the matrix fold reads the derived ones (k, d, log gate)
    per_record = tb.derived if cfg.mode_variant in MATRIX_FOLD_PRECISION else tb.raw + gate
    fold_bytes = (fold * (checkpoint_passes * tb.state + c * per_record)).sum()
    c_after = torch.where(fold, 0, c)
    forward = ((w > 0) * (tb.state + c_after * tb.derived) + w * (tb.derived + tb.raw)).sum()
    return _common(tb, g, w) + float(fold_bytes + forward) * g.layers


# ----------------------------------------------------------------------------------- baselines (peers)
# Each counts what every mode moves besides its state (`_common`: inputs, outputs, conv windows) plus what
# the peer's functions and the layout work around them move, as the adapters in kernels/ssm/baselines run
# them. Copies over the round's packed rows cover all `n * W` of them (padding included), as they do.


def fla_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor) -> float:
    """fla (fused_recurrent_kda_fwd in place on the native pool layout): the split of the conv output
    into the contiguous q, k, v fla takes (read and written once), GDN's gate broadcast over K (written
    once and read by the kernel), and fla's state traffic: the accepted state read and one state written
    per token (decode: the same row, in place), as native's."""
    tb, w = TokenBytes.of(g, cfg), widths.long().cpu()
    act, rows = _nbytes(cfg.act_dtype), w.numel() * cfg.width
    split = rows * 2 * g.conv_dim * act
    gate = rows * 2 * g.value_heads * g.head_k_dim * act if g.family == "gdn" else 0
    states = ((w > 0).long() + w).sum() * tb.state
    return _common(tb, g, w) + float(split + gate + states) * g.layers


def flashinfer_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor) -> float:
    """FlashInfer (gated_delta_rule_mtp with per-token ssm_state_indices; decode_pretranspose at W = 1):
    the gather of the packed rows into its `[B, T]` q, k, v, a, b (read and written once), the accepted
    state read and a state written for each of the W tokens of an active request (its scatter writes
    every position of the window, padded ones too; decode: the same row), and its bf16 outputs put back
    into packed rows (read and written once)."""
    tb, w = TokenBytes.of(g, cfg), widths.long().cpu()
    act, rows, W = _nbytes(cfg.act_dtype), w.numel() * cfg.width, cfg.width
    gather = rows * 2 * (g.conv_dim + 2 * g.value_heads) * act
    unpack = rows * 2 * g.value_heads * g.head_v_dim * 2
    states = ((w > 0).long() * (1 + W)).sum() * tb.state
    return _common(tb, g, w) + float(gather + unpack + states) * g.layers


@dataclass(frozen=True)
class RingBytes:
    """Byte sizes of one token's records in SGLang's ring, one layer."""

    derived: int  # d (HV x V) and k (H x K) in the history dtype, g (HV) fp32
    raw: int  # replay's exact-fold inputs: raw v, raw k (activation dtype), beta (fp32)
    residual: int  # compact's hi/lo residuals of d and k with a 16-bit ring (activation dtype)

    @classmethod
    def of(cls, g: SSMGeometry, cfg: StateConfig) -> RingBytes:
        act, hist = _nbytes(cfg.act_dtype), _nbytes(cfg.history_dtype)
        H, HV, K, V = g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim
        residual = (HV * V + H * K) * act if cfg.mode == "compact" and cfg.history_dtype != torch.float32 else 0
        return cls(derived=(HV * V + H * K) * hist + HV * 4, raw=(HV * V + H * K) * act + HV * 4, residual=residual)


def sglang_replay_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor,
                              counts: torch.Tensor, flush: torch.Tensor) -> float:
    """SGLang's ReplaySSM round (gdn_replayssm_spec_decode + commit_gdn_replayssm_spec), per layer and active
    request with `c = counts` committed records: a request not flushing reads its checkpoint and its `c`
    derived records; one flushing (`flush`, set by the last commit) first folds: reads the checkpoint and
    `c` raw records, writes the checkpoint, then reads it again for its outputs. Either writes the window's
    `w` derived and raw records. Cursor updates are a few bytes per request and not counted."""
    tb, rb, w = TokenBytes.of(g, cfg), RingBytes.of(g, cfg), widths.long().cpu()
    c, f, live = counts.long().cpu(), flush.bool().cpu(), w > 0
    verify = ~f * (tb.state + c * rb.derived)
    fold = f * (3 * tb.state + c * rb.raw)
    per_layer = (live * (verify + fold) + w * (rb.derived + rb.raw)).sum()
    return _common(tb, g, w) + float(per_layer) * g.layers


def sglang_cursors_after(counts: torch.Tensor, flush: torch.Tensor, widths: torch.Tensor, accepted: torch.Tensor,
                         ring: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's commit: `write_pos <- accepted + 1` after a flush, `+= accepted + 1` otherwise; the next
    round flushes when `write_pos + 2W > L`."""
    num = torch.where(widths.cpu() > 0, accepted.long().cpu() + 1, 0)
    c = torch.where(flush.bool().cpu(), num, counts.long().cpu() + num)
    return c, (c + 2 * width) > ring


def sglang_compact_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor,
                               ring: int) -> float:
    """SGLang's fold-every-commit round, per layer and active request: the verify reads the checkpoint and
    writes the window's `w` (d, k, g) records (and their residuals with a 16-bit ring); the commit
    (commit_gdn_replayssm_circular) reads the checkpoint and the whole ring of `ring` records (its loads
    are not masked by the accepted count) and writes the checkpoint."""
    tb, rb, w = TokenBytes.of(g, cfg), RingBytes.of(g, cfg), widths.long().cpu()
    rec = rb.derived + rb.residual
    per_layer = ((w > 0) * (3 * tb.state + ring * rec) + w * rec).sum()
    return _common(tb, g, w) + float(per_layer) * g.layers


def sglang_kda_round_bytes(g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor, accepted: torch.Tensor) -> float:
    """SGLang's KDA round (fold every commit), per layer and active request: the recurrent verify reads the
    checkpoint and writes the window's `w` raw records (raw v and k in the activation dtype, the per-K gate
    and beta in fp32); the commit reads the checkpoint and the `accepted + 1` records and writes the
    checkpoint."""
    tb, w, a = TokenBytes.of(g, cfg), widths.long().cpu(), accepted.long().cpu()
    H, HV, K, V, act = g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim, _nbytes(cfg.act_dtype)
    rec = (HV * V + H * K) * act + HV * K * 4 + HV * 4
    per_layer = ((w > 0) * 3 * tb.state + w * rec + (a + 1).clamp_min(0) * rec).sum()
    return _common(tb, g, w) + float(per_layer) * g.layers


def baseline_round_bytes(backend: str, g: SSMGeometry, cfg: StateConfig, widths: torch.Tensor,
                         accepted: torch.Tensor) -> float:
    """A baseline row's bytes per round (SGLang's replay: the mean over its steady-state flush cycle, from
    empty rings, like `steady_replay_round_bytes`)."""
    if backend == "fla":
        return fla_round_bytes(g, cfg, widths, accepted)
    if backend == "flashinfer":
        return flashinfer_round_bytes(g, cfg, widths, accepted)
    if g.family == "kda":
        return sglang_kda_round_bytes(g, cfg, widths, accepted)
    ring = ring_len(cfg.mode, PoolSpec(cfg.mode, cfg.max_requests, cfg.width, history_len=cfg.history_len))
    if cfg.mode == "compact":
        return sglang_compact_round_bytes(g, cfg, widths, accepted, ring)
    counts = torch.zeros(widths.shape[0], dtype=torch.long)
    flush = torch.zeros(widths.shape[0], dtype=torch.bool)
    total, rounds = 0.0, 4 * ring
    for r in range(2 * rounds):  # the first half brings the cursors to their cycle
        if r >= rounds:
            total += sglang_replay_round_bytes(g, cfg, widths, accepted, counts, flush)
        counts, flush = sglang_cursors_after(counts, flush, widths, accepted, ring, cfg.width)
    return total / rounds


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
