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
    """Reference conv in fp64, rounded to `act_dtype` like §2 prescribes; any leading batch dims.

    Args:
        window: `[..., C, kernel - 1]`; x: `[..., T, C]`; weight: `[C, kernel]`.

    Returns:
        `[..., T, C]` float64 holding values representable in `act_dtype`.
    """
    kernel = weight.shape[1]
    full = torch.cat([window.double(), x.double().transpose(-1, -2)], dim=-1)
    out = torch.stack(
        [(weight.double() * full[..., t : t + kernel]).sum(-1) for t in range(x.shape[-2])], dim=-2
    )
    out = out * torch.sigmoid(out)
    return out.to(act_dtype).double()
