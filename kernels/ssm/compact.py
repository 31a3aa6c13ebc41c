"""Compact mode: verify reads the state and records the round; the accepted records are replayed later.

Storage (one pool for the `L` layers of a rank; `W = S + 1`; `P = W` positions for the `accept`
variant, `P = 2W` in two halves for `deferred`; round token `t` lives at position `half * W + t`):

    ssm        [L, slots, HV, K, V]       state dtype   the committed state
    rec_k      [L, slots, H, P, K]        act dtype     raw k (conv output)
    rec_v      [L, slots, HV, P, V]       act dtype     raw v
    rec_decay  [L, slots, HV, P(, K)]     fp32          exp(g), `[..., P]` GDN, `[..., P, K]` KDA
    rec_beta   [L, slots, HV, P]          fp32          sigmoid(b)
    pending    [slots]                    int32         deferred: last accepted token of the pending round, -1 none
    parity     [slots]                    int32         deferred: the half holding the pending round

Verify is native's token loop (same `load_token`, `prepare_token`, `delta_step`, rounding after
every token) minus the state stores, plus the records. The `accept` variant commits with one launch
for every layer and request that replays records `0 .. accepted[r]` and writes each state once. The
`deferred` variant's verify first replays the pending records of its layer onto the state block it
loaded (`replay_records`), stores the state once, then verifies the new tokens from the same
registers, writing their records into the other half. Every kernel runs with fp fusion off and the
step's fixed-order reductions, so committed states and outputs equal native's bit for bit whatever
config each kernel runs with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import COMPACT_COMMIT, COMPACT_VERIFY, DEFERRED_VERIFY, Config
from kernels.ssm.native import check_verify_inputs, head_gate_params, step_launch_options, zero_padding_rows
from kernels.ssm.step import decay_column, delta_step, l2norm, load_token, prepare_token, round_to, step_output


@dataclass(frozen=True)
class CompactPool:
    """The compact pool tensors (shapes in the module docstring), every one contiguous; `pending` and
    `parity` are given for the deferred variant only."""

    ssm: torch.Tensor
    rec_k: torch.Tensor
    rec_v: torch.Tensor
    rec_decay: torch.Tensor
    rec_beta: torch.Tensor
    pending: torch.Tensor | None = None
    parity: torch.Tensor | None = None

    def __post_init__(self) -> None:
        L, cap, HV, K, V = self.ssm.shape
        H, P = self.rec_k.shape[2], self.rec_k.shape[3]
        gate = (L, cap, HV, P, K) if self.rec_decay.dim() == 5 else (L, cap, HV, P)
        want = {"rec_k": (L, cap, H, P, K), "rec_v": (L, cap, HV, P, V), "rec_decay": gate, "rec_beta": (L, cap, HV, P)}
        if (self.pending is None) != (self.parity is None):
            raise ValueError("the deferred variant needs both pending and parity")
        if self.deferred:
            if P % 2:
                raise ValueError(f"deferred records hold two halves of W positions, got {P} positions")
            want.update(pending=(cap,), parity=(cap,))
        for name, shape in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ValueError(f"compact {name} has shape {tuple(t.shape)}, expected {shape} "
                                 f"for ssm {tuple(self.ssm.shape)}")
        for name in ("ssm", *want):
            if not getattr(self, name).is_contiguous():
                raise ValueError(f"compact pool tensor {name} must be contiguous")
        if self.rec_decay.dtype != torch.float32 or self.rec_beta.dtype != torch.float32:
            raise ValueError(f"rec_decay / rec_beta must be float32, got {self.rec_decay.dtype} / "
                             f"{self.rec_beta.dtype}")
        if self.deferred and (self.pending.dtype != torch.int32 or self.parity.dtype != torch.int32):
            raise ValueError("pending / parity must be int32")

    @property
    def deferred(self) -> bool:
        return self.pending is not None

    @property
    def dims(self) -> tuple[int, int, int, int, int, int, int]:
        """`(L, slots, H, HV, K, V, W)`."""
        L, cap, HV, K, V = self.ssm.shape
        P = self.rec_k.shape[3]
        return L, cap, self.rec_k.shape[2], HV, K, V, P // 2 if self.deferred else P

    @property
    def is_kda(self) -> bool:
        return self.rec_decay.dim() == 5


# ---------------------------------------------------------------------------------------------- jit


@triton.jit
def replay_records(b_h, rec_k, rec_v, rec_decay, rec_beta, row, i_h, i_hv, base, last, o_k, m_k, o_v, m_v,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                   P: tl.constexpr, IS_KDA: tl.constexpr, STATE_DTYPE: tl.constexpr):
    """`b_h` (fp32 `[BK, BV]`) advanced through record positions `base + 0 .. base + last` of pool row
    `row` (int64) and value head `i_hv`, rounding to the state dtype after every token as native does;
    `last = -1` leaves it unchanged. Each record's step inputs are built exactly as verify built them:
    `l2norm` of raw k in fp32, raw v in fp32, the stored `exp(g)` and beta. The loop runs `last + 1`
    times (a row's accepted tokens, not W: geometric acceptance keeps about 2.7 of 4), loading record
    t + 1 before stepping through record t."""
    GW: tl.constexpr = K if IS_KDA else 1
    p_rk = rec_k + (row * H + i_h) * P * K
    p_rh = (row * HV + i_hv) * P  # (row, head) of rec_v / rec_decay / rec_beta, in records
    n_k, n_v, n_d, n_b = _load_record(p_rk, rec_v, rec_decay, rec_beta, p_rh, base, 0 <= last, o_k, m_k, o_v, m_v,
                                      K, V, GW, IS_KDA)
    for t in range(0, last + 1):
        c_k, c_v, c_d, c_b = n_k, n_v, n_d, n_b
        n_k, n_v, n_d, n_b = _load_record(p_rk, rec_v, rec_decay, rec_beta, p_rh, base + t + 1, t + 1 <= last,
                                          o_k, m_k, o_v, m_v, K, V, GW, IS_KDA)
        b_h = round_to(delta_step(b_h, l2norm(c_k.to(tl.float32)), c_v.to(tl.float32), decay_column(c_d, IS_KDA),
                                  c_b), STATE_DTYPE).to(tl.float32)
    return b_h


@triton.jit
def _load_record(p_rk, rec_v, rec_decay, rec_beta, p_rh, pos, valid, o_k, m_k, o_v, m_v,
                 K: tl.constexpr, V: tl.constexpr, GW: tl.constexpr, IS_KDA: tl.constexpr):
    """Raw k `[BK]`, raw v `[BV]`, `exp(g)` (`[BK]` or scalar) and beta of record position `pos`."""
    b_k = tl.load(p_rk + pos * K + o_k, mask=m_k & valid, other=0.0)
    b_v = tl.load(rec_v + (p_rh + pos) * V + o_v, mask=m_v & valid, other=0.0)
    if IS_KDA:
        b_d = tl.load(rec_decay + (p_rh + pos) * GW + o_k, mask=m_k & valid, other=0.0)
    else:
        b_d = tl.load(rec_decay + p_rh + pos, mask=valid, other=0.0)
    b_b = tl.load(rec_beta + p_rh + pos, mask=valid, other=0.0)
    return b_k, b_v, b_d, b_b


@triton.jit(do_not_specialize=["layer", "cap", "n"])
def compact_verify_kernel(qkv, a, b, A_log, dt_bias, out, ssm, rec_k, rec_v, rec_decay, rec_beta, pending, parity,
                          slots, widths, cu_seqlens, layer, cap, n, scale, lower_bound,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                          IS_KDA: tl.constexpr, DEFERRED: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
    P: tl.constexpr = 2 * W if DEFERRED else W
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    GW: tl.constexpr = K if IS_KDA else 1
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    row = layer * cap + slot  # int64 through slot
    p_h = ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    x_q, x_k, x_v, x_a, x_b = load_token(qkv, a, b, bos, w > 0, i_h, i_hv, o_k, m_k, o_v, m_v, H, HV, K, V, IS_KDA)
    b_h = tl.load(p_h, mask=m_h & (w > 0), other=0.0).to(tl.float32)
    if DEFERRED:
        # the pending round's accepted records first (an idle row keeps its pending round for later)
        half = tl.load(parity + slot, mask=w > 0, other=0)
        last = tl.load(pending + slot, mask=w > 0, other=-1)
        b_h = replay_records(b_h, rec_k, rec_v, rec_decay, rec_beta, row, i_h, i_hv, half * W, last,
                             o_k, m_k, o_v, m_v, H, HV, K, V, W, P, IS_KDA, ssm.dtype.element_ty)
        tl.store(p_h, b_h.to(ssm.dtype.element_ty), mask=m_h & (last >= 0))
        base = (1 - half) * W
    else:
        base = 0
    # key-head records come from the first value head of each group; per-head scalars from V block 0
    w_k = m_k & (i_v == 0) & (i_hv % (HV // H) == 0)
    p_rk = rec_k + (row * H + i_h) * P * K + base * K
    p_rh = (row * HV + i_hv) * P + base  # (row, head, first position of this round) of the other records
    b_A_log, b_bias = head_gate_params(A_log, dt_bias, i_hv, o_k, m_k, K, IS_KDA)
    for t in tl.static_range(W):
        c_q, c_k, c_v, c_a, c_b = x_q, x_k, x_v, x_a, x_b
        if t + 1 < W:
            x_q, x_k, x_v, x_a, x_b = load_token(qkv, a, b, bos + t + 1, t + 1 < w, i_h, i_hv, o_k, m_k, o_v, m_v,
                                                 H, HV, K, V, IS_KDA)
        b_q, b_k, b_v, b_g, b_beta = prepare_token(c_q, c_k, c_v, c_a, c_b, b_A_log, b_bias, scale, lower_bound,
                                                   IS_KDA)
        b_e = tl.exp(b_g)  # exp(g): what the record keeps and the step scales by
        valid = t < w
        tl.store(p_rk + t * K + o_k, c_k, mask=w_k & valid)
        tl.store(rec_v + (p_rh + t) * V + o_v, c_v, mask=m_v & valid)
        if IS_KDA:
            tl.store(rec_decay + (p_rh + t) * GW + o_k, b_e, mask=m_k & (i_v == 0) & valid)
            b_e = b_e[:, None]
        else:
            tl.store(rec_decay + p_rh + t, b_e, mask=(i_v == 0) & valid)
        tl.store(rec_beta + p_rh + t, b_beta, mask=(i_v == 0) & valid)
        b_h = delta_step(b_h, b_k, b_v, b_e, b_beta)
        tl.store(out + ((bos + t) * HV + i_hv) * V + o_v, step_output(b_h, b_q), mask=m_v & valid)
        b_h = round_to(b_h, ssm.dtype.element_ty).to(tl.float32)
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)


@triton.jit(do_not_specialize=["cap", "dst_stride_req", "dst_stride_layer"])
def compact_commit_kernel(ssm, rec_k, rec_v, rec_decay, rec_beta, slots, last_token, parity, dst, cap,
                          dst_stride_req, dst_stride_layer,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                          IS_KDA: tl.constexpr, DEFERRED: tl.constexpr, TO_DST: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr):
    """Grid `(cdiv(V, BV) * n * HV, L)`. In place (`TO_DST` off): rows with `last_token[r] >= 0` get
    their records replayed and the state written once; -1 rows are not touched. Into `dst` (a
    snapshot): every row's committed state is written to `dst[r, layer]`, the pool only read."""
    pid, i_l = tl.program_id(0), tl.program_id(1)
    NV: tl.constexpr = tl.cdiv(V, BV)
    P: tl.constexpr = 2 * W if DEFERRED else W
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    slot = tl.load(slots + i_n).to(tl.int64)
    last = tl.load(last_token + i_n)  # -1: no token to replay
    if DEFERRED:
        half = tl.load(parity + slot)
    else:
        half = 0

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    row = i_l * cap + slot  # int64 through slot
    o_h = o_k[:, None] * V + o_v[None, :]
    m_load = m_h if TO_DST else m_h & (last >= 0)
    b_h = tl.load(ssm + (row * HV + i_hv) * K * V + o_h, mask=m_load, other=0.0).to(tl.float32)
    b_h = replay_records(b_h, rec_k, rec_v, rec_decay, rec_beta, row, i_h, i_hv, half * W, last,
                         o_k, m_k, o_v, m_v, H, HV, K, V, W, P, IS_KDA, ssm.dtype.element_ty)
    if TO_DST:
        p_dst = dst + i_n.to(tl.int64) * dst_stride_req + i_l.to(tl.int64) * dst_stride_layer + i_hv * K * V + o_h
        tl.store(p_dst, b_h.to(ssm.dtype.element_ty), mask=m_h)
    else:
        tl.store(ssm + (row * HV + i_hv) * K * V + o_h, b_h.to(ssm.dtype.element_ty), mask=m_load)


# ---------------------------------------------------------------------------------------- launchers


def check_compact_round(pool: CompactPool, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                        A_log: torch.Tensor, dt_bias: torch.Tensor, slots: torch.Tensor, widths: torch.Tensor,
                        cu_seqlens: torch.Tensor, out: torch.Tensor | None
                        ) -> tuple[bool, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """A verify launch's arguments checked against the pool (both verify kernels): `(is_kda, out,
    (pending, parity))`, the bookkeeping a deferred pool's kernel reads (any int tensors otherwise: unread)."""
    L, cap, H, HV, K, V, W = pool.dims
    if not 0 <= layer < L:
        raise ValueError(f"layer {layer} outside [0, {L})")
    is_kda, out = check_verify_inputs(qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, H, HV, K, V, W, out)
    if is_kda != pool.is_kda:
        raise ValueError(f"gate input of rank {a.dim()} does not match the pool's rec_decay "
                         f"{tuple(pool.rec_decay.shape)}")
    return is_kda, out, (pool.pending, pool.parity) if pool.deferred else (slots, slots)


def compact_verify(
    pool: CompactPool,
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
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer of a compact verify round: outputs and records `0 .. w - 1` of each row. The accept
    variant only reads the state; deferred first commits the layer's pending records (one state write).

    Args:
        pool: the compact pool; records of `layer` are written for the round's valid tokens.
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * W`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (must match the pool's family).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        slots: `[n]` int64                     # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32, tokens of each row (0 = idle: its pending records wait).
        cu_seqlens: `[n + 1]` int32            # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: the `compact-verify` config (`deferred-verify` for a deferred pool).
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, W = pool.dims
    is_kda, out, bookkeeping = check_compact_round(pool, layer, qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens,
                                                   out)
    BV, opts = step_launch_options(DEFERRED_VERIFY if pool.deferred else COMPACT_VERIFY, config, V)
    n = slots.shape[0]
    compact_verify_kernel[(triton.cdiv(V, BV) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out, pool.ssm, pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta,
        *bookkeeping, slots, widths, cu_seqlens, layer, cap, n, K**-0.5, lower_bound,
        H=H, HV=HV, K=K, V=V, W=W, IS_KDA=is_kda, DEFERRED=pool.deferred, BK=triton.next_power_of_2(K), BV=BV,
        **opts,
    )
    return out


def compact_commit(pool: CompactPool, slots: torch.Tensor, last_token: torch.Tensor, config: Config,
                   dst: torch.Tensor | None = None) -> None:
    """Replay record tokens `0 .. last_token[r]` into the state of every layer, one launch.

    Args:
        pool: the compact pool (`ssm` updated in place for rows with `last_token >= 0`, unless `dst`).
        slots: `[n]` int64                     # slot: [batch row] -> pool row (distinct)
        last_token: `[n]` int32, last kept token of each row; -1 for a row with nothing to replay. The
            accept variant's commit passes the round's `accepted`; a deferred snapshot passes `pending`.
        config: the `compact-commit` config.
        dst: None to commit in place, or a contiguous `[n, L, HV, K, V]` in the state dtype that
            receives every row's committed state (a non-mutating snapshot).
    """
    L, cap, H, HV, K, V, W = pool.dims
    n = slots.shape[0]
    if last_token.shape != (n,):
        raise ValueError(f"last_token has shape {tuple(last_token.shape)}, expected ({n},)")
    if dst is not None and (tuple(dst.shape) != (n, L, HV, K, V) or dst.dtype != pool.ssm.dtype
                            or not dst.is_contiguous()):
        raise ValueError(f"commit destination {tuple(dst.shape)} {dst.dtype} must be a contiguous "
                         f"{(n, L, HV, K, V)} {pool.ssm.dtype}")
    if n == 0:
        return
    BV, opts = step_launch_options(COMPACT_COMMIT, config, V)
    target = pool.ssm if dst is None else dst
    strides = (0, 0) if dst is None else (dst.stride(0), dst.stride(1))
    compact_commit_kernel[(triton.cdiv(V, BV) * n * HV, L)](
        pool.ssm, pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta, slots, last_token,
        pool.parity if pool.deferred else slots, target, cap, *strides,
        H=H, HV=HV, K=K, V=V, W=W, IS_KDA=pool.is_kda, DEFERRED=pool.deferred, TO_DST=dst is not None,
        BK=triton.next_power_of_2(K), BV=BV, **opts,
    )
