"""Replay's `precompute` forward (SPEC §3): a round's outputs as matrix products (`tl.dot`; tensor cores at
every precision but `ieee`).

The inline forward (kernels/ssm/replay.py) walks the round token by token and reduces the checkpoint
block and the history registers twice per token with CUDA-core FMAs. This kernel takes the whole round
at once, in the transposed form that puts the V block on the tensor cores' M side: with the round's
normalized keys and queries stacked as the rows of `X = [k_0 .. k_{W-1}; q_0 .. q_{W-1}]`, `G_c` the
history's gate total, `Γ_t` the round's gates up to token t and `rel_j` the gates after record j,

    HW^T = S0^T (X ⊙ e^{G_c + Γ})^T                   [BV, 2W]   the checkpoint, one tl.dot per K chunk
    SC   = (Kd ⊙ e^{rel}) (X ⊙ e^{Γ})^T               [J, 2W]    history scores, once per K chunk
    HW^T += Dd^T SC                                    [BV, 2W]   the history values, one tl.dot
    A    = (X ⊙ e^{Γ}) (k ⊙ e^{-Γ})^T                  [2W, W]    pair scores inside the round
    d_t  = beta_t (v_t - HW_k[t] - sum_{i<t} A[k_t, i] d_i)      forward substitution, W steps, fp32
    o_t  = HW_q[t] + sum_{i<=t} A[q_t, i] d_i

(GDN's gates are scalars per token, so its products run on the unscaled rows and the decays
`e^{G_c + Γ_t}`, `e^{rel_j + Γ_t}` and `e^{Γ_t - Γ_i}` scale the small results instead; every GDN
exponent is <= 0. KDA's gates are `[K]` vectors, so its rows are scaled before the products, and the
pair scores factor `e^{Γ_t - Γ_i} = e^{Γ_t} e^{-Γ_i}`: `e^{-Γ_i}` is at most `e^{W |lower_bound|}`,
which the launcher bounds.)

The K reductions run in chunks of `BK` columns, so only a `[BV, BK]` slice of the checkpoint is live
at a time, and every product of a K reduction runs at `precision` (`tl.dot`'s `input_precision`:
`ieee`, `tf32x3`, `bf16x3`, `bf16x6` keep fp32-contract accuracy; `tf32` does not); the `W x W` solve
and the `[BV, W] x [W, W]` round terms are fp32 on CUDA cores. `d_t` and `k_t` are rounded to the
history dtype before any later use, as the records hold them.

Outputs are held to contract 2's tolerance against native, never to bitwise equality. The token fold (the
`precompute*` variants: native's step, so folded states equal native's bit for bit with fp32 state) runs
before the forward, in `replay_fold`'s launch for the layer, not inside it: a token-fold branch here holds a
`[K, BV]` block across a token loop, and the kernel's registers follow its largest branch (measured at BV 64
on 2 warps, results/reference/h200-2026-12-03b: 255 registers and 4 programs an SM with the fold inside,
216 us a layer at batch 128; 72 registers without it (scripts/sass_stats.py); folding 8 columns at a time
inside took 96-128 registers, 186 us a layer, but 1303 us a launch where every row folds). The matrix fold
(the `matrix*` variants, kernels/ssm/replay_matrix_fold.py) has no token loop, so it runs here, as the
first loop of a folding row's program (`FOLD`): its own loop over the block's K chunks, then the forward
reads the folded block back, which saves the fold launch's second read of the state from DRAM. The raw
records (conv outputs, beta, the log gate) come from the same elementwise helpers as the inline forward's,
bit for bit.

Config `replay-precompute`: `BV` (V block, >= 16), `BK` (K chunk, >= 16), `num_warps`, `num_stages`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import REPLAY_PRECOMPUTE, Config
from kernels.ssm.dot_precision import DEFAULT_PRECISION
from kernels.ssm.matrix_fold_block import fold_block, history_keys, matrix_fold_supported
from kernels.ssm.matrix_round import matrix_blocks, round_chunk, round_scalars, solve_round, stack_vec
from kernels.ssm.native import zero_padding_rows
from kernels.ssm.replay import ReplayPool, check_replay_round
from kernels.ssm.step import round_to

# The largest KDA `W * |lower_bound|` the kernel can factor (e^80 and e^-80 are well inside fp32's range, so
# no pair score overflows or flushes to zero).
KDA_MAX_LOG_SPAN = 80.0


@triton.jit(do_not_specialize=["layer", "cap", "n"])
def replay_precompute_kernel(qkv, a, b, A_log, dt_bias, out,
                             ssm, hist_k, hist_d, hist_g, raw_k, raw_v, raw_beta, cursor,
                             slots, widths, cu_seqlens, fold_from, layer, cap, n, scale, lower_bound,
                             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                             P: tl.constexpr, WP: tl.constexpr, J: tl.constexpr, IS_KDA: tl.constexpr,
                             KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                             FOLD: tl.constexpr):
    """Grid `(cdiv(V, BV) * n * HV,)`: one layer's round for one row, value head and V block.

    WP: the round width padded to a power of two (>= 4); J: the history length padded to >= 16 (the
    smallest tensor-core reduction); KP: K padded to a power of two (the fold's block). FOLD: a row with
    `fold_from[r] >= 0` first folds its block in matrix form (`fold_block`) and reads it back.
    """
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    LH: tl.constexpr = P // 2
    GW: tl.constexpr = K if IS_KDA else 1
    C: tl.constexpr = 2 * H * K + HV * V
    o_t = tl.arange(0, WP)  # round token
    o_j = tl.arange(0, J)  # history record since the checkpoint
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

    p_s0 = ssm + (row * HV + i_hv) * K * V
    if FOLD:
        f_cur = tl.load(fold_from + i_n)
        if f_cur >= 0:
            # Fold first, in its own loop over the block: its registers are not live beside the forward's
            # (one loop doing both took 251 registers against 137 at BV 32 on one warp, sm_90), and the
            # forward below reads the folded block back from L2 instead of a second launch reading it from
            # DRAM. The barrier makes this program's stores visible to all its threads (other lanes load
            # what a lane stored: the forward's loads are transposed).
            fold_block(ssm, hist_k, hist_d, hist_g, p_s0, row, i_h, i_hv, f_cur, o_v, m_v,
                       H, HV, K, V, P, J, IS_KDA, KP, BK, BV, PREC)
            tl.debug_barrier()
    # the history since the checkpoint (the cursor was flipped by prepare for rows that fold: count 0)
    cur = tl.load(cursor + slot, mask=w > 0, other=0)
    count = cur % P
    base = (cur // P) * LH
    m_j = o_j < count
    m_jn = (o_j + 1) < count
    p_hk = hist_k + (row * H + i_h) * P * K
    p_hd = hist_d + (row * HV + i_hv) * P * V
    p_hg = hist_g + (row * HV + i_hv) * P * GW
    if not IS_KDA:
        b_gc = tl.sum(tl.load(p_hg + base + o_j, mask=m_j, other=0.0), 0)  # G_c
        # record j decays by the gates after it: a reverse cumsum of the gates shifted by one
        b_rel = tl.cumsum(tl.load(p_hg + base + o_j + 1, mask=m_jn, other=0.0), 0, reverse=True)

    # K reductions, chunk by chunk
    b_hw = tl.zeros([BV, 2 * WP], dtype=tl.float32)  # HW^T: checkpoint (+ history) projections
    b_sc = tl.zeros([J, 2 * WP], dtype=tl.float32)  # SC: history scores
    b_kk = tl.zeros([2 * WP, WP], dtype=tl.float32)  # A: pair scores inside the round
    w_k = (i_v == 0) & (i_hv % (HV // H) == 0)  # key-head records: V block 0 of a group's first head
    pos = base + count + o_t  # ring positions of the round's records
    for k0 in range(0, KP, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        x_k, b_k, b_x, b_gk, b_gamk = round_chunk(qkv, a, dt_bias, bos, o_t, m_t, o_k, m_k, i_h, i_hv, r_q, r_k,
                                                  b_A_log, lower_bound, H, HV, K, V, IS_KDA)
        b_kh = round_to(b_k, hist_k.dtype.element_ty)  # the key as its record holds it
        b_kd, b_gck = history_keys(p_hk, p_hg, base, o_j, m_j, m_jn, o_k, m_k, K, IS_KDA)  # (b_gc: GDN's total)
        if IS_KDA:
            b_xc = b_x * tl.exp(b_gck)[None, :]
            b_kr = b_kh.to(tl.float32) * tl.exp(-b_gamk)
            tl.store(p_hg + pos[:, None] * K + o_k[None, :], b_gk, mask=m_tk & (i_v == 0))
        else:
            b_xc = b_x
            b_kr = b_kh.to(tl.float32)
        b_s = tl.load(p_s0 + o_k[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_k[None, :] & (w > 0),
                      other=0.0).to(tl.float32)  # [BV, BK] of S0^T
        b_hw = tl.dot(b_s, tl.trans(b_xc), b_hw, input_precision=PREC)
        b_sc = tl.dot(b_kd, tl.trans(b_x), b_sc, input_precision=PREC)
        b_kk = tl.dot(b_x, tl.trans(b_kr), b_kk, input_precision=PREC)
        tl.store(p_hk + pos[:, None] * K + o_k[None, :], b_kh, mask=m_tk & w_k)
        tl.store(raw_k + (row * H + i_h) * P * K + pos[:, None] * K + o_k[None, :], x_k, mask=m_tk & w_k)

    if not IS_KDA:
        b_g2 = stack_vec(b_gam)  # Γ of each stacked row's token
        b_hw = b_hw * tl.exp(b_gc + b_g2)[None, :]
        b_sc = b_sc * tl.where(m_j[:, None], tl.exp(b_rel[:, None] + b_g2[None, :]), 0.0)
        b_kk = b_kk * tl.exp(tl.minimum(b_g2[:, None] - b_gam[None, :], 0.0))  # i > t is masked below
    b_dd = tl.load(p_hd + (base + o_j)[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_j[None, :],
                   other=0.0).to(tl.float32)  # [BV, J] of Dd^T
    b_hw = tl.dot(b_dd, b_sc, b_hw, input_precision=PREC)
    m_vt = m_v[:, None] & m_t[None, :]
    x_v = tl.load(p_tok[None, :] + 2 * H * K + i_hv * V + o_v[:, None], mask=m_vt, other=0.0)  # [BV, WP] raw v
    # d_t rounded to the history dtype before later use, as its record holds it
    b_o, b_d = solve_round(b_hw, b_kk, x_v.to(tl.float32), b_beta, W, hist_d.dtype.element_ty)

    tl.store(out + ((bos + o_t) * HV + i_hv)[None, :] * V + o_v[:, None], b_o, mask=m_vt)
    tl.store(p_hd + pos[None, :] * V + o_v[:, None], b_d.to(hist_d.dtype.element_ty), mask=m_vt)
    tl.store(raw_v + (row * HV + i_hv) * P * V + pos[None, :] * V + o_v[:, None], x_v, mask=m_vt)
    if not IS_KDA:
        tl.store(p_hg + pos, b_g, mask=m_t & (i_v == 0))
    tl.store(raw_beta + (row * HV + i_hv) * P + pos, b_beta, mask=m_t & (i_v == 0))


def precompute_supported(K: int, V: int, family: str = "gdn", width: int = 1, lower_bound: float = -5.0) -> str | None:
    """Why a geometry cannot run the precompute forward, or None: tensor-core reductions are >= 16
    wide, and KDA's in-round pair scores factor `e^{Γ_t - Γ_i}` only while `W * |lower_bound|` fits."""
    if K < 16 or V < 16:
        return f"the precompute forward needs K >= 16 and V >= 16 (tensor-core tiles), got K={K}, V={V}"
    if family == "kda" and width * abs(lower_bound) > KDA_MAX_LOG_SPAN:
        return (f"the precompute forward factors KDA's in-round decay, which needs W * |lower_bound| <= "
                f"{KDA_MAX_LOG_SPAN:g}, got W={width}, lower_bound={lower_bound}")
    return None


def matrix_launch(kernel: str, config: Config, K: int, V: int, W: int, is_kda: bool, lower_bound: float,
                  precision: str) -> dict:
    """The constexprs and launch options of a matrix-form kernel (`replay-precompute`, `compact-precompute`)
    after checking what it needs: `KP`, `BK`, `BV`, `WP`, `PREC` (ieee in the interpreter, which computes
    every product in fp32 anyway), `num_warps`, `num_stages`, fp fusion off. ValueError on a geometry it
    cannot run (`precompute_supported`), an unknown precision or a bad config."""
    why = precompute_supported(K, V, "kda" if is_kda else "gdn", W, lower_bound)
    if why:
        raise ValueError(why)
    return {**matrix_blocks(kernel, config, K, V, precision), "WP": max(4, triton.next_power_of_2(W))}


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
    precision: str = DEFAULT_PRECISION,
    fold_from: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer of a replay round with the precompute forward: outputs from checkpoint + history as
    matrix products, records appended. The rows that `replay_prepare` marked either folded this layer
    first (`fold_from` None: `replay_fold(..., layer=layer)` or `replay_matrix_fold` ran; the history fits
    with the round, `count + width <= Lh`) or fold here (`fold_from` given, the `matrix*` variants): such a
    row's program folds its checkpoint block as `replay_matrix_fold` does (the same helper and formula,
    at this launch's BV / BK) and then runs the forward on it, which saves that launch's second read of the state.

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
        config: a `replay-precompute` config (`BV`, `BK` >= 16, `num_warps`, `num_stages`).
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.
        precision: `tl.dot` input precision of the K reductions (`PRECISIONS`) and of the fold; the
            interpreter computes every product in fp32 whatever is asked.
        fold_from: None, or `[n]` int32 from `replay_prepare` (batch row -> old cursor, -1: no fold); needs
            an fp32 history (`matrix_fold_supported`).

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, H, HV, K, V, P = pool.dims
    n = slots.shape[0]
    W, is_kda, out = check_replay_round(pool, layer, qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, out)
    opts = matrix_launch(REPLAY_PRECOMPUTE, config, K, V, W, is_kda, lower_bound, precision)
    if fold_from is not None:
        why = matrix_fold_supported(K, V, pool.hist_d.dtype)
        if why:
            raise ValueError(why)
        if fold_from.shape != (n,) or fold_from.dtype != torch.int32:
            raise ValueError(f"fold_from must be [{n}] int32, got {tuple(fold_from.shape)} {fold_from.dtype}")
    replay_precompute_kernel[(triton.cdiv(V, opts["BV"]) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out,
        pool.ssm, pool.hist_k, pool.hist_d, pool.hist_g, pool.raw_k, pool.raw_v, pool.raw_beta, pool.cursor,
        slots, widths, cu_seqlens, slots if fold_from is None else fold_from, layer, cap, n, K**-0.5, lower_bound,
        H=H, HV=HV, K=K, V=V, W=W, P=P, J=max(16, P // 2), IS_KDA=is_kda, FOLD=fold_from is not None, **opts,
    )
    return out
