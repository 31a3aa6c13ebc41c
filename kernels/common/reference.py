"""Independent float64 reference of one linear-attention layer over a token sequence (SPEC §2).

Written without the helpers the modes share (plain einsum in fp64), so that contract 3 compares every
backend against something that did not inherit their mistakes. The only rounding it reproduces is the
one §2 prescribes as part of the math: conv outputs rounded to the activation dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.conv.naive import naive_causal_conv_fp64


def naive_recurrent_fp64(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_window: torch.Tensor,
    state: torch.Tensor,
    conv_weight: torch.Tensor,
    key_heads: int,
    gate_fp64: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer, T tokens, in float64, for one request or a batch of them (any leading dims `...`).

    Batching requests only adds a leading dim to every einsum, so a batch of requests runs on the
    inputs' device at once (a GPU computes the fp64 reference of many requests in one pass).

    Args:
        mixed_qkv: `[..., T, conv_dim]` raw inputs (activation dtype).
        a: `[..., T, HV]` (GDN) or `[..., T, HV, K]` (KDA) gate input.
        b: `[..., T, HV]` beta input.
        conv_window: `[..., conv_dim, kernel - 1]` inputs before the first token.
        state: `[..., HV, K, V]` state before the first token (any float dtype).
        conv_weight: `[conv_dim, kernel]`.
        key_heads: H.
        gate_fp64: maps `a` (fp64) to the log gate, `[..., T, HV, 1]` or `[..., T, HV, K]`.

    Returns:
        outputs `[..., T, HV, V]`, states after every token `[..., T, HV, K, V]` and conv windows after
        every token `[..., T, conv_dim, kernel - 1]`, all float64 except the windows (input dtype).
    """
    T = mixed_qkv.shape[-2]
    lead = mixed_qkv.shape[:-2]
    HV, K, V = state.shape[-3:]
    H = key_heads
    kernel = conv_weight.shape[1]
    y = naive_causal_conv_fp64(conv_window, mixed_qkv, conv_weight, mixed_qkv.dtype)
    q = y[..., : H * K].reshape(*lead, T, H, K)
    k = y[..., H * K : 2 * H * K].reshape(*lead, T, H, K)
    v = y[..., 2 * H * K :].reshape(*lead, T, HV, V)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K**-0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q.repeat_interleave(HV // H, dim=-2)
    k = k.repeat_interleave(HV // H, dim=-2)
    decay = torch.exp(gate_fp64(a.double()))
    beta = torch.sigmoid(b.double())
    S = state.double().clone()
    outs, states = [], []
    for t in range(T):
        S = S * decay[..., t, :, :, None]
        d = beta[..., t, :, None] * (v[..., t, :, :] - torch.einsum("...hkv,...hk->...hv", S, k[..., t, :, :]))
        S = S + torch.einsum("...hk,...hv->...hkv", k[..., t, :, :], d)
        outs.append(torch.einsum("...hkv,...hk->...hv", S, q[..., t, :, :]))
        states.append(S.clone())
    full = torch.cat([conv_window, mixed_qkv.transpose(-1, -2).to(conv_window.dtype)], dim=-1)
    windows = torch.stack([full[..., t + 1 : t + kernel] for t in range(T)], dim=-3)
    return torch.stack(outs, dim=-3), torch.stack(states, dim=-4), windows
