"""The one per-token step every Triton kernel that evolves SSM state calls (SPEC §2).

Native verify, compact verify, compact commit and the replay fold all evolve the state through
`delta_step` below, with the same block shapes (the "step" config class), and every kernel that calls
it launches with `enable_fp_fusion=False`. Both are needed for the bitwise contracts: with default fp
contraction a separately compiled kernel calling the same helper may fuse a multiply-add differently
(measured on an H200: committed states 1 ulp apart), and a different BV/warp layout changes the
reduction tree of `tl.sum`.

States evolve through `delta_step` and native and compact take outputs from the stepped state
(`step_output`); replay's forward takes them from its checkpoint and history (`project_token`).

Register blocks: `b_h [BK, BV]` fp32 (state rows K, a BV slice of columns V), `b_k`, `b_q [BK]` fp32,
`b_v [BV]` fp32, `b_beta` scalar; the decay is a scalar `exp(g)` for GDN and a `[BK, 1]` column
`exp(g)` for KDA, so one helper serves both families.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.triton_cpu import interpreting

L2NORM_EPS = 1e-6
ENABLE_FP_FUSION = False  # pass as `enable_fp_fusion=ENABLE_FP_FUSION` to every state-evolving launch
# Triton 3.6's interpreter casts fp32 -> bf16 by truncation (its explicit "rtne" mode mishandles the
# carry into the exponent); GPUs round to nearest even. `round_to` emulates RTNE when interpreting.
_EMULATE_RTNE: tl.constexpr = tl.constexpr(interpreting())


@triton.jit
def round_to(b_x, dtype: tl.constexpr):
    """fp32 `b_x` rounded to nearest even in `dtype` (the state or activation dtype), on GPU and CPU alike."""
    if _EMULATE_RTNE and dtype == tl.bfloat16:
        b_bits = b_x.to(tl.uint32, bitcast=True)
        b_bits = b_bits + 0x7FFF + ((b_bits >> 16) & 1)
        b_y = (b_bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        b_y = b_x.to(dtype)
    return b_y


# Reductions over K in a fixed order. `tl.sum` reduces in whatever order the block's layout gives it
# (rows held by one thread first, then across lanes, then across warps), and the layout follows the launch
# config (BV, num_warps): two configs would give two sets of bits, so modes that must agree bit for bit
# would have to share one config. `kdot` instead names its order by row index: rows r, r + BK/4, r + BK/2
# and r + 3BK/4 are chained with explicit FMAs (one rounding each), then the BK/4 partial sums are added
# in halves (row i + row i + n/2), each level adding exactly two operands, which commutes. Nothing is left
# for the layout to choose, so every config and every kernel computes the same bits, and the FMAs do in
# one instruction what `tl.sum(h * x)` does in two (measured in SASS: 96 FFMA + 32 FMUL + 36 FADD against
# 128 FMUL + 132 FADD for a 128 x 32 block).


@triton.constexpr_function
def log2(n):
    """log2 of a power of two, at compile time."""
    return int(n).bit_length() - 1


@triton.jit
def _halves(b_s, R: tl.constexpr, BV: tl.constexpr):
    """`[R, BV]` (R a power of two) -> `[BV]`: add row i and row i + R/2 until one row is left."""
    for lvl in tl.static_range(log2(R)):
        b_s = tl.sum(tl.reshape(b_s, [2, R >> (lvl + 1), BV]), 0)
    return tl.reshape(b_s, [BV])


@triton.jit
def kdot(b_h, b_x):
    """`sum_k h[k, :] * x[k]` of an fp32 `[BK, BV]` block and a `[BK]` vector (BK a power of two >= 4), in
    the fixed order described above."""
    BK: tl.constexpr = b_h.shape[0]
    BV: tl.constexpr = b_h.shape[1]
    Q: tl.constexpr = BK // 4
    # [Q, BV, 2, 2]: element [r, :, a, b] is row (2a + b) * Q + r
    h_0, h_1 = tl.split(tl.permute(tl.reshape(b_h, [2, 2, Q, BV]), (2, 3, 0, 1)))
    x_0, x_1 = tl.split(tl.permute(tl.reshape(b_x, [2, 2, Q]), (2, 0, 1)))
    h_00, h_10 = tl.split(h_0)
    h_01, h_11 = tl.split(h_1)
    x_00, x_10 = tl.split(x_0)
    x_01, x_11 = tl.split(x_1)
    b_s = h_00 * x_00[:, None]
    b_s = tl.fma(h_01, x_01[:, None], b_s)
    b_s = tl.fma(h_10, x_10[:, None], b_s)
    b_s = tl.fma(h_11, x_11[:, None], b_s)
    return _halves(b_s, Q, BV)


@triton.jit
def ksq(b_x):
    """`sum_k x[k]^2` of an fp32 `[BK]` vector in `kdot`'s order (a scalar)."""
    BK: tl.constexpr = b_x.shape[0]
    Q: tl.constexpr = BK // 4
    x_0, x_1 = tl.split(tl.permute(tl.reshape(b_x, [2, 2, Q]), (2, 0, 1)))
    x_00, x_10 = tl.split(x_0)
    x_01, x_11 = tl.split(x_1)
    b_s = tl.fma(x_11, x_11, tl.fma(x_10, x_10, tl.fma(x_01, x_01, x_00 * x_00)))
    for lvl in tl.static_range(log2(Q)):
        b_s = tl.sum(tl.reshape(b_s, [2, Q >> (lvl + 1)]), 0)
    return tl.sum(b_s, 0)


