"""PyTorch building blocks shared by the GDN and KDA steps (SPEC §2).

Bit-stability matters more than speed here: compact must equal native bit for bit, and a replay fold
must equal native bit for bit with fp32 state, even though those paths call these functions on
tensors of different shapes (a whole batch, a commit subset, a fold subset). Two rules make that hold
on every torch device:

* reductions are written as a fixed left-to-right loop of elementwise ops (`seq_sum`), so each
  output element sees the same IEEE operations whatever the surrounding shape or vector width;
* transcendentals (`exp`, `log1p`, `sigmoid`, SiLU) are evaluated in float64 and rounded once: in
  float32, torch's vectorized and scalar loops can disagree in the last bit, and which loop an
  element lands in depends on the tensor's size, so a restored request decoding in a batch of 2
  would not reproduce its own bits from a batch of 4. (fp64 results rounded to fp32 agree except in
  ties about 2^-29 apart, never seen.)
"""

from __future__ import annotations

import torch

L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


def seq_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` in a fixed left-to-right order (one rounding per add)."""
    x = x.movedim(dim, 0)
    acc = x[0].clone()
    for i in range(1, x.shape[0]):
        acc = acc + x[i]
    return acc


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + 1e-6)` over the last dim, in fp32."""
    x = x.float()
    return x / torch.sqrt(seq_sum(x * x, -1) + L2NORM_EPS)[..., None]


def decay_from_log_gate(g: torch.Tensor) -> torch.Tensor:
    """`exp(g)` in fp32, rounded once from fp64 so every path that recomputes it gets the same bits."""
    return torch.exp(g.double()).float()


def softplus(x: torch.Tensor) -> torch.Tensor:
    """Softplus with beta 1 and threshold 20 (x itself above the threshold), fp32."""
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))


def expand_heads(x: torch.Tensor, group: int, dim: int = 1) -> torch.Tensor:
    """Key heads -> value heads: value head `h` reads key head `h // group`."""
    return x if group == 1 else x.repeat_interleave(group, dim=dim)


def delta_rule_update(
    state: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    q: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token of the gated delta rule for N rows, fp32 throughout.

    Args:
        state: `[N, HV, K, V]` fp32.
        k: `[N, HV, K]` fp32, L2-normalized (already expanded to value heads).
        v: `[N, HV, V]` fp32.
        decay: `[N, HV, 1]` (GDN) or `[N, HV, K]` (KDA) fp32, `exp(g)` per state row.
        beta: `[N, HV]` fp32.
        q: `[N, HV, K]` fp32, normalized and scaled, or None when no output is needed (commit, fold).

    Returns:
        The new state `[N, HV, K, V]` fp32 and the output `[N, HV, V]` fp32 (or None).
    """
    state = state * decay[..., None]
    sk = seq_sum(state * k[..., None], -2)
    d = beta[..., None] * (v - sk)
    state = state + k[..., None] * d[..., None, :]
    o = None if q is None else seq_sum(state * q[..., None], -2)
    return state, o


def split_qkv(y: torch.Tensor, key_heads: int, head_k_dim: int, value_heads: int, head_v_dim: int):
    """Split conv outputs `[..., 2*H*K + HV*V]` into raw q, k `[..., H, K]` and v `[..., HV, V]`."""
    hk = key_heads * head_k_dim
    lead = y.shape[:-1]
    q = y[..., :hk].reshape(*lead, key_heads, head_k_dim)
    k = y[..., hk : 2 * hk].reshape(*lead, key_heads, head_k_dim)
    v = y[..., 2 * hk :].reshape(*lead, value_heads, head_v_dim)
    return q, k, v
