"""Layer parameters and per-token inputs of the linear-attention layers (SPEC §2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from states.geometry import SSMGeometry


@dataclass
class SSMParams:
    """Parameters of all `L` linear-attention layers of one rank.

    Attributes:
        conv_weight: `[L, conv_dim, kernel]` activation dtype.
        A_log: `[L, HV]` float32.
        dt_bias: `[L, HV]` (GDN) or `[L, HV * K]` (KDA) float32.
    """

    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    def to(self, device: torch.device | str) -> SSMParams:
        return SSMParams(self.conv_weight.to(device), self.A_log.to(device), self.dt_bias.to(device))


@dataclass
class TokenInputs:
    """One layer's inputs for one round, packed token-major (`T = n * W` rows, fixed per batch shape).

    Request `r` owns rows `cu_seqlens[r] : cu_seqlens[r + 1]`; rows past `cu_seqlens[-1]` are padding
    that no mode reads.

    Attributes:
        mixed_qkv: `[T, conv_dim]` activation dtype (projection output before the conv).
        a: `[T, HV]` (GDN) or `[T, HV, K]` (KDA) activation dtype, gate input.
        b: `[T, HV]` activation dtype, beta input.
    """

    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor

    def to(self, device: torch.device | str) -> TokenInputs:
        return TokenInputs(self.mixed_qkv.to(device), self.a.to(device), self.b.to(device))


def make_params(geom: SSMGeometry, act_dtype: torch.dtype, generator: torch.Generator) -> SSMParams:
    """Random parameters in realistic ranges (decays between ~0.5 and ~1, conv weights ~ 1/kernel)."""
    L, HV = geom.layers, geom.value_heads
    conv_weight = (torch.randn(L, geom.conv_dim, geom.conv_kernel, generator=generator) / geom.conv_kernel**0.5)
    A_log = torch.empty(L, HV).uniform_(-2.0, 0.5, generator=generator)
    bias_width = HV if geom.family == "gdn" else HV * geom.head_k_dim
    dt_bias = torch.empty(L, bias_width).uniform_(-1.0, 1.0, generator=generator)
    return SSMParams(conv_weight.to(act_dtype), A_log, dt_bias)


def make_token_inputs(
    geom: SSMGeometry, tokens: int, act_dtype: torch.dtype, generator: torch.Generator
) -> TokenInputs:
    """Random inputs for `tokens` packed rows of one layer, drawn on the generator's device (at model
    shapes a round of inputs is hundreds of MB: drawing it on the CPU and copying cost seconds a case)."""
    a_shape = (tokens, geom.value_heads) if geom.family == "gdn" else (tokens, geom.value_heads, geom.head_k_dim)
    dev = generator.device
    return TokenInputs(
        mixed_qkv=torch.randn(tokens, geom.conv_dim, generator=generator, device=dev).to(act_dtype),
        a=torch.randn(*a_shape, generator=generator, device=dev).to(act_dtype),
        b=torch.randn(tokens, geom.value_heads, generator=generator, device=dev).to(act_dtype),
    )
