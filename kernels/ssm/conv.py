"""Causal depthwise conv of a round over packed tokens, reading and advancing the widened conv pool.

Request `r` owns packed rows `cu_seqlens[r] : cu_seqlens[r] + w_r` and slot `slots[r]`; its accepted
window is columns `[off, off + kernel - 1)` of `conv[slot]` with `off = conv_offset[slot]`. With
`full = [window | x_0 .. x_{w-1}]`, token `t` is `silu(sum_i weight[:, i] * full[:, t + i])`, summed
in fp32 tap by tap (the order of kernels/conv/naive.py::causal_conv) and rounded to the activation
dtype. The next window is stored as columns `[0, kernel - 2 + w)` <- `full[:, 1 : kernel - 1 + w]`,
so accepting `a` drafts leaves it at columns `[a, a + kernel - 1)`. Idle rows (w = 0) touch nothing.

SiLU gives the bits of `x / (1 + exp(-x))` evaluated in fp64 from the fp32 sum and rounded to fp32, then
to the activation dtype: the path torch takes for `F.silu(acc.double()).to(bf16)` (the torch backend and
the fp64 reference; torch casts a double to bf16 through float), so all three give the same bits. (A plain
fp32 SiLU differed from torch's in the last fp32 bit often enough to flip the bf16 rounding of a few
elements per layer at model shapes.) The fp64 path is what made the kernel instruction-bound (ncu, H200,
Qwen3-Next batch 128: 165 instructions an element, 25 of them fp64; results/reference/h200-2026-12-04c), so
a bf16 output takes it only where it can matter (`silu_rounded`): an fp32 SiLU whose error is bounded, and
the fp64 one for the tiles holding a value whose bf16 rounding that error could change.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton.language.extra import libdevice

from kernels.common.triton_cpu import interpreting
from kernels.ssm.configs import CONV, Config, check_config
from kernels.ssm.step import ENABLE_FP_FUSION, round_to

# The fp32 SiLU's error bound. libdevice's expf is within 2 ulps (CUDA C Programming Guide, "Mathematical
# Functions"), so `1 + e` is within 2^-22 + 2^-24 of `1 + exp(-x)` relatively and the correctly rounded
# division adds 2^-24: under 2^-21.4 relative in all, fewer than 6 fp32 ulps of the value (an ulp is at
# least 2^-24 of it). A bf16 rounding can only change where the fp32 value lies within that of a bf16
# midpoint (its low 16 bits 0x8000), so values whose low 16 bits are within NEAR_ULPS of it go the fp64
# way; so do |x| > FAST_RANGE (large exponents, results near fp32's underflow), subnormal-sized |x| and NaNs.
NEAR_ULPS: tl.constexpr = tl.constexpr(16)
FAST_RANGE: tl.constexpr = tl.constexpr(16.0)
# the interpreter has no libdevice; numpy's exp there is within an ulp
_INTERPRETING: tl.constexpr = tl.constexpr(interpreting())


@triton.jit
def _silu64(b_x):
    """SiLU of fp32 `b_x` in fp64, rounded to fp32."""
    b_x64 = b_x.to(tl.float64)
    return (b_x64 / (1.0 + tl.exp(-b_x64))).to(tl.float32)


@triton.jit
def silu_rounded(b_x, dtype: tl.constexpr):
    """SiLU of the fp32 tile `b_x` in `dtype`, with the bits of the fp64 SiLU rounded to fp32, then `dtype`.

    bf16: the fp32 SiLU (error under 6 fp32 ulps, see NEAR_ULPS), and the fp64 one for the whole tile only
    where an element's bf16 rounding could differ between the two (one branch per program, taken by a few
    percent of 128-element tiles at random values). fp32: the fp64 one (every bit of it is kept)."""
    if dtype == tl.bfloat16:
        if _INTERPRETING:
            b_e = tl.exp(-b_x)
        else:
            b_e = libdevice.exp(-b_x)
        b_y = tl.math.div_rn(b_x, 1.0 + b_e)
        b_low = (b_y.to(tl.uint32, bitcast=True) & 0xFFFF).to(tl.int32)
        b_ax = tl.abs(b_x)
        b_near = (b_low >= 0x8000 - NEAR_ULPS) & (b_low <= 0x8000 + NEAR_ULPS)
        # `not <=` is true for NaN too; 0 stays on the fast path (its SiLU is exactly +-0 either way)
        b_slow = b_near | ~(b_ax <= FAST_RANGE) | ((b_ax < 1e-30) & (b_ax > 0))
        if tl.max(tl.ravel(b_slow.to(tl.int32)), 0) > 0:
            b_y = tl.where(b_slow, _silu64(b_x), b_y)
    else:
        b_y = _silu64(b_x)
    return round_to(b_y, dtype)


@triton.jit
def _column(b_tile, j: tl.constexpr):
    """Column `j` of a `[BC, J]` register tile (J a power of two), by halving it bit by bit of `j`: moves, no
    arithmetic, so every bit is kept (-0.0 and NaN payloads included)."""
    BC: tl.constexpr = b_tile.shape[0]
    J: tl.constexpr = b_tile.shape[1]
    if J == 1:
        return tl.reshape(b_tile, [BC])
    else:
        b_lo, b_hi = tl.split(tl.reshape(b_tile, [BC, J // 2, 2]))
        if j % 2 == 1:
            return _column(b_hi, j // 2)
        else:
            return _column(b_lo, j // 2)


@triton.jit
def _full_column(b_win, x, bos, o_c, m, j: tl.constexpr, C, KERNEL: tl.constexpr):
    """Column `j` (a compile-time index) of `full = [window | tokens]` for channels `o_c`, fp32: a column of
    the window tile, or token row `j - (kernel - 1)` (one coalesced 1-D load, masked by `m`)."""
    if j < KERNEL - 1:
        return _column(b_win, j)
    else:
        return tl.load(x + (bos + (j - (KERNEL - 1))) * C + o_c, mask=m, other=0.0).to(tl.float32)


@triton.jit
def causal_conv_kernel(
    x,
    y,
    conv,
    conv_offset,
    weight,
    slots,
    widths,
    cu_seqlens,
    C,
    KERNEL: tl.constexpr,
    KP: tl.constexpr,
    W: tl.constexpr,
    KW: tl.constexpr,
    KWP: tl.constexpr,
    BC: tl.constexpr,
):
    """Grid `(cdiv(C, BC), n)`: one row's round for `BC` channels. KP: `kernel` padded to a power of two;
    W: the round's width (T // n, exact: not padded); KW: the pool's window columns, KWP padded.

    The pool keeps a channel's window columns next to each other (`[slots, C, KW]`), so the window and the
    weights come in as `[BC, *]` tiles (one coalesced 2-D load each) and the next window goes out as one;
    token rows are 1-D loads at compile-time indices. (Column by column, the window's strided 1-D loads and
    the 2-D address and mask tensors of every tap were most of the time; ncu, h200-2026-12-04c.)"""
    i_c, i_n = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    off = tl.load(conv_offset + slot, mask=w > 0, other=0).to(tl.int64)  # an idle row's may be anything
    conv = conv + slot * C * KW

    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    m_row = m_c & (w > 0)
    o_k = tl.arange(0, KP)
    o_s = tl.arange(0, KWP)
    b_wt = tl.load(weight + o_c[:, None] * KERNEL + o_k[None, :], mask=m_c[:, None] & (o_k < KERNEL)[None, :],
                   other=0.0).to(tl.float32)  # [BC, KP]
    # the accepted window, columns [off, off + kernel - 1) (read before anything is written: the next one
    # may overlap it)
    b_win = tl.load(conv + o_c[:, None] * KW + off + o_k[None, :], mask=m_row[:, None] & (o_k < KERNEL - 1)[None, :],
                    other=0.0).to(tl.float32)  # [BC, KP]
    # the next window: columns [0, kernel - 2 + w) <- full[:, 1 : kernel - 1 + w]
    b_next = tl.zeros([BC, KWP], dtype=tl.float32)
    for s in tl.static_range(KW):
        if s + 1 < KERNEL - 1 + W:
            b_next = tl.where(o_s[None, :] == s,
                              _full_column(b_win, x, bos, o_c, m_row & (s + 2 - KERNEL < w), s + 1, C, KERNEL)[:, None],
                              b_next)
    for t in tl.static_range(W):
        m_t = m_c & (t < w)
        for i in tl.static_range(KERNEL):
            b_f = _full_column(b_win, x, bos, o_c, m_t, t + i, C, KERNEL)
            if i == 0:
                b_acc = _column(b_wt, i) * b_f
            else:
                b_acc = b_acc + _column(b_wt, i) * b_f  # tap by tap in fp32, kernels/conv/naive.py's order
        # SiLU with the bits of torch's `F.silu(acc.double()).to(bf16)`: conv outputs agree bit for bit with
        # the torch backend and the fp64 reference (an fp32 SiLU flipped the bf16 rounding of a few elements a
        # layer at model shapes, 1e-4 in contract 3)
        tl.store(y + (bos + t) * C + o_c, silu_rounded(b_acc, y.dtype.element_ty), mask=m_t)
    tl.debug_barrier()  # the accepted window read, before it is overwritten
    # the window holds activation-dtype values, so the fp32 round trip of b_next is exact
    tl.store(conv + o_c[:, None] * KW + o_s[None, :], b_next.to(conv.dtype.element_ty),
             mask=m_row[:, None] & (o_s < KERNEL - 2 + w)[None, :])


def causal_conv_update(
    x: torch.Tensor,
    conv: torch.Tensor,
    conv_offset: torch.Tensor,
    weight: torch.Tensor,
    slots: torch.Tensor,
    widths: torch.Tensor,
    cu_seqlens: torch.Tensor,
    config: Config,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Conv outputs of one layer for a round; advances the conv windows of the active slots in place.

    Args:
        x: `[T, C]` activation dtype, packed raw inputs (`T = n * W`; rows past `cu_seqlens[-1]` unread).
        conv: `[slots, C, kernel - 1 + S]` activation dtype, one layer of the conv pool (contiguous).
        conv_offset: `[slots]` int32           # slot -> first column of its accepted window
        weight: `[C, kernel]` activation dtype.
        slots: `[n]` int64                     # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32, tokens of each row this round (0 = idle, untouched).
        cu_seqlens: `[n + 1]` int32            # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: a `conv` config (`BC`, `num_warps`, `num_stages`).
        out: optional `[T, C]` output buffer in `x.dtype`.

    Returns:
        `[T, C]` in `x.dtype`: the conv outputs on each row's valid tokens; other rows are not written.
    """
    config = check_config(CONV, config)
    T, C = x.shape
    n = slots.shape[0]
    KW, kernel = conv.shape[2], weight.shape[1]
    if conv.dim() != 3 or conv.shape[1] != C or weight.shape[0] != C or not conv.is_contiguous():
        raise ValueError(f"conv pool {tuple(conv.shape)} / weight {tuple(weight.shape)} do not fit x {tuple(x.shape)} "
                         "(want a contiguous [slots, C, kernel - 1 + S] pool and a [C, kernel] weight)")
    if n == 0 or T % n or KW < kernel - 1 or T // n > KW - kernel + 2:
        raise ValueError(f"{T} packed rows for {n} requests do not make a round of width <= {KW - kernel + 2}")
    if widths.shape != (n,) or cu_seqlens.shape != (n + 1,):
        raise ValueError(f"widths {tuple(widths.shape)} / cu_seqlens {tuple(cu_seqlens.shape)} do not match {n} rows")
    if conv.dtype != x.dtype:
        raise ValueError(f"conv pool dtype {conv.dtype} differs from the activations' {x.dtype}")
    W = T // n
    y = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(C, config["BC"]), n)
    causal_conv_kernel[grid](
        x, y, conv, conv_offset, weight.contiguous(), slots, widths, cu_seqlens, C,
        KERNEL=kernel, KP=triton.next_power_of_2(kernel), W=W, KW=KW, KWP=triton.next_power_of_2(KW), BC=config["BC"],
        num_warps=config["num_warps"], num_stages=config["num_stages"], enable_fp_fusion=ENABLE_FP_FUSION,
    )
    return y