@triton.jit
def l2norm(b_x, scale=1.0):
    """`scale * x / sqrt(sum(x^2) + 1e-6)` of an fp32 `[BK]` block (masked lanes must hold 0), the sum in
    `kdot` order. One division per vector, then a multiply per element: a per-element `x / y` compiles to
    about five instructions (reciprocal, two range fix-up multiplies and their tests)."""
    return b_x * (scale / tl.sqrt(ksq(b_x) + 1e-6))


@triton.jit
def delta_step(b_h, b_k, b_v, b_decay, b_beta):
    """`S <- decay * S; d = beta (v - S^T k); S <- S + k d^T`; returns the new `b_h` (fp32, unrounded)."""
    b_h = b_h * b_decay
    b_d = b_beta * (b_v - kdot(b_h, b_k))
    return tl.fma(b_k[:, None], b_d[None, :], b_h)


@triton.jit
def step_output(b_h, b_q):
    """`o = S^T q` for the `[BV]` slice of columns held in `b_h`."""
    return kdot(b_h, b_q)


@triton.jit
def load_token(qkv, a, b, tok, valid, i_h, i_hv, o_k, m_k, o_v, m_v,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, IS_KDA: tl.constexpr):
    """The raw inputs of packed token `tok` (int64) for value head `i_hv`, or zeros where `valid` is off.

    Returns `(q, k, v, a, b)` as loaded (activation dtype): q and k `[BK]` of key head `i_h`, v `[BV]`,
    the gate input a `[BK]` (KDA) or a scalar (GDN), the beta input b a scalar. Kernels issue the loads
    of the next token before the current token's math so the latency of one overlaps the other.
    """
    p_x = qkv + tok * (2 * H * K + HV * V)
    b_q = tl.load(p_x + i_h * K + o_k, mask=m_k & valid, other=0.0)
    b_k = tl.load(p_x + (H + i_h) * K + o_k, mask=m_k & valid, other=0.0)
    b_v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=m_v & valid, other=0.0)
    if IS_KDA:
        b_a = tl.load(a + (tok * HV + i_hv) * K + o_k, mask=m_k & valid, other=0.0)
    else:
        b_a = tl.load(a + tok * HV + i_hv, mask=valid, other=0.0)
    b_b = tl.load(b + tok * HV + i_hv, mask=valid, other=0.0)
    return b_q, b_k, b_v, b_a, b_b


@triton.jit
def prepare_token(b_q, b_k, b_v, b_a, b_b, b_A_log, b_bias, scale, lower_bound, IS_KDA: tl.constexpr):
    """Step inputs of one token from its raw loads (`load_token`), fp32: q normalized and scaled, k
    normalized, v, the log gate g (a scalar for GDN, `[BK]` for KDA) and beta = sigmoid(b)."""
    b_q = l2norm(b_q.to(tl.float32), scale)
    b_k = l2norm(b_k.to(tl.float32))
    if IS_KDA:
        b_g = kda_log_gate(b_a.to(tl.float32), b_A_log, b_bias, lower_bound)
    else:
        b_g = gdn_log_gate(b_a.to(tl.float32), b_A_log, b_bias)
    return b_q, b_k, b_v.to(tl.float32), b_g, tl.sigmoid(b_b.to(tl.float32))


@triton.jit
def decay_of(b_g, IS_KDA: tl.constexpr):
    """`exp(g)` shaped to scale the state block: a scalar (GDN) or a `[BK, 1]` column over the rows (KDA)."""
    return decay_column(tl.exp(b_g), IS_KDA)


@triton.jit
def decay_column(b_e, IS_KDA: tl.constexpr):
    """`exp(g)` (a scalar, or `[BK]` for KDA) shaped to scale the `[BK, BV]` state block."""
    if IS_KDA:
        b_col = b_e[:, None]
    else:
        b_col = b_e
    return b_col


