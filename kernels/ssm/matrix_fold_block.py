"""The matrix fold of one `[K, BV]` checkpoint block (kernels/ssm/replay_matrix_fold.py's module docstring has
the formula): the helper that the fold launch, the precompute forward (`matrix*` variants) and the inline forward
(`inline-matrix*` variants) all run, so the three fold the same way. Its own module because the inline forward
(kernels/ssm/replay.py) is imported by the fold launch's module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.step import round_to


@triton.jit
def history_keys(p_hk, p_hg, base, o_j, m_j, m_jn, o_k, m_k, K: tl.constexpr, IS_KDA: tl.constexpr):
    """Key columns `o_k` of the `J` history records from ring position `base` (`m_j`: the live ones, `m_jn`: those
    with a live successor): `(b_kd [J, BK], b_gc [BK])` in fp32. KDA's keys come decayed by the gates after each
    record (`e^{G_c - G_j}`, a reverse cumsum of the gates shifted by one, never a difference of running sums)
    and `b_gc` is their total `G_c`; GDN's scalar gates are the caller's, so its keys are as stored, `b_gc` 0."""
    m_jk = m_j[:, None] & m_k[None, :]
    b_kd = tl.load(p_hk + (base + o_j)[:, None] * K + o_k[None, :], mask=m_jk, other=0.0).to(tl.float32)
    if IS_KDA:
        b_hg = tl.load(p_hg + (base + o_j)[:, None] * K + o_k[None, :], mask=m_jk, other=0.0)
        b_hn = tl.load(p_hg + (base + o_j + 1)[:, None] * K + o_k[None, :], mask=m_jn[:, None] & m_k[None, :],
                       other=0.0)
        b_kd = b_kd * tl.exp(tl.cumsum(b_hn, 0, reverse=True))
        b_gc = tl.sum(b_hg, 0)
    else:
        b_gc = tl.zeros_like(o_k).to(tl.float32)
    return b_kd, b_gc


@triton.jit
def fold_block(ssm, hist_k, hist_d, hist_g, p_dst, row, i_h, i_hv, old_cursor, o_v, m_v,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr, J: tl.constexpr,
               IS_KDA: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Fold the `old_cursor % P` records of pool row `row` (layer-major: `layer * cap + slot`) and value head
    `i_hv` into its `[K, BV]` checkpoint block of columns `o_v`, and store it, rounded once, at `p_dst` (the
    head's `[K, V]` block: the checkpoint itself or a snapshot's). Also the matrix variants' forward's first
    step for a row that folds (kernels/ssm/replay_precompute.py)."""
    GW: tl.constexpr = K if IS_KDA else 1
    count = old_cursor % P
    base = (old_cursor // P) * (P // 2)
    o_j = tl.arange(0, J)  # record since the checkpoint
    m_j = o_j < count
    m_jn = (o_j + 1) < count
    p_hk = hist_k + (row * H + i_h) * P * K
    p_hg = hist_g + (row * HV + i_hv) * P * GW
    b_dd = tl.load(hist_d + ((row * HV + i_hv) * P + base + o_j)[:, None] * V + o_v[None, :],
                   mask=m_j[:, None] & m_v[None, :], other=0.0).to(tl.float32)  # [J, BV]
    if not IS_KDA:
        b_ec = tl.exp(tl.sum(tl.load(p_hg + base + o_j, mask=m_j, other=0.0), 0))  # e^{G_c}
        # record j decays by the gates after it: a reverse cumsum of the gates shifted by one
        b_rel = tl.cumsum(tl.load(p_hg + base + o_j + 1, mask=m_jn, other=0.0), 0, reverse=True)
        b_dd = b_dd * tl.exp(b_rel)[:, None]
    p_s0 = ssm + (row * HV + i_hv) * K * V
    for k0 in range(0, KP, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        m_h = m_k[:, None] & m_v[None, :]
        b_s = tl.load(p_s0 + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.0).to(tl.float32)  # [BK, BV]
        b_kd, b_gc = history_keys(p_hk, p_hg, base, o_j, m_j, m_jn, o_k, m_k, K, IS_KDA)
        if IS_KDA:
            b_s = b_s * tl.exp(b_gc)[:, None]
        else:
            b_s = b_s * b_ec
        b_s = tl.dot(tl.trans(b_kd), b_dd, b_s, input_precision=PREC)
        tl.store(p_dst + o_k[:, None] * V + o_v[None, :], round_to(b_s, ssm.dtype.element_ty), mask=m_h)


def matrix_fold_supported(K: int, V: int, history_dtype: torch.dtype) -> str | None:
    """Why a pool cannot fold in matrix form, or None: tensor-core reductions are >= 16 wide, and the fold
    reads the stored d's, which must be fp32 (a bf16 history's would round the checkpoint on every fold)."""
    if K < 16 or V < 16:
        return f"the matrix fold needs K >= 16 and V >= 16 (tensor-core tiles), got K={K}, V={V}"
    if history_dtype != torch.float32:
        return ("the matrix fold reads the stored d's, which a bf16 history rounds: the checkpoint would take "
                "that rounding on every fold (use --history-dtype fp32, or a replay variant that folds token by "
                "token)")
    return None
