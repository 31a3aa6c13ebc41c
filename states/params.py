"""Layer parameters and per-token inputs of the linear-attention layers (SPEC §2).

Two kinds of gate inputs (`GATES`, the `--gates` option):

* `random`: decays spread between about 0.5 and 1 (short memory: a token's contribution fades within
  a few dozen tokens, so per-token rounding errors fade with it);
* `long-memory`: every per-token decay `exp(g)` lies in `LONG_MEMORY_DECAY` (0.995 to 0.9997), the
  regime of long-context heads, where the state keeps hundreds of tokens and rounding errors
  accumulate instead of fading (SPEC §5 measures the bf16 bounds there).
"""

from __future__ import annotations

import math
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

    def __post_init__(self) -> None:
        self.A_log, self.dt_bias = _aligned_rows(self.A_log), _aligned_rows(self.dt_bias)

    def to(self, device: torch.device | str) -> SSMParams:
        return SSMParams(self.conv_weight.to(device), self.A_log.to(device), self.dt_bias.to(device))


def _aligned_rows(t: torch.Tensor, align_bytes: int = 16) -> torch.Tensor:
    """`t` (`[L, n]`) as a view whose rows each start on an `align_bytes` boundary (same values).

    The kernels take one layer's row (`A_log[layer]`), and Triton specializes a pointer argument on
    whether it is 16-byte aligned: with 2 value heads (tiny-kda) layer 1's row of a contiguous `[L, 2]`
    fp32 tensor starts 8 bytes in, so every verify kernel compiled twice per configuration, once per
    alignment (scripts/gate_specializations.py). Padding the rows makes every layer's pointer aligned.
    """
    per = align_bytes // t.element_size()
    if t.dim() != 2 or per <= 1 or (t.stride(0) % per == 0 and t.stride(1) == 1 and t.data_ptr() % align_bytes == 0):
        return t
    width = -(-t.shape[1] // per) * per
    out = torch.zeros(t.shape[0], width, dtype=t.dtype, device=t.device)[:, : t.shape[1]]
    out.copy_(t)
    return out


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


GATES = ("random", "long-memory")
LONG_MEMORY_DECAY = (0.995, 0.9997)  # per-token exp(g) of every head (and every K row for KDA)
# Spread of the per-token gate input `a` around its head's bias in long-memory mode, and what bf16 rounding
# of `a` can add to it (half a bf16 ULP at 1.0), so the decays stay inside LONG_MEMORY_DECAY.
_A_SPREAD = 0.6
_A_ROUNDING = 2.0**-8


def check_gates(gates: str) -> str:
    if gates not in GATES:
        raise ValueError(f"--gates must be one of {', '.join(GATES)}, got {gates!r}")
    return gates


def make_params(geom: SSMGeometry, act_dtype: torch.dtype, generator: torch.Generator,
                gates: str = "random") -> SSMParams:
    """Random parameters in realistic ranges (conv weights ~ 1/kernel); decays between ~0.5 and ~1, or
    with `gates="long-memory"` biases that put every decay inside LONG_MEMORY_DECAY (module docstring)."""
    check_gates(gates)
    L, HV = geom.layers, geom.value_heads
    conv_weight = (torch.randn(L, geom.conv_dim, geom.conv_kernel, generator=generator) / geom.conv_kernel**0.5)
    A_log = torch.empty(L, HV).uniform_(-2.0, 0.5, generator=generator)
    bias_width = HV if geom.family == "gdn" else HV * geom.head_k_dim
    dt_bias = torch.empty(L, bias_width).uniform_(-1.0, 1.0, generator=generator)
    if gates == "long-memory":
        lo, hi = long_memory_bias_range(geom)
        A_log = torch.zeros(L, HV)  # exp(A_log) = 1: the bias alone sets the decay
        dt_bias = torch.empty(L, bias_width).uniform_(lo, hi, generator=generator)
    return SSMParams(conv_weight.to(act_dtype), A_log, dt_bias)


def long_memory_bias_range(geom: SSMGeometry) -> tuple[float, float]:
    """Range of `dt_bias` (with `A_log = 0`) such that `a + dt_bias`, for any `|a| <= _A_SPREAD` after
    bf16 rounding, gives a per-token decay inside LONG_MEMORY_DECAY.

    GDN: `exp(g) = exp(-softplus(x))`, so `x = log(expm1(-log(decay)))`; KDA: `exp(g) =
    exp(lower_bound * sigmoid(x))`, so `x = logit(log(decay) / lower_bound)`. Both increase as the decay
    falls, so the slowest decay gives the lowest x.
    """
    def x_of(decay: float) -> float:
        g = math.log(decay)
        if geom.family == "gdn":
            return math.log(math.expm1(-g))
        s = g / geom.lower_bound
        return math.log(s / (1.0 - s))

    margin = _A_SPREAD + _A_ROUNDING
    lo, hi = x_of(LONG_MEMORY_DECAY[1]) + margin, x_of(LONG_MEMORY_DECAY[0]) - margin
    if lo >= hi:
        raise ValueError(f"lower_bound {geom.lower_bound} leaves no room for long-memory gates")
    return lo, hi


def make_token_inputs(
    geom: SSMGeometry, tokens: int, act_dtype: torch.dtype, generator: torch.Generator, gates: str = "random"
) -> TokenInputs:
    """Random inputs for `tokens` packed rows of one layer (`gates`: see the module docstring), drawn on
    the generator's device (at model shapes a round of inputs is hundreds of MB: drawing it on the CPU
    and copying cost seconds a case)."""
    a_shape = (tokens, geom.value_heads) if geom.family == "gdn" else (tokens, geom.value_heads, geom.head_k_dim)
    dev = generator.device
    mixed_qkv = torch.randn(tokens, geom.conv_dim, generator=generator, device=dev)
    a = torch.randn(*a_shape, generator=generator, device=dev)
    if check_gates(gates) == "long-memory":
        a = (2 * torch.rand(*a_shape, generator=generator, device=dev) - 1) * _A_SPREAD
    return TokenInputs(
        mixed_qkv=mixed_qkv.to(act_dtype),
        a=a.to(act_dtype),
        b=torch.randn(tokens, geom.value_heads, generator=generator, device=dev).to(act_dtype),
    )