@triton.jit
def project_token(b_s0, b_kd, b_dd, b_rel, b_eg, b_q, b_k, b_v, b_g, b_e, b_beta, here, IS_KDA: tl.constexpr,
                  HIST_DTYPE: tl.constexpr):
    """One token's output from the round's start state instead of the stepped one (SPEC §3, the replay
    formula): with `G` the running sum of log gates since `b_s0`,

        sk = S0^T (e^G * k) + sum_j ((e^{G - G_j} k_j) . k) d_j,   d = beta (v - sk),
        o  = S0^T (e^G * q) + sum_{j <= this} ((e^{G - G_j} k_j) . q) d_j.

    Replay's inline forward takes its outputs from here. The two checkpoint projections are `kdot`s
    (FMAs); the record terms are `[J]` weights times `[J, BV]` values. GDN's gate is a scalar per
    token, so record j's decay is the scalar `exp(G - G_j)`: the keys stay as recorded and `b_rel`
    holds `G - G_j` per record (summed token by token, so a recent record's decay is exact to fp32 even
    when G is large); KDA's gate is a `[K]` vector, so its keys are decayed in place by each `exp(g)`.

    (Taking native's and compact's outputs from here too, so compact verify would never step the state,
    was measured on an H200 and was slower: compact verify 46.8% of the copy ceiling at best against 46.1%
    stepping, native 77% against 86%, the `[W, K]` record registers costing more than the saved updates.)

    Args:
        b_s0: `[BK, BV]` fp32 start state; b_kd `[J, BK]` keys (KDA: decayed to now) and b_dd `[J, BV]`
            values of the records so far (zero rows unused); b_rel: `[J]` `G - G_j` (GDN; unused for KDA);
            b_eg: e^G, a scalar (GDN) or `[BK]` (KDA); b_q, b_k, b_v, b_beta: the token's step inputs;
            b_g, b_e: its log gate and `exp(g)` (scalar or `[BK]`); here: `[J]` mask of the row this
            token's record goes to.
        HIST_DTYPE: what records hold d and k in (replay's history dtype).

    Returns:
        `(o [BV], d [BV] in HIST_DTYPE, k [BK] in HIST_DTYPE, b_kd, b_dd, b_rel, b_eg)` updated.
    """
    if IS_KDA:
        b_kd = b_kd * b_e[None, :]
        b_wk = tl.sum(b_kd * b_k[None, :], 1)
    else:
        b_rel = b_rel + b_g
        b_fac = tl.exp(b_rel)
        b_wk = tl.sum(b_kd * b_k[None, :], 1) * b_fac
    b_eg = b_eg * b_e
    b_sk = kdot(b_s0, b_eg * b_k) + tl.sum(b_wk[:, None] * b_dd, 0)
    b_d = round_to(b_beta * (b_v - b_sk), HIST_DTYPE)
    b_kh = round_to(b_k, HIST_DTYPE)
    b_kd = tl.where(here[:, None], b_kh.to(tl.float32)[None, :], b_kd)
    b_dd = tl.where(here[:, None], b_d.to(tl.float32)[None, :], b_dd)
    b_wq = tl.sum(b_kd * b_q[None, :], 1)
    if not IS_KDA:
        b_rel = tl.where(here, 0.0, b_rel)
        b_wq = b_wq * tl.where(here, 1.0, b_fac)
    b_o = kdot(b_s0, b_eg * b_q) + tl.sum(b_wq[:, None] * b_dd, 0)
    return b_o, b_d, b_kh, b_kd, b_dd, b_rel, b_eg


# The log gate of a token must have the same bits in every mode: native uses it in registers, compact
# records `exp(g)` and replay records `g` for their commit and fold. So every kernel computes it with
# these helpers, launched with fp fusion off like the step.


@triton.jit
def gdn_log_gate(b_a, b_A_log, b_dt_bias):
    """GDN `g = -exp(A_log) * softplus(a + dt_bias)`, softplus threshold 20, fp32.

    `log(1 + exp(x))` stands in for `log1p` (the interpreter has no libdevice): its absolute error is
    about one ulp of `1 + exp(x)` (6e-8), so `exp(g)` moves by about `exp(A_log) * 6e-8` relative.
    """
    b_x = b_a + b_dt_bias
    return -tl.exp(b_A_log) * tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(b_x)))


@triton.jit
def kda_log_gate(b_a, b_A_log, b_dt_bias, lower_bound):
    """KDA `g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))` over a `[BK]` block, fp32."""
    return lower_bound * tl.sigmoid(tl.exp(b_A_log) * (b_a + b_dt_bias))
