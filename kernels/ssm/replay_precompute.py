"""Replay's `precompute` forward (SPEC §3): a round's projections as matrix products on tensor cores.

The inline forward (kernels/ssm/replay.py) walks the round token by token, reducing the checkpoint
block and the history registers twice per token. This kernel takes the whole round at once, the way
LightLLM's precompute mode and fla's chunked kernels do. With `G` the running sum of log gates since
the checkpoint, `Γ_t` its part inside the round, `E_t = e^{Γ_t}` and `e^{G_c}` the history's total:

    PK = (e^{G_c} E ⊙ K) S0        PQ = (e^{G_c} E ⊙ Q) S0               [W, BV], one tl.dot each
    HK = ((E ⊙ K) Kd^T) Dd         HQ = ((E ⊙ Q) Kd^T) Dd                history: two tl.dot each
    A[t, j] = Σ_K k_t k_j e^{Γ_t - Γ_j} (j < t),  M[t, j] = Σ_K q_t k_j e^{Γ_t - Γ_j} (j <= t)
    d_t = β_t (v_t - PK_t - HK_t - Σ_{j<t} A[t, j] d_j)                   forward substitution, W steps
    O = PQ + HQ + M D

(`Kd` the history's decayed keys `e^{G_c - G_j} k_j`, `Dd` its values; every exponent is <= 0.) The
products run in `tf32x3` (about fp32 accuracy): outputs are held to contract 2's tolerance against
native, never to bitwise equality. What the records keep is bitwise what the inline forward keeps for
the raw part (conv outputs, beta and the log gate from the same elementwise helpers), so folds (done
before this kernel) equal native's state bit for bit with fp32 state.

Config `replay-precompute` (BV >= 16 and K >= 16, the smallest tensor-core tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import REPLAY_PRECOMPUTE, Config, check_config
from kernels.ssm.native import zero_padding_rows
from kernels.ssm.replay import ReplayPool, check_replay_round
from kernels.ssm.step import ENABLE_FP_FUSION, gdn_log_gate, kda_log_gate, round_to

DOT_PRECISION: tl.constexpr = tl.constexpr("tf32x3")


@triton.jit
def _row(b_x, o_r, r):
    """Row `r` of a 2-D register block, by a masked sum."""
    return tl.sum(tl.where((o_r == r)[:, None], b_x, 0.0), 0)


@triton.jit
def _elem(b_x, o_r, r):
    """Element `r` of a 1-D register block, by a masked sum."""
    return tl.sum(tl.where(o_r == r, b_x, 0.0), 0)


@triton.jit
def _l2norm_rows(b_x):
    """Rows of `[R, BK]` divided by `sqrt(sum(x^2) + 1e-6)` (SPEC §2), fp32."""
    return b_x / tl.sqrt(tl.sum(b_x * b_x, 1) + 1e-6)[:, None]


@triton.jit(do_not_specialize=["layer", "cap", "n"])
def replay_precompute_kernel(qkv, a, b, A_log, dt_bias, out,
                             ssm, hist_k, hist_d, hist_g, raw_k, raw_v, raw_beta, cursor,
                             slots, widths, cu_seqlens, layer, cap, n, scale, lower_bound,
                             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                             P: tl.constexpr, RW: tl.constexpr, J: tl.constexpr, IS_KDA: tl.constexpr,
                             BK: tl.constexpr, BV: tl.constexpr):
    """Grid `(cdiv(V, BV) * n * HV,)`: one layer's round for one row, value head and V block."""
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    LH: tl.constexpr = P // 2
    GW: tl.constexpr = K if IS_KDA else 1
    C: tl.constexpr = 2 * H * K + HV * V
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, RW)  # round token
    o_j = tl.arange(0, J)  # history record
    m_k, m_v = o_k < K, o_v < V
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    row = layer * cap + slot  # int64 through slot
    m_t = o_t < w
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]

    # the round's raw inputs, all tokens at once
    p_x = qkv + (bos + o_t)[:, None] * C
    b_qr = tl.load(p_x + i_h * K + o_k[None, :], mask=m_tk, other=0.0)
    b_kr = tl.load(p_x + (H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
    b_vr = tl.load(p_x + 2 * H * K + i_hv * V + o_v[None, :], mask=m_tv, other=0.0)
    b_b = tl.load(b + (bos + o_t) * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    if IS_KDA:
        b_ar = tl.load(a + ((bos + o_t) * HV + i_hv)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
        b_bias = tl.load(dt_bias + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_g = tl.where(m_tk, kda_log_gate(b_ar.to(tl.float32), b_A_log, b_bias[None, :], lower_bound), 0.0)
    else:
        b_ar = tl.load(a + (bos + o_t) * HV + i_hv, mask=m_t, other=0.0)
        b_g = tl.where(m_t, gdn_log_gate(b_ar.to(tl.float32), b_A_log, tl.load(dt_bias + i_hv).to(tl.float32)), 0.0)
    b_q = _l2norm_rows(b_qr.to(tl.float32)) * scale
    b_k = _l2norm_rows(b_kr.to(tl.float32))
    b_beta = tl.sigmoid(b_b)
    b_s0 = tl.load(ssm + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                   mask=m_k[:, None] & m_v[None, :] & (w > 0), other=0.0).to(tl.float32)

    # history since the checkpoint: decayed keys e^{G_c - G_j} k_j, values d_j, e^{G_c}
    cur = tl.load(cursor + slot, mask=w > 0, other=0)
    count = cur % P
    base = (cur // P) * LH
    m_j = o_j < count
    p_hk = hist_k + (row * H + i_h) * P * K
    p_hd = hist_d + (row * HV + i_hv) * P * V
    p_hg = hist_g + (row * HV + i_hv) * P * GW
    b_kd = tl.load(p_hk + (base + o_j)[:, None] * K + o_k[None, :], mask=m_j[:, None] & m_k[None, :], other=0.0)
    b_dd = tl.load(p_hd + (base + o_j)[:, None] * V + o_v[None, :], mask=m_j[:, None] & m_v[None, :], other=0.0)
    b_kd, b_dd = b_kd.to(tl.float32), b_dd.to(tl.float32)
    if IS_KDA:
        b_hg = tl.load(p_hg + (base + o_j)[:, None] * K + o_k[None, :], mask=m_j[:, None] & m_k[None, :], other=0.0)
        b_gc = tl.sum(b_hg, 0)
        b_kd = b_kd * tl.exp(b_gc[None, :] - tl.cumsum(b_hg, 0))
        b_gam = tl.cumsum(b_g, 0)  # [RW, BK] Γ_t
        b_ek = tl.exp(b_gam) * b_k
        b_eq = tl.exp(b_gam) * b_q
        b_egc = tl.exp(b_gc)[None, :]
    else:
        b_hg = tl.load(p_hg + base + o_j, mask=m_j, other=0.0)
        b_gc = tl.sum(b_hg, 0)
        b_kd = b_kd * tl.exp(b_gc - tl.cumsum(b_hg, 0))[:, None]
        b_gam = tl.cumsum(b_g, 0)  # [RW] Γ_t
        b_ek = tl.exp(b_gam)[:, None] * b_k
        b_eq = tl.exp(b_gam)[:, None] * b_q
        b_egc = tl.exp(b_gc)

    # checkpoint and history projections of every token (tensor cores)
    b_r = b_vr.to(tl.float32) - tl.dot(b_egc * b_ek, b_s0, input_precision=DOT_PRECISION)
    b_r -= tl.dot(tl.dot(b_ek, tl.trans(b_kd), input_precision=DOT_PRECISION), b_dd, input_precision=DOT_PRECISION)
    b_o = tl.dot(b_egc * b_eq, b_s0, input_precision=DOT_PRECISION)
    b_o += tl.dot(tl.dot(b_eq, tl.trans(b_kd), input_precision=DOT_PRECISION), b_dd, input_precision=DOT_PRECISION)

    # within the round: A[t, j] = sum_K k_t k_j e^{Γ_t - Γ_j} (j < t), M[t, j] likewise with q_t (j <= t)
    b_a = tl.zeros([RW, RW], dtype=tl.float32)
    b_m = tl.zeros([RW, RW], dtype=tl.float32)
    for j in tl.static_range(W):
        b_kj = round_to(_row(b_k, o_t, j), hist_k.dtype.element_ty).to(tl.float32)  # as record j will hold it
        if IS_KDA:
            b_dec = tl.exp(tl.minimum(b_gam - _row(b_gam, o_t, j)[None, :], 0.0)) * b_kj[None, :]
        else:
            b_dec = tl.exp(tl.minimum(b_gam - _elem(b_gam, o_t, j), 0.0))[:, None] * b_kj[None, :]
        b_a = tl.where((o_t[None, :] == j) & (o_t[:, None] > j), tl.sum(b_dec * b_k, 1)[:, None], b_a)
        b_m = tl.where((o_t[None, :] == j) & (o_t[:, None] >= j), tl.sum(b_dec * b_q, 1)[:, None], b_m)

    # d_t = beta_t (r_t - sum_{j<t} A[t, j] d_j), rounded to the history dtype as the records keep it
    b_d = tl.zeros([RW, BV], dtype=tl.float32)
    for t in tl.static_range(W):
        b_dt = _elem(b_beta, o_t, t) * (_row(b_r, o_t, t) - tl.sum(_row(b_a, o_t, t)[:, None] * b_d, 0))
        b_dt = round_to(b_dt, hist_d.dtype.element_ty).to(tl.float32)
        b_d = tl.where((o_t == t)[:, None], b_dt[None, :], b_d)
    b_o += tl.dot(b_m, b_d, input_precision=DOT_PRECISION)
    tl.store(out + ((bos + o_t) * HV + i_hv)[:, None] * V + o_v[None, :], b_o, mask=m_tv)

    # records at ring positions base + count + t
    pos = base + count + o_t
    w_k = m_tk & (i_v == 0) & (i_hv % (HV // H) == 0)
    tl.store(p_hd + pos[:, None] * V + o_v[None, :], b_d.to(hist_d.dtype.element_ty), mask=m_tv)
    tl.store(raw_v + (row * HV + i_hv) * P * V + pos[:, None] * V + o_v[None, :], b_vr, mask=m_tv)
    tl.store(p_hk + pos[:, None] * K + o_k[None, :], round_to(b_k, hist_k.dtype.element_ty), mask=w_k)
    tl.store(raw_k + (row * H + i_h) * P * K + pos[:, None] * K + o_k[None, :], b_kr, mask=w_k)
    if IS_KDA:
        tl.store(p_hg + pos[:, None] * K + o_k[None, :], b_g, mask=m_tk & (i_v == 0))
    else:
        tl.store(p_hg + pos, b_g, mask=m_t & (i_v == 0))
    tl.store(raw_beta + (row * HV + i_hv) * P + pos, b_beta, mask=m_t & (i_v == 0))
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)


def precompute_supported(K: int, V: int) -> str | None:
    """Why a geometry cannot run the precompute forward (tensor-core tiles are >= 16 wide), or None."""
    if K < 16 or V < 16:
        return f"the precompute forward needs K >= 16 and V >= 16 (tensor-core tiles), got K={K}, V={V}"
    return None


def replay_precompute_forward(
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
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer of a replay round with the precompute forward; folds must have run first (the
    cursor's history fits with the round: `count + width <= Lh`).

    Args:
        pool: the replay pool; records of `layer` go to ring positions `base + count + t`.
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * W`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (must match the pool's family).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32           # tokens of each row (0 = idle)
        cu_seqlens: `[n + 1]` int32   # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: a `replay-precompute` config (`BV` >= 16, `num_warps`, `num_stages`).
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, P = pool.dims
    n = slots.shape[0]
    why = precompute_supported(K, V)
    if why:
        raise ValueError(why)
    W, is_kda, out = check_replay_round(pool, layer, qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, out)
    config = check_config(REPLAY_PRECOMPUTE, config)
    BV = min(config["BV"], max(16, triton.next_power_of_2(V)))
    replay_precompute_kernel[(triton.cdiv(V, BV) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out,
        pool.ssm, pool.hist_k, pool.hist_d, pool.hist_g, pool.raw_k, pool.raw_v, pool.raw_beta, pool.cursor,
        slots, widths, cu_seqlens, layer, cap, n, K**-0.5, lower_bound,
        H=H, HV=HV, K=K, V=V, W=W, P=P, RW=max(16, triton.next_power_of_2(W)), J=max(16, P // 2), IS_KDA=is_kda,
        BK=triton.next_power_of_2(K), BV=BV, num_warps=config["num_warps"], num_stages=config["num_stages"],
        enable_fp_fusion=ENABLE_FP_FUSION,
    )
    return out
