"""Compact mode: verify reads the state and records the round; commit replays the accepted records.

Storage (one pool for the `L` layers of a rank; `W = S + 1`):

    ssm        [L, slots, HV, K, V]       state dtype   the accepted state
    rec_k      [L, slots, H, W, K]        act dtype     raw k (conv output) of round token t
    rec_v      [L, slots, HV, W, V]       act dtype     raw v
    rec_decay  [L, slots, HV, W(, K)]     fp32          exp(g), `[..., W]` GDN, `[..., W, K]` KDA
    rec_beta   [L, slots, HV, W]          fp32          sigmoid(b)

Verify is native's token loop (same `verify_token`, `delta_step`, rounding after every token) minus
the state stores, plus the records. Commit is one launch for every layer and request: it replays
records `0 .. accepted[r]` through `delta_step`, rounding after each token, and writes each state
once. Both run with the `step` config class of native verify and fp fusion off, so committed states
and outputs equal native's bit for bit.
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
from kernels.ssm.step import delta_step, l2norm, round_to, step_output


@dataclass(frozen=True)
class CompactPool:
    """The compact pool tensors (shapes in the module docstring), every one contiguous."""

    ssm: torch.Tensor
    rec_k: torch.Tensor
    rec_v: torch.Tensor
    rec_decay: torch.Tensor
    rec_beta: torch.Tensor

    def __post_init__(self) -> None:
        L, cap, HV, K, V = self.ssm.shape
        H, W = self.rec_k.shape[2], self.rec_k.shape[3]
        gate = (L, cap, HV, W, K) if self.rec_decay.dim() == 5 else (L, cap, HV, W)
        want = {"rec_k": (L, cap, H, W, K), "rec_v": (L, cap, HV, W, V), "rec_decay": gate, "rec_beta": (L, cap, HV, W)}
        for name, shape in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ValueError(f"compact {name} has shape {tuple(t.shape)}, expected {shape} "
                                 f"for ssm {tuple(self.ssm.shape)}")
        for name in ("ssm", "rec_k", "rec_v", "rec_decay", "rec_beta"):
            if not getattr(self, name).is_contiguous():
                raise ValueError(f"compact pool tensor {name} must be contiguous")
        if self.rec_decay.dtype != torch.float32 or self.rec_beta.dtype != torch.float32:
            raise ValueError(f"rec_decay / rec_beta must be float32, got {self.rec_decay.dtype} / "
                             f"{self.rec_beta.dtype}")

    @property
    def dims(self) -> tuple[int, int, int, int, int, int, int]:
        """`(L, slots, H, HV, K, V, W)`."""
        L, cap, HV, K, V = self.ssm.shape
        return L, cap, self.rec_k.shape[2], HV, K, V, self.rec_k.shape[3]

    @property
    def is_kda(self) -> bool:
        return self.rec_decay.dim() == 5


@triton.jit
def compact_verify_kernel(qkv, a, b, A_log, dt_bias, out, ssm, rec_k, rec_v, rec_decay, rec_beta,
                          slots, widths, cu_seqlens, layer, cap, n, scale, lower_bound,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                          IS_KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
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
    b_h = tl.load(ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.0)
    b_h = b_h.to(tl.float32)
    # key-head records come from the first value head of each group; per-head scalars from V block 0
    w_k = m_k & (i_v == 0) & (i_hv % (HV // H) == 0)
    p_rk = rec_k + (row * H + i_h) * W * K
    p_rh = (row * HV + i_hv) * W  # (row, head) of rec_v / rec_decay / rec_beta, in records
    b_A_log, b_bias = head_gate_params(A_log, dt_bias, i_hv, o_k, m_k, K, IS_KDA)
    for t in range(0, w):
        tok = bos + t
        b_q, b_k_raw, b_v_raw, b_decay, b_beta = verify_token(
            qkv, a, b, b_A_log, b_bias, tok, i_h, i_hv, o_k, m_k, o_v, m_v, scale, lower_bound, H, HV, K, V, IS_KDA)
        tl.store(p_rk + t * K + o_k, b_k_raw, mask=w_k)
        tl.store(rec_v + (p_rh + t) * V + o_v, b_v_raw, mask=m_v)
        if IS_KDA:
            tl.store(rec_decay + (p_rh + t) * GW + o_k, b_decay, mask=m_k & (i_v == 0))
            b_decay = b_decay[:, None]
        else:
            tl.store(rec_decay + p_rh + t, b_decay, mask=i_v == 0)
        tl.store(rec_beta + p_rh + t, b_beta, mask=i_v == 0)
        b_h = delta_step(b_h, l2norm(b_k_raw.to(tl.float32)), b_v_raw.to(tl.float32), b_decay, b_beta)
        tl.store(out + (tok * HV + i_hv) * V + o_v, step_output(b_h, b_q), mask=m_v)
        b_h = round_to(b_h, ssm.dtype.element_ty).to(tl.float32)
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)


@triton.jit
def compact_commit_kernel(ssm, rec_k, rec_v, rec_decay, rec_beta, slots, accepted, cap,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                          IS_KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    pid, i_l = tl.program_id(0), tl.program_id(1)
    NV: tl.constexpr = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    GW: tl.constexpr = K if IS_KDA else 1
    slot = tl.load(slots + i_n).to(tl.int64)
    keep = tl.load(accepted + i_n)  # -1 for idle rows: no token, no load, no store

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :] & (keep >= 0)
    row = i_l * cap + slot  # int64 through slot
    p_h = ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(p_h, mask=m_h, other=0.0).to(tl.float32)
    p_rk = rec_k + (row * H + i_h) * W * K
    p_rh = (row * HV + i_hv) * W
    for t in range(0, keep + 1):
        b_k = l2norm(tl.load(p_rk + t * K + o_k, mask=m_k, other=0.0).to(tl.float32))
        b_v = tl.load(rec_v + (p_rh + t) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        if IS_KDA:
            b_decay = tl.load(rec_decay + (p_rh + t) * GW + o_k, mask=m_k, other=0.0)[:, None]
        else:
            b_decay = tl.load(rec_decay + p_rh + t)
        b_h = delta_step(b_h, b_k, b_v, b_decay, tl.load(rec_beta + p_rh + t))
        b_h = round_to(b_h, ssm.dtype.element_ty).to(tl.float32)
    tl.store(p_h, round_to(b_h, ssm.dtype.element_ty), mask=m_h)


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
    """One layer of a compact verify round: outputs and records `0 .. w - 1` of each row; the state
    is only read.

    Args:
        pool: the compact pool; records of `layer` are written for the round's valid tokens.
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * W`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (must match the pool's family).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        slots: `[n]` int64                     # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32, tokens of each row (0 = idle).
        cu_seqlens: `[n + 1]` int32            # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: the `step` config (the one native verify and compact commit use).
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, W = pool.dims
    if not 0 <= layer < L:
        raise ValueError(f"layer {layer} outside [0, {L})")
    is_kda, out = check_verify_inputs(qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, H, HV, K, V, W, out)
    if is_kda != pool.is_kda:
        raise ValueError(f"gate input of rank {a.dim()} does not match the pool's rec_decay "
                         f"{tuple(pool.rec_decay.shape)}")
    BV, opts = step_launch_options(config, V)
    n = slots.shape[0]
    compact_verify_kernel[(triton.cdiv(V, BV) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out, pool.ssm, pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta,
        slots, widths, cu_seqlens, layer, cap, n, K**-0.5, lower_bound,
        H=H, HV=HV, K=K, V=V, W=W, IS_KDA=is_kda, BK=triton.next_power_of_2(K), BV=BV, **opts,
    )
    return out


def compact_commit(pool: CompactPool, slots: torch.Tensor, accepted: torch.Tensor, config: Config) -> None:
    """Replay records `0 .. accepted[r]` into the state of every layer, one launch, one write per state.

    Args:
        pool: the compact pool (`ssm` updated in place for rows with `accepted >= 0`).
        slots: `[n]` int64                     # slot: [batch row] -> pool row (distinct)
        accepted: `[n]` int32, last kept token of each row; -1 for an idle row (left untouched).
        config: the `step` config of the round's verify.
    """
    L, cap, H, HV, K, V, W = pool.dims
    n = slots.shape[0]
    if accepted.shape != (n,):
        raise ValueError(f"accepted has shape {tuple(accepted.shape)}, expected ({n},)")
    BV, opts = step_launch_options(config, V)
    compact_commit_kernel[(triton.cdiv(V, BV) * n * HV, L)](
        pool.ssm, pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta, slots, accepted, cap,
        H=H, HV=HV, K=K, V=V, W=W, IS_KDA=pool.is_kda, BK=triton.next_power_of_2(K), BV=BV, **opts,
    )
