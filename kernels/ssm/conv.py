"""Causal depthwise conv of a round over packed tokens, reading and advancing the widened conv pool.

Request `r` owns packed rows `cu_seqlens[r] : cu_seqlens[r] + w_r` and slot `slots[r]`; its accepted
window is columns `[off, off + kernel - 1)` of `conv[slot]` with `off = conv_offset[slot]`. With
`full = [window | x_0 .. x_{w-1}]`, token `t` is `silu(sum_i weight[:, i] * full[:, t + i])`, summed
in fp32 tap by tap (the order of kernels/conv/naive.py::causal_conv) and rounded to the activation
dtype. The next window is stored as columns `[0, kernel - 2 + w)` <- `full[:, 1 : kernel - 1 + w]`,
so accepting `a` drafts leaves it at columns `[a, a + kernel - 1)`. Idle rows (w = 0) touch nothing.

SiLU is `x / (1 + exp(-x))` evaluated in fp64 from the fp32 sum and rounded to fp32, then to the
activation dtype: the path torch takes for `F.silu(acc.double()).to(bf16)` (the torch backend and the
fp64 reference), so all three give the same bits. (An fp32 `tl.exp` SiLU differed from torch's in the
last fp32 bit often enough to flip the bf16 rounding of a few elements per layer at model shapes.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import CONV, Config, check_config
from kernels.ssm.step import ENABLE_FP_FUSION, round_to


@triton.jit
def _full_column(x, conv, off, bos, o_c, j, C, KW, m, KERNEL: tl.constexpr):
    """Column(s) `j` of `full = [window | tokens]` for channels `o_c`, activation dtype (0 where `m` is off)."""
    from_window = j < KERNEL - 1
    p_win = conv + o_c * KW + (off + j)
    p_x = x + (bos + j - (KERNEL - 1)) * C + o_c
    b_win = tl.load(p_win, mask=m & from_window, other=0.0)
    b_x = tl.load(p_x, mask=m & (j >= KERNEL - 1), other=0.0)
    return tl.where(from_window, b_win, b_x)


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
    KW,
    KERNEL: tl.constexpr,
    BW: tl.constexpr,
    BKW: tl.constexpr,
    BC: tl.constexpr,
):
    i_c, i_n = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    off = tl.load(conv_offset + slot, mask=w > 0, other=0).to(tl.int64)  # an idle row's may be anything
    conv = conv + slot * C * KW

    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    # tokens of the round along the second axis; full column t + i feeds tap i of token t
    o_t = tl.arange(0, BW)
    m_y = m_c[:, None] & (o_t < w)[None, :]
    for i in tl.static_range(KERNEL):
        b_w = tl.load(weight + o_c * KERNEL + i, mask=m_c, other=0.0).to(tl.float32)
        b_f = _full_column(x, conv, off, bos, o_c[:, None], (o_t + i)[None, :], C, KW, m_y, KERNEL).to(tl.float32)
        if i == 0:
            b_acc = b_w[:, None] * b_f
        else:
            b_acc = b_acc + b_w[:, None] * b_f
    # SiLU in fp64, then fp32, then the activation dtype: torch's `F.silu(acc.double()).to(bf16)` goes the
    # same way, so conv outputs agree bit for bit with the torch backend and the fp64 reference (an fp32
    # SiLU flipped the bf16 rounding of a few elements a layer at model shapes, 1e-4 in contract 3)
    b_acc64 = b_acc.to(tl.float64)
    b_y = (b_acc64 / (1.0 + tl.exp(-b_acc64))).to(tl.float32)

    # the next window, read before anything is written: it may overlap the accepted one
    o_s = tl.arange(0, BKW)
    m_s = m_c[:, None] & ((o_s < KERNEL - 2 + w) & (w > 0))[None, :]
    b_next = _full_column(x, conv, off, bos, o_c[:, None], (o_s + 1)[None, :], C, KW, m_s, KERNEL)
    tl.debug_barrier()

    tl.store(y + (bos + o_t[None, :]) * C + o_c[:, None], round_to(b_y, y.dtype.element_ty), mask=m_y)
    tl.store(conv + o_c[:, None] * KW + o_s[None, :], b_next, mask=m_s)


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
        x, y, conv, conv_offset, weight.contiguous(), slots, widths, cu_seqlens, C, KW,
        KERNEL=kernel, BW=triton.next_power_of_2(W), BKW=triton.next_power_of_2(KW), BC=config["BC"],
        num_warps=config["num_warps"], num_stages=config["num_stages"], enable_fp_fusion=ENABLE_FP_FUSION,
    )
    return y
