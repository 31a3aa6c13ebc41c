"""The one per-token step every Triton kernel that evolves SSM state calls (SPEC §2).

Native verify, compact verify, compact commit and the replay fold all evolve the state through
`delta_step` below, with the same block shapes (the "step" config class), and every kernel that calls
it launches with `enable_fp_fusion=False`. Both are needed for the bitwise contracts: with default fp
contraction a separately compiled kernel calling the same helper may fuse a multiply-add differently
(measured on an H200: committed states 1 ulp apart), and a different BV/warp layout changes the
reduction tree of `tl.sum`.

Register blocks: `b_h [BK, BV]` fp32 (state rows K, a BV slice of columns V), `b_k`, `b_q [BK]` fp32,
`b_v [BV]` fp32, `b_beta` scalar; the decay is a scalar `exp(g)` for GDN and a `[BK, 1]` column
`exp(g)` for KDA, so one helper serves both families.
"""

from __future__ import annotations

import triton
import triton.language as tl

L2NORM_EPS = 1e-6
ENABLE_FP_FUSION = False  # pass as `enable_fp_fusion=ENABLE_FP_FUSION` to every state-evolving launch


@triton.jit
def l2norm(b_x):
    """`x / sqrt(sum(x^2) + 1e-6)` of an fp32 `[BK]` block (masked lanes must hold 0)."""
    return b_x / tl.sqrt(tl.sum(b_x * b_x, 0) + 1e-6)


@triton.jit
def delta_step(b_h, b_k, b_v, b_decay, b_beta):
    """`S <- decay * S; d = beta (v - S^T k); S <- S + k d^T`; returns the new `b_h` (fp32, unrounded)."""
    b_h = b_h * b_decay
    b_d = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))
    b_h = b_h + b_k[:, None] * b_d[None, :]
    return b_h


@triton.jit
def step_output(b_h, b_q):
    """`o = S^T q` for the `[BV]` slice of columns held in `b_h`."""
    return tl.sum(b_h * b_q[:, None], 0)
