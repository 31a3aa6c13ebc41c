"""The matrix form of one verify round, shared by the tensor-core forwards (replay's precompute forward,
kernels/ssm/replay_precompute.py, and compact's precompute verify, kernels/ssm/compact_precompute.py).

Both stack the round's normalized keys and queries as the rows of `X = [k_0 .. k_{W-1}; q_0 .. q_{W-1}]`
(`[2 WP, C]`, WP the round width padded to a power of two), reduce a start state against them on the
tensor cores in the transposed form `HW^T = S^T X^T` (`[BV, 2 WP]`: the V block is the products' M side)
and take the pair scores `A = X k^T` (`[2 WP, WP]`) inside the round. What is left per (row, head, V
block) is a `W x W` forward substitution, fp32 on CUDA cores:

    d_t = beta_t (v_t - HW_k[t] - sum_{i<t} A[k_t, i] d_i)
    o_t = HW_q[t] + sum_{i<=t} A[q_t, i] d_i

The gates are the callers' business: they scale `X`, `HW` and `A` before `solve_round`. `matrix_blocks`
is the launch options every matrix-form kernel takes (the replay matrix fold's, which has no round, too).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.triton_cpu import interpreting
from kernels.ssm.configs import Config, check_config
from kernels.ssm.dot_precision import PRECISIONS
from kernels.ssm.step import ENABLE_FP_FUSION, gdn_log_gate, kda_log_gate, round_to


@triton.jit
def stack_rows(b_k, b_q):
    """`[WP, C]` key rows and `[WP, C]` query rows -> `[2 WP, C]` (row `s * WP + t`, s = 0 keys, 1 queries)."""
    WP: tl.constexpr = b_k.shape[0]
    C: tl.constexpr = b_k.shape[1]
    return tl.reshape(tl.permute(tl.join(b_k, b_q), (2, 0, 1)), [2 * WP, C])


@triton.jit
def stack_vec(b_x):
    """`[WP]` -> `[2 WP]`, the vector twice (a per-token value of both halves of `stack_rows`)."""
    WP: tl.constexpr = b_x.shape[0]
    return tl.reshape(tl.permute(tl.join(b_x, b_x), (1, 0)), [2 * WP])


@triton.jit
def split_cols(b_x):
    """`[R, 2 WP]` (columns of stacked rows) -> `([R, WP]` key columns, `[R, WP]` query columns)."""
    R: tl.constexpr = b_x.shape[0]
    WP: tl.constexpr = b_x.shape[1] // 2
    return tl.split(tl.permute(tl.reshape(b_x, [R, 2, WP]), (0, 2, 1)))


@triton.jit
def split_rows(b_x):
    """`[2 WP, C]` (stacked rows) -> `([WP, C]` key rows, `[WP, C]` query rows)."""
    WP: tl.constexpr = b_x.shape[0] // 2
    C: tl.constexpr = b_x.shape[1]
    return tl.split(tl.permute(tl.reshape(b_x, [2, WP, C]), (1, 2, 0)))


@triton.jit
def solve_round(b_hw, b_pair, b_v, b_beta, W: tl.constexpr, D_DTYPE: tl.constexpr):
    """The round's outputs from its projections (the module docstring's substitution).

    Args:
        b_hw: `[BV, 2 WP]` fp32, `HW^T` with every decay applied (key columns, then query columns).
        b_pair: `[2 WP, WP]` fp32, the pair scores `A` (key rows, then query rows) with their decays;
            entries above each row's diagonal are ignored.
        b_v: `[BV, WP]` fp32 values of the round's tokens; b_beta: `[WP]` fp32 (0 past the row's width).
        D_DTYPE: each `d_t` is rounded to it before any later use (what a record holds; fp32: none).

    Returns:
        `(o [BV, WP], d [BV, WP])` fp32.
    """
    BV: tl.constexpr = b_hw.shape[0]
    WP: tl.constexpr = b_pair.shape[1]
    o_t = tl.arange(0, WP)
    b_hk, b_hq = split_cols(b_hw)  # [BV, WP] each
    b_ak, b_aq = split_rows(b_pair)  # [WP (t), WP (i)] each
    b_ak = tl.where(o_t[None, :] < o_t[:, None], b_ak, 0.0)
    b_aq = tl.where(o_t[None, :] <= o_t[:, None], b_aq, 0.0)
    b_r = b_v - b_hk
    b_d = tl.zeros([BV, WP], dtype=tl.float32)
    for t in tl.static_range(W):
        sel = o_t == t
        a_t = tl.sum(tl.where(sel[:, None], b_ak, 0.0), 0)
        r_t = tl.sum(tl.where(sel[None, :], b_r, 0.0), 1)
        beta_t = tl.sum(tl.where(sel, b_beta, 0.0), 0)
        d_t = round_to(beta_t * (r_t - tl.sum(b_d * a_t[None, :], 1)), D_DTYPE).to(tl.float32)
        b_d = tl.where(sel[None, :], d_t[:, None], b_d)
    b_o = b_hq + tl.sum(b_d[:, None, :] * b_aq[None, :, :], 2)  # o_t += sum_{i<=t} A[q_t, i] d_i
    return b_o, b_d


@triton.jit
def round_scalars(qkv, a, b, A_log, dt_bias, bos, o_t, m_t, i_h, i_hv, scale,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
                  IS_KDA: tl.constexpr):
    """The round's per-token scalars of one (row, value head), fp32 and 0 past the row's width `m_t`:
    `(beta [WP], A_log, 1/|q| * scale [WP], 1/|k| [WP], g [WP])`, the norms over the whole K (`KP` its
    power-of-two padding) and `g` GDN's log gate (zeros for KDA, whose gate is per key column). Each from
    the same elementwise helpers as the token loops, so what a record keeps has their bits."""
    p_tok = qkv + (bos + o_t) * (2 * H * K + HV * V)
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + (bos + o_t) * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)), 0.0)
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    o_kp = tl.arange(0, KP)
    m_tkp = m_t[:, None] & (o_kp < K)[None, :]
    b_qf = tl.load(p_tok[:, None] + i_h * K + o_kp[None, :], mask=m_tkp, other=0.0).to(tl.float32)
    b_kf = tl.load(p_tok[:, None] + (H + i_h) * K + o_kp[None, :], mask=m_tkp, other=0.0).to(tl.float32)
    r_q = scale / tl.sqrt(tl.sum(b_qf * b_qf, 1) + 1e-6)
    r_k = 1.0 / tl.sqrt(tl.sum(b_kf * b_kf, 1) + 1e-6)
    if IS_KDA:
        b_g = tl.zeros_like(b_beta)
    else:
        b_ga = tl.load(a + (bos + o_t) * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        b_g = tl.where(m_t, gdn_log_gate(b_ga, b_A_log, tl.load(dt_bias + i_hv).to(tl.float32)), 0.0)
    return b_beta, b_A_log, r_q, r_k, b_g


@triton.jit
def round_chunk(qkv, a, dt_bias, bos, o_t, m_t, o_k, m_k, i_h, i_hv, r_q, r_k, b_A_log, lower_bound,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, IS_KDA: tl.constexpr):
    """One chunk of key columns `o_k` of the round's rows: `(x_k, b_k, b_x, b_gk, b_gamk)`, the raw keys as
    loaded (what a record keeps), the normalized keys `[WP, BK]` fp32, the stacked rows `X` (`stack_rows`;
    KDA's scaled by `e^{Γ_t}` of each key column), and KDA's log gates and their running sum `Γ_t` per column
    (zeros for GDN, whose gates are the scalars of `round_scalars`)."""
    p_tok = qkv + (bos + o_t) * (2 * H * K + HV * V)
    m_tk = m_t[:, None] & m_k[None, :]
    x_q = tl.load(p_tok[:, None] + i_h * K + o_k[None, :], mask=m_tk, other=0.0)
    x_k = tl.load(p_tok[:, None] + (H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
    b_q = x_q.to(tl.float32) * r_q[:, None]
    b_k = x_k.to(tl.float32) * r_k[:, None]
    if IS_KDA:
        b_ga = tl.load(a + ((bos + o_t) * HV + i_hv)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
        b_bias = tl.load(dt_bias + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_gk = tl.where(m_tk, kda_log_gate(b_ga.to(tl.float32), b_A_log, b_bias[None, :], lower_bound), 0.0)
        b_gamk = tl.cumsum(b_gk, 0)  # [WP, BK] Γ_t per key column
        b_eg = tl.exp(b_gamk)
        b_x = stack_rows(b_k * b_eg, b_q * b_eg)
    else:
        b_gk = tl.zeros_like(b_k)
        b_gamk = b_gk
        b_x = stack_rows(b_k, b_q)
    return x_k, b_k, b_x, b_gk, b_gamk


def matrix_blocks(kernel: str, config: Config, K: int, V: int, precision: str) -> dict:
    """What every matrix-form kernel takes (`matrix_launch`, and the replay matrix fold, which has no
    round): `KP`, `BK`, `BV`, `PREC` (ieee in the interpreter), `num_warps`, `num_stages`, fp fusion off."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} not in {PRECISIONS}")
    config = check_config(kernel, config)
    KP = triton.next_power_of_2(K)
    return {"KP": KP, "BK": min(config["BK"], KP), "BV": min(config["BV"], max(16, triton.next_power_of_2(V))),
            "PREC": "ieee" if interpreting() else precision,
            "num_warps": config["num_warps"], "num_stages": config["num_stages"], "enable_fp_fusion": ENABLE_FP_FUSION}
