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

A round is `replay_prepare` (fold decision on the device, cursor flip), then one `replay_forward`
per layer: a row that must fold first folds that layer's records into the checkpoint block the
forward loads anyway, stores it once and continues from the folded values (no separate launch over
all rows). Nothing reads a host value after launch, so a round captures in one CUDA graph.
`replay_fold` (every layer in one launch) serves snapshots (into a copy) and materialize.

Forward takes each token's q, k, v, log gate g and beta from the helpers native verify uses
(`load_token`, `prepare_token`), so records hold the bits native steps with. Folds replay the raw
records through `delta_step` (kernels/ssm/step.py) in fp32 with fp fusion off, `exp` of the stored fp32 log gate, and round once (`round_to`): with an fp32 state a
fold equals native's per-token state bit for bit. Apart from a fold, forward never writes the
checkpoint: with `G_t = sum_{i <= t} g_i` since the checkpoint it keeps the decayed keys
`e^{G_t - G_j} * k_j` of every record in registers (from one running sum of the history's log gates,
`G_t - G_j <= 0`, then multiplied forward by each new `exp(g)`), and computes `sk_t`,
`d_t = beta_t (v_t - sk_t)` and `o_t` of SPEC §3; `d_t` and `k_t` are rounded to the history dtype
before any later use, as the records will hold them.

