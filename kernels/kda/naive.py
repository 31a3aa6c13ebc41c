"""Kimi Delta Attention in PyTorch: the gate, the shared per-token step, and the fp64 layer reference.

Every torch-backend state mode evolves KDA state through `kda_step` and nothing else (SPEC §2).
"""

from __future__ import annotations

import torch

from kernels.common.reference import naive_recurrent_fp64
from kernels.common.torch_ops import delta_rule_update, expand_heads


def kda_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float) -> torch.Tensor:
    """Log gate `g = lower_bound * sigmoid(exp(A_log[h]) * (a[h, :] + dt_bias[h, :]))`, fp32.

    Args:
        a: `[..., HV, K]` gate input.
        A_log: `[HV]`.
        dt_bias: `[HV * K]` (flattened over heads, as the checkpoints store it).
        lower_bound: negative bound of the gate (default -5.0).

    Returns:
        `[..., HV, K]` float32 in `(lower_bound, 0)`.
    """
    HV, K = a.shape[-2:]
    # fp64 then one rounding, so the bits do not depend on the call's shape (see kernels/common/torch_ops.py)
    x = torch.exp(A_log.double())[:, None] * (a.double() + dt_bias.double().reshape(HV, K))
    return (lower_bound * torch.sigmoid(x)).float()


def kda_step(
    state: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    q: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One KDA token for N rows: `S <- diag(exp(g)) S; d = beta (v - S^T k); S <- S + k d^T; o = S^T q`.

    Args:
        state: `[N, HV, K, V]` float32.
        k: `[N, H, K]` float32, L2-normalized.
        v: `[N, HV, V]` float32.
        decay: `[N, HV, K]` float32, `exp(g)` per state row.
        beta: `[N, HV]` float32.
        q: `[N, H, K]` float32, normalized and scaled by `K^-0.5`; None when only the state is needed.

    Returns:
        new state `[N, HV, K, V]` float32 and output `[N, HV, V]` float32 (None without q).
    """
    group = state.shape[1] // k.shape[1]
    qe = None if q is None else expand_heads(q, group)
    return delta_rule_update(state, expand_heads(k, group), v, decay, beta, qe)


def naive_recurrent_kda(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_window: torch.Tensor,
    state: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    key_heads: int,
    lower_bound: float = -5.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 reference of one KDA layer over T tokens of one request or a batch (see `naive_recurrent_fp64`).

    Shapes: mixed_qkv `[..., T, conv_dim]`, a `[..., T, HV, K]`, b `[..., T, HV]`, conv_window
    `[..., conv_dim, kernel - 1]`, state `[..., HV, K, V]`, conv_weight `[conv_dim, kernel]`, A_log `[HV]`,
    dt_bias `[HV * K]` (`...`: any batch of requests, none for one).
    """
    HV, K = state.shape[-3:-1]

    def gate(a64: torch.Tensor) -> torch.Tensor:
        x = torch.exp(A_log.double())[:, None] * (a64 + dt_bias.double().reshape(HV, K))
        return lower_bound * torch.sigmoid(x)

    return naive_recurrent_fp64(mixed_qkv, a, b, conv_window, state, conv_weight, key_heads, gate)
