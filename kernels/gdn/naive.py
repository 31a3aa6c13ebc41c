"""Gated DeltaNet in PyTorch: the gate, the shared per-token step, and the fp64 layer reference.

Every torch-backend state mode evolves GDN state through `gdn_step` and nothing else (SPEC §2).
"""

from __future__ import annotations

import torch

from kernels.common.reference import naive_recurrent_fp64
from kernels.common.torch_ops import delta_rule_update, expand_heads, softplus


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Log gate `g = -exp(A_log) * softplus(a + dt_bias)`, fp32.

    Args:
        a: `[..., HV]` gate input.
        A_log: `[HV]`.
        dt_bias: `[HV]`.

    Returns:
        `[..., HV]` float32, `<= 0`.
    """
    # fp64 then one rounding: the SIMD and scalar paths of exp/log1p may differ in fp32, and the result
    # must not depend on how many rows a call happens to hold (see kernels/common/torch_ops.py)
    return (-torch.exp(A_log.double()) * softplus(a.double() + dt_bias.double())).float()


def gdn_step(
    state: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    q: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One GDN token for N rows: `S <- exp(g) S; d = beta (v - S^T k); S <- S + k d^T; o = S^T q`.

    Args:
        state: `[N, HV, K, V]` float32.
        k: `[N, H, K]` float32, L2-normalized.
        v: `[N, HV, V]` float32.
        decay: `[N, HV]` float32, `exp(g)`.
        beta: `[N, HV]` float32, `sigmoid(b)`.
        q: `[N, H, K]` float32, normalized and scaled by `K^-0.5`; None when only the state is needed.

    Returns:
        new state `[N, HV, K, V]` float32 and output `[N, HV, V]` float32 (None without q).
    """
    group = state.shape[1] // k.shape[1]
    qe = None if q is None else expand_heads(q, group)
    return delta_rule_update(state, expand_heads(k, group), v, decay[..., None], beta, qe)


def naive_recurrent_gdn(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_window: torch.Tensor,
    state: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    key_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 reference of one GDN layer over T tokens of one request or a batch (see `naive_recurrent_fp64`).

    Shapes: mixed_qkv `[..., T, conv_dim]`, a and b `[..., T, HV]`, conv_window `[..., conv_dim, kernel - 1]`,
    state `[..., HV, K, V]`, conv_weight `[conv_dim, kernel]`, A_log and dt_bias `[HV]` (`...`: any batch of
    requests, none for one).
    """

    def gate(a64: torch.Tensor) -> torch.Tensor:
        x = a64 + dt_bias.double()
        sp = torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))
        return (-torch.exp(A_log.double()) * sp)[..., None]

    return naive_recurrent_fp64(mixed_qkv, a, b, conv_window, state, conv_weight, key_heads, gate)
