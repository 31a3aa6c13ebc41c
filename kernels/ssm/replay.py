"""Triton kernels of the replay state mode (SPEC §3, replay paragraph): prepare, fold, forward.

Storage (one pool for the `L` layers of a rank; `P = 2 * Lh` ring positions, ring position
`phase * Lh + j` holds record `j` since the checkpoint; `gw` = 1 for GDN, K for KDA):

    ssm       [L, slots, HV, K, V]   state dtype   the checkpoint S0
    hist_k    [L, slots, H, P, K]    history dtype normalized k        (derived records)
    hist_d    [L, slots, HV, P, V]   history dtype d = beta (v - S^T k)
    hist_g    [L, slots, HV, P(, K)] fp32          log gate g
    raw_k     [L, slots, H, P, K]    act dtype     conv output k     (raw records, for exact folds)
    raw_v     [L, slots, HV, P, V]   act dtype     conv output v
    raw_beta  [L, slots, HV, P]      fp32          beta
    cursor    [slots]                int32         phase * P + count

A round is `replay_prepare` (fold decision on the device, cursor flip), then either `replay_fold`
before layer 0 (the split variant) or the fold done by the round's first `replay_forward` launch (the
fused variant), then one `replay_forward` per layer. Nothing reads a host value after launch, so a
round captures in one CUDA graph.

Forward takes each token's q, k, v, `exp(g)` and beta from native's `verify_token` (and the log gate
it records from the same gate helper on the same loads), so records hold the bits native steps with.
Folds replay the raw records through `delta_step` (kernels/ssm/step.py) in fp32 with the `step`
config's block shape and fp fusion off, `exp` of the stored fp32 log gate, and round once
(`round_to`): with an fp32 state a fold equals native's per-token state bit for bit.
Forward never writes the checkpoint: with `G_t = sum_{i <= t} g_i` since the checkpoint it keeps the
decayed keys `e^{G_t - G_j} * k_j` of every record in registers, multiplying them forward by each new
`exp(g)` (never dividing), and computes `sk_t`, `d_t = beta_t (v_t - sk_t)` and `o_t` of SPEC §3;
`d_t` and `k_t` are rounded to the history dtype before any later use, as the records will hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import Config
from kernels.ssm.native import (
    check_verify_inputs,
    head_gate_params,
    step_launch_options,
    verify_token,
    zero_padding_rows,
)
from kernels.ssm.step import ENABLE_FP_FUSION, delta_step, gdn_log_gate, kda_log_gate, l2norm, round_to

# The forward kernel's own config class (its arithmetic is not part of a bitwise contract). Folds use
# the shared `step` class of kernels/ssm/configs.py.
REPLAY_FORWARD = "replay-forward"
DEFAULT_FORWARD_CONFIG = {"BV": 32, "num_warps": 4, "num_stages": 1}
PREPARE_BLOCK = 128
FOLD_VARIANTS = ("auto", "split", "fused")


@dataclass(frozen=True)
class ReplayPool:
    """The replay pool tensors (shapes in the module docstring), every one contiguous."""

    ssm: torch.Tensor
    hist_k: torch.Tensor
    hist_d: torch.Tensor
    hist_g: torch.Tensor
    raw_k: torch.Tensor
    raw_v: torch.Tensor
    raw_beta: torch.Tensor
    cursor: torch.Tensor

    def __post_init__(self) -> None:
        L, cap, HV, K, V = self.ssm.shape
        H, P = self.hist_k.shape[2], self.hist_k.shape[3]
        gate = (L, cap, HV, P, K) if self.hist_g.dim() == 5 else (L, cap, HV, P)
        want = {"hist_k": (L, cap, H, P, K), "hist_d": (L, cap, HV, P, V), "hist_g": gate, "raw_k": (L, cap, H, P, K),
                "raw_v": (L, cap, HV, P, V), "raw_beta": (L, cap, HV, P), "cursor": (cap,)}
        for name, shape in want.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"replay {name} has shape {tuple(getattr(self, name).shape)}, expected {shape} "
                                 f"for ssm {tuple(self.ssm.shape)}")
        for name in ("ssm", *want):
            if not getattr(self, name).is_contiguous():
                raise ValueError(f"replay pool tensor {name} must be contiguous")
        if P < 8 or P & (P - 1):
            raise ValueError(f"replay ring of {P} positions: 2 * Lh with Lh a power of two >= 4")
        if self.hist_g.dtype != torch.float32 or self.raw_beta.dtype != torch.float32 or self.cursor.dtype != torch.int32:
            raise ValueError(f"hist_g / raw_beta must be float32 and cursor int32, got {self.hist_g.dtype} / "
                             f"{self.raw_beta.dtype} / {self.cursor.dtype}")

    @property
    def dims(self) -> tuple[int, int, int, int, int, int, int]:
        """`(L, slots, H, HV, K, V, P)`."""
        L, cap, HV, K, V = self.ssm.shape
        return L, cap, self.hist_k.shape[2], HV, K, V, self.hist_k.shape[3]

    @property
    def is_kda(self) -> bool:
        return self.hist_g.dim() == 5


# ---------------------------------------------------------------------------------------------- jit


@triton.jit
def _fold_block(ssm, raw_k, raw_v, raw_beta, hist_g, row, i_hv, old_cursor, o_k, m_k, o_v, m_v,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                P: tl.constexpr, IS_KDA: tl.constexpr):
    """The checkpoint block `[BK, BV]` of pool row `row` (int64, `layer * slots + slot`) and value head
    `i_hv` with the raw records counted by `old_cursor` replayed, rounded once to the state dtype.

    Each record's step inputs are built exactly as native verify builds them from the conv output:
    `l2norm` of raw k in fp32, raw v in fp32, `exp` of the fp32 log gate, fp32 beta.
    """
    count = old_cursor % P
    base = (old_cursor // P) * (P // 2)
    i_h = i_hv // (HV // H)
    GW: tl.constexpr = K if IS_KDA else 1
    p_h = ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(p_h, mask=m_k[:, None] & m_v[None, :], other=0.0).to(tl.float32)
    p_k = raw_k + (row * H + i_h) * P * K
    p_v = raw_v + (row * HV + i_hv) * P * V
    p_beta = raw_beta + (row * HV + i_hv) * P
    p_g = hist_g + (row * HV + i_hv) * P * GW
    for j in range(count):
        pos = base + j
        b_k = l2norm(tl.load(p_k + pos * K + o_k, mask=m_k, other=0.0).to(tl.float32))
        b_v = tl.load(p_v + pos * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        if IS_KDA:  # a [BK, 1] column over the state rows
            b_decay = tl.exp(tl.load(p_g + pos * K + o_k, mask=m_k, other=0.0))[:, None]
        else:
            b_decay = tl.exp(tl.load(p_g + pos))
        b_h = delta_step(b_h, b_k, b_v, b_decay, tl.load(p_beta + pos))
    return round_to(b_h, ssm.dtype.element_ty)


@triton.jit
def replay_prepare_kernel(cursor, slots, widths, fold_from, n, P: tl.constexpr, BN: tl.constexpr):
    """Per batch row: fold iff `count + width > Lh`; `fold_from[r]` = the old cursor or -1; a folding
    row's cursor moves to the other half of the ring with count 0."""
    o_r = tl.program_id(0) * BN + tl.arange(0, BN)
    m_r = o_r < n
    slot = tl.load(slots + o_r, mask=m_r, other=0)
    width = tl.load(widths + o_r, mask=m_r, other=0)
    cur = tl.load(cursor + slot, mask=m_r, other=0)
    fold = (cur % P) + width > P // 2
    tl.store(fold_from + o_r, tl.where(fold, cur, -1), mask=m_r)
    tl.store(cursor + slot, (1 - cur // P) * P, mask=m_r & fold)


@triton.jit
def replay_fold_kernel(ssm, raw_k, raw_v, raw_beta, hist_g, slots, fold_from, dst, dst_index,
                       dst_stride_req, dst_stride_layer, cap,
                       H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr,
                       IS_KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Grid `(cdiv(V, BV), n, L * HV)`: fold one `[K, BV]` block of one layer and head of a row with
    `fold_from[r] >= 0` and store it at `dst + dst_index[r] * dst_stride_req + layer * dst_stride_layer`."""
    i_v, i_n, i_lh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    old_cursor = tl.load(fold_from + i_n)
    if old_cursor < 0:
        return
    i_l, i_hv = i_lh // HV, i_lh % HV
    slot = tl.load(slots + i_n).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    b_h = _fold_block(ssm, raw_k, raw_v, raw_beta, hist_g, i_l * cap + slot, i_hv, old_cursor,
                      o_k, m_k, o_v, m_v, H, HV, K, V, P, IS_KDA)
    p_dst = (dst + tl.load(dst_index + i_n).to(tl.int64) * dst_stride_req + i_l.to(tl.int64) * dst_stride_layer
             + i_hv * K * V + o_k[:, None] * V + o_v[None, :])
    tl.store(p_dst, b_h, mask=m_k[:, None] & m_v[None, :])


@triton.jit
def replay_forward_kernel(qkv, a, b, A_log, dt_bias, out,
                          ssm, hist_k, hist_d, hist_g, raw_k, raw_v, raw_beta, cursor,
                          slots, widths, cu_seqlens, fold_from, layer, cap, n, scale, lower_bound,
                          L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          W: tl.constexpr, P: tl.constexpr, IS_KDA: tl.constexpr, FUSED_FOLD: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr):
    """Grid `(cdiv(V, BV), n, HV)`: outputs and records of one layer for one row, value head, V block.

    The checkpoint is only read, except by a fused fold, which first folds every layer of its own
    (row, head, V block). History records `0 .. count - 1` and the round's tokens share the registers
    `b_kd [Lh, BK]` (decayed keys `e^{G_now - G_j} k_j`) and `b_dd [Lh, BV]` (`d_j`); prepare made
    `count + width <= Lh`.
    """
    i_v, i_n, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    LH: tl.constexpr = P // 2
    GW: tl.constexpr = K if IS_KDA else 1
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_j = tl.arange(0, LH)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    row = layer * cap + slot  # int64 through slot

    b_s0 = tl.load(ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.0)
    b_s0 = b_s0.to(tl.float32)
    if FUSED_FOLD:
        old_cursor = tl.load(fold_from + i_n)
        if old_cursor >= 0:
            for i_l in range(L):
                row_l = i_l * cap + slot
                b_h = _fold_block(ssm, raw_k, raw_v, raw_beta, hist_g, row_l, i_hv, old_cursor,
                                  o_k, m_k, o_v, m_v, H, HV, K, V, P, IS_KDA)
                tl.store(ssm + (row_l * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], b_h, mask=m_h)
                b_s0 = tl.where(i_l == layer, b_h.to(tl.float32), b_s0)

    cur = tl.load(cursor + slot)
    count = cur % P
    base = (cur // P) * LH
    p_hk = hist_k + (row * H + i_h) * P * K
    p_hd = hist_d + (row * HV + i_hv) * P * V
    p_hg = hist_g + (row * HV + i_hv) * P * GW
    m_j = o_j < count
    b_kd = tl.load(p_hk + (base + o_j)[:, None] * K + o_k[None, :], mask=m_j[:, None] & m_k[None, :], other=0.0)
    b_kd = b_kd.to(tl.float32)
    b_dd = tl.load(p_hd + (base + o_j)[:, None] * V + o_v[None, :], mask=m_j[:, None] & m_v[None, :], other=0.0)
    b_dd = b_dd.to(tl.float32)
    b_eg = tl.full([BK], 1.0, dtype=tl.float32)  # e^{G_now}
    for j in range(count):
        # record j's decay reaches the records before it, and the checkpoint
        if IS_KDA:
            b_dec = tl.exp(tl.load(p_hg + (base + j) * K + o_k, mask=m_k, other=0.0))
            b_kd = tl.where((o_j < j)[:, None], b_kd * b_dec[None, :], b_kd)
        else:
            b_dec = tl.exp(tl.load(p_hg + base + j))
            b_kd = tl.where((o_j < j)[:, None], b_kd * b_dec, b_kd)
        b_eg = b_eg * b_dec

    # key-head records come from the first value head of each group; per-head scalars from V block 0
    w_k = m_k & (i_v == 0) & (i_hv % (HV // H) == 0)
    b_A_log, b_bias = head_gate_params(A_log, dt_bias, i_hv, o_k, m_k, K, IS_KDA)
    for t in range(0, w):
        tok = bos + t
        b_q, b_k_raw, b_v_raw, b_dec, b_beta = verify_token(
            qkv, a, b, b_A_log, b_bias, tok, i_h, i_hv, o_k, m_k, o_v, m_v, scale, lower_bound, H, HV, K, V, IS_KDA)
        b_k = l2norm(b_k_raw.to(tl.float32))
        if IS_KDA:
            b_kd = b_kd * b_dec[None, :]
        else:
            b_kd = b_kd * b_dec
        b_eg = b_eg * b_dec

        b_sk = tl.sum(b_s0 * (b_eg * b_k)[:, None], 0) + tl.sum(tl.sum(b_kd * b_k[None, :], 1)[:, None] * b_dd, 0)
        b_d = round_to(b_beta * (b_v_raw.to(tl.float32) - b_sk), hist_d.dtype.element_ty)
        b_kh = round_to(b_k, hist_k.dtype.element_ty)
        here = (o_j == count + t)[:, None]
        b_kd = tl.where(here, b_kh.to(tl.float32)[None, :], b_kd)
        b_dd = tl.where(here, b_d.to(tl.float32)[None, :], b_dd)
        b_o = tl.sum(b_s0 * (b_eg * b_q)[:, None], 0) + tl.sum(tl.sum(b_kd * b_q[None, :], 1)[:, None] * b_dd, 0)
        tl.store(out + (tok * HV + i_hv) * V + o_v, b_o, mask=m_v)

        pos = base + count + t
        tl.store(p_hd + pos * V + o_v, b_d, mask=m_v)
        tl.store(raw_v + (row * HV + i_hv) * P * V + pos * V + o_v, b_v_raw, mask=m_v)
        tl.store(p_hk + pos * K + o_k, b_kh, mask=w_k)
        tl.store(raw_k + (row * H + i_h) * P * K + pos * K + o_k, b_k_raw, mask=w_k)
        if i_v == 0:
            # verify_token hands out exp(g); the record keeps g, from the same gate helper on the same loads
            if IS_KDA:
                b_a = tl.load(a + (tok * HV + i_hv) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
                tl.store(p_hg + pos * K + o_k, kda_log_gate(b_a, b_A_log, b_bias, lower_bound), mask=m_k)
            else:
                b_a = tl.load(a + tok * HV + i_hv).to(tl.float32)
                tl.store(p_hg + pos, gdn_log_gate(b_a, b_A_log, b_bias))
            tl.store(raw_beta + (row * HV + i_hv) * P + pos, b_beta)
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)


# ---------------------------------------------------------------------------------------- launchers


def check_forward_config(config: Config) -> Config:
    """A copy of a `replay-forward` config after checking its axes (BV a power of two)."""
    if set(config) != {"BV", "num_warps", "num_stages"}:
        raise ValueError(f"{REPLAY_FORWARD} config {config} must set exactly ['BV', 'num_stages', 'num_warps']")
    BV, warps, stages = (int(config[k]) for k in ("BV", "num_warps", "num_stages"))
    if BV < 1 or BV & (BV - 1) or warps < 1 or warps & (warps - 1) or stages < 1:
        raise ValueError(f"{REPLAY_FORWARD} config {config}: BV and num_warps must be powers of two, num_stages >= 1")
    return dict(config)


def choose_fold_variant(variant: str) -> str:
    """Where a round's folds run: `split` (a fold kernel before the first layer, every layer, head and
    V block in parallel) or `fused` (the round's first forward launch folds all layers of its own head
    and V block, one after another, before its forward).

    `auto` is split. Measured on an H200 (Qwen3-Next GDN heads, 12 layers, W = 4, Lh = 8, default
    configs, CUDA-graph rounds of batch 1 to 256): split was as fast or faster whenever a quarter or
    more of the rows folded (256 rows: 12.6 vs 13.2 ms a round with a quarter folding, 16.7 vs
    19.3 ms with all), since fused serializes L folds inside one program of the first launch; fused
    only saved the empty fold launch of rounds where nothing folds (11.0 vs 11.3 ms).
    """
    if variant not in FOLD_VARIANTS:
        raise ValueError(f"unknown fold variant {variant!r}; choose one of {', '.join(FOLD_VARIANTS)}")
    return "split" if variant == "auto" else variant


def replay_prepare(pool: ReplayPool, slots: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """Decide the round's folds on the device and flip the cursors of the rows that fold.

    Args:
        pool: the replay pool (`cursor` is updated in place).
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32           # tokens each row verifies this round (0 = idle)

    Returns:
        fold_from `[n]` int32: the cursor before the flip for rows that must fold, -1 otherwise.
    """
    n = slots.shape[0]
    if widths.shape != (n,):
        raise ValueError(f"widths has shape {tuple(widths.shape)}, expected ({n},)")
    fold_from = torch.empty(n, dtype=torch.int32, device=slots.device)
    if n:
        replay_prepare_kernel[(triton.cdiv(n, PREPARE_BLOCK),)](
            pool.cursor, slots, widths, fold_from, n, P=pool.hist_k.shape[3], BN=PREPARE_BLOCK,
        )
    return fold_from


def replay_fold(
    pool: ReplayPool,
    slots: torch.Tensor,
    fold_from: torch.Tensor,
    config: Config,
    dst: torch.Tensor | None = None,
) -> None:
    """Replay the raw records of every layer into the checkpoint (or a copy of it), rounding once.

    Args:
        pool: the replay pool; only read unless `dst` is None.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        fold_from: `[n]` int32        # batch row -> cursor whose records to fold; -1 leaves the row alone
        config: the `step` config (`BV`, `num_warps`, `num_stages`) of native verify, so the fold
            equals native's state bit for bit.
        dst: None to write the checkpoint `pool.ssm` in place (materialize, the split fold), or a
            contiguous `[n, L, HV, K, V]` in the state dtype to receive the folded states (snapshot).
    """
    L, cap, H, HV, K, V, P = pool.dims
    n = slots.shape[0]
    if fold_from.shape != (n,):
        raise ValueError(f"fold_from has shape {tuple(fold_from.shape)}, expected ({n},)")
    if dst is None:
        dst, dst_index, stride_req, stride_layer = pool.ssm, slots, pool.ssm.stride(1), pool.ssm.stride(0)
    else:
        if tuple(dst.shape) != (n, L, HV, K, V) or dst.dtype != pool.ssm.dtype or not dst.is_contiguous():
            raise ValueError(f"fold destination {tuple(dst.shape)} {dst.dtype} must be a contiguous "
                             f"{(n, L, HV, K, V)} {pool.ssm.dtype}")
        dst_index = torch.arange(n, device=slots.device)
        stride_req, stride_layer = dst.stride(0), dst.stride(1)
    BV, opts = step_launch_options(config, V)
    if n:
        replay_fold_kernel[(triton.cdiv(V, BV), n, L * HV)](
            pool.ssm, pool.raw_k, pool.raw_v, pool.raw_beta, pool.hist_g, slots, fold_from, dst, dst_index,
            stride_req, stride_layer, cap,
            H=H, HV=HV, K=K, V=V, P=P, IS_KDA=pool.is_kda, BK=triton.next_power_of_2(K), BV=BV, **opts,
        )


def replay_forward(
    pool: ReplayPool,
    layer: int,
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    slots: torch.Tensor,
    widths: torch.Tensor,
    cu_seqlens: torch.Tensor,
    config: Config,
    lower_bound: float = -5.0,
    fold_from: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer of a replay round: outputs from checkpoint + history, records appended, state unwritten.

    Args:
        pool: the replay pool; records of `layer` go to ring positions `base + count + t` (from the
            cursor); with `fold_from` the checkpoints of every layer are folded first.
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * W`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (must match the pool's family).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32           # tokens of each row (0 = idle)
        cu_seqlens: `[n + 1]` int32   # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: the `replay-forward` config (`BV`, `num_warps`, `num_stages`); with `fold_from`, the
            `step` config, since the fold in this launch must run native's block shape.
        lower_bound: KDA gate bound.
        fold_from: `[n]` int32 from `replay_prepare` to fold in this launch (the fused variant), or None.
        out: optional `[T, HV, V]` float32 buffer.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, P = pool.dims
    n = slots.shape[0]
    if not 0 <= layer < L:
        raise ValueError(f"layer {layer} outside [0, {L})")
    if n == 0 or qkv.shape[0] % n:
        raise ValueError(f"{qkv.shape[0]} packed rows do not make a round of {n} requests")
    W = qkv.shape[0] // n
    if W > P // 2:
        raise ValueError(f"round width {W} exceeds the history length {P // 2}")
    is_kda, out = check_verify_inputs(qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, H, HV, K, V, W, out)
    if is_kda != pool.is_kda:
        raise ValueError(f"gate input of rank {a.dim()} does not match the pool's hist_g {tuple(pool.hist_g.shape)}")
    if fold_from is None:
        config = check_forward_config(config)
        BV = min(config["BV"], triton.next_power_of_2(V))
        opts = {"num_warps": config["num_warps"], "num_stages": config["num_stages"], "enable_fp_fusion": ENABLE_FP_FUSION}
    else:
        if fold_from.shape != (n,):
            raise ValueError(f"fold_from has shape {tuple(fold_from.shape)}, expected ({n},)")
        BV, opts = step_launch_options(config, V)
    replay_forward_kernel[(triton.cdiv(V, BV), n, HV)](
        qkv, a, b, A_log, dt_bias, out,
        pool.ssm, pool.hist_k, pool.hist_d, pool.hist_g, pool.raw_k, pool.raw_v, pool.raw_beta, pool.cursor,
        slots, widths, cu_seqlens, slots if fold_from is None else fold_from, layer, cap, n, K**-0.5, lower_bound,
        L=L, H=H, HV=HV, K=K, V=V, W=W, P=P, IS_KDA=is_kda, FUSED_FOLD=fold_from is not None,
        BK=triton.next_power_of_2(K), BV=BV, **opts,
    )
    return out
