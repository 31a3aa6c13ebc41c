"""Causal depthwise conv over `mixed_qkv` (SPEC §2 step 1), PyTorch.

The conv state of a request holds the previous `kernel - 1` inputs of every channel. For a round of
`W` tokens the conv reads `full = [window | x_0 .. x_{W-1}]` (`kernel - 1 + W` columns) and token `t`
is `silu(sum_i weight[:, i] * full[:, t + i])`, accumulated in fp32 and rounded to the activation
dtype, as a separate conv kernel writing bf16 would: that rounded tensor is what every mode consumes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(
    window: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Conv outputs of a round for N requests.

    Args:
        window: `[N, C, kernel - 1]` activation dtype, the accepted window of each request.
        x: `[N, W, C]` activation dtype, the round's raw inputs (rows past a request's width are
            ignored by the caller).
        weight: `[C, kernel]`.

    Returns:
        `y` `[N, W, C]` in the activation dtype, and `full` `[N, C, kernel - 1 + W]` (window then inputs),
        from which the caller stores the next window.
    """
    kernel = weight.shape[1]
    full = torch.cat([window, x.transpose(1, 2).to(window.dtype)], dim=2)
    n_tok = x.shape[1]
    w = weight.float()
    acc = w[None, :, 0:1] * full[:, :, 0:n_tok].float()
    for i in range(1, kernel):
        acc = acc + w[None, :, i : i + 1] * full[:, :, i : i + n_tok].float()
    # SiLU in fp64, rounded once to the activation dtype: shape-independent bits (kernels/common/torch_ops.py)
    y = F.silu(acc.double()).to(x.dtype).transpose(1, 2).contiguous()
    return y, full


def naive_causal_conv_fp64(
    window: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, act_dtype: torch.dtype
) -> torch.Tensor:
    """Reference conv, rounded to `act_dtype` like §2 prescribes; any leading batch dims.

    The one rounding §2 makes part of the math is only reproducible if it is taken from the same value:
    the taps are summed in fp32 in order (what a conv kernel does), the SiLU in fp64, then rounded.
    (Summing in fp64 instead moved a few bf16 roundings a layer by one ulp at model shapes, each worth
    1e-4 of RMS in contract 3 at batch 1: the reference's sum, not the recurrence under test.)

    Args:
        window: `[..., C, kernel - 1]`; x: `[..., T, C]`; weight: `[C, kernel]`.

    Returns:
        `[..., T, C]` float64 holding values representable in `act_dtype`.
    """
    kernel = weight.shape[1]
    full = torch.cat([window, x.transpose(-1, -2).to(window.dtype)], dim=-1).float()
    w = weight.float()
    acc = w[:, 0:1] * full[..., 0 : x.shape[-2]]  # [..., C, T]: fp32, tap by tap, the order §2's conv rounds in
    for i in range(1, kernel):
        acc = acc + w[:, i : i + 1] * full[..., i : i + x.shape[-2]]
    out = F.silu(acc.double()).to(act_dtype)
    return out.transpose(-1, -2).double()