The `inline-matrix*` variants run this forward with `MATRIX_FOLD`: a folding row folds in matrix form from
the derived records (kernels/ssm/matrix_fold_block.py, the matrix fold's helper) instead of stepping the
block through the raw ones, so its states are native's within the fp32 contract, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import REPLAY_FOLD, REPLAY_FORWARD, REPLAY_MATRIX_FOLD, Config
from kernels.ssm.matrix_fold_block import fold_block, matrix_fold_supported
from kernels.ssm.matrix_round import matrix_blocks
from kernels.ssm.native import check_verify_inputs, head_gate_params, step_launch_options, zero_padding_rows
from kernels.ssm.step import decay_of, delta_step, l2norm, load_token, prepare_token, project_token, round_to

PREPARE_BLOCK = 128


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
def _load_raw(p_k, p_v, p_beta, p_g, pos, valid, o_k, m_k, o_v, m_v, K: tl.constexpr, V: tl.constexpr,
              IS_KDA: tl.constexpr):
    """Raw k `[BK]`, raw v `[BV]`, log gate (`[BK]` or scalar) and beta of ring position `pos`."""
    b_k = tl.load(p_k + pos * K + o_k, mask=m_k & valid, other=0.0)
    b_v = tl.load(p_v + pos * V + o_v, mask=m_v & valid, other=0.0)
    if IS_KDA:
        b_g = tl.load(p_g + pos * K + o_k, mask=m_k & valid, other=0.0)
    else:
        b_g = tl.load(p_g + pos, mask=valid, other=0.0)
    b_b = tl.load(p_beta + pos, mask=valid, other=0.0)
    return b_k, b_v, b_g, b_b


@triton.jit
def fold_records(b_h, raw_k, raw_v, raw_beta, hist_g, row, i_hv, old_cursor, o_k, m_k, o_v, m_v,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr,
                 IS_KDA: tl.constexpr):
    """The fp32 block `b_h` of pool row `row` (int64) and value head `i_hv` advanced through the raw
    records that `old_cursor` counts, unrounded (the caller rounds once).

    Each record's step inputs are built exactly as native verify builds them from the conv output:
    `l2norm` of raw k in fp32, raw v in fp32, `exp` of the fp32 log gate, fp32 beta. The next record's
    loads are issued before the current record's step.
    """
    count = old_cursor % P
    base = (old_cursor // P) * (P // 2)
    i_h = i_hv // (HV // H)
    GW: tl.constexpr = K if IS_KDA else 1
    p_k = raw_k + (row * H + i_h) * P * K
    p_v = raw_v + (row * HV + i_hv) * P * V
    p_beta = raw_beta + (row * HV + i_hv) * P
    p_g = hist_g + (row * HV + i_hv) * P * GW
    n_k, n_v, n_g, n_b = _load_raw(p_k, p_v, p_beta, p_g, base, 0 < count, o_k, m_k, o_v, m_v, K, V, IS_KDA)
    for j in range(0, count):
        c_k, c_v, c_g, c_b = n_k, n_v, n_g, n_b
        n_k, n_v, n_g, n_b = _load_raw(p_k, p_v, p_beta, p_g, base + j + 1, j + 1 < count, o_k, m_k, o_v, m_v,
                                       K, V, IS_KDA)
        b_h = delta_step(b_h, l2norm(c_k.to(tl.float32)), c_v.to(tl.float32), decay_of(c_g, IS_KDA), c_b)
    return b_h


@triton.jit(do_not_specialize=["n"])
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
def fold_program(i_n, slots, dst, dst_index, dst_stride_req, dst_stride_layer, cap, layer0,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """What a fold launch's program `(V block, batch row i_n, layer * HV + head)` of a folding row works on:
    `(row, i_hv, o_v, p_dst)`, its pool row (`layer * cap + slot`), the value head, the block's V columns and
    the head's `[K, V]` destination block. (The caller returns first where the row does not fold, so those
    programs load nothing more.)"""
    i_v, i_lh = tl.program_id(0), tl.program_id(2)
    i_l, i_hv = layer0 + i_lh // HV, i_lh % HV
    slot = tl.load(slots + i_n).to(tl.int64)
    p_dst = (dst + tl.load(dst_index + i_n).to(tl.int64) * dst_stride_req + i_l.to(tl.int64) * dst_stride_layer
             + i_hv * K * V)
    return i_l * cap + slot, i_hv, i_v * BV + tl.arange(0, BV), p_dst


@triton.jit(do_not_specialize=["dst_stride_req", "dst_stride_layer", "cap", "layer0"])
def replay_fold_kernel(ssm, raw_k, raw_v, raw_beta, hist_g, slots, fold_from, dst, dst_index,
                       dst_stride_req, dst_stride_layer, cap, layer0,
                       H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr,
                       IS_KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Grid `(cdiv(V, BV), n, layers * HV)`: fold one `[K, BV]` block of one layer (`layer0` onwards)
    and head of a row with `fold_from[r] >= 0` and store it, rounded once, at `dst + dst_index[r] *
    dst_stride_req + layer * dst_stride_layer`."""
    i_n = tl.program_id(1)
    old_cursor = tl.load(fold_from + i_n)
    if old_cursor < 0:
        return
    row, i_hv, o_v, p_dst = fold_program(i_n, slots, dst, dst_index, dst_stride_req, dst_stride_layer, cap, layer0,
                                         HV, K, V, BV)
    o_k = tl.arange(0, BK)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    o_h = o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(ssm + (row * HV + i_hv) * K * V + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_h = fold_records(b_h, raw_k, raw_v, raw_beta, hist_g, row, i_hv, old_cursor, o_k, m_k, o_v, m_v,
                       H, HV, K, V, P, IS_KDA)
    tl.store(p_dst + o_h, round_to(b_h, ssm.dtype.element_ty), mask=m_h)


@triton.jit(do_not_specialize=["layer", "cap", "n"])
def replay_forward_kernel(qkv, a, b, A_log, dt_bias, out,
                          ssm, hist_k, hist_d, hist_g, raw_k, raw_v, raw_beta, cursor,
                          slots, widths, cu_seqlens, fold_from, layer, cap, n, scale, lower_bound,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                          P: tl.constexpr, IS_KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          MATRIX_FOLD: tl.constexpr, J: tl.constexpr, KP: tl.constexpr, FBK: tl.constexpr,
                          FBV: tl.constexpr, PREC: tl.constexpr):
    """Grid `(cdiv(V, BV) * n * HV,)`: outputs and records of one layer for one row, value head, V block.

    A row that `replay_prepare` marked (`fold_from[r] >= 0`) first folds its old records into the
    checkpoint block it loaded, stores it once and goes on from the folded values; otherwise the
    checkpoint is only read. History records `0 .. count - 1` and the round's tokens share the
    registers `b_kd [Lh, BK]` (decayed keys `e^{G_now - G_j} k_j`) and `b_dd [Lh, BV]` (`d_j`);
    prepare made `count + width <= Lh`.

    MATRIX_FOLD (the `inline-matrix*` variants) folds in matrix form instead (`fold_block`, the matrix
    fold's helper: `FBK`-row chunks, `J` records, `PREC` products) over `FBV = max(BV, 16)` columns, the
    tensor cores' narrowest, of which those past this program's `BV` are masked off.
    """
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
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

    x_q, x_k, x_v, x_a, x_b = load_token(qkv, a, b, bos, w > 0, i_h, i_hv, o_k, m_k, o_v, m_v, H, HV, K, V, IS_KDA)
    p_s0 = ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    old_cursor = tl.load(fold_from + i_n)
    if MATRIX_FOLD:
        if old_cursor >= 0:
            # Fold first, chunk by chunk, straight from and to the checkpoint: the chunks' registers are dead
            # before the forward's block is live, and the block is read back below from L2. The barrier makes
            # this program's stores visible to all its threads (the fold's dot layout is not the block's).
            o_f = i_v * BV + tl.arange(0, FBV)
            fold_block(ssm, hist_k, hist_d, hist_g, ssm + (row * HV + i_hv) * K * V, row, i_h, i_hv, old_cursor,
                       o_f, (tl.arange(0, FBV) < BV) & (o_f < V), H, HV, K, V, P, J, IS_KDA, KP, FBK, FBV, PREC)
            tl.debug_barrier()
    b_s0 = tl.load(p_s0, mask=m_h & (w > 0), other=0.0).to(tl.float32)
    if not MATRIX_FOLD:
        if old_cursor >= 0:
            b_s0 = fold_records(b_s0, raw_k, raw_v, raw_beta, hist_g, row, i_hv, old_cursor, o_k, m_k, o_v, m_v,
                                H, HV, K, V, P, IS_KDA)
            b_s0 = round_to(b_s0, ssm.dtype.element_ty)
            tl.store(p_s0, b_s0, mask=m_h)
            b_s0 = b_s0.to(tl.float32)

    cur = tl.load(cursor + slot, mask=w > 0, other=0)
    count = cur % P
    base = (cur // P) * LH
    p_hk = hist_k + (row * H + i_h) * P * K
    p_hd = hist_d + (row * HV + i_hv) * P * V
    p_hg = hist_g + (row * HV + i_hv) * P * GW
    m_j = o_j < count
    b_kd = tl.load(p_hk + (base + o_j)[:, None] * K + o_k[None, :], mask=m_j[:, None] & m_k[None, :], other=0.0)
    b_dd = tl.load(p_hd + (base + o_j)[:, None] * V + o_v[None, :], mask=m_j[:, None] & m_v[None, :], other=0.0)
    b_kd, b_dd = b_kd.to(tl.float32), b_dd.to(tl.float32)
    # record j is decayed by the gates of the records after it: G_count - G_j = sum_{i > j} g_i, summed
    # from the next record's gate on (a reverse cumsum of the gates shifted by one), not as a difference
    # of two large running sums
    m_n = (o_j + 1) < count
    if IS_KDA:
        b_hg = tl.load(p_hg + (base + o_j)[:, None] * K + o_k[None, :], mask=m_j[:, None] & m_k[None, :], other=0.0)
        b_hn = tl.load(p_hg + (base + o_j + 1)[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                       other=0.0)
        b_kd = b_kd * tl.exp(tl.cumsum(b_hn, 0, reverse=True))
        b_rel = tl.zeros([LH], dtype=tl.float32)  # unused: KDA keeps its keys decayed
    else:
        b_hg = tl.load(p_hg + base + o_j, mask=m_j, other=0.0)
        b_rel = tl.cumsum(tl.load(p_hg + base + o_j + 1, mask=m_n, other=0.0), 0, reverse=True)
    b_eg = tl.exp(tl.sum(b_hg, 0))  # e^{G_now}: a scalar (GDN) or [BK] (KDA)

    # key-head records come from the first value head of each group; per-head scalars from V block 0
    w_k = m_k & (i_v == 0) & (i_hv % (HV // H) == 0)
    b_A_log, b_bias = head_gate_params(A_log, dt_bias, i_hv, o_k, m_k, K, IS_KDA)
    for t in tl.static_range(W):
        c_q, c_k, c_v, c_a, c_b = x_q, x_k, x_v, x_a, x_b
        if t + 1 < W:
            x_q, x_k, x_v, x_a, x_b = load_token(qkv, a, b, bos + t + 1, t + 1 < w, i_h, i_hv, o_k, m_k, o_v, m_v,
                                                 H, HV, K, V, IS_KDA)
        b_q, b_k, b_v, b_g, b_beta = prepare_token(c_q, c_k, c_v, c_a, c_b, b_A_log, b_bias, scale, lower_bound,
                                                   IS_KDA)
        b_o, b_d, b_kh, b_kd, b_dd, b_rel, b_eg = project_token(b_s0, b_kd, b_dd, b_rel, b_eg, b_q, b_k, b_v, b_g,
                                                                tl.exp(b_g), b_beta, o_j == count + t, IS_KDA,
                                                                hist_d.dtype.element_ty)
        valid = t < w
        tl.store(out + ((bos + t) * HV + i_hv) * V + o_v, b_o, mask=m_v & valid)

        pos = base + count + t
        tl.store(p_hd + pos * V + o_v, b_d, mask=m_v & valid)
        tl.store(raw_v + (row * HV + i_hv) * P * V + pos * V + o_v, c_v, mask=m_v & valid)
        tl.store(p_hk + pos * K + o_k, b_kh, mask=w_k & valid)
        tl.store(raw_k + (row * H + i_h) * P * K + pos * K + o_k, c_k, mask=w_k & valid)
        if IS_KDA:
            tl.store(p_hg + pos * K + o_k, b_g, mask=m_k & (i_v == 0) & valid)
        else:
            tl.store(p_hg + pos, b_g, mask=(i_v == 0) & valid)
        tl.store(raw_beta + (row * HV + i_hv) * P + pos, b_beta, mask=(i_v == 0) & valid)
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)


# ---------------------------------------------------------------------------------------- launchers


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


def fold_destination(pool: ReplayPool, slots: torch.Tensor, fold_from: torch.Tensor, dst: torch.Tensor | None,
                     layer: int | None) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Where a fold writes (`replay_fold`'s and the matrix fold's arguments checked): `(dst, dst_index,
    stride_req, stride_layer)`, the checkpoint itself at the slots when `dst` is None."""
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
    if layer is not None and (dst is not pool.ssm or not 0 <= layer < L):
        raise ValueError(f"a single-layer fold is in place, layer {layer} in [0, {L})")
    return dst, dst_index, stride_req, stride_layer


def replay_fold(
    pool: ReplayPool,
    slots: torch.Tensor,
    fold_from: torch.Tensor,
    config: Config,
    dst: torch.Tensor | None = None,
    layer: int | None = None,
) -> None:
    """Replay the raw records of every layer (or of `layer` only) into the checkpoint (or a copy of
    it), rounding once.

    Args:
        pool: the replay pool; only read unless `dst` is None.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        fold_from: `[n]` int32        # batch row -> cursor whose records to fold; -1 leaves the row alone
        config: the `replay-fold` config (`BV`, `num_warps`, `num_stages`); any config folds to
            native's state bit for bit (the step's reductions have a fixed order).
        dst: None to write the checkpoint `pool.ssm` in place (materialize), or a
            contiguous `[n, L, HV, K, V]` in the state dtype to receive the folded states (snapshot).
        layer: fold this layer only (in place; the precompute forward folds layer by layer).
    """
    L, cap, H, HV, K, V, P = pool.dims
    n = slots.shape[0]
    dst, dst_index, stride_req, stride_layer = fold_destination(pool, slots, fold_from, dst, layer)
    BV, opts = step_launch_options(REPLAY_FOLD, config, V)
    layers = L if layer is None else 1
    if n:
        replay_fold_kernel[(triton.cdiv(V, BV), n, layers * HV)](
            pool.ssm, pool.raw_k, pool.raw_v, pool.raw_beta, pool.hist_g, slots, fold_from, dst, dst_index,
            stride_req, stride_layer, cap, layer or 0,
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
    fold_from: torch.Tensor,
    config: Config,
    lower_bound: float = -5.0,
    out: torch.Tensor | None = None,
    fold_precision: str | None = None,
    fold_config: Config | None = None,
) -> torch.Tensor:
    """One layer of a replay round: outputs from checkpoint + history, records appended; the
    checkpoint is written only by the rows that fold.

    Args:
        pool: the replay pool; records of `layer` go to ring positions `base + count + t` (from the
            cursor, which `replay_prepare` already flipped for folding rows).
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * W`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (must match the pool's family).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32           # tokens of each row (0 = idle)
        cu_seqlens: `[n + 1]` int32   # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        fold_from: `[n]` int32        # batch row -> the cursor whose records this layer folds first, -1 none
        config: the `replay-forward` config (`BV`, `num_warps`, `num_stages`); the fold inside runs with
            it too and still equals native's state bit for bit.
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.
        fold_precision: None folds token by token (native's step: bitwise); a `tl.dot` precision
            (`PRECISIONS`) folds in matrix form from the stored d's instead (the `inline-matrix*` variants:
            kernels/ssm/replay_matrix_fold.py, states within the fp32 contract, not bitwise; fp32 history,
            `matrix_fold_supported`).
        fold_config: with `fold_precision`, the `replay-matrix-fold` config whose `BK` (K chunk of the fold)
            it takes; its `BV` and warps are the forward's own.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, P = pool.dims
    n = slots.shape[0]
    W, is_kda, out = check_replay_round(pool, layer, qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, out)
    if fold_from.shape != (n,):
        raise ValueError(f"fold_from has shape {tuple(fold_from.shape)}, expected ({n},)")
    BV, opts = step_launch_options(REPLAY_FORWARD, config, V)
    fold = {"MATRIX_FOLD": False, "J": 16, "KP": 16, "FBK": 16, "FBV": 16, "PREC": "ieee"}  # unused by the token fold
    if fold_precision is not None:
        why = matrix_fold_supported(K, V, pool.hist_d.dtype)
        if why:
            raise ValueError(why)
        if fold_config is None:
            raise ValueError("a matrix fold inside the forward needs fold_config (a replay-matrix-fold config)")
        m = matrix_blocks(REPLAY_MATRIX_FOLD, fold_config, K, V, fold_precision)
        fold = {"MATRIX_FOLD": True, "J": max(16, P // 2), "KP": m["KP"], "FBK": m["BK"], "FBV": max(16, BV),
                "PREC": m["PREC"]}
    replay_forward_kernel[(triton.cdiv(V, BV) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out,
        pool.ssm, pool.hist_k, pool.hist_d, pool.hist_g, pool.raw_k, pool.raw_v, pool.raw_beta, pool.cursor,
        slots, widths, cu_seqlens, fold_from, layer, cap, n, K**-0.5, lower_bound,
        H=H, HV=HV, K=K, V=V, W=W, P=P, IS_KDA=is_kda, BK=triton.next_power_of_2(K), BV=BV, **fold, **opts,
    )
    return out


def check_replay_round(pool: ReplayPool, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       A_log: torch.Tensor, dt_bias: torch.Tensor, slots: torch.Tensor, widths: torch.Tensor,
                       cu_seqlens: torch.Tensor, out: torch.Tensor | None) -> tuple[int, bool, torch.Tensor]:
    """Validate a replay forward launch (both variants); returns `(W, is_kda, out)`, `out` allocated if None."""
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
    return W, is_kda, out
