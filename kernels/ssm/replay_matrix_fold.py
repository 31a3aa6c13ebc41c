"""Replay's matrix fold (SPEC §3; the `matrix*` replay variants): the accepted history folded into the
checkpoint as one rank-`count` product per K chunk, from the derived records the forward stored.

With `G_c` the history's gate total since the checkpoint and `rel_j` the gates after record `j`
(states/replay.py's module docstring: `S_t = D(G_t) S0 + sum_{j <= t} D(G_t - G_j) k_j d_j^T`), the state
the `count` accepted records reach is, per value head,

    S = e^{G_c} ⊙ S0 + (Kd ⊙ e^{rel})^T Dd          [K, V]
    Kd [J, K]: the records' normalized keys (hist_k),  Dd [J, V]: their corrected values d (hist_d)

One program folds one `[K, BV]` block of one (row, layer, value head): per chunk of `BK` key columns it
loads `S0 [BK, BV]`, decays it, adds one `tl.dot` of `[BK, J] x [J, BV]` (`J`: Lh padded to >= 16, the
smallest tensor-core reduction), rounds once to the state dtype and stores. No token loop: the fold reads
the block once and writes it once, where the token fold (kernels/ssm/replay.py, `replay_fold`) steps the
block through every record in turn with CUDA-core FMAs.

Why it is a separate variant, never bitwise: native's step adds each record's `k d^T` to the decayed state
one at a time; here the records' contributions are summed in a dot and decayed by one factor each, so the
fp32 sums associate differently (a few ulps), and the d's are the forward's own (a precompute forward's d's
are inside the fp32 contract of native's, not equal to them). Its states are held to the fp32 contract's
tolerance against native (docs/CONTRACTS.md). A bf16 history stores the d's rounded to bf16, which this fold
would carry into the checkpoint on every fold (the token fold replays the raw records instead): the
variants refuse one (`matrix_fold_supported`).

GDN's gates are scalars per token, so `e^{rel_j}` scales the rows of `Dd` once per program; KDA's are `[K]`
vectors per token, so they scale `Kd`'s columns chunk by chunk. Every exponent is <= 0.

Config `replay-matrix-fold`: `BV` (V block, >= 16), `BK` (K chunk, >= 16), `num_warps`, `num_stages`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import REPLAY_MATRIX_FOLD, Config
from kernels.ssm.dot_precision import DEFAULT_PRECISION
from kernels.ssm.matrix_fold_block import fold_block, matrix_fold_supported
from kernels.ssm.matrix_round import matrix_blocks
from kernels.ssm.replay import ReplayPool, fold_destination, fold_program


@triton.jit(do_not_specialize=["dst_stride_req", "dst_stride_layer", "cap", "layer0"])
def replay_matrix_fold_kernel(ssm, hist_k, hist_d, hist_g, slots, fold_from, dst, dst_index,
                              dst_stride_req, dst_stride_layer, cap, layer0,
                              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr,
                              J: tl.constexpr, IS_KDA: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr,
                              BV: tl.constexpr, PREC: tl.constexpr):
    """Grid `(cdiv(V, BV), n, layers * HV)`: fold one `[K, BV]` block of one layer (`layer0` onwards) and
    value head of a row with `fold_from[r] >= 0`, and store it, rounded once, at `dst + dst_index[r] *
    dst_stride_req + layer * dst_stride_layer`. KP: K padded to a power of two."""
    i_n = tl.program_id(1)
    old_cursor = tl.load(fold_from + i_n)
    if old_cursor < 0:
        return
    row, i_hv, o_v, p_dst = fold_program(i_n, slots, dst, dst_index, dst_stride_req, dst_stride_layer, cap, layer0,
                                         HV, K, V, BV)
    fold_block(ssm, hist_k, hist_d, hist_g, p_dst, row, i_hv // (HV // H), i_hv, old_cursor, o_v, o_v < V,
               H, HV, K, V, P, J, IS_KDA, KP, BK, BV, PREC)


def replay_matrix_fold(
    pool: ReplayPool,
    slots: torch.Tensor,
    fold_from: torch.Tensor,
    config: Config,
    dst: torch.Tensor | None = None,
    layer: int | None = None,
    precision: str = DEFAULT_PRECISION,
) -> None:
    """Fold the derived records of every layer (or of `layer` only) into the checkpoint (or a copy of it) in
    matrix form, rounding once. The same interface as `replay_fold`; states within the fp32 contract of
    native's, not bitwise (module docstring).

    Args:
        pool: the replay pool, fp32 history (`matrix_fold_supported`); only read unless `dst` is None.
        slots: `[n]` int64            # slot: [batch row] -> pool row (distinct)
        fold_from: `[n]` int32        # batch row -> cursor whose records to fold; -1 leaves the row alone
        config: a `replay-matrix-fold` config (`BV`, `BK` >= 16, `num_warps`, `num_stages`).
        dst: None to write the checkpoint `pool.ssm` in place, or a contiguous `[n, L, HV, K, V]` in the
            state dtype to receive the folded states (snapshot).
        layer: fold this layer only (in place; the matrix variants fold layer by layer before the forward).
        precision: `tl.dot` input precision of the product (`PRECISIONS`); the interpreter computes it in
            fp32 whatever is asked.
    """
    L, cap, H, HV, K, V, P = pool.dims
    why = matrix_fold_supported(K, V, pool.hist_d.dtype)
    if why:
        raise ValueError(why)
    n = slots.shape[0]
    dst, dst_index, stride_req, stride_layer = fold_destination(pool, slots, fold_from, dst, layer)
    opts = matrix_blocks(REPLAY_MATRIX_FOLD, config, K, V, precision)
    layers = L if layer is None else 1
    if n:
        replay_matrix_fold_kernel[(triton.cdiv(V, opts["BV"]), n, layers * HV)](
            pool.ssm, pool.hist_k, pool.hist_d, pool.hist_g, slots, fold_from, dst, dst_index,
            stride_req, stride_layer, cap, layer or 0,
            H=H, HV=HV, K=K, V=V, P=P, J=max(16, P // 2), IS_KDA=pool.is_kda, **opts,
        )
