"""Compact's `precompute` verify (SPEC §3): the accept and deferred variants' verify as matrix products
(`tl.dot`; tensor cores at every precision but `ieee`).

Compact verify (kernels/ssm/compact.py) steps the committed state token by token to take each output
and then throws the stepped state away: the state is only read. Its outputs are replay's with an empty
history (kernels/ssm/matrix_round.py), so this kernel reduces the committed state against the round's
stacked keys and queries, chunk by chunk of `BK` key columns, and solves the `W x W` system:

    HW^T = S^T (X ⊙ e^Γ)^T       [BV, 2W]   one tl.dot per K chunk
    A    = (X ⊙ e^Γ) (k ⊙ e^{-Γ})^T          [2W, W]    pair scores inside the round
    then `solve_round` (d_t and o_t, fp32 on CUDA cores).

(GDN's gates are scalars per token: the products run on the unscaled rows and `e^{Γ_t}`, `e^{Γ_t - Γ_i}`
scale the small results. KDA's are `[K]` vectors, so its rows are scaled before the products and the
pair scores factor `e^{Γ_t - Γ_i} = e^{Γ_t} e^{-Γ_i}`, bounded by the launcher as in replay's kernel.)

The records it writes are the token loop's, bit for bit: raw k and v as loaded, `exp(g)` from the same
gate helpers and beta = sigmoid(b), each with fp fusion off. So the accept commit (compact_commit, which
replays those records token by token) still writes native's states bit for bit; only the outputs differ
from native's, by rounding (and, with a bf16 state, by the intermediate roundings the token loop makes
and this form does not), and are compared by tolerance.

The deferred variant (`deferred-precompute*`, `DEFERRED`) first commits the row's pending records as the
token-loop deferred verify does: the whole `[K, BV]` block loaded once, `replay_records` (native's step,
rounding after every token), one store; then, after a block barrier (the chunks below read back what other
threads of the program stored), the same matrix verify on the committed state, writing the new round's
records into the other half. So its committed states are native's bit for bit, like `deferred`'s, and only
its outputs are judged by tolerance.

Config `compact-precompute` (`deferred-precompute` for a deferred pool): `BV` (V block, >= 16), `BK` (K
chunk, >= 16), `num_warps`, `num_stages`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.compact import CompactPool, check_compact_round, replay_records
from kernels.ssm.configs import COMPACT_PRECOMPUTE, DEFERRED_PRECOMPUTE, Config
from kernels.ssm.dot_precision import DEFAULT_PRECISION
from kernels.ssm.matrix_round import round_chunk, round_scalars, solve_round, stack_vec
from kernels.ssm.native import zero_padding_rows
from kernels.ssm.replay_precompute import matrix_launch


@triton.jit(do_not_specialize=["layer", "cap", "n"])
def compact_precompute_kernel(qkv, a, b, A_log, dt_bias, out, ssm, rec_k, rec_v, rec_decay, rec_beta, pending,
                              parity, slots, widths, cu_seqlens, layer, cap, n, scale, lower_bound,
                              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                              WP: tl.constexpr, IS_KDA: tl.constexpr, DEFERRED: tl.constexpr, KP: tl.constexpr,
                              BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Grid `(cdiv(V, BV) * n * HV,)`: one layer's round for one row, value head and V block.

    WP: the round width padded to a power of two (>= 4); KP: K padded to a power of two; DEFERRED: commit
    the pending records first (`pending`, `parity` are read only then).
    """
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    GW: tl.constexpr = K if IS_KDA else 1
    C: tl.constexpr = 2 * H * K + HV * V
    o_t = tl.arange(0, WP)  # round token
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    row = layer * cap + slot  # int64 through slot
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)
    m_t = o_t < w
    p_tok = qkv + (bos + o_t) * C  # [WP] the round's conv output rows

    # per-token scalars (fp32): beta, the norms of q and k over the whole K, GDN's log gate
    b_beta, b_A_log, r_q, r_k, b_g = round_scalars(qkv, a, b, A_log, dt_bias, bos, o_t, m_t, i_h, i_hv, scale,
                                                   H, HV, K, V, KP, IS_KDA)
    if not IS_KDA:
        b_gam = tl.cumsum(b_g, 0)  # Γ_t

    p_s = ssm + (row * HV + i_hv) * K * V
    P: tl.constexpr = 2 * W if DEFERRED else W
    if DEFERRED:
        # the pending round's accepted records first (an idle row keeps its pending round for later)
        half = tl.load(parity + slot, mask=w > 0, other=0)
        last = tl.load(pending + slot, mask=w > 0, other=-1)
        o_kf = tl.arange(0, KP)
        m_kf = o_kf < K
        m_hf = m_kf[:, None] & m_v[None, :] & (last >= 0)
        p_hf = p_s + o_kf[:, None] * V + o_v[None, :]
        b_h = tl.load(p_hf, mask=m_hf, other=0.0).to(tl.float32)
        b_h = replay_records(b_h, rec_k, rec_v, rec_decay, rec_beta, row, i_h, i_hv, half * W, last,
                             o_kf, m_kf, o_v, m_v, H, HV, K, V, W, P, IS_KDA, ssm.dtype.element_ty)
        tl.store(p_hf, b_h.to(ssm.dtype.element_ty), mask=m_hf)
        tl.debug_barrier()  # the chunks below load the committed block back, stored by other threads
        base = (1 - half) * W
    else:
        base = 0
    p_rh = (row * HV + i_hv) * P + base  # (row, head, first position of this round) of rec_v / rec_decay / rec_beta
    w_k = (i_v == 0) & (i_hv % (HV // H) == 0)  # key-head records: V block 0 of a group's first head
    b_hw = tl.zeros([BV, 2 * WP], dtype=tl.float32)  # HW^T: state projections
    b_kk = tl.zeros([2 * WP, WP], dtype=tl.float32)  # A: pair scores inside the round
    for k0 in range(0, KP, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        x_k, b_k, b_x, b_gk, b_gamk = round_chunk(qkv, a, dt_bias, bos, o_t, m_t, o_k, m_k, i_h, i_hv, r_q, r_k,
                                                  b_A_log, lower_bound, H, HV, K, V, IS_KDA)
        if IS_KDA:
            b_kr = b_k * tl.exp(-b_gamk)
            tl.store(rec_decay + (p_rh + o_t)[:, None] * GW + o_k[None, :], tl.exp(b_gk), mask=m_tk & (i_v == 0))
        else:
            b_kr = b_k
        b_s = tl.load(p_s + o_k[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_k[None, :] & (w > 0),
                      other=0.0).to(tl.float32)  # [BV, BK] of S^T
        b_hw = tl.dot(b_s, tl.trans(b_x), b_hw, input_precision=PREC)
        b_kk = tl.dot(b_x, tl.trans(b_kr), b_kk, input_precision=PREC)
        tl.store(rec_k + ((row * H + i_h) * P + base + o_t)[:, None] * K + o_k[None, :], x_k, mask=m_tk & w_k)

    if not IS_KDA:
        b_g2 = stack_vec(b_gam)  # Γ of each stacked row's token
        b_hw = b_hw * tl.exp(b_g2)[None, :]
        b_kk = b_kk * tl.exp(tl.minimum(b_g2[:, None] - b_gam[None, :], 0.0))  # i > t is masked in the solve
    m_vt = m_v[:, None] & m_t[None, :]
    x_v = tl.load(p_tok[None, :] + 2 * H * K + i_hv * V + o_v[:, None], mask=m_vt, other=0.0)  # [BV, WP] raw v
    b_o, b_d = solve_round(b_hw, b_kk, x_v.to(tl.float32), b_beta, W, tl.float32)

    tl.store(out + ((bos + o_t) * HV + i_hv)[None, :] * V + o_v[:, None], b_o, mask=m_vt)
    tl.store(rec_v + (p_rh + o_t)[None, :] * V + o_v[:, None], x_v, mask=m_vt)
    if not IS_KDA:
        tl.store(rec_decay + p_rh + o_t, tl.exp(b_g), mask=m_t & (i_v == 0))
    tl.store(rec_beta + p_rh + o_t, b_beta, mask=m_t & (i_v == 0))


def compact_precompute_verify(
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
    precision: str = DEFAULT_PRECISION,
) -> torch.Tensor:
    """One layer of a compact verify round as matrix products: outputs, and records `0 .. w - 1` of each row
    exactly as `compact_verify` writes them. An accept pool's state is only read; a deferred pool's pending
    records are committed first, bit for bit as `compact_verify` commits them (one state write).

    Args:
        pool: a compact pool, accept or deferred (`pool.deferred`).
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * W`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (must match the pool's family).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32           # tokens of each row (0 = idle)
        cu_seqlens: `[n + 1]` int32   # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: a `compact-precompute` config (`deferred-precompute` for a deferred pool; `BV`, `BK` >= 16,
            `num_warps`, `num_stages`).
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.
        precision: `tl.dot` input precision of the K reductions (`PRECISIONS`); the interpreter
            computes every product in fp32 whatever is asked.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, W = pool.dims
    is_kda, out, bookkeeping = check_compact_round(pool, layer, qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens,
                                                   out)
    opts = matrix_launch(DEFERRED_PRECOMPUTE if pool.deferred else COMPACT_PRECOMPUTE, config, K, V, W, is_kda,
                         lower_bound, precision)
    n = slots.shape[0]
    compact_precompute_kernel[(triton.cdiv(V, opts["BV"]) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out, pool.ssm, pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta, *bookkeeping,
        slots, widths, cu_seqlens, layer, cap, n, K**-0.5, lower_bound, H=H, HV=HV, K=K, V=V, W=W, IS_KDA=is_kda,
        DEFERRED=pool.deferred, **opts,
    )
    return out
